"""A job's life as one pure state machine: what the launch does next, from what it saw.

Every rule of a job's rounds lives here and nowhere else (docs/across-hosts.md, docs/checkpoints.md): who may join,
when the job starts, settles, restarts, retries, moves, ends or aborts; the adaptive rules (what measured rates and
a proposal lead to: docs/adaptive.md) in launch/adaptive.py, which this machine's table calls.  :func:`step` takes the job as it is, one
event and the time, and returns the job as it becomes and the actions to carry out.  It does no I/O, starts no
thread and reads no clock: the coordinator (launch/coordinator.py, across hosts) and the one-host driver
(launch/driver.py: one host is the same machine with one member) are shells that turn sockets, exit statuses and
timers into events and carry the actions out.

The shape follows TorchElastic's agent: one state enum, a frozen record of the round, and one function from what was
observed to the next action; and its rule that membership changes are not retries (here: a move is not a restart,
and a retry of Paddle's connect-timeout abort uses up neither).

The rounds, in short:

- **Joining.**  Every host of the round's placement joins with the digest of its plan and placement; a host with
  another digest ends the launch, naming it; when all have joined the round starts.  A host that never joins within
  the startup time ends it too.
- **Settling.**  Once started, a failure (a process failed, a host's launch went away or fell silent) is settled for
  ``settle_s`` (a host's death fails its peers' processes within seconds) when the job may start again: with
  restarts left, or when the first failure is Paddle's connect-timeout abort and retries are left.  Otherwise, and
  before the start, the first failure ends the launch.
- **A new round.**  After settling, the hosts lost are those gone, silent or never joined: none lost and a retry
  settling gives a retry (the same plan on the same hosts); else a restart re-plans for what is left, if restarts
  remain.  The coordinator's own host cannot be replaced.  A lost host that stands by again is back: at the next
  complete checkpoint the job re-plans with it and moves when that plan is better.  So does a machine from outside
  the hosts file that joins with the job's key and says what it is (``heterps launch --join``): it stands by, and
  every later round's plan is made, and expanded on every host, with it.
- **Leaving.**  A host that asks to leave (SIGTERM to its launch, ``heterps launch --leave``) gets a checkpoint at
  the end of the shards the trainers hold (docs/data-plan.md), after which its trainers train no further; once
  it is complete the job re-plans without the host and goes on from it, nothing redone and no restart used.  Past
  the host's grace time it goes without one (from the newest checkpoint); a host that dies first is an ordinary
  loss.
- **The end.**  When every host that runs CPU trainers has finished, the job ends on every host.

The machine speaks in facts and typed actions (launch/events.py): it builds no wire message and no console line;
the shells render those (launch/render.py).  Every (state, event) pair is decided: a transition of the table in
tests/test_launch_machine.py, or named there as ignored with the reason.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from heterps_paddle.launch.adaptive import WINDOWS_KEPT, on_measured, on_proposed, stands_in

# the vocabulary, re-exported: the shells and tests speak to the machine as machine.Joined, machine.Job, ...
from heterps_paddle.launch.events import (
    EVENTS,
    NOTES,
    AbortAll,
    Action,
    AdaptAdvice,
    AskCheckpoint,
    Beat,
    CheckpointComplete,
    Dismiss,
    Dismissal,
    Done,
    EndAll,
    Event,
    HostBack,
    HostGone,
    HostSilent,
    Joined,
    LeaveAnswer,
    LeaveAsked,
    LeaveNoted,
    Measured,
    MoveDeclined,
    MoveImpossible,
    NextRound,
    OnScale,
    PlanFailed,
    Planned,
    ProcessFailed,
    Proposal,
    Proposed,
    Reconsider,
    Refuse,
    ReplaceAdvice,
    Replan,
    Settling,
    SpareGone,
    SpareJoined,
    SpareLeft,
    SpareLost,
    StandBy,
    Start,
    Tick,
)
from heterps_paddle.launch.state import (
    Adapt,
    Change,
    Job,
    JobState,
    Kind,
    Replacement,
    Round,
    RoundChange,
    Rules,
    Seen,
    first_job,
    with_seen,
)

__all__ = [
    "EVENTS",
    "NOTES",
    "AbortAll",
    "Adapt",
    "AdaptAdvice",
    "OnScale",
    "Proposal",
    "Proposed",
    "Reconsider",
    "Action",
    "AskCheckpoint",
    "Beat",
    "Change",
    "CheckpointComplete",
    "Dismiss",
    "Dismissal",
    "Done",
    "EndAll",
    "Event",
    "HostBack",
    "HostGone",
    "HostSilent",
    "Job",
    "JobState",
    "Joined",
    "Kind",
    "LeaveAnswer",
    "LeaveAsked",
    "LeaveNoted",
    "Measured",
    "MoveDeclined",
    "MoveImpossible",
    "NextRound",
    "PlanFailed",
    "Planned",
    "ProcessFailed",
    "Refuse",
    "Replan",
    "ReplaceAdvice",
    "Replacement",
    "Round",
    "RoundChange",
    "Rules",
    "Seen",
    "Settling",
    "SpareGone",
    "SpareJoined",
    "SpareLeft",
    "SpareLost",
    "StandBy",
    "Start",
    "Tick",
    "WINDOWS_KEPT",
    "first_job",
    "step",
]

# ------------------------------------------------------------------------------------------------ the rules


def step(job: Job, event: Event, now: float) -> tuple[Job, list[Action]]:
    """The job after ``event`` at time ``now``, and what to do about it."""
    handler: Callable[[Job, Any, float], tuple[Job, list[Action]]] = _HANDLERS[type(event)]
    return handler(job, event, now)


_seen = with_seen


def _joined(job: Job, event: Joined, now: float) -> tuple[Job, list[Action]]:
    host, seen = event.host, job.seen
    if host not in job.round.members:
        listed = ", ".join(job.round.members)
        return job, [Refuse(host, f"{host} runs nothing of this launch's plan (its hosts: {listed})")]
    if host in seen.joined:
        return job, [Refuse(host, f"host {host} joined twice: a second heterps launch with --host {host}")]
    if job.state is not JobState.JOINING:
        reason = job.reason or f"host {host} joined a launch that had started"
        return _seen(job, gone=seen.gone | {host}), [Refuse(host, reason)]
    job = _seen(job, joined=seen.joined | {host}, gone=seen.gone - {host})
    if event.digest != job.round.digest:
        return _abort(job, _other_files(host, event.digest, job.round.coordinator, job.round.digest))
    if set(job.round.members) <= job.seen.joined:
        actions: list[Action] = [Start(tuple(job.round.members), job.round.digest)]
        job = _seen(replace(job, state=JobState.RUNNING), started=True)
        if job.leaving and job.rules.checkpoints:  # asked while the round was starting
            hold_s = max(deadline for deadline, _ in job.leaving.values()) - now
            actions.append(AskCheckpoint(f"host(s) {', '.join(sorted(job.leaving))} leave", max(0.0, hold_s)))
        elif job.leaving:
            job, more = _leave_now(job, "the launch keeps no checkpoints: the job starts again without it")
            actions += more
        return job, actions
    return job, []


def _other_files(host: str, digest: str, coordinator: str, expected: str) -> str:
    """Why a host with other files is refused: each host named with its own digest, so that the line reads the same
    on the refused host's console as on the coordinator's."""
    return (
        f"host {host} was given another plan or hosts file than {coordinator}: plan and placement digest {digest} "
        f"on {host}, {expected} on {coordinator} (the coordinator's host): give every host the same files"
    )


def _spare_joined(job: Job, event: SpareJoined, now: float) -> tuple[Job, list[Action]]:
    host = event.host
    outside = host not in job.rules.file_hosts
    if outside and host not in job.extra and event.joining is None:
        return job, [
            Refuse(
                host,
                f"{host} is not a host of this launch's hosts file (a machine from outside it joins with "
                "heterps launch --join type=TYPE)",
            )
        ]
    if event.digest != job.rules.files_digest:
        return job, [Refuse(host, _other_files(host, event.digest, job.round.coordinator, job.rules.files_digest))]
    if host in job.seen.spares:
        return job, [Refuse(host, f"host {host} stands by twice: a second heterps launch with --host {host}")]
    if host in job.seen.joined:
        return job, [Refuse(host, f"host {host} runs a part of this round: it cannot stand by as well")]
    if job.state is JobState.ABORTED:
        return job, [Dismiss(host, Dismissal.ABORTED, job.reason or "")]
    if job.state is JobState.ENDED:
        return job, [Dismiss(host, Dismissal.ENDED)]
    job = _seen(job, spares=job.seen.spares | {host})
    actions: list[Action] = [StandBy(host, job.round.number)]
    joining = None
    if outside and host not in job.extra:
        assert event.joining is not None
        joining = dict(event.joining)
        job = replace(job, extra={**job.extra, host: joining})
    elif host in job.lost:
        job = replace(job, lost=job.lost - {host})
    elif job.seen.replacing is not None and job.rules.checkpoints:  # a spare of the file: it stands in
        return stands_in(replace(job, back={**job.back, host: event.newest_checkpoint}), actions)
    else:
        return job, actions  # a spare of the file, never lost: it waits for a round that needs it
    actions.append(HostBack(host, joining, moves=job.rules.checkpoints))
    if not job.rules.checkpoints:
        return job, actions
    return stands_in(replace(job, back={**job.back, host: event.newest_checkpoint}), actions)


def _leave_asked(job: Job, event: LeaveAsked, now: float) -> tuple[Job, list[Action]]:
    """A host asks to go (module doc): a spare goes at once; a host of the round at the next checkpoint."""
    host = event.host
    if job.state.over:
        return job, [LeaveAnswer(host, False, f"the job has {job.state.value}")]
    if host in job.seen.spares:
        job = replace(job, lost=job.lost | {host}, back=_without(job.back, host))
        job = _seen(job, spares=job.seen.spares - {host})
        return job, [
            LeaveAnswer(host, True, "it stood by: it leaves now"),
            Dismiss(host, Dismissal.LEFT),
            SpareLeft(host),
        ]
    if host not in job.round.members or host in job.lost:
        return job, [LeaveAnswer(host, False, f"{host} runs nothing of the job's round {job.round.number}")]
    if host == job.round.coordinator:
        why = f"{host} is the coordinator's host (server 0): it cannot leave without ending the job"
        return job, [LeaveAnswer(host, False, why)]
    if host in job.leaving:
        return job, [LeaveAnswer(host, True, "it leaves at the next checkpoint (asked already)")]
    deadline = now + max(0.0, event.grace_s)
    job = replace(job, leaving={**job.leaving, host: (deadline, event.newest_checkpoint)})
    if not job.rules.checkpoints:
        actions: list[Action] = [LeaveAnswer(host, True, "no checkpoints (--checkpoint-dir): it leaves now")]
        if job.state is JobState.RUNNING:
            job, more = _leave_now(job, "the launch keeps no checkpoints: the job starts again without it")
            actions += more
        return job, actions
    how = (
        "a checkpoint once the trainers have trained the shards in hand, then the job goes on without it "
        f"({event.grace_s:.0f} s at most)"
    )
    actions = [LeaveAnswer(host, True, how), LeaveNoted(host, event.grace_s)]
    if job.state is JobState.RUNNING:
        # the round ends at the checkpoint: its trainers train no further (it would be redone), for the grace time
        actions.append(AskCheckpoint(f"host {host} leaves", max(0.0, event.grace_s)))
    return job, actions


def _leave_now(job: Job, how: str) -> tuple[Job, list[Action]]:
    """Every host asking to leave goes: the next round is planned without them (no restart used)."""
    hosts = tuple(sorted(job.leaving))
    lost = job.lost | frozenset(hosts)
    change = Change(Kind.LEAVE, lost, (), f"host(s) {', '.join(hosts)} left on notice ({how})", left=hosts)
    job = _seen(replace(job, leaving={}, back={}, state=JobState.REPLANNING), pending=change)
    return job, [Replan(lost, Kind.LEAVE, job.extra, refit=job.refit)]


def _without(mapping: Any, key: str) -> dict[Any, Any]:
    return {k: v for k, v in mapping.items() if k != key}


def _spare_gone(job: Job, event: SpareGone, now: float) -> tuple[Job, list[Action]]:
    host = event.host
    if host not in job.seen.spares:
        return job, []  # told to go (a restart, the end) before its connection closed
    job = _seen(replace(job, back=_without(job.back, host)), spares=job.seen.spares - {host})
    if job.state.over:
        return job, []
    # gone while standing by: a later round must not wait for it
    return replace(job, lost=job.lost | {host}), [SpareLost(host)]


def _process_failed(job: Job, event: ProcessFailed, now: float) -> tuple[Job, list[Action]]:
    if event.round != job.round.number:
        return job, []  # a host of an earlier round: it starts again, or was dropped
    return _trouble(job, f"host {event.host}: {event.reason}", now, event.connect_timeout)


def _host_gone(job: Job, event: HostGone, now: float) -> tuple[Job, list[Action]]:
    if event.round != job.round.number:
        return job, []
    job = _seen(job, joined=job.seen.joined - {event.host}, gone=job.seen.gone | {event.host})
    why = event.why or (
        "went away (its connection to the coordinator closed: the process was killed, or the machine or its network "
        "is gone)"
    )
    return _trouble(job, f"host {event.host}'s heterps launch {why}", now)


def _host_silent(job: Job, event: HostSilent, now: float) -> tuple[Job, list[Action]]:
    if event.round != job.round.number or event.host in job.seen.gone:
        return job, []
    job = _seen(job, silent=job.seen.silent | {event.host})
    if job.state is not JobState.RUNNING:
        return job, []  # before the start the startup deadline rules; while settling, the settling counts it lost
    return _trouble(
        job,
        f"host {event.host} stopped answering ({event.seconds:.0f} s without a word; HETERPS_HOST_TIMEOUT)",
        now,
    )


def _done(job: Job, event: Done, now: float) -> tuple[Job, list[Action]]:
    if event.round != job.round.number:
        return job, []
    job = _seen(job, done=job.seen.done | {event.host})
    if job.state.over or not job.round.trainer_hosts <= job.seen.done:
        return job, []
    return replace(job, state=JobState.ENDED), [EndAll()]


def _checkpoint_complete(job: Job, event: CheckpointComplete, now: float) -> tuple[Job, list[Action]]:
    if job.state is not JobState.RUNNING or not job.rules.checkpoints:
        return job, []
    job = replace(job, newest_checkpoint=max(job.newest_checkpoint, event.passes))
    if job.leaving:
        if event.passes > min(at for _, at in job.leaving.values()):
            return _leave_now(job, f"the job goes on from the checkpoint of {event.passes:g} passes, nothing redone")
        return job, []
    adapting = job.seen.adapting
    if adapting is not None and event.passes > job.seen.adapt_from:
        # the move the measurements decided, from a checkpoint written after the decision
        change = Change(Kind.ADAPT, job.lost, (), adapting.why, proposal=adapting)
        job = _seen(replace(job, back={}, state=JobState.REPLANNING), pending=change, adapting=None)
        return job, [Replan(job.lost, Kind.ADAPT, job.extra, decided=adapting, refit=job.refit)]
    if not job.back or event.passes <= max(job.back.values()):
        return job, []  # the move waits for a checkpoint written after the host came back
    hosts = tuple(sorted(job.back))
    joined = [h for h in hosts if h in job.extra and h not in job.round.joined]
    what = f"host(s) {', '.join(hosts)} back" if not joined else f"host(s) {', '.join(hosts)} joined or back"
    slow = job.seen.replacing
    if slow is not None:
        # the slow host's replacement: planned without it (on the measured rates), and let go with the move
        lost = job.lost | {slow.host}
        why = f"{what}, standing in for host {slow.host}, slow ({slow.share:.0%} of its peers' samples/s)"
        change = Change(Kind.ADAPT, lost, (), why, back=hosts, replaced={slow.host: slow.price_per_hour})
        job = _seen(replace(job, back={}, state=JobState.REPLANNING), pending=change)
        return job, [Replan(lost, Kind.ADAPT, job.extra, refit=job.refit)]
    change = Change(Kind.MOVE, job.lost, (), what, back=hosts)
    job = _seen(replace(job, back={}, state=JobState.REPLANNING), pending=change)
    return job, [Replan(job.lost, Kind.MOVE, job.extra, refit=job.refit)]


def _tick(job: Job, event: Tick, now: float) -> tuple[Job, list[Action]]:
    seen = job.seen
    if job.state is JobState.SETTLING and seen.settle_at is not None and now >= seen.settle_at:
        return _settled(job, now)
    if job.state is JobState.JOINING and now > seen.startup_deadline:
        missing = [h for h in job.round.members if h not in seen.joined]
        return _abort(
            job,
            f"host{'s' * (len(missing) != 1)} {', '.join(missing)} never joined the launch within "
            f"{job.rules.startup_s:.0f} s (HETERPS_STARTUP_TIMEOUT): start `heterps launch --hosts ...` there too, "
            "with the same files",
        )
    if job.state is JobState.RUNNING and job.leaving and now >= min(at for at, _ in job.leaving.values()):
        return _leave_now(job, "no checkpoint within its grace time: the job goes on from the newest one")
    if job.state in (JobState.JOINING, JobState.RUNNING):
        return job, [Beat()]
    return job, []


def _planned(job: Job, event: Planned, now: float) -> tuple[Job, list[Action]]:
    change = job.seen.pending
    if job.state is not JobState.REPLANNING or change is None:
        return job, []
    if change.kind in (Kind.MOVE, Kind.ADAPT) and not event.better and not change.replaced:
        job = _seen(replace(job, state=JobState.RUNNING), pending=None)
        return job, [MoveDeclined(change.back, str(event.report.get("new_summary", "?")))]
    old = job.round
    # an adaptive move lets go the hosts its plan runs nothing on, and the slow host it replaces
    released = {**event.released, **change.replaced} if change.kind is Kind.ADAPT else {}
    new = Round(
        number=old.number + 1,
        members=dict(event.members),
        coordinator=event.coordinator,
        digest=event.digest,
        plan=dict(event.plan),
        lost=change.lost,
        resumes_from=event.checkpoint.get("resumes_from"),
        joined=frozenset(h for h in job.extra if h not in change.lost),
        retries_used=old.retries_used + (change.kind is Kind.RETRY),
        restarts_used=old.restarts_used + (change.kind is Kind.RESTART),
    )
    record = RoundChange(
        round=new.number,
        kind=change.kind,
        at=event.at,
        why=change.reason,
        lost=change.lost_now,
        lost_so_far=tuple(sorted(change.lost)),
        left=change.left,
        released=tuple(sorted(released)),
        # the machines from outside the hosts file that this round's plan takes in for the first time since they came
        joined=tuple({"address": h, **job.extra[h]} for h in job.extra if h in event.members and h not in old.members),
        hosts=tuple(sorted(event.members)),
        checkpoint=dict(event.checkpoint),
        report=dict(event.report),
    )
    job = replace(
        job,
        round=new,
        # a fresh round: nothing seen yet; the spares were told with every host: they start again too, and stand by
        # anew if the plan skips them
        seen=Seen(startup_deadline=now + job.rules.startup_s),
        state=JobState.JOINING,
        lost=change.lost,
        history=(*job.history, record),
        back={h: passes for h, passes in job.back.items() if h not in event.members},  # taken in: nothing to move for
        moved_at=float(event.checkpoint.get("passes_done") or 0) if change.kind is Kind.ADAPT else job.moved_at,
    )
    if released:  # let go: a later round's plan is made without them
        job = replace(job, lost=job.lost | frozenset(released))
    joined = tuple({"address": host, **spec} for host, spec in job.extra.items())
    return job, [NextRound(new, change, str(event.report.get("summary", "")), joined, released)]


def _plan_failed(job: Job, event: PlanFailed, now: float) -> tuple[Job, list[Action]]:
    change = job.seen.pending
    if job.state is not JobState.REPLANNING or change is None:
        return job, []
    if change.kind in (Kind.MOVE, Kind.ADAPT):  # the job runs on as it was: its plan still works
        return _seen(replace(job, state=JobState.RUNNING), pending=None), [MoveImpossible(change.back, event.detail)]
    job = _seen(job, pending=None)
    if event.expected:
        return _abort(job, f"{change.reason}; the job cannot go on with what is left: {event.detail}")
    return _abort(job, f"{change.reason}; re-planning failed ({event.detail})")


def _trouble(job: Job, reason: str, now: float, connect_timeout: bool = False) -> tuple[Job, list[Action]]:
    """A failure ends the launch, or, once it had started, begins the settling that ends in a new round: a restart
    (with restarts left), or a retry when the first failure is Paddle's connect-timeout abort and retries are left.
    What fails while a failure settles is counted with it.  The one home of the retry rule."""
    if job.state.over or job.state is JobState.REPLANNING:
        return job, []
    if job.state is JobState.JOINING or not job.rules.can_replan:
        return _abort(job, reason)
    actions: list[Action] = []
    if job.state is JobState.RUNNING:
        retry = connect_timeout and job.retries_left > 0
        if job.restarts_left <= 0 and not retry:
            return _abort(job, reason)
        if retry:
            actions.append(Settling(reason, Kind.RETRY, job.retries_left))
        else:
            actions.append(Settling(reason, Kind.RESTART, job.restarts_left))
        job = replace(job, state=JobState.SETTLING)
        job = _seen(job, settle_at=now + job.rules.settle_s, connect_timeout=retry)
    return _seen(job, trouble=(*job.seen.trouble, reason)), actions


def _settled(job: Job, now: float) -> tuple[Job, list[Action]]:
    """The settled failure's new round: who is lost, who leaves (asked to: they go with it, told they left), and
    whether the job may go on without them."""
    members, seen = job.round.members, job.seen
    left = tuple(sorted(set(job.leaving) & set(members)))
    missing = seen.gone | seen.silent | {h for h in members if h not in seen.joined}
    lost_now = tuple(sorted((missing & set(members)) - set(left)))
    reason = "; ".join(seen.trouble)
    if job.round.coordinator in lost_now:
        return _abort(job, f"{reason} (the coordinator's own host cannot be replaced: the job ends)")
    # A host lost, or a process failure that is not Paddle's connect-timeout abort, uses up a restart; the abort
    # alone is a retry (the same plan on the same hosts), or, when hosts leave with it, a leave (a plan without them).
    if lost_now or not seen.connect_timeout:
        kind = Kind.RESTART
    else:
        kind = Kind.LEAVE if left else Kind.RETRY
    if kind is Kind.RESTART and job.restarts_left <= 0:
        what = f"; and lost host(s) {', '.join(lost_now)}" if lost_now else ""
        return _abort(job, f"{reason}{what}: no restarts left (--restarts)")
    lost = job.lost | frozenset(lost_now) | frozenset(left)
    back = {h: passes for h, passes in job.back.items() if h not in lost}
    change = Change(kind, lost, lost_now if kind is Kind.RESTART else (), reason, left=left)
    job = _seen(replace(job, state=JobState.REPLANNING, back=back, leaving={}), pending=change)
    # a retry runs the round's plan again: the machines that joined since wait for a plan that is made with them
    joined = {h: job.extra[h] for h in job.round.joined} if kind is Kind.RETRY else job.extra
    return job, [Replan(lost, kind, joined, refit=job.refit)]


def _abort(job: Job, reason: str) -> tuple[Job, list[Action]]:
    """The first reason ends the launch on every host."""
    if job.state.over:
        return job, []
    job = _seen(replace(job, state=JobState.ABORTED, reason=reason), pending=None)
    return job, [AbortAll(reason)]


_HANDLERS: dict[type, Any] = {
    Joined: _joined,
    SpareJoined: _spare_joined,
    LeaveAsked: _leave_asked,
    SpareGone: _spare_gone,
    ProcessFailed: _process_failed,
    HostGone: _host_gone,
    HostSilent: _host_silent,
    Done: _done,
    CheckpointComplete: _checkpoint_complete,
    Tick: _tick,
    Planned: _planned,
    PlanFailed: _plan_failed,
    Measured: on_measured,
    Proposed: on_proposed,
}
