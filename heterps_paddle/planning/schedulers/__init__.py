"""Schedulers behind one interface (``base.Scheduler``); ``make_scheduler(name, seed)`` builds one by name.

Modules are imported on demand. None of them needs Paddle: ``rl``'s policy is numpy (``policy.py``), so the
whole planning half runs without it."""

from __future__ import annotations

import importlib
from typing import Callable

from heterps_paddle.planning.model import PlanningInputError
from heterps_paddle.planning.schedulers.base import Schedule, Scheduler

# name -> module of this package: the registry (strategy validation and the CLI read SCHEDULERS from here)
_MODULES = {"rl": "rl", "exact": "exact", "brute": "brute", "greedy": "greedy", "genetic": "genetic"}
SCHEDULERS = tuple(_MODULES)


def make_scheduler(name: str, seed: int = 0, **options: object) -> Scheduler:
    if name not in _MODULES:
        raise PlanningInputError(f"unknown scheduler {name!r} (choose from {', '.join(SCHEDULERS)})")
    module = importlib.import_module(f"{__name__}.{_MODULES[name]}")
    # Each module's SCHEDULER is its Scheduler subclass; their keyword options differ.
    scheduler_class: Callable[..., Scheduler] = module.SCHEDULER
    return scheduler_class(seed=seed, **options)


__all__ = ["Schedule", "Scheduler", "make_scheduler", "SCHEDULERS"]
