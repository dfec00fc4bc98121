"""Measure before betting (docs/adaptive.md): on a launch across hosts, every type of host the launch runs a trainer
on is timed on a host of that type before the job is planned on it, so that no plan, the first one or a move, is
chosen on a cluster file's datasheet figures for a type the job has.

- ``heterps launch`` names, in ``HETERPS_LAUNCH`` (``measure``: type -> endpoint), one trainer process on one host
  of each type but the type of stage 1 trainer 0's host (launch/placement.py: ``launch_description``).  That
  process, inside ``minimize`` (where every process but trainer 0 waits for the plan anyway), profiles the job's
  program on its own CPU, as trainer 0 does for its own type (program/job_profile.py: ``measure_job``, cached per
  machine), and publishes the per-layer times on the launch's board (``measured.<type>``) with how long it took
  and what the cluster file had predicted.
- Trainer 0 waits for them (``HETERPS_MEASURE_WAIT_S``) and plans on the profile with those times: a measured time
  replaces the file's estimate for that layer on that type.  A type no host measured (none of its hosts runs a
  trainer, the wait ran out, or its trainers run on a GPU, which the profiler does not time) keeps the file's
  figures, and the plan report says so.  The launch's coordinator writes a ``measured`` record of each
  (launch/coordinator.py).

A GPU-kind type run on a CPU (``--devices cpu``, or no CUDA) is timed on that CPU: that is what runs it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, cast

from heterps_paddle import rendezvous, settings
from heterps_paddle.log import logger
from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.launch import LAUNCH_ENV
from heterps_paddle.planning.model import Cluster, ModelProfile

MEASURED_PREFIX = rendezvous.MEASURED_PREFIX


@dataclass(frozen=True)
class TypeMeasurement:
    """One type timed on one of its hosts: each layer's seconds a sample on one unit (None: not timed, and why)."""

    type: str
    host: str
    seconds: float  # how long measuring took on that host
    times: Mapping[str, float] | None
    file_seconds_per_sample: float  # what the cluster file's figures predicted for the whole program on one unit
    why_not: str = ""

    @property
    def seconds_per_sample(self) -> float | None:
        return None if self.times is None else float(sum(self.times.values()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "host": self.host,
            "seconds": round(self.seconds, 3),
            "times": None if self.times is None else dict(self.times),
            "file_seconds_per_sample": self.file_seconds_per_sample,
            "seconds_per_sample": self.seconds_per_sample,
            "why_not": self.why_not,
        }

    @staticmethod
    def from_dict(value: Mapping[str, Any]) -> TypeMeasurement:
        times = value.get("times")
        return TypeMeasurement(
            str(value["type"]),
            str(value["host"]),
            float(value["seconds"]),
            None if times is None else {str(k): float(v) for k, v in dict(times).items()},
            float(value["file_seconds_per_sample"]),
            str(value.get("why_not") or ""),
        )

    def line(self) -> str:
        """What was measured, where, how long it took and what it changed, in one line."""
        if self.times is None:
            return f"{self.type}: not measured on {self.host} ({self.why_not}): the cluster file's figures stand"
        measured = self.seconds_per_sample or 0.0
        ratio = measured / self.file_seconds_per_sample if self.file_seconds_per_sample > 0 else float("nan")
        return (
            f"{self.type}: measured on {self.host} in {self.seconds:.1f} s: {measured * 1e6:.3g} us a sample on one "
            f"unit, where the cluster file predicted {self.file_seconds_per_sample * 1e6:.3g} us ({ratio:.3g}x)"
        )


def launch_told(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What ``heterps launch`` told this process (``HETERPS_LAUNCH``), or {}."""
    text = (os.environ if env is None else env).get(LAUNCH_ENV)
    try:
        told = json.loads(text) if text else {}
    except ValueError:
        return {}
    return told if isinstance(told, dict) else {}


def wanted_types(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """type -> the endpoint of the process that measures it, as the launch named them."""
    measure = launch_told(env).get("measure") or {}
    return {str(k): str(v) for k, v in measure.items()} if isinstance(measure, dict) else {}


def my_type(env: Mapping[str, str] | None = None) -> str | None:
    """The type this process is named to measure (None: it measures nothing)."""
    env = os.environ if env is None else env
    me = f"{env.get('POD_IP', '')}:{env.get('PADDLE_PORT', '')}"
    return next((rtype for rtype, endpoint in wanted_types(env).items() if endpoint == me), None)


def file_seconds_per_sample(profile: ModelProfile, cluster: Cluster, rtype: str) -> float:
    """What the cluster file's figures predict the whole program takes a sample on one unit of ``rtype`` (the
    profile's times for it left out)."""
    bare = replace(profile, layers=tuple(replace(layer, time={}) for layer in profile.layers))
    model = CostModel(bare, cluster, throughput=cluster.throughput or 1.0)
    index = cluster.type_names().index(rtype)
    return float(sum(float(model.base_time[index, i]) for i in range(len(profile.layers))))


def measure_this_host(
    cluster: Cluster, measure: Callable[[str], ModelProfile], env: Mapping[str, str] | None = None, cuda: bool = False
) -> TypeMeasurement | None:
    """When this process is the one named to measure its host's type: time the program on it (``measure(type)``,
    the job's profile with that type's times) and publish the result; None when it is not named.  ``cuda``: Paddle
    can use a GPU in this process."""
    env = os.environ if env is None else env
    rtype = my_type(env)
    board = rendezvous.board()
    if rtype is None or board is None:
        return None
    host = env.get("POD_IP", "?")
    started = time.monotonic()
    kinds = {t.name: t.kind for t in cluster.resource_types}
    if rtype not in kinds:
        result = TypeMeasurement(rtype, host, 0.0, None, 0.0, "not a type of the cluster file")
    elif kinds[rtype] == "gpu" and env.get("HETER_DEVICE_TYPE", "gpu" if cuda else "cpu") == "gpu":
        # a heterogeneous trainer on its GPU, or a CPU trainer where Paddle has CUDA (a one-stage plan's trainers run
        # on the GPU there): the profiler would time the wrong device
        result = TypeMeasurement(
            rtype, host, 0.0, None, 0.0, "its trainers run on a GPU, which the profiler does not time"
        )
    else:
        try:
            profile = measure(rtype)
            times = {layer.name: float(layer.time[rtype]) for layer in profile.layers if rtype in layer.time}
            took = time.monotonic() - started
            result = TypeMeasurement(rtype, host, took, times, file_seconds_per_sample(profile, cluster, rtype))
        except Exception as exc:  # measuring must never fail the job: the file's figures stand, said
            result = TypeMeasurement(rtype, host, time.monotonic() - started, None, 0.0, f"{type(exc).__name__}: {exc}")
    board.put(MEASURED_PREFIX + rtype, result.to_dict())
    logger.info("measure before betting: %s", result.line())
    return result


def gather(profile: ModelProfile, env: Mapping[str, str] | None = None) -> tuple[ModelProfile, list[TypeMeasurement]]:
    """Trainer 0: every type the launch named, as its host measured it (waiting ``HETERPS_MEASURE_WAIT_S`` at
    most), and the profile with the measured times in place of the file's estimates."""
    own = my_type(env)  # trainer 0 timed its own host's type itself, in its profile
    wanted = {rtype: endpoint for rtype, endpoint in wanted_types(env).items() if rtype != own}
    board = rendezvous.board()
    if not wanted or board is None:
        return profile, []
    wait = float(cast(float, settings.get("HETERPS_MEASURE_WAIT_S")))
    deadline = time.monotonic() + wait
    logger.info("measure before betting: waiting (up to %.0f s) for %s timed on their hosts", wait, sorted(wanted))
    found: dict[str, Any] = {}
    while True:
        found = {k[len(MEASURED_PREFIX) :]: v for k, v in board.entries(MEASURED_PREFIX).items()}
        if set(wanted) <= set(found) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    out = []
    for rtype in sorted(wanted):
        if rtype in found:
            try:
                out.append(TypeMeasurement.from_dict(found[rtype]))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:  # not a record this version writes
                why = f"its record on the board could not be read ({type(exc).__name__}: {exc})"
                out.append(TypeMeasurement(rtype, wanted[rtype].rsplit(":", 1)[0], 0.0, None, 0.0, why))
        else:
            why = f"no measurement within {wait:.0f} s (HETERPS_MEASURE_WAIT_S)"
            out.append(TypeMeasurement(rtype, wanted[rtype].rsplit(":", 1)[0], wait, None, 0.0, why))
    return with_times(profile, out), out


def with_times(profile: ModelProfile, measured: list[TypeMeasurement]) -> ModelProfile:
    """``profile`` with each measured type's times on its layers (a measured time replaces the file's estimate)."""
    layers = []
    for layer in profile.layers:
        time_ = dict(layer.time)
        for m in measured:
            if m.times is not None and layer.name in m.times:
                time_[m.type] = m.times[layer.name]
        layers.append(replace(layer, time=time_))
    return replace(profile, layers=tuple(layers))
