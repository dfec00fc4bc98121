"""The job's state machine (launch/machine.py) through whole stories: a job restarted, moved and ended; retries and
restarts; a joiner that leaves; leaves met by failures; one host as a job of one member.  Pure, as
tests/test_launch_machine.py's transitions."""

from dataclasses import replace

from test_launch_machine import GPU, NOW, RESTARTING, SETTLING, A, B, C, E, S, job, kinds, planned

from heterps_paddle.launch import machine as m
from heterps_paddle.launch import render


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
