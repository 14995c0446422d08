"""sluice.dask on a real distributed.LocalCluster (2 worker processes) and a real sluice-server
(and a real 3-server cluster with etcd at R = 2): shuffle, set_index, sort_values, merge and
groupby-apply give what Dask's own give on the same frames (rows, dtypes, index); a worker
killed with SIGKILL in the map or the reduce phase costs only its own tasks; the shuffles are
deleted on close (docs/dask.md)."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest

import sluice

dask = pytest.importorskip("dask")
dd = pytest.importorskip("dask.dataframe")
distributed = pytest.importorskip("distributed")

import sluice.dask  # noqa: E402  (after the skips: Dask is optional)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "harness"))
from local_cluster import LocalCluster as SluiceCluster  # noqa: E402

SERVER = os.environ.get("SLUICE_SERVER_BIN", "build/server/sluice-server")
MAKE_CERTS = os.path.join(os.path.dirname(__file__), "..", "harness", "make_certs.sh")


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0", silence_logs=40) as c:
        with distributed.Client(c) as client:
            yield client


def frame(partitions=4, rows=2000, seed=1):
    """Input partitions as the issue's workload: {key < 500, seq, src, payload}, and a float, a
    bool and a datetime, indexed by a named int."""
    rng = np.random.default_rng(seed)
    parts = []
    alphabet = np.array(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"))
    for p in range(partitions):
        n = rows
        parts.append(pd.DataFrame({
            "key": rng.integers(0, 500, n),
            "seq": np.arange(n, dtype=np.int64),
            "src": np.full(n, p, dtype=np.int32),
            "payload": ["".join(rng.choice(alphabet, 24)) for _ in range(n)],
            "x": rng.random(n),
            "flag": rng.random(n) < 0.5,
            "when": pd.to_datetime(rng.integers(0, 10**9, n), unit="s"),
        }, index=pd.Index(np.arange(p * n, (p + 1) * n, dtype=np.int64), name="row")))
    return dd.from_pandas(pd.concat(parts), npartitions=partitions)


def rows(df):
    """A frame's rows as a sorted list, index included: order-free equality."""
    flat = df.reset_index()
    return sorted(map(tuple, flat.astype(str).values.tolist()))


def test_shuffle_puts_every_row_where_dasks_own_shuffle_does(server, cluster):
    ddf = frame()
    with sluice.dask.Shuffle(server) as s:
        out = s.shuffle(ddf, on="key", npartitions=5)
        ref = ddf.shuffle("key", npartitions=5, shuffle="tasks")
        got = dask.compute(*out.to_delayed())
        want = dask.compute(*ref.to_delayed())
        assert len(got) == 5
        for p, (g, w) in enumerate(zip(got, want)):
            assert list(g.columns) == list(w.columns)
            assert g.dtypes.to_dict() == w.dtypes.to_dict(), p
            assert g.index.name == "row" and g.index.dtype == w.index.dtype
            assert rows(g) == rows(w), f"partition {p}"
        whole = pd.concat(got)
        assert len(whole) == len(ddf)
        # Each key in one partition only.
        owners = {}
        for p, g in enumerate(got):
            for k in set(g["key"]):
                assert owners.setdefault(k, p) == p


def test_map_tasks_that_flush_many_times_send_every_row(server, cluster):
    # 2 x 40,000 rows of ~100 bytes with a 1 MiB writer buffer: each map task sends many times.
    ddf = frame(partitions=2, rows=40000, seed=3)
    with sluice.dask.Shuffle(server, buffer_mb=1) as s:
        got = dask.compute(*s.shuffle(ddf, on="key", npartitions=3).to_delayed())
        want = dask.compute(*ddf.shuffle("key", npartitions=3, shuffle="tasks").to_delayed())
        for p, (g, w) in enumerate(zip(got, want)):
            assert rows(g) == rows(w), f"partition {p}"
    with pytest.raises(ValueError, match="buffer_mb must be 1 to 65,536"):
        sluice.dask.Shuffle(server, buffer_mb=0)


def test_reduce_batches_join_into_the_inputs_dtypes():
    # A reduce task's batches of columns (a masked array where a batch had nulls) joined into
    # one frame of the input's dtypes and index.
    meta = pd.DataFrame({"a": pd.Series([], dtype="Int64"), "s": pd.Series([], dtype=object),
                         "t": pd.Series([], dtype="datetime64[ns]"),
                         "f": pd.Series([], dtype="float32")},
                        index=pd.Index([], dtype="int32", name="row"))
    idx = sluice.dask._INDEX
    batches = [
        {"a": np.array([1, 2]), "s": np.array(["x", None], dtype=object),
         "t": np.array([0, 10**9]), "f": np.array([0.5, 1.5], dtype=np.float32),
         idx: np.array([5, 6])},
        {"a": np.ma.masked_array([3, 0], mask=[False, True]),
         "s": np.array(["z", "w"], dtype=object), "t": np.array([2 * 10**9, 3 * 10**9]),
         "f": np.array([2.5, 3.5], dtype=np.float32), idx: np.array([7, 8])},
    ]
    out = sluice.dask._from_wire(batches, meta)
    assert out.dtypes.to_dict() == meta.dtypes.to_dict()
    assert out.index.dtype == meta.index.dtype and out.index.name == "row"
    assert out.index.tolist() == [5, 6, 7, 8]
    assert out["a"].tolist()[:3] == [1, 2, 3] and out["a"].isna().tolist() == [False] * 3 + [True]
    assert out["s"].tolist() == ["x", None, "z", "w"]
    assert out["t"].tolist() == list(pd.to_datetime([0, 10**9, 2 * 10**9, 3 * 10**9]))
    assert out["f"].tolist() == [0.5, 1.5, 2.5, 3.5]
    assert sluice.dask._from_wire([], meta).dtypes.to_dict() == meta.dtypes.to_dict()


def test_nulls_shuffle_as_in_dask(server, cluster):
    df = pd.DataFrame({"key": np.arange(600) % 7,
                       "n": pd.array([None if i % 5 == 0 else i for i in range(600)],
                                     dtype="Int64"),
                       "s": [None if i % 3 == 0 else f"v{i}" for i in range(600)]})
    ddf = dd.from_pandas(df, npartitions=3)
    with sluice.dask.Shuffle(server) as s:
        got = dask.compute(*s.shuffle(ddf, on="key", npartitions=2).to_delayed())
        want = dask.compute(*ddf.shuffle("key", npartitions=2, shuffle="tasks").to_delayed())
        for g, w in zip(got, want):
            assert g.dtypes.to_dict() == w.dtypes.to_dict()
            assert rows(g) == rows(w)


def test_set_index_and_sort_values_match_dasks(server, cluster):
    ddf = frame(seed=2)
    with sluice.dask.Shuffle(server) as s:
        out = s.set_index(ddf, "key")
        ref = ddf.set_index("key")
        assert out.known_divisions
        got, want = out.compute(), ref.compute()
        assert got.index.is_monotonic_increasing
        assert got.dtypes.to_dict() == want.dtypes.to_dict()
        assert rows(got) == rows(want)
        parts = dask.compute(*out.to_delayed())
        for p, part in enumerate(parts):
            lo, hi = out.divisions[p], out.divisions[p + 1]
            assert part.empty or (part.index.min() >= lo and part.index.max() <= hi)
        by_x = s.sort_values(ddf, "x").compute()
        assert by_x["x"].is_monotonic_increasing
        assert rows(by_x) == rows(ddf.compute())


def test_merge_and_groupby_apply_match_dasks(server, cluster):
    left = frame(seed=3)
    rng = np.random.default_rng(4)
    right = dd.from_pandas(pd.DataFrame({
        "key": np.arange(0, 600, 2, dtype=np.int64),
        "label": [f"label-{i}" for i in range(300)],
        "weight": rng.random(300),
    }), npartitions=3)
    with sluice.dask.Shuffle(server) as s:
        for how in ("inner", "left"):
            got = s.merge(left, right, on="key", how=how).compute()
            want = dd.merge(left, right, on="key", how=how, shuffle="tasks").compute()
            assert got.dtypes.to_dict() == want.dtypes.to_dict(), how
            assert rows(got.reset_index(drop=True)) == rows(want.reset_index(drop=True)), how

        def summary(g):
            return pd.Series({"n": len(g), "total": g["x"].sum(), "first": g["seq"].min()})

        meta = pd.DataFrame({"n": pd.Series(dtype="float64"), "total": pd.Series(dtype="float64"),
                             "first": pd.Series(dtype="float64")})
        got = s.groupby_apply(left, "key", summary, meta=meta).compute().sort_index()
        want = left.compute().groupby("key").apply(summary).sort_index()
        pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_close_deletes_the_shuffles_it_made(server, cluster):
    ddf = frame(partitions=2, rows=100)
    s = sluice.dask.Shuffle(server, prefix="gone")
    s.shuffle(ddf, on="key").compute()
    made = s.shuffle_ids
    assert len(made) == 1
    client = sluice.connect(server)
    assert client.shuffle_status(made[0])["num_mappers"] == 2
    s.close()
    with pytest.raises(sluice.Error) as e:
        client.shuffle_status(made[0])
    assert e.value.code == "NOT_FOUND"
    s.close()  # (again: nothing left)


def test_unsupported_dtypes_are_refused_naming_the_column(server):
    ddf = dd.from_pandas(pd.DataFrame({"key": [1, 2], "c": pd.Categorical(["a", "b"])}),
                         npartitions=1)
    with sluice.dask.Shuffle(server) as s:
        with pytest.raises(TypeError, match="column 'c' has dtype category"):
            s.shuffle(ddf, on="key")


def _logged_route(part, npartitions, on, log, hold_s):
    """A map task's route that notes each run (its process and mapper) and holds it a while, so
    that a worker can be killed in the middle of one."""
    with open(log, "a") as f:
        f.write(f"{os.getpid()} {int(part['src'].iloc[0])}\n")
    time.sleep(hold_s)
    return sluice.dask._hash_route(part, npartitions, on)


def _logged_read(df, log, hold_s):
    with open(log, "a") as f:
        f.write(f"{os.getpid()} {len(df)}\n")
    time.sleep(hold_s)
    return df


def _lines(path):
    return path.read_text().split("\n")[:-1] if path.exists() else []


def _kill_when(path, count):
    """Kills (SIGKILL) the worker that wrote the `count`-th line of `path`, once there is one."""
    killed = []

    def watch():
        for _ in range(600):
            lines = _lines(path)
            if len(lines) >= count:
                pid = int(lines[count - 1].split()[0])
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.05)

    t = threading.Thread(target=watch)
    t.start()
    return t, killed


@pytest.mark.parametrize("phase", ["map", "reduce"])
def test_a_worker_killed_mid_shuffle_costs_only_its_own_tasks(server, tmp_path, phase):
    ddf = frame(partitions=8, rows=1500, seed=5)
    want = dask.compute(*ddf.shuffle("key", npartitions=4, shuffle="tasks").to_delayed(),
                        scheduler="sync")
    maps, reads = tmp_path / "maps", tmp_path / "reads"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0", silence_logs=50) as lc, \
            distributed.Client(lc) as client, sluice.dask.Shuffle(server) as s:
        out = s._exchange(ddf, 4, _logged_route,
                          (["key"], str(maps), 0.4 if phase == "map" else 0.0),
                          after=_logged_read,
                          after_args=(str(reads), 0.5 if phase == "reduce" else 0.0))
        watcher, killed = _kill_when(maps if phase == "map" else reads, 3)
        got = client.compute(out.to_delayed())
        got = client.gather(got)
        watcher.join()
        assert killed, "no worker was killed"
        for p, (g, w) in enumerate(zip(got, want)):
            assert rows(g) == rows(w), f"partition {p}"
        runs = {}
        for line in _lines(maps):
            pid, mapper = map(int, line.split())
            runs.setdefault(mapper, []).append(pid)
        assert sorted(runs) == list(range(8)), "every mapper ran"
        for mapper, pids in runs.items():
            # Run again only if its first run was on the killed worker (in flight, or its
            # result lost with it before it committed): never a mapper of the other worker.
            assert len(pids) == 1 or (len(pids) == 2 and pids[0] == killed[0]), (mapper, pids)
        if phase == "map":
            # The mapper the kill landed in ran again, elsewhere.
            in_flight = int(_lines(maps)[2].split()[1])
            assert len(runs[in_flight]) == 2 and runs[in_flight][1] != killed[0]
        if phase == "reduce":
            assert all(len(p) == 1 for p in runs.values()), "no mapper ran again"
            assert len(_lines(reads)) > 4, "the read the kill landed in ran again"


def test_a_replicated_cluster_shuffles_and_joins_as_dask_does(tmp_path, cluster):
    """Three servers and etcd, R = 2: one of them killed -9 between the shuffle and its reads."""
    ddf = frame(partitions=4, rows=1500, seed=6)
    with SluiceCluster(tmp_path, SERVER) as sc, \
            sluice.dask.Shuffle(sc.servers, replication=2) as s:
        out = s.shuffle(ddf, on="key", npartitions=6)
        written = out.persist()  # (map and reduce once; the reads come from the servers)
        want = dask.compute(*ddf.shuffle("key", npartitions=6, shuffle="tasks").to_delayed())
        got = dask.compute(*written.to_delayed())
        for p, (g, w) in enumerate(zip(got, want)):
            assert rows(g) == rows(w), f"partition {p}"
        # Computed again with a server gone: the map tasks find their mappers committed and
        # write nothing, the reads go to the other replicas.
        sc.kill(1)
        again = dask.compute(*out.to_delayed())
        for p, (g, w) in enumerate(zip(again, want)):
            assert rows(g) == rows(w), f"partition {p}, a server down"
        # Deleted from the cluster; the copies on the server that is down stay until it is
        # back (warned of, not raised).
        with pytest.warns(RuntimeWarning, match="not deleted now"):
            s.close()
        with pytest.raises(sluice.Error) as e:
            sluice.connect(sc.servers).shuffle_status(s.shuffle_ids[0])
        assert e.value.code == "NOT_FOUND"


def test_tls_and_a_tenant_token_reach_every_worker(tmp_path, cluster, make_tokens):
    """A server with TLS and tokens (certificates from openssl, a token from `sluice token`):
    the servers from Dask's config `sluice.servers`, the TLS and token settings from `connect`,
    carried to every worker's client; the shuffle is the tenant's alone."""
    subprocess.run(["bash", MAKE_CERTS, str(tmp_path)], check=True, capture_output=True)
    tokens, lines = make_tokens(("team-a", "team-b"))
    (tmp_path / "creds").write_text("\n".join(lines) + "\n")
    p = subprocess.Popen([SERVER, f"--data_dir={tmp_path}/data", "--listen=127.0.0.1:0",
                          f"--tls_cert={tmp_path}/server.pem", f"--tls_key={tmp_path}/server.key",
                          f"--auth_file={tmp_path}/creds", "--worker_threads=2",
                          "--log_level=warn"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True)
    try:
        port = int(re.search(r"listening on port (\d+)", p.stdout.readline()).group(1))
        server = f"127.0.0.1:{port}"
        ddf = frame(partitions=3, rows=500, seed=7)
        connect = {"tls_ca": f"{tmp_path}/ca.pem", "token": tokens["team-a"]}
        with dask.config.set({"sluice.servers": server}):
            with sluice.dask.Shuffle(connect=connect) as s:
                got = dask.compute(*s.shuffle(ddf, on="key", npartitions=2).to_delayed())
                want = dask.compute(*ddf.shuffle("key", npartitions=2,
                                                 shuffle="tasks").to_delayed())
                for g, w in zip(got, want):
                    assert rows(g) == rows(w)
                (sid,) = s.shuffle_ids
                mine = sluice.connect(server, **connect).shuffle_status(sid)
                assert sorted(mine["committed_mappers"]) == [0, 1, 2]
                other = sluice.connect(server, tls_ca=f"{tmp_path}/ca.pem",
                                       token=tokens["team-b"])
                with pytest.raises(sluice.Error) as e:
                    other.shuffle_status(sid)
                assert e.value.code == "NOT_FOUND"
        # Without the token the shuffle is refused as the graph is built (UNAUTHENTICATED: not
        # to be retried), and close() has nothing to delete.
        with sluice.dask.Shuffle(server, connect={"tls_ca": f"{tmp_path}/ca.pem"}) as s:
            with pytest.raises(sluice.Error) as e:
                s.shuffle(ddf, on="key", npartitions=2)
            assert e.value.code == "UNAUTHENTICATED" and not e.value.retryable
            assert s.shuffle_ids == []
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_a_shuffle_whose_making_failed_on_the_way_is_kept_for_close():
    # Nothing listens there: the create fails UNAVAILABLE (it might have reached a server), so
    # the id is kept and close() tries it, warning that it cannot delete it now.
    ddf = frame(partitions=1, rows=10)
    s = sluice.dask.Shuffle("127.0.0.1:1", connect={"call_timeout": 1.0})
    with pytest.raises(sluice.Error) as e:
        s.shuffle(ddf, on="key")
    assert e.value.code == "UNAVAILABLE" and e.value.retryable
    assert len(s.shuffle_ids) == 1
    with pytest.warns(RuntimeWarning, match="not deleted now"):
        s.close()
    assert len(s.shuffle_ids) == 1
