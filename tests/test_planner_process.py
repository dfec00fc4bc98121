"""Why the automatic path's advice runs `heterps plan` in a process of its own (fleet/auto_plan.py ``_advice``):
the exact scheduler's MILP (scipy's HiGHS) cannot run in a process that imported Paddle 2.6.2 first, as a training
process has (libpaddle exports zlib's symbols: scipy's import fails with a zlib.error or the process dies in
``inflateReset2``; docs/paddle-notes.md).  If this test fails because the paddle-first run now succeeds, the reason
is gone: plan the advice in-process instead (planning/planner.py) and delete this test."""

import textwrap

from conftest import run_python

# A case whose shared unit limit binds, so exact really calls HiGHS, not only its DP; exact imports scipy itself
# (lazily, as in a job), and prints how often HiGHS ran where COUNT_MILP counts it.
PLAN_A_BINDING_CASE = textwrap.dedent(
    """
    import sys
    from heterps_paddle.planning.catalog import random_case
    from heterps_paddle.planning.cost_model import CostModel
    from heterps_paddle.planning.schedulers.exact import ExactScheduler
    profile, cluster = random_case(0, n=40, T=6, time_scale=-11)
    plan = ExactScheduler().plan(CostModel(profile, cluster))
    calls = getattr(sys.modules.get("scipy.optimize"), "milp_calls", [None])
    print("planned", plan.feasible, len(calls), flush=True)
    """
)
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


def test_exact_scheduler_calls_highs_in_a_process_without_paddle():
    done = run_python(COUNT_MILP + PLAN_A_BINDING_CASE)
    assert done.returncode == 0, done.stderr[-2000:]
    feasible, milp_calls = done.stdout.split()[-2:]
    assert feasible == "True" and int(milp_calls) > 0, done.stdout


def test_exact_scheduler_cannot_run_after_paddle_is_imported():
    done = run_python("import paddle\nprint('paddle imported', flush=True)\n" + PLAN_A_BINDING_CASE)
    assert "paddle imported" in done.stdout, done.stderr[-2000:]
    assert done.returncode != 0 and "planned" not in done.stdout, (
        "the exact scheduler ran after `import paddle`: the reason fleet/auto_plan.py plans its advice in a "
        "subprocess is gone (see this module's docstring)"
    )
