"""The seed workload through Dask's dataframe shuffle, the local Python peer of
`python3 -m sluice.bench --columns` (bench/python_bench.sh runs them side by side).

The very items of the columns bench and `sluice bench` (8 shards of 50,000 rows {key, seq, src,
payload}, from sluice.bench.columns, --payload random or same), made inside Dask tasks (or,
with --premade, before the clock starts), shuffled on `key` into 8 partitions with
shuffle="disk" (partd files in a temporary directory), then each partition's rows counted per
key; the counts must match what was made. Dask's threads scheduler with 2 workers. Debian's
python3-dask (install it for the bench: it is not a build dependency).
Prints a RESULT line of JSON like the other benches.
"""
import argparse
import json
import resource
import sys
import tempfile
import time

import numpy as np
import pandas as pd

import dask
import dask.dataframe as dd

from sluice.bench import PAYLOADS, columns


def shard(m, n, keys, item_bytes, payload="random"):
    """Shard m's items (the very items of `sluice bench` and sluice.bench) as a DataFrame."""
    return pd.DataFrame(columns(m, n, keys, item_bytes, payload))


def counts(df, keys):
    return np.bincount(df["key"].to_numpy(), minlength=keys)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--items-per-shard", type=int, default=50000)
    ap.add_argument("--item-bytes", type=int, default=200)
    ap.add_argument("--keys", type=int, default=10000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--payload", choices=PAYLOADS, default="random",
                    help="each row's payload random characters of its own, or one str for all")
    ap.add_argument("--premade", action="store_true",
                    help="the shards made as pandas frames before the clock starts (in this "
                         "process, which the threads share): the shuffle alone is timed")
    a = ap.parse_args(argv)
    meta = shard(0, 0, a.keys, a.item_bytes)
    with tempfile.TemporaryDirectory(prefix="dask-shuffle-") as tmp, \
            dask.config.set(scheduler="threads", num_workers=a.workers, temporary_directory=tmp):
        # --premade: the frames themselves, in memory (the tasks hand them on); else made again
        # by the timed shuffle's tasks.
        make = (lambda *args: dask.delayed(shard(*args))) if a.premade else dask.delayed(shard)
        parts = [make(m, a.items_per_shard, a.keys, a.item_bytes, a.payload)
                 for m in range(a.shards)]
        ddf = dd.from_delayed(parts, meta=meta)
        expected = sum(dask.compute(*[dask.delayed(counts)(p, a.keys) for p in parts]))
        made = time.perf_counter()
        shuffled = ddf.shuffle("key", shuffle="disk", npartitions=a.partitions)
        # Each reducer groups its partition by key, as the Sluice reducers do.
        sizes = shuffled.map_partitions(lambda df: df.groupby("key").size(),
                                        meta=pd.Series(dtype="int64"))
        got = sizes.compute()
        end = time.perf_counter()
    counted = np.zeros(a.keys, dtype=np.int64)
    np.add.at(counted, got.index.to_numpy(), got.to_numpy())
    # The expected counts came from making the shards once before the clock started; the timed
    # shuffle makes them again in its tasks, as the Sluice mappers make theirs (--premade: it
    # takes the frames made then).
    total = a.shards * a.items_per_shard
    elapsed = end - made
    result = {
        "shards": a.shards, "items_per_shard": a.items_per_shard, "partitions": a.partitions,
        "payload": a.payload, "premade": a.premade, "shuffle": "disk", "scheduler": "threads",
        "workers": a.workers,
        "elapsed_s": round(elapsed, 3), "items_per_sec": round(total / elapsed),
        "expected_items": int(expected.sum()), "counted_items": int(counted.sum()),
        "counts_match": bool((counted == expected).all()) and int(counted.sum()) == total,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "dask": dask.__version__,
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0 if result["counts_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
