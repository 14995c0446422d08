"""Sluice's Python client: mappers write items, reducers read partitions, through a Sluice
server or cluster. Encoding (msgpack of your objects), compression and gRPC run in C++ without
the GIL (the native module `sluice._sluice`).

    import sluice
    client = sluice.connect("127.0.0.1:7070")          # or "h1:p1,h2:p2,..." for a cluster
    client.create_shuffle("job", partitions=8, mappers=4)
    with client.writer("job", mapper=0, attempt=1, sort_by_key=True) as w:
        for item in items:
            w.write(item["key"], item)                  # any msgpack-able key and value
    for key, values in client.reader("job", partition=3, order="key").groups():
        ...

Keys route as zephyr routes them: xxh3-64 of the key's msgpack bytes, modulo the partition
count (`partition_of`), and a KEY-ordered read orders them by those bytes. Objects msgpack
cannot carry (set, frozenset, custom classes) raise TypeError, unless the writer has
`pickle_fallback=True` (and the reader `allow_pickle=True`). Every failure raises
`sluice.Error`, whose `code` is the gRPC status name ("NOT_FOUND", "UNAVAILABLE", ...),
`retryable` whether a retry (of a mapper: a new attempt) can succeed, `retry_after` the
seconds the server suggests waiting (or None) and `reason` why, when it says (docs/api.md).
docs/python.md is the reference.
"""
from . import _columns, _sluice
from ._sluice import Error, packb, partition_of, unpackb

__all__ = ["ArrowStream", "Client", "Error", "Reader", "Writer", "connect", "packb", "partition_of", "unpackb"]


def connect(servers="127.0.0.1:7070", *, call_timeout=30.0, tls=False, tls_ca=None,
            tls_cert=None, tls_key=None, tls_server_name=None, token=None, keepalive=10.0,
            keepalive_timeout=10.0, placement_ttl=10.0, unhealthy_for=30.0, stream_timeout=None,
            object_store=None, object_endpoint=None):
    """A client of one server or a cluster ("h1:p1,h2:p2,..." or a DNS name listing them).

    Timeouts, in seconds (docs/api.md, "Timeouts and hung servers"): `call_timeout` bounds each
    control call (a retry on a dead connection included); a hung server is found within about
    `keepalive` + `keepalive_timeout` (`keepalive` at least 1: servers refuse faster pings);
    `placement_ttl` is how long a shuffle's placement is reused (kept longer while etcd is
    down); a server that timed out is asked after the others for `unhealthy_for`;
    `stream_timeout` bounds a whole push or fetch (None: no bound).

    TLS (docs/security.md): `tls_ca` is the PEM file of the CAs the servers' certificates must
    chain to (or `tls=True` for the system's CAs); `tls_cert` and `tls_key` a client
    certificate for servers that require one (mutual TLS); `tls_server_name` the name the
    servers' certificates must carry, if not the host dialled. None of them: plaintext.
    `token`: the bearer token for servers that ask for credentials (sent only over TLS or to a
    loopback address).

    `object_store` ("s3://bucket/prefix", as the servers' --object_store) and `object_endpoint`
    (None: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else AWS's): a read no server can serve goes
    on from the shuffle's objects in the store (docs/object-store.md, "Reads with no server");
    credentials as AWS's tools find them."""
    for name, value in (("tls_ca", tls_ca), ("tls_cert", tls_cert), ("tls_key", tls_key),
                        ("tls_server_name", tls_server_name), ("token", token),
                        ("object_store", object_store), ("object_endpoint", object_endpoint)):
        if value is not None and not value:  # "" (an unset variable?) must not mean plaintext
            raise ValueError(f"{name} is empty: give a value, or None")
    if stream_timeout is not None and not stream_timeout > 0:
        raise ValueError("stream_timeout must be more than 0 (None: no bound)")
    if keepalive < 1.0:
        raise ValueError("keepalive must be at least 1 s (servers close connections that ping "
                         "more often)")
    return Client(_sluice.Client(servers, float(call_timeout), bool(tls), tls_ca or "",
                                 tls_cert or "", tls_key or "", tls_server_name or "",
                                 token or "", float(keepalive), float(keepalive_timeout),
                                 float(placement_ttl), float(unhealthy_for),
                                 float(stream_timeout) if stream_timeout is not None else 0.0,
                                 object_store or "", object_endpoint or ""))


class Client:
    """Reuse one client: it owns the connections its writers and readers use."""

    def __init__(self, native):
        self._c = native

    def create_shuffle(self, shuffle_id, partitions, mappers=0, *, replication=0):
        """Creates the shuffle; False if it exists already with the same shape. In a cluster,
        `replication` copies of each partition (1 to 3; 0: 2 with two servers or more)."""
        return self._c.create_shuffle(shuffle_id, partitions, mappers, replication)

    def delete_shuffle(self, shuffle_id):
        self._c.delete_shuffle(shuffle_id)

    def shuffle_status(self, shuffle_id, *, hot_keys=0):
        """A dict: num_partitions, num_mappers, committed_mappers, partitions (counts)...
        hot_keys=N (at most 8): each partition's dict also has "hot_keys", its N heaviest keys
        by records, heaviest first: dicts of key (msgpack bytes: sluice.unpackb gives the
        object), records, bytes, error (records may be this many too high), cut (key is its
        first 32 bytes)."""
        return self._c.get_shuffle(shuffle_id, hot_keys)

    def split_keys(self, shuffle_id, partition, slices):
        """Keys cutting a partition into at most `slices` (1 to 4,096) slices of nearly equal
        bytes, planned by the server from its frames' key bounds (no data read): a dict of keys
        (bytes, increasing), slice_bytes (estimates, one more than keys), partition_bytes,
        frames, frames_without_bounds. Slice i is read with reader(..., order="key",
        from_key=keys[i-1] (none for the first), to_key=keys[i] (none for the last))."""
        return self._c.get_splits(shuffle_id, partition, slices)

    def revoke_mappers(self, shuffle_id, mappers, placement_epoch):
        """In a cluster: revokes the winning decisions of `mappers` as the status at
        `placement_epoch` showed them (shuffle_status()["placement_epoch"]), so that they are run
        again into the same shuffle, with new attempt ids: typically the mappers of
        shuffle_status()["lost_partitions"]. Returns {"placement_epoch", "attempts"}; a repeat
        revokes nothing new. Error ABORTED: the placement moved since, read the status again."""
        return self._c.revoke_mappers(shuffle_id, list(mappers), placement_epoch)

    def writer(self, shuffle_id, mapper, attempt=1, *, sort_by_key=False, buffer_mb=64,
               zstd_level=3, pickle_fallback=False):
        """One mapper attempt. As a context manager it commits on a clean exit and discards the
        attempt on an exception (Ctrl-C included)."""
        native = self._c.open_writer(shuffle_id, mapper, attempt, sort_by_key,
                                     int(buffer_mb) << 20, zstd_level, pickle_fallback)
        return Writer(native)

    def reader(self, shuffle_id, partition, *, order="unordered", require_complete=False,
               raw=False, allow_pickle=False, batch=1024, from_key=None, to_key=None):
        """One partition's (key, value) pairs. order="key" merges every mapper's sorted runs;
        raw=True gives values as their msgpack bytes. from_key / to_key (bytes: a key's msgpack
        bytes, sluice.packb(key), or a key split_keys gave): only the keys in [from_key,
        to_key), in key order."""
        if order not in ("unordered", "key"):
            raise ValueError(f"order must be 'unordered' or 'key', not {order!r}")
        if batch < 1:
            raise ValueError("batch must be at least 1")
        for name, k in (("from_key", from_key), ("to_key", to_key)):
            if k is not None and not isinstance(k, (bytes, bytearray)):
                raise TypeError(f"{name} must be bytes (sluice.packb(key)), not "
                                f"{type(k).__name__}")
        if from_key is not None or to_key is not None:
            order = "key"
        native = self._c.open_reader(shuffle_id, partition, order == "key", require_complete,
                                     raw, allow_pickle,
                                     None if from_key is None else bytes(from_key),
                                     None if to_key is None else bytes(to_key))
        return Reader(native, batch)


class Writer:
    def __init__(self, native):
        self._w = native
        self.result = None

    def write(self, key, value):
        self._w.write(key, value)

    def write_many(self, items):
        """(key, value) pairs from any iterable; returns how many were written."""
        return self._w.write_many(items)

    def write_columns(self, columns, key):
        """Rows of columns: a pandas DataFrame, or a mapping of column name -> numpy array,
        pandas Series or list, all of one length. Each row is written as
        write(row[key], {name: row[name] for every column}) would write it (same partition, same
        order, same bytes), but the rows are made in C++ without the GIL. Columns carry ints,
        floats (32 or 64 bits), bools, str, bytes and nulls (None, pandas' NA and the nullable
        dtypes' masks); anything else raises TypeError naming the column. Returns the rows.

        Also any object of the Arrow PyCapsule interface (__arrow_c_stream__ or
        __arrow_c_array__: a pyarrow Table or RecordBatch, a Polars DataFrame...), read through
        the Arrow C data interface: int8-64, uint8-64, float32/64, bool, utf8, binary (large
        ones too) and null columns, with their validity bitmaps."""
        if not hasattr(columns, "items") and not _columns.is_pandas_frame(columns):
            if hasattr(columns, "__arrow_c_stream__"):
                return self._w.write_arrow_stream(columns.__arrow_c_stream__(), key)
            if hasattr(columns, "__arrow_c_array__"):
                schema, array = columns.__arrow_c_array__()
                return self._w.write_arrow_array(schema, array, key)
        return self._w.write_columns(_columns.columns_in(columns), key)

    def close(self):
        """Commits; returns a dict: duplicate (another attempt had committed), frames, records,
        bytes, winning_attempt."""
        self.result = self._w.close()
        return self.result

    def abort(self):
        self._w.abort()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False


def _only(columns):
    """The fields a reader gives back (None: all): a list of str."""
    if columns is None:
        return None
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise TypeError("columns is a list of field names (str)")
    return list(columns)


class ArrowStream:
    """A reader's records for a consumer of the Arrow PyCapsule stream interface."""

    def __init__(self, native, rows, keys, only):
        self._r, self._rows, self._keys, self._only = native, rows, keys, only

    def __arrow_c_stream__(self, requested_schema=None):
        # requested_schema may be ignored (the interface lets a producer do so): the consumer
        # casts if it must.
        return self._r.arrow_stream(self._rows, self._keys, self._only)


class Reader:
    def __init__(self, native, batch):
        self._r = native
        self._batch = batch

    def batches(self):
        """Lists of (key, value) pairs, as they come."""
        while True:
            b = self._r.next_batch(self._batch)
            if not b:
                return
            yield b

    def __iter__(self):
        for b in self.batches():
            yield from b

    def groups(self):
        """(key, [values]) for each key, for a reader with order="key". Keys are grouped by
        their msgpack bytes, as they are ordered and routed: 1, 1.0 and True are three keys."""
        while True:
            groups = self._r.next_groups(self._batch)
            if not groups:
                return
            yield from groups

    def frames(self, *, pandas=False, rows=2048, keys=None, dtypes=None, columns=None):
        """The records as batches of columns, in the reader's order: dicts of name -> numpy
        array (a masked array where a field has nulls), or DataFrames with pandas=True (the
        nullable dtypes where a field has nulls). Each record's value must be a map of the same
        fields (as write_columns writes them); dtypes are read from the values (docs/python.md,
        "Columns"). columns=[names]: only these fields (the others are checked, not made into
        arrays). keys="name": the records' keys as one more column of that name. dtypes:
        {name: dtype} casts numeric columns (say, back to the int32 a writer gave), raising
        ValueError for a value the dtype cannot hold exactly. A batch that cannot be columns
        raises ValueError saying why, and ends the read."""
        while True:
            b = self._r.next_columns(rows, 64 << 20, keys or "", False, _only(columns))
            if b is None:
                return
            yield _columns.frame_of(b[0], b[1], pandas, dtypes)

    def to_pandas(self, *, keys=None, dtypes=None, columns=None):
        """The whole partition as one DataFrame (decoded at once, so each column's dtype holds
        for all of it)."""
        b = self._r.next_columns(1 << 62, 0, keys or "", False, _only(columns))
        pd = _columns._pandas(needed=True)
        if b is None:
            return pd.DataFrame()
        return _columns.frame_of(b[0], b[1], True, dtypes)

    def to_columns(self, *, keys=None, dtypes=None, columns=None):
        """The whole partition as one dict of name -> numpy array (decoded at once)."""
        b = self._r.next_columns(1 << 62, 0, keys or "", False, _only(columns))
        return {} if b is None else _columns.frame_of(b[0], b[1], False, dtypes)

    def to_arrow(self, *, rows=65536, keys=None, columns=None):
        """The records as an Arrow C stream (an object with __arrow_c_stream__, read once):
        pyarrow.table(r.to_arrow()), polars.from_arrow(...), or any consumer of the Arrow
        PyCapsule interface. Batches of `rows`; the schema is the first batch's (int64, uint64,
        float, double, bool, large_utf8, large_binary, null), and a later batch whose column
        has another type ends the stream with an error saying so (more rows a batch, or the
        whole partition in one, give one type). Columns that mix types cannot be exported."""
        return ArrowStream(self._r, rows, keys or "", _only(columns))

    def frame_groups(self, *, pandas=False, rows=2048, keys=None, dtypes=None, columns=None):
        """(key, columns) for each key, for a reader with order="key": the key's rows as slices
        of a batch's arrays (or a DataFrame with pandas=True), never split over batches."""
        while True:
            b = self._r.next_columns(rows, 64 << 20, keys or "", True, _only(columns))
            if b is None:
                return
            frame = _columns.frame_of(b[0], b[1], pandas, dtypes)
            starts, group_keys = b[2], b[3]
            bounds = starts.tolist() + [b[1]]
            for i, key in enumerate(group_keys):
                yield key, _columns.sliced(frame, bounds[i], bounds[i + 1])

    def close(self):
        """Ends the read early (the server stops sending)."""
        self._r.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
