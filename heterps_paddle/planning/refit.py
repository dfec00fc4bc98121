"""The cost model corrected by what a running job measured (docs/adaptive.md): a plan is a hypothesis, the job tests it.

From a window's measured rates (launch/gauge.py: the job's samples/s, each stage's work share) the refit estimates
how long a unit of each stage's resource type really takes per sample for the layers that stage runs, and returns
the profile with those layers' times on that type corrected, for the scheduler to plan again on
(planning/replan.py).  Only what the job ran is corrected: the layers of each stage, on its type.

- **A stage's capacity** is what it could train on its own: the measured samples/s over its work share (the rest of
  its time it waited for a neighbour).  A unit of it then takes ``units / capacity`` seconds a sample, where the
  model predicted ``time_per_sample``; the difference is added to the stage's layers' times on its type, shared
  out in proportion to them, so the corrected stage predicts its measured capacity whatever the model had left out
  (reading and parsing the data, a framework's per-batch costs, a slower core).  A layer's time never falls below
  a tenth of the model's.  A stage whose work share is not measured (a GPU stage on its device) is left as it was,
  unless what is left unexplained (below) says otherwise.
- **What is left unexplained.**  Corrected, the plan predicts its slowest stage's corrected samples/s.  When the job
  measured less than that (beyond ``tolerance``), something the work shares do not see slowed it.  On one stage that
  is the machine (a busy or throttled host keeps a process off the CPU without it waiting for a neighbour): every
  unit time is raised alike.  On a pipeline it is taken to be the pipeline's (a micro-batch's round trip that no
  stage's work covers): ``pipeline``, by which a plan of several stages is predicted slower (:func:`predicted`),
  and one stage is not.
- **What is not corrected.**  A layer on a type the job has not run it on keeps its estimate (the profile's
  measured time, or the cluster file's figures): nothing measured says otherwise, and a move to it is a bet the
  next windows check.
- **Uncertainty.**  One window is noisy: the launch refits from the median of several windows (:func:`combine`),
  and reports their spread.

Pure Python, no Paddle.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.model import Cluster, LayerProfile, ModelProfile, Plan

FLOOR = 0.1  # a corrected layer time at least this share of the model's


@dataclass(frozen=True)
class Refit:
    """Per (layer, type): the corrected seconds a sample on one unit; and the factor no work share explained."""

    times: Mapping[tuple[str, str], float]
    unexplained: float = 1.0  # one stage: its unit time was raised by it (1: the work shares explain it all)
    pipeline: float = 1.0  # several stages: what no stage's work explains, a pipeline's samples/s is divided by it
    spread: Mapping[str, float] = field(default_factory=dict)  # per type: (max - min) / median of its windows

    def factors(self, profile: ModelProfile, cluster: Cluster) -> dict[str, float]:
        """Each refitted type's corrected time over the model's, for the layers refitted on it (for reports)."""
        model = CostModel(profile, cluster, throughput=cluster.throughput or 1.0)
        index = {t.name: i for i, t in enumerate(cluster.resource_types)}
        names = {layer.name: i for i, layer in enumerate(profile.layers)}
        sums: dict[str, list[float]] = {}
        for (layer, rtype), seconds in self.times.items():
            if rtype in index and layer in names:
                entry = sums.setdefault(rtype, [0.0, 0.0])
                entry[0] += seconds
                entry[1] += float(model.base_time[index[rtype], names[layer]])
        return {t: (s / b if b > 0 else 1.0) for t, (s, b) in sums.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "times": {f"{layer}@{rtype}": seconds for (layer, rtype), seconds in sorted(self.times.items())},
            "unexplained": round(self.unexplained, 4),
            "pipeline": round(self.pipeline, 4),
            "spread": {k: round(v, 4) for k, v in self.spread.items()},
        }

    def merged(self, older: Refit | None) -> Refit:
        """This correction over an older one (an earlier round's): what this one measured wins; the rest (layers
        the new plan did not run, a pipeline's factor where it runs one stage) is kept."""
        if older is None:
            return self
        times = {**older.times, **self.times}
        pipeline = self.pipeline if self.pipeline != 1.0 else older.pipeline
        return Refit(times, self.unexplained, pipeline, {**older.spread, **self.spread})


def from_rates(
    plan: Plan, rates: Mapping[str, Any], profile: ModelProfile, cluster: Cluster, tolerance: float = 0.05
) -> Refit | None:
    """What one window's ``rates`` (a ``rates`` record) say of ``plan``'s layers on its types (module doc); None
    when the window says nothing (no samples trained in it, or no prediction to compare with)."""
    measured = float(rates.get("samples_per_s") or 0.0)
    stages = list(rates.get("stages") or ())
    if measured <= 0 or len(stages) != plan.num_stages or not all(s.time_per_sample > 0 for s in plan.stages):
        return None
    # each stage's measured seconds a sample on one unit (its model's where its work share is not measured)
    unit_time = []
    for stage, figures in zip(plan.stages, stages):
        work = figures.get("work_share")
        if work is None or work <= 0:
            unit_time.append(stage.time_per_sample)
        else:
            unit_time.append(stage.units * min(1.0, float(work)) / measured)
    predicted = min(stage.units / t for stage, t in zip(plan.stages, unit_time))
    unexplained = pipeline = 1.0
    if predicted > measured * (1.0 + tolerance):
        if plan.num_stages > 1:
            pipeline = predicted / measured
        else:
            unexplained = predicted / measured
            unit_time = [t * unexplained for t in unit_time]
    model = CostModel(profile, cluster, throughput=cluster.throughput or 1.0)
    index = {t.name: i for i, t in enumerate(cluster.resource_types)}
    names = {layer.name: i for i, layer in enumerate(profile.layers)}
    times: dict[tuple[str, str], float] = {}
    for stage, measured_time in zip(plan.stages, unit_time):
        if stage.resource not in index:
            continue
        base = [float(model.base_time[index[stage.resource], names[layer]]) for layer in stage.layers if layer in names]
        total = sum(base)
        extra = measured_time - stage.time_per_sample  # what the model left out of this stage, a sample a unit
        for layer, seconds in zip(stage.layers, base):
            share = seconds / total if total > 0 else 1.0 / len(base)
            times[(layer, stage.resource)] = max(FLOOR * seconds, seconds + extra * share)
    return Refit(times, unexplained, pipeline)


def predicted(plan: Plan, refit: Refit | None) -> float:
    """What ``plan`` (made on the corrected model) is predicted to train: a pipeline's samples/s over the factor no
    stage's work explained (``Refit.pipeline``); one stage's as the model says."""
    if refit is None or plan.num_stages < 2:
        return plan.throughput
    return plan.throughput / refit.pipeline


def combine(refits: Sequence[Refit]) -> Refit:
    """Several windows as one: each corrected time's median over the windows that have it, with each type's spread
    (its layers' corrected times summed per window)."""
    keys = sorted({key for r in refits for key in r.times})
    times = {key: statistics.median(r.times[key] for r in refits if key in r.times) for key in keys}
    spread: dict[str, float] = {}
    for rtype in sorted({t for _, t in keys}):
        sums = [sum(s for (_, t), s in r.times.items() if t == rtype) for r in refits]
        sums = [s for s in sums if s > 0]
        middle = statistics.median(sums) if sums else 0.0
        spread[rtype] = (max(sums) - min(sums)) / middle if middle > 0 else 0.0
    return Refit(
        times,
        statistics.median(r.unexplained for r in refits) if refits else 1.0,
        statistics.median(r.pipeline for r in refits) if refits else 1.0,
        spread,
    )


def corrected_profile(profile: ModelProfile, refit: Refit) -> ModelProfile:
    """``profile`` with the refitted layers' times on their types: every scheduler plans on it unchanged."""
    layers: list[LayerProfile] = []
    for layer in profile.layers:
        time = dict(layer.time)
        time.update({rtype: seconds for (name, rtype), seconds in refit.times.items() if name == layer.name})
        layers.append(replace(layer, time=time))
    return replace(profile, layers=tuple(layers))


def rate_of(plan: Plan, profile: ModelProfile, cluster: Cluster) -> float:
    """What ``plan`` trains, its units as they are (not provisioned again), on the model ``profile`` gives: its
    slowest stage's samples/s (0 when a stage cannot run)."""
    model = CostModel(profile, cluster, throughput=cluster.throughput or 1.0)
    index = {t.name: i for i, t in enumerate(cluster.resource_types)}
    names = [layer.name for layer in profile.layers]
    rates = []
    for stage in plan.stages:
        start = names.index(stage.layers[0])
        time = model.stage_time(start, start + len(stage.layers), index[stage.resource], stage.units)
        rates.append(0.0 if not time else stage.units / time)
    return min(rates, default=0.0)
