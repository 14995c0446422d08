"""The Python client against a real cluster: a real etcd and three sluice-server processes, each
on its own loopback address (127.0.0.2-4) with its own data directory, given to the client as a
server list. Replicated writes and key-ordered reads, the first commit winning across attempts,
reads that go on after a server is killed -9, and deletes everywhere.

Run by ctest `python_cluster` (PYTHONPATH=<build>/python, SLUICE_SERVER_BIN set; etcd from
Debian's etcd-server, SLUICE_ETCD_BIN to override; the cluster is tests/harness/local_cluster.py)."""
import os
import random
import signal
import sys
import time
from collections import Counter

import pytest

import sluice

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "harness"))
from local_cluster import LocalCluster, wait_for  # noqa: E402

SERVER = os.environ.get("SLUICE_SERVER_BIN", "build/server/sluice-server")


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(tmp_path, SERVER) as c:
        yield c


def write_mappers(client, sid, mappers, items_per_mapper, keys):
    """Each mapper writes dicts keyed by an int; returns the count sent per key."""
    sent = Counter()
    for m in range(mappers):
        rng = random.Random(m)
        pairs = []
        for seq in range(items_per_mapper):
            k = rng.randrange(keys)
            sent[k] += 1
            pairs.append((k, {"key": k, "mapper": m, "seq": seq, "pad": "y" * 50}))
        with client.writer(sid, mapper=m, sort_by_key=True) as w:
            w.write_many(pairs)
        assert not w.result["duplicate"] and w.result["records"] == items_per_mapper
    return sent


def read_groups(client, sid, partitions):
    got = Counter()
    for p in range(partitions):
        last = None
        for key, values in client.reader(sid, p, order="key", require_complete=True).groups():
            assert last is None or sluice.packb(last) < sluice.packb(key), "keys out of order"
            assert sluice.partition_of(key, partitions) == p
            assert all(v["key"] == key for v in values)
            got[key] += len(values)
            last = key
    return got


def test_replicated_shuffle_through_a_server_list(cluster):
    client = sluice.connect(cluster.servers)
    assert client.create_shuffle("c1", partitions=6, mappers=3, replication=2)
    sent = write_mappers(client, "c1", 3, 2000, 300)
    assert read_groups(client, "c1", 6) == sent
    status = client.shuffle_status("c1")
    assert status["committed_mappers"] == [0, 1, 2] and status["num_partitions"] == 6
    # Every server holds some of it: the client reached all three through the list.
    for a in cluster.addresses:
        one = sluice.connect(a)
        assert one.shuffle_status("c1")["num_partitions"] == 6


def test_first_commit_wins_across_attempts(cluster):
    client = sluice.connect(cluster.servers)
    client.create_shuffle("c2", partitions=4, mappers=1)
    with client.writer("c2", mapper=0, attempt=1) as w:
        w.write_many((i, f"first {i}") for i in range(100))
    with client.writer("c2", mapper=0, attempt=2) as w2:
        w2.write_many((i, f"second {i}") for i in range(100))
    assert not w.result["duplicate"] and w.result["winning_attempt"] == 1
    assert w2.result["duplicate"] and w2.result["winning_attempt"] == 1
    values = [v for p in range(4) for _, v in client.reader("c2", p)]
    assert sorted(values) == sorted(f"first {i}" for i in range(100))


def test_a_revoked_mapper_runs_again_into_the_same_shuffle(cluster):
    client = sluice.connect(cluster.servers)
    client.create_shuffle("c5", partitions=4, mappers=2, replication=2)
    for m in range(2):
        with client.writer("c5", mapper=m, attempt=1) as w:
            w.write_many((i, f"m{m} first {i}") for i in range(200))
    status = client.shuffle_status("c5")
    assert status["committed_mappers"] == [0, 1] and status["lost_partitions"] == {}
    done = client.revoke_mappers("c5", [0], status["placement_epoch"])
    assert done["attempts"] == [1] and done["placement_epoch"] == status["placement_epoch"] + 1
    assert client.shuffle_status("c5")["committed_mappers"] == [1]
    # A view older than the record that did not revoke this mapper: read the status again.
    with pytest.raises(sluice.Error) as stale:
        client.revoke_mappers("c5", [1], status["placement_epoch"])
    assert stale.value.code == "ABORTED" and stale.value.retryable
    with client.writer("c5", mapper=0, attempt=2) as w:
        w.write_many((i, f"m0 again {i}") for i in range(150))
    assert not w.result["duplicate"] and w.result["winning_attempt"] == 2
    values = sorted(v for p in range(4) for _, v in client.reader("c5", p, require_complete=True))
    assert values == sorted([f"m0 again {i}" for i in range(150)] +
                            [f"m1 first {i}" for i in range(200)])


def test_split_keys_and_hot_keys_come_from_a_replica_and_survive_a_kill(cluster):
    client = sluice.connect(cluster.servers)
    client.create_shuffle("c6", partitions=2, mappers=2, replication=2)
    for m in range(2):
        with client.writer("c6", mapper=m, sort_by_key=True, buffer_mb=1) as w:
            w.write_many((("hot" if i % 4 == 0 else f"k{i:06d}"), i) for i in range(20000))
    plans = [client.split_keys("c6", p, 4) for p in range(2)]
    hot_partition = sluice.partition_of("hot", 2)
    whole = {p: list(client.reader("c6", p, order="key")) for p in range(2)}
    cluster.kill(1)  # every partition has another replica: plans and slices still come
    for p in range(2):
        plan = client.split_keys("c6", p, 4)
        assert plan["keys"] == plans[p]["keys"] and len(plan["keys"]) >= 1
        bounds = [None] + plan["keys"] + [None]
        sliced = []
        for i in range(len(bounds) - 1):
            sliced.extend(client.reader("c6", p, from_key=bounds[i], to_key=bounds[i + 1]))
        assert sliced == whole[p]
    hot = client.shuffle_status("c6", hot_keys=1)["partitions"][hot_partition]["hot_keys"]
    assert sluice.unpackb(hot[0]["key"]) == "hot" and hot[0]["records"] == 2 * 5000


def test_columns_through_a_cluster_and_after_a_kill(cluster):
    import numpy as np
    client = sluice.connect(cluster.servers)
    client.create_shuffle("cc", partitions=6, mappers=2, replication=2)
    expected = np.zeros(500, dtype=np.int64)
    for m in range(2):
        k = np.random.default_rng(m).integers(0, 500, size=3000)
        expected += np.bincount(k, minlength=500)
        with client.writer("cc", mapper=m, sort_by_key=True) as w:
            w.write_columns({"key": k, "m": np.full(3000, m), "seq": np.arange(3000)}, key="key")
    cluster.kill(1)
    got = np.zeros(500, dtype=np.int64)
    for p in range(6):
        for key, rows in client.reader("cc", p, order="key", require_complete=True).frame_groups():
            assert sluice.partition_of(key, 6) == p and (rows["key"] == key).all()
            got[key] += len(rows["seq"])
    assert (got == expected).all()


def test_reads_go_on_after_a_server_is_killed(cluster):
    client = sluice.connect(cluster.servers)
    client.create_shuffle("c3", partitions=6, mappers=2, replication=2)
    sent = write_mappers(client, "c3", 2, 3000, 500)
    cluster.kill(1)
    # Every partition has a copy on another server: the reads switch to it, exactly.
    assert read_groups(client, "c3", 6) == sent


def test_delete_removes_it_everywhere(cluster):
    client = sluice.connect(cluster.servers)
    client.create_shuffle("c4", partitions=3, mappers=1)
    write_mappers(client, "c4", 1, 100, 10)
    client.delete_shuffle("c4")
    for a in cluster.addresses:
        with pytest.raises(sluice.Error) as e:
            sluice.connect(a).shuffle_status("c4")
        assert e.value.code == "NOT_FOUND"


def test_with_etcd_stopped_a_new_client_reads_and_errors_say_to_retry(cluster):
    client = sluice.connect(cluster.servers)
    client.create_shuffle("c5", partitions=6, mappers=2, replication=2)
    sent = write_mappers(client, "c5", 2, 500, 50)
    assert read_groups(client, "c5", 6) == sent  # the servers have read what they serve
    cluster.etcd.send_signal(signal.SIGSTOP)
    try:
        fresh = sluice.connect(cluster.servers, call_timeout=10)
        assert read_groups(fresh, "c5", 6) == sent
        with pytest.raises(sluice.Error) as e:
            fresh.create_shuffle("c6", partitions=2)
        assert e.value.code == "UNAVAILABLE" and e.value.retryable
        assert e.value.reason == "ETCD_UNAVAILABLE" and "etcd" in e.value.message
    finally:
        cluster.etcd.send_signal(signal.SIGCONT)

    def not_found_again():  # once the servers have seen etcd answer again (within ~2 s)
        try:
            fresh.shuffle_status("no-such-shuffle")
        except sluice.Error as e:
            if e.code == "UNAVAILABLE":
                return False
            assert e.code == "NOT_FOUND" and not e.retryable and e.reason is None, e
            return True
        raise AssertionError("a shuffle never created has a status")

    wait_for("NOT_FOUND with etcd back", not_found_again, timeout=15)


def test_keepalive_set_from_python_finds_a_hung_server_in_seconds(cluster):
    client = sluice.connect(cluster.servers, keepalive=1, keepalive_timeout=1, call_timeout=3)
    client.create_shuffle("c7", partitions=6, mappers=2, replication=2)
    sent = write_mappers(client, "c7", 2, 500, 50)
    cluster.pause(0)  # hung: its connections stay up
    try:
        start = time.monotonic()
        assert read_groups(client, "c7", 6) == sent  # its partitions from their other replica
        took = time.monotonic() - start
        # One keepalive (1 s + 1 s) per stream that was on it, not gRPC's 20 s default.
        assert took < 15, f"reads took {took:.1f} s"
    finally:
        cluster.resume(0)


def test_connect_checks_its_timeouts():
    with pytest.raises(ValueError, match="keepalive"):
        sluice.connect("127.0.0.1:1", keepalive=0.5)
    with pytest.raises(ValueError):
        sluice.connect("127.0.0.1:1", unhealthy_for=0)
    with pytest.raises(ValueError, match="stream_timeout"):
        sluice.connect("127.0.0.1:1", stream_timeout=0)
