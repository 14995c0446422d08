"""Hostile Arrow producers given to Writer.write_columns (issue 50, items 1 and 2): each case runs
in a child interpreter, so a crash fails its test rather than the run, and must end in a clear
Python error (or be written correctly), never a crash and never bytes from outside a buffer."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import sys
sys.path.insert(0, {here!r})
import numpy as np
import sluice
from arrow_hostile import column, stream
ks = np.array([1, 2, 3, 4], np.int64).tobytes()  # 32 bytes: 4 int64s
client = sluice.connect({server!r})
sid = "hostile-{name}"
client.create_shuffle(sid, partitions=1, mappers=1)
w = client.writer(sid, mapper=0, attempt=1)
try:
    n = w.write_columns({case}, key="k")
    w.close()
    rows = [int(v) for v in client.reader(sid, 0).to_columns()["k"]]
    print("WROTE", n, rows)
except Exception as e:
    print("RAISED", type(e).__name__, e)
"""

I64 = '[("k", "l")]'
CASES = {
    # The top-level schema is not a struct.
    "not_a_struct": (f'stream({I64}, [column(4, buffers=(None, ks))], top_format=b"l", '
                     'schema_n_children=0, batch_n_children=0)', "RAISED TypeError"),
    # Three children announced, none there.
    "children_null": (f'stream({I64}, [column(4, buffers=(None, ks))], schema_n_children=3, '
                      'schema_children=False, batch_n_children=3, batch_children=False)',
                      "RAISED ValueError"),
    "children_negative": (f'stream({I64}, [column(4, buffers=(None, ks))], '
                          'schema_n_children=-7, batch_n_children=-7)', "RAISED ValueError"),
    # An int64 column far longer than its 32-byte buffer.
    "length_2_40": (f'stream({I64}, [column(2**40, buffers=(None, ks))], length=2**40)',
                    "RAISED ValueError"),
    "length_2_62": (f'stream({I64}, [column(2**62, buffers=(None, ks))], length=2**62)',
                    "RAISED ValueError"),
    # An offset whose byte offset wraps (x 8: -16 bytes, before the buffer).
    "offset_wraps": (f'stream({I64}, [column(2, offset=2**63 - 2, buffers=(None, ks))], '
                     'length=2)', "RAISED ValueError"),
    "batch_offset_wraps": (f'stream({I64}, [column(2**63 - 1, buffers=(None, ks))], length=2, '
                           'offset=2**63 - 2)', "RAISED ValueError"),
    # A string column whose last offset points far past its data.
    "string_past_data": ('stream([("k", "l"), ("s", "u")], [column(1, buffers=(None, ks)), '
                         'column(1, buffers=(None, np.array([0, 2**30], np.int32).tobytes(), '
                         'b"ab"))])', "RAISED ValueError"),
    # Within its buffers: written as given.
    "sliced_within": (f'stream({I64}, [column(2, offset=2, buffers=(None, ks))])',
                      "WROTE 2 [3, 4]"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_hostile_arrow_producer_gets_an_error_not_a_crash(server, name):
    case, expected = CASES[name]
    code = CHILD.format(here=HERE, server=server, name=name.replace("_", "-"), case=case)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{name}: the interpreter died ({r.returncode}): {r.stderr[-2000:]}"
    assert expected in r.stdout, f"{name}: {r.stdout} {r.stderr[-1000:]}"
