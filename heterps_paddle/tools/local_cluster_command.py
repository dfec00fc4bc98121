"""``heterps local-cluster``: write the cluster file of this machine, measured (measure/local_cluster.py)."""

from __future__ import annotations

import argparse

from heterps_paddle.files import output_dir, output_file
from heterps_paddle.measure.local_cluster import detect_local_cluster
from heterps_paddle.planning.model import cluster_to_dict, save_yaml


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="where to write the cluster YAML")
    parser.add_argument("--throughput", type=float, help="required samples/s to put in the file")
    parser.add_argument("--ssd-dir", help="directory of the SSD tier (default: the temp directory)")


def run(args: argparse.Namespace) -> int:
    output_file("--out", args.out)
    if args.ssd_dir is not None:
        output_dir("--ssd-dir", args.ssd_dir)  # measured by writing a file there
    cluster = detect_local_cluster(args.ssd_dir)
    if args.throughput is not None:
        cluster = cluster.with_throughput(args.throughput)
    save_yaml(cluster_to_dict(cluster), args.out)
    print(
        f"wrote {args.out}: {', '.join(t.name for t in cluster.resource_types)} "
        f"({cluster.resource_types[0].max_units} units each)"
    )
    return 0
