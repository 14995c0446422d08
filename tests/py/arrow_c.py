"""The Arrow C data and C stream interfaces in ctypes, written from the specification
(https://arrow.apache.org/docs/format/CDataInterface.html), apart from Sluice's C++: a consumer
that reads any `__arrow_c_stream__` into Python lists, and a producer that serves numpy buffers
as a stream. pyarrow and Polars are not in Debian 12; these stand in for them in the tests."""
import ctypes
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_int, c_int64, c_void_p,
                    py_object)

import numpy as np


class ArrowSchema(Structure):
    pass


ArrowSchema._fields_ = [
    ("format", c_char_p), ("name", c_char_p), ("metadata", c_char_p), ("flags", c_int64),
    ("n_children", c_int64), ("children", POINTER(POINTER(ArrowSchema))),
    ("dictionary", POINTER(ArrowSchema)), ("release", CFUNCTYPE(None, POINTER(ArrowSchema))),
    ("private_data", c_void_p)]


class ArrowArray(Structure):
    pass


ArrowArray._fields_ = [
    ("length", c_int64), ("null_count", c_int64), ("offset", c_int64), ("n_buffers", c_int64),
    ("n_children", c_int64), ("buffers", POINTER(c_void_p)),
    ("children", POINTER(POINTER(ArrowArray))), ("dictionary", POINTER(ArrowArray)),
    ("release", CFUNCTYPE(None, POINTER(ArrowArray))), ("private_data", c_void_p)]


class ArrowArrayStream(Structure):
    pass


GET_SCHEMA = CFUNCTYPE(c_int, POINTER(ArrowArrayStream), POINTER(ArrowSchema))
GET_NEXT = CFUNCTYPE(c_int, POINTER(ArrowArrayStream), POINTER(ArrowArray))
GET_LAST_ERROR = CFUNCTYPE(c_char_p, POINTER(ArrowArrayStream))
RELEASE_STREAM = CFUNCTYPE(None, POINTER(ArrowArrayStream))
ArrowArrayStream._fields_ = [
    ("get_schema", GET_SCHEMA), ("get_next", GET_NEXT), ("get_last_error", GET_LAST_ERROR),
    ("release", RELEASE_STREAM), ("private_data", c_void_p)]

_api = ctypes.pythonapi
_api.PyCapsule_GetPointer.restype = c_void_p
_api.PyCapsule_GetPointer.argtypes = [py_object, c_char_p]
_api.PyCapsule_New.restype = py_object
_api.PyCapsule_New.argtypes = [c_void_p, c_char_p, c_void_p]

_NUMERIC = {b"c": np.int8, b"s": np.int16, b"i": np.int32, b"l": np.int64, b"C": np.uint8,
            b"S": np.uint16, b"I": np.uint32, b"L": np.uint64, b"f": np.float32,
            b"g": np.float64}


class StreamError(Exception):
    def __init__(self, rc, message):
        super().__init__(f"errno {rc}: {message}")
        self.rc, self.message = rc, message


def _bits(addr, start, n):
    if not addr:
        return None
    nbytes = (start + n + 7) // 8
    raw = np.frombuffer(ctypes.string_at(addr, nbytes), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[start:start + n].astype(bool)


def _column(schema, array, parent_offset, n):
    fmt = schema.format
    off = parent_offset + array.offset
    bufs = array.buffers
    valid = _bits(bufs[0], off, n) if array.n_buffers > 0 and array.null_count != 0 else None
    if fmt == b"n":
        return [None] * n
    if fmt in _NUMERIC:
        t = np.dtype(_NUMERIC[fmt])
        values = np.frombuffer(ctypes.string_at(bufs[1] + off * t.itemsize, n * t.itemsize),
                               dtype=t).tolist() if n else []
    elif fmt == b"b":
        values = _bits(bufs[1], off, n).tolist() if n else []
    elif fmt in (b"u", b"U", b"z", b"Z"):
        w = np.int64 if fmt in (b"U", b"Z") else np.int32
        size = np.dtype(w).itemsize
        offs = np.frombuffer(ctypes.string_at(bufs[1] + off * size, (n + 1) * size), dtype=w)
        values = []
        for i in range(n):
            b = ctypes.string_at(bufs[2] + int(offs[i]), int(offs[i + 1] - offs[i]))
            values.append(b.decode() if fmt in (b"u", b"U") else b)
    else:
        raise ValueError(f"format {fmt!r}")
    if valid is not None:
        values = [v if ok else None for v, ok in zip(values, valid)]
    return values


def consume(obj):
    """Reads obj.__arrow_c_stream__() whole: (names, formats, {name: values}, batch lengths)."""
    cap = obj.__arrow_c_stream__()
    ptr = _api.PyCapsule_GetPointer(cap, b"arrow_array_stream")
    stream = ArrowArrayStream.from_address(ptr)
    schema = ArrowSchema()
    rc = stream.get_schema(ctypes.byref(stream), ctypes.byref(schema))
    if rc:
        raise StreamError(rc, stream.get_last_error(ctypes.byref(stream)))
    assert schema.format == b"+s"
    kids = [schema.children[j].contents for j in range(schema.n_children)]
    names = [k.name.decode() for k in kids]
    formats = [k.format.decode() for k in kids]
    cols = {name: [] for name in names}
    lengths = []
    try:
        while True:
            array = ArrowArray()
            rc = stream.get_next(ctypes.byref(stream), ctypes.byref(array))
            if rc:
                raise StreamError(rc, stream.get_last_error(ctypes.byref(stream)).decode())
            if not array.release:
                break
            assert array.n_children == len(names)
            lengths.append(array.length)
            for j, name in enumerate(names):
                cols[name].extend(_column(kids[j], array.children[j].contents, array.offset,
                                          array.length))
            array.release(ctypes.byref(array))
    finally:
        schema.release(ctypes.byref(schema))
        del cap  # the capsule's destructor releases the stream
    return names, formats, cols, lengths


class Producer:
    """An Arrow C stream over batches of numpy buffers, built by hand: each batch is a list of
    (name, format, length, offset, null_count, buffers), buffers as bytes or None."""

    _NAME = b"arrow_array_stream"

    def __init__(self, batches, schema=None):
        self.batches = batches
        self.schema = schema or [(name, fmt) for name, fmt, *_ in batches[0]]
        self.keep = []
        self.released = 0

    def _schema(self, out):
        kids = []
        for name, fmt in self.schema:
            k = ArrowSchema(format=fmt.encode(), name=name.encode(), flags=2)
            k.release = CFUNCTYPE(None, POINTER(ArrowSchema))(self._noop_schema)
            kids.append(k)
        ptrs = (POINTER(ArrowSchema) * len(kids))(*[ctypes.pointer(k) for k in kids])
        self.keep += [kids, ptrs]
        out.contents.format = b"+s"
        out.contents.name = b""
        out.contents.n_children = len(kids)
        out.contents.children = ptrs
        out.contents.release = self._release_schema_cb
        return 0

    def _noop_schema(self, s):
        s.contents.release = CFUNCTYPE(None, POINTER(ArrowSchema))()

    def _array(self, batch):
        children = []
        length = None
        for name, fmt, n, offset, nulls, bufs in batch:
            blobs = [None if b is None else ctypes.create_string_buffer(b, len(b) + 1)
                     for b in bufs]
            self.keep.append(blobs)
            arr = (c_void_p * len(bufs))(*[None if b is None else ctypes.addressof(b)
                                           for b in blobs])
            c = ArrowArray(length=n, null_count=nulls, offset=offset, n_buffers=len(bufs),
                           buffers=arr)
            c.release = CFUNCTYPE(None, POINTER(ArrowArray))(self._noop_array)
            self.keep += [arr, c]
            children.append(c)
            length = n if length is None else min(length, n)
        ptrs = (POINTER(ArrowArray) * len(children))(*[ctypes.pointer(c) for c in children])
        parent_bufs = (c_void_p * 1)(None)
        self.keep += [ptrs, parent_bufs]
        return length or 0, ptrs, parent_bufs, len(children)

    def _noop_array(self, a):
        a.contents.release = CFUNCTYPE(None, POINTER(ArrowArray))()

    def _release_array(self, a):
        self.released += 1
        a.contents.release = CFUNCTYPE(None, POINTER(ArrowArray))()

    def __arrow_c_stream__(self, requested_schema=None):
        it = iter(self.batches)

        def get_schema(stream, out):
            return self._schema(out)

        def get_next(stream, out):
            batch = next(it, None)
            if batch is None:
                out.contents.release = CFUNCTYPE(None, POINTER(ArrowArray))()
                return 0
            length, ptrs, bufs, n = self._array(batch)
            out.contents.length = length
            out.contents.null_count = 0
            out.contents.offset = 0
            out.contents.n_buffers = 1
            out.contents.buffers = bufs
            out.contents.n_children = n
            out.contents.children = ptrs
            out.contents.release = self._release_array_cb
            return 0

        def get_last_error(stream):
            return None

        def release(stream):
            self.released += 1
            stream.contents.release = RELEASE_STREAM()

        self._release_schema_cb = CFUNCTYPE(None, POINTER(ArrowSchema))(self._noop_schema)
        self._release_array_cb = CFUNCTYPE(None, POINTER(ArrowArray))(self._release_array)
        cbs = (GET_SCHEMA(get_schema), GET_NEXT(get_next), GET_LAST_ERROR(get_last_error),
               RELEASE_STREAM(release))
        stream = ArrowArrayStream(*cbs, None)
        self.keep += [cbs, stream]
        return _api.PyCapsule_New(ctypes.addressof(stream), self._NAME, None)


def validity(bits):
    """A validity bitmap (bytes) of booleans, True = valid."""
    return np.packbits(np.asarray(bits, dtype=bool), bitorder="little").tobytes()


def offsets(strings, dtype=np.int32):
    data = b"".join(strings)
    offs = np.cumsum([0] + [len(s) for s in strings]).astype(dtype).tobytes()
    return offs, data
