"""``strategy.heterps`` / ``strategy.heterps_configs``: the fields, their schema and their validation.

Validation is pure Python so it can be tested and reused (for example by ``heterps plan``) without
Paddle; ``install_strategy_fields`` is what attaches the fields to fleet's ``DistributedStrategy``.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any, Callable

from heterps_paddle.errors import HeterPSError

SCHEDULERS = ("rl", "exact", "brute", "greedy", "genetic")


class HeterPSConfigError(HeterPSError, ValueError):
    """A ``strategy.heterps`` / ``strategy.heterps_configs`` value that cannot be used."""


@dataclass(frozen=True)
class ConfigKey:
    name: str
    types: tuple[type, ...]
    default: Any
    help: str
    check: Callable[[Any], str | None] | None = None  # returns a reason when the value is bad

    def type_names(self) -> str:
        return " or ".join(t.__name__ for t in self.types)


def _existing_file(value: str) -> str | None:
    if not os.path.isfile(value):
        return f"file {value!r} does not exist"
    return None


LOCAL_CLUSTER = "local"  # heterps_configs["cluster"]: describe this machine (heterps local-cluster) at plan time


def _cluster_file(value: str) -> str | None:
    return None if value == LOCAL_CLUSTER else _existing_file(value)


def _positive(value: float) -> str | None:
    if not value > 0 or value != value or value == float("inf"):
        return f"must be a positive finite number, got {value!r}"
    return None


def _scheduler(value: str) -> str | None:
    if value not in SCHEDULERS:
        return f"must be one of {', '.join(SCHEDULERS)}, got {value!r}"
    return None


def _non_negative_int(value: int) -> str | None:
    if value < 0:
        return f"must be >= 0, got {value!r}"
    return None


# One home for the keys a user may put in strategy.heterps_configs.
CONFIG_KEYS: dict[str, ConfigKey] = {
    k.name: k
    for k in (
        ConfigKey("cluster", (str,), None, "cluster description file (YAML/JSON, see specs/plan-io.md), or "
                  "'local' for this machine as measured by heterps local-cluster; with 'plan' it only says which "
                  "resource types are CPUs and which GPUs", _cluster_file),
        ConfigKey("throughput", (int, float), None, "required samples/s (overrides the cluster file's)",
                  _positive),
        ConfigKey("scheduler", (str,), "rl", "which scheduler plans the job: " + "|".join(SCHEDULERS),
                  _scheduler),
        ConfigKey("plan", (str,), None, "a saved plan JSON to use instead of planning", _existing_file),
        ConfigKey("seed", (int,), 0, "seed for the scheduler and profiling", _non_negative_int),
        ConfigKey("output_dir", (str,), ".", "where plan.json and the plan report are written", None),
        ConfigKey("profile_batch_size", (int,), 512, "batch size the program is profiled with", _positive),
    )
}


def validate_heterps_flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise HeterPSConfigError(
            f"strategy.heterps must be a bool (True or False), got {type(value).__name__} {value!r}")
    return value


def validate_heterps_configs(configs: Any) -> dict[str, Any]:
    """Return the full config (defaults filled in) or raise naming the key, the value and what is allowed."""
    if not isinstance(configs, dict):
        raise HeterPSConfigError(
            f"strategy.heterps_configs must be a dict, got {type(configs).__name__} {configs!r}")
    full = {name: key.default for name, key in CONFIG_KEYS.items()}
    for name, value in configs.items():
        key = CONFIG_KEYS.get(name)
        if key is None:
            raise HeterPSConfigError(
                f"strategy.heterps_configs: unknown key {name!r} (given {value!r}); "
                f"allowed keys: {', '.join(sorted(CONFIG_KEYS))}")
        if value is None:
            full[name] = key.default
            continue
        # bool is an int subclass: True is not a valid throughput or seed.
        if isinstance(value, bool) or not isinstance(value, key.types):
            raise HeterPSConfigError(
                f"strategy.heterps_configs[{name!r}] must be {key.type_names()} ({key.help}), "
                f"got {type(value).__name__} {value!r}")
        if key.check is not None:
            reason = key.check(value)
            if reason:
                raise HeterPSConfigError(f"strategy.heterps_configs[{name!r}]: {reason} ({key.help})")
        full[name] = value
    return full


def install_strategy_fields() -> None:
    """Add ``heterps`` and ``heterps_configs`` properties to fleet's DistributedStrategy.

    DistributedStrategy.__setattr__ rejects names ``hasattr`` does not know; a class-level property is
    known, so assignments go through our setter, which validates and stores in the instance dict (which
    survives fleet's deepcopy of the strategy).
    """
    from paddle.distributed.fleet.base.distributed_strategy import DistributedStrategy

    if isinstance(getattr(DistributedStrategy, "heterps", None), property):
        return

    def get_flag(self):
        return self.__dict__.get("_heterps_flag", False)

    def set_flag(self, value):
        object.__setattr__(self, "_heterps_flag", validate_heterps_flag(value))

    def get_configs(self):
        configs = self.__dict__.get("_heterps_configs")
        if configs is None:
            configs = validate_heterps_configs({})
            object.__setattr__(self, "_heterps_configs", configs)
        return configs

    def set_configs(self, value):
        object.__setattr__(self, "_heterps_configs", validate_heterps_configs(copy.deepcopy(value)))

    DistributedStrategy.heterps = property(
        get_flag, set_flag, doc="Let heterps-paddle plan and split this parameter-server job (bool).")
    DistributedStrategy.heterps_configs = property(
        get_configs, set_configs, doc="Options of strategy.heterps; see heterps_paddle.fleet.strategy.CONFIG_KEYS.")
