"""The plan as the sections runtime reads it: stages in order, each with its layers, unit count and kind.

Pure Python (no Paddle): ``heterps launch-args`` and the checks made in every launched process use it.

A plan JSON (specs/plan-io.md) names a resource type per stage but not whether that type is a CPU or a
GPU.  The kind is taken, in this order, from a cluster file (``resource_types[].kind``), from an optional
``"kind"`` key of the stage, and last from the resource name (a name containing ``gpu`` is a GPU type).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from heterps_paddle.errors import HeterPSError


class PlanError(HeterPSError, ValueError):
    """A plan file the sections runtime cannot run."""


class LaunchMismatchError(HeterPSError, RuntimeError):
    """The processes started by the launcher do not match the plan."""


@dataclass(frozen=True)
class Stage:
    index: int  # 1-based, as Paddle's STAGE_ID
    resource: str
    kind: str  # "cpu" | "gpu"
    layers: tuple[str, ...]
    units: int


@dataclass(frozen=True)
class SectionPlan:
    path: str
    stages: tuple[Stage, ...]

    @property
    def layer_to_stage(self) -> dict[str, int]:
        return {layer: s.index for s in self.stages for layer in s.layers}

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def heter_stages(self) -> tuple[Stage, ...]:
        return self.stages[1:]


def _load_cluster_kinds(cluster_path: str | None) -> dict[str, str]:
    if not cluster_path:
        return {}
    with open(cluster_path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
    except ValueError:
        import yaml  # a dependency of the package; only needed for YAML cluster files

        data = yaml.safe_load(text)
    kinds = {}
    for rt in (data or {}).get("resource_types", []) or []:
        if isinstance(rt, dict) and "name" in rt and "kind" in rt:
            kinds[str(rt["name"])] = str(rt["kind"]).lower()
    return kinds


def load_plan(path: str, cluster_path: str | None = None) -> SectionPlan:
    """Read a plan JSON and check what the sections runtime needs from it; errors name file, key and reason."""
    if not os.path.isfile(path):
        raise PlanError(f"plan file {path!r} does not exist")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except ValueError as exc:
        raise PlanError(f"{path}: not valid JSON ({exc})") from None
    return plan_from_dict(data, path, _load_cluster_kinds(cluster_path))


def plan_from_dict(data, path: str = "<plan>", kinds: dict[str, str] | None = None) -> SectionPlan:
    """The same checks on a plan already in memory (``path`` names it in errors; ``kinds``: resource
    type -> cpu|gpu, e.g. from the cluster the plan was made for)."""
    if not isinstance(data, dict):
        raise PlanError(f"{path}: the plan must be a JSON object, got {type(data).__name__}")
    if data.get("format", 1) != 1:
        raise PlanError(f"{path}: key 'format': only format 1 is supported, got {data.get('format')!r}")
    if data.get("feasible") is False:
        raise PlanError(f"{path}: the plan is infeasible ({data.get('reason', 'no reason given')}); "
                        "nothing to launch")
    stages_raw = data.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise PlanError(f"{path}: key 'stages' must be a non-empty list of stages")
    kinds = kinds or {}
    stages = []
    seen_layers: set[str] = set()
    for i, st in enumerate(stages_raw):
        where = f"{path}: stages[{i}]"
        if not isinstance(st, dict):
            raise PlanError(f"{where}: must be an object")
        for key in ("resource", "layers", "units"):
            if key not in st:
                raise PlanError(f"{where}: missing key {key!r}")
        resource = st["resource"]
        if not isinstance(resource, str) or not resource:
            raise PlanError(f"{where}: key 'resource' must be a non-empty string")
        layers = st["layers"]
        if not isinstance(layers, list) or not layers or not all(isinstance(x, str) for x in layers):
            raise PlanError(f"{where}: key 'layers' must be a non-empty list of layer names")
        dup = seen_layers.intersection(layers)
        if dup:
            raise PlanError(f"{where}: layers {sorted(dup)} appear in more than one stage")
        seen_layers.update(layers)
        units = st["units"]
        if isinstance(units, bool) or not isinstance(units, (int, float)) or not math.isfinite(units) \
                or units < 1 or int(units) != units:
            raise PlanError(f"{where}: key 'units' must be a positive integer, got {units!r}")
        kind = kinds.get(resource) or st.get("kind") or ("gpu" if "gpu" in resource.lower() else "cpu")
        kind = str(kind).lower()
        if kind not in ("cpu", "gpu"):
            raise PlanError(f"{where}: kind must be 'cpu' or 'gpu', got {kind!r}")
        stages.append(Stage(index=i + 1, resource=resource, kind=kind, layers=tuple(layers), units=int(units)))
    if stages[0].kind != "cpu" and len(stages) > 1:
        # Paddle's heter pipeline reads data only on stage 1, which runs as ordinary CPU trainers.
        raise PlanError(f"{path}: stages[0] runs on {stages[0].resource!r} ({stages[0].kind}); in a split job the "
                        "first stage reads the data on Paddle's CPU trainers and must be a CPU stage (put at "
                        "least the first layer on a CPU type)")
    return SectionPlan(path=path, stages=tuple(stages))


def heter_device_for(stage: Stage, gpu_available: bool) -> str:
    """--heter_devices entry of a stage: a GPU stage gets 'gpu' only where Paddle can use a GPU."""
    if stage.kind == "gpu" and gpu_available:
        return "gpu"
    return "cpu"


def launch_arguments(plan: SectionPlan, server_num: int, gpu_available: bool) -> list[str]:
    """The ``paddle.distributed.launch`` arguments for a plan (before the training script)."""
    if server_num < 1:
        raise PlanError(f"server_num must be >= 1, got {server_num}")
    args = [f"--server_num={server_num}", f"--worker_num={plan.stages[0].units}"]
    heter = plan.heter_stages()
    if heter:
        args.append("--heter_worker_num=" + ";".join(str(s.units) for s in heter))
        args.append("--heter_devices=" + ";".join(heter_device_for(s, gpu_available) for s in heter))
    return args


def check_launch_matches(plan: SectionPlan, env: dict[str, str] | None = None) -> None:
    """Compare what ``paddle.distributed.launch`` started (its env variables) with the plan; raise on mismatch.

    Every launched process runs this, so a wrong launch stops at ``minimize`` with the expected arguments
    spelled out instead of hanging in a pipeline whose stages do not exist.
    """
    env = os.environ if env is None else env
    role = env.get("TRAINING_ROLE", "")
    expected = (" ".join(launch_arguments(plan, 1, False)).replace("--server_num=1 ", "")
                + f" (see `heterps launch-args {plan.path}`)")
    heter_units = [s.units for s in plan.heter_stages()]
    if not heter_units:
        if env.get("STAGE_NUM") and int(env["STAGE_NUM"]) > 1:
            raise LaunchMismatchError(
                f"plan {plan.path} has 1 stage (no heterogeneous trainers) but the job was launched with "
                f"{env['STAGE_NUM']} stages; launch with {expected}")
        # One stage is plain data parallelism over the launched trainers (PS workers), whatever the stage's
        # kind: a gpu-kind stage's units are the trainers too (on a CUDA build each uses its device; its
        # embeddings live in the project's table, synced with the servers per pass, sections/gpu_embedding.py).
        # More trainers than the plan needs only add throughput, fewer cannot meet the target.
        stage = plan.stages[0]
        launched = int(env.get("PADDLE_TRAINERS_NUM", "0") or 0)
        if role in ("TRAINER", "PSERVER") and 0 < launched < stage.units:
            what = ("CPU trainers" if stage.kind == "cpu"
                    else f"trainers (units of the {stage.kind} type {stage.resource!r})")
            raise LaunchMismatchError(
                f"plan {plan.path} needs {stage.units} {what} to meet its throughput, but the job "
                f"was launched with {launched}; launch with {expected}")
        return
    if role not in ("TRAINER", "HETER_TRAINER", "PSERVER"):
        return  # not a launched PS process (e.g. a unit test building the program)
    if "STAGE_NUM" not in env and role == "PSERVER":
        return  # servers do not get the stage variables; the trainers check
    if "STAGE_NUM" not in env:
        raise LaunchMismatchError(
            f"plan {plan.path} has {plan.num_stages} stages ({len(heter_units)} of heterogeneous trainers) but "
            f"the job was launched without heterogeneous trainers; launch with {expected}")
    got_stages = int(env["STAGE_NUM"])
    got_trainers = env.get("PADDLE_STAGE_TRAINERS_NUM", "")
    want_trainers = [plan.stages[0].units] + heter_units
    import re

    got_list = [int(x) for x in re.findall(r"\d+", got_trainers)]
    if got_stages != plan.num_stages or got_list != want_trainers:
        raise LaunchMismatchError(
            f"plan {plan.path} expects {plan.num_stages} stages with {want_trainers} processes per stage "
            f"(stage 1 = CPU trainers), but the launch has {got_stages} stages with {got_list or got_trainers}; "
            f"launch with {expected}")
