#!/usr/bin/python3
"""Requests and their cost per TiB shuffled through an object store, three layouts computed the
same way (docs/benchmarks.md, "The object tier"): Sluice's tier (one object per partition, a
manifest), Spark's S3 shuffle plugins (one data object and one index per map task; each reducer
reads its range of every map output and its index), and zephyr's shuffle (a Parquet file per
mapper flush plus a sidecar per mapper; each reducer reads every sidecar, every file's footer
and its rows' range of every file). Request counts are per request type as S3 bills them; the
prices are S3 Standard's published request prices (us-east-1): PUT, COPY, POST, LIST $0.005 per
1,000; GET and every other (HEAD) $0.0004 per 1,000; DELETE free. Sluice's per-object counts are
the ones bench/object_tier_bench.sh measures on a real store (one PUT or a multipart upload per
object plus one HEAD, the manifest; a read: one tail GET and one GET per range).

  /usr/bin/python3 bench/object_cost.py [--mappers 1691] [--partitions 8192] [--tib 1]
      [--part-mib 8] [--range-mib 8] [--zephyr-files 30678]
"""
import argparse
import math

PUT_CLASS = 0.005 / 1000   # PUT, COPY, POST, LIST
GET_CLASS = 0.0004 / 1000  # GET, HEAD, everything else but DELETE
MIB = 1 << 20


def upload(size, part):
    """PUT-class requests to write one object of `size` bytes: one PUT up to a part (the tier's
    rule), else a multipart upload's create, parts and complete."""
    if size <= part:
        return 1
    return 2 + math.ceil(size / part)


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    a.add_argument("--mappers", type=int, default=1691)
    a.add_argument("--partitions", type=int, default=8192)
    a.add_argument("--tib", type=float, default=1.0)
    a.add_argument("--part-mib", type=int, default=8)
    a.add_argument("--range-mib", type=int, default=8)
    a.add_argument("--zephyr-files", type=int, default=30678,
                   help="Parquet files a zephyr shuffle writes (30,678 at 1,691 x 8,192)")
    o = a.parse_args()
    total = o.tib * (1 << 40)
    part, rng = o.part_mib * MIB, o.range_mib * MIB
    m, r = o.mappers, o.partitions
    rows = []

    # Sluice: one object per partition (+ a HEAD after each upload), a manifest; each reducer
    # reads its partition's tail then its frames by ranges.
    per_part = total / r
    w = upload(per_part, part)
    puts = r * w + 1
    gets = r * 1 + r * (1 + math.ceil(per_part / rng))  # HEADs, then the reads
    rows.append(("Sluice (object per partition)", r + 1, puts, gets))

    # Spark's S3 shuffle plugins: a data object and an index per map task; each reducer GETs
    # its range of every map output and that output's index.
    per_map = total / m
    w = upload(per_map, part)
    puts = m * (w + 1)
    gets = m * r * 2
    rows.append(("Spark S3 plugins (object per map task)", 2 * m, puts, gets))

    # zephyr: a Parquet file per mapper flush and a sidecar per mapper; each reducer reads
    # every sidecar, every file's footer (its length, then the footer) and its rows' range of
    # every file.
    files = o.zephyr_files
    per_file = total / files
    w = upload(per_file, part)
    puts = files * w + m
    gets = r * (m + files * 3)
    rows.append(("zephyr (file per mapper flush + sidecars)", files + m, puts, gets))

    print(f"# {m:,} mappers x {r:,} partitions, {o.tib:g} TiB; parts and ranges of "
          f"{o.part_mib} / {o.range_mib} MiB; S3 Standard request prices")
    print(f"{'layout':44} {'objects':>10} {'PUT-class':>12} {'GET-class':>14} {'$ / TiB':>9}")
    for name, objects, puts, gets in rows:
        cost = (puts * PUT_CLASS + gets * GET_CLASS) / o.tib
        print(f"{name:44} {objects:>10,} {puts:>12,} {gets:>14,} {cost:>9.2f}")


if __name__ == "__main__":
    main()
