#!/usr/bin/python3
"""The seed workload shuffled the way a pure-Python framework does it (zephyr before Sluice):
each mapper process splits its items by key into partitions, sorts each partition's chunk by
key, pickles and zstd-compresses it and writes it to a file (fsynced: durable, as Sluice's
commits are); each reducer process reads its partition's chunk from every mapper, decompresses,
unpickles, merges them with heapq by key and counts each key's items, which must match what was
sent. The baseline for `python3 -m sluice.bench` (docs/benchmarks.md, "Python client").

The very items of sluice.bench and `sluice bench` (sluice.bench.items: dicts {key, seq, src,
payload} of ~200 bytes keyed by an int out of --keys, --payload random or same); routing by crc32
of the pickled key. Prints a RESULT line of JSON.

    PYTHONPATH=build/python /usr/bin/python3 tests/py/zephyr_style_shuffle.py [--shards 8] \
        [--items-per-shard 50000] [--payload random|same]
"""
import argparse
import heapq
import json
import multiprocessing
import os
import pickle
import resource
import shutil
import tempfile
import time
import zlib
from collections import Counter
from itertools import groupby

import zstandard

from sluice.bench import PAYLOADS, items


def mapper(args):
    shard, n, keys, item_bytes, partitions, out, payload = args
    parts = [[] for _ in range(partitions)]
    sent = Counter()
    for key, item in items(shard, n, keys, item_bytes, sent, payload):  # (counted into sent)
        parts[zlib.crc32(pickle.dumps(key)) % partitions].append((key, item))
    cctx = zstandard.ZstdCompressor(level=3)
    for p, chunk in enumerate(parts):
        chunk.sort(key=lambda kv: kv[0])
        path = os.path.join(out, f"m{shard}-p{p}")
        with open(path, "wb") as f:
            f.write(cctx.compress(pickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL)))
            f.flush()
            os.fsync(f.fileno())
    return sent


def reducer(args):
    p, shards, out = args
    dctx = zstandard.ZstdDecompressor()
    runs = []
    for m in range(shards):
        with open(os.path.join(out, f"m{m}-p{p}"), "rb") as f:
            runs.append(pickle.loads(dctx.decompress(f.read())))
    got = Counter()
    for key, group in groupby(heapq.merge(*runs, key=lambda kv: kv[0]), key=lambda kv: kv[0]):
        got[key] += sum(1 for _ in group)
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--items-per-shard", type=int, default=50000)
    ap.add_argument("--item-bytes", type=int, default=200)
    ap.add_argument("--keys", type=int, default=10000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--processes", type=int, default=os.cpu_count())
    ap.add_argument("--payload", choices=PAYLOADS, default="random")
    a = ap.parse_args()
    out = tempfile.mkdtemp(prefix="zephyr-style-")
    try:
        start = time.perf_counter()
        with multiprocessing.Pool(a.processes) as pool:
            sent = pool.map(mapper, [(m, a.items_per_shard, a.keys, a.item_bytes, a.partitions,
                                      out, a.payload) for m in range(a.shards)])
            scattered = time.perf_counter()
            got = pool.map(reducer, [(p, a.shards, out) for p in range(a.partitions)])
        end = time.perf_counter()
        expected, counted = Counter(), Counter()
        for c in sent:
            expected.update(c)
        for c in got:
            counted.update(c)
        total = a.shards * a.items_per_shard
        usage = [resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF,
                                                           resource.RUSAGE_CHILDREN)]
        print("RESULT " + json.dumps({
            "way": "zephyr-style pure Python (pickle + zstd, sorted chunks, heapq merge)",
            "shards": a.shards, "items_per_shard": a.items_per_shard,
            "partitions": a.partitions, "processes": a.processes, "payload": a.payload,
            "elapsed_s": round(end - start, 3), "items_per_sec": round(total / (end - start)),
            "scatter_s": round(scattered - start, 3), "reduce_s": round(end - scattered, 3),
            "counts_match": expected == counted,
            "peak_rss_mb": round(max(usage) / 1024, 1),
        }), flush=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
