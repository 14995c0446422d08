"""Connections a client can make the server hold, measured (docs/benchmarks.md, "Connection
floods"): a real sluice-server under prlimit --nofile=N, flooded with idle TCP connections that
send nothing (no TLS, no credentials), from many loopback addresses, with the connection guard
on and off. Reported: what the server kept and refused (its metrics), its RSS, how long a new
client's call took during the flood (a fresh connection each, from 127.0.0.1), and whether and
when the server took new clients again once the flood was gone.

    PYTHONPATH=build/python /usr/bin/python3 bench/connections_bench.py \\
        [--build build] [--nofile 4096] [--flood 6000] [--addresses 40]

Three runs: the guard on with the flood from --addresses addresses, then from one, then the
guard off (gRPC's own accept loop).
"""
import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import sluice


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def metrics(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(sluice_connections\w*)(\{reason="(\w+)"\})? (\S+)$', line)
        if m:
            out[m.group(1) + (":" + m.group(3) if m.group(3) else "")] = float(m.group(4))
    return out


def call(port, timeout=5.0):
    """A new client's call, on a connection of its own; its latency, or None if it failed."""
    t = time.monotonic()
    try:
        c = sluice.connect(f"127.0.0.1:{port}", call_timeout=timeout)
        c.create_shuffle(f"probe{time.monotonic_ns()}", partitions=1)
        return time.monotonic() - t
    except sluice.Error:
        return None


def flood(port, n, addresses):
    socks = []
    for i in range(n):
        s = socket.socket()
        try:
            s.bind((f"127.0.1.{10 + i % addresses}", 0))
            s.connect(("127.0.0.1", port))
            socks.append(s)
        except OSError:
            s.close()
    return socks


def run(build, nofile, n, addresses, guard):
    with tempfile.TemporaryDirectory(prefix="sluice-conn-") as tmp:
        p = subprocess.Popen(
            ["/usr/bin/prlimit", f"--nofile={nofile}:{nofile}",
             os.path.join(build, "server", "sluice-server"), f"--data_dir={tmp}",
             "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", "--worker_threads=2",
             f"--guard_connections={'true' if guard else 'false'}", "--listener_probe_s=2",
             "--drain_grace_s=1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        port = int(re.search(r"listening on port (\d+)", p.stdout.readline()).group(1))
        mport = None
        while mport is None:
            m = re.search(r"metrics_port=(\d+)", p.stderr.readline())
            mport = int(m.group(1)) if m else None
        threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
        base_rss = rss_mb(p.pid)
        before = [call(port) for _ in range(5)]
        t = time.monotonic()
        socks = flood(port, n, addresses)
        opened = time.monotonic() - t
        time.sleep(1.0)
        m = metrics(mport)
        peak = rss_mb(p.pid)
        # (Within the handshake timeout, 10 s: the flood's connections are still held.)
        during = [call(port, timeout=0.5) for _ in range(10)]
        for s in socks:
            s.close()
        t = time.monotonic()
        back = None
        while time.monotonic() - t < 30 and p.poll() is None:
            if call(port, timeout=2) is not None:
                back = time.monotonic() - t
                break
        exited = None
        if back is None:
            try:
                p.wait(timeout=30)
                exited = p.returncode
            except subprocess.TimeoutExpired:
                pass
        if p.poll() is None:
            p.terminate()
            p.wait(timeout=30)
    ok = [x for x in during if x is not None]
    fmt = lambda xs: f"{statistics.median(xs) * 1000:.1f} ms" if xs else "-"  # noqa: E731
    print(f"guard {'on ' if guard else 'off'} nofile {nofile}: {len(socks)} idle connections "
          f"from {addresses} addresses opened in {opened:.1f} s")
    print(f"  kept {m.get('sluice_connections', '?'):.0f}" if m else
          "  metrics: unreachable (the metrics endpoint is out of files too)",
          end="")
    if m:
        print(f", refused server_limit {m.get('sluice_connections_refused_total:server_limit', 0):.0f}"
              f" address_limit {m.get('sluice_connections_refused_total:address_limit', 0):.0f}"
              f" descriptors {m.get('sluice_connections_refused_total:descriptors', 0):.0f}")
    else:
        print()
    print(f"  server RSS {base_rss:.0f} MiB before, {peak:.0f} MiB during the flood")
    print(f"  a new client's call: {fmt([x for x in before if x])} before; during the flood "
          f"(from another address) {len(ok)}/10 succeeded ({fmt(ok)})")
    if back is not None:
        print(f"  after the flood closed: new clients served within {back * 1000:.0f} ms")
    else:
        print(f"  after the flood closed: no new client served in 30 s; the server exited "
              f"with status {exited}")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--nofile", type=int, default=4096)
    ap.add_argument("--flood", type=int, default=6000)
    ap.add_argument("--addresses", type=int, default=40)
    a = ap.parse_args()
    run(a.build, a.nofile, a.flood, a.addresses, True)
    run(a.build, a.nofile, a.flood, 1, True)  # one host: the others still get in
    run(a.build, a.nofile, a.flood, a.addresses, False)


if __name__ == "__main__":
    main()
