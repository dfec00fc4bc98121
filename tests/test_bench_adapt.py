"""``heterps bench adapt`` (tools/bench/adapt.py): its figures from a coordinator's event log, on canned records (no
launch: the launched scenario it runs is tests/test_host_restarts.py's adaptive test); the command's registration
and its refusal of bad sizes."""

import pytest

from heterps_paddle.tools.bench import adapt
from heterps_paddle.tools.cli import build_parser

T = 1_764_000_000.0


def rates(at, round_number, samples, per_s, cost, per_hour, target=None):
    return {
        "t": T + at,
        "type": "rates",
        "round": round_number,
        "samples": samples,
        "samples_per_s": per_s,
        "target_samples_per_s": target,
        "cost_so_far": cost,
        "cost_per_hour": per_hour,
        "cost_per_million_samples": per_hour / 3600 / per_s * 1e6 if per_s and per_hour else None,
    }


# A split that moves: 4/h, 1,000 samples/s in round 0; decided at 25 s, round 1 (2/h, 1,000 samples/s) from 40 s.
MOVED = [
    {"t": T - 15, "type": "launch_started"},
    {"t": T, "type": "round_started", "round": 0},
    rates(10, 0, 10_000, 1000.0, 0.0111, 4.0),
    rates(20, 0, 20_000, 1000.0, 0.0222, 4.0),
    {"t": T + 35, "type": "adapt", "decision": "move"},
    rates(30, 0, 30_000, 1000.0, 0.0333, 4.0),
    {
        "t": T + 36,
        "type": "round_planned",
        "round": 1,
        "kind": "adapt",
        "released": ["127.0.0.4"],
        "passes_done": 1,
        "new_plan": {"stages": ["2 x local_cpu (4 layers)"]},
    },
    {"t": T + 40, "type": "round_started", "round": 1},
    rates(50, 1, 40_000, 1000.0, 0.0433, 2.0),
    rates(60, 1, 50_000, 1000.0, 0.0489, 2.0),
    rates(70, 1, 60_000, 1000.0, 0.0544, 2.0),
    {"t": T + 71, "type": "job_ended"},
]


def test_a_moved_jobs_figures():
    figures = adapt.job_figures(MOVED)
    assert figures["windows"] == 6 and figures["samples"] == 60_000 and figures["cost"] == 0.0544
    assert figures["cost_per_million_samples"] == pytest.approx(0.0544 / 60_000 * 1e6)
    assert figures["share_at_target"] is None  # no window had a target
    assert figures["adapt_decisions"] == ["move"]
    moved = figures["moved"]
    assert moved["round"] == 1 and moved["released"] == ["127.0.0.4"] and moved["passes_done"] == 1
    assert moved["decision_s"] == pytest.approx(25.0) and moved["round_started_s"] == pytest.approx(30.0)
    assert moved["restart_s"] == pytest.approx(4.0) and figures["seconds"] == pytest.approx(86.0)
    # from round 1's first window to its last: 20,000 samples for 0.0111
    assert moved["cost_per_million_samples_after"] == pytest.approx((0.0544 - 0.0433) / 20_000 * 1e6)
    assert figures["rounds"]["0"]["cost_per_hour"] == 4.0 and figures["rounds"]["1"]["cost_per_hour"] == 2.0
    assert figures["rounds"]["1"]["samples_per_s_median"] == 1000.0 and figures["rounds"]["1"]["windows_training"] == 3
    assert figures["rounds"]["1"]["cost_per_million_samples_median"] == pytest.approx(2.0 / 3600 / 1000 * 1e6)


def test_windows_that_know_no_plan_or_trained_nothing_are_left_out():
    first = rates(45, 1, 35_000, 1000.0, None, None)
    idle = rates(80, 1, 60_000, 0.0, 0.0600, 2.0)
    figures = adapt.job_figures([*MOVED[:8], first, *MOVED[8:-1], idle])
    # cost from round 1's first costed window (50 s) to its last (80 s): 20,000 samples for 0.0167
    assert figures["moved"]["cost_per_million_samples_after"] == pytest.approx((0.0600 - 0.0433) / 20_000 * 1e6)
    assert figures["rounds"]["1"]["windows_training"] == 4 and figures["rounds"]["1"]["samples_per_s_median"] == 1000.0


def test_a_job_that_never_moved_has_no_move():
    still = [r for r in MOVED if r["type"] == "rates" and r["round"] == 0]
    figures = adapt.job_figures(still)
    assert figures["moved"] is None and figures["adapt_decisions"] == []
    assert adapt.job_figures([])["cost_per_million_samples"] is None


def test_the_share_at_target_weighs_each_window_by_its_time():
    windows = [rates(0, 0, 0, 900.0, 0, 1.0, 1000.0), rates(10, 0, 0, 1100.0, 0, 1.0, 1000.0)]
    windows.append(rates(40, 0, 0, 800.0, 0, 1.0, 1000.0))
    # 10 s met, 30 s missed (the first record starts the clock)
    assert adapt.share_at_target(windows) == pytest.approx(0.25)
    assert adapt.share_at_target(windows[:1]) is None


def test_the_goals_compare_against_the_fixed_jobs_of_the_same_run():
    fixed = {"split": {"cost_per_million_samples": 1.0}, "one_stage": {"cost_per_million_samples": 0.5}}
    adaptive = {"cost_per_million_samples": 0.7, "moved": {"decision_s": 30.0, "cost_per_million_samples_after": 0.54}}
    got = adapt.goals(fixed, adaptive)
    assert got["after_move_over_best_fixed"] == pytest.approx(1.08) and got["after_move_within_goal"] is True
    assert got["adaptive_over_fixed_split"] == pytest.approx(0.7) and got["adaptive_within_goal"] is True
    assert got["decision_within_goal"] is True
    never = adapt.goals(fixed, {"cost_per_million_samples": 1.02, "moved": None})
    assert never["decision_s"] is None and never["decision_within_goal"] is None
    assert never["after_move_over_best_fixed"] is None and never["adaptive_within_goal"] is False


def test_the_command_is_registered_and_bad_sizes_are_refused():
    args = build_parser().parse_args(["bench", "adapt", "--passes", "1", "--json"])
    with pytest.raises(adapt.HeterPSError, match="--passes and --slowed-passes must be >= 2"):
        adapt.run(args)
    args = build_parser().parse_args(["bench", "adapt", "--slowed-passes", "1"])
    with pytest.raises(adapt.HeterPSError, match="--slowed-passes must be >= 2"):
        adapt.run(args)


# Scenario (ii): B slowed at 5 s; the replacement decided at 12 s, the round on A and C started at 40 s.
SLOWED = [
    {"t": T, "type": "round_started", "round": 0},
    rates(2, 0, 2_000, 1000.0, 0.001, 2.0, target=750.0),
    rates(6, 0, 6_000, 1000.0, 0.002, 2.0, target=750.0),
    rates(10, 0, 7_000, 250.0, 0.003, 2.0, target=750.0),
    {"t": T + 12, "type": "adapt", "decision": "replace"},
    rates(14, 0, 8_000, 250.0, 0.004, 2.0, target=750.0),
    rates(18, 0, 8_000, 0.0, 0.005, 2.0, target=750.0),  # a checkpoint: trained nothing, the time counts
    rates(22, 0, 9_000, 250.0, 0.006, 2.0, target=750.0),
    {"t": T + 36, "type": "round_planned", "round": 1, "kind": "adapt", "released": ["127.0.0.3"]},
    {"t": T + 40, "type": "round_started", "round": 1},
    rates(42, 1, 9_000, 0.0, 0.007, 2.0, target=750.0),
    rates(44, 1, 11_000, 1000.0, 0.008, 2.0, target=750.0),
    rates(48, 1, 15_000, 1000.0, 0.009, 2.0, target=750.0),
]


def test_a_slowed_jobs_figures_over_whole_stretches():
    # the windows' mean, as the machine judges a miss: the checkpoint's idle window counts, the idle ends do not
    round0 = [r for r in SLOWED if r["type"] == "rates" and r["round"] == 0]
    assert adapt.windows_mean(round0, since=T + 5) == pytest.approx(1750 / 5)
    assert adapt.windows_mean([r for r in SLOWED if r["type"] == "rates" and r["round"] == 1]) == 1000.0
    figures = adapt.slowed_figures(SLOWED, T + 5, {"wanted": {"local_cpu": 1}, "why": "host B is slow"})
    assert figures["decision_after_slowing_s"] == pytest.approx(7.0)
    assert figures["training_on_new_plan_after_slowing_s"] == pytest.approx(35.0)
    assert figures["on_scale_asked"]["wanted"] == {"local_cpu": 1}
    # from the slowing to the move (6 s to 22 s), and after it
    assert figures["samples_per_s_slowed"] == pytest.approx(350.0) and figures["samples_per_s_after_move"] == 1000.0
    assert adapt.job_figures(SLOWED)["moved"]["decision_s"] == pytest.approx(10.0)  # from the first window
    never = adapt.slowed_figures(SLOWED[:4], None, None)
    assert never["decision_after_slowing_s"] is None and never["on_scale_asked"] is None
