"""The Python client against a real cluster: a real etcd and three sluice-server processes, each
on its own loopback address (127.0.0.2-4) with its own data directory, given to the client as a
server list. Replicated writes and key-ordered reads, the first commit winning across attempts,
reads that go on after a server is killed -9, and deletes everywhere.

Run by ctest `python_client` (PYTHONPATH=<build>/python, SLUICE_SERVER_BIN set; etcd from
Debian's etcd-server, SLUICE_ETCD_BIN to override)."""
import os
import random
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections import Counter

import pytest

import sluice

SERVER = os.environ.get("SLUICE_SERVER_BIN", "build/server/sluice-server")
ETCD = os.environ.get("SLUICE_ETCD_BIN", "/usr/bin/etcd")


def free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for(what, ready, timeout=30):
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if ready():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} was not ready within {timeout} s")


class Cluster:
    """etcd on 127.0.0.1 and servers n0..n2 on 127.0.0.2..4."""

    def __init__(self, tmp):
        assert os.access(ETCD, os.X_OK), f"{ETCD} is missing (Debian's etcd-server)"
        self.tmp = tmp
        self.procs = {}
        cport, pport = free_port("127.0.0.1"), free_port("127.0.0.1")
        curl, purl = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
        self.etcd = subprocess.Popen(
            [ETCD, "--name=pytest", f"--data-dir={tmp}/etcd", f"--listen-client-urls={curl}",
             f"--advertise-client-urls={curl}", f"--listen-peer-urls={purl}",
             f"--initial-advertise-peer-urls={purl}", f"--initial-cluster=pytest={purl}",
             "--log-level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.etcd_endpoint = f"127.0.0.1:{cport}"

        def healthy():
            try:
                with urllib.request.urlopen(curl + "/health", timeout=1) as r:
                    return b'"health":"true"' in r.read()
            except OSError:
                return False

        wait_for("etcd", healthy)
        self.addresses = []
        for i in range(3):
            host = f"127.0.0.{i + 2}"
            self.addresses.append(f"{host}:{free_port(host)}")
            self.start(i)

    def start(self, i):
        p = subprocess.Popen(
            [SERVER, f"--data_dir={self.tmp}/n{i}", f"--listen={self.addresses[i]}",
             f"--etcd={self.etcd_endpoint}", f"--node_id=n{i}", "--node_lease_s=2",
             "--worker_threads=2", "--log_level=warn"], stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline()
        assert re.search(r"listening on port \d+", line), f"server n{i} did not start: {line!r}"
        self.procs[i] = p

    def kill(self, i):
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait()

    @property
    def servers(self):
        return ",".join(self.addresses)

    def stop(self):
        """kill -9 (a graceful stop is not under test here, and drains take seconds)."""
        for p in list(self.procs.values()) + [self.etcd]:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.stop()


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
