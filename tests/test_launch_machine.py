"""The job's state machine (launch/machine.py), transition by transition: every event in every state it can meet,
with the state it leads to and the actions it asks for.  Pure: no sockets, no processes, time given."""

from dataclasses import replace

import pytest

from heterps_paddle.launch import machine as m

A, B, C, D = "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"  # names only: nothing is sent anywhere
E = "10.0.0.5"  # not in the hosts file
GPU = {"type": "gpu_fast", "units": 1}
S = m.JobState
NOW = 1000.0


def job(state=S.JOINING, restarts=1, retries=1, checkpoints=True, can_replan=True, **fields):
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
    if state is not S.JOINING:
        base = replace(base, joined=frozenset({A, B, C}))
    return replace(base, state=state, **fields)


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


SETTLING = dict(state=S.SETTLING, settle_at=NOW + 1, trouble=("host B: x",))
RETRY_SETTLING = dict(state=S.SETTLING, settle_at=NOW, trouble=("host B: abort",), retry_settling=True)
MOVING = dict(state=S.REPLANNING, pending=m.Change(m.Kind.MOVE, frozenset(), (), "host(s) D back", back=(D,)))
RESTARTING = dict(state=S.REPLANNING, pending=m.Change(m.Kind.RESTART, frozenset({B}), (B,), "host B: x"))

# name, the job before, the event, the state after, the actions
TABLE = [
    # ---- joining
    ("a member joins", job(), m.Joined(A, "d"), S.JOINING, []),
    ("the last member joins: start", job(joined=frozenset({A, B})), m.Joined(C, "d"), S.RUNNING, ["Start"]),
    ("another digest ends the launch", job(), m.Joined(B, "x"), S.ABORTED, ["Tell"]),
    ("a stranger is refused", job(), m.Joined(D, "d"), S.JOINING, ["Refuse"]),
    ("a host joined twice is refused", job(joined=frozenset({A})), m.Joined(A, "d"), S.JOINING, ["Refuse"]),
    ("a late joiner is refused", job(S.RUNNING), m.Joined(A, "d"), S.RUNNING, ["Refuse"]),
    ("a host gone before the start ends it", job(), m.HostGone(B, 0), S.ABORTED, ["Tell"]),
    ("a failure before the start ends it", job(), m.ProcessFailed(B, 0, "x", True), S.ABORTED, ["Tell"]),
    ("the startup deadline ends it", job(startup_deadline=NOW - 1), m.Tick(), S.ABORTED, ["Tell"]),
    ("joining beats", job(), m.Tick(), S.JOINING, ["Beat"]),
    ("silent before the start: the deadline rules", job(), m.HostSilent(B, 0, 30), S.JOINING, []),
    # ---- running
    ("running beats", job(S.RUNNING), m.Tick(), S.RUNNING, ["Beat"]),
    ("a failure with restarts settles", job(S.RUNNING), m.ProcessFailed(B, 0, "x"), S.SETTLING, ["Say"]),
    ("a failure without restarts ends", job(S.RUNNING, restarts=0), m.ProcessFailed(B, 0, "x"), S.ABORTED, ["Tell"]),
    (
        "the connect-timeout abort without restarts settles for a retry",
        job(S.RUNNING, restarts=0),
        m.ProcessFailed(B, 0, "x", retryable=True),
        S.SETTLING,
        ["Say"],
    ),
    (
        "the abort with no retries left ends",
        job(S.RUNNING, restarts=0, retries=0),
        m.ProcessFailed(B, 0, "x", retryable=True),
        S.ABORTED,
        ["Tell"],
    ),
    ("without a re-planner any failure ends", job(S.RUNNING, can_replan=False), m.HostGone(B, 0), S.ABORTED, ["Tell"]),
    ("a host gone settles", job(S.RUNNING), m.HostGone(B, 0), S.SETTLING, ["Say"]),
    ("a silent host settles", job(S.RUNNING), m.HostSilent(B, 0, 30), S.SETTLING, ["Say"]),
    ("an earlier round's failure is ignored", job(S.RUNNING), m.ProcessFailed(B, -1, "x"), S.RUNNING, []),
    ("an earlier round's host gone is ignored", job(S.RUNNING), m.HostGone(B, -1), S.RUNNING, []),
    ("a trainer host done", job(S.RUNNING), m.Done(A, 0), S.RUNNING, []),
    ("the last trainer host done: the end", job(S.RUNNING, done=frozenset({A})), m.Done(B, 0), S.ENDED, ["Tell"]),
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
    ("a stranger with a type stands by", job(S.RUNNING), m.SpareJoined(E, "d", 2, GPU), S.RUNNING, ["Reply", "Say"]),
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
        ["Reply", "Say", "AskCheckpoint"],
    ),
    ("the coordinator's host cannot leave", job(S.RUNNING), m.LeaveAsked(A, 60, 2), S.RUNNING, ["Reply"]),
    ("a host of no round cannot leave", job(S.RUNNING), m.LeaveAsked(D, 60, 2), S.RUNNING, ["Reply"]),
    (
        "a spare leaves at once",
        job(S.RUNNING, spares=frozenset({D})),
        m.LeaveAsked(D, 60, 2),
        S.RUNNING,
        ["Reply", "LetGo", "Say"],
    ),
    ("leaving while joining waits for the start", job(), m.LeaveAsked(B, 60, 2), S.JOINING, ["Reply", "Say"]),
    ("after the end no host leaves", job(S.ENDED), m.LeaveAsked(B, 60, 2), S.ENDED, ["Reply"]),
    (
        "without checkpoints a leave re-plans at once",
        job(S.RUNNING, checkpoints=False),
        m.LeaveAsked(B, 60, 0),
        S.REPLANNING,
        ["Reply", "Replan"],
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
        ["Tell"],
    ),
    (
        "settled with the coordinator's host lost: the end",
        job(**{**SETTLING, "settle_at": NOW}, gone=frozenset({A})),
        m.Tick(),
        S.ABORTED,
        ["Tell"],
    ),
    (
        "settled, restarts spent: the end",
        job(**{**SETTLING, "settle_at": NOW}, restarts=0, silent=frozenset({B})),
        m.Tick(),
        S.ABORTED,
        ["Tell"],
    ),
    ("a host silent while settling is counted", job(**SETTLING), m.HostSilent(B, 0, 30), S.SETTLING, []),
    ("done while settling may end the job", job(**SETTLING, done=frozenset({A})), m.Done(B, 0), S.ENDED, ["Tell"]),
    # ---- re-planning
    ("a restart planned: the next round", job(**RESTARTING), planned(), S.JOINING, ["Say", "NextRound"]),
    ("a restart with no plan ends", job(**RESTARTING), m.PlanFailed("no room"), S.ABORTED, ["Tell"]),
    ("a re-planning bug ends", job(**RESTARTING), m.PlanFailed("KeyError: x", expected=False), S.ABORTED, ["Tell"]),
    ("a better plan with a host back: move", job(**MOVING), planned(), S.JOINING, ["Say", "NextRound"]),
    ("no better plan: the job goes on", job(**MOVING), planned(better=False), S.RUNNING, ["Say"]),
    ("no plan with the host back: the job goes on", job(**MOVING), m.PlanFailed("x"), S.RUNNING, ["Say"]),
    ("a plan nobody asked for is ignored", job(S.RUNNING), planned(), S.RUNNING, []),
    ("a plan failure nobody asked for is ignored", job(S.RUNNING), m.PlanFailed("x"), S.RUNNING, []),
    # ---- spares
    ("a spare stands by", job(S.RUNNING), m.SpareJoined(D, "d", 2), S.RUNNING, ["Reply"]),
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
    ("a lost host back", job(S.RUNNING, lost=frozenset({D})), m.SpareJoined(D, "d", 2), S.RUNNING, ["Reply", "Say"]),
    ("a spare after the end is told", job(S.ENDED), m.SpareJoined(D, "d", 2), S.ENDED, ["Reply"]),
    ("a spare after the abort is told", job(S.ABORTED, reason="x"), m.SpareJoined(D, "d", 2), S.ABORTED, ["Reply"]),
    ("a spare gone is lost", job(S.RUNNING, spares=frozenset({D})), m.SpareGone(D), S.RUNNING, ["Say"]),
    ("a spare already let go", job(S.RUNNING), m.SpareGone(D), S.RUNNING, []),
    # ---- over
    ("after the end nothing fails", job(S.ENDED), m.ProcessFailed(B, 0, "x"), S.ENDED, []),
    ("after the abort nothing settles", job(S.ABORTED, reason="x"), m.HostGone(B, 0), S.ABORTED, []),
    ("after the abort no beat", job(S.ABORTED, reason="x"), m.Tick(), S.ABORTED, []),
]


@pytest.mark.parametrize("name,before,event,state,actions", TABLE, ids=[row[0] for row in TABLE])
def test_transition(name, before, event, state, actions):
    after, done = m.step(before, event, NOW)
    assert after.state is state, (name, after)
    assert kinds(done) == actions, (name, done)


def test_every_event_and_state_is_in_the_table():
    events = {type(row[2]) for row in TABLE}
    assert events == set(m._HANDLERS), set(m._HANDLERS) - events
    assert {row[3] for row in TABLE} == set(S)
    assert {row[1].state for row in TABLE} == set(S)


def test_a_full_job_restart_then_move_then_end():
    """Round 0 on A, B, C; C lost: a restart without it; C back: a move at the next checkpoint; then the end.  A
    move uses up no restart; restarts.json's history says each."""
    j = job(restarts=1, retries=0)
    for host in (A, B, C):
        j, _ = m.step(j, m.Joined(host, "d"), NOW)
    assert j.state is S.RUNNING
    j, _ = m.step(j, m.HostGone(C, 0), NOW)
    j, actions = m.step(j, m.Tick(), NOW + 6)
    assert actions == [m.Replan(frozenset({C}), m.Kind.RESTART)]
    j, actions = m.step(j, planned(), NOW + 6)
    new_round = actions[-1]
    assert isinstance(new_round, m.NextRound) and new_round.round.number == 1
    assert new_round.message == {
        "op": "restart",
        "round": 1,
        "plan": {"stages": ["new"]},
        "lost": [C],
        "why": j.history[0]["why"],
        "joined": [],
        "left": [],
    }
    assert j.round.restarts_used == 1 and j.restarts_left == 0 and j.round.resumes_from == "ckpt/pass-000002"
    assert "restart 1 (0 left; round 1): lost " + C in actions[0].text
    for host in (A, B):
        j, _ = m.step(j, m.Joined(host, "d2"), NOW + 7)
    assert j.state is S.RUNNING
    j, _ = m.step(j, m.SpareJoined(C, "d", 2), NOW + 8)
    assert j.lost == frozenset() and j.back == {C: 2}
    j, _ = m.step(j, m.CheckpointComplete(3), NOW + 9)
    j, actions = m.step(j, planned(members={A: True, B: True, C: False}), NOW + 9)
    assert j.round.number == 2 and j.round.restarts_used == 1 and "moving to another plan (round 2)" in actions[0].text
    assert [event["kind"] for event in j.history] == ["restart", "move"]
    assert j.history[1]["lost"] == [] and j.history[0]["lost"] == [C] and j.history[0]["passes_done"] == 2
    for host in (A, B, C):
        j, _ = m.step(j, m.Joined(host, "d2"), NOW + 10)
    j, _ = m.step(j, m.Done(A, 2), NOW + 11)
    j, actions = m.step(j, m.Done(B, 2), NOW + 11)
    assert j.state is S.ENDED and actions == [m.Tell({"op": "end"})]


def test_a_retry_uses_up_a_retry_and_keeps_restarts():
    j = job(S.RUNNING, restarts=1, retries=2)
    j, actions = m.step(j, m.ProcessFailed(B, 0, "aborted", retryable=True), NOW)
    assert "1 restart" not in actions[0].text and "2 retry(-ies) of this abort left" in actions[0].text
    j, actions = m.step(j, m.Tick(), NOW + 5)
    assert actions == [m.Replan(frozenset(), m.Kind.RETRY)]
    j, actions = m.step(j, planned(), NOW + 5)
    assert (j.round.retries_used, j.round.restarts_used, j.retries_left, j.restarts_left) == (1, 0, 1, 1)
    assert "retry 1 after Paddle's connect-timeout abort (1 left; round 1)" in actions[0].text
    assert j.history[-1]["kind"] == "retry" and j.history[-1]["lost"] == []


def test_a_host_lost_while_a_retry_settles_makes_it_a_restart():
    j = job(S.RUNNING, restarts=1, retries=2)
    j, _ = m.step(j, m.ProcessFailed(B, 0, "aborted", retryable=True), NOW)
    j, _ = m.step(j, m.HostGone(C, 0), NOW + 1)
    assert j.trouble[-1].startswith(f"host {C}'s heterps launch went away")
    j, actions = m.step(j, m.Tick(), NOW + 5)
    assert actions == [m.Replan(frozenset({C}), m.Kind.RESTART)]


def test_the_abort_reason_names_what_happened():
    j, actions = m.step(job(), m.Joined(B, "x"), NOW)
    assert f"host {B} was given another plan or hosts file than {A}" in j.reason
    # each host named with its own digest: the line reads right on the refused host's console too
    assert f"digest x on {B}, d on {A} (the coordinator's host)" in j.reason
    j, _ = m.step(job(startup_deadline=NOW - 1, joined=frozenset({A})), m.Tick(), NOW)
    assert f"hosts {B}, {C} never joined the launch within 60 s" in j.reason
    j, _ = m.step(job(**RESTARTING), m.PlanFailed("no room"), NOW)
    assert j.reason == "host B: x; the job cannot go on with what is left: no room"
    j, _ = m.step(job(**{**SETTLING, "settle_at": NOW}, gone=frozenset({A})), m.Tick(), NOW)
    assert "the coordinator's own host cannot be replaced" in j.reason
    # a late joiner hears the abort's reason
    _, actions = m.step(replace(j, state=S.ABORTED, joined=frozenset()), m.Joined(B, "d"), NOW)
    assert actions == [m.Refuse(B, j.reason)]


def test_one_host_is_the_machine_with_one_member_retried_as_often_as_allowed():
    """The one-host launch (launch/driver.py) drives the same machine: each attempt joins, a connect-timeout abort
    is retried while retries are left (every round anew), then the job fails like any other failure."""
    from heterps_paddle.launch.driver import LOCAL_ADDRESS, _drive

    class Lines:
        def __init__(self):
            self.said = []

        def error(self, text):
            self.said.append(text)

    console = Lines()
    rules = m.Rules(connect_retries=2, settle_s=0.0)
    j = m.first_job(rules, m.Round(0, {LOCAL_ADDRESS: True}, LOCAL_ADDRESS, ""), NOW)
    for attempt in range(3):
        j, _ = _drive(j, m.Joined(LOCAL_ADDRESS, ""), console)
        assert j.state is S.RUNNING
        j, _ = _drive(j, m.ProcessFailed(LOCAL_ADDRESS, j.round.number, "abort", retryable=True), console)
        j, actions = _drive(j, m.Tick(), console)
        if attempt < 2:
            assert j.state is S.JOINING and j.round.retries_used == attempt + 1, j
            assert [type(a).__name__ for a in actions][-1] == "NextRound"
    assert j.state is S.ABORTED and j.round.retries_used == 2
    assert any("retry 2 after Paddle's connect-timeout abort (0 left; round 2)" in line for line in console.said)
    # a clean end ends
    j = m.first_job(rules, m.Round(0, {LOCAL_ADDRESS: True}, LOCAL_ADDRESS, ""), NOW)
    j, _ = _drive(j, m.Joined(LOCAL_ADDRESS, ""), console)
    j, _ = _drive(j, m.Done(LOCAL_ADDRESS, 0), console)
    assert j.state is S.ENDED


def test_a_machine_from_outside_the_file_joins_then_leaves_without_a_restart():
    """Round 0 on A, B, C; E (never in the hosts file) joins as a GPU: at the next checkpoint the job moves to a plan
    with it, and every host is told what E is; then E asks to leave: a checkpoint, a round without it, no restart
    used, and E's launch is told it left."""
    j = job(restarts=1, retries=0)
    for host in (A, B, C):
        j, _ = m.step(j, m.Joined(host, "d"), NOW)
    j, actions = m.step(j, m.SpareJoined(E, "d", 1, GPU), NOW + 1)
    assert j.extra == {E: GPU} and j.back == {E: 1} and E in j.spares
    assert "host 10.0.0.5 (1 x gpu_fast) joined the job from outside the hosts file" in actions[-1].text
    j, actions = m.step(j, m.CheckpointComplete(2), NOW + 2)
    assert actions == [m.Replan(frozenset(), m.Kind.MOVE, {E: GPU})]
    j, actions = m.step(j, planned(members={A: True, B: True, E: False}), NOW + 2)
    new_round = actions[-1]
    assert new_round.message["joined"] == [{"address": E, **GPU}] and new_round.message["left"] == []
    assert j.history[-1]["kind"] == "move" and j.history[-1]["joined"] == [{"address": E, **GPU}]
    assert j.round.joined == frozenset({E}) and j.round.restarts_used == 0
    for host in (A, B, E):
        j, _ = m.step(j, m.Joined(host, "d2"), NOW + 3)
    assert j.state is S.RUNNING
    j, actions = m.step(j, m.LeaveAsked(E, 60, 2), NOW + 4)
    assert actions[0] == m.Reply(E, {"op": "leave", "accepted": True, "reason": actions[0].message["reason"]})
    assert isinstance(actions[-1], m.AskCheckpoint)
    j, actions = m.step(j, m.CheckpointComplete(3), NOW + 5)
    assert actions == [m.Replan(frozenset({E}), m.Kind.LEAVE, {E: GPU})]
    j, actions = m.step(j, planned(members={A: True, B: True}), NOW + 5)
    assert "going on without the host(s) that left (round 2)" in actions[0].text
    assert actions[-1].message["left"] == [E] and actions[-1].message["lost"] == [E]
    assert j.history[-1]["kind"] == "leave" and j.history[-1]["left"] == [E] and j.history[-1]["lost"] == []
    assert j.round.restarts_used == 0 and j.restarts_left == 1 and not j.leaving
    # it can come back like any host lost: its launch again, with --join
    for host in (A, B):
        j, _ = m.step(j, m.Joined(host, "d2"), NOW + 6)
    j, actions = m.step(j, m.SpareJoined(E, "d", 3, GPU), NOW + 7)
    assert j.back == {E: 3} and E not in j.lost and "host 10.0.0.5 is back" in actions[-1].text


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
    j, _ = m.step(j, m.ProcessFailed(A, 0, "aborted", retryable=True), NOW)
    j, actions = m.step(j, m.Tick(), NOW + 5)
    assert actions == [m.Replan(frozenset({B}), m.Kind.LEAVE)] and j.pending.left == (B,)
    j, actions = m.step(j, planned(members={A: True}), NOW + 5)
    assert actions[-1].message["left"] == [B] and j.round.restarts_used == 0 and j.history[-1]["kind"] == "leave"
    j = job(S.RUNNING, restarts=1, leaving={B: (NOW + 60, 2)})
    j, _ = m.step(j, m.HostGone(C, 0), NOW)
    j, actions = m.step(j, m.Tick(), NOW + 5)
    assert actions == [m.Replan(frozenset({B, C}), m.Kind.RESTART)] and j.pending.left == (B,)
    assert j.pending.lost_now == (C,)


def test_a_retry_keeps_the_rounds_machines_and_a_round_that_takes_a_joiner_in_forgets_its_move():
    j = job(S.RUNNING, restarts=1, retries=1, extra={E: GPU}, back={E: 1}, spares=frozenset({E}))
    j, _ = m.step(j, m.ProcessFailed(B, 0, "aborted", retryable=True), NOW)
    j, actions = m.step(j, m.Tick(), NOW + 5)
    assert actions == [m.Replan(frozenset(), m.Kind.RETRY, {})]  # E waits for a plan made with it
    j = job(S.RUNNING, restarts=1, extra={E: GPU}, back={E: 1})
    j, _ = m.step(j, m.HostGone(C, 0), NOW)
    j, actions = m.step(j, m.Tick(), NOW + 5)
    assert actions == [m.Replan(frozenset({C}), m.Kind.RESTART, {E: GPU})]
    j, _ = m.step(j, planned(members={A: True, B: True, E: False}), NOW + 5)
    assert j.back == {} and j.history[-1]["joined"] == [{"address": E, **GPU}]


def test_without_checkpoints_a_leave_asked_while_joining_goes_at_the_start():
    j = job(joined=frozenset({A, B}), checkpoints=False)
    j, actions = m.step(j, m.LeaveAsked(C, 60, 0), NOW)
    assert kinds(actions) == ["Reply"] and C in j.leaving
    j, actions = m.step(j, m.Joined(C, "d"), NOW + 1)
    assert kinds(actions) == ["Start", "Replan"] and j.state is S.REPLANNING
