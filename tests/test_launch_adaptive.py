"""The adaptive rules (launch/adaptive.py) through the job's state machine: measured rates and proposals in, the
decisions out (rules a to e, a slow host's replacement), time given.  Pure: no sockets, no processes."""

from dataclasses import replace

from test_launch_machine import NOW, A, B, C, D, E, S, job, kinds, planned, window

from heterps_paddle.launch import machine as m
from heterps_paddle.launch import render

# ---- the plan follows the job (--adapt, docs/adaptive.md): decisions on measured rates, pure

ADAPT = m.Adapt(mode="on", miss=0.10, sustain_s=45.0, saving=0.15, every_s=30.0, cooldown=2, move_s=60.0)


def adaptive(mode="on", **fields):
    j = job(S.RUNNING, **fields)
    return replace(j, rules=replace(j.rules, adapt=replace(ADAPT, mode=mode), started_at=NOW - 3600))


def rates(per_s, target=1000.0):
    return window(per_s, target)


def feed(j, values, start=NOW, every=10.0):
    """Measured rates every ``every`` s from ``start``; every action they led to."""
    said = []
    for i, value in enumerate(values):
        j, actions = m.step(j, m.Measured(rates(value)), start + i * every)
        said += actions
    return j, said


def proposal(**fields):
    base = dict(
        plan={"stages": ["cheaper"]},
        summary="2 x cpu | 1 x gpu (4/h) -> 2 x cpu (2/h)",
        samples_per_s=1100.0,
        cost_per_hour=2.0,
        meets_target=True,
        current_samples_per_s=1050.0,
        current_cost_per_hour=4.0,
        target=1000.0,
        released={C: 2.0},
    )
    return m.Proposal(**{**base, **fields})


def test_rates_that_jitter_by_a_fifth_around_the_target_never_count_as_a_miss():
    import random

    rng = random.Random(7)
    j, said = feed(adaptive(), [1000.0 * (1 + rng.uniform(-0.2, 0.2)) + 50 for _ in range(60)])
    assert not [a for a in said if isinstance(a, m.Reconsider) and a.missed], said
    # it looks for cheaper plans now and then (at most every every_s), and a proposal no cheaper moves nothing
    asked = [a for a in said if isinstance(a, m.Reconsider)]
    assert 10 <= len(asked) <= 21
    j, actions = m.step(j, m.Proposed(proposal(cost_per_hour=3.6)), NOW + 700)  # 10% cheaper: under the margin
    assert actions == [] and j.seen.adapting is None


def test_a_pause_that_trains_nothing_for_the_whole_sustain_is_no_miss():
    """A checkpoint's capture under load outlasted the sustain: every window of it at 0 samples/s after the round had
    trained.  A pause, not a slow plan: no miss, no move (the slowed-host test under two busy loops moved on it)."""
    j, said = feed(adaptive(newest_checkpoint=3), [1100.0] * 6 + [0.0] * 8)
    assert not [a for a in said if isinstance(a, m.Reconsider) and a.missed], said
    j, said = feed(j, [600.0] * 6, start=NOW + 140)
    assert [a for a in said if isinstance(a, m.Reconsider) and a.missed], said  # training slowly is a miss


def test_a_rounds_start_that_trains_nothing_is_no_miss():
    """Its processes starting (seconds on a busy machine) train nothing: no miss until it has trained sustain_s."""
    j, said = feed(adaptive(newest_checkpoint=3), [0.0] * 8)
    assert not [a for a in said if isinstance(a, m.Reconsider) and a.missed] and j.seen.trained_at is None
    j, said = feed(j, [600.0] * 4, start=NOW + 80)
    assert not [a for a in said if isinstance(a, m.Reconsider) and a.missed]  # 30 s of training: not yet 45
    j, said = feed(j, [600.0, 0.0, 600.0, 600.0], start=NOW + 120)  # a checkpoint's idle window: a miss all the same
    assert [a for a in said if isinstance(a, m.Reconsider) and a.missed]


def test_a_sustained_miss_moves_at_the_next_checkpoint_and_lets_the_unneeded_host_go():
    j, said = feed(adaptive(newest_checkpoint=3), [600.0] * 10)  # 90 s under 900 samples/s
    ask = [a for a in said if isinstance(a, m.Reconsider) and a.missed][0]
    assert "was missed for 45 s" in ask.why
    j, actions = m.step(j, m.Proposed(proposal()), NOW + 100)
    assert kinds(actions) == ["AdaptAdvice", "AskCheckpoint"] and actions[0].decision == "move"
    assert actions[1].hold_s == 0  # a move may be declined: the trainers go on training
    assert "reaches it" in actions[0].why
    j, actions = m.step(j, m.CheckpointComplete(3), NOW + 101)  # not newer than the decision: it waits
    assert actions == []
    j, actions = m.step(j, m.CheckpointComplete(4), NOW + 110)
    # the plan decided is the plan the next round runs: the re-planning is told it, never asked to plan again
    decided = replace(proposal(), why=actions[0].decided.why)
    assert actions == [m.Replan(frozenset(), m.Kind.ADAPT, decided=decided)] and j.state is S.REPLANNING
    done = replace(planned(members={A: True, B: True}), released={C: 2.0})
    j, actions = m.step(j, done, NOW + 111)
    (new_round,) = actions
    assert new_round.released == {C: 2.0} and render.message(new_round)["released"] == {C: 2.0}
    assert j.history[-1].kind is m.Kind.ADAPT and j.history[-1].released == (C,)
    assert C in j.lost and j.round.restarts_used == 0 and j.moved_at == 2
    assert "the plan follows the job: moving to another plan (round 1)" in render.line(new_round, j)


def test_advise_says_what_it_would_do_and_does_nothing():
    j, _ = feed(adaptive("advise", newest_checkpoint=3), [600.0] * 10)
    j, actions = m.step(j, m.Proposed(proposal()), NOW + 100)
    assert kinds(actions) == ["AdaptAdvice"] and actions[0].decision == "would move"
    assert j.seen.adapting is None
    assert "adapt (advise: doing nothing): would move" in render.line(actions[0], j)


def test_a_cheaper_plan_moves_only_when_its_saving_beats_the_moves_cost_and_the_cooldown_passed():
    j = adaptive(newest_checkpoint=5)
    j, actions = m.step(j, m.Proposed(proposal()), NOW)  # half the cost, an hour run: saves far more than a move
    assert kinds(actions) == ["AdaptAdvice", "AskCheckpoint"] and "meets the target for 50% less" in actions[0].why
    short = replace(adaptive(newest_checkpoint=5), rules=replace(j.rules, started_at=NOW - 20))
    assert m.step(short, m.Proposed(proposal()), NOW)[1] == []  # 20 s run: 20 s of saving do not pay for a move
    cooling = adaptive(newest_checkpoint=5, moved_at=4)  # moved one checkpoint ago
    assert m.step(cooling, m.Proposed(proposal()), NOW)[1] == []


def test_a_miss_only_more_units_reach_wishes_for_them_once():
    j, _ = feed(adaptive(newest_checkpoint=3), [600.0] * 10)
    short = proposal(meets_target=False, wanted={"cpu_small": 1}, released={})
    j, actions = m.step(j, m.Proposed(short), NOW + 100)
    assert kinds(actions) == ["AdaptAdvice", "OnScale"] and actions[1].wanted == {"cpu_small": 1}
    assert actions[0].decision == "wish" and "needs 1 x cpu_small more" in actions[0].why
    assert m.step(j, m.Proposed(short), NOW + 130)[1] == []  # asked already this round
    advised, _ = feed(adaptive("advise", newest_checkpoint=3), [600.0] * 10)
    assert kinds(m.step(advised, m.Proposed(short), NOW + 100)[1]) == ["AdaptAdvice"]  # logged, no command run


def test_a_run_of_noisy_windows_under_the_floor_wishes_for_no_machine():
    """Jitter around a met target: a run of windows under the floor is a miss over sustain_s, but the windows' mean
    since the round trained is above the floor; a machine is paid for, so no wish (launched: the jittering job)."""
    calm, dips = [1300.0] * 12, [500.0] * 7  # 120 s above the target of 1,000, then 70 s under the floor of 900
    j, said = feed(adaptive(newest_checkpoint=3), calm + dips)
    assert [a for a in said if isinstance(a, m.Reconsider) and a.missed]  # a miss over sustain_s all the same
    short = proposal(meets_target=False, wanted={"gpu_fast": 1}, released={})
    j, actions = m.step(j, m.Proposed(short), NOW + 190)
    assert actions == [] and not j.seen.wished  # the mean, (12 x 1,300 + 7 x 500) / 19 = 1,005, meets it
    # the same dips after a round that was under the target all along: a wish
    j, _ = feed(adaptive(newest_checkpoint=3), [850.0] * 12 + dips)
    assert kinds(m.step(j, m.Proposed(short), NOW + 190)[1]) == ["AdaptAdvice", "OnScale"]


def test_a_target_out_of_every_plans_reach_moves_to_the_plan_that_comes_closest():
    j, _ = feed(adaptive(newest_checkpoint=3), [600.0] * 10)
    closer = proposal(meets_target=False, samples_per_s=800.0, current_samples_per_s=600.0, wanted={})
    j, actions = m.step(j, m.Proposed(closer), NOW + 100)
    assert kinds(actions) == ["AdaptAdvice", "AskCheckpoint"] and "no plan reaches it" in actions[0].why
    j, _ = feed(adaptive(newest_checkpoint=3), [600.0] * 10)
    barely = proposal(meets_target=False, samples_per_s=650.0, current_samples_per_s=600.0, wanted={})  # 8%: under
    assert m.step(j, m.Proposed(barely), NOW + 100)[1] == []
    same = proposal(meets_target=True, same=True)  # the running plan itself: nothing to move to
    assert m.step(j, m.Proposed(same), NOW + 100)[1] == []


def test_a_move_for_speed_alone_must_win_back_its_own_time():
    closer = proposal(meets_target=False, samples_per_s=800.0, current_samples_per_s=600.0, wanted={})
    for started, moves in ((100.0, False), (250.0, True)):  # decided at NOW + 100; the move takes 60 s
        j, _ = feed(adaptive(newest_checkpoint=3), [600.0] * 10)
        j = replace(j, rules=replace(j.rules, started_at=NOW + 100 - started))
        actions = m.step(j, m.Proposed(closer), NOW + 100)[1]
        # 100 s run: 800 x 40 < 600 x 100; 250 s: 800 x 190 > 600 x 250 (1% more)
        assert bool(actions) is moves, (started, actions)
        if moves:
            assert "trains 1% more, the move's 60 s included" in actions[0].why
    told = replace(ADAPT, horizon_s=3600.0)  # the job says how long it runs on: a fresh job moves
    j, _ = feed(adaptive(newest_checkpoint=3), [600.0] * 10)
    j = replace(j, rules=replace(j.rules, adapt=told, started_at=NOW + 90))
    assert kinds(m.step(j, m.Proposed(closer), NOW + 100)[1]) == ["AdaptAdvice", "AskCheckpoint"]
    # under a budget, the same rule
    within = proposal(meets_target=False, target=None, budget=5.0, samples_per_s=800.0, wanted={})
    budgeted = adaptive(newest_checkpoint=3, measured=rates(600.0, target=None))
    assert (
        m.step(replace(budgeted, rules=replace(budgeted.rules, started_at=NOW - 20)), m.Proposed(within), NOW)[1] == []
    )
    assert kinds(m.step(budgeted, m.Proposed(within), NOW)[1]) == ["AdaptAdvice", "AskCheckpoint"]


# ---- a slow host replaced (issue 41, test ii): its trainers slow against their peers while the job misses its target


def _stage():
    from heterps_paddle.launch.gauge import StageRate

    return StageRate(1, "cpu_small", "cpu", 2, None, 0.0, None, "nothing", 1.5)


STAGE = _stage()


def host_rates(per_s, shares, target=1000.0):
    """A window in which each host's trainer (A's, B's) trained ``shares[host]`` of its peer's samples/s (None: it
    had no peer in its pass: the other one waited)."""
    from heterps_paddle.launch.gauge import TrainerRate

    trainers = []
    for index, (host, share) in enumerate(shares.items()):
        peers = None if share is None else 500.0
        mine = 500.0 if share is None else 500.0 * share
        trainers.append(TrainerRate(host, index, mine, peers, share is not None and share < 0.6))
    return window(per_s, target, stages=(STAGE,), trainers=trainers)


# B stopped most of the time: compared at each pass's start (slow), then alone in its pass's tail (not compared);
# the windows' mean far under the target, though the burst windows come near it
SLOWED = [
    host_rates(950.0, {A: 3.0, B: 0.3}),
    host_rates(300.0, {A: None, B: None}),
    host_rates(280.0, {A: None, B: None}),
    host_rates(940.0, {A: 3.2, B: 0.3}),
    host_rates(290.0, {A: None, B: None}),
    host_rates(960.0, {A: 3.1, B: 0.32}),
    host_rates(300.0, {A: None, B: None}),
]


def feed_rates(j, windows, start=NOW, every=10.0):
    said = []
    for i, measured in enumerate(windows):
        j, actions = m.step(j, m.Measured(measured), start + i * every)
        said += actions
    return j, said


def test_a_host_slow_against_its_peers_while_the_job_misses_is_replaced_by_a_unit_asked_of_on_scale():
    j, said = feed_rates(adaptive(newest_checkpoint=2), SLOWED)
    advice = [a for a in said if isinstance(a, m.ReplaceAdvice)]
    assert kinds(said).count("ReplaceAdvice") == 1 and advice[0].decision == "replace", said
    assert advice[0].replacement == m.Replacement(B, "cpu_small", 1.5, 0.32, 3)
    (wish,) = [a for a in said if isinstance(a, m.OnScale)]
    assert wish.wanted == {"cpu_small": 1} and "host 10.0.0.2 is slow" in wish.why
    assert "slow in 3 comparisons in a row" in advice[0].why and "on average" in advice[0].why
    assert j.seen.replacing.host == B and not [a for a in said if isinstance(a, m.Reconsider) and a.missed]
    # decided: no other plan is looked for or taken this round, and no second wish
    j, more = feed_rates(j, SLOWED, start=NOW + 100)
    assert not [a for a in more if isinstance(a, (m.Reconsider, m.OnScale, m.ReplaceAdvice))], more
    assert m.step(j, m.Proposed(proposal()), NOW + 200)[1] == []
    # a machine of its type joins: a checkpoint at the end of the running pass, and the move from it
    j, actions = m.step(j, m.SpareJoined(E, "d", 2, joining={"type": "cpu_small", "units": 1}), NOW + 210)
    assert kinds(actions) == ["StandBy", "HostBack", "AskCheckpoint"] and "stand in for host 10.0.0.2" in str(actions)
    assert m.step(j, m.CheckpointComplete(2), NOW + 215)[1] == []  # written before it joined
    j, actions = m.step(j, m.CheckpointComplete(3), NOW + 220)
    assert actions == [m.Replan(frozenset({B}), m.Kind.ADAPT, {E: {"type": "cpu_small", "units": 1}})]
    assert "standing in for host 10.0.0.2, slow (32% of its peers' samples/s)" in j.seen.pending.reason
    # the new plan is no better on the model (the same units, another host): the move goes on all the same
    j, actions = m.step(j, planned(better=False, members={A: True, E: True}), NOW + 230)
    (nxt,) = actions
    assert isinstance(nxt, m.NextRound) and nxt.released == {B: 1.5} and render.message(nxt)["released"] == {B: 1.5}
    assert j.history[-1].released == (B,) and j.history[-1].kind is m.Kind.ADAPT and B in j.lost
    assert j.seen.replacing is None and j.seen.slow_windows == {}  # a fresh round measures anew


def test_the_round_after_a_move_replaces_no_host_and_wishes_for_no_machine_before_the_cooldown():
    """Under load the machine that stood in for a slow host was named slow on its first seconds, and a second one
    asked of --on-scale (CI, the slowed-host test): a move's round is judged only past the cooldown."""
    moved = adaptive(newest_checkpoint=3, moved_at=3.0)
    j, said = feed_rates(moved, SLOWED)
    assert "ReplaceAdvice" not in kinds(said) and "OnScale" not in kinds(said), said
    short = proposal(meets_target=False, wanted={"cpu_small": 1}, released={})
    assert "OnScale" not in kinds(m.step(j, m.Proposed(short), NOW + 100)[1])
    # nor does a host counted slow hold a sustained miss back then: rule (a) reconsiders as ever
    missing = [host_rates(300.0, {A: 3.0, B: 0.3})] * 7
    _, said = feed_rates(moved, missing)
    assert "ReplaceAdvice" not in kinds(said) and [a for a in said if isinstance(a, m.Reconsider) and a.missed]
    cooled, said = feed_rates(replace(j, newest_checkpoint=5), SLOWED, start=NOW + 100)
    assert kinds(said).count("ReplaceAdvice") == 1 and "OnScale" in kinds(said), said


def test_a_machine_standing_by_stands_in_for_a_slow_host_at_once():
    j, said = feed_rates(adaptive(newest_checkpoint=2, spares=frozenset({D})), SLOWED)
    assert kinds(said)[-2:] == ["ReplaceAdvice", "AskCheckpoint"] and "OnScale" not in kinds(said)
    j, actions = m.step(j, m.CheckpointComplete(3), NOW + 100)
    assert actions == [m.Replan(frozenset({B}), m.Kind.ADAPT, {})]


def test_no_replacement_for_a_host_compared_fast_once_in_between_the_coordinators_or_a_job_on_target():
    between = [*SLOWED[:3], host_rates(900.0, {A: 1.0, B: 0.9}), *SLOWED[3:]]
    j, said = feed_rates(adaptive(), between)
    assert "ReplaceAdvice" not in kinds(said) and j.seen.slow_windows[B] == 2
    # a window in which neither trained (a checkpoint): their peers' median 0, no comparison, the count kept
    idle = host_rates(0.0, {A: 1.0, B: 1.0})
    idle = replace(
        idle,
        trainers=tuple(replace(t, samples_per_s=0.0, peers_samples_per_s=0.0, slow=False) for t in idle.trainers),
    )
    j, said = feed_rates(adaptive(newest_checkpoint=2), [SLOWED[0], idle, *SLOWED[1:]])
    assert kinds(said).count("ReplaceAdvice") == 1
    coordinator = [host_rates(w.samples_per_s, {A: 0.3, B: 3.0} if w.trainers[0].share else {A: None}) for w in SLOWED]
    j, said = feed_rates(adaptive(), coordinator)
    assert "ReplaceAdvice" not in kinds(said) and j.seen.slow_windows[A] == 3  # server 0's host cannot go
    # the round's first windows train nothing (its processes start): no miss, and they do not pull the mean down
    starting = [host_rates(0.0, {A: None, B: None})] * 4
    calm_then_slow = [host_rates(1400.0, {A: 1.0, B: 1.0})] * 2 + [host_rates(950.0, {A: 3.0, B: 0.3})] * 3
    j, said = feed_rates(adaptive(), starting + calm_then_slow)
    assert "ReplaceAdvice" not in kinds(said) and j.seen.slow_windows[B] == 3  # 40 s of windows that trained
    j, said = feed_rates(j, [host_rates(300.0, {A: None, B: None})] * 3, start=NOW + 90)
    assert "ReplaceAdvice" in kinds(said)  # with its tail's windows, under the floor of 900 on average
    on_target = [replace(w, target_samples_per_s=500.0) for w in SLOWED]
    j, said = feed_rates(adaptive(), on_target)
    assert "ReplaceAdvice" not in kinds(said), said  # slow, but the job meets its target: nothing to gain


def test_rates_that_jitter_by_a_fifth_never_replace_a_host():
    import random

    rng = random.Random(11)
    windows = [
        host_rates(1000.0 * (1 + rng.uniform(-0.2, 0.2)), {A: rng.uniform(0.8, 1.25), B: rng.uniform(0.8, 1.25)})
        for _ in range(60)
    ]
    j, said = feed_rates(adaptive(), windows)
    assert "ReplaceAdvice" not in kinds(said) and j.seen.replacing is None


def test_advise_says_once_a_round_which_host_it_would_replace_and_asks_for_nothing():
    j, said = feed_rates(adaptive("advise"), SLOWED + SLOWED)
    assert kinds(said).count("ReplaceAdvice") == 1 and "OnScale" not in kinds(said)
    (advice,) = [a for a in said if isinstance(a, m.ReplaceAdvice)]
    assert advice.decision == "would replace" and j.seen.replacing is None
    assert "adapt (advise: doing nothing): would replace host 10.0.0.2" in render.line(advice, j)


def test_a_proposal_after_the_decision_changes_neither_the_plan_nor_the_correction_the_move_runs_on():
    decided_refit, later = object(), object()
    j, _ = feed(adaptive(newest_checkpoint=3), [600.0] * 10)
    j, actions = m.step(j, m.Proposed(proposal(correction=decided_refit)), NOW + 100)
    assert actions[0].decision == "move" and j.refit is decided_refit
    # a reconsideration's thread that outlasted the decision answers late, with another plan and correction
    j, actions = m.step(j, m.Proposed(proposal(plan={"stages": ["other"]}, correction=later)), NOW + 101)
    assert actions == [] and j.refit is decided_refit
    j, (replan,) = m.step(j, m.CheckpointComplete(4), NOW + 110)
    assert replan.decided.plan == {"stages": ["cheaper"]} and replan.refit is decided_refit


def test_whole_windows_are_kept_for_the_refit_and_travel_with_a_reconsideration():
    j = adaptive(newest_checkpoint=3)
    j, actions = m.step(j, m.Measured(rates(600.0), whole=False), NOW)  # a round's first, shorter window
    assert j.seen.windows == () and actions == []  # nothing to correct the model by: no reconsideration yet
    j, actions = m.step(j, m.Measured(rates(0.0)), NOW + 5)  # whole, but its processes starting trained nothing
    assert j.seen.windows == () and not [a for a in actions if isinstance(a, m.Reconsider)]
    j, said = feed(j, [600.0] * 9, start=NOW + 10)
    asks = [a for a in said if isinstance(a, m.Reconsider)]
    assert asks and len(asks[-1].windows) == m.WINDOWS_KEPT
    assert all(w.samples_per_s == 600.0 for w in asks[-1].windows)


def test_without_a_target_or_budget_a_plan_cheaper_per_sample_at_no_lower_rate_moves():
    """(e) the job's objective is its cost per sample: the proposal at no lower rate for at least ``saving`` less a
    sample, its saving over the horizon beating the move's cost, moves; slower, or too little cheaper, does not."""
    free = dict(target=None, meets_target=True, current_samples_per_s=1000.0, current_cost_per_hour=4.0)
    j, (ask,) = m.step(adaptive(newest_checkpoint=5), m.Measured(rates(1000.0, target=None)), NOW)
    assert "or one cheaper a sample" in ask.why and not ask.missed
    # one stage on the CPU hosts: half the cost an hour, as fast: half the cost a sample
    moved, actions = m.step(j, m.Proposed(proposal(samples_per_s=1000.0, cost_per_hour=2.0, **free)), NOW + 1)
    assert kinds(actions) == ["AdaptAdvice", "AskCheckpoint"]
    assert "trains a sample for 50% less at no lower rate" in actions[0].why and moved.seen.adapting is not None
    # cheaper a sample but slower: the job would train less
    _, actions = m.step(j, m.Proposed(proposal(samples_per_s=900.0, cost_per_hour=1.0, **free)), NOW + 1)
    assert actions == []
    # faster, 10% less a sample: under the saving margin
    _, actions = m.step(j, m.Proposed(proposal(samples_per_s=2000.0, cost_per_hour=7.2, **free)), NOW + 1)
    assert actions == []
    # a job 20 s old (a horizon of 20 s by default): the move's 60 s are never paid back
    young = replace(j, rules=replace(j.rules, started_at=NOW - 20))
    _, actions = m.step(young, m.Proposed(proposal(samples_per_s=1000.0, cost_per_hour=2.0, **free)), NOW + 1)
    assert actions == []
