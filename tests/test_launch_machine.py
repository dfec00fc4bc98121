"""The job's state machine (launch/machine.py), transition by transition: every event in every state it can meet,
with the state it leads to and the actions it asks for.  Pure: no sockets, no processes, time given."""

from dataclasses import replace

import pytest

from heterps_paddle.launch import machine as m

A, B, C, D = "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"  # names only: nothing is sent anywhere
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
