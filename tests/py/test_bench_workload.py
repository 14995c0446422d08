"""The benches' one workload: sluice.bench.columns (the Python benches' and Dask benches' items)
makes the very items the C++ bench (`sluice-bench`, bench/workload.cc) writes, byte for byte:
the C++ bench writes them to a real server and keeps the shuffle, Python reads them back. And
the Python benches' ways of timing them (items made before the clock, or made and nothing
else) count every item."""
import json
import os
import subprocess
import sys

import pytest

import sluice
import sluice.bench

BENCH = os.environ.get("SLUICE_BENCH_BIN", "build/bench/sluice-bench")


def result_of(out):
    """The RESULT line of a bench's output, as a dict."""
    return json.loads(next(line for line in out.splitlines()
                           if line.startswith("RESULT "))[len("RESULT "):])


def cpp_items(server, payload, shards, per_shard, keys, item_bytes):
    out = subprocess.run([BENCH, f"--server={server}", "--keep=1", f"--shards={shards}",
                          f"--items-per-shard={per_shard}", f"--keys={keys}",
                          f"--item-bytes={item_bytes}", "--partitions=3", "--order=UNORDERED",
                          f"--payload={payload}"],
                         check=True, capture_output=True, text=True).stdout
    sid = next(line.split()[1] for line in out.splitlines() if line.startswith("KEPT "))
    assert result_of(out)["counts_match"]
    client = sluice.connect(server)
    got = []
    for p in range(3):
        for key, v in client.reader(sid, p, require_complete=True):
            assert key == v["key"]
            got.append((v["src"], v["seq"], v["key"], v["payload"]))
    client.delete_shuffle(sid)
    return sorted(got)


def py_items(payload, shards, per_shard, keys, item_bytes):
    made = []
    for m in range(shards):
        c = sluice.bench.columns(m, per_shard, keys, item_bytes, payload)
        made += zip(c["src"].tolist(), c["seq"].tolist(), c["key"].tolist(), c["payload"])
    return sorted(made)


@pytest.mark.parametrize("payload,item_bytes", [("random", 200), ("random", 57), ("same", 200)])
def test_python_makes_the_cpp_benchs_items(server, payload, item_bytes):
    args = (payload, 3, 700, 97, item_bytes)
    want = py_items(*args)
    assert len(want) == 3 * 700
    assert cpp_items(server, *args) == want
    lengths = {len(x[3]) for x in want}
    assert lengths == {item_bytes - 32}
    if payload == "random":
        assert len({x[3] for x in want}) == len(want)  # each its own
        assert set("".join(x[3] for x in want)) <= set(sluice.bench._ALNUM.decode())
    else:
        assert {x[3] for x in want} == {"x" * (item_bytes - 32)}


def test_the_dicts_path_makes_the_same_items():
    from collections import Counter

    counts = Counter()
    dicts = list(sluice.bench.items(2, 300, 50, 120, counts, "random"))
    cols = sluice.bench.columns(2, 300, 50, 120, "random")
    assert [k for k, _ in dicts] == cols["key"].tolist()
    assert [v["payload"] for _, v in dicts] == list(cols["payload"])
    assert sum(counts.values()) == 300
    with pytest.raises(ValueError, match="payload must be one of"):
        sluice.bench.columns(0, 1, 1, 200, "distinct")


def run(*args):
    """One bench run (its own process: the benches fork workers); its RESULT line."""
    return result_of(subprocess.run([sys.executable, *args], check=True, capture_output=True,
                                    text=True).stdout)


def test_the_columns_bench_takes_its_items_made_before_the_clock(server):
    r = run("-m", "sluice.bench", f"--server={server}", "--columns", "--premade", "--shards=4",
            "--items-per-shard=3000", "--keys=500")
    assert r["premade"] and r["counts_match"] and r["counted_items"] == 12000


def test_making_the_columns_alone_makes_every_item():
    r = run("-m", "sluice.bench", "--generate-only", "--columns", "--shards=3",
            "--items-per-shard=2000")
    assert r["path"] == "columns" and r["counts_match"] and r["counted_items"] == 6000


def test_dasks_shuffle_takes_the_same_frames_made_before_the_clock():
    pytest.importorskip("dask.dataframe")  # (the test set-up installs python3-dask)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                          "dask_shuffle.py")
    r = run(script, "--premade", "--shards=3", "--items-per-shard=2000", "--partitions=4")
    assert r["premade"] and r["counts_match"] and r["counted_items"] == 6000


def test_a_refused_premade_run_starts_no_server():
    """--premade without --columns is refused before the bench starts its server child (which
    would outlive it, its data directory with it)."""
    try:  # (a server child left behind holds the output pipes open: the run never ends)
        p = subprocess.run([sys.executable, "-m", "sluice.bench", "--premade"],
                           capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the refused run left a server child holding its output")
    assert p.returncode == 2 and "--premade goes with --columns" in p.stderr
    left = subprocess.run(["pgrep", "-f", "sluice-pybench-"], capture_output=True, text=True)
    assert left.stdout == "", "a server child outlived the refused run"
