"""Budget mode (`heterps plan --budget`, heterps_configs['budget']): the most samples/s within a price per hour,
checked against a brute force over every assignment and every unit count on small cases."""

import itertools
import json

import pytest
from conftest import CLUSTER, plan_exact, run_cli

from heterps_paddle.fleet.strategy import HeterPSConfigError, validate_heterps_configs
from heterps_paddle.planning.budget import BUDGET_TOLERANCE, fastest_within_budget
from heterps_paddle.planning.catalog import random_case
from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.schedulers import make_scheduler


def brute_fastest(profile, cluster, budget):
    """(samples/s, cost) of the fastest plan costing at most ``budget``: every assignment of types to layers, every
    unit count of every stage (1..max_units), shared limits per type; independent of the schedulers' provisioning."""
    model = CostModel(profile, cluster, 1.0)
    n, types = model.num_layers, model.types
    best = (0.0, None)
    for assignment in itertools.product(range(len(types)), repeat=n):
        cuts = [0] + [i for i in range(1, n) if assignment[i] != assignment[i - 1]] + [n]
        stages = [(cuts[k], cuts[k + 1], assignment[cuts[k]]) for k in range(len(cuts) - 1)]
        choices = []
        for start, end, t in stages:
            options = []
            for units in range(1, types[t].max_units + 1):
                time = model.stage_time(start, end, t, units)
                if time is not None:
                    options.append((units, units / time if time > 0 else float("inf")))
            choices.append(options)
        for picked in itertools.product(*choices):
            used = [0] * len(types)
            for (_, _, t), (units, _) in zip(stages, picked):
                used[t] += units
            if any(u > types[t].max_units for t, u in enumerate(used)):
                continue
            cost = sum(units * types[t].price_per_hour for (_, _, t), (units, _) in zip(stages, picked))
            throughput = min(rate for _, rate in picked)
            if cost <= budget * (1 + 1e-12) and (throughput, -cost) > (best[0], -(best[1] or 0.0)):
                best = (throughput, cost)
    return best


CASES = [random_case(seed, n=4, T=2) for seed in range(6)] + [random_case(seed, n=3, T=3) for seed in (11, 12)]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_exact_budget_mode_finds_the_fastest_plan_within_the_budget(case):
    profile, cluster = CASES[case]
    cheapest = make_scheduler("exact").plan(CostModel(profile, cluster, 1.0))
    if not cheapest.feasible:
        pytest.skip("no plan runs this random model at all")
    for factor in (1.0, 1.7, 3.0, 10.0):
        budget = cheapest.cost_per_hour * factor
        want, _ = brute_fastest(profile, cluster, budget)
        answer = fastest_within_budget(budget, lambda t: CostModel(profile, cluster, t), make_scheduler("exact").plan)
        got = answer.plan
        assert got.feasible and got.cost_per_hour <= budget * (1 + 1e-12), (factor, got)
        assert want * (1 - BUDGET_TOLERANCE) <= got.throughput <= want * (1 + 1e-9), (factor, got.throughput, want)


def test_rl_budget_mode_is_close_on_a_small_case():
    # rl trains its policy for every target the search tries (~15): kept to one case and a short training here;
    # `heterps plan --budget B --scheduler rl` runs the full one.
    profile, cluster = CASES[0]
    cheapest = make_scheduler("exact").plan(CostModel(profile, cluster, 1.0))
    budget = cheapest.cost_per_hour * 3.0
    want, _ = brute_fastest(profile, cluster, budget)
    rl = make_scheduler("rl", iterations=20, restarts=1)
    got = fastest_within_budget(budget, lambda t: CostModel(profile, cluster, t), rl.plan).plan
    assert got.feasible and got.cost_per_hour <= budget * (1 + 1e-12)
    assert got.throughput >= 0.95 * want, (got.throughput, want)


def test_a_budget_below_the_cheapest_plan_says_what_the_cheapest_costs():
    profile, cluster = CASES[0]
    cheapest = make_scheduler("exact").plan(CostModel(profile, cluster, 1.0))
    answer = fastest_within_budget(
        cheapest.cost_per_hour * 0.9, lambda t: CostModel(profile, cluster, t), make_scheduler("exact").plan
    )
    assert not answer.plan.feasible
    assert f"the cheapest plan that runs the model costs {cheapest.cost_per_hour:.4g}/h" in answer.plan.reason


def test_cli_budget_prints_the_plan_and_records_the_budget(capsys, model_file):
    code, out, err = plan_exact(capsys, model_file, "--budget", "2", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["feasible"] and plan["budget_per_hour"] == 2.0 and plan["cost_per_hour"] <= 2.0
    # More budget never buys less; too little is exit 1 with the cheapest plan's price.
    code, out, _ = plan_exact(capsys, model_file, "--budget", "20", "--json")
    assert code == 0 and json.loads(out)["throughput"] >= plan["throughput"]
    code, _, err = plan_exact(capsys, model_file, "--budget", "0.01")
    assert code == 1 and "no plan fits a budget of 0.01/h" in err
    code, _, err = run_cli(
        capsys, "plan", "--model", model_file, "--cluster", CLUSTER, "--budget", "2", "--throughput", "1000"
    )
    assert code == 2 and "not both" in err


def test_heterps_configs_budget_is_checked_when_assigned():
    assert validate_heterps_configs({"cluster": "local", "budget": 3.5})["budget"] == 3.5
    with pytest.raises(HeterPSConfigError, match="not both"):
        validate_heterps_configs({"cluster": "local", "budget": 3.5, "throughput": 1000})
    with pytest.raises(HeterPSConfigError, match="budget"):
        validate_heterps_configs({"cluster": "local", "budget": -1})
