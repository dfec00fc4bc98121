"""``heterps launch-args PLAN.json``: the ``paddle.distributed.launch`` arguments for a plan.

    heterps launch $(heterps launch-args plan.json) --log_dir log train.py ...

Stage 1 of a plan is the data-reading CPU trainers (``--worker_num``); each later stage is one group of
heterogeneous trainers (``--heter_worker_num "n2;n3"``, ``--heter_devices "gpu;cpu"``).  A GPU stage gets ``gpu``
only when the installed Paddle can use a GPU (``--devices auto``, the default); with the CPU wheel it runs on
``cpu``.  The plan does not size the parameter servers: ``--server-num`` (default 1).

Across hosts (``--hosts HOSTS.yaml``, launch/placement.py): the one command each host runs, every port explicit, the
parameter servers placed by the stated rule (printed); ``--json`` gives the same as one object.  ``--devices auto``
then reads the plan (a GPU stage runs on ``gpu``: the hosts are not this machine, and every host must compute the
same arguments).  ``--k8s DIR --image IMAGE`` writes Kubernetes manifests (a Job per process and a headless
Service, tools/k8s.py) that run ``--train 'TRAIN.py ARGS'``.  It also makes the job's key once (heterps_paddle/
control.py: beside the hosts file, mode 0600, never printed), which every host's ``heterps launch --hosts`` proves
to the launch's coordinator: give every host that file with the hosts file and the plan.

No Paddle import at module level (the CLI stays fast); ``--devices auto`` imports it to ask about CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from heterps_paddle import control
from heterps_paddle.files import input_file, output_dir, output_file, write_atomic
from heterps_paddle.launch.hosts import job_key_path
from heterps_paddle.launch.placement import Expansion, expand_files
from heterps_paddle.planning.launch import heter_device_for, launch_arguments
from heterps_paddle.planning.model import PlanningInputError, load_plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", help="plan JSON (docs/plan-formats.md), as written by `heterps plan --out`")
    parser.add_argument(
        "--cluster", default=None, help="cluster file, for the kind (cpu|gpu) of stages whose plan does not carry it"
    )
    parser.add_argument(
        "--server-num",
        type=int,
        default=None,
        help="parameter servers to start (default 1; with --hosts: one per stage 1 host, unless the file places them)",
    )
    parser.add_argument(
        "--devices",
        choices=("auto", "plan", "cpu"),
        default="auto",
        help="heter device of GPU stages: auto = gpu where Paddle has CUDA, else cpu; "
        "plan = as the plan says; cpu = always cpu",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON object instead of the arguments")
    parser.add_argument(
        "--hosts", default=None, help="hosts file (docs/plan-formats.md, Hosts): print the command each host runs"
    )
    parser.add_argument("--k8s", metavar="DIR", default=None, help="with --hosts: write Kubernetes manifests to DIR")
    parser.add_argument("--image", default=None, help="with --k8s: the container image of every pod")
    parser.add_argument("--name", default="heterps", help="with --k8s: the job's name (prefix of every object)")
    parser.add_argument("--namespace", default=None, help="with --k8s: the namespace of every object")
    parser.add_argument(
        "--train",
        metavar="'TRAIN.py ARGS'",
        default=None,
        help="with --hosts: the training script and its arguments, as one string (appended to each host's command; "
        "what each pod runs with --k8s)",
    )


def _paddle_has_cuda() -> bool:
    try:  # imported here: the CLI imports this module at start-up, and Paddle may not be installed
        import paddle
    except ImportError:
        return False
    return bool(paddle.device.is_compiled_with_cuda()) and paddle.device.cuda.device_count() > 0


def run(args: argparse.Namespace) -> int:
    input_file("plan", args.plan)
    for option, path in (("--cluster", args.cluster), ("--hosts", args.hosts)):
        if path is not None:
            input_file(option, path)
    if args.server_num is not None and args.server_num < 1:
        raise PlanningInputError(f"--server-num must be >= 1, got {args.server_num}")
    if args.hosts is not None:
        return _run_hosts(args)
    if args.k8s or args.train:
        raise PlanningInputError("--k8s and --train need --hosts")
    plan = load_plan(args.plan, args.cluster)
    args.server_num = 1 if args.server_num is None else args.server_num
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


def _run_hosts(args: argparse.Namespace) -> int:
    command = shlex.split(args.train) if args.train else []
    if args.k8s is not None:
        if not args.image:
            raise PlanningInputError("--k8s needs --image (the container image every pod runs)")
        if not command:
            raise PlanningInputError("--k8s needs --train 'TRAIN.py ARGS' (what every pod runs)")
    expansion = expand_files(args.plan, args.hosts, args.cluster, args.server_num, gpu=args.devices != "cpu")
    if args.k8s is not None:
        from heterps_paddle.tools.k8s import manifests, to_yaml  # the YAML writer only when asked

        documents = manifests(expansion, command, args.image, args.name, args.namespace)
        output_dir("--k8s", args.k8s)
        path = output_file("--k8s", os.path.join(args.k8s, f"{args.name}.yaml"))
        write_atomic(path, to_yaml(documents))
        print(
            f"heterps launch-args: wrote {len(documents)} objects to {path} (kubectl apply -f {path})", file=sys.stderr
        )
    # the job's key, once every input is known good (a refused command leaves nothing beside the hosts file)
    key_file = job_key_path(args.hosts)
    made = control.make_key(key_file)
    print(
        f"heterps launch-args: the job's key {'made at' if made else 'is'} {key_file} (mode 0600, never printed): "
        "give every host this file with the hosts file and the plan",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps({**expansion.to_dict(), "command": command, "key_file": key_file}))
    else:
        own = ["--hosts", args.hosts, "--plan", args.plan]
        if args.cluster:
            own += ["--cluster", args.cluster]
        if args.server_num is not None:
            own += ["--server-num", str(args.server_num)]
        if args.devices == "cpu":
            own += ["--devices", "cpu"]
        print("\n".join(host_commands(expansion, command, own)))
    return 0


def host_commands(expansion: Expansion, command: list[str], own: list[str]) -> list[str]:
    """What ``heterps launch-args --hosts`` prints: the placement, then the command of each host (``own``: the
    hosts options it was given, which every host's ``heterps launch`` reads again from its copy of the files)."""
    args = " ".join(shlex.quote(a) for a in expansion.arguments())
    options = " ".join(shlex.quote(a) for a in own)
    tail = " " + " ".join(shlex.quote(c) for c in command) if command else " TRAIN.py [ARGS...]"
    lines = [f"# {line}" for line in expansion.placement()]
    lines.append(
        "# each host runs its line, with the same files (the launches join one job through the coordinator; "
        f"each expands to Paddle's launcher with POD_IP=<host> and: {args})"
    )
    for part in expansion.parts:
        lines.append(f"# {part.describe()}")
        if part.processes:
            lines.append(f"heterps launch {options} --host {part.host.address}{tail}")
    return lines
