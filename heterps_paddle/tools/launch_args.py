"""``heterps launch-args PLAN.json``: the ``paddle.distributed.launch`` arguments for a plan.

    heterps launch $(heterps launch-args plan.json) --log_dir log train.py ...

Stage 1 of a plan is the data-reading CPU trainers (``--worker_num``); each later stage is one group of
heterogeneous trainers (``--heter_worker_num "n2;n3"``, ``--heter_devices "gpu;cpu"``).  A GPU stage gets ``gpu``
only when the installed Paddle can use a GPU (``--devices auto``, the default); with the CPU wheel it runs on
``cpu``.  The plan does not size the parameter servers: ``--server-num`` (default 1).

No Paddle import at module level (the CLI stays fast); ``--devices auto`` imports it to ask about CUDA.
"""

from __future__ import annotations

import argparse
import json
import sys

from heterps_paddle.planning.launch import heter_device_for, launch_arguments
from heterps_paddle.planning.model import PlanningInputError, load_plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", help="plan JSON (docs/plan-formats.md), as written by `heterps plan --out`")
    parser.add_argument(
        "--cluster", default=None, help="cluster file, for the kind (cpu|gpu) of stages whose plan does not carry it"
    )
    parser.add_argument("--server-num", type=int, default=1, help="parameter servers to start (default 1)")
    parser.add_argument(
        "--devices",
        choices=("auto", "plan", "cpu"),
        default="auto",
        help="heter device of GPU stages: auto = gpu where Paddle has CUDA, else cpu; "
        "plan = as the plan says; cpu = always cpu",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON object instead of the arguments")


def _paddle_has_cuda() -> bool:
    try:  # imported here: the CLI imports this module at start-up, and Paddle may not be installed
        import paddle
    except ImportError:
        return False
    return bool(paddle.device.is_compiled_with_cuda()) and paddle.device.cuda.device_count() > 0


def run(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan, args.cluster)
    if args.server_num < 1:
        raise PlanningInputError(f"--server-num must be >= 1, got {args.server_num}")
    if args.devices == "plan":
        gpu = True
    elif args.devices == "cpu":
        gpu = False
    else:
        wants_gpu = any(s.kind == "gpu" for s in plan.heter_stages())
        gpu = wants_gpu and _paddle_has_cuda()
        if wants_gpu and not gpu:
            print("heterps launch-args: no CUDA in this Paddle; GPU stages will run on cpu", file=sys.stderr)
    argv = launch_arguments(plan, args.server_num, gpu)
    if args.json:
        print(
            json.dumps(
                {
                    "launch_args": argv,
                    "stages": [
                        {
                            "stage": index,
                            "resource": s.resource,
                            "kind": s.kind,
                            "units": s.units,
                            "layers": list(s.layers),
                            "role": "trainer" if index == 1 else "heter_trainer",
                            "heter_device": None if index == 1 else heter_device_for(s, gpu),
                        }
                        for index, s in enumerate(plan.stages, 1)
                    ],
                }
            )
        )
    else:
        print(" ".join(argv))
    return 0
