"""Fixtures the Python client's tests share: a real sluice-server child on 127.0.0.1 with a real
data directory, one per test module, and a client of it."""
import os
import re
import subprocess

import pytest

import sluice

SERVER = os.environ.get("SLUICE_SERVER_BIN", "build/server/sluice-server")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    p = subprocess.Popen([SERVER, f"--data_dir={data}", "--listen=127.0.0.1:0",
                          "--worker_threads=2", "--log_level=warn"],
                         stdout=subprocess.PIPE, text=True)
    port = int(re.search(r"listening on port (\d+)", p.stdout.readline()).group(1))
    yield f"127.0.0.1:{port}"
    p.terminate()
    p.wait(timeout=30)


@pytest.fixture
def client(server):
    return sluice.connect(server)


def tenant_tokens(tenants):
    """A token for each tenant, made by `sluice token`, and the --auth_file lines that admit
    them: ({tenant: token}, [line, ...])."""
    cli = os.path.join(os.path.dirname(SERVER), "..", "client", "sluice")
    tokens, lines = {}, []
    for tenant in tenants:
        out = subprocess.run([cli, "token", "--tenant", tenant], check=True,
                             capture_output=True, text=True).stdout
        tokens[tenant] = re.search(r"token: (\S+)", out).group(1)
        lines.append(re.search(r"line: +(.+)", out).group(1))
    return tokens, lines


@pytest.fixture
def make_tokens():
    """tenant_tokens, for tests (conftest's functions are reached through fixtures)."""
    return tenant_tokens
