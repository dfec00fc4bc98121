"""One plan for every process of a launch across hosts, checked by digest (``heterps launch --hosts``).

Across hosts nothing is shared but the launch's coordinator (rendezvous.py), so the plan travels through its
board: stage 1's CPU trainer 0 publishes the plan it runs (made inside ``minimize`` on the automatic path, or
read from ``heterps_configs['plan']``) under ``plan``; every other process of every host waits for it, and either
takes it (the automatic path: it does not plan on its own) or checks that the plan it read from its own copy of
the file has the same digest.  Every process logs the digest, so a reader of any host's logs sees one plan.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, cast

from heterps_paddle import rendezvous, settings
from heterps_paddle.errors import HeterPSError
from heterps_paddle.log import logger
from heterps_paddle.measure.cache import digest
from heterps_paddle.planning.model import Plan, plan_from_dict

PLAN_KEY = rendezvous.PLAN_KEY


class PlanDisagreement(HeterPSError, RuntimeError):
    """A process's plan is not the one its launch runs."""


def plan_digest(plan: Plan) -> str:
    return digest(plan.to_dict())


def publishes_the_plan(env: Any = None) -> bool:
    """Stage 1's CPU trainer 0: the process that plans on the automatic path, and publishes across hosts."""
    env = os.environ if env is None else env
    return bool(env.get("TRAINING_ROLE") == "TRAINER" and env.get("PADDLE_TRAINER_ID", "0") == "0")


def _where() -> str:
    return os.environ.get("POD_IP", "this host")


def published(what: str) -> dict[str, Any]:
    """The launch's plan record, waiting for trainer 0 to publish it (HETERPS_PLAN_WAIT_S)."""
    board = rendezvous.board()
    if board is None:
        raise PlanDisagreement(f"{what}: this process is not part of a launch; no plan was published to it")
    wait = float(cast(float, settings.get("HETERPS_PLAN_WAIT_S")))
    logger.info("%s: waiting (up to %.0f s) for the plan stage 1's trainer 0 publishes on %s", what, wait, board.where)
    try:
        return dict(rendezvous.wait_for(lambda: board.get(PLAN_KEY), wait, f"the launch's plan on {board.where}"))
    except rendezvous.RendezvousError as exc:
        raise PlanDisagreement(f"{what}: {exc} (HETERPS_PLAN_WAIT_S); see stage 1 trainer 0's log") from None


def published_plan(what: str) -> tuple[Plan, str]:
    """The plan trainer 0 published, and its report."""
    record = published(what)
    return plan_from_dict(record["plan"], f"the launch's plan (published by {record['host']})"), str(record["report"])


def agree(
    plan: Plan, report: str = "", inputs: dict[str, Any] | None = None, prices: Mapping[str, float] | None = None
) -> None:
    """Trainer 0 publishes ``plan`` on the launch's board; across hosts every other process checks it runs the same
    one, and every process logs the digest (on one host there is one plan file, or one output_dir).  ``inputs``:
    what the plan was made from (planning/replan.py), published with it so that the launch's coordinator can
    re-plan for fewer hosts after losing one; ``prices``: each resource type's price per hour (when no inputs say
    them), so that the launch's gauge can say what the job costs (launch/gauge.py)."""
    board = rendezvous.board()
    mine = plan_digest(plan)
    if inputs is not None and prices is None:
        types = (inputs.get("cluster") or {}).get("resource_types") or ()
        prices = {str(t["name"]): float(t["price_per_hour"]) for t in types if "price_per_hour" in t}
    record = {
        "plan": plan.to_dict(),
        "digest": mine,
        "host": _where(),
        "report": report,
        "inputs": inputs,
        "prices": dict(prices or {}),
    }
    if not rendezvous.across_hosts():
        if board is not None and publishes_the_plan():
            board.put(PLAN_KEY, record)  # for the launch's gauge: the plan it measures against, and its prices
        return
    assert board is not None
    if publishes_the_plan():
        board.put(PLAN_KEY, record)
        print(f"heterps: plan digest {mine} (published for every process of the launch)", flush=True)
        return
    record = published("this process")
    if record["digest"] != mine:
        raise PlanDisagreement(
            f"this process ({os.environ.get('TRAINING_ROLE', '?')} on {_where()}) has plan digest {mine}, but the "
            f"launch runs plan digest {record['digest']} (published by stage 1 trainer 0 on {record['host']}): "
            "every host must be given the same plan file"
        )
    print(f"heterps: plan digest {mine} (the launch's, published on {record['host']})", flush=True)
