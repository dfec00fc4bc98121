"""rl's refinement (planning/schedulers/refine.py, plan_moves.py, window_covers.py): every move it scores from
the stage tables costs what the cost model says the moved plan costs, with the same units over the limits; a
re-cover is the cheapest cover of its window by brute force, and so is a priced re-cover's under any prices; a
descent, an oscillation and a priced re-cover never end worse than they started."""

import itertools

import numpy as np
import pytest

from heterps_paddle.planning.catalog import generate_workload, random_case, tight_case
from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.schedulers.exact import ExactScheduler
from heterps_paddle.planning.schedulers.plan_moves import Move, MoveScorer
from heterps_paddle.planning.schedulers.refine import (
    RECOVER_SPAN,
    descend,
    oscillate,
    penalised_descent,
    penalised_value,
    reprice,
)
from heterps_paddle.planning.schedulers.window_covers import RECOVER_PIECES, priced_cover, recover


def small_models():
    """Catalog workloads (limits binding or not) and random cases whose tight limits bind across stages."""
    for seed in range(8):
        if seed % 2:
            yield CostModel(*random_case(seed, 8, 4, time_scale=-11.0))
        else:
            workload = generate_workload(seed, 8, 4, binding=seed % 4 == 0)
            yield CostModel(workload.profile, workload.cluster)


def plans(model, rng, count=4):
    """Sorted plans (few stages) and random ones (many, often over the limits)."""
    for index in range(count):
        plan = rng.integers(0, model.num_types, model.num_layers)
        yield np.sort(plan) if index % 2 else plan


@pytest.mark.parametrize("model_index", range(8))
def test_every_scored_move_matches_the_cost_model(model_index):
    model = list(small_models())[model_index]
    scorer = MoveScorer(model)
    rng = np.random.default_rng(model_index)
    checked = 0
    for plan in plans(model, rng):
        stages = scorer.stages(plan)
        scored = []  # (moved plan, cost, excess)
        costs, excess = scorer.segment_moves(stages)
        for t, segment in itertools.product(range(model.num_types), range(costs.shape[1])):
            start, end = int(scorer.segment_start[segment]), int(scorer.segment_end[segment])
            moved = Move(0.0, 0.0, "segment", start, end, end, t, t).apply(plan)
            scored.append((moved, costs[t, segment], excess[t, segment]))
        for q in range(stages.start.size):
            if stages.end[q] - stages.start[q] < 2:
                continue
            costs, excess = scorer.split_moves(stages, q)
            start, end = int(stages.start[q]), int(stages.end[q])
            for cut, a, b in itertools.product(range(costs.shape[0]), range(model.num_types), range(model.num_types)):
                if a != b:
                    moved = Move(0.0, 0.0, "split", start, end, start + 1 + cut, a, b).apply(plan)
                    scored.append((moved, costs[cut, a, b], excess[cut, a, b]))
        batch = model.evaluate_batch(np.array([moved for moved, _, _ in scored]))
        for index, (moved, cost, over) in enumerate(scored):
            if not np.isfinite(over):
                # a new stage no unit count can run: the cost model counts it far over the limits
                assert not batch.feasible[index]
                continue
            assert cost == pytest.approx(batch.cost_per_hour[index], rel=1e-9), moved
            assert over == pytest.approx(model.evaluate(moved).excess_units, abs=1e-9), moved
            checked += 1
    assert checked > 100


def cheapest_cover_by_brute_force(model, plan, low, high):
    """The cheapest plan that differs from ``plan`` only in layers [low, high), covered by 2..RECOVER_PIECES
    stages, each stage touching the window within its type's limit on its own (the re-cover ignores the
    shared limits)."""
    best = np.inf
    for pieces in range(2, RECOVER_PIECES + 1):
        for cuts in itertools.combinations(range(low + 1, high), pieces - 1):
            bounds = (low, *cuts, high)
            for types in itertools.product(range(model.num_types), repeat=pieces):
                if any(types[i] == types[i + 1] for i in range(pieces - 1)):
                    continue
                moved = plan.copy()
                for i, t in enumerate(types):
                    moved[bounds[i] : bounds[i + 1]] = t
                evaluation = model.evaluate(moved)
                if all(s.within_limit for s in evaluation.stages if s.end > low and s.start < high):
                    best = min(best, evaluation.cost_per_hour)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_a_recover_is_the_cheapest_cover_of_its_window(seed):
    workload = generate_workload(seed, 7, 3, binding=False)
    model = CostModel(workload.profile, workload.cluster)
    scorer = MoveScorer(model)
    rng = np.random.default_rng(seed)
    for plan in plans(model, rng, count=3):
        stages = scorer.stages(plan)
        for first in range(stages.start.size):
            for last in range(first, min(first + RECOVER_SPAN, stages.start.size)):
                low, high = int(stages.start[first]), int(stages.end[last])
                best = cheapest_cover_by_brute_force(model, plan, low, high)
                moved = recover(scorer, stages, first, last)
                if moved is None:  # nothing cheaper than what is there
                    assert not best < stages.total - 1e-9
                else:
                    assert scorer.stages(moved).total == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("model_index", range(8))
def test_descent_ends_no_worse_and_repairs_where_it_can(model_index):
    model = list(small_models())[model_index]
    rng = np.random.default_rng(100 + model_index)
    for plan in plans(model, rng):
        before = model.evaluate(plan)
        after = descend(model, plan)
        if before.feasible:
            assert after.feasible and after.cost_per_hour <= before.cost_per_hour + 1e-9
        else:
            assert after.excess_units <= before.excess_units


def used_per_type(model, plan):
    used = np.zeros(model.num_types)
    for stage in model.evaluate(plan).stages:
        used[stage.type_index] += stage.units
    return used


@pytest.mark.parametrize("model_index", range(8))
def test_weighted_units_over_the_limits_match_the_cost_model(model_index):
    """With a price per unit over each type's limit (the oscillation's penalty), every scored move's weighted
    excess is that price times the units over the limits, type by type, of the moved plan."""
    model = list(small_models())[model_index]
    scorer = MoveScorer(model)
    rng = np.random.default_rng(50 + model_index)
    weights = rng.uniform(0.2, 3.0, model.num_types)
    checked = 0
    for plan in plans(model, rng, count=2):
        stages = scorer.stages(plan)
        scored = []
        costs, excess = scorer.segment_moves(stages, weights)
        for t, segment in itertools.product(range(model.num_types), range(costs.shape[1])):
            start, end = int(scorer.segment_start[segment]), int(scorer.segment_end[segment])
            scored.append((Move(0.0, 0.0, "segment", start, end, end, t, t).apply(plan), excess[t, segment]))
        for q in range(stages.start.size):
            if stages.end[q] - stages.start[q] < 2:
                continue
            costs, excess = scorer.split_moves(stages, q, weights)
            start, end = int(stages.start[q]), int(stages.end[q])
            for cut, a, b in itertools.product(range(costs.shape[0]), range(model.num_types), range(model.num_types)):
                if a != b:
                    moved = Move(0.0, 0.0, "split", start, end, start + 1 + cut, a, b).apply(plan)
                    scored.append((moved, excess[cut, a, b]))
        for moved, over in scored:
            if np.isfinite(over):
                expected = (weights * np.maximum(0.0, used_per_type(model, moved) - model.max_units)).sum()
                assert over == pytest.approx(expected, rel=1e-9, abs=1e-9), moved
                checked += 1
    assert checked > 50


@pytest.mark.parametrize("model_index", range(8))
def test_the_oscillation_keeps_the_limits_and_never_ends_worse(model_index):
    model = list(small_models())[model_index]
    scorer = MoveScorer(model)
    rng = np.random.default_rng(200 + model_index)
    for plan in plans(model, rng):
        start = descend(model, plan, scorer)
        if not start.feasible:
            continue
        assignment = np.array(start.assignment)
        penalty = rng.uniform(0.1, 2.0, model.num_types) * scorer.price
        ended = penalised_descent(scorer, assignment, penalty)
        assert penalised_value(scorer, scorer.stages(ended), penalty) <= start.cost_per_hour + 1e-9
        after = oscillate(model, assignment, scorer)
        assert after.feasible and after.cost_per_hour <= start.cost_per_hour + 1e-9
        assert after.cost_per_hour == pytest.approx(model.evaluate(after.assignment).cost_per_hour)


def test_the_oscillation_finds_what_a_descent_misses_on_a_tight_case():
    """The issue's kind of case (32 layers x 8 types, the limited optimum 1.2x+ the unlimited one): from the
    cheapest single-type plan, the descent stops at a local optimum more than 10% above exact's optimum (1.131x);
    the oscillation from there lands within 1% of it (on the optimum)."""
    workload = tight_case(3002, 32, 8)
    model = CostModel(workload.profile, workload.cluster)
    optimum = ExactScheduler().plan(model).cost_per_hour
    scorer = MoveScorer(model)
    single = min(model.single_type_evaluations(), key=lambda e: (e.excess_units, e.cost_per_hour))
    descended = descend(model, np.array(single.assignment), scorer)
    assert descended.feasible and descended.cost_per_hour > 1.10 * optimum
    oscillated = oscillate(model, np.array(descended.assignment), scorer)
    assert oscillated.feasible and oscillated.cost_per_hour <= 1.01 * optimum


def priced_total(scorer, plan, unit_price):
    stages = scorer.stages(plan)
    with np.errstate(invalid="ignore"):
        return float((stages.units * unit_price[stages.type]).sum())


@pytest.mark.parametrize("seed", range(6))
def test_a_priced_cover_is_the_cheapest_cover_of_its_window(seed):
    """Under any prices per unit, the window DP's cover of a few stages is the cheapest way to assign their layers
    (any number of stages, the outer ones joining a neighbour of their type), by brute force; its value is what
    the plan's priced total changes by."""
    workload = generate_workload(seed, 7, 3, binding=seed % 2 == 0)
    model = CostModel(workload.profile, workload.cluster)
    scorer = MoveScorer(model)
    rng = np.random.default_rng(seed)
    unit_price = scorer.price * rng.uniform(0.5, 3.0, model.num_types)
    checked = 0
    for plan in plans(model, rng, count=3):
        stages = scorer.stages(plan)
        for first in range(stages.start.size):
            for last in range(first, stages.start.size):
                low, high = int(stages.start[first]), int(stages.end[last])
                if high - low > 5:
                    break
                best = np.inf
                for types in itertools.product(range(model.num_types), repeat=high - low):
                    moved = plan.copy()
                    moved[low:high] = types
                    best = min(best, priced_total(scorer, moved, unit_price))
                found = priced_cover(scorer, stages, first, last, unit_price)
                if found is None:
                    assert not np.isfinite(best)
                    continue
                moved = plan.copy()
                moved[low:high] = found[0]
                assert priced_total(scorer, moved, unit_price) == pytest.approx(best, rel=1e-9)
                outside = priced_total(scorer, plan, unit_price) - float(
                    (stages.units[first : last + 1] * unit_price[stages.type[first : last + 1]]).sum()
                )
                assert outside + found[1] == pytest.approx(best, rel=1e-9)
                checked += 1
    assert checked > 10


@pytest.mark.parametrize("model_index", range(8))
def test_the_priced_recover_keeps_the_limits_and_never_ends_worse(model_index):
    model = list(small_models())[model_index]
    scorer = MoveScorer(model)
    rng = np.random.default_rng(300 + model_index)
    for plan in plans(model, rng):
        start = descend(model, plan, scorer)
        if not start.feasible:
            continue
        after = reprice(model, np.array(start.assignment), scorer)
        assert after.feasible and after.cost_per_hour <= start.cost_per_hour + 1e-9
        assert after.cost_per_hour == pytest.approx(model.evaluate(after.assignment).cost_per_hour)
