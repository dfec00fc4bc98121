"""The automatic path's advice (fleet/auto_plan.py ``_advice``) is `heterps plan` in a process of its own, and that
is what makes it safe on every interpreter: scipy's HiGHS, which the exact scheduler needs when the shared unit
limit binds, cannot load in a process that imported Paddle 2.6.2 first on some Python builds (libpaddle exports
zlib's symbols: with pyenv's CPython 3.11.7 the import fails with a zlib.error or the process dies in
``inflateReset2``), while Debian's CPython 3.11.2 with the very same wheels plans fine (docs/paddle-notes.md).  So
these tests say what the project guarantees, whatever the Python: the exact scheduler really runs HiGHS on the
case, and the advice asked for from a training process, one that imported Paddle first, is that exact optimum."""

import json
import os
import textwrap

import yaml
from conftest import run_python

from heterps_paddle.planning.model import cluster_to_dict, model_profile_to_dict

# A case whose shared unit limit binds, so exact really calls HiGHS, not only its DP; exact imports scipy itself
# (lazily, as in a job), and prints how often HiGHS ran where COUNT_MILP counts it.
# Its layers in a CTR model's order, the lookups before the dense layers: a launchable split's first stage holds every
# lookup (model.lookups_end), which a random order's late sparse layer leaves no split and no feasible plan.
BINDING_CASE = textwrap.dedent(
    """
    import dataclasses
    from heterps_paddle.planning.catalog import random_case
    profile, cluster = random_case(2, n=40, T=6, time_scale=-11)
    profile = dataclasses.replace(profile, layers=tuple(sorted(profile.layers, key=lambda layer: layer.kind != "sparse")))
    """
)
PLAN_A_BINDING_CASE = BINDING_CASE + textwrap.dedent(
    """
    import json, sys
    from heterps_paddle.planning.cost_model import CostModel
    from heterps_paddle.planning.planner import launchable_cost_model
    from heterps_paddle.planning.schedulers.exact import ExactScheduler
    plan = ExactScheduler().plan(COST_MODEL)
    calls = getattr(sys.modules.get("scipy.optimize"), "milp_calls", [None])
    print("planned", plan.feasible, len(calls), flush=True)
    print(json.dumps(plan.to_dict()), flush=True)
    """
)
# the advice's rules on a machine without CUDA (fleet/auto_plan.py: _trainer_kinds): the trainers of a one-stage
# plan are cpu types, as are a split's first stage's
ADVICE_COST_MODEL = "launchable_cost_model(profile, cluster, cluster.throughput, ('cpu',))"
COUNT_MILP = textwrap.dedent(
    """
    import scipy.optimize
    milp = scipy.optimize.milp
    scipy.optimize.milp_calls = []
    def counting(*args, **kwargs):
        scipy.optimize.milp_calls.append(1)
        return milp(*args, **kwargs)
    scipy.optimize.milp = counting
    """
)


def exact_optimum(cost_model="CostModel(profile, cluster)"):
    """The exact scheduler's plan of the case under ``cost_model`` in a process without Paddle, and how often it
    ran HiGHS."""
    done = run_python(COUNT_MILP + PLAN_A_BINDING_CASE.replace("COST_MODEL", cost_model))
    assert done.returncode == 0, done.stderr[-2000:]
    summary, plan = done.stdout.splitlines()[-2:]
    _, feasible, milp_calls = summary.split()
    return feasible == "True", int(milp_calls), json.loads(plan)


def test_exact_scheduler_calls_highs_in_a_process_without_paddle():
    feasible, milp_calls, _ = exact_optimum()
    assert feasible and milp_calls > 0


def test_the_advice_asked_for_after_paddle_is_imported_is_the_exact_optimum(tmp_path):
    """A training process imported Paddle long before it asks for advice: whatever the interpreter, the advice
    comes back, and it is the optimum the exact scheduler finds where Paddle was never imported."""
    case: dict = {}
    exec(BINDING_CASE, case)  # the case exact_optimum plans, in this process
    profile, cluster = case["profile"], case["cluster"]
    profile_path, cluster_path = tmp_path / "profile.yaml", tmp_path / "cluster.yaml"
    profile_path.write_text(yaml.safe_dump(model_profile_to_dict(profile)))
    cluster_path.write_text(yaml.safe_dump(cluster_to_dict(cluster)))
    target = cluster.throughput
    code = textwrap.dedent(
        f"""
        import json
        import paddle
        from heterps_paddle.fleet import auto_plan
        plan, why = auto_plan._advice(
            {str(profile_path)!r}, {str(cluster_path)!r}, ("--throughput", {target!r}),
            {{"scheduler": "exact", "seed": 0}}, False,
        )
        print(json.dumps({{"plan": None if plan is None else plan.to_dict(), "why": why}}), flush=True)
        """
    )
    # the advice runs `python -m heterps_paddle plan` from its files' directory: the package must come from where
    # this test's does (an editable install, or the tree PYTHONPATH names)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    done = run_python(code, env={"PYTHONPATH": path})
    assert done.returncode == 0, done.stderr[-3000:]
    advice = json.loads(done.stdout.splitlines()[-1])
    assert advice["why"] is None and advice["plan"] is not None, advice
    feasible, milp_calls, optimum = exact_optimum(ADVICE_COST_MODEL)
    assert feasible and milp_calls > 0 and advice["plan"]["feasible"]
    assert advice["plan"]["stages"] == optimum["stages"]
    assert advice["plan"]["cost_per_hour"] == optimum["cost_per_hour"]
