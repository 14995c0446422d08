"""The seed workload from Python: `python3 -m sluice.bench`.

Mappers each write items of ~200 bytes (dicts {key, seq, src, payload}, keyed by an int out of
--keys; the very items `sluice bench` makes, from its generator: `columns()`) through
`Writer.write_many`, sorted for a KEY-ordered read; then reducers read every partition in key order
with `Reader.groups()` and count each key's items, which must match what was sent. Mappers and
reducers are tasks of a pool of worker processes (--workers, one per core by default: Python
workers are processes, as in zephyr, Ray or Dask), or of threads (--threads). Against --server, or
a sluice-server child on 127.0.0.1 with a temporary data directory (durable commits). Prints a
RESULT line of JSON, like `sluice bench`.

--columns: the same items made as numpy columns, written with `Writer.write_columns` and read with
`Reader.frame_groups()`, each key's rows counted exactly. --steps: one process, the columns path
step by step at 400,000 rows (make the columns, rows from columns, writer adds, close: push and
commit, fetch, columns from records, numpy arrays): the seconds and nanoseconds per row of each.
"""
import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import multiprocessing
import multiprocessing.pool
import time
from collections import Counter

import sluice


def find_server():
    env = os.environ.get("SLUICE_SERVER_BIN")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))  # <build>/python/sluice
    built = os.path.join(here, "..", "..", "server", "sluice-server")
    if os.access(built, os.X_OK):
        return os.path.normpath(built)
    found = shutil.which("sluice-server")
    if found:
        return found
    sys.exit("sluice.bench: no sluice-server (set SLUICE_SERVER_BIN, or pass --server)")


def start_server(memory_mb):
    data = tempfile.mkdtemp(prefix="sluice-pybench-")
    p = subprocess.Popen([find_server(), f"--data_dir={data}", "--listen=127.0.0.1:0",
                          f"--memory_budget_mb={memory_mb}", "--log_level=warn"],
                         stdout=subprocess.PIPE, text=True)
    port = int(re.search(r"listening on port (\d+)", p.stdout.readline()).group(1))
    return p, data, f"127.0.0.1:{port}"


_ALNUM = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
PAYLOADS = ("random", "same")


def _draws(seed, count, skip=0):
    """`count` numbers of the C++ bench's generator seeded with `seed` (splitmix64,
    bench/workload.cc's Rng), after its first `skip`, as uint64s."""
    import numpy as np
    golden = np.array(0x9e3779b97f4a7c15, dtype=np.uint64)
    state = np.array(seed, dtype=np.uint64) * golden + np.array(1, dtype=np.uint64)
    z = state + np.arange(skip + 1, skip + count + 1, dtype=np.uint64) * golden
    z = (z ^ (z >> np.uint64(30))) * np.array(0xbf58476d1ce4e5b9, dtype=np.uint64)
    z = (z ^ (z >> np.uint64(27))) * np.array(0x94d049bb133111eb, dtype=np.uint64)
    return z ^ (z >> np.uint64(31))


def columns(shard, n, keys, item_bytes, payload="random"):
    """Shard `shard`'s items as numpy columns {key, seq, src, payload}: the very items the C++
    bench (`sluice bench`, bench/workload.cc) makes for that shard with the same --keys and
    --item-bytes. Its generator, seeded with shard + 1, draws each item's key (a number mod
    `keys`), then with payload="random" its payload: item_bytes - 32 (at least 8) alphanumeric
    characters, ten a number (6 bits each, mod 62), each item its own; with payload="same"
    every payload is one str of that many "x" (pickle's memo writes it once a batch)."""
    import numpy as np
    if payload not in PAYLOADS:
        raise ValueError(f"payload must be one of {PAYLOADS}, not {payload!r}")
    length = max(8, item_bytes - 32)
    per_item = 1 + ((length + 9) // 10 if payload == "random" else 0)
    key = np.empty(n, dtype=np.int64)
    values = np.empty(n, dtype=object)
    # As bench/workload.cc: 12 bits make two characters, through a table of the 4,096 pairs.
    v = np.arange(4096)
    alnum = np.frombuffer(_ALNUM, dtype=np.uint8)
    pairs = np.stack([alnum[(v & 63) % 62], alnum[(v >> 6) % 62]], axis=1)  # [v] = lo, hi
    step = 8192
    for at in range(0, n, step):  # in slices: the numbers take 8 bytes a character
        rows = min(step, n - at)
        d = _draws(shard + 1, rows * per_item, at * per_item).reshape(rows, per_item)
        key[at:at + rows] = (d[:, 0] % np.uint64(keys)).astype(np.int64)
        if payload == "random":
            # (bits past 60 are never used, so the signed shift's sign bits do not matter)
            numbers = np.ascontiguousarray(d[:, 1:]).view(np.int64)
            codes = np.empty(numbers.shape + (5,), dtype=np.int64)
            for k in range(5):  # (one shift at a time: numpy's broadcast shift is 20x slower)
                np.bitwise_and(numbers >> (12 * k), 4095, out=codes[:, :, k])
            chars = pairs[codes].reshape(rows, -1)[:, :length]
            strs = [x.decode() for x in np.ascontiguousarray(chars).view(f"S{length}").ravel()]
            values[at:at + rows] = np.array(strs, dtype=object)
    if payload == "same":
        values[:] = "x" * length
    return {"key": key, "seq": np.arange(n, dtype=np.int64),
            "src": np.full(n, shard, dtype=np.int64), "payload": values}


def items(shard, n, keys, item_bytes, counts, payload="random"):
    """The same items as (key, dict) pairs, counted per key into `counts`."""
    cols = columns(shard, n, keys, item_bytes, payload)
    for key, seq, value in zip(cols["key"].tolist(), cols["seq"].tolist(), cols["payload"]):
        counts[key] += 1
        yield key, {"key": key, "seq": seq, "src": shard, "payload": value}


_clients = {}


def _client(server):
    """One client per worker (process or thread pool) and server: connections are reused."""
    c = _clients.get(server)
    if c is None:
        c = _clients[server] = sluice.connect(server)
    return c


def mapper(args):
    server, sid, m, n, keys, item_bytes, buffer_mb, payload = args
    sent = Counter()
    with _client(server).writer(sid, mapper=m, sort_by_key=True, buffer_mb=buffer_mb) as w:
        w.write_many(items(m, n, keys, item_bytes, sent, payload))
    return sent


# --premade: every shard's columns, made before the clock by the parent process before it forks
# its workers (which see them copy-on-write): the timed run is the shuffle alone.
_premade = {}


def columns_mapper(args):
    import numpy as np
    server, sid, m, n, keys, item_bytes, buffer_mb, payload = args
    cols = _premade.get(m) or columns(m, n, keys, item_bytes, payload)
    with _client(server).writer(sid, mapper=m, sort_by_key=True, buffer_mb=buffer_mb) as w:
        w.write_columns(cols, key="key")
    return np.bincount(cols["key"], minlength=keys)


def columns_reducer(args):
    import numpy as np
    server, sid, p, keys = args
    got = np.zeros(keys, dtype=np.int64)
    for key, frame in _client(server).reader(sid, p, order="key",
                                             require_complete=True).frame_groups():
        got[key] += len(frame["seq"])
    return got


def generate_only(args):
    _, _, m, n, keys, item_bytes, _, payload = args
    sent = Counter()
    for _ in items(m, n, keys, item_bytes, sent, payload):
        pass
    return sent


def generate_columns_only(args):
    _, _, m, n, keys, item_bytes, _, payload = args
    return Counter({"made": len(columns(m, n, keys, item_bytes, payload)["key"])})


def reducer(args):
    server, sid, p = args
    got = Counter()
    for key, values in _client(server).reader(sid, p, order="key",
                                              require_complete=True).groups():
        got[key] += len(values)
    return got


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m sluice.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--server", help="host:port (or a server list); default: a child server")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--items-per-shard", type=int, default=50000)
    ap.add_argument("--item-bytes", type=int, default=200)
    ap.add_argument("--keys", type=int, default=10000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--buffer-mb", type=int, default=4)
    ap.add_argument("--server-memory-mb", type=int, default=128)
    ap.add_argument("--workers", type=int, default=os.cpu_count(),
                    help="worker processes (or threads) running the mappers, then the reducers")
    ap.add_argument("--threads", action="store_true", help="threads instead of processes")
    ap.add_argument("--columns", action="store_true",
                    help="items as numpy columns: write_columns, then frame_groups")
    ap.add_argument("--premade", action="store_true",
                    help="with --columns: every shard's columns made before the clock starts "
                         "(and before the workers fork), so the shuffle alone is timed")
    ap.add_argument("--steps", action="store_true",
                    help="the columns path's cost step by step, in one process")
    ap.add_argument("--payload", choices=PAYLOADS, default="random",
                    help="each item's payload random alphanumeric characters of its own (the "
                         "C++ bench's items), or one str for all (pickle writes it once)")
    ap.add_argument("--generate-only", action="store_true",
                    help="only make the items, in the same workers, and shuffle nothing: the "
                         "workload's own Python, a ceiling for any shuffle of it (with "
                         "--columns: the numpy columns write_columns would take)")
    a = ap.parse_args(argv)
    if a.premade and (not a.columns or a.generate_only or a.steps):
        ap.error("--premade goes with --columns, in a shuffle run")  # (before any server starts)
    if a.generate_only:
        return run_generate_only(a)
    if a.steps:
        return run_steps(a)

    child = None
    if a.server is None:
        child, data, a.server = start_server(a.server_memory_mb)
    if a.columns:
        import numpy  # noqa: F401  (once, before the workers fork)
    if a.premade:
        for m in range(a.shards):
            _premade[m] = columns(m, a.items_per_shard, a.keys, a.item_bytes, a.payload)
    # The worker processes are forked before this process makes a gRPC client (gRPC's threads
    # do not survive a fork); each worker makes its own.
    pool = (multiprocessing.pool.ThreadPool(a.workers) if a.threads else
            multiprocessing.get_context("fork").Pool(a.workers))
    try:
        client = sluice.connect(a.server)
        sid = f"pybench-{os.getpid()}-{int(time.time() * 1000)}"
        client.create_shuffle(sid, partitions=a.partitions, mappers=a.shards)
        with pool:
            start = time.perf_counter()
            sent = pool.map(columns_mapper if a.columns else mapper,
                            [(a.server, sid, m, a.items_per_shard, a.keys, a.item_bytes,
                              a.buffer_mb, a.payload) for m in range(a.shards)],
                            chunksize=1)
            scattered = time.perf_counter()
            if a.columns:
                got = pool.map(columns_reducer, [(a.server, sid, p, a.keys)
                                                 for p in range(a.partitions)], chunksize=1)
            else:
                got = pool.map(reducer, [(a.server, sid, p) for p in range(a.partitions)],
                               chunksize=1)
            end = time.perf_counter()
        client.delete_shuffle(sid)
        expected, counted = Counter(), Counter()
        for c in sent:
            expected.update(dict(enumerate(c.tolist())) if a.columns else c)
        for c in got:
            counted.update(dict(enumerate(c.tolist())) if a.columns else c)
        expected, counted = +expected, +counted  # zero counts out
        total = a.shards * a.items_per_shard
        result = {
            "shards": a.shards, "items_per_shard": a.items_per_shard, "partitions": a.partitions,
            "order": "KEY", "elapsed_s": round(end - start, 3),
            "items_per_sec": round(total / (end - start)),
            "scatter_s": round(scattered - start, 3), "reduce_s": round(end - scattered, 3),
            "expected_items": total, "counted_items": sum(counted.values()),
            "counts_match": expected == counted,
            "workers": a.workers, "worker_kind": "threads" if a.threads else "processes",
            "path": "columns" if a.columns else "dicts", "payload": a.payload,
            "premade": a.premade,
            "peak_rss_mb": round(max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                                     resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
                                 / 1024, 1),
            "embedded_server": child is not None,
        }
        print("RESULT " + json.dumps(result), flush=True)
        return 0 if result["counts_match"] else 1
    finally:
        pool.terminate()
        if child is not None:
            child.terminate()
            child.wait(timeout=60)
            shutil.rmtree(data, ignore_errors=True)


def run_steps(a):
    """The columns path step by step in this process: one mapper writes every row (the
    shards' rows together), then one reader reads every partition."""
    import numpy as np
    child = None
    if a.server is None:
        child, data, a.server = start_server(a.server_memory_mb)
    try:
        client = sluice.connect(a.server)
        sid = f"pysteps-{os.getpid()}-{int(time.time() * 1000)}"
        client.create_shuffle(sid, partitions=a.partitions, mappers=1)
        rows = a.shards * a.items_per_shard
        t0 = time.perf_counter()
        cols = columns(0, rows, a.keys, a.item_bytes, a.payload)
        make_s = time.perf_counter() - t0
        w = client.writer(sid, mapper=0, sort_by_key=True, buffer_mb=a.buffer_mb)
        w.write_columns(cols, key="key")
        w.close()
        wt = w._w.timings()
        got = np.zeros(a.keys, dtype=np.int64)
        rt = {"fetch_s": 0.0, "decode_s": 0.0, "to_python_s": 0.0}
        for p in range(a.partitions):
            r = client.reader(sid, p, order="key", require_complete=True)
            for key, frame in r.frame_groups():
                got[key] += len(frame["seq"])
            for k, v in r._r.timings().items():
                rt[k] += v
        client.delete_shuffle(sid)
        ok = bool((got == np.bincount(cols["key"], minlength=a.keys)).all())
        steps = {"make_columns": make_s, "rows_from_columns": wt["encode_rows_s"],
                 "writer_add": wt["add_s"], "close_push_commit": wt["close_s"],
                 "fetch": rt["fetch_s"], "columns_from_records": rt["decode_s"],
                 "numpy_arrays": rt["to_python_s"]}
        print("RESULT " + json.dumps({
            "rows": rows, "counts_match": ok,
            "seconds": {k: round(v, 4) for k, v in steps.items()},
            "ns_per_row": {k: round(v / rows * 1e9, 1) for k, v in steps.items()},
        }), flush=True)
        return 0 if ok else 1
    finally:
        if child is not None:
            child.terminate()
            child.wait(timeout=60)
            shutil.rmtree(data, ignore_errors=True)


def run_generate_only(a):
    pool = (multiprocessing.pool.ThreadPool(a.workers) if a.threads else
            multiprocessing.get_context("fork").Pool(a.workers))
    with pool:
        start = time.perf_counter()
        make = generate_columns_only if a.columns else generate_only
        sent = pool.map(make, [(None, None, m, a.items_per_shard, a.keys, a.item_bytes, None,
                                a.payload) for m in range(a.shards)], chunksize=1)
        end = time.perf_counter()
    total = a.shards * a.items_per_shard
    made = sum(sum(c.values()) for c in sent)
    print("RESULT " + json.dumps({
        "shards": a.shards, "items_per_shard": a.items_per_shard, "generate_only": True,
        "path": "columns" if a.columns else "dicts",
        "elapsed_s": round(end - start, 3), "items_per_sec": round(total / (end - start)),
        "expected_items": total, "counted_items": made, "counts_match": made == total,
        "workers": a.workers, "worker_kind": "threads" if a.threads else "processes",
    }), flush=True)
    return 0 if made == total else 1


if __name__ == "__main__":
    sys.exit(main())
