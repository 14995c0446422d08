"""A real Sluice cluster for Python tests and benchmarks: one etcd on 127.0.0.1 and servers n0,
n1, ... on 127.0.0.2, 127.0.0.3, ..., each with its own data directory and a fixed address (a
restarted server comes back where it was, as a pod does). Faults on demand: SIGSTOP and SIGCONT
of etcd or a server, kill -9, a drain (SIGTERM, waited for), a restart.

    with LocalCluster(tmp, server_bin) as c:
        client = sluice.connect(c.servers)
        c.pause(0); ...; c.resume(0)
        c.drain(1); c.start(1)
"""
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request

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


class LocalCluster:
    """etcd on 127.0.0.1 and `size` servers on 127.0.0.2 onwards (node ids n0, n1, ...)."""

    def __init__(self, tmp, server_bin, size=3, lease_s=2, extra_flags=()):
        assert os.access(ETCD, os.X_OK), f"{ETCD} is missing (Debian's etcd-server)"
        assert os.access(server_bin, os.X_OK), f"{server_bin} is missing (build first)"
        self.tmp = str(tmp)
        self.server_bin = server_bin
        self.lease_s = lease_s
        self.extra_flags = list(extra_flags)
        self.procs = {}
        cport, pport = free_port("127.0.0.1"), free_port("127.0.0.1")
        curl, purl = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
        self.etcd = subprocess.Popen(
            [ETCD, "--name=local", f"--data-dir={self.tmp}/etcd",
             f"--listen-client-urls={curl}", f"--advertise-client-urls={curl}",
             f"--listen-peer-urls={purl}", f"--initial-advertise-peer-urls={purl}",
             f"--initial-cluster=local={purl}", "--log-level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.etcd_endpoint = f"127.0.0.1:{cport}"

        def healthy():
            try:
                with urllib.request.urlopen(curl + "/health", timeout=1) as r:
                    return b'"health":"true"' in r.read()
            except OSError:
                return False

        wait_for("etcd", healthy)
        self.addresses = []
        for i in range(size):
            host = f"127.0.0.{i + 2}"
            self.addresses.append(f"{host}:{free_port(host)}")
            self.start(i)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    @property
    def servers(self):
        return ",".join(self.addresses)

    def start(self, i):
        """Starts server i on its address; returns once it is registered (a server registers
        before it says it listens)."""
        p = subprocess.Popen(
            [self.server_bin, f"--data_dir={self.tmp}/n{i}", f"--listen={self.addresses[i]}",
             f"--etcd={self.etcd_endpoint}", f"--node_id=n{i}", f"--node_lease_s={self.lease_s}",
             "--worker_threads=2", "--log_level=warn"] + self.extra_flags,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = p.stdout.readline()
        assert re.search(r"listening on port \d+", line), f"server n{i} did not start: {line!r}"
        self.procs[i] = p

    def pause(self, i):
        self.procs[i].send_signal(signal.SIGSTOP)

    def resume(self, i):
        self.procs[i].send_signal(signal.SIGCONT)

    def kill(self, i):
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait()

    def drain(self, i, timeout=60):
        """SIGTERM: the server drains (leaves the cluster, finishes what runs) and exits."""
        self.procs[i].send_signal(signal.SIGTERM)
        return self.procs[i].wait(timeout=timeout)

    def stop(self):
        """kill -9 of everything (a graceful stop is not what is measured here)."""
        for p in list(self.procs.values()) + [self.etcd]:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait(timeout=30)
