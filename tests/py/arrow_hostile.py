"""Arrow C streams that break the specification on purpose, for the Python client's hostile-input
tests (test_arrow_hostile.py): every field of the top-level schema and batch set by hand, NULL
where the specification wants pointers, lengths and offsets beyond the buffers. Built with the
ctypes structs of arrow_c.py. Run each in a child interpreter: a crash fails the test, not the
run."""
import ctypes
from ctypes import CFUNCTYPE, POINTER, c_void_p

from arrow_c import (GET_LAST_ERROR, GET_NEXT, GET_SCHEMA, RELEASE_STREAM, ArrowArray,
                     ArrowArrayStream, ArrowSchema, _api)

_KEEP = []  # everything the structs point to lives as long as the process


def _keep(*objs):
    _KEEP.extend(objs)
    return objs[0]


def _noop_schema(s):
    s.contents.release = CFUNCTYPE(None, POINTER(ArrowSchema))()


def _noop_array(a):
    a.contents.release = CFUNCTYPE(None, POINTER(ArrowArray))()


_RELEASE_SCHEMA = _keep(CFUNCTYPE(None, POINTER(ArrowSchema))(_noop_schema))
_RELEASE_ARRAY = _keep(CFUNCTYPE(None, POINTER(ArrowArray))(_noop_array))


def column(length, offset=0, null_count=0, buffers=(None,)):
    """A child array: `buffers` as bytes (copied into C memory of exactly that size) or None."""
    blobs = [None if b is None else ctypes.create_string_buffer(b, len(b)) for b in buffers]
    arr = (c_void_p * len(blobs))(*[None if b is None else ctypes.addressof(b) for b in blobs])
    a = ArrowArray(length=length, null_count=null_count, offset=offset, n_buffers=len(blobs),
                   buffers=arr)
    a.release = _RELEASE_ARRAY
    return _keep(a, blobs, arr)


def stream(fields, columns, top_format=b"+s", schema_n_children=None, schema_children=True,
           length=None, offset=0, batch_n_children=None, batch_children=True):
    """A stream capsule of one batch. `fields`: (name, format) of the schema's children;
    `columns`: their arrays (column()). The counts and child pointers of the top-level schema and
    batch may be set to anything: None keeps them consistent, False for *_children makes them
    NULL."""
    kids = [ArrowSchema(format=f.encode(), name=n.encode(), flags=2) for n, f in fields]
    for k in kids:
        k.release = _RELEASE_SCHEMA
    schema_ptrs = (POINTER(ArrowSchema) * max(len(kids), 1))(*[ctypes.pointer(k) for k in kids])
    array_ptrs = (POINTER(ArrowArray) * max(len(columns), 1))(*[ctypes.pointer(c)
                                                                  for c in columns])
    parent_bufs = (c_void_p * 1)(None)
    _keep(kids, schema_ptrs, array_ptrs, parent_bufs)
    state = {"sent": False}

    def get_schema(_, out):
        out.contents.format = top_format
        out.contents.name = b""
        out.contents.n_children = len(kids) if schema_n_children is None else schema_n_children
        out.contents.children = schema_ptrs if schema_children else None
        out.contents.release = _RELEASE_SCHEMA
        return 0

    def get_next(_, out):
        if state["sent"]:
            out.contents.release = CFUNCTYPE(None, POINTER(ArrowArray))()
            return 0
        state["sent"] = True
        out.contents.length = (min((c.length for c in columns), default=0)
                               if length is None else length)
        out.contents.null_count = 0
        out.contents.offset = offset
        out.contents.n_buffers = 1
        out.contents.buffers = parent_bufs
        out.contents.n_children = (len(columns) if batch_n_children is None
                                   else batch_n_children)
        out.contents.children = array_ptrs if batch_children else None
        out.contents.release = _RELEASE_ARRAY
        return 0

    def release(s):
        s.contents.release = RELEASE_STREAM()

    cbs = (GET_SCHEMA(get_schema), GET_NEXT(get_next), GET_LAST_ERROR(lambda _: None),
           RELEASE_STREAM(release))
    st = _keep(ArrowArrayStream(*cbs, None), cbs)

    class Holder:
        def __arrow_c_stream__(self, requested_schema=None):
            return _api.PyCapsule_New(ctypes.addressof(st), b"arrow_array_stream", None)

    return Holder()
