"""The Python client over TLS and mutual TLS, against a real sluice-server with certificates
made by openssl (tests/harness/make_certs.sh): a plaintext client and one without a client
certificate are refused, bad files are named, and a tenant's certificate goes end to end.

Run by ctest `python_client` (PYTHONPATH=<build>/python, SLUICE_SERVER_BIN set)."""
import os
import re
import subprocess
from collections import Counter

import pytest

import sluice

SERVER = os.environ.get("SLUICE_SERVER_BIN", "build/server/sluice-server")
MAKE_CERTS = os.path.join(os.path.dirname(__file__), "..", "harness", "make_certs.sh")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    subprocess.run(["bash", MAKE_CERTS, str(d)], check=True, capture_output=True)
    return d


@pytest.fixture(scope="module")
def server(certs, tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    p = subprocess.Popen([SERVER, f"--data_dir={data}", "--listen=127.0.0.1:0",
                          f"--tls_cert={certs}/server.pem", f"--tls_key={certs}/server.key",
                          f"--tls_client_ca={certs}/ca.pem", "--worker_threads=2",
                          "--log_level=warn"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True)
    port = int(re.search(r"listening on port (\d+)", p.stdout.readline()).group(1))
    yield f"127.0.0.1:{port}"
    p.terminate()
    p.wait(timeout=30)


def test_plaintext_and_anonymous_clients_are_refused(server, certs):
    for client in (sluice.connect(server, call_timeout=5),
                   sluice.connect(server, call_timeout=5, tls_ca=f"{certs}/ca.pem")):
        with pytest.raises(sluice.Error) as e:
            client.create_shuffle("refused", partitions=1)
        assert e.value.code == "UNAVAILABLE"


def test_bad_files_are_named(certs):
    with pytest.raises(sluice.Error) as e:
        sluice.connect("127.0.0.1:1", tls_ca=f"{certs}/ca.pem", tls_cert=f"{certs}/client-a.pem",
                       tls_key=f"{certs}/client-b.key")
    assert e.value.code == "INVALID_ARGUMENT" and "is not the key of" in e.value.message
    with pytest.raises(sluice.Error, match="expired on"):
        sluice.connect("127.0.0.1:1", tls_ca=f"{certs}/ca.pem",
                       tls_cert=f"{certs}/client-expired.pem", tls_key=f"{certs}/client-expired.key")
    with pytest.raises(sluice.Error, match="cannot read it"):
        sluice.connect("127.0.0.1:1", tls_ca=f"{certs}/nothing-here.pem")
    # An empty value (an unset environment variable, say) is refused, not taken as plaintext.
    with pytest.raises(ValueError, match="tls_ca is empty"):
        sluice.connect("127.0.0.1:1", tls_ca="")


def test_mutual_tls_end_to_end(server, certs):
    client = sluice.connect(server, tls_ca=f"{certs}/ca.pem", tls_cert=f"{certs}/client-a.pem",
                            tls_key=f"{certs}/client-a.key")
    assert client.create_shuffle("mtls", partitions=3, mappers=2)
    sent = Counter()
    for m in range(2):
        with client.writer("mtls", mapper=m, sort_by_key=True) as w:
            pairs = [(i % 40, {"m": m, "i": i}) for i in range(1000)]
            w.write_many(pairs)
        sent.update(k for k, _ in pairs)
    got = Counter()
    for p in range(3):
        for key, values in client.reader("mtls", p, order="key", require_complete=True).groups():
            got[key] += len(values)
    assert got == sent


def test_tokens(tmp_path, make_tokens):
    """A server with --auth_file (in clear on loopback): a token from `sluice token` works, no
    token or a wrong one is UNAUTHENTICATED, another tenant's shuffles are not there, quotas
    hold, and a token is never sent in clear off-host."""
    tokens, lines = make_tokens(("team-a", "team-b"))
    token = tokens["team-a"]
    (tmp_path / "creds").write_text("\n".join(lines) + "\nquota team-b shuffles=1\n")
    p = subprocess.Popen([SERVER, f"--data_dir={tmp_path}/data", "--listen=127.0.0.1:0",
                          f"--auth_file={tmp_path}/creds", "--log_level=warn"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(re.search(r"listening on port (\d+)", p.stdout.readline()).group(1))
        server = f"127.0.0.1:{port}"
        for bad in (None, "slc_wrong"):
            with pytest.raises(sluice.Error) as e:
                sluice.connect(server, token=bad).create_shuffle("t", partitions=1)
            assert e.value.code == "UNAUTHENTICATED"
        client = sluice.connect(server, token=token)
        assert client.create_shuffle("t", partitions=1, mappers=1)
        with client.writer("t", mapper=0) as w:
            w.write("k", {"v": 1})
        assert list(client.reader("t", 0)) == [("k", {"v": 1})]
        # Tenant team-b has a namespace of its own: team-a's "t" is not there for it.
        other = sluice.connect(server, token=tokens["team-b"])
        for look in (lambda: other.shuffle_status("t"), lambda: list(other.reader("t", 0))):
            with pytest.raises(sluice.Error) as e:
                look()
            assert e.value.code == "NOT_FOUND" and "team-a" not in str(e.value)
        assert other.create_shuffle("t", partitions=2, mappers=1)
        with pytest.raises(sluice.Error) as e:  # its quota line: one shuffle
            other.create_shuffle("u", partitions=1)
        assert e.value.code == "RESOURCE_EXHAUSTED" and "quota" in str(e.value)
        assert list(client.reader("t", 0)) == [("k", {"v": 1})]
        with pytest.raises(sluice.Error, match="in clear"):
            sluice.connect("10.0.0.1:7070", token=token)
    finally:
        p.terminate()
        p.wait(timeout=30)
