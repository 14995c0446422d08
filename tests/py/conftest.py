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
