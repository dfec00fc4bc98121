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
