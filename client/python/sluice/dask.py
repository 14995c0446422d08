"""Dask DataFrames shuffled through Sluice (docs/dask.md). Dask is imported only by this module.

    import sluice.dask
    with sluice.dask.Shuffle("h1:7070,h2:7070", replication=2) as s:
        out = s.shuffle(ddf, on="key")              # as ddf.shuffle("key", shuffle="tasks")
        by_key = s.set_index(ddf, "key")            # sorted, with divisions
        joined = s.merge(left, right, on="key")     # a hash join
        counts = s.groupby_apply(ddf, "key", f, meta=...)
        out.compute()

Each input partition is one mapper: its task writes its rows with `write_columns` (the mapper id
is the partition's number, the attempt id new at every run of the task), routed to the output
partition Dask's own shuffle would give them (the same hash of the same columns, or the same
divisions); each output partition is one reducer task reading its partition into pandas, the
input's dtypes and index kept. A task Dask runs again (a worker lost, a task stolen) writes a new
attempt: the first attempt of a mapper to commit wins, reducers read only winners, so no row is
lost or doubled and no other mapper runs again. The graph carries only small objects (ids,
numbers, the connection settings), never a DataFrame.
"""
import os
import threading

import numpy as np

from . import Error, connect, partition_of

__all__ = ["Shuffle"]

_ROUTE = "__sluice_route"
_READ_ROWS = 65536
_INDEX = "__sluice_index"

# Per worker process: one client per connection settings, and the routing keys per partition
# count.
_lock = threading.Lock()
_clients = {}
_routes = {}


def _client(settings):
    with _lock:
        c = _clients.get(settings)
        if c is None:
            c = connect(**dict(settings))
            _clients[settings] = c
        return c


def _routing_keys(n):
    """Int keys k[p] that Sluice routes to partition p of n (partition_of(k[p], n) == p): a row
    written with key k[p] lands in partition p, whatever the row."""
    with _lock:
        keys = _routes.get(n)
    if keys is None:
        table = np.full(n, -1, dtype=np.int64)
        left, k = n, 0
        while left:
            p = partition_of(k, n)
            if table[p] < 0:
                table[p] = k
                left -= 1
            k += 1
        with _lock:
            keys = _routes.setdefault(n, table)
    return keys


def _attempt():
    """A new attempt id for each run of a task (63 bits: never 0)."""
    return (int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)) or 1


# Dtypes the columns carry as they are (docs/python.md, "Columns"); datetimes travel as their
# int64 nanoseconds and come back as they were.
def _check_dtypes(meta):
    import pandas as pd

    for name, dtype in list(meta.dtypes.items()) + [(_INDEX, meta.index.dtype)]:
        if isinstance(dtype, pd.DatetimeTZDtype) or isinstance(dtype, pd.CategoricalDtype):
            raise TypeError(f"column {name!r} has dtype {dtype}: sluice.dask carries ints, "
                            "floats, bools, str, bytes, nulls and datetime64[ns]; convert it first")
        if dtype.kind == "m":
            raise TypeError(f"column {name!r} has dtype {dtype}: convert timedeltas to ints first")
    if meta.index.nlevels != 1:
        raise TypeError("a MultiIndex is not carried: reset_index() first")
    for name in meta.columns:
        if not isinstance(name, str) or name in (_ROUTE, _INDEX):
            raise TypeError(f"column names must be str (and not {_ROUTE!r} or {_INDEX!r}): "
                            f"{name!r}")


def _to_wire(part):
    """The partition's rows as the columns written: its index as one more column, datetimes as
    int64."""
    out = {}
    for name in part.columns:
        col = part[name]
        out[name] = col.values.view("int64") if col.dtype.kind == "M" else col
    idx = part.index
    out[_INDEX] = idx.values.view("int64") if idx.dtype.kind == "M" else idx.values
    return out


def _joined(pieces):
    """One column from its batches' arrays (a masked array where a batch had nulls): a numpy
    array, or pandas' nullable array for numeric columns with nulls."""
    if len(pieces) == 1 and not isinstance(pieces[0], np.ma.MaskedArray):
        return pieces[0]
    if not any(isinstance(p, np.ma.MaskedArray) for p in pieces):
        return np.concatenate(pieces)
    import pandas as pd

    from . import _columns

    joined = np.ma.concatenate(pieces)
    return _columns._masked(np, pd, np.ma.getdata(joined), np.ma.getmaskarray(joined), True)


def _from_wire(batches, meta):
    """A reducer's batches of columns as one DataFrame in the input's dtypes, columns and
    index."""
    import pandas as pd

    if not batches:
        return meta.iloc[:0].copy()
    cols = {}
    for name, dtype in meta.dtypes.items():
        col = pd.Series(_joined([b[name] for b in batches]), copy=False)
        if dtype.kind == "M":
            col = pd.to_datetime(col.astype("int64"))
        elif col.dtype != dtype:
            col = col.astype(dtype)
        cols[name] = col.values
    idx = pd.Series(_joined([b[_INDEX] for b in batches]), copy=False)
    if meta.index.dtype.kind == "M":
        index = pd.DatetimeIndex(idx.astype("int64").values, name=meta.index.name)
    else:
        index = pd.Index(idx.values, name=meta.index.name).astype(meta.index.dtype)
    return pd.DataFrame(cols, index=index, columns=meta.columns)


def _numeric_dtypes(meta):
    """What a reader casts as it makes arrays: the numeric columns' own dtypes."""
    out = {}
    for name, dtype in list(meta.dtypes.items()) + [(_INDEX, meta.index.dtype)]:
        if dtype.kind in "iuf" and not hasattr(dtype, "na_value"):
            out[name] = dtype
    return out


def _write(part, settings, shuffle_id, mapper, npartitions, route, route_args, buffer_mb):
    """A map task: the input partition's rows, each to the partition `route` gives it. A task
    run again after its mapper committed (its result was lost with a worker) writes nothing."""
    client = _client(settings)
    if mapper in client.shuffle_status(shuffle_id)["committed_mappers"]:
        return {"mapper": mapper, "attempt": 0, "winner": None, "rows": 0, "duplicate": True}
    targets = np.asarray(route(part, npartitions, *route_args), dtype=np.int64)
    columns = _to_wire(part)
    columns[_ROUTE] = _routing_keys(npartitions)[targets]
    attempt = _attempt()
    with client.writer(shuffle_id, mapper=mapper, attempt=attempt, buffer_mb=buffer_mb) as w:
        w.write_columns(columns, key=_ROUTE)
    r = w.result
    return {"mapper": mapper, "attempt": attempt, "winner": r["winning_attempt"],
            "rows": len(part), "duplicate": r["duplicate"]}


def _barrier(*written):
    return sum(w["rows"] for w in written if not w["duplicate"])


def _read(barrier, settings, shuffle_id, partition, meta, after, after_args):
    """A reduce task: one output partition, every mapper's winning attempt, in pandas."""
    del barrier  # (only ordering: every mapper has committed)
    client = _client(settings)
    reader = client.reader(shuffle_id, partition, require_complete=True)
    # In batches: the partition's records are decoded a batch at a time (a whole-partition
    # decode held its rows' bytes beside the arrays made of them), joined per column at the end.
    batches = list(reader.frames(rows=_READ_ROWS, dtypes=_numeric_dtypes(meta),
                                 columns=list(meta.columns) + [_INDEX]))
    out = _from_wire(batches, meta)
    del batches
    return after(out, *after_args) if after is not None else out


# Routes: the output partition of each row, as Dask's own shuffle gives them.
def _hash_route(part, npartitions, on):
    from dask.dataframe.shuffle import partitioning_index

    keys = part.index.to_frame(index=False) if on is None else part[on]
    return partitioning_index(keys, npartitions)


def _division_route(part, npartitions, column, divisions):
    values = part.index if column is None else part[column]
    p = np.searchsorted(np.asarray(divisions[1:-1]), values.values, side="right")
    return np.clip(p, 0, npartitions - 1)


def _sorted_by_index(df):
    return df.sort_index(kind="mergesort")


def _set_index_after(df, column, drop):
    return df.set_index(column, drop=drop).sort_index(kind="mergesort")


def _sort_after(df, by, ascending):
    return df.sort_values(by, ascending=ascending, kind="mergesort")


class Shuffle:
    """Shuffles Dask DataFrames through a Sluice server or cluster. `servers` ("h1:p1,h2:p2",
    or None: Dask's config `sluice.servers`), `replication` (0: the cluster's default), and
    `connect`: more sluice.connect() settings (tls_ca, token...) for the workers' clients;
    `buffer_mb`: what each map task's writer buffers before it sends (Client.writer's
    buffer_mb; at 8 a 500,000-row task took no longer than at 64, with a quarter of the memory).
    Each shuffle it makes is deleted by close() (or leaving its `with`); a server's
    --shuffle_ttl_s deletes those of a process that died first."""

    def __init__(self, servers=None, *, replication=0, prefix="dask", connect=None,
                 buffer_mb=8):
        import dask

        if servers is None:
            servers = dask.config.get("sluice.servers", None)
        if not servers:
            raise ValueError("no Sluice servers: give servers=, or set Dask's config "
                             "'sluice.servers'")
        settings = dict(connect or {})
        settings["servers"] = servers
        self._settings = tuple(sorted(settings.items()))
        self._replication = int(replication)
        self._prefix = prefix
        if not 1 <= int(buffer_mb) <= 65536:
            raise ValueError(f"buffer_mb must be 1 to 65,536, not {buffer_mb!r}")
        self._buffer_mb = int(buffer_mb)
        self._made = []

    @property
    def shuffle_ids(self):
        """The shuffles made so far (deleted by close())."""
        return list(self._made)

    def _new_id(self):
        return f"{self._prefix}-{os.urandom(8).hex()}"

    def _exchange(self, df, npartitions, route, route_args, after=None, after_args=(),
                  meta=None, divisions=None, name="sluice-shuffle"):
        from dask.base import tokenize
        from dask.dataframe.core import new_dd_object
        from dask.highlevelgraph import HighLevelGraph

        _check_dtypes(df._meta)
        npartitions = int(npartitions or df.npartitions)
        sid = self._new_id()
        client = _client(self._settings)
        try:
            client.create_shuffle(sid, npartitions, df.npartitions,
                                  replication=self._replication)
        except Error as e:
            # A refusal made nothing; a call that failed on the way (retryable) may have made
            # it: close() deletes that one, passing over it if it is not there.
            if e.retryable:
                self._made.append(sid)
            raise
        self._made.append(sid)
        token = tokenize(sid)
        write_name, barrier_name, read_name = (f"{name}-write-{token}",
                                               f"{name}-barrier-{token}", f"{name}-{token}")
        dsk = {}
        for i in range(df.npartitions):
            dsk[(write_name, i)] = (_write, (df._name, i), self._settings, sid, i, npartitions,
                                    route, route_args, self._buffer_mb)
        dsk[barrier_name] = (_barrier,) + tuple((write_name, i) for i in range(df.npartitions))
        for j in range(npartitions):
            dsk[(read_name, j)] = (_read, barrier_name, self._settings, sid, j, df._meta, after,
                                   after_args)
        graph = HighLevelGraph.from_collections(read_name, dsk, dependencies=[df])
        out_meta = df._meta if meta is None else meta
        return new_dd_object(graph, read_name, out_meta,
                             divisions or (None,) * (npartitions + 1))

    def shuffle(self, df, on=None, npartitions=None):
        """Every row to the partition Dask's own shuffle ("tasks") gives it: rows with equal
        values of `on` (a column, a list of them, or None: the index) together. As
        df.shuffle(on, npartitions=...): the result's divisions are unknown."""
        if isinstance(on, str):
            on = [on]
        return self._exchange(df, npartitions, _hash_route, (on,))

    def set_index(self, df, column, *, npartitions=None, divisions=None, drop=True):
        """As df.set_index(column): the rows range-partitioned on `column` (divisions as Dask
        computes them, from the column's quantiles, unless given), each partition sorted."""
        if divisions is None:
            divisions = self._divisions(df[column], npartitions or df.npartitions)
        n = len(divisions) - 1
        meta = df._meta.set_index(column, drop=drop)
        return self._exchange(df, n, _division_route, (column, list(divisions)),
                              after=_set_index_after, after_args=(column, drop), meta=meta,
                              divisions=tuple(divisions))

    def sort_values(self, df, by, *, npartitions=None, ascending=True):
        """As df.sort_values(by) on one column: range-partitioned on it, each partition sorted
        (stably)."""
        if not isinstance(by, str):
            raise TypeError("sort_values takes one column name")
        divisions = self._divisions(df[by], npartitions or df.npartitions)
        n = len(divisions) - 1
        route_divisions = list(divisions)
        out = self._exchange(df, n, _division_route, (by, route_divisions), after=_sort_after,
                             after_args=(by, ascending))
        if not ascending:
            out = out.partitions[::-1]
        return out

    def merge(self, left, right, on, *, how="inner", npartitions=None, suffixes=("_x", "_y")):
        """As dd.merge(left, right, on=..., how=...): both sides hash-shuffled on `on` into the
        same partitions, then joined partition by partition with pandas."""
        from dask.base import tokenize
        from dask.dataframe.core import new_dd_object
        from dask.highlevelgraph import HighLevelGraph
        import pandas as pd

        if how not in ("inner", "left", "right", "outer"):
            raise ValueError(f"how must be inner, left, right or outer, not {how!r}")
        n = int(npartitions or max(left.npartitions, right.npartitions))
        keys = [on] if isinstance(on, str) else list(on)
        lhs = self.shuffle(left, keys, npartitions=n)
        rhs = self.shuffle(right, keys, npartitions=n)
        meta = pd.merge(left._meta, right._meta, how=how, on=keys, suffixes=suffixes)
        name = f"sluice-merge-{tokenize(lhs._name, rhs._name, how, keys, suffixes)}"
        dsk = {(name, i): (_merge_parts, (lhs._name, i), (rhs._name, i), how, keys, suffixes)
               for i in range(n)}
        graph = HighLevelGraph.from_collections(name, dsk, dependencies=[lhs, rhs])
        return new_dd_object(graph, name, meta, (None,) * (n + 1))

    def groupby_apply(self, df, by, func, *, meta, npartitions=None):
        """As df.groupby(by).apply(func, meta=meta): the rows of each group brought together by
        a shuffle on `by`, then func applied to each group with pandas."""
        keys = [by] if isinstance(by, str) else list(by)
        shuffled = self.shuffle(df, keys, npartitions=npartitions)
        return shuffled.map_partitions(_apply_groups, keys, func, meta=meta)

    def _divisions(self, column, npartitions):
        """Divisions as Dask's set_index computes them (approximate quantiles, made unique)."""
        from dask.dataframe.shuffle import _calculate_divisions

        divisions = list(_calculate_divisions(column.to_frame(), column, False, npartitions)[0])
        unique = sorted(set(divisions))  # (skewed data repeats quantiles: fewer partitions)
        return unique if len(unique) > 1 else unique * 2

    def close(self):
        """Deletes every shuffle this object made (those already gone are passed over). One
        that cannot be deleted now (etcd or a server down) is warned of and kept for the next
        close(); the servers' --shuffle_ttl_s deletes it otherwise. Never raises (it runs as a
        `with` ends, maybe on another error)."""
        import warnings

        client = _client(self._settings)
        failed = []
        for sid in self._made:
            try:
                client.delete_shuffle(sid)
            except Error as e:
                if e.code != "NOT_FOUND":
                    failed.append((sid, e))
        self._made = [sid for sid, _ in failed]
        if failed:
            warnings.warn(f"sluice.dask: {len(failed)} shuffle(s) not deleted now (close() again, "
                          f"or the servers' --shuffle_ttl_s deletes them): {failed[0][1]}",
                          RuntimeWarning, stacklevel=2)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _merge_parts(left, right, how, keys, suffixes):
    import pandas as pd

    return pd.merge(left, right, how=how, on=keys, suffixes=suffixes)


def _apply_groups(part, keys, func):
    return part.groupby(keys if len(keys) > 1 else keys[0], group_keys=True).apply(func)
