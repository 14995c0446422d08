#!/usr/bin/python3
"""The Drain RPC is an admin call: a server takes it from its own host (loopback) only, unless
it runs with --allow_remote_admin. Tested from another host for real: a network namespace the
test creates, joined to this one by a veth pair (10.213.0.1 here, 10.213.0.2 there), with the
server listening on 0.0.0.0 and `sluice drain` run inside the namespace.

Usage: remote_admin_test.py SLUICE_SERVER_BIN SLUICE_CLI_BIN. Needs root (ip netns); exits 77
(ctest: skipped) where namespaces cannot be made."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SERVER, CLI = sys.argv[1], sys.argv[2]
TAG = f"{os.getpid() % 100000}"
NS, HOST_IF, NS_IF = f"sluice-adm-{TAG}", f"sla{TAG}", f"slb{TAG}"
HOST_IP, NS_IP = "10.213.0.1", "10.213.0.2"


def sh(*args, check=True):
    return subprocess.run(args, capture_output=True, text=True, check=check)


def setup_netns():
    if sh("ip", "netns", "add", NS, check=False).returncode != 0:
        print("SKIP: cannot create a network namespace here (needs root)")
        sys.exit(77)
    sh("ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF, "netns", NS)
    sh("ip", "addr", "add", f"{HOST_IP}/30", "dev", HOST_IF)
    sh("ip", "link", "set", HOST_IF, "up")
    sh("ip", "netns", "exec", NS, "ip", "addr", "add", f"{NS_IP}/30", "dev", NS_IF)
    sh("ip", "netns", "exec", NS, "ip", "link", "set", NS_IF, "up")
    sh("ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up")


def start(work, *flags):
    # Every address, so that the namespace reaches it: in clear only when asked for.
    p = subprocess.Popen([SERVER, f"--data_dir={work}/data", "--listen=0.0.0.0:0", "--plaintext",
                          "--drain_grace_s=2", "--log_level=warn", *flags],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    port = int(re.search(r"listening on port (\d+)", p.stdout.readline()).group(1))
    return p, port


def drain_from_namespace(port):
    return sh("ip", "netns", "exec", NS, CLI, "drain", "--server", f"{HOST_IP}:{port}",
              "--grace-s", "1", check=False)


def main():
    work = tempfile.mkdtemp(prefix="sluice-admin-")
    server = None
    try:
        setup_netns()
        # Reachable from the namespace at all (a plain call works from there).
        server, port = start(work)
        nodes = sh("ip", "netns", "exec", NS, CLI, "list", "--server", f"{HOST_IP}:{port}",
                   check=False)
        if nodes.returncode != 0:
            sys.exit(f"FAIL: the server is not reachable from the namespace: {nodes.stdout}"
                     f"{nodes.stderr}")
        # Refused from the other host, naming the flag; the server serves on.
        r = drain_from_namespace(port)
        if r.returncode == 0:
            sys.exit(f"FAIL: a remote Drain was not refused: {r.stdout}{r.stderr}")
        if "--allow_remote_admin" not in r.stdout + r.stderr:
            sys.exit(f"FAIL: the refusal does not name --allow_remote_admin: {r.stdout}{r.stderr}")
        print("ok: remote Drain refused:", (r.stdout + r.stderr).strip().splitlines()[-1])
        time.sleep(0.5)
        if server.poll() is not None:
            sys.exit("FAIL: the server stopped after a refused Drain")
        local = sh(CLI, "list", "--server", f"127.0.0.1:{port}", check=False)
        if local.returncode != 0:
            sys.exit(f"FAIL: the server is not serving after a refused Drain: {local.stdout}")
        # From loopback it is taken.
        r = sh(CLI, "drain", "--server", f"127.0.0.1:{port}", "--grace-s", "1", check=False)
        if r.returncode != 0 or server.wait(timeout=30) != 0:
            sys.exit(f"FAIL: a loopback Drain did not stop the server: {r.stdout}{r.stderr}")
        print("ok: loopback Drain taken, exit 0")
        # With --allow_remote_admin the other host may drain it.
        server, port = start(work, "--allow_remote_admin")
        r = drain_from_namespace(port)
        if r.returncode != 0 or server.wait(timeout=30) != 0:
            sys.exit(f"FAIL: a remote Drain with --allow_remote_admin failed: {r.stdout}{r.stderr}")
        print("ok: remote Drain taken with --allow_remote_admin, exit 0")
        print("PASS")
    finally:
        if server is not None and server.poll() is None:
            server.kill()
            server.wait()
        sh("ip", "netns", "del", NS, check=False)  # takes the veth pair with it
        sh("ip", "link", "del", HOST_IF, check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
