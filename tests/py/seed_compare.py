#!/usr/bin/python3
"""Encodes the codec benchmark's records the seed's two ways and prints them beside Sluice.

The seed (zephyr's scatter-chunk PR) compared Python pickle and Python msgpack, each followed
by zstd level 3. This script runs `sluice-codec-bench --dump DIR --json`, reads the very same
records back from DIR/<dataset>.msgpack (a stream of [key, value] pairs), encodes them both
ways in Python, and prints sizes and items/s for all of them, plus whether Sluice AUTO is no
larger than the smaller Python encoding (the size target of the codec issue).

Needs Debian's interpreter and packages: /usr/bin/python3, python3-msgpack, python3-zstandard.

    /usr/bin/python3 tests/py/seed_compare.py --bench build/codec/sluice-codec-bench [--json]
"""
import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

import msgpack
import zstandard


def rate(n_items, fn, runs, min_run_s):
    fn()  # warm up
    rates = []
    for _ in range(runs):
        iters = 0
        start = time.perf_counter()
        while True:
            fn()
            iters += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_run_s:
                break
        rates.append(n_items * iters / elapsed)
    return statistics.median(rates)


def python_way(records, way, runs, min_run_s):
    comp = zstandard.ZstdCompressor(level=3)
    decomp = zstandard.ZstdDecompressor()
    if way == "pickle":
        def write():
            return comp.compress(pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL))

        def read(blob):
            return pickle.loads(decomp.decompress(blob))
    else:
        def write():
            return comp.compress(msgpack.packb(records, use_bin_type=True))

        def read(blob):
            return msgpack.unpackb(decomp.decompress(blob), raw=False)

    blob = write()
    assert read(blob) == records or way == "msgpack"  # msgpack gives lists for tuples
    return {
        "compressed_bytes": len(blob),
        "write_items_per_s": rate(len(records), write, runs, min_run_s),
        "read_items_per_s": rate(len(records), lambda: read(blob), runs, min_run_s),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True, help="path to sluice-codec-bench")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--min-run-s", type=float, default=0.2)
    ap.add_argument("--json", action="store_true", help="print JSON lines only")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([args.bench, "--json", "--dump", tmp], check=True,
                             capture_output=True, text=True).stdout
        sluice_rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        datasets = []
        for row in sluice_rows:
            if row["dataset"] not in datasets:
                datasets.append(row["dataset"])
        python_rows = {}
        for name in datasets:
            with open(os.path.join(tmp, name + ".msgpack"), "rb") as f:
                records = [tuple(pair) for pair in msgpack.Unpacker(f, raw=False)]
            for way in ("pickle", "msgpack"):
                python_rows[(name, way)] = python_way(records, way, args.runs, args.min_run_s)

    ok = True
    rows = []
    for name in datasets:
        for r in sluice_rows:
            if r["dataset"] == name:
                rows.append({"dataset": name, "encoder": "sluice " + r["layout"],
                             "write_items_per_s": r["write_items_per_s"],
                             "read_items_per_s": r["read_items_per_s"],
                             "compressed_bytes": r["compressed_bytes"]})
        for way in ("pickle", "msgpack"):
            rows.append({"dataset": name, "encoder": "python " + way + "+zstd",
                         **python_rows[(name, way)]})
        auto = next(r for r in sluice_rows if r["dataset"] == name and r["layout"] == "AUTO")
        best_python = min(python_rows[(name, w)]["compressed_bytes"] for w in ("pickle", "msgpack"))
        verdict = auto["compressed_bytes"] <= best_python
        ok = ok and verdict
        rows.append({"dataset": name, "check": "auto_size_le_best_python",
                     "auto_bytes": auto["compressed_bytes"], "best_python_bytes": best_python,
                     "pass": verdict})

    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print(f"{'dataset':<14} {'encoder':<22} {'write items/s':>14} {'read items/s':>14} "
              f"{'bytes':>9}")
        for r in rows:
            if "check" in r:
                print(f"{r['dataset']:<14} AUTO {r['auto_bytes']} B vs best Python "
                      f"{r['best_python_bytes']} B: {'PASS' if r['pass'] else 'FAIL'}\n")
                continue
            print(f"{r['dataset']:<14} {r['encoder']:<22} {r['write_items_per_s']:>14,.0f} "
                  f"{r['read_items_per_s']:>14,.0f} {r['compressed_bytes']:>9}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
