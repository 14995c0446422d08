"""The Python client against a real sluice-server (a child process on 127.0.0.1 with a real
data directory): round trips of every msgpack type, key order and groups, routing, duplicate
attempts, the set/frozenset case, errors, aborted writes and abandoned reads.

Run by ctest `python_client` (PYTHONPATH=<build>/python, SLUICE_SERVER_BIN set)."""
import math

import pytest

import sluice

_ids = iter(range(1_000_000))


def fresh(client, partitions=4, mappers=1):
    sid = f"py{next(_ids)}"
    assert client.create_shuffle(sid, partitions=partitions, mappers=mappers)
    return sid


def read_all(client, sid, partitions, **kw):
    out = []
    for p in range(partitions):
        out.extend(client.reader(sid, p, **kw))
    return out


VALUES = [
    None, True, False, 0, 1, -1, 127, 128, -33, 2**31, 2**63 - 1, -2**63, 2**64 - 1,
    1.5, -0.0, 1e300, float("inf"), "", "héllo wörld ✓ 🚀", "x" * 70000, b"", b"\x00\xff" * 40000,
    [], [1, [2, [3, [4]]]], {}, {"a": 1, "nested": {"list": [1, "two", 3.0, None, b"b"]}},
    {1: "int key", "s": "str key"}, [{"k": [{"deep": True}]}],
]


@pytest.mark.parametrize("order", ["unordered", "key"])
def test_every_msgpack_type_round_trips(client, order):
    sid = fresh(client)
    with client.writer(sid, mapper=0, sort_by_key=order == "key") as w:
        for i, v in enumerate(VALUES):
            w.write(i, v)
    assert w.result["records"] == len(VALUES) and not w.result["duplicate"]
    got = dict(read_all(client, sid, 4, order=order))
    assert got == dict(enumerate(VALUES))
    # Equal is not enough (True == 1 == 1.0): the types come back too.
    assert [type(got[i]) for i in range(len(VALUES))] == [type(v) for v in VALUES]
    neg_zero = next(i for i, v in enumerate(VALUES) if isinstance(v, float) and v == 0)
    assert math.copysign(1, got[neg_zero]) == -1.0


def test_nan_and_tuples_come_back_as_documented(client):
    sid = fresh(client, partitions=1)
    with client.writer(sid, mapper=0) as w:
        w.write("nan", float("nan"))
        w.write(("tuple", 1), (1, 2))  # a tuple key comes back a tuple, a tuple value a list
    got = dict(client.reader(sid, 0))
    assert math.isnan(got["nan"])
    assert got[("tuple", 1)] == [1, 2]


def test_keys_route_like_zephyr_and_come_back_in_msgpack_order(client):
    sid = fresh(client, partitions=8, mappers=2)
    keys = [f"user{i % 500}" for i in range(5000)]
    for m in range(2):
        with client.writer(sid, mapper=m, sort_by_key=True) as w:
            w.write_many((k, {"m": m, "i": i}) for i, k in enumerate(keys))
    total = 0
    for p in range(8):
        seen = []
        for key, values in client.reader(sid, p, order="key").groups():
            assert sluice.partition_of(key, 8) == p
            assert len(values) == 2 * keys.count(key)
            seen.append(key)
            total += len(values)
        assert [sluice.packb(k) for k in seen] == sorted(sluice.packb(k) for k in seen)
        assert len(seen) == len(set(seen))
    assert total == 2 * len(keys)


def test_a_second_attempt_of_a_mapper_is_a_duplicate_and_counted_once(client):
    sid = fresh(client, partitions=2)
    for attempt in (1, 2):
        with client.writer(sid, mapper=0, attempt=attempt) as w:
            w.write_many((i, "v") for i in range(100))
        assert w.result["duplicate"] == (attempt == 2)
    assert len(read_all(client, sid, 2)) == 100


def test_sets_and_custom_objects_are_never_silently_changed(client):
    sid = fresh(client, partitions=1)
    with client.writer(sid, mapper=0) as w:
        for bad in (frozenset({1, 2}), {3}, object()):
            with pytest.raises(TypeError, match="pickle_fallback"):
                w.write("k", bad)
            with pytest.raises(TypeError):
                w.write(bad, "v")
        w.write("ok", [1])  # the writer goes on
    assert list(client.reader(sid, 0)) == [("ok", [1])]
    # Asked for: pickled, and unpickled only by a reader that allows it.
    sid = fresh(client, partitions=1)
    with client.writer(sid, mapper=0, pickle_fallback=True) as w:
        w.write("fs", {"tags": frozenset({"a", "b"})})
    with pytest.raises(ValueError, match="allow_pickle"):
        list(client.reader(sid, 0))
    assert list(client.reader(sid, 0, allow_pickle=True)) == [("fs", {"tags": frozenset("ab")})]


def test_ints_past_64_bits_raise(client):
    sid = fresh(client, partitions=1)
    with client.writer(sid, mapper=0) as w:
        with pytest.raises(OverflowError, match="64 bits"):
            w.write("k", 2**64)
        with pytest.raises(OverflowError):
            w.write("k", -2**63 - 1)


def test_raw_values_are_their_msgpack_bytes(client):
    sid = fresh(client, partitions=1)
    with client.writer(sid, mapper=0) as w:
        w.write("k", {"a": [1, 2]})
    [(k, v)] = list(client.reader(sid, 0, raw=True))
    assert k == "k" and v == sluice.packb({"a": [1, 2]})
    assert sluice.unpackb(v) == {"a": [1, 2]}


def test_errors_say_what_happened(client):
    with pytest.raises(sluice.Error) as e:
        list(client.reader("no-such-shuffle", 0))
    assert e.value.code == "NOT_FOUND" and "no-such-shuffle" in e.value.message
    sid = fresh(client, partitions=2, mappers=3)
    with client.writer(sid, mapper=0) as w:
        w.write(1, 1)
    with pytest.raises(sluice.Error) as e:
        list(client.reader(sid, 0, require_complete=True))
    assert e.value.code == "FAILED_PRECONDITION"
    with pytest.raises(sluice.Error) as e:
        with client.writer(sid, mapper=7) as w:
            w.write(1, 1)
    assert e.value.code == "INVALID_ARGUMENT" and "mapper 7" in e.value.message
    with pytest.raises(ValueError):
        client.reader(sid, 0, order="sorted")
    dead = sluice.connect("127.0.0.1:1", call_timeout=2)
    with pytest.raises(sluice.Error) as e:
        dead.create_shuffle("x", 1)
    assert e.value.code == "UNAVAILABLE"


def test_an_exception_inside_the_writer_discards_the_attempt(client):
    sid = fresh(client, partitions=2)
    with pytest.raises(KeyboardInterrupt):
        with client.writer(sid, mapper=0) as w:
            w.write_many((i, i) for i in range(1000))
            raise KeyboardInterrupt  # Ctrl-C mid-write
    assert client.shuffle_status(sid)["committed_mappers"] == []
    assert read_all(client, sid, 2) == []
    with client.writer(sid, mapper=0, attempt=2) as w:  # a retry commits
        w.write(1, 1)
    assert client.shuffle_status(sid)["committed_mappers"] == [0]


def test_a_reader_abandoned_half_way_leaves_the_server_serving(client):
    sid = fresh(client, partitions=1)
    with client.writer(sid, mapper=0, sort_by_key=True) as w:
        w.write_many((i, "x" * 200) for i in range(50000))
    r = client.reader(sid, 0, order="key", batch=100)
    it = iter(r)
    first = [next(it) for _ in range(10)]
    assert [k for k, _ in first] == list(range(10))
    r.close()
    del it, r
    assert len(list(client.reader(sid, 0, order="key"))) == 50000
    with client.reader(sid, 0) as r2:  # the context manager closes it too
        next(iter(r2))
    assert client.shuffle_status(sid)["partitions"][0]["records"] == 50000


def test_threads_share_a_client_and_even_a_writer(client):
    import threading
    sid = fresh(client, partitions=4, mappers=1)
    with client.writer(sid, mapper=0, buffer_mb=1) as w:
        def go(t):
            for i in range(3000):
                w.write((t, i), "v" * 100)

        threads = [threading.Thread(target=go, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "writers deadlocked"
    got = read_all(client, sid, 4)
    assert sorted(k for k, _ in got) == sorted((t, i) for t in range(4) for i in range(3000))


def test_groups_follow_key_bytes_and_span_batches(client):
    sid = fresh(client, partitions=1)
    with client.writer(sid, mapper=0, sort_by_key=True) as w:
        for k in (1, 1.0, True, (1, 1), (1, True)):
            w.write_many((k, i) for i in range(3))
        w.write_many(("big", i) for i in range(2500))  # one group over several batches
    groups = list(client.reader(sid, 0, order="key", batch=100).groups())
    assert len(groups) == 6
    assert sorted(len(v) for _, v in groups) == [3, 3, 3, 3, 3, 2500]
    assert {type(k) for k, _ in groups} == {int, float, bool, tuple, str}


def test_subclasses_and_oversized_claims_are_refused(client):
    import enum
    from collections import namedtuple

    class Color(enum.IntEnum):
        RED = 1

    Point = namedtuple("Point", "x y")
    sid = fresh(client, partitions=1)
    with client.writer(sid, mapper=0) as w:
        for bad in (Color.RED, Point(1, 2), type("MyStr", (str,), {})("s")):
            with pytest.raises(TypeError, match="pickle_fallback"):
                w.write("k", bad)
    # A few bytes that claim billions of elements are refused before anything is allocated.
    with pytest.raises(ValueError, match="claimed"):
        sluice.unpackb(b"\xdd\xff\xff\xff\xff" * 4)
    with pytest.raises(ValueError):
        sluice.unpackb(b"\xdd\x00\x10\x00\x00" + b"\xdd\x00\x10\x00\x00" * 100)


def test_a_failed_write_many_discards_the_attempt(client):
    sid = fresh(client, partitions=2)

    def items():
        yield from ((i, i) for i in range(5000))
        raise RuntimeError("the mapper's own bug")

    w = client.writer(sid, mapper=0)
    with pytest.raises(RuntimeError):
        w.write_many(items())
    with pytest.raises(sluice.Error) as e:
        w.close()  # no commit with a hole in it
    assert e.value.code == "FAILED_PRECONDITION" and "discarded" in e.value.message
    assert client.shuffle_status(sid)["committed_mappers"] == []


def test_the_encoding_agrees_with_msgpack_python_both_ways():
    """Debian's python3-msgpack as an independent oracle, on maps whose keys go through the
    decoder's cache of short keys (and past it): many distinct keys (slots collide), keys of 24
    and 25 bytes (the cache's limit), non-ASCII keys, non-str keys, the same map many times."""
    import msgpack

    objs = [
        {f"k{i}": i for i in range(5000)},
        {"x" * 24: 1, "y" * 25: 2, "": 3, "é": 4, "日本": 5, 7: "int", b"b": "bytes"},
        [{"key": i, "seq": -i, "src": "s", "payload": "p" * i} for i in range(300)],
        {"nested": {"nested": {"nested": [1.5, None, True, {"": b""}]}}},
    ]
    for obj in objs:
        ours = sluice.packb(obj)
        assert msgpack.unpackb(ours, raw=False, strict_map_key=False) == obj
        assert sluice.unpackb(msgpack.packb(obj, use_bin_type=True)) == obj
        assert sluice.unpackb(ours) == obj
    # The cached keys are strs equal to what was sent, whichever record they came from.
    rows = sluice.unpackb(sluice.packb(objs[2]))
    assert [sorted(r) for r in rows] == [["key", "payload", "seq", "src"]] * 300
    assert all(type(k) is str for r in rows for k in r)


def test_a_skewed_partition_is_read_as_slices_and_its_hot_key_is_named(client):
    """split_keys plans slices from the server's key bounds; read with from_key/to_key they are
    exactly the partition, each key in one slice; shuffle_status(hot_keys=) names the hot key."""
    sid = fresh(client, partitions=1, mappers=4)
    expected = []
    for m in range(4):
        items = [(("hot" if i % 10 < 3 else f"k{(i * 7919 + m) % 100000:06d}"), {"m": m, "i": i})
                 for i in range(20000)]
        expected.extend(items)
        with client.writer(sid, mapper=m, sort_by_key=True, buffer_mb=1) as w:
            w.write_many(items)
    plan = client.split_keys(sid, 0, 8)
    assert 3 <= len(plan["keys"]) <= 7
    assert plan["keys"] == sorted(plan["keys"]) and len(set(plan["keys"])) == len(plan["keys"])
    assert len(plan["slice_bytes"]) == len(plan["keys"]) + 1
    assert plan["frames_without_bounds"] == 0
    whole = list(client.reader(sid, 0, order="key"))
    bounds = [None] + plan["keys"] + [None]
    sliced, with_hot = [], 0
    for i in range(len(bounds) - 1):
        part = list(client.reader(sid, 0, from_key=bounds[i], to_key=bounds[i + 1]))
        with_hot += any(k == "hot" for k, _ in part)
        sliced.extend(part)
    assert sliced == whole
    assert len(whole) == len(expected)
    assert with_hot == 1
    # A range by key objects: sluice.packb gives their bytes.
    only = list(client.reader(sid, 0, from_key=sluice.packb("hot"),
                              to_key=sluice.packb("hot") + b"\x00"))
    assert len(only) == sum(1 for k, _ in expected if k == "hot")
    with pytest.raises(TypeError, match="from_key must be bytes"):
        client.reader(sid, 0, from_key="hot")
    with pytest.raises(sluice.Error) as e:
        list(client.reader(sid, 0, from_key=b"b", to_key=b"a"))
    assert e.value.code == "INVALID_ARGUMENT" and not e.value.retryable
    status = client.shuffle_status(sid, hot_keys=2)
    hot = status["partitions"][0]["hot_keys"]
    assert sluice.unpackb(hot[0]["key"]) == "hot"
    assert hot[0]["records"] == 4 * 6000 and hot[0]["error"] == 0
    assert "hot_keys" not in client.shuffle_status(sid)["partitions"][0]


def test_a_read_no_server_answers_is_asked_of_the_object_store_when_given_one(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with pytest.raises(ValueError):
        sluice.connect("127.0.0.1:1", object_store="")
    # No server and no store answer: the error names both, and says a retry may help.
    dead = sluice.connect("127.0.0.1:1", call_timeout=2, object_store="s3://bucket/prefix",
                          object_endpoint="http://127.0.0.1:1")
    with pytest.raises(sluice.Error) as e:
        list(dead.reader("job", 0))
    assert e.value.code == "UNAVAILABLE" and "the object store" in e.value.message
