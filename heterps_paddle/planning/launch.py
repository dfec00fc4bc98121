"""The launch as part of the cluster: what ``paddle.distributed.launch`` started, and what a plan needs started.

``paddle.distributed.launch`` fixes, before ``minimize`` runs, how many CPU trainers (stage 1: they read the
data), how many heterogeneous trainers per later stage, and on which device each heterogeneous stage runs.  A
plan made inside the job must fit that (planning/launch_fit.py); a saved plan is checked against it; and
``heterps launch-args`` turns a plan into the arguments that start it.

Pure Python: the records and the reading of the launcher's environment need no Paddle.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

from heterps_paddle.errors import HeterPSError
from heterps_paddle.planning.model import Plan, PlanningInputError, Stage
from heterps_paddle.rendezvous import LAUNCH_ID_ENV, RENDEZVOUS_ENV

HETER_DEVICES = ("cpu", "gpu")
# Paddle's heterogeneous pipeline reads the data on its CPU trainers, which therefore run a split plan's first stage.
SPLIT_FIRST_STAGE_KINDS = ("cpu",)
# Set by `heterps launch` for every process of the job: the launch arguments as JSON.  Paddle's launcher tells
# each process only its own stage's device, so without it no process knows every heterogeneous stage's device.
LAUNCH_ENV = "HETERPS_LAUNCH"


# Variables of the launcher and of fleet: a process started from inside a job must not inherit them, or it would
# take itself for a process of that job.
_LAUNCH_ENV_PREFIXES = (
    "PADDLE_",
    "TRAINING_ROLE",
    "POD_IP",
    "STAGE_",
    "HETER_",
    "FLAGS_selected_",
    "TRAINER_",
    "CUDA_VISIBLE_DEVICES",
    RENDEZVOUS_ENV,
    LAUNCH_ID_ENV,
    "HETERPS_CHECKPOINT_",  # a measuring job must not save into, or resume from, the launch's checkpoints
)


def env_outside_the_launch(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment without the launcher's variables, for a process a job's process starts on its own."""
    env = os.environ if env is None else env
    clean = {k: v for k, v in env.items() if not k.startswith(_LAUNCH_ENV_PREFIXES) and k != LAUNCH_ENV}
    clean["PYTHONUNBUFFERED"] = "1"
    return clean


class LaunchMismatchError(HeterPSError, RuntimeError):
    """The processes the launcher started cannot run the (saved) plan."""


@dataclass(frozen=True)
class HeterGroup:
    """The heterogeneous trainers of one stage (2, 3, ...) as launched."""

    units: int
    device: str | None  # cpu | gpu; None when this process cannot tell (launched without `heterps launch`)
    # the resource type the hosts file names for every host this group runs on (None: no hosts file, or its hosts
    # are of several types): a plan made for the launch must price and time the group as that type
    type: str | None = None


@dataclass(frozen=True)
class LaunchShape:
    """What one launch started: CPU trainers (stage 1) and heterogeneous trainers per later stage."""

    cpu_trainers: int
    heter: tuple[HeterGroup, ...] = ()
    servers: int | None = None
    cpu_type: str | None = None  # the CPU trainers' hosts' one type (HeterGroup.type says why)
    # the layers of each stage of the plan the launch was started for (heterps launch's plan file: the plan a
    # round of a launch across hosts runs, an adaptive move's as decided); () where no plan says them
    layers: tuple[tuple[str, ...], ...] = ()

    @property
    def num_stages(self) -> int:
        return 1 + len(self.heter)

    @property
    def heter_units(self) -> int:
        return sum(group.units for group in self.heter)

    def stage_units(self) -> list[int]:
        return [self.cpu_trainers] + [group.units for group in self.heter]

    def arguments(self, server_num: int | None = None) -> list[str]:
        """The ``paddle.distributed.launch`` arguments that start this shape."""
        servers = server_num if server_num is not None else self.servers
        args = [] if servers is None else [f"--server_num={servers}"]
        args.append(f"--worker_num={self.cpu_trainers}")
        if self.heter:
            args.append("--heter_worker_num=" + ";".join(str(g.units) for g in self.heter))
            args.append("--heter_devices=" + ";".join(g.device or "cpu" for g in self.heter))
        return args

    def describe(self) -> str:
        parts = [f"{self.cpu_trainers} CPU trainer{'s' * (self.cpu_trainers != 1)}"]
        if self.cpu_type is not None:
            parts[0] += f" ({self.cpu_type} hosts)"
        for stage, group in enumerate(self.heter, 2):
            where = f"on {group.device}" if group.device else "device not known to this process"
            if group.type is not None:
                where += f", {group.type} hosts"
            parts.append(f"stage {stage}: {group.units} heterogeneous trainer{'s' * (group.units != 1)} ({where})")
        if self.servers is not None:
            parts.insert(0, f"{self.servers} server{'s' * (self.servers != 1)}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "worker_num": self.cpu_trainers,
            "heter_worker_num": [g.units for g in self.heter],
            "heter_devices": [g.device for g in self.heter],
        }
        if self.servers is not None:
            out["server_num"] = self.servers
        if self.cpu_type is not None or any(g.type is not None for g in self.heter):
            out["worker_type"] = self.cpu_type
            out["heter_types"] = [g.type for g in self.heter]
        if self.layers:
            out["stage_layers"] = [list(stage) for stage in self.layers]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LaunchShape:
        try:
            units = [int(u) for u in data.get("heter_worker_num", [])]
            devices = list(data.get("heter_devices") or [None] * len(units))
            if len(devices) != len(units):
                raise ValueError("heter_devices and heter_worker_num differ in length")
            servers = data.get("server_num")
            types = list(data.get("heter_types") or [None] * len(units))
            if len(types) != len(units):
                raise ValueError("heter_types and heter_worker_num differ in length")
            layers = data.get("stage_layers") or ()
            if not isinstance(layers, (list, tuple)) or not all(
                isinstance(stage, (list, tuple)) and stage and all(isinstance(n, str) for n in stage)
                for stage in layers
            ):
                raise ValueError("stage_layers must be a list of each stage's layer names")
            return cls(
                int(data["worker_num"]),
                tuple(HeterGroup(u, _device(d), _type(t)) for u, d, t in zip(units, devices, types)),
                None if servers is None else int(servers),
                _type(data.get("worker_type")),
                tuple(tuple(stage) for stage in layers),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanningInputError(f"launch description {dict(data)!r}: {exc}") from None


def _type(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"a host type must be a resource type's name, got {value!r}")
    return value


def _device(value: Any) -> str | None:
    if value is None or value == "":
        return None
    device = str(value).lower()
    if device not in HETER_DEVICES:
        raise ValueError(f"heterogeneous device {value!r} is not one of {', '.join(HETER_DEVICES)}")
    return device


def _endpoints(value: str | None) -> list[str]:
    return [e for e in (value or "").replace(";", ",").split(",") if e]


def launch_from_env(env: Mapping[str, str] | None = None) -> LaunchShape | None:
    """The launch this process belongs to, from the launcher's environment; None outside a launched job.

    Every trainer of a launch computes the same shape: counts come from the variables Paddle gives every
    trainer, devices and the hosts' types only from ``HETERPS_LAUNCH`` (a heterogeneous trainer knows its own
    stage's device, a CPU trainer none, so using them would make the shape depend on which process asks).  Servers
    are not told the stages at all: they get None here and wait for the plan a trainer made (fleet/auto_plan.py).
    """
    env = os.environ if env is None else env
    role = env.get("TRAINING_ROLE")
    if role not in ("TRAINER", "HETER_TRAINER"):
        return None
    trainers = int(env.get("PADDLE_TRAINERS_NUM", "0") or 0) or len(_endpoints(env.get("PADDLE_TRAINER_ENDPOINTS")))
    servers = len(_endpoints(env.get("PADDLE_PSERVERS_IP_PORT_LIST"))) or None
    stage_num = int(env.get("STAGE_NUM", "1") or 1)
    counts = [int(x) for x in re.findall(r"\d+", env.get("PADDLE_STAGE_TRAINERS_NUM", ""))]
    heter_counts = counts[1:stage_num] if stage_num > 1 else []
    if stage_num > 1 and len(heter_counts) != stage_num - 1:
        raise LaunchMismatchError(
            f"the launcher says STAGE_NUM={stage_num} but PADDLE_STAGE_TRAINERS_NUM="
            f"{env.get('PADDLE_STAGE_TRAINERS_NUM')!r}"
        )
    devices: list[str | None] = [None] * len(heter_counts)
    types: list[str | None] = [None] * len(heter_counts)
    cpu_type = None
    layers: tuple[tuple[str, ...], ...] = ()
    told = env.get(LAUNCH_ENV)
    if told:
        try:
            declared = LaunchShape.from_dict(json.loads(told))
        except ValueError as exc:
            raise PlanningInputError(f"{LAUNCH_ENV}={told!r}: {exc}") from None
        # Trust it only where it agrees with what Paddle says was started.
        if declared.stage_units() == [trainers] + heter_counts:
            devices = [g.device for g in declared.heter]
            types = [g.type for g in declared.heter]
            cpu_type = declared.cpu_type
            layers = declared.layers
    groups = tuple(HeterGroup(u, d, t) for u, d, t in zip(heter_counts, devices, types))
    return LaunchShape(trainers, groups, servers, cpu_type, layers)


def heter_device_for(stage: Stage, gpu_available: bool) -> str:
    """--heter_devices entry of a stage: a GPU stage gets 'gpu' only where Paddle can use a GPU."""
    return "gpu" if stage.kind == "gpu" and gpu_available else "cpu"


def shape_of(plan: Plan, gpu_available: bool, server_num: int | None = None) -> LaunchShape:
    """The launch a plan needs."""
    check_runnable(plan)
    return LaunchShape(
        plan.stages[0].units,
        tuple(HeterGroup(s.units, heter_device_for(s, gpu_available)) for s in plan.heter_stages()),
        server_num,
    )


def launch_arguments(plan: Plan, server_num: int, gpu_available: bool) -> list[str]:
    """The ``paddle.distributed.launch`` arguments for a plan (before the training script)."""
    if server_num < 1:
        raise PlanningInputError(f"server_num must be >= 1, got {server_num}")
    return shape_of(plan, gpu_available, server_num).arguments()


def check_runnable(plan: Plan) -> None:
    """What the runtime needs of any plan: feasible, stages, and a CPU first stage when it is split."""
    if not plan.feasible:
        raise PlanningInputError(f"the plan is infeasible ({plan.reason or 'no reason given'}); nothing to run")
    if not plan.stages:
        raise PlanningInputError("the plan has no stages")
    first = plan.stages[0]
    if plan.num_stages > 1 and first.kind not in SPLIT_FIRST_STAGE_KINDS:
        # Paddle's heter pipeline reads data only on stage 1, which runs as ordinary CPU trainers.
        raise PlanningInputError(
            f"stage 1 runs on {first.resource!r} ({first.kind}); in a split plan the first stage reads the data on "
            "Paddle's CPU trainers and must be a cpu stage (put at least the first layer on a cpu type)"
        )


def check_launch_matches(plan: Plan, launch: LaunchShape | None, source: str = "the plan") -> None:
    """A saved plan against the launch; raises naming what the plan expects and the arguments that start it.

    One stage is data parallelism over the launched CPU trainers: at least the plan's units (more only add
    throughput); heterogeneous trainers beyond it are left unused.  A split plan needs exactly its stages.
    """
    check_runnable(plan)
    if launch is None:
        return  # a server, or a process not started by the launcher: the trainers check
    expected = " ".join(shape_of(plan, gpu_available=False).arguments()) + " (see `heterps launch-args`)"
    if plan.num_stages == 1:
        stage = plan.stages[0]
        if launch.cpu_trainers < stage.units:
            raise LaunchMismatchError(
                f"{source} needs {stage.units} trainers ({stage.resource}, {stage.kind}) to meet its throughput, "
                f"but the job was launched with {launch.cpu_trainers}; launch with {expected}"
            )
        return
    want = [s.units for s in plan.stages]
    if launch.stage_units() != want:
        raise LaunchMismatchError(
            f"{source} expects {plan.num_stages} stages with {want} processes per stage (stage 1 = CPU trainers), "
            f"but the launch has {launch.num_stages} stage{'s' * (launch.num_stages != 1)} with "
            f"{launch.stage_units()}; launch with {expected}"
        )
