"""The best plan that fits a launch (the plan a job runs when the automatic path plans inside ``minimize``).

The launch fixes the units: every CPU trainer reads a shard of the data and runs stage 1, every heterogeneous
trainer of stage k serves stage k.  So the choice left is the cut of the program into stages and which of the
cluster's types each launched group is; prices and speeds come from the cluster file and the profile, through the
one cost model (``CostModel.stage_on_units``), and so do a plan's throughput and costs (``plan_throughput``,
``plan_cost_per_hour``, ``cost_per_million_samples``).  Two shapes fit any launch:

- one stage on the CPU trainers alone (launched heterogeneous trainers are then left unused, and leave);
- every launched stage used, the program cut into that many contiguous runs of layers.

Objective, in this order (ties of float predictions are not left to chance):

- with a target: the cheapest plan that meets it; then fewer stages, fewer units, more samples/s;
- with a budget (a price per hour instead of a target): among plans that cost no more, as without a target;
- a target no fitting plan meets, or no target at all: the most samples/s, predictions within
  ``THROUGHPUT_TIE`` of the best counting as equal (the cost model's own error is larger), then the cheapest,
  fewer stages, fewer units;
- last, a fixed order: one stage before split, the cluster's type order, earlier cuts first.

``host_cores``: every process of the launch runs on one machine with this many cores (the ``local`` cluster, whose
types are this machine's cores): a sample costs the sum of its stages' times in CPU, so no plan beats
``host_cores / sum``.  Without it each unit is its own machine.

Pure Python: exhaustive over cuts (a program has tens of layers and a launch a few stages), so it is exact.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

from heterps_paddle.planning.budget import within_budget
from heterps_paddle.planning.cost_model import (
    CostModel,
    StageOption,
    plan_cost_per_hour,
    plan_throughput,
)
from heterps_paddle.planning.launch import SPLIT_FIRST_STAGE_KINDS, LaunchShape
from heterps_paddle.planning.model import Cluster, ModelProfile, Plan, PlanningInputError, ResourceType
from heterps_paddle.planning.unit_cost import cost_per_million_samples

THROUGHPUT_TIE = 0.02
SCHEDULER_NAME = "launch-fit"
_MAX_CUTS = 2_000_000  # cut combinations enumerated per type choice; beyond it the launch has too many stages


@dataclass(frozen=True)
class FitOption:
    """One way to run the program on the launch, priced and predicted."""

    plan: Plan
    uses_heter: bool  # whether the launched heterogeneous trainers run a stage
    meets_target: bool | None  # None without a target
    order: int  # position in the fixed enumeration order (the last tie-break)

    @property
    def throughput(self) -> float:
        return self.plan.throughput

    @property
    def cost_per_hour(self) -> float:
        return self.plan.cost_per_hour

    @property
    def units(self) -> int:
        return sum(s.units for s in self.plan.stages)


@dataclass(frozen=True)
class LaunchFit:
    chosen: FitOption
    one_stage: FitOption | None  # the best plan on the CPU trainers alone
    split: FitOption | None  # the best plan using every launched stage (None: nothing launched to split onto)
    launch: LaunchShape
    target: float | None
    host_cores: int | None
    notes: tuple[str, ...]  # what the fit assumed, in plain words (the plan report prints them)
    budget: float | None = None  # price per hour the plan stays within (budget mode, instead of a target)

    @property
    def leaves_heter_unused(self) -> bool:
        return bool(self.launch.heter) and not self.chosen.uses_heter


def group_types(cluster: Cluster, device: str | None, stand_in_gpu: bool) -> list[int]:
    """Indices of the cluster's types a launched heterogeneous group can be.

    ``device`` is the group's ``--heter_devices`` entry: ``gpu`` groups are gpu types; ``cpu`` groups are cpu
    types, and gpu types too where Paddle has no CUDA (``stand_in_gpu``: this machine's cores stand in for a GPU,
    as ``heterps launch-args`` maps gpu stages to cpu there); unknown: any type.
    """
    kinds = {"gpu": ("gpu",), "cpu": ("cpu", "gpu") if stand_in_gpu else ("cpu",), None: ("cpu", "gpu")}[device]
    return [i for i, t in enumerate(cluster.resource_types) if t.kind in kinds]


def hosts_type(cluster: Cluster, named: str | None, candidates: list[int], who: str, notes: list[str]) -> list[int]:
    """``candidates`` narrowed to the type the hosts file names for ``who``'s hosts: a plan for the launch is
    priced and timed as the machines that run it (else a cheaper type's figures could stand for a dearer host).
    A name the cluster file does not give as a candidate leaves them all, said in ``notes``."""
    if named is None:
        return candidates
    chosen = [i for i in candidates if cluster.resource_types[i].name == named]
    if not chosen:
        notes.append(
            f"{who}: the hosts file names their hosts' type {named}, not one of the cluster file's types they can "
            "be; timed and priced as any of those"
        )
        return candidates
    return chosen


class _LaunchedStages:
    """Memoised stages of a cost model on the units a launch gives them (``CostModel.stage_on_units``): the cut
    combinations of one launch ask for the same stage many times."""

    def __init__(self, cost_model: CostModel):
        self.cost_model = cost_model
        self._memo: dict[tuple[int, int, int, int], StageOption | None] = {}

    def __call__(self, start: int, end: int, type_index: int, units: int) -> StageOption | None:
        key = (start, end, type_index, units)
        if key not in self._memo:
            self._memo[key] = self.cost_model.stage_on_units(start, end, type_index, units)
        return self._memo[key]


def fit_to_launch(
    profile: ModelProfile,
    cluster: Cluster,
    launch: LaunchShape,
    target: float | None = None,
    *,
    budget: float | None = None,
    stand_in_gpu: bool = False,
    trainers_on_gpu: bool = False,
    host_cores: int | None = None,
) -> LaunchFit:
    """The plan this launch runs best (module doc), with the best one-stage and split options beside it.

    ``trainers_on_gpu``: Paddle has CUDA, so the CPU trainers may be gpu-type units of a one-stage plan
    (data-parallel GPU trainers); a split plan's first stage is a cpu type either way.
    """
    if target is not None and not (target > 0 and math.isfinite(target)):
        raise PlanningInputError(f"throughput target must be a positive finite number, got {target!r}")
    if budget is not None and not (budget > 0 and math.isfinite(budget)):
        raise PlanningInputError(f"budget must be a positive finite price per hour, got {budget!r}")
    if target is not None and budget is not None:
        raise PlanningInputError("give a throughput target or a budget, not both")
    if launch.cpu_trainers < 1:
        raise PlanningInputError(f"the launch has {launch.cpu_trainers} CPU trainers; stage 1 needs at least one")
    types = cluster.resource_types
    # stage_on_units does not depend on the target; the cost model wants one only to provision, which is not done here
    cost_model = CostModel(profile, cluster, target or 1.0)
    stages_on_units = _LaunchedStages(cost_model)
    n = cost_model.num_layers
    notes: list[str] = []
    first_types = [i for i, t in enumerate(types) if t.kind in SPLIT_FIRST_STAGE_KINDS]
    one_stage_types = [i for i, t in enumerate(types) if t.kind == "cpu" or (trainers_on_gpu and t.kind == "gpu")]
    if not one_stage_types:
        raise PlanningInputError(
            "the cluster has no cpu type: the CPU trainers (stage 1, they read the data) "
            "need one to be priced and timed"
        )
    first_types = hosts_type(cluster, launch.cpu_type, first_types, "the CPU trainers", notes)
    one_stage_types = hosts_type(cluster, launch.cpu_type, one_stage_types, "the CPU trainers", [])
    notes.insert(
        0, _group_note("the CPU trainers", [types[i] for i in one_stage_types], "gpu" if trainers_on_gpu else "cpu")
    )
    options: list[FitOption] = []

    def add(stage_types: Sequence[int], cuts: Sequence[int], units: Sequence[int]) -> None:
        option = _option(stages_on_units, stage_types, cuts, units, target, host_cores, launch, len(options))
        if option is not None:
            options.append(option)

    for t in one_stage_types:
        add([t], [0, n], [launch.cpu_trainers])
    one_stage_count = len(options)
    if launch.heter:
        heter_types = [
            hosts_type(cluster, g.type, group_types(cluster, g.device, stand_in_gpu), f"stage {stage}", notes)
            for stage, g in enumerate(launch.heter, 2)
        ]
        for stage, (group, candidates) in enumerate(zip(launch.heter, heter_types), 2):
            notes.append(
                _group_note(
                    f"stage {stage}'s heterogeneous trainers",
                    [types[i] for i in candidates],
                    group.device,
                    stand_in_gpu,
                )
            )
        stages = launch.num_stages
        if n < stages:
            notes.append(f"the launch has {stages} stages but the program has only {n} layers: no split fits it")
        elif first_types and all(heter_types):
            cut_count = math.comb(n - 1, stages - 1)
            if cut_count > _MAX_CUTS:
                raise PlanningInputError(
                    f"{n} layers over {stages} stages is {cut_count:,} cuts to try; launch "
                    "fewer heterogeneous stages or give a saved plan"
                )
            units = launch.stage_units()
            # the runtime's rule (cost_model.lookups_end): a split's first stage holds every lookup
            first_cut = max(1, cost_model.lookups_end)
            if first_cut > 1:
                notes.append(
                    f"a split's lookups run on its first stage (the CPU trainers): its first cut comes after "
                    f"{cost_model.layer_names[first_cut - 1]}, the last sparse layer"
                    + ("" if first_cut < n else ", the program's last layer: no split fits it")
                )
            for combo in itertools.product(first_types, *heter_types):
                for inner in itertools.combinations(range(1, n), stages - 1):
                    if inner[0] >= first_cut:
                        add(combo, [0, *inner, n], units)
    if not options:
        raise PlanningInputError(
            f"no plan fits this launch: the cluster's types cannot hold the program's parameters ({launch.describe()})"
        )
    options, one_stage_count = _the_launchs_cut(options, one_stage_count, launch, profile, notes)
    one_stage, split_options = options[:one_stage_count], options[one_stage_count:]
    if budget is not None:
        if not any(within_budget(o.cost_per_hour, budget) for o in options):
            cheapest = min(options, key=lambda o: (o.cost_per_hour, o.order))
            raise PlanningInputError(
                f"no plan for this launch ({launch.describe()}) fits the budget of {budget:.4g}/h: the cheapest, "
                f"{_describe(cheapest.plan)}, costs {cheapest.cost_per_hour:.4g}/h; raise the budget or launch "
                "fewer processes"
            )
        # One test per option (a membership test against the kept list compared whole plans, quadratically).
        options, one_stage, split_options = (
            [o for o in group if within_budget(o.cost_per_hour, budget)]
            for group in (options, one_stage, split_options)
        )
        notes.append(f"budget {budget:.4g}/h: plans that cost more were left out")
    chosen = _best(options, target)
    one = _best(one_stage, target) if one_stage else None
    split = _best(split_options, target) if split_options else None
    if host_cores is not None:
        notes.append(
            f"every process runs on this machine's {host_cores} cores: a plan gives at most "
            f"{host_cores} / (sum of its stages' seconds per sample) samples/s"
        )
    return LaunchFit(chosen, one, split, launch, target, host_cores, tuple(notes), budget)


def _the_launchs_cut(
    options: list[FitOption], one_stage_count: int, launch: LaunchShape, profile: ModelProfile, notes: list[str]
) -> tuple[list[FitOption], int]:
    """The options that run the cut of the plan the launch was started for (``launch.layers``: a round of a launch
    across hosts runs its plan file's cut, an adaptive move's as the launch's machine decided it, never one chosen
    again here on the uncorrected model), and how many of them are one-stage.  All of them when the launch names
    no cut, or one this program has not (a plan made for another program: said in ``notes``)."""
    if not launch.layers:
        return options, one_stage_count
    names = tuple(layer.name for layer in profile.layers)
    flat = tuple(name for stage in launch.layers for name in stage)
    if flat != names or len(launch.layers) not in (1, launch.num_stages):
        notes.append(
            f"the launch's plan cuts layers {' | '.join(', '.join(s) for s in launch.layers)}, not this program's "
            f"({', '.join(names)}): the cut is chosen here"
        )
        return options, one_stage_count
    kept = [(i, o) for i, o in enumerate(options) if tuple(tuple(s.layers) for s in o.plan.stages) == launch.layers]
    if not kept:
        notes.append("no type of the cluster file runs the launch's plan's cut on this launch: the cut is chosen here")
        return options, one_stage_count
    notes.append(f"the cut of the plan the launch was started for: {' | '.join(', '.join(s) for s in launch.layers)}")
    return [o for _, o in kept], sum(1 for i, _ in kept if i < one_stage_count)


def _group_note(
    who: str, candidates: list[ResourceType], device: str | None = "cpu", stand_in_gpu: bool = False
) -> str:
    names = ", ".join(t.name for t in candidates) or "none"
    if device is None:
        how = "their device is not known to this process (start the job with `heterps launch` to tell it)"
    elif device == "cpu" and stand_in_gpu and any(t.kind == "gpu" for t in candidates):
        how = "launched on cpu; without CUDA this machine's cores stand in for the gpu types"
    elif who == "the CPU trainers":
        how = "Paddle has CUDA: gpu types too, for a one-stage plan" if device == "gpu" else "cpu types"
    else:
        how = f"launched on {device}"
    return f"{who}: {how}; types they can be: {names}"


def _option(
    stages_on_units: _LaunchedStages,
    stage_types: Sequence[int],
    cuts: Sequence[int],
    units: Sequence[int],
    target: float | None,
    host_cores: int | None,
    launch: LaunchShape,
    order: int,
) -> FitOption | None:
    stages = []
    for index, t in enumerate(stage_types):
        stage = stages_on_units(cuts[index], cuts[index + 1], t, units[index])
        if stage is None:
            return None  # its parameters do not fit this type's memory and it has no SSD tier
        stages.append(stage)
    cost_model = stages_on_units.cost_model
    records = tuple(cost_model.stage_record(s) for s in stages)
    throughput = plan_throughput(stages, shared_cores=host_cores)
    cost = plan_cost_per_hour(stages)
    meets = None if target is None else throughput >= target * (1 - 1e-9)
    plan = Plan(
        scheduler=SCHEDULER_NAME,
        model=cost_model.profile.name,
        feasible=True,
        assignment={layer: s.resource for s in records for layer in s.layers},
        stages=records,
        throughput=throughput,
        cost_per_hour=cost,
        # at the throughput achieved: the launch fixed the units, and there may be no target to price them at
        cost_per_million_samples=cost_per_million_samples(cost, throughput),
        required_throughput=target,
        launch=launch.to_dict(),
    )
    return FitOption(plan, uses_heter=len(stages) > 1, meets_target=meets, order=order)


def _describe(plan: Plan) -> str:
    return " | ".join(f"{s.units} x {s.resource} ({', '.join(s.layers)})" for s in plan.stages)


def _best(options: list[FitOption], target: float | None) -> FitOption:
    if target is not None:
        meeting = [o for o in options if o.meets_target]
        if meeting:
            return min(meeting, key=lambda o: (o.cost_per_hour, o.plan.num_stages, o.units, -o.throughput, o.order))
    fastest = max(o.throughput for o in options)
    near = [o for o in options if o.throughput >= fastest * (1 - THROUGHPUT_TIE)]
    return min(near, key=lambda o: (o.cost_per_hour, o.plan.num_stages, o.units, -o.throughput, o.order))
