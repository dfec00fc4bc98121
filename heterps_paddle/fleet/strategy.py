"""``strategy.heterps`` / ``strategy.heterps_configs``: the fields, their schema and their validation.

Validation is pure Python, so it is tested and reused without Paddle, and it happens when the user assigns the
configs: a missing or malformed cluster or plan file (read by the loader ``heterps plan`` uses, so with its
messages), an unknown key or a wrong type is an error at that line of the fleet script, naming the key, the value
and what is allowed, not later inside a launched job.  runtime/patches.install_fleet_surface attaches the fields to
fleet's DistributedStrategy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from heterps_paddle.errors import HeterPSError
from heterps_paddle.fleet.plan_files import DEFAULT_OUTPUT_DIR, LOCAL_CLUSTER, overwrites_an_input
from heterps_paddle.measure.local_cluster import LOCAL_KINDS
from heterps_paddle.planning.model import Plan, PlanningInputError, load_cluster, load_plan
from heterps_paddle.planning.schedulers import SCHEDULERS


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


def _cluster_file(value: str) -> str | None:
    if value == LOCAL_CLUSTER:
        return None
    try:  # the loader `heterps plan` uses: the same file gets the same message, at the user's line
        load_cluster(value)
    except PlanningInputError as exc:
        return str(exc)
    return None


def configured_plan(configs: dict[str, Any]) -> Plan:
    """The saved plan ``configs["plan"]`` names, the kinds of stages that carry none taken from the configured
    cluster (this machine's types with "local").  Read when the configs are assigned, so a bad plan is an error at
    that line, and again by minimize, which runs it."""
    local = configs["cluster"] == LOCAL_CLUSTER
    cluster = None if local or configs["cluster"] is None else configs["cluster"]
    return load_plan(configs["plan"], cluster, kinds=LOCAL_KINDS if local else None)


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
        ConfigKey(
            "cluster",
            (str,),
            None,
            "cluster description file (YAML/JSON, docs/plan-formats.md), or 'local' "
            "for this machine as measured by heterps local-cluster; with 'plan' it says which resource types "
            "are CPUs and which GPUs",
            _cluster_file,
        ),
        ConfigKey(
            "throughput",
            (int, float),
            None,
            "required samples/s (overrides the cluster file's); without "
            "one the job plans for the most samples/s its launch can give",
            _positive,
        ),
        ConfigKey(
            "budget",
            (int, float),
            None,
            "price per hour (the cluster file's currency) to stay within, instead of a throughput target: the "
            "job plans the most samples/s its launch can give at no more than this",
            _positive,
        ),
        ConfigKey(
            "scheduler",
            (str,),
            "rl",
            "scheduler of the plan the report advises when another launch would do better: " + "|".join(SCHEDULERS),
            _scheduler,
        ),
        ConfigKey(
            "plan",
            (str,),
            None,
            "a saved plan JSON to run instead of planning (checked against the launch)",
            None,  # read with the cluster, which says the kinds of its stages: validate_heterps_configs
        ),
        ConfigKey(
            "replan",
            (bool,),
            False,
            "measure the program again and make a new plan even if output_dir holds one made from the same inputs",
            None,
        ),
        ConfigKey("seed", (int,), 0, "seed for the scheduler and profiling", _non_negative_int),
        ConfigKey(
            "output_dir",
            (str,),
            DEFAULT_OUTPUT_DIR,
            "where the automatic path writes plan.json, plan_report.txt and profile.yaml (never over a file the job "
            "was given)",
            None,  # checked against the job's inputs with the cluster and plan: validate_heterps_configs
        ),
        ConfigKey("profile_batch_size", (int,), 512, "batch size the program is profiled with", _positive),
    )
}


def validate_heterps_flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise HeterPSConfigError(
            f"strategy.heterps must be a bool (True or False), got {type(value).__name__} {value!r}"
        )
    return value


def validate_heterps_configs(configs: Any) -> dict[str, Any]:
    """Return the full config (defaults filled in) or raise naming the key, the value and what is allowed."""
    if not isinstance(configs, dict):
        raise HeterPSConfigError(f"strategy.heterps_configs must be a dict, got {type(configs).__name__} {configs!r}")
    full = {name: key.default for name, key in CONFIG_KEYS.items()}
    for name, value in configs.items():
        key = CONFIG_KEYS.get(name)
        if key is None:
            raise HeterPSConfigError(
                f"strategy.heterps_configs: unknown key {name!r} (given {value!r}); "
                f"allowed keys: {', '.join(sorted(CONFIG_KEYS))}"
            )
        if value is None:
            full[name] = key.default
            continue
        # bool is an int subclass: True is not a valid throughput or seed (and 1 is not a bool).
        if (isinstance(value, bool) and bool not in key.types) or not isinstance(value, key.types):
            raise HeterPSConfigError(
                f"strategy.heterps_configs[{name!r}] must be {key.type_names()} ({key.help}), "
                f"got {type(value).__name__} {value!r}"
            )
        if key.check is not None:
            reason = key.check(value)
            if reason:
                raise HeterPSConfigError(f"strategy.heterps_configs[{name!r}]: {reason} ({key.help})")
        full[name] = value
    if full["budget"] is not None and full["throughput"] is not None:
        raise HeterPSConfigError(
            "strategy.heterps_configs: give 'throughput' (the cheapest plan that meets it) or 'budget' (the most "
            f"samples/s within it), not both (got throughput={full['throughput']!r}, budget={full['budget']!r})"
        )
    overwrites = overwrites_an_input(full)
    if overwrites is not None:
        raise HeterPSConfigError(overwrites)
    if full["plan"] is not None:
        try:
            configured_plan(full)
        except PlanningInputError as exc:
            raise HeterPSConfigError(f"strategy.heterps_configs['plan']: {exc} ({CONFIG_KEYS['plan'].help})") from None
    return full
