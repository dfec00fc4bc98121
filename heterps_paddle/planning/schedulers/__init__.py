"""Schedulers behind one interface (``base.Scheduler``); ``make_scheduler(name, seed)`` builds one by name.

Modules are imported on demand: ``rl`` needs Paddle (imported inside its functions), the others do not."""

from __future__ import annotations

import importlib

from heterps_paddle.fleet.strategy import SCHEDULERS
from heterps_paddle.planning.model import PlanningInputError
from heterps_paddle.planning.schedulers.base import Schedule, Scheduler

_MODULES = {"rl": "rl", "exact": "exact", "brute": "brute", "greedy": "greedy", "genetic": "genetic"}
assert set(_MODULES) == set(SCHEDULERS), "strategy.SCHEDULERS and the scheduler modules disagree"


def make_scheduler(name: str, seed: int = 0, **options) -> Scheduler:
    if name not in _MODULES:
        raise PlanningInputError(f"unknown scheduler {name!r} (choose from {', '.join(SCHEDULERS)})")
    module = importlib.import_module(f"{__name__}.{_MODULES[name]}")
    return module.SCHEDULER(seed=seed, **options)


__all__ = ["Schedule", "Scheduler", "make_scheduler", "SCHEDULERS"]
