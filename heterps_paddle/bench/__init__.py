"""``heterps bench ...``: benchmarks that print numbers (``--json`` for one JSON object on stdout).

Benchmarks compare against a baseline measured in the same run and report ratios: this machine is
shared and noisy, so absolute figures from different runs are not comparable.
"""

from __future__ import annotations

import importlib

# name -> (module, help); each module exposes add_arguments(parser) and run(args) -> int.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "e2e": ("heterps_paddle.bench.e2e", "launched CTR training with heterps off and on, back to back"),
    "scheduler": ("heterps_paddle.bench.scheduler", "every scheduler against the exact optimum on a workload suite"),
    "table": ("heterps_paddle.bench.table", "sparse table pull/push rows/s against numpy and dict references"),
    "sections": ("heterps_paddle.bench.sections", "unsplit vs 2- and 3-stage heterogeneous sections"),
}


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    sub.required = True
    for name, (module_name, help_text) in BENCHMARKS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # not part of this build yet
        bench_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(bench_parser)
        bench_parser.set_defaults(_bench_run=module.run)


def run(args) -> int:
    return args._bench_run(args)
