"""The cluster's control plane under faults, measured (docs/benchmarks.md, "Cluster under
faults"): a real etcd and three sluice-servers on 127.0.0.2-4 (tests/harness/local_cluster.py),
driven through the Python client (the C++ client underneath, as every engine's).

  reader    a committed shuffle (8 partitions x 3 mappers, R=2) read in full by a new client,
            etcd up and etcd SIGSTOPped, interleaved round by round
  hung      a server SIGSTOPped first in the client's list: the latency of each of 10 creates
            and 10 status calls (call_timeout 5 s)
  restart   mapper attempts written one after another while a server is restarted between
            them (drained, then killed -9): attempts lost (goal 0)
  rolling   a rolling restart of the 3 servers (each drained, restarted, then the next) while
            4 mappers write attempts back to back; each failed attempt is retried as an
            engine would (a new attempt id, after the error's retry_after or 1 s): the most
            retries one mapper task needed, and how long a task waited

    PYTHONPATH=build/python /usr/bin/python3 bench/faults_bench.py [--rounds 5] [--build build]
"""
import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

import sluice

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "harness"))
from local_cluster import LocalCluster  # noqa: E402

PARTITIONS, MAPPERS, ITEMS = 8, 3, 20000


def write(client, sid, mapper, attempt, items=ITEMS):
    with client.writer(sid, mapper=mapper, attempt=attempt, sort_by_key=True) as w:
        w.write_many(((i * 7919 + mapper) % 5000, {"m": mapper, "i": i, "pad": "x" * 100})
                     for i in range(items))
    return w.result


def read_all(client, sid):
    n = 0
    for p in range(PARTITIONS):
        for _ in client.reader(sid, p, order="key", require_complete=True).groups():
            n += 1
    return n


def bench_reader(c, rounds):
    client = sluice.connect(c.servers)
    client.create_shuffle("r", partitions=PARTITIONS, mappers=MAPPERS, replication=2)
    for m in range(MAPPERS):
        write(client, "r", m, 1)
    groups = read_all(client, "r")  # every server has read the placement and decisions
    up, down = [], []
    for _ in range(rounds):
        t = time.monotonic()
        assert read_all(sluice.connect(c.servers), "r") == groups
        up.append(time.monotonic() - t)
        c.etcd.send_signal(19)  # SIGSTOP
        try:
            time.sleep(1.5)  # the servers have found etcd down
            t = time.monotonic()
            assert read_all(sluice.connect(c.servers, call_timeout=10), "r") == groups
            down.append(time.monotonic() - t)
        finally:
            c.etcd.send_signal(18)  # SIGCONT
        time.sleep(1.5)
    print(f"reader: new client reads {PARTITIONS} partitions ({MAPPERS * ITEMS} records, "
          f"{groups} keys)")
    for i, (u, d) in enumerate(zip(up, down)):
        print(f"  round {i + 1}: etcd up {u * 1000:.0f} ms, etcd stopped {d * 1000:.0f} ms, "
              f"ratio {d / u:.2f}")
    print(f"  median: up {statistics.median(up) * 1000:.0f} ms, stopped "
          f"{statistics.median(down) * 1000:.0f} ms, ratio of medians "
          f"{statistics.median(down) / statistics.median(up):.2f}")


def bench_hung(c):
    client = sluice.connect(c.servers, call_timeout=5)
    client.create_shuffle("warm", partitions=4, mappers=1)
    c.pause(0)
    try:
        creates, statuses = [], []
        for i in range(10):
            t = time.monotonic()
            client.create_shuffle(f"h{i}", partitions=4, mappers=1)
            creates.append(time.monotonic() - t)
            t = time.monotonic()
            client.shuffle_status(f"h{i}")
            statuses.append(time.monotonic() - t)
    finally:
        c.resume(0)
    fmt = lambda xs: ", ".join(f"{x * 1000:.0f}" for x in xs)  # noqa: E731
    print("hung: server n0 SIGSTOPped, first in the list, call_timeout 5 s")
    print(f"  creates (ms): {fmt(creates)}")
    print(f"  statuses (ms): {fmt(statuses)}")


def bench_restart(c, rounds):
    client = sluice.connect(c.servers)
    client.create_shuffle("s", partitions=PARTITIONS, mappers=2 * rounds * 3, replication=2)
    lost = []
    m = 0
    for kind in ("drained", "killed -9"):
        for r in range(rounds):
            for victim in range(3):
                if kind == "drained":
                    c.drain(victim)
                else:
                    c.kill(victim)
                c.start(victim)
                try:
                    write(client, "s", m, 1, items=2000)
                except sluice.Error as e:
                    lost.append(f"{kind} n{victim}: {e.code} {e.message[:100]}")
                m += 1
    print(f"restart: {m} attempts, each right after a server restart (half drained, half "
          f"killed -9): {len(lost)} lost")
    for line in lost:
        print("  " + line)


def bench_rolling(c, mappers=4):
    client = sluice.connect(c.servers)
    client.create_shuffle("roll", partitions=PARTITIONS, mappers=0, replication=2)
    stop = threading.Event()
    tasks = []  # per task: (retries, seconds from the first failure to the commit)
    errors = {}
    lock = threading.Lock()

    def mapper(k):
        task = 0
        attempt = 0
        while not stop.is_set():
            retries, first_failure = 0, None
            while True:
                attempt += 1
                try:
                    write(client, "roll", k * 100000 + task, attempt, items=2000)
                    break
                except sluice.Error as e:
                    if not e.retryable:
                        raise
                    retries += 1
                    first_failure = first_failure or time.monotonic()
                    with lock:
                        key = f"{e.code} {e.reason or ''}".strip()
                        errors[key] = errors.get(key, 0) + 1
                    time.sleep(e.retry_after or 1.0)
            with lock:
                tasks.append((retries, time.monotonic() - first_failure if first_failure else 0))
            task += 1

    threads = [threading.Thread(target=mapper, args=(k,)) for k in range(mappers)]
    for t in threads:
        t.start()
    time.sleep(2)
    windows = []
    for victim in range(3):
        t = time.monotonic()
        c.drain(victim)
        c.start(victim)
        windows.append(time.monotonic() - t)
        time.sleep(2)
    stop.set()
    for t in threads:
        t.join()
    retried = [t for t in tasks if t[0] > 0]
    print(f"rolling: 3 servers drained and restarted one after another under {mappers} mappers "
          f"({len(tasks)} tasks committed)")
    print("  each server's drain-to-registered: " +
          ", ".join(f"{w * 1000:.0f} ms" for w in windows))
    print(f"  tasks retried: {len(retried)}; most retries of one task: "
          f"{max((r for r, _ in tasks), default=0)}; longest wait from a task's first failure "
          f"to its commit: {max((w for _, w in tasks), default=0):.1f} s")
    print(f"  failures by code and reason: {errors}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default="reader,hung,restart,rolling")
    a = ap.parse_args()
    server = os.path.join(a.build, "server", "sluice-server")
    only = a.only.split(",")
    for part in ("reader", "hung", "restart", "rolling"):
        if part not in only:
            continue
        with tempfile.TemporaryDirectory(prefix="sluice-faults-") as tmp, \
                LocalCluster(tmp, server, extra_flags=["--memory_budget_mb=128"]) as c:
            if part == "reader":
                bench_reader(c, a.rounds)
            elif part == "hung":
                bench_hung(c)
            elif part == "restart":
                bench_restart(c, max(1, a.rounds // 2))
            else:
                bench_rolling(c)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
