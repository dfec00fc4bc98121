"""The job's state machine (launch/machine.py), transition by transition: every event in every state it can meet,
with the state it leads to and the actions it asks for.  Pure: no sockets, no processes, time given."""

from dataclasses import replace

import pytest

from heterps_paddle.launch import machine as m
from heterps_paddle.launch import render

A, B, C, D = "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"  # names only: nothing is sent anywhere
E = "10.0.0.5"  # not in the hosts file
GPU = {"type": "gpu_fast", "units": 1}
S = m.JobState
NOW = 1000.0


SEEN_FIELDS = set(m.Seen.__dataclass_fields__)


def job(state=S.JOINING, restarts=1, retries=1, checkpoints=True, can_replan=True, **fields):
    """A job in ``state``; ``fields`` of the job and of what its round has seen (m.Seen), by name."""
    rules = m.Rules(
        restarts,
        retries,
        settle_s=5.0,
        startup_s=60.0,
        can_replan=can_replan,
        checkpoints=checkpoints,
        file_hosts=frozenset({A, B, C, D}),
        files_digest="d",
    )
    round_ = m.Round(0, {A: True, B: True, C: False}, A, "d")
    base = m.first_job(rules, round_, NOW)
    seen = {k: fields.pop(k) for k in list(fields) if k in SEEN_FIELDS}
    if state is not S.JOINING:
        seen = {"joined": frozenset({A, B, C}), "started": True, **seen}
    return replace(base, state=state, seen=replace(base.seen, **seen), **fields)


def planned(better=True, members=None):
    return m.Planned(
        {"stages": ["new"]},
        members or {A: True, B: True},
        A,
        "d2",
        {"summary": "old -> new", "new_summary": "new"},
        {"resumes_from": "ckpt/pass-000002", "passes_done": 2},
        "2026-11-25T12:00:00+0000",
        better=better,
    )


def kinds(actions):
    return [type(a).__name__ for a in actions]


def window(per_s, target=None, round_number=0, stages=(), trainers=()):
    """A Rates (launch/gauge.py) the machine reads: what the shell measured over a window."""
    from heterps_paddle.launch.gauge import Rates

    return Rates(round_number, 0.0, 30.0, 0, per_s, None, target, None, None, tuple(stages), tuple(trainers))


RATES = window(100.0)  # a Rates of round 0
# the running plan again: nothing to gain
PROPOSAL = m.Proposal({"stages": []}, "a -> a", 100.0, 4.0, True, 100.0, 4.0, target=100.0)

SETTLING = dict(state=S.SETTLING, settle_at=NOW + 1, trouble=("host B: x",))
RETRY_SETTLING = dict(state=S.SETTLING, settle_at=NOW, trouble=("host B: abort",), connect_timeout=True)
MOVING = dict(state=S.REPLANNING, pending=m.Change(m.Kind.MOVE, frozenset(), (), "host(s) D back", back=(D,)))
RESTARTING = dict(state=S.REPLANNING, pending=m.Change(m.Kind.RESTART, frozenset({B}), (B,), "host B: x"))

# name, the job before, the event, the state after, the actions
TABLE = [
    # ---- joining
    ("a member joins", job(), m.Joined(A, "d"), S.JOINING, []),
    ("the last member joins: start", job(joined=frozenset({A, B})), m.Joined(C, "d"), S.RUNNING, ["Start"]),
    ("another digest ends the launch", job(), m.Joined(B, "x"), S.ABORTED, ["AbortAll"]),
    ("a stranger is refused", job(), m.Joined(D, "d"), S.JOINING, ["Refuse"]),
    ("a host joined twice is refused", job(joined=frozenset({A})), m.Joined(A, "d"), S.JOINING, ["Refuse"]),
    ("a late joiner is refused", job(S.RUNNING), m.Joined(A, "d"), S.RUNNING, ["Refuse"]),
    ("a host gone before the start ends it", job(), m.HostGone(B, 0), S.ABORTED, ["AbortAll"]),
    ("a failure before the start ends it", job(), m.ProcessFailed(B, 0, "x", True), S.ABORTED, ["AbortAll"]),
    ("the startup deadline ends it", job(startup_deadline=NOW - 1), m.Tick(), S.ABORTED, ["AbortAll"]),
    ("joining beats", job(), m.Tick(), S.JOINING, ["Beat"]),
    ("silent before the start: the deadline rules", job(), m.HostSilent(B, 0, 30), S.JOINING, []),
    # ---- running
    ("running beats", job(S.RUNNING), m.Tick(), S.RUNNING, ["Beat"]),
    ("a failure with restarts settles", job(S.RUNNING), m.ProcessFailed(B, 0, "x"), S.SETTLING, ["Settling"]),
    (
        "a failure without restarts ends",
        job(S.RUNNING, restarts=0),
        m.ProcessFailed(B, 0, "x"),
        S.ABORTED,
        ["AbortAll"],
    ),
    (
        "the connect-timeout abort without restarts settles for a retry",
        job(S.RUNNING, restarts=0),
        m.ProcessFailed(B, 0, "x", connect_timeout=True),
        S.SETTLING,
        ["Settling"],
    ),
    (
        "the abort with no retries left ends",
        job(S.RUNNING, restarts=0, retries=0),
        m.ProcessFailed(B, 0, "x", connect_timeout=True),
        S.ABORTED,
        ["AbortAll"],
    ),
    (
        "without a re-planner any failure ends",
        job(S.RUNNING, can_replan=False),
        m.HostGone(B, 0),
        S.ABORTED,
        ["AbortAll"],
    ),
    ("a host gone settles", job(S.RUNNING), m.HostGone(B, 0), S.SETTLING, ["Settling"]),
    ("a silent host settles", job(S.RUNNING), m.HostSilent(B, 0, 30), S.SETTLING, ["Settling"]),
    ("an earlier round's failure is ignored", job(S.RUNNING), m.ProcessFailed(B, -1, "x"), S.RUNNING, []),
    ("an earlier round's host gone is ignored", job(S.RUNNING), m.HostGone(B, -1), S.RUNNING, []),
    ("a trainer host done", job(S.RUNNING), m.Done(A, 0), S.RUNNING, []),
    ("the last trainer host done: the end", job(S.RUNNING, done=frozenset({A})), m.Done(B, 0), S.ENDED, ["EndAll"]),
    ("no host back: a checkpoint changes nothing", job(S.RUNNING), m.CheckpointComplete(5), S.RUNNING, []),
    ("a checkpoint older than the host back", job(S.RUNNING, back={D: 3}), m.CheckpointComplete(3), S.RUNNING, []),
    (
        "a checkpoint after a host back: re-plan",
        job(S.RUNNING, back={D: 3}),
        m.CheckpointComplete(4),
        S.REPLANNING,
        ["Replan"],
    ),
    (
        "without checkpoints a host back waits",
        job(S.RUNNING, back={D: 3}, checkpoints=False),
        m.CheckpointComplete(4),
        S.RUNNING,
        [],
    ),
    # ---- a machine from outside the hosts file joins; a host leaves on notice
    ("a stranger without a type is refused", job(S.RUNNING), m.SpareJoined(E, "d", 0), S.RUNNING, ["Refuse"]),
    (
        "a stranger with a type stands by",
        job(S.RUNNING),
        m.SpareJoined(E, "d", 2, GPU),
        S.RUNNING,
        ["StandBy", "HostBack"],
    ),
    ("a joiner with other files is refused", job(S.RUNNING), m.SpareJoined(E, "x", 2, GPU), S.RUNNING, ["Refuse"]),
    (
        "a checkpoint after a machine joined: re-plan",
        job(S.RUNNING, back={E: 2}, extra={E: GPU}),
        m.CheckpointComplete(3),
        S.REPLANNING,
        ["Replan"],
    ),
    (
        "a host asks to leave: a checkpoint",
        job(S.RUNNING),
        m.LeaveAsked(B, 60, 2),
        S.RUNNING,
        ["LeaveAnswer", "LeaveNoted", "AskCheckpoint"],
    ),
    ("the coordinator's host cannot leave", job(S.RUNNING), m.LeaveAsked(A, 60, 2), S.RUNNING, ["LeaveAnswer"]),
    ("a host of no round cannot leave", job(S.RUNNING), m.LeaveAsked(D, 60, 2), S.RUNNING, ["LeaveAnswer"]),
    (
        "a spare leaves at once",
        job(S.RUNNING, spares=frozenset({D})),
        m.LeaveAsked(D, 60, 2),
        S.RUNNING,
        ["LeaveAnswer", "Dismiss", "SpareLeft"],
    ),
    (
        "leaving while joining waits for the start",
        job(),
        m.LeaveAsked(B, 60, 2),
        S.JOINING,
        ["LeaveAnswer", "LeaveNoted"],
    ),
    ("after the end no host leaves", job(S.ENDED), m.LeaveAsked(B, 60, 2), S.ENDED, ["LeaveAnswer"]),
    (
        "without checkpoints a leave re-plans at once",
        job(S.RUNNING, checkpoints=False),
        m.LeaveAsked(B, 60, 0),
        S.REPLANNING,
        ["LeaveAnswer", "Replan"],
    ),
    (
        "the checkpoint after the notice: re-plan without it",
        job(S.RUNNING, leaving={B: (NOW + 60, 2)}),
        m.CheckpointComplete(3),
        S.REPLANNING,
        ["Replan"],
    ),
    (
        "a checkpoint from before the notice: it waits",
        job(S.RUNNING, leaving={B: (NOW + 60, 2)}),
        m.CheckpointComplete(2),
        S.RUNNING,
        [],
    ),
    (
        "past the grace: re-plan without it anyway",
        job(S.RUNNING, leaving={B: (NOW - 1, 2)}),
        m.Tick(),
        S.REPLANNING,
        ["Replan"],
    ),
    (
        "the last host joins while one leaves: start and ask",
        job(joined=frozenset({A, B}), leaving={B: (NOW + 60, 2)}),
        m.Joined(C, "d"),
        S.RUNNING,
        ["Start", "AskCheckpoint"],
    ),
    # ---- settling
    ("settling counts more failures quietly", job(**SETTLING), m.ProcessFailed(A, 0, "y"), S.SETTLING, []),
    ("settling does not beat", job(**SETTLING), m.Tick(), S.SETTLING, []),
    (
        "settled with a host lost: restart",
        job(**{**SETTLING, "settle_at": NOW}, gone=frozenset({B})),
        m.Tick(),
        S.REPLANNING,
        ["Replan"],
    ),
    ("settled, the abort alone: retry", job(**RETRY_SETTLING), m.Tick(), S.REPLANNING, ["Replan"]),
    (
        "settled, the abort and a lost host without restarts: the end",
        job(**RETRY_SETTLING, restarts=0, gone=frozenset({B})),
        m.Tick(),
        S.ABORTED,
        ["AbortAll"],
    ),
    (
        "settled with the coordinator's host lost: the end",
        job(**{**SETTLING, "settle_at": NOW}, gone=frozenset({A})),
        m.Tick(),
        S.ABORTED,
        ["AbortAll"],
    ),
    (
        "settled, restarts spent: the end",
        job(**{**SETTLING, "settle_at": NOW}, restarts=0, silent=frozenset({B})),
        m.Tick(),
        S.ABORTED,
        ["AbortAll"],
    ),
    ("a host silent while settling is counted", job(**SETTLING), m.HostSilent(B, 0, 30), S.SETTLING, []),
    ("done while settling may end the job", job(**SETTLING, done=frozenset({A})), m.Done(B, 0), S.ENDED, ["EndAll"]),
    # ---- re-planning
    ("a restart planned: the next round", job(**RESTARTING), planned(), S.JOINING, ["NextRound"]),
    ("a restart with no plan ends", job(**RESTARTING), m.PlanFailed("no room"), S.ABORTED, ["AbortAll"]),
    ("a re-planning bug ends", job(**RESTARTING), m.PlanFailed("KeyError: x", expected=False), S.ABORTED, ["AbortAll"]),
    ("a better plan with a host back: move", job(**MOVING), planned(), S.JOINING, ["NextRound"]),
    ("no better plan: the job goes on", job(**MOVING), planned(better=False), S.RUNNING, ["MoveDeclined"]),
    ("no plan with the host back: the job goes on", job(**MOVING), m.PlanFailed("x"), S.RUNNING, ["MoveImpossible"]),
    ("a plan nobody asked for is ignored", job(S.RUNNING), planned(), S.RUNNING, []),
    ("a plan failure nobody asked for is ignored", job(S.RUNNING), m.PlanFailed("x"), S.RUNNING, []),
    # ---- spares
    ("a spare stands by", job(S.RUNNING), m.SpareJoined(D, "d", 2), S.RUNNING, ["StandBy"]),
    (
        "a spare not in the hosts file is refused",
        job(S.RUNNING),
        m.SpareJoined("10.9.9.9", "d", 2),
        S.RUNNING,
        ["Refuse"],
    ),
    ("a spare with other files is refused", job(S.RUNNING), m.SpareJoined(D, "x", 2), S.RUNNING, ["Refuse"]),
    ("a spare named after a running host is refused", job(S.RUNNING), m.SpareJoined(B, "d", 2), S.RUNNING, ["Refuse"]),
    (
        "a spare twice is refused",
        job(S.RUNNING, spares=frozenset({D})),
        m.SpareJoined(D, "d", 2),
        S.RUNNING,
        ["Refuse"],
    ),
    (
        "a lost host back",
        job(S.RUNNING, lost=frozenset({D})),
        m.SpareJoined(D, "d", 2),
        S.RUNNING,
        ["StandBy", "HostBack"],
    ),
    ("a spare after the end is told", job(S.ENDED), m.SpareJoined(D, "d", 2), S.ENDED, ["Dismiss"]),
    ("a spare after the abort is told", job(S.ABORTED, reason="x"), m.SpareJoined(D, "d", 2), S.ABORTED, ["Dismiss"]),
    ("a spare gone is lost", job(S.RUNNING, spares=frozenset({D})), m.SpareGone(D), S.RUNNING, ["SpareLost"]),
    ("a spare already let go", job(S.RUNNING), m.SpareGone(D), S.RUNNING, []),
    # ---- over
    ("after the end nothing fails", job(S.ENDED), m.ProcessFailed(B, 0, "x"), S.ENDED, []),
    ("after the abort nothing settles", job(S.ABORTED, reason="x"), m.HostGone(B, 0), S.ABORTED, []),
    ("after the abort no beat", job(S.ABORTED, reason="x"), m.Tick(), S.ABORTED, []),
    ("a late joiner after the end is refused", job(S.ENDED), m.Joined(B, "d"), S.ENDED, ["Refuse"]),
    ("a late joiner hears the abort", job(S.ABORTED, reason="x"), m.Joined(B, "d"), S.ABORTED, ["Refuse"]),
    ("after the abort no host leaves", job(S.ABORTED, reason="x"), m.LeaveAsked(B, 60, 2), S.ABORTED, ["LeaveAnswer"]),
    ("after the end a host gone is noted", job(S.ENDED), m.HostGone(B, 0), S.ENDED, []),
    ("after the end a silent host is noted", job(S.ENDED), m.HostSilent(B, 0, 30), S.ENDED, []),
    ("after the abort a silent host is noted", job(S.ABORTED, reason="x"), m.HostSilent(B, 0, 30), S.ABORTED, []),
    ("after the end a spare gone is forgotten", job(S.ENDED, spares=frozenset({D})), m.SpareGone(D), S.ENDED, []),
    (
        "after the abort a spare gone is forgotten",
        job(S.ABORTED, reason="x", spares=frozenset({D})),
        m.SpareGone(D),
        S.ABORTED,
        [],
    ),
    ("after the end a host done is noted", job(S.ENDED), m.Done(A, 0), S.ENDED, []),
    ("after the abort a host done is noted", job(S.ABORTED, reason="x"), m.Done(A, 0), S.ABORTED, []),
    # ---- measured rates (launch/gauge.py); the plan follows the job (--adapt)
    ("the running round's rates are kept", job(S.RUNNING), m.Measured(RATES), S.RUNNING, []),
    ("a proposal no better: the job stays", job(S.RUNNING), m.Proposed(PROPOSAL), S.RUNNING, []),
    # ---- what else a round meets while it joins, settles or is re-planned
    ("a spare stands by while the round joins", job(), m.SpareJoined(D, "d", 0), S.JOINING, ["StandBy"]),
    ("a spare gone while the round joins", job(spares=frozenset({D})), m.SpareGone(D), S.JOINING, ["SpareLost"]),
    ("a host done before the start is noted", job(), m.Done(A, 0), S.JOINING, []),
    ("a host joining while a failure settles is refused", job(**SETTLING), m.Joined(A, "d"), S.SETTLING, ["Refuse"]),
    ("a spare stands by while a failure settles", job(**SETTLING), m.SpareJoined(D, "d", 1), S.SETTLING, ["StandBy"]),
    (
        "a leave asked while a failure settles goes with it",
        job(**SETTLING),
        m.LeaveAsked(B, 60, 1),
        S.SETTLING,
        ["LeaveAnswer", "LeaveNoted"],
    ),
    ("a host gone while settling is counted", job(**SETTLING), m.HostGone(C, 0), S.SETTLING, []),
    (
        "a spare gone while settling is lost",
        job(**SETTLING, spares=frozenset({D})),
        m.SpareGone(D),
        S.SETTLING,
        ["SpareLost"],
    ),
    ("a host joining while re-planning is refused", job(**MOVING), m.Joined(A, "d"), S.REPLANNING, ["Refuse"]),
    ("a spare stands by while re-planning", job(**MOVING), m.SpareJoined(D, "d", 1), S.REPLANNING, ["StandBy"]),
    (
        "a leave asked while re-planning waits for the next round",
        job(**MOVING),
        m.LeaveAsked(B, 60, 1),
        S.REPLANNING,
        ["LeaveAnswer", "LeaveNoted"],
    ),
    ("a host gone while re-planning is noted", job(**MOVING), m.HostGone(C, 0), S.REPLANNING, []),
    ("a silent host while re-planning is noted", job(**MOVING), m.HostSilent(C, 0, 30), S.REPLANNING, []),
    (
        "a spare gone while re-planning is lost",
        job(**MOVING, spares=frozenset({D})),
        m.SpareGone(D),
        S.REPLANNING,
        ["SpareLost"],
    ),
    (
        "the last trainer host done while re-planning: the end",
        job(**MOVING, done=frozenset({A})),
        m.Done(B, 0),
        S.ENDED,
        ["EndAll"],
    ),
]

# The (state, event) pairs no row above covers: each does nothing, for the reason given (test_ignored_pairs checks
# that the machine really leaves the job as it was and asks for nothing).
OVER = "the job is over: nothing follows from it"
NOT_ASKED = "no new round was asked for: an answer nobody waits for"
ONLY_RUNNING = "a checkpoint moves the job, or lets a host go, only while a round runs"
IGNORED = {
    (S.JOINING, m.CheckpointComplete): ONLY_RUNNING + " (a joining round resumes from the newest anyway)",
    (S.JOINING, m.Planned): NOT_ASKED,
    (S.JOINING, m.PlanFailed): NOT_ASKED,
    (S.SETTLING, m.CheckpointComplete): ONLY_RUNNING + " (the settling decides the next round)",
    (S.SETTLING, m.Planned): NOT_ASKED,
    (S.SETTLING, m.PlanFailed): NOT_ASKED,
    (S.REPLANNING, m.ProcessFailed): "the next round is being planned: the round that failed ends with it",
    (S.REPLANNING, m.CheckpointComplete): ONLY_RUNNING + " (a new round is being planned)",
    (S.REPLANNING, m.Tick): "re-planning waits for its answer, which the shell gives in the same step",
    (S.ENDED, m.CheckpointComplete): OVER,
    (S.ENDED, m.Tick): OVER,
    (S.ENDED, m.Planned): OVER,
    (S.ENDED, m.PlanFailed): OVER,
    (S.ABORTED, m.ProcessFailed): OVER,
    (S.ABORTED, m.CheckpointComplete): OVER,
    (S.ABORTED, m.Planned): OVER,
    (S.ABORTED, m.PlanFailed): OVER,
}
# one event of each kind, for the ignored pairs
SAMPLE = {
    m.Joined: m.Joined(B, "d"),
    m.SpareJoined: m.SpareJoined(D, "d", 1),
    m.LeaveAsked: m.LeaveAsked(B, 60, 1),
    m.ProcessFailed: m.ProcessFailed(B, 0, "x"),
    m.HostGone: m.HostGone(B, 0),
    m.HostSilent: m.HostSilent(B, 0, 30),
    m.SpareGone: m.SpareGone(D),
    m.Done: m.Done(A, 0),
    m.CheckpointComplete: m.CheckpointComplete(9),
    m.Tick: m.Tick(),
    m.Planned: planned(),
    m.PlanFailed: m.PlanFailed("x"),
    m.Measured: m.Measured(RATES),
    m.Proposed: m.Proposed(PROPOSAL),
}
NOT_RUNNING = "a round that does not run (yet, or any more) has no rates of a plan being run"
IGNORED.update({(state, m.Measured): NOT_RUNNING for state in S if state is not S.RUNNING})
IGNORED.update({(state, m.Proposed): NOT_RUNNING for state in S if state is not S.RUNNING})
IN_STATE = {S.SETTLING: SETTLING, S.REPLANNING: MOVING, S.ABORTED: {"reason": "x"}}


@pytest.mark.parametrize("name,before,event,state,actions", TABLE, ids=[row[0] for row in TABLE])
def test_transition(name, before, event, state, actions):
    after, done = m.step(before, event, NOW)
    assert after.state is state, (name, after)
    assert kinds(done) == actions, (name, done)


def test_every_state_and_event_pair_is_decided():
    """Each (state, event) pair is a row of the table or ignored with its reason: a new event or state fails here
    until its pairs are named."""
    assert set(m.EVENTS) == set(m._HANDLERS) == set(SAMPLE)
    rows = {(row[1].state, type(row[2])) for row in TABLE}
    pairs = {(state, event) for state in S for event in m.EVENTS}
    undecided = sorted(f"{state.name} x {event.__name__}" for state, event in pairs - rows - set(IGNORED))
    assert not undecided, f"(state, event) pairs neither in TABLE nor in IGNORED: {undecided}"
    assert not rows & set(IGNORED), "a pair both in TABLE and in IGNORED"


@pytest.mark.parametrize(
    "state,event",
    sorted(IGNORED, key=lambda pair: (pair[0].name, pair[1].__name__)),
    ids=lambda x: getattr(x, "name", getattr(x, "__name__", "")),
)
def test_ignored_pairs_change_nothing(state, event):
    before = job(**{"state": state, **IN_STATE.get(state, {})})
    after, actions = m.step(before, SAMPLE[event], NOW)
    assert after == before and actions == [], IGNORED[(state, event)]


def text(action, j):
    return render.line(action, j)


def test_a_full_job_restart_then_move_then_end():
    """Round 0 on A, B, C; C lost: a restart without it; C back: a move at the next checkpoint; then the end.  A
    move uses up no restart; the history (the event log's round_planned records, restarts.json) says each."""
    j = job(restarts=1, retries=0)
    for host in (A, B, C):
        j, _ = m.step(j, m.Joined(host, "d"), NOW)
    assert j.state is S.RUNNING and j.seen.started
    j, _ = m.step(j, m.HostGone(C, 0), NOW)
    j, actions = m.step(j, m.Tick(), NOW + 6)
    assert actions == [m.Replan(frozenset({C}), m.Kind.RESTART)]
    j, actions = m.step(j, planned(), NOW + 6)
    (new_round,) = actions
    assert isinstance(new_round, m.NextRound) and new_round.round.number == 1
    assert render.message(new_round) == {
        "op": "restart",
        "round": 1,
        "plan": {"stages": ["new"]},
        "lost": [C],
        "why": j.history[0].why,
        "joined": [],
        "left": [],
        "released": {},
    }
    assert j.round.restarts_used == 1 and j.restarts_left == 0 and j.round.resumes_from == "ckpt/pass-000002"
    assert j.seen == m.Seen(startup_deadline=NOW + 6 + 60.0)  # a new round has seen nothing yet
    assert "restart 1 (0 left; round 1): lost " + C in text(new_round, j)
    for host in (A, B):
        j, _ = m.step(j, m.Joined(host, "d2"), NOW + 7)
    assert j.state is S.RUNNING
    j, _ = m.step(j, m.SpareJoined(C, "d", 2), NOW + 8)
    assert j.lost == frozenset() and j.back == {C: 2}
    j, _ = m.step(j, m.CheckpointComplete(3), NOW + 9)
    j, actions = m.step(j, planned(members={A: True, B: True, C: False}), NOW + 9)
    assert j.round.number == 2 and j.round.restarts_used == 1
    assert "moving to another plan (round 2)" in text(actions[0], j)
    assert [change.kind for change in j.history] == [m.Kind.RESTART, m.Kind.MOVE]
    assert j.history[1].lost == () and j.history[0].lost == (C,)
    assert j.history[0].to_dict()["passes_done"] == 2 and j.history[0].to_dict()["kind"] == "restart"
    for host in (A, B, C):
        j, _ = m.step(j, m.Joined(host, "d2"), NOW + 10)
    j, _ = m.step(j, m.Done(A, 2), NOW + 11)
    j, actions = m.step(j, m.Done(B, 2), NOW + 11)
    assert j.state is S.ENDED and actions == [m.EndAll()]


def test_a_retry_uses_up_a_retry_and_keeps_restarts():
    j = job(S.RUNNING, restarts=1, retries=2)
    j, actions = m.step(j, m.ProcessFailed(B, 0, "aborted", connect_timeout=True), NOW)
    assert actions == [m.Settling("host 10.0.0.2: aborted", m.Kind.RETRY, 2)]
    assert "2 retry(-ies) of this abort left" in text(actions[0], j) and "1 restart" not in text(actions[0], j)
    j, actions = m.step(j, m.Tick(), NOW + 5)
    assert actions == [m.Replan(frozenset(), m.Kind.RETRY)]
    j, actions = m.step(j, planned(), NOW + 5)
    assert (j.round.retries_used, j.round.restarts_used, j.retries_left, j.restarts_left) == (1, 0, 1, 1)
    assert "retry 1 after Paddle's connect-timeout abort (1 left; round 1)" in text(actions[0], j)
    assert j.history[-1].kind is m.Kind.RETRY and j.history[-1].lost == ()


def test_a_host_lost_while_a_retry_settles_makes_it_a_restart():
    j = job(S.RUNNING, restarts=1, retries=2)
    j, _ = m.step(j, m.ProcessFailed(B, 0, "aborted", connect_timeout=True), NOW)
    j, _ = m.step(j, m.HostGone(C, 0), NOW + 1)
    assert j.seen.trouble[-1].startswith(f"host {C}'s heterps launch went away")
    j, actions = m.step(j, m.Tick(), NOW + 5)
    assert actions == [m.Replan(frozenset({C}), m.Kind.RESTART)]


def test_the_abort_reason_names_what_happened():
    j, actions = m.step(job(), m.Joined(B, "x"), NOW)
    assert f"host {B} was given another plan or hosts file than {A}" in j.reason
    # each host named with its own digest: the line reads right on the refused host's console too
    assert f"digest x on {B}, d on {A} (the coordinator's host)" in j.reason
    assert actions == [m.AbortAll(j.reason)] and render.message(actions[0]) == {"op": "abort", "reason": j.reason}
    j, _ = m.step(job(startup_deadline=NOW - 1, joined=frozenset({A})), m.Tick(), NOW)
    assert f"hosts {B}, {C} never joined the launch within 60 s" in j.reason
    j, _ = m.step(job(**RESTARTING), m.PlanFailed("no room"), NOW)
    assert j.reason == "host B: x; the job cannot go on with what is left: no room"
    j, _ = m.step(job(**{**SETTLING, "settle_at": NOW}, gone=frozenset({A})), m.Tick(), NOW)
    assert "the coordinator's own host cannot be replaced" in j.reason
    # a late joiner hears the abort's reason
    _, actions = m.step(replace(j, seen=replace(j.seen, joined=frozenset())), m.Joined(B, "d"), NOW)
    assert actions == [m.Refuse(B, j.reason)]


def test_one_host_is_the_machine_with_one_member_retried_as_often_as_allowed(tmp_path):
    """The one-host launch (launch/driver.py: OneHost) drives the same machine: each attempt joins, a connect-timeout
    abort is retried while retries are left (every round anew), then the job fails like any other failure."""
    from heterps_paddle.launch.driver import LOCAL_ADDRESS, OneHost
    from heterps_paddle.launch.event_log import EventLog, read

    rules = m.Rules(connect_retries=2, settle_s=0.0)
    host = OneHost.__new__(OneHost)  # only its machine: no launch options, no console
    host.log = EventLog(str(tmp_path))
    host.job = m.first_job(rules, m.Round(0, {LOCAL_ADDRESS: True}, LOCAL_ADDRESS, ""), NOW)
    said = []
    for attempt in range(3):
        said += host._drive(m.Joined(LOCAL_ADDRESS, ""))
        assert host.job.state is S.RUNNING
        said += host._drive(m.ProcessFailed(LOCAL_ADDRESS, host.job.round.number, "abort", connect_timeout=True))
        said += host._drive(m.Tick())
        if attempt < 2:
            assert host.job.state is S.JOINING and host.job.round.retries_used == attempt + 1, host.job
    assert host.job.state is S.ABORTED and host.job.round.retries_used == 2
    assert any("retry 2 after Paddle's connect-timeout abort (0 left; round 2)" in line for line in said)
    kinds_logged = [r["type"] for r in read(str(tmp_path))]
    assert kinds_logged.count("round_planned") == 2 and kinds_logged[-1] == "job_aborted", kinds_logged
    # a clean end ends
    host.job = m.first_job(rules, m.Round(0, {LOCAL_ADDRESS: True}, LOCAL_ADDRESS, ""), NOW)
    host._drive(m.Joined(LOCAL_ADDRESS, ""))
    host._drive(m.Done(LOCAL_ADDRESS, 0))
    assert host.job.state is S.ENDED


def test_a_machine_from_outside_the_file_joins_then_leaves_without_a_restart():
    """Round 0 on A, B, C; E (never in the hosts file) joins as a GPU: at the next checkpoint the job moves to a plan
    with it, and every host is told what E is; then E asks to leave: a checkpoint, a round without it, no restart
    used, and E's launch is told it left."""
    j = job(restarts=1, retries=0)
    for host in (A, B, C):
        j, _ = m.step(j, m.Joined(host, "d"), NOW)
    j, actions = m.step(j, m.SpareJoined(E, "d", 1, GPU), NOW + 1)
    assert j.extra == {E: GPU} and j.back == {E: 1} and E in j.seen.spares
    assert actions == [m.StandBy(E, 0), m.HostBack(E, GPU, moves=True)]
    assert "host 10.0.0.5 (1 x gpu_fast) joined the job from outside the hosts file" in text(actions[-1], j)
    j, actions = m.step(j, m.CheckpointComplete(2), NOW + 2)
    assert actions == [m.Replan(frozenset(), m.Kind.MOVE, {E: GPU})]
    j, actions = m.step(j, planned(members={A: True, B: True, E: False}), NOW + 2)
    (new_round,) = actions
    assert render.message(new_round)["joined"] == [{"address": E, **GPU}] and render.message(new_round)["left"] == []
    assert j.history[-1].kind is m.Kind.MOVE and j.history[-1].joined == ({"address": E, **GPU},)
    assert j.round.joined == frozenset({E}) and j.round.restarts_used == 0
    for host in (A, B, E):
        j, _ = m.step(j, m.Joined(host, "d2"), NOW + 3)
    assert j.state is S.RUNNING
    j, actions = m.step(j, m.LeaveAsked(E, 60, 2), NOW + 4)
    assert actions[0] == m.LeaveAnswer(E, True, actions[0].reason) and isinstance(actions[-1], m.AskCheckpoint)
    assert actions[-1].hold_s == 60  # the round ends at it: its trainers train no further, for the grace at most
    j, actions = m.step(j, m.CheckpointComplete(2.5), NOW + 5)  # inside pass 3: newer than the notice's
    assert actions == [m.Replan(frozenset({E}), m.Kind.LEAVE, {E: GPU})]
    j, actions = m.step(j, planned(members={A: True, B: True}), NOW + 5)
    assert "going on without the host(s) that left (round 2)" in text(actions[0], j)
    assert render.message(actions[-1])["left"] == [E] and render.message(actions[-1])["lost"] == [E]
    assert j.history[-1].kind is m.Kind.LEAVE and j.history[-1].left == (E,) and j.history[-1].lost == ()
    assert j.round.restarts_used == 0 and j.restarts_left == 1 and not j.leaving
    # it can come back like any host lost: its launch again, with --join
    for host in (A, B):
        j, _ = m.step(j, m.Joined(host, "d2"), NOW + 6)
    j, actions = m.step(j, m.SpareJoined(E, "d", 3, GPU), NOW + 7)
    assert j.back == {E: 3} and E not in j.lost and "host 10.0.0.5 is back" in text(actions[-1], j)


def test_a_leaving_host_that_dies_first_is_an_ordinary_loss():
    j = job(S.RUNNING, restarts=1, leaving={B: (NOW + 60, 2)})
    j, _ = m.step(j, m.HostGone(B, 0), NOW)
    assert j.state is S.SETTLING
    j, actions = m.step(j, m.Tick(), NOW + 6)
    assert actions == [m.Replan(frozenset({B}), m.Kind.RESTART)] and not j.leaving


def test_a_host_that_asked_to_leave_goes_with_a_failure_being_settled_and_is_told_it_left():
    """Paddle's connect-timeout abort settling while B asked to leave: a leave (a plan without B, no restart, no
    retry used), and B is told it left; with a host lost as well, a restart that B leaves with."""
    j = job(S.RUNNING, restarts=0, retries=1, leaving={B: (NOW + 60, 2)})
    j, _ = m.step(j, m.ProcessFailed(A, 0, "aborted", connect_timeout=True), NOW)
    j, actions = m.step(j, m.Tick(), NOW + 5)
    assert actions == [m.Replan(frozenset({B}), m.Kind.LEAVE)] and j.seen.pending.left == (B,)
    j, actions = m.step(j, planned(members={A: True}), NOW + 5)
    assert render.message(actions[-1])["left"] == [B] and j.round.restarts_used == 0
    assert j.history[-1].kind is m.Kind.LEAVE
    j = job(S.RUNNING, restarts=1, leaving={B: (NOW + 60, 2)})
    j, _ = m.step(j, m.HostGone(C, 0), NOW)
    j, actions = m.step(j, m.Tick(), NOW + 5)
    assert actions == [m.Replan(frozenset({B, C}), m.Kind.RESTART)] and j.seen.pending.left == (B,)
    assert j.seen.pending.lost_now == (C,)


def test_a_retry_keeps_the_rounds_machines_and_a_round_that_takes_a_joiner_in_forgets_its_move():
    j = job(S.RUNNING, restarts=1, retries=1, extra={E: GPU}, back={E: 1}, spares=frozenset({E}))
    j, _ = m.step(j, m.ProcessFailed(B, 0, "aborted", connect_timeout=True), NOW)
    j, actions = m.step(j, m.Tick(), NOW + 5)
    assert actions == [m.Replan(frozenset(), m.Kind.RETRY, {})]  # E waits for a plan made with it
    j = job(S.RUNNING, restarts=1, extra={E: GPU}, back={E: 1})
    j, _ = m.step(j, m.HostGone(C, 0), NOW)
    j, actions = m.step(j, m.Tick(), NOW + 5)
    assert actions == [m.Replan(frozenset({C}), m.Kind.RESTART, {E: GPU})]
    j, _ = m.step(j, planned(members={A: True, B: True, E: False}), NOW + 5)
    assert j.back == {} and j.history[-1].joined == ({"address": E, **GPU},)


def test_without_checkpoints_a_leave_asked_while_joining_goes_at_the_start():
    j = job(joined=frozenset({A, B}), checkpoints=False)
    j, actions = m.step(j, m.LeaveAsked(C, 60, 0), NOW)
    assert kinds(actions) == ["LeaveAnswer"] and C in j.leaving
    j, actions = m.step(j, m.Joined(C, "d"), NOW + 1)
    assert kinds(actions) == ["Start", "Replan"] and j.state is S.REPLANNING


def test_every_action_has_its_words_and_every_job_fact_its_record():
    """The shells render every action the machine can ask for (launch/render.py, launch/event_log.py): a wire
    message for what a peer is told, a console line for every note, a record for every fact of the job's life."""
    from heterps_paddle.launch.event_log import SCHEMA, record_of

    j = job(S.RUNNING)
    told = [m.Refuse(B, "x"), m.StandBy(D, 0), m.LeaveAnswer(B, True, "x"), m.Dismiss(D, m.Dismissal.LEFT)]
    told += [m.EndAll(), m.AbortAll("x")]
    for action in told:
        assert render.message(action)["op"] in ("abort", "standby", "leave", "end")
    notes = {
        m.Settling: m.Settling("x", m.Kind.RESTART, 1),
        m.HostBack: m.HostBack(D, None, True),
        m.SpareLeft: m.SpareLeft(D),
        m.SpareLost: m.SpareLost(D),
        m.LeaveNoted: m.LeaveNoted(B, 60),
        m.MoveDeclined: m.MoveDeclined((D,), "p"),
        m.MoveImpossible: m.MoveImpossible((D,), "x"),
        m.AdaptAdvice: m.AdaptAdvice("move", "x", PROPOSAL),
        m.ReplaceAdvice: m.ReplaceAdvice("replace", "x", m.Replacement(B, "cpu_small", 1.0, 0.3, 3)),
    }
    assert set(notes) == set(m.NOTES)  # a new note fails here until it has its words and record
    for note in notes.values():
        assert render.line(note, j).startswith("heterps launch: ")
        kind, fields = record_of(note, j)
        assert set(SCHEMA[kind]) <= set(fields), kind


def test_the_newest_rates_of_the_running_round_are_kept_and_an_earlier_rounds_are_not():
    j, _ = m.step(job(S.RUNNING), m.Measured(RATES), NOW)
    assert j.measured is RATES
    late = window(1.0, round_number=-1)  # measured before a new round started
    assert m.step(j, m.Measured(late), NOW)[0].measured is RATES


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
    for i, window in enumerate(windows):
        j, actions = m.step(j, m.Measured(window), start + i * every)
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
    j, _ = m.step(j, m.Measured(rates(600.0), whole=False), NOW)  # a round's first, shorter window
    assert j.seen.windows == ()
    j, said = feed(j, [600.0] * 9, start=NOW + 10)
    asks = [a for a in said if isinstance(a, m.Reconsider)]
    assert asks and len(asks[-1].windows) == m.WINDOWS_KEPT
    assert all(w.samples_per_s == 600.0 for w in asks[-1].windows)


def test_without_a_target_or_budget_a_plan_cheaper_per_sample_at_no_lower_rate_moves():
    """(e) the job's objective is its cost per sample: the proposal at no lower rate for at least ``saving`` less a
    sample, its saving over the horizon beating the move's cost, moves; slower, or too little cheaper, does not."""
    free = dict(target=None, meets_target=True, current_samples_per_s=1000.0, current_cost_per_hour=4.0)
    j, (ask,) = m.step(adaptive(newest_checkpoint=5), m.Measured(rates(1000.0, target=None)), NOW)
    assert "trains a sample for less at no lower rate" in ask.why and not ask.missed
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
