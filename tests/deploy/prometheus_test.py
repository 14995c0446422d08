#!/usr/bin/python3
"""A real Prometheus scrapes a real sluice-server during a real `sluice bench`: the target is
up (Prometheus parsed the text format), and queries through Prometheus's HTTP API see the
counters move from nothing to exactly what the bench did (records pushed and fetched, commits,
calls by method and code) and the commit latency histogram fill.

Usage: prometheus_test.py SLUICE_SERVER_BIN SLUICE_CLI_BIN. Needs Debian's `prometheus`
package (the README's test command installs it); fails, naming it, without."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

SERVER, CLI = sys.argv[1], sys.argv[2]
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
SHARDS, ITEMS = 4, 20000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def wait_for(what, check, timeout=30.0):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = check()
            if last:
                return last
        except (OSError, ValueError, KeyError) as e:
            last = e
        time.sleep(0.25)
    sys.exit(f"FAIL: {what} within {timeout} s (last: {last})")


def main():
    if not os.access(PROMETHEUS, os.X_OK):
        sys.exit("FAIL: no prometheus binary: install Debian's `prometheus` package "
                 "(bash deploy/dev.sh test does)")
    work = tempfile.mkdtemp(prefix="sluice-prom-")
    procs = []
    try:
        # The server: its metrics port from its start line.
        server = subprocess.Popen(
            [SERVER, f"--data_dir={work}/data", "--listen=127.0.0.1:0",
             "--metrics_listen=127.0.0.1:0", "--worker_threads=2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(server)
        grpc_port = int(re.search(r"listening on port (\d+)", server.stdout.readline()).group(1))
        metrics_port = None
        while metrics_port is None:
            line = server.stderr.readline()
            if not line:
                sys.exit("FAIL: the server exited before it started")
            m = re.search(r"event=started .*metrics_port=(\d+)", line)
            if m:
                metrics_port = int(m.group(1))
        # Prometheus, scraping it every second.
        prom_port = free_port()
        with open(f"{work}/prometheus.yml", "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                    "scrape_configs:\n  - job_name: sluice\n    static_configs:\n"
                    f"      - targets: ['127.0.0.1:{metrics_port}']\n")
        prom = subprocess.Popen(
            [PROMETHEUS, f"--config.file={work}/prometheus.yml",
             f"--storage.tsdb.path={work}/tsdb", f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=open(f"{work}/prometheus.log", "w"))
        procs.append(prom)
        api = f"http://127.0.0.1:{prom_port}/api/v1"

        def query(q):
            r = http_json(f"{api}/query?" + urllib.parse.urlencode({"query": q}))
            res = r["data"]["result"]
            return float(res[0]["value"][1]) if res else None

        wait_for("Prometheus ready",
                 lambda: urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/-/ready",
                                                timeout=2).status == 200)
        wait_for("a first scrape with the counters at 0",
                 lambda: query("sluice_push_records_total") == 0)
        target = http_json(f"{api}/targets")["data"]["activeTargets"][0]
        if target["health"] != "up" or target["lastError"]:
            sys.exit(f"FAIL: the target is {target['health']}: {target['lastError']}")

        bench = subprocess.run(
            [CLI, "bench", "--server", f"127.0.0.1:{grpc_port}", "--shards", str(SHARDS),
             "--items-per-shard", str(ITEMS), "--partitions", "8", "--order", "KEY"],
            capture_output=True, text=True, timeout=120)
        result = re.search(r"RESULT (\{.*\})", bench.stdout)
        if bench.returncode != 0 or not result or not json.loads(result.group(1))["counts_match"]:
            sys.exit(f"FAIL: the bench failed:\n{bench.stdout}\n{bench.stderr}")
        total = SHARDS * ITEMS
        expect = {
            "sluice_push_records_total": total,
            "sluice_fetch_records_total": total,
            "sluice_commits_total": SHARDS,
            'sum(sluice_rpc_handled_total{method="PushFlow",code="OK"})': SHARDS,  # (the client pushes with credit)
            'sum(sluice_rpc_handled_total{method="Fetch",code="OK"})': 8,
            "sluice_commit_seconds_count": SHARDS,
        }
        for q, want in expect.items():
            wait_for(f"{q} == {want}", lambda q=q, want=want: query(q) == want)
            print(f"ok: {q} = {want}")
        # What a dashboard plots: the counter's increase between scrapes, seen by PromQL.
        inc = wait_for("an increase of sluice_push_records_total",
                       lambda: (query("increase(sluice_push_records_total[1m])") or 0) > 0 and
                       query("increase(sluice_push_records_total[1m])"))
        print(f"ok: increase(sluice_push_records_total[1m]) = {inc:.0f}")
        for q in ["sluice_commit_sync_seconds_count", "sluice_disk_free_bytes",
                  "sluice_memory_budget_bytes"]:
            v = query(q)
            if not v or v <= 0:
                sys.exit(f"FAIL: {q} = {v}")
            print(f"ok: {q} = {v:.0f}")
        if query("sluice_fetch_bytes_total") <= 0:
            sys.exit("FAIL: no fetch bytes")
        print("PASS")
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
