"""rl's local refinement of a plan: searches over the moves of ``plan_moves`` (scored from the stage tables)
and the window re-covers of ``window_covers``.

``descend`` takes the best move of each round and then each of the next best that still improves the plan
(checked on the whole plan); a plan over the limits is repaired first (fewest units over the limits, then cost).
At a local optimum it tries two larger steps:

- ejection: where the shared unit limits bind, the best plans often need two moves at once (one stage gives up a
  type's units so that another can take them): each of the cheapest few moves that break a limit, followed by
  the best move that repairs it;
- re-cover: up to ``RECOVER_SPAN`` consecutive stages replaced by the cheapest cover of their layers with 2 to
  ``RECOVER_PIECES`` stages (``window_covers.recover``). The DP does not see the shared limits; where its cover
  breaks one, the types over their limit get a surcharge and it tries again.

Where the shared limits bind hard, two searches around them (after a descent):

- strategic oscillation (``oscillate``): descents on the cost plus a price per unit over a limit;
- priced re-cover (``reprice``): windows of ``REPRICE_SPAN`` stages replaced by their cheapest cover under unit
  prices that subgradient steps raise on the types the plan takes too many units of, each round's plan repaired
  by a descent: the better plans there differ from a local optimum in several places at once, linked by the
  units they trade.
"""

from __future__ import annotations

import time

import numpy as np
from numpy.typing import NDArray

from heterps_paddle.planning.cost_model import CostModel, Evaluation
from heterps_paddle.planning.schedulers.plan_moves import MoveScorer, Stages, cheaper
from heterps_paddle.planning.schedulers.window_covers import priced_cover, recover

# How many of the best moves a descent round tries, one after another on the plan as it goes.
MOVES_PER_ROUND = 16
# How many limit-breaking moves an ejection tries at a local optimum, cheapest first.
EJECTION_TRIES = 6
# How many consecutive stages a re-cover replaces at most (with how many new stages: window_covers).
RECOVER_SPAN = 4
RECOVER_TRIES = 4  # covers tried per window when the cheapest breaks a shared limit
# Strategic oscillation (``oscillate``): rounds, and the price of a unit over a limit, first as a share of the
# type's price, then multiplied or divided by the growth each round.
OSCILLATION_ROUNDS = 12
PENALTY_START = 0.25
PENALTY_GROWTH = 2.0
# Priced re-cover (``reprice``): how many consecutive stages one window DP replaces (the windows overlap by half),
# the subgradient step of a type's price per unit over its limit (a share of its price; halved after every
# REPRICE_HALVING rounds in a row that found nothing cheaper), the rounds at most, and how many rounds in a row
# without a cheaper plan end it.
REPRICE_SPAN = 16
REPRICE_STEP = 0.05
REPRICE_HALVING = 8
REPRICE_ROUNDS = 80
REPRICE_PATIENCE = 24


def descend(
    cost_model: CostModel,
    assignment: NDArray[np.intp],
    scorer: MoveScorer | None = None,
    deadline: float | None = None,
    jumps: bool = True,
) -> Evaluation:
    """Best-improvement descent from a plan until no move, and no ejection, makes it better: fewer units over
    the limits first (so an infeasible start is repaired where a sequence of moves can), then a lower cost.
    ``jumps=False``: no ejection and no re-cover at a local optimum (most of a long descent's time on a large
    plan; ``reprice`` repairs with it and polishes only what improves). Stops early, with the plan reached so
    far, once ``time.perf_counter()`` passes ``deadline``."""
    scorer = scorer or MoveScorer(cost_model)
    current = np.asarray(assignment, dtype=np.intp)
    state = scorer.state(scorer.stages(current))
    while not _late(deadline):
        # The best move, then each of the next best that still improves the plan once the ones before it are
        # in (checked on the whole plan): one scoring of all moves serves several steps where the plan has
        # many stages that each want their own fix.
        improved = False
        for move in scorer.best_moves(current, MOVES_PER_ROUND):
            moved = move.apply(current)
            candidate = scorer.state(scorer.stages(moved))
            if _better(candidate, state):
                current, state, improved = moved, candidate, True
        if improved:
            continue
        if state[0] > 0 or not jumps:
            break
        jump = _ejection(scorer, current, state[1], deadline) or _best_recover(scorer, current, state[1], deadline)
        if jump is None:
            break
        current, state = jump[0], (0.0, jump[1])
    return cost_model.evaluate(current.tolist())


def penalised_value(scorer: MoveScorer, stages: Stages, penalty: NDArray[np.float64]) -> float:
    """A plan's cost plus ``penalty[type]`` for each unit of a type over its limit."""
    return stages.total + float((penalty * np.maximum(0.0, stages.used - scorer.limit)).sum())


def penalised_descent(
    scorer: MoveScorer, assignment: NDArray[np.intp], penalty: NDArray[np.float64], deadline: float | None = None
) -> NDArray[np.intp]:
    """Descent on the cost plus ``penalty[type]`` per unit over a type's limit: a plan may go over a limit where
    what it saves elsewhere is worth more than the penalty. Returns the plan it ends at (maybe over the limits)."""
    current = np.asarray(assignment, dtype=np.intp)
    value = penalised_value(scorer, scorer.stages(current), penalty)
    while not _late(deadline):
        improved = False
        for move in scorer.penalised_moves(current, MOVES_PER_ROUND, penalty):
            moved = move.apply(current)
            candidate = penalised_value(scorer, scorer.stages(moved), penalty)
            if cheaper(candidate, value):
                current, value, improved = moved, candidate, True
        if not improved:
            break
    return current


def oscillate(
    cost_model: CostModel,
    assignment: NDArray[np.intp],
    scorer: MoveScorer | None = None,
    deadline: float | None = None,
    rounds: int = OSCILLATION_ROUNDS,
) -> Evaluation:
    """Strategic oscillation around the shared limits, from a plan that keeps them: where limits bind hard, the
    better plans lie behind chains of exchanges (a stage frees units of one type so that another stage can take
    them, which frees units of a third ...), each step of which breaks some limit, so no descent that keeps the
    limits, and no single ejection, walks there. Each round descends on the cost plus a price per unit over a
    limit (``penalised_descent``), then repairs a copy of where it ended with ``descend``; the penalty of every
    type left over its limit rises (``PENALTY_GROWTH``), and all fall when the round ended within the limits, so
    the search crosses the boundary back and forth from where it was. Returns the cheapest repaired plan, never
    worse than ``assignment``."""
    scorer = scorer or MoveScorer(cost_model)
    best = cost_model.evaluate(np.asarray(assignment).tolist())
    penalty = PENALTY_START * scorer.price.astype(float)
    current = np.asarray(assignment, dtype=np.intp)
    for _ in range(rounds):
        if _late(deadline):
            break
        current = penalised_descent(scorer, current, penalty, deadline)
        over = scorer.stages(current).used > scorer.limit
        repaired = descend(cost_model, current, scorer, deadline)
        if repaired.feasible and (
            not best.feasible or _better((0.0, repaired.cost_per_hour), (0.0, best.cost_per_hour))
        ):
            best = repaired
        if over.any():
            penalty[over] *= PENALTY_GROWTH
        else:
            penalty /= PENALTY_GROWTH
    return best


def reprice(
    cost_model: CostModel,
    assignment: NDArray[np.intp],
    scorer: MoveScorer | None = None,
    deadline: float | None = None,
    rounds: int = REPRICE_ROUNDS,
    patience: int = REPRICE_PATIENCE,
) -> Evaluation:
    """Priced re-cover, from a plan: where shared limits bind, the better plans differ from it in several places
    at once, linked by the units they trade (one region gives up a cheap type's units so that another can take
    them), which no chain of moves within the limits reaches. Each round replaces every window of
    ``REPRICE_SPAN`` consecutive stages (half overlapping) by its cheapest cover (``window_covers.priced_cover``)
    when one is cheaper under the current unit prices: a type's price plus a surcharge per unit, raised by a
    subgradient step where the plan ended over the type's limit and lowered where it left units free (the
    step halves after every ``REPRICE_HALVING`` rounds in a row without a cheaper plan). The plan so priced may
    break limits; a copy is repaired by descent without jumps (``descend(jumps=False)``), and the cheapest
    repaired plan is kept; at the end it gets a full descent. Stops after ``patience`` rounds in a row that
    found nothing cheaper, or ``rounds``, or at the deadline; returns the cheapest feasible plan, never worse
    than ``assignment``."""
    scorer = scorer or MoveScorer(cost_model)
    best = cost_model.evaluate(np.asarray(assignment).tolist())
    surcharge = np.zeros(scorer.T)
    step_size = REPRICE_STEP
    current = np.asarray(assignment, dtype=np.intp).copy()
    stale = 0
    for round_index in range(rounds):
        if stale >= patience or _late(deadline):
            break
        unit_price = scorer.price + surcharge
        stages = scorer.stages(current)
        stride = max(1, REPRICE_SPAN // 2)
        first = (round_index % 2) * (stride // 2)  # shift the windows' edges every other round
        while first < stages.start.size:
            last = min(first + REPRICE_SPAN, stages.start.size) - 1
            found = priced_cover(scorer, stages, first, last, unit_price)
            if found is not None:
                old = float((stages.units[first : last + 1] * unit_price[stages.type[first : last + 1]]).sum())
                if cheaper(found[1], old):
                    current[stages.start[first] : stages.end[last]] = found[0]
                    stages = scorer.stages(current)
            first += stride
        over = stages.used - scorer.limit
        surcharge = np.maximum(0.0, surcharge + step_size * scorer.price * np.where(np.isfinite(over), over, 0.0))
        repaired = descend(cost_model, current, scorer, deadline, jumps=False)
        stale += 1
        if repaired.feasible and (
            not best.feasible or _better((0.0, repaired.cost_per_hour), (0.0, best.cost_per_hour))
        ):
            best, stale = repaired, 0
        elif stale % REPRICE_HALVING == 0:  # the prices cycle: smaller steps settle them nearer the limits
            step_size /= 2.0
    if best.feasible:  # the jumps, once, on the best plan
        polished = descend(cost_model, np.array(best.assignment), scorer, deadline)
        if polished.feasible:
            best = polished
    return best


def _best_recover(
    scorer: MoveScorer, current: NDArray[np.intp], current_cost: float, deadline: float | None = None
) -> tuple[NDArray[np.intp], float] | None:
    """The best re-cover of up to ``RECOVER_SPAN`` consecutive stages that keeps the limits and lowers the cost."""
    stages = scorer.stages(current)
    best: tuple[NDArray[np.intp], float] | None = None
    for first in range(stages.start.size):
        if _late(deadline):
            break
        for last in range(first, min(first + RECOVER_SPAN, stages.start.size)):
            # The cover ignores the shared limits: where it breaks one, the types over their limit cost more
            # in the next try, until a cover keeps them or none is cheaper.
            surcharge = np.ones(scorer.T)
            for _ in range(RECOVER_TRIES):
                moved = recover(scorer, stages, first, last, surcharge)
                if moved is None:
                    break
                after = scorer.stages(moved)
                over = after.used > scorer.limit
                if not over.any():
                    if _better(scorer.state(after), (0.0, current_cost if best is None else best[1])):
                        best = (moved, after.total)
                    break
                surcharge[over] *= 4.0
    return best


def _ejection(
    scorer: MoveScorer, current: NDArray[np.intp], current_cost: float, deadline: float | None = None
) -> tuple[NDArray[np.intp], float] | None:
    """The cheapest limit-breaking moves, each followed by its best repair; the best pair under the current cost."""
    best: tuple[NDArray[np.intp], float] | None = None
    for breaking in scorer.breaking_moves(current, EJECTION_TRIES):
        if not _better((0.0, breaking.cost), (0.0, current_cost)) or _late(deadline):
            break
        broken = breaking.apply(current)
        repair = scorer.best_move(broken)
        if (
            repair is not None
            and repair.excess == 0
            and _better((0.0, repair.cost), (0.0, current_cost if best is None else best[1]))
        ):
            best = (repair.apply(broken), repair.cost)
    return best


def _late(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() > deadline


def _better(candidate: tuple[float, float], than: tuple[float, float]) -> bool:
    """Fewer units over the limits, or as many and a cost lower by more than rounding."""
    if candidate[0] != than[0]:
        return candidate[0] < than[0]
    return cheaper(candidate[1], than[1])
