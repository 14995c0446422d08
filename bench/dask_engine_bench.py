"""sluice.dask against Dask distributed's own shuffle ("tasks") on the same frames and the same
LocalCluster (docs/benchmarks.md, "Dask on Sluice").

The frames: SHARDS partitions of ROWS rows {key < KEYS, seq, src, payload: 168 random alphanumeric
characters, each row its own}: the very items of `sluice bench` (sluice.bench.columns), made on the
workers by the same function for both sides and persisted there before the clock. Each round
shuffles them on `key` into PARTITIONS partitions, once through Sluice (a real sluice-server child,
fsync on, its data in a temporary directory on this machine's disk) and once with Dask's own
shuffle, alternating which goes first, and consumes each output partition on the workers (its rows
counted per key: the counts must be the made ones); one round of each, not counted, goes first
(imports, connections). Timed: the shuffle and the consumption; items/s = rows / seconds. The
workers' peak memory: their processes' resident set sampled every 20 ms during the round, the peak
of the sum less the sum just before it (the persisted input is in both). The server's resident set
at the end of each Sluice round is printed beside it. CPU-s: the CPU time the workers, the server
and this process (Dask's scheduler and client) spent in the round (on 2 cores a round takes at
least half of it).

    PYTHONPATH=build/python /usr/bin/python3 bench/dask_engine_bench.py [--scale 10] [--rounds 3]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pandas as pd

import dask
import dask.dataframe as dd
import distributed
import psutil

import sluice.dask
from sluice.bench import columns

def shard(m, n, keys, item_bytes=200):
    """Shard m's rows: the very items of `sluice bench` and sluice.bench (random payloads)."""
    return pd.DataFrame(columns(m, n, keys, item_bytes))


def key_counts(df, keys):
    return np.bincount(df["key"].to_numpy(), minlength=keys)


class Peak:
    """The peak of the workers' summed resident set, sampled on a thread."""

    def __init__(self, pids):
        self.procs = [psutil.Process(p) for p in pids]
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def now(self):
        return sum(p.memory_info().rss for p in self.procs)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.02)

    def __enter__(self):
        self.base = self.now()
        self.peak = self.base
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def start_server(binary, data):
    p = subprocess.Popen([binary, f"--data_dir={data}", "--listen=127.0.0.1:0",
                          "--worker_threads=2", "--log_level=warn"],
                         stdout=subprocess.PIPE, text=True)
    port = int(re.search(r"listening on port (\d+)", p.stdout.readline()).group(1))
    return p, f"127.0.0.1:{port}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--rows", type=int, default=50000, help="rows a shard at --scale 1")
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--keys", type=int, default=10000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--server", default=os.environ.get("SLUICE_SERVER_BIN",
                                                       "build/server/sluice-server"))
    a = ap.parse_args(argv)
    rows = a.rows * a.scale
    total = a.shards * rows
    data = tempfile.mkdtemp(prefix="sluice-dask-bench-", dir="/var/tmp")
    server, address = start_server(a.server, data)
    results = {"sluice": [], "dask": []}
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      dashboard_address=":0", silence_logs=50) as lc, \
                distributed.Client(lc) as client:
            pids = list(client.run(os.getpid).values())
            meta = shard(0, 0, a.keys)
            parts = [dask.delayed(shard)(m, rows, a.keys) for m in range(a.shards)]
            ddf = dd.from_delayed(parts, meta=meta).persist()
            distributed.wait(ddf)
            expected = sum(client.gather(client.compute(
                [dask.delayed(key_counts)(p, a.keys) for p in ddf.to_delayed()])))
            server_proc = psutil.Process(server.pid)
            # CPU: the workers, the server and this process (the scheduler and the client).
            cpu_procs = [psutil.Process(p) for p in pids] + [server_proc, psutil.Process()]

            def cpu_seconds():
                return sum(t.user + t.system for t in (p.cpu_times() for p in cpu_procs))

            def run(side):
                with sluice.dask.Shuffle(address) as s, Peak(pids) as peak:
                    server_base = server_proc.memory_info().rss
                    cpu_base = cpu_seconds()
                    start = time.perf_counter()
                    if side == "sluice":
                        out = s.shuffle(ddf, on="key", npartitions=a.partitions)
                    else:
                        out = ddf.shuffle("key", npartitions=a.partitions, shuffle="tasks")
                    got = sum(client.gather(client.compute(
                        [dask.delayed(key_counts)(p, a.keys) for p in out.to_delayed()])))
                    seconds = time.perf_counter() - start
                    cpu = cpu_seconds() - cpu_base
                    server_end = server_proc.memory_info().rss
                if not np.array_equal(got, expected):
                    sys.exit(f"{side}: the counts per key differ from the made ones")
                return {"items_per_s": total / seconds, "seconds": seconds, "cpu_s": cpu,
                        "workers_peak_mib": (peak.peak - peak.base) / 2**20,
                        "server_rss_mib": server_end / 2**20,
                        "server_rss_growth_mib": (server_end - server_base) / 2**20}

            for side in ("sluice", "dask"):  # warm-up, not counted: imports, connections
                run(side)
            for r in range(a.rounds):
                order = ("sluice", "dask") if r % 2 == 0 else ("dask", "sluice")
                for side in order:
                    res = run(side)
                    results[side].append(res)
                    print(f"round {r + 1} {side:6s}: {res['items_per_s']:,.0f} items/s "
                          f"({res['seconds']:.2f} s, {res['cpu_s']:.2f} CPU-s), workers' peak "
                          f"+{res['workers_peak_mib']:.0f} MiB" +
                          (f", server RSS {res['server_rss_mib']:.0f} MiB"
                           if side == "sluice" else ""), flush=True)
                ratio = (results["sluice"][-1]["items_per_s"] / results["dask"][-1]["items_per_s"])
                mem = (results["sluice"][-1]["workers_peak_mib"] /
                       max(results["dask"][-1]["workers_peak_mib"], 1e-9))
                print(f"round {r + 1}: sluice / dask items/s {ratio:.2f}, workers' peak memory "
                      f"{mem:.2f}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(data, ignore_errors=True)

    def median(side, field):
        return float(np.median([x[field] for x in results[side]]))

    summary = {
        "rows": total, "partitions": a.partitions, "rounds": a.rounds,
        "sluice_items_per_s": median("sluice", "items_per_s"),
        "dask_items_per_s": median("dask", "items_per_s"),
        "ratio_items_per_s": float(np.median([s["items_per_s"] / d["items_per_s"] for s, d in
                                              zip(results["sluice"], results["dask"])])),
        "sluice_cpu_s": median("sluice", "cpu_s"), "dask_cpu_s": median("dask", "cpu_s"),
        "sluice_workers_peak_mib": median("sluice", "workers_peak_mib"),
        "dask_workers_peak_mib": median("dask", "workers_peak_mib"),
        "server_rss_mib": median("sluice", "server_rss_mib"),
    }
    print("RESULT " + json.dumps(summary))


if __name__ == "__main__":
    main()
