"""The ``heterps`` command.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``, named in
:data:`COMMANDS` and imported by name (tools/command_table.py, which ``heterps bench`` uses too): this module only
parses the command line and reports errors, and no subcommand imports it back (pyproject.toml's import contracts).  Those modules must not import Paddle at module level: ``heterps plan`` and
``heterps --help`` stay fast and work where Paddle is not installed.
"""

from __future__ import annotations

import argparse
import sys

from heterps_paddle.errors import EXIT_INPUT_ERROR, HeterPSError
from heterps_paddle.tools.command_table import add_command_table
from heterps_paddle.tools.launch import main as launch_main
from heterps_paddle.version import __version__

# name -> (module, one-line help). One table, so the help and the dispatch cannot disagree.
COMMANDS: dict[str, tuple[str, str]] = {
    "gen-data": (
        "heterps_paddle.tools.gen_data_command",
        "write synthetic Criteo-format CTR data with a planted signal",
    ),
    "plan": ("heterps_paddle.tools.plan_command", "plan layer placement and unit counts from a profile and a cluster"),
    "profile": ("heterps_paddle.tools.profile_command", "profile a static program into a model profile file"),
    "local-cluster": (
        "heterps_paddle.tools.local_cluster_command",
        "write a cluster file describing this machine (measured)",
    ),
    "launch-args": ("heterps_paddle.tools.launch_args", "print the paddle.distributed.launch arguments for a plan"),
    "eval": ("heterps_paddle.tools.eval_command", "the held-out AUC of a saved model, loaded as a serving job would"),
    "settings": ("heterps_paddle.tools.settings_command", "list the HETERPS_* environment variables"),
    "status": (
        "heterps_paddle.tools.status_command",
        "a job's measured rates beside the plan's, its cost and its rounds, from its event log (LOG_DIR)",
    ),
    "bench": ("heterps_paddle.tools.bench", "benchmarks that print numbers (JSON with --json)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="heterps",
        description="heterps-paddle: HeterPS scheduling and heterogeneous training for PaddlePaddle fleet.",
    )
    parser.add_argument("--version", action="version", version=f"heterps-paddle {__version__}")
    add_command_table(parser, COMMANDS, dest="command", run_key="command_run")
    parser.epilog = f"{LAUNCH_COMMAND[0]}: {LAUNCH_COMMAND[1]}"
    return parser


# Takes paddle.distributed.launch's own arguments, which argparse here would not know: dispatched before parsing.
LAUNCH_COMMAND = (
    "launch",
    "run a parameter-server job like python -m paddle.distributed.launch, failing when it "
    "fails (heterps_paddle.tools.launch)",
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [LAUNCH_COMMAND[0]]:
        return launch_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.command_run(args) or 0)
    except HeterPSError as exc:
        print(f"heterps {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_INPUT_ERROR


if __name__ == "__main__":
    sys.exit(main())
