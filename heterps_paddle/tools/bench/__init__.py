"""``heterps bench ...``: benchmarks that print numbers (``--json`` for one JSON object on stdout).

Benchmarks compare against a baseline measured in the same run and report ratios: this machine is
shared and noisy, so absolute figures from different runs are not comparable.
"""

from __future__ import annotations

import argparse
from typing import Callable

from heterps_paddle.tools.command_table import add_command_table

# name -> (module, help); each module exposes add_arguments(parser) and run(args) -> int.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "e2e": ("heterps_paddle.tools.bench.e2e", "launched CTR training with heterps off and on, back to back"),
    "scheduler": (
        "heterps_paddle.tools.bench.scheduler",
        "every scheduler against the exact optimum on a workload suite",
    ),
    "table": (
        "heterps_paddle.tools.bench.table",
        "sparse table pull/push rows/s against numpy and dict references; --host-tier: the host tier's batch calls per thread count",
    ),
    "sections": ("heterps_paddle.tools.bench.sections", "unsplit vs 2- and 3-stage heterogeneous sections"),
    "control": (
        "heterps_paddle.tools.bench.control",
        "the launch's coordinator at cluster scale, simulated members and unproven connections knocking",
    ),
    "hosts": (
        "heterps_paddle.tools.bench.hosts",
        "a 2-stage split across two emulated hosts over shaped links, measured against the cost model",
    ),
    "elastic": (
        "heterps_paddle.tools.bench.elastic",
        "a lost host's recovery, a leave on notice and checkpoints' cost, on three loopback hosts",
    ),
    "adapt": (
        "heterps_paddle.tools.bench.adapt",
        "a plan that follows the job (--adapt on) against the same job with the plan fixed, on three loopback hosts",
    ),
    "data": (
        "heterps_paddle.tools.bench.data",
        "the data plan: a slowed host with pulled shards against the static split, and what a shard's call costs",
    ),
    "restore-proof": (
        "heterps_paddle.tools.bench.restore_proof",
        "proving a resume's sparse tables (every row hashed and checked for its shard) at 10^7 or 10^8 rows",
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_command_table(parser, BENCHMARKS, dest="benchmark", run_key="benchmark_run")


def run(args: argparse.Namespace) -> int:
    bench_run: Callable[[argparse.Namespace], int] = args.benchmark_run
    return bench_run(args)
