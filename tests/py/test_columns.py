"""Columns through a real sluice-server (a child process on 127.0.0.1 with a real data
directory): write_columns from numpy, pandas and lists, frames/to_pandas/to_columns and
frame_groups back, in both orders; every dtype with nulls and limits; rows byte-identical to the
dict path's; mixed writers; dtype changes between chunks; errors named per column.

Run by ctest `python_columns` (PYTHONPATH=<build>/python, SLUICE_SERVER_BIN set)."""
import math

import numpy as np
import pandas as pd
import pytest

import sluice

_ids = iter(range(1_000_000))


def fresh(client, partitions=1, mappers=1):
    sid = f"col{next(_ids)}"
    assert client.create_shuffle(sid, partitions=partitions, mappers=mappers)
    return sid


def write_cols(client, sid, cols, key="k", mapper=0, sort=True):
    with client.writer(sid, mapper=mapper, sort_by_key=sort) as w:
        n = w.write_columns(cols, key=key)
    return n, w.result


I64 = np.iinfo(np.int64)
U64 = np.iinfo(np.uint64)


def every_dtype(n=6):
    """Columns of every dtype write_columns takes, with their limits."""
    return {
        "k": np.arange(n, dtype=np.int64),
        "i8": np.array([-128, 127, 0, -1, 1, 5][:n], dtype=np.int8),
        "i16": np.array([-32768, 32767, 0, -1, 300, 5][:n], dtype=np.int16),
        "i32": np.array([-2**31, 2**31 - 1, 0, -1, 70000, 5][:n], dtype=np.int32),
        "i64": np.array([I64.min, I64.max, 0, -1, 2**40, 5][:n], dtype=np.int64),
        "u8": np.array([0, 255, 1, 2, 3, 4][:n], dtype=np.uint8),
        "u64": np.array([0, U64.max, 2**63, 1, 2**32, 7][:n], dtype=np.uint64),
        "f32": np.array([1.5, -0.0, np.inf, np.nan, 3.25, -1e30][:n], dtype=np.float32),
        "f64": np.array([1e300, -0.0, -np.inf, np.nan, 2.0, 5e-324][:n], dtype=np.float64),
        "b": np.array([True, False, True, True, False, False][:n]),
        "s": np.array(["", "héllo wörld ✓ 🚀", "x" * 70000, "a", "\x00b", "z"][:n], dtype=object),
        "by": np.array([b"", b"\x00\xff" * 40000, b"x", b"\x80", b"", b"q"][:n], dtype=object),
        "U": np.array(["", "ünïcode", "🚀", "ab", "c", "d"][:n]),  # numpy str, UCS-4
        "S": np.array([b"", b"raw", b"\x01", b"ab", b"c", b"d"][:n]),  # numpy bytes
    }


def same(a, b):
    """Equal values, NaN included, and the same sign of zero."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, float) or isinstance(y, float) or isinstance(x, np.floating):
            if math.isnan(x):
                assert math.isnan(y)
                continue
            assert x == y and math.copysign(1, x) == math.copysign(1, y)
        else:
            assert x == y and type(x) is type(y), (x, y)


@pytest.mark.parametrize("order", ["unordered", "key"])
def test_every_dtype_round_trips_in_both_orders(client, order):
    sid = fresh(client)
    cols = every_dtype()
    n, result = write_cols(client, sid, cols, sort=order == "key")
    assert n == 6 and result["records"] == 6
    got = client.reader(sid, 0, order=order).to_columns()
    assert list(got) == list(cols)  # the writer's names, in its order
    idx = np.argsort(got["k"])  # unordered reads come in any order
    expect_dtype = {"i8": np.int64, "i16": np.int64, "i32": np.int64, "i64": np.int64,
                    "u8": np.int64, "u64": np.uint64, "f32": np.float32, "f64": np.float64,
                    "b": np.bool_, "k": np.int64, "s": object, "by": object, "U": object,
                    "S": object}
    for name, values in cols.items():
        back = got[name][idx]
        assert back.dtype == expect_dtype[name], name
        if name in ("f32", "f64"):
            same(values.tolist(), back.tolist())
        elif name == "U":
            assert back.tolist() == [str(v) for v in values]
        elif name == "S":
            assert back.tolist() == [bytes(v) for v in values]
        else:
            assert back.tolist() == values.tolist(), name
            same(values.tolist(), back.tolist())


def test_rows_are_the_bytes_write_makes_so_keys_route_and_order_alike(client):
    """write_columns(row) == write(row[key], row): same key bytes, same value bytes."""
    n = 3000
    rng = np.random.default_rng(7)
    cols = {"k": rng.integers(-5, 500, size=n), "name": np.array([f"u{i % 97}" for i in range(n)],
                                                                 dtype=object),
            "x": rng.random(n), "flag": rng.random(n) < 0.5, "big": rng.integers(0, 2**63, size=n,
                                                                               dtype=np.uint64)}
    for key in ("k", "name", "flag"):
        a, b = fresh(client, partitions=8), fresh(client, partitions=8)
        write_cols(client, a, cols, key=key)
        rows = [{name: cols[name][i:i + 1].tolist()[0] for name in cols} for i in range(n)]
        with client.writer(b, mapper=0, sort_by_key=True) as w:
            w.write_many((r[key], r) for r in rows)
        for p in range(8):
            got_a = [(sluice.packb(k), v) for k, v in client.reader(a, p, order="key", raw=True)]
            got_b = [(sluice.packb(k), v) for k, v in client.reader(b, p, order="key", raw=True)]
            assert got_a == got_b, (key, p)
            for k, _ in got_a:
                assert sluice.partition_of(sluice.unpackb(k), 8) == p


def test_pandas_frames_with_nulls_round_trip(client):
    sid = fresh(client)
    df = pd.DataFrame({
        "k": pd.array([3, 1, 2, 4], dtype="Int64").astype("int64"),
        "n": pd.array([1, None, -3, 2**62], dtype="Int64"),
        "u": pd.array([None, 1, 2, 3], dtype="UInt8"),
        "f": pd.array([1.5, None, 2.5, -0.0], dtype="Float64"),
        "b": pd.array([True, None, False, True], dtype="boolean"),
        "s": pd.array(["a", None, "", "é"], dtype="string"),
        "o": ["x", None, np.nan, "y"],  # pandas' nulls in an object column: None and NaN
        "plain": [0.5, np.nan, 1.0, 2.0],  # a float64 NaN stays a float
    })
    write_cols(client, sid, df)
    got = client.reader(sid, 0, order="key").to_pandas()
    assert list(got.columns) == list(df.columns)
    assert got["k"].tolist() == [1, 2, 3, 4]
    assert str(got["n"].dtype) == "Int64" and got["n"].isna().tolist() == [True, False, False, False]
    assert got["n"].dropna().tolist() == [-3, 1, 2**62]
    assert str(got["u"].dtype) == "Int64" and got["u"].isna().tolist() == [False, False, True, False]
    assert str(got["f"].dtype) == "Float64" and got["f"].isna().tolist() == [True, False, False, False]
    assert str(got["b"].dtype) == "boolean" and got["b"].isna().tolist() == [True, False, False, False]
    assert got["s"].tolist() == [None, "", "a", "é"]
    assert got["o"].tolist() == [None, None, "x", "y"]
    assert got["plain"].dtype == np.float64 and math.isnan(got["plain"][0])
    chunks = list(client.reader(sid, 0, order="key").frames(pandas=True, rows=3))
    assert [len(c) for c in chunks] == [3, 1] and all(isinstance(c, pd.DataFrame) for c in chunks)
    assert pd.concat(chunks, ignore_index=True)["k"].tolist() == [1, 2, 3, 4]
    # Without pandas' frames: masked arrays, which write_columns takes back with their nulls.
    cols = client.reader(sid, 0, order="key").to_columns()
    assert isinstance(cols["n"], np.ma.MaskedArray) and cols["n"].mask.tolist() == [True, False,
                                                                                   False, False]
    again = fresh(client)
    write_cols(client, again, cols)
    back = client.reader(again, 0, order="key").to_pandas()
    assert back["n"].isna().tolist() == [True, False, False, False]
    assert back["b"].isna().tolist() == [True, False, False, False]


def test_dtypes_cast_back_exactly_or_say_which_value_does_not_fit(client):
    sid = fresh(client)
    cols = every_dtype()
    cols["n"] = pd.array([1, None, 3, 4, 5, 6], dtype="Int64")
    write_cols(client, sid, cols)
    got = client.reader(sid, 0, order="key").to_columns(
        dtypes={"i8": "int8", "i32": np.int32, "u8": "uint8", "f64": "float64", "n": "int16"})
    assert got["i8"].dtype == np.int8 and got["i8"].tolist() == cols["i8"].tolist()
    assert got["i32"].dtype == np.int32 and got["u8"].dtype == np.uint8
    assert got["n"].dtype == np.int16 and got["n"].mask.tolist()[:2] == [False, True]
    df = client.reader(sid, 0, order="key").to_pandas(dtypes={"n": "int32", "f32": "float64"})
    assert str(df["n"].dtype) == "Int32" and df["f32"].dtype == np.float64
    for dtypes, match in [({"i64": "int32"}, "column 'i64' row 0 holds"),
                          ({"u64": "int64"}, "column 'u64' row 1 holds"),
                          ({"i8": "uint8"}, "column 'i8' row 0 holds"),
                          ({"f64": "float32"}, "column 'f64' row 0 holds"),
                          ({"f32": "int64"}, "column 'f32' row 0 holds"),
                          ({"nope": "int8"}, "dtypes names no column 'nope'")]:
        with pytest.raises(ValueError, match=match):
            client.reader(sid, 0, order="key").to_columns(dtypes=dtypes)
    with pytest.raises(TypeError, match="only numeric and bool columns are cast"):
        client.reader(sid, 0, order="key").to_columns(dtypes={"s": "int8"})


def test_columns_gives_only_the_fields_asked_for(client):
    sid = fresh(client)
    write_cols(client, sid, {"k": np.arange(6) % 3, "s": [f"s{i}" for i in range(6)],
                             "x": np.arange(6) * 0.5})
    got = client.reader(sid, 0, order="key").to_columns(columns=["x", "k"])
    assert list(got) == ["k", "x"]  # the records' order of fields
    assert got["x"].tolist() == [0.0, 1.5, 0.5, 2.0, 1.0, 2.5]
    assert list(client.reader(sid, 0).to_pandas(columns=["s"]).columns) == ["s"]
    assert client.reader(sid, 0).to_columns(columns=[], keys="key")["key"].tolist() == [0, 0, 1,
                                                                                         1, 2, 2]
    groups = [(k, f["x"].tolist(), list(f)) for k, f in
              client.reader(sid, 0, order="key").frame_groups(columns=["x"], rows=1)]
    assert groups == [(0, [0.0, 1.5], ["x"]), (1, [0.5, 2.0], ["x"]), (2, [1.0, 2.5], ["x"])]
    names, formats, cols, _ = arrow_c.consume(client.reader(sid, 0).to_arrow(columns=["s"]))
    assert names == ["s"] and formats == ["U"] and len(cols["s"]) == 6
    with pytest.raises(ValueError, match=r"no field named 'nope' \(the fields: k, s, x\)"):
        client.reader(sid, 0).to_columns(columns=["nope"])
    with pytest.raises(TypeError, match="columns is a list of field names"):
        client.reader(sid, 0).to_columns(columns="s")


def test_one_row_empty_frames_and_lists(client):
    sid = fresh(client)
    with client.writer(sid, mapper=0, sort_by_key=True) as w:
        assert w.write_columns({"k": np.array([], dtype=np.int64), "v": []}, key="k") == 0
        assert w.write_columns(pd.DataFrame({"k": [], "v": []}), key="k") == 0
        assert w.write_columns({"k": [7], "v": ["only"]}, key="k") == 1
    assert w.result["records"] == 1
    got = client.reader(sid, 0).to_columns()
    assert got["k"].tolist() == [7] and got["v"].tolist() == ["only"]
    empty = fresh(client)
    write_cols(client, empty, {"k": np.array([], dtype=np.int64)})
    assert client.reader(empty, 0).to_columns() == {}
    assert client.reader(empty, 0).to_pandas().empty
    assert list(client.reader(empty, 0).frames()) == []


def test_lists_are_taken_element_by_element_without_coercion(client):
    sid = fresh(client)
    # numpy would make ["1", "a"] of [1, "a"]: a list is kept as Python values.
    write_cols(client, sid, {"k": [1, 2, 3], "mixed": [1, "a", None],
                             "nested": [[1, 2], {"a": 1}, None]})
    got = client.reader(sid, 0, order="key").to_columns()
    assert got["mixed"].dtype == object and got["mixed"].tolist() == [1, "a", None]
    assert got["nested"].tolist() == [[1, 2], {"a": 1}, None]


def test_mixed_row_and_column_writers_in_one_shuffle(client):
    sid = fresh(client, partitions=2, mappers=2)
    write_cols(client, sid, {"k": np.arange(100), "v": np.arange(100) * 2.0}, mapper=0)
    with client.writer(sid, mapper=1, sort_by_key=True) as w:
        w.write_many((i, {"k": i, "v": i * 2.0}) for i in range(100, 200))
    ks = []
    for p in range(2):
        df = client.reader(sid, p, order="key", require_complete=True).to_pandas()
        assert df["v"].dtype == np.float64 and (df["v"] == df["k"] * 2.0).all()
        ks.extend(df["k"].tolist())
    assert sorted(ks) == list(range(200))


def test_a_column_whose_dtype_changes_between_chunks(client):
    sid = fresh(client)
    with client.writer(sid, mapper=0, sort_by_key=True) as w:
        w.write_columns({"k": np.arange(0, 5), "x": np.arange(5)}, key="k")  # ints
        w.write_columns({"k": np.arange(5, 10), "x": np.arange(5) + 0.5}, key="k")  # floats
        w.write_columns({"k": np.arange(10, 12), "x": pd.array([None, 1], dtype="Int64")}, key="k")
    # Read at once: the values mix ints, floats and nils, so the column is Python objects, each
    # exactly as written (never int -> float).
    x = client.reader(sid, 0, order="key").to_columns()["x"]
    assert x.dtype == object
    assert x.tolist() == [0, 1, 2, 3, 4, 0.5, 1.5, 2.5, 3.5, 4.5, None, 1]
    assert [type(v) for v in x.tolist()[:6]] == [int] * 5 + [float]
    # Read in chunks of 5 rows: each chunk has the dtype of its own values.
    chunks = [f["x"] for f in client.reader(sid, 0, order="key").frames(rows=5)]
    assert [c.dtype for c in chunks[:2]] == [np.int64, np.float64]
    assert isinstance(chunks[2], np.ma.MaskedArray) and chunks[2].dtype == np.int64


def test_frame_groups_are_slices_of_whole_keys(client):
    sid = fresh(client, partitions=1, mappers=2)
    rng = np.random.default_rng(3)
    for m in range(2):
        k = rng.integers(0, 40, size=1000)
        write_cols(client, sid, {"k": k, "m": np.full(1000, m), "i": np.arange(1000)}, mapper=m)
    expected = [(k, len(v)) for k, v in client.reader(sid, 0, order="key").groups()]
    got = []
    for rows in (7, 100, 8192):  # batches smaller than a key's run: runs are never split
        got = [(k, len(f["i"])) for k, f in client.reader(sid, 0, order="key").frame_groups(
            rows=rows)]
        assert got == expected
    for key, frame in client.reader(sid, 0, order="key").frame_groups(rows=50):
        assert isinstance(frame["i"], np.ndarray) and frame["i"].base is not None  # a view
    for key, df in client.reader(sid, 0, order="key").frame_groups(pandas=True):
        assert isinstance(df, pd.DataFrame) and len(df) > 0
        break


def test_keys_as_a_column_for_row_writers(client):
    sid = fresh(client)
    with client.writer(sid, mapper=0, sort_by_key=True) as w:
        w.write_many((f"key{i}", {"v": i}) for i in range(10))
    df = client.reader(sid, 0, order="key").to_pandas(keys="key")
    assert df["key"].tolist() == sorted(f"key{i}" for i in range(10))
    with pytest.raises(ValueError, match="field named 'v' already"):
        client.reader(sid, 0).to_pandas(keys="v")


def test_values_that_are_not_columns_raise_saying_why(client):
    sid = fresh(client)
    with client.writer(sid, mapper=0) as w:
        w.write(1, [1, 2])
    with pytest.raises(ValueError, match="an array, not a map of fields"):
        client.reader(sid, 0).to_columns()
    sid = fresh(client)
    with client.writer(sid, mapper=0, sort_by_key=True) as w:
        w.write(1, {"a": 1, "b": 2})
        w.write(2, {"b": 3, "a": 4})  # another order of the same fields: fine
        w.write(3, {"a": 5, "c": 6})
    with pytest.raises(ValueError, match=r"record 2's fields differ from record 0's \(a, b\)"):
        client.reader(sid, 0, order="key").to_columns()
    two = client.reader(sid, 0, order="key").frames(rows=2)
    assert next(two)["a"].tolist() == [1, 4]
    with client.reader(sid, 0, order="key") as r:  # the records still read as pairs
        assert len(list(r)) == 3


def test_float32_keys_route_as_the_float64_write_sends(client):
    sid = fresh(client, partitions=8)
    keys = np.array([0.5, 1.25, -3.0, 1e10], dtype=np.float32)
    write_cols(client, sid, {"k": keys, "v": np.arange(4)})
    for p in range(8):
        for k, _ in client.reader(sid, p):
            assert isinstance(k, float) and sluice.partition_of(float(k), 8) == p


def test_errors_name_the_column_and_leave_the_writer_usable(client):
    sid = fresh(client)
    with client.writer(sid, mapper=0) as w:
        bad = [
            ({"k": [1], "when": np.array(["2024-01-01"], dtype="datetime64[ns]")}, TypeError,
             r"column 'when' has dtype datetime64\[ns\]"),
            ({"k": [1], "c": pd.Series(["a"], dtype="category")}, TypeError,
             "column 'c' has dtype category"),
            ({"k": [1], "h": np.array([1.0], dtype=np.float16)}, TypeError,
             "column 'h' has dtype float16"),
            ({"k": [1, 2], "s": [frozenset(), "x"]}, TypeError,
             "column 's', row 0: cannot encode an object of type 'frozenset'"),
            ({"k": [1, 2], "v": np.array([np.int64(1), "x"], dtype=object)}, TypeError,
             "column 'v', row 0: .*numpy.int64"),
            ({"k": [1, 2], "v": [1]}, ValueError, "column 'v' has 1 rows, column 'k' has 2"),
            ({"k": [1], "m": np.zeros((1, 2))}, ValueError, "column 'm' has 2 dimensions"),
            ({"x": [1]}, ValueError, "no column named 'k'"),
            ({"k": [2**64]}, OverflowError, "column 'k', row 0"),
            ({1: [1], "k": [1]}, TypeError, "column names are str"),
            ({"k": 5}, TypeError, "column 'k' is a int"),
            ([("k", [1])], TypeError, "takes a pandas DataFrame or a mapping"),
        ]
        for cols, exc, match in bad:
            with pytest.raises(exc, match=match):
                w.write_columns(cols, key="k")
        w.write_columns({"k": [1], "v": ["fine"]}, key="k")  # nothing was added before
    assert w.result["records"] == 1
    assert client.reader(sid, 0).to_columns()["v"].tolist() == ["fine"]


def test_a_failure_while_adding_discards_the_attempt(client):
    sid = fresh(client)
    w = client.writer(sid, mapper=0)
    client.delete_shuffle(sid)  # the pushes will find no shuffle
    with pytest.raises(sluice.Error):
        for _ in range(50):  # until a flush reaches the server
            w.write_columns({"k": np.arange(100000), "v": np.zeros(100000)}, key="k")
        w.close()
    with pytest.raises(sluice.Error, match="closed|discarded"):
        w.close()


# --- Arrow: the C stream interface, read and written by arrow_c.py's ctypes code ------------

import arrow_c  # noqa: E402  (tests/py, beside this file)


def test_arrow_export_reads_with_an_independent_consumer(client):
    sid = fresh(client)
    cols = {"k": np.arange(5), "i": pd.array([1, None, 3, 4, -5], dtype="Int64"),
            "f32": np.array([1.5, 2, 3, 4, 5], dtype=np.float32), "f": np.arange(5) / 2,
            "b": pd.array([True, None, False, True, False], dtype="boolean"),
            "s": ["a", None, "é🚀", "", "z"], "by": [b"x", b"", None, b"\x00", b"q"],
            "u": np.array([2**64 - 1, 0, 1, 2, 3], dtype=np.uint64), "nil": [None] * 5}
    write_cols(client, sid, cols)
    names, formats, got, lengths = arrow_c.consume(
        client.reader(sid, 0, order="key").to_arrow(rows=2))
    assert names == list(cols)
    assert formats == ["l", "l", "f", "g", "b", "U", "Z", "L", "n"]
    assert lengths == [2, 2, 1]
    assert got["k"] == [0, 1, 2, 3, 4]
    assert got["i"] == [1, None, 3, 4, -5]
    assert got["f32"] == [1.5, 2, 3, 4, 5] and got["f"] == [0, 0.5, 1, 1.5, 2]
    assert got["b"] == [True, None, False, True, False]
    assert got["s"] == ["a", None, "é🚀", "", "z"] and got["by"] == [b"x", b"", None, b"\x00", b"q"]
    assert got["u"] == [2**64 - 1, 0, 1, 2, 3] and got["nil"] == [None] * 5
    # The keys as a column; an empty partition is an empty schema and no batch.
    names, _, got, _ = arrow_c.consume(client.reader(sid, 0, order="key").to_arrow(keys="key"))
    assert names[-1] == "key" and got["key"] == [0, 1, 2, 3, 4]
    empty = fresh(client)
    assert arrow_c.consume(client.reader(empty, 0).to_arrow()) == ([], [], {}, [])


def test_arrow_export_says_when_a_column_has_no_arrow_type_or_changes_type(client):
    sid = fresh(client)
    write_cols(client, sid, {"k": [1, 2], "x": [1, "a"]})
    with pytest.raises(arrow_c.StreamError, match="column 'x' mixes types"):
        arrow_c.consume(client.reader(sid, 0, order="key").to_arrow())
    with pytest.raises(arrow_c.StreamError,
                       match="column 'x' is of Arrow format 'U' in this batch but 'l'"):
        arrow_c.consume(client.reader(sid, 0, order="key").to_arrow(rows=1))


def test_arrow_import_from_an_independent_producer(client):
    v = arrow_c.validity
    s_offs, s_data = arrow_c.offsets([b"skip", b"a", b"", "zz\u00e9".encode()])
    z_offs, z_data = arrow_c.offsets([b"", b"\x00\xff", b"", b"q"], np.int64)
    first = [  # every column sliced: its rows start at offset 1
        ("k", "i", 3, 1, 0, [None, np.array([100, 0, 1, 2], np.int32).tobytes()]),
        ("s", "u", 3, 1, 1, [v([1, 1, 0, 1]), s_offs, s_data]),
        ("b", "b", 3, 1, 0, [None, v([0, 1, 0, 1])]),
        ("u", "L", 3, 1, 0, [None, np.array([0, 2**64 - 1, 5, 6], np.uint64).tobytes()]),
        ("f", "f", 3, 1, 0, [None, np.array([0, 1.5, -2, 3.25], np.float32).tobytes()]),
        ("nil", "n", 3, 0, 3, []),
        ("by", "Z", 3, 1, 0, [None, z_offs, z_data]),
        ("i8", "c", 3, 1, 1, [v([1, 1, 1, 0]), np.array([0, -128, 127, 9], np.int8).tobytes()]),
    ]
    t_offs, t_data = arrow_c.offsets([b"t"])
    second = [
        ("k", "i", 1, 0, 0, [None, np.array([3], np.int32).tobytes()]),
        ("s", "u", 1, 0, 0, [None, t_offs, t_data]),
        ("b", "b", 1, 0, 0, [None, v([0])]),
        ("u", "L", 1, 0, 0, [None, np.array([7], np.uint64).tobytes()]),
        ("f", "f", 1, 0, 0, [None, np.array([0.25], np.float32).tobytes()]),
        ("nil", "n", 1, 0, 1, []),
        ("by", "Z", 1, 0, 0, [None] + list(arrow_c.offsets([b"zz"], np.int64))),
        ("i8", "c", 1, 0, 0, [None, np.array([1], np.int8).tobytes()]),
    ]
    producer = arrow_c.Producer([first, second])
    sid = fresh(client)
    with client.writer(sid, mapper=0, sort_by_key=True) as w:
        assert w.write_columns(producer, key="k") == 4
    assert producer.released == 3  # the stream and both batches
    got = client.reader(sid, 0, order="key").to_columns()
    assert got["k"].tolist() == [0, 1, 2, 3]
    assert got["s"].tolist() == ["a", None, "zzé", "t"]
    assert got["b"].tolist() == [True, False, True, False]
    assert got["u"].dtype == np.uint64 and got["u"].tolist() == [2**64 - 1, 5, 6, 7]
    assert got["f"].dtype == np.float32 and got["f"].tolist() == [1.5, -2, 3.25, 0.25]
    assert got["nil"].tolist() == [None] * 4
    assert got["by"].tolist() == [b"\x00\xff", b"", b"q", b"zz"]
    assert got["i8"].mask.tolist() == [False, False, True, False]
    assert got["i8"].data.tolist()[:2] == [-128, 127]


def test_arrow_import_names_what_it_cannot_take(client):
    sid = fresh(client)
    ts = np.array([1, 2], np.int64).tobytes()
    bad_utf8 = arrow_c.offsets([b"ok", b"\xff\xfe"])
    with client.writer(sid, mapper=0) as w:
        with pytest.raises(TypeError, match="column 'when' has Arrow format 'tsu:'"):
            w.write_columns(arrow_c.Producer([[("k", "l", 2, 0, 0, [None, ts]),
                                               ("when", "tsu:", 2, 0, 0, [None, ts])]]), key="k")
        with pytest.raises(UnicodeError, match="column 's', row 1: not UTF-8"):
            w.write_columns(arrow_c.Producer([[("k", "l", 2, 0, 0, [None, ts]),
                                               ("s", "u", 2, 0, 0, [None, *bad_utf8])]]), key="k")
        w.write_columns({"k": [1]}, key="k")  # nothing was added before: the writer goes on
    assert w.result["records"] == 1


def test_arrow_round_trip_from_a_reader_to_a_writer(client):
    a, b = fresh(client), fresh(client)
    cols = {"k": np.arange(1000) % 37, "s": np.array([f"v{i}" for i in range(1000)], dtype=object),
            "x": pd.array([None if i % 7 == 0 else i for i in range(1000)], dtype="Int64")}
    write_cols(client, a, cols)
    with client.writer(b, mapper=0, sort_by_key=True) as w:
        assert w.write_columns(client.reader(a, 0, order="key").to_arrow(rows=300), key="k") == 1000
    ra = [(k, v) for k, v in client.reader(a, 0, order="key", raw=True)]
    rb = [(k, v) for k, v in client.reader(b, 0, order="key", raw=True)]
    assert ra == rb  # the same records, byte for byte
