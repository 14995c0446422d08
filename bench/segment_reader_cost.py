"""What opening a reader costs when a shuffle's partitions may split (docs/benchmarks.md, "Huge
partitions over servers"): an 8,192-partition shuffle at R = 2 on two clusters, one splitting and
one not; 256 readers of small partitions opened and drained on each in turn, 3 rounds.

    /usr/bin/python3 bench/segment_reader_cost.py BUILD_DIR SPLIT_SERVERS WHOLE_SERVERS
(bench/segment_reader_cost.sh starts the clusters and runs it.)"""
import sys
import time

sys.path.insert(0, f"{sys.argv[1]}/python")
import sluice  # noqa: E402

split = sluice.connect(sys.argv[2])
whole = sluice.connect(sys.argv[3])
PARTITIONS, READERS, ROUNDS = 8192, 256, 3
for client in (split, whole):
    client.create_shuffle("w", PARTITIONS, 4, replication=2)
    for m in range(4):
        with client.writer("w", m) as w:
            for i in range(2000):
                w.write(i, b"x" * 20)


def read_block(client, start):
    t = time.perf_counter()
    records = 0
    for p in range(start, start + READERS):
        for _ in client.reader("w", p):
            records += 1
    return (time.perf_counter() - t) / READERS * 1000, records


results = {"split": [], "whole": []}
for r in range(ROUNDS):
    for name, client in (("split", split), ("whole", whole)):
        ms, records = read_block(client, r * READERS)
        results[name].append(ms)
        print(f"round {r} {name}: {ms:.2f} ms a reader ({records} records)", flush=True)
for name, v in results.items():
    v.sort()
    print(f"{name}: min/median/max {v[0]:.2f} / {v[len(v) // 2]:.2f} / {v[-1]:.2f} ms a reader")
