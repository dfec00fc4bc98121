"""A job's life as one pure state machine: what the launch does next, from what it saw.

Every rule of a job's rounds lives here and nowhere else (docs/across-hosts.md, docs/checkpoints.md): who may join,
when the job starts, settles, restarts, retries, moves, ends or aborts.  :func:`step` takes the job as it is, one
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
  the end of the running pass or slice (HETERPS_CHECKPOINT_SLICES), after which its trainers train no further; once
  it is complete the job re-plans without the host and goes on from it, nothing redone and no restart used.  Past
  the host's grace time it goes without one (from the newest checkpoint); a host that dies first is an ordinary
  loss.
- **The end.**  When every host that runs CPU trainers has finished, the job ends on every host.

The machine speaks in facts and typed actions (launch/events.py): it builds no wire message and no console line;
the shells render those (launch/render.py).  Every (state, event) pair is decided: a transition of the table in
tests/test_launch_machine.py, or named there as ignored with the reason.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any, Callable

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
    "first_job",
    "step",
]

# ------------------------------------------------------------------------------------------------ the rules

WINDOWS_KEPT = 6  # whole windows a reconsideration corrects the model by (by default a window every 10 s: a minute)


def step(job: Job, event: Event, now: float) -> tuple[Job, list[Action]]:
    """The job after ``event`` at time ``now``, and what to do about it."""
    handler: Callable[[Job, Any, float], tuple[Job, list[Action]]] = _HANDLERS[type(event)]
    return handler(job, event, now)


def _seen(job: Job, **changes: Any) -> Job:
    """``job`` with what its round has seen changed."""
    return replace(job, seen=replace(job.seen, **changes))


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
        return _stands_in(replace(job, back={**job.back, host: event.newest_checkpoint}), actions)
    else:
        return job, actions  # a spare of the file, never lost: it waits for a round that needs it
    actions.append(HostBack(host, joining, moves=job.rules.checkpoints))
    if not job.rules.checkpoints:
        return job, actions
    return _stands_in(replace(job, back={**job.back, host: event.newest_checkpoint}), actions)


def _stands_in(job: Job, actions: list[Action]) -> tuple[Job, list[Action]]:
    """A machine standing by while a slow host waits for one to replace it: a checkpoint at the end of the running
    pass, and the move onto it from there (``_checkpoint_complete``)."""
    slow = job.seen.replacing
    if slow is None or job.state is not JobState.RUNNING or not job.back:
        return job, actions
    hosts = ", ".join(sorted(job.back))
    return job, [*actions, AskCheckpoint(f"host(s) {hosts} stand in for host {slow.host}, slow")]


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
        "a checkpoint at the end of the running pass or slice, then the job goes on without it "
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


def _measured(job: Job, event: Measured, now: float) -> tuple[Job, list[Action]]:
    """The running round's rates, kept: what the plan delivers.  With --adapt, a reconsideration asked for, at most
    every ``every_s``: when the target has been missed over ``sustain_s``, or (past the cooldown after a move) to
    look for a cheaper or faster plan."""
    if job.state is not JobState.RUNNING or getattr(event.rates, "round", None) != job.round.number:
        return job, []
    adapt = job.rules.adapt
    kept = tuple(r for r in job.seen.rates if now - r[0] <= 2 * adapt.sustain_s) + ((now, event.rates),)
    windows = (*job.seen.windows, event.rates)[-WINDOWS_KEPT:] if event.whole else job.seen.windows
    slow = _slow_windows(job.seen.slow_windows, event.rates)
    trained_at = job.seen.trained_at
    if trained_at is None and event.rates.samples_per_s > 0:
        trained_at = now
    job = _seen(
        replace(job, measured=event.rates), rates=kept, windows=windows, slow_windows=slow, trained_at=trained_at
    )
    if not adapt.active or job.leaving or job.back or job.seen.adapting is not None:
        return job, []
    if job.seen.replacing is not None:
        return job, []  # the round's decision is made: a machine to stand in for the slow host
    straggler = _straggler(job, now)
    if straggler is not None:
        return _replace(job, *straggler)
    if _short_of_target(job, now) and any(n and h != job.round.coordinator for h, n in job.seen.slow_windows.items()):
        # a host measured slow may explain the miss: its next comparisons decide first.  The refit corrects a type,
        # and more units of it would not help: the slow host bounds every pass it is in
        return job, []
    if job.seen.asked_at is not None and now - job.seen.asked_at < adapt.every_s:
        return job, []
    missed = _missed(job, now)
    if missed is None and not _cooled(job):
        return job, []
    why = missed or _looking_for(job)
    return _seen(job, asked_at=now), [Reconsider(why, missed is not None, job.seen.windows, job.refit)]


def _looking_for(job: Job) -> str:
    """What a reconsideration past the cooldown looks for, by the job's objective (the newest window's)."""
    rates = job.measured
    if rates is not None and rates.target_samples_per_s:
        return "looking for a plan that meets the target for less, on the measured rates"
    return "looking for a plan that trains a sample for less at no lower rate, on the measured rates"


def _missed(job: Job, now: float) -> str | None:
    """Why the target counts as missed (None: it does not): every rates of the last ``sustain_s`` under it by more
    than ``miss``, and the round has trained that long (Seen.trained_at: its start is no miss)."""
    adapt, rates = job.rules.adapt, job.seen.rates
    judged = _judged(job, now)
    if judged is None:
        return None
    target, started = judged
    window = [r for t, r in rates if now - t <= adapt.sustain_s and t >= started]
    floor = target * (1.0 - adapt.miss)
    if not window or any(r.samples_per_s >= floor for r in window):
        return None
    worst = max(r.samples_per_s for r in window)
    return (
        f"the target of {target:,.0f} samples/s was missed for {adapt.sustain_s:.0f} s "
        f"(at most {worst:,.0f} samples/s measured, under {floor:,.0f})"
    )


def _slow_windows(counts: Any, rates: Any) -> dict[str, int]:
    """Each host's slow comparisons in a row after ``rates``' window: a host whose trainers had peers in the same
    pass (launch/gauge.py: TrainerRate) counts one more when every one of them was slow, and starts again from 0 when
    one was not; a host no window compared (its trainers alone in their pass, or waiting) keeps its count.  Rows in
    a row, not windows in a span of time: a slow trainer has peers only at the start of each pass, until they end
    their share and wait for it."""
    compared: dict[str, bool] = {}
    for t in getattr(rates, "trainers", ()) or ():
        if t.share is not None:  # peers that trained in the window (none trains across a checkpoint: no comparison)
            compared[t.host] = compared.get(t.host, True) and bool(t.slow)
    out = dict(counts)
    for host, slow in compared.items():
        out[host] = out.get(host, 0) + 1 if slow else 0
    return out


def _straggler(job: Job, now: float) -> tuple[Replacement, str] | None:
    """The host to replace, and why, or None: a host of the round (not the coordinator's, which cannot go) whose
    trainers were slow in ``straggler_windows`` comparisons in a row while the job missed its target on average over
    the rates kept (at least ``sustain_s`` of them).  On average, not every window: the windows that see the fast
    trainers' burst at a pass's start meet the target, and those of the slow one's tail miss it by far; the pass as
    a whole is what the target is about."""
    adapt, rates = job.rules.adapt, job.seen.rates
    counts = job.seen.slow_windows
    hosts = [
        h
        for h, n in counts.items()
        if n >= adapt.straggler_windows and h in job.round.members and h != job.round.coordinator and h not in job.lost
    ]
    short = _short_of_target(job, now)
    if not hosts or short is None:
        return None
    target, mean, floor, span = short
    shares = {h: _newest_share(rates, h) for h in hosts}
    host = min(hosts, key=lambda h: (shares[h], h))
    stages = getattr(rates[-1][1], "stages", ()) or ()
    first = stages[0] if stages else None
    resource = str(getattr(first, "resource", "?"))
    price = float(getattr(first, "price_per_hour", None) or 0.0)
    found = Replacement(host, resource, price, shares[host], counts[host])
    why = (
        f"host {host} is slow: its trainers trained {found.share:.0%} of their peers' samples/s in the same pass, "
        f"slow in {found.windows} comparisons in a row, and the job missed its target of {target:,.0f} samples/s "
        f"({mean:,.0f} on average over the last {span:.0f} s, under {floor:,.0f})"
    )
    return found, why


def _judged(job: Job, now: float) -> tuple[float, float] | None:
    """(target, since) when the round can be judged against its target: it has one, and it has trained for at least
    ``sustain_s`` since ``since`` (Seen.trained_at: the windows of its processes starting are no miss)."""
    rates = job.seen.rates
    target = getattr(rates[-1][1], "target_samples_per_s", None) if rates else None
    started = job.seen.trained_at
    if not target or started is None or now - started < job.rules.adapt.sustain_s:
        return None
    return float(target), started


def _short_of_target(job: Job, now: float) -> tuple[float, float, float, float] | None:
    """(target, mean, floor, span) when the windows kept since the round first trained (``_judged``) trained under
    the target by more than ``miss`` on average over their ``span`` seconds; None when they did not, or the round
    cannot be judged yet.  A checkpoint's idle windows count."""
    judged = _judged(job, now)
    if judged is None:
        return None
    target, started = judged
    kept = [(t, r) for t, r in job.seen.rates if t >= started]
    mean = statistics.fmean(r.samples_per_s for _, r in kept)
    floor = target * (1.0 - job.rules.adapt.miss)
    return (target, mean, floor, now - kept[0][0]) if mean < floor else None


def _newest_share(rates: Any, host: str) -> float:
    """``host``'s trainers' lowest share of their peers' samples/s in the newest window that compared them."""
    for _, r in reversed(rates):
        shares = [t.share for t in getattr(r, "trainers", ()) or () if t.host == host and t.share is not None]
        if shares:
            return float(min(shares))
    return 0.0


def _replace(job: Job, slow: Replacement, why: str) -> tuple[Job, list[Action]]:
    """A slow host replaced: a machine standing by stands in at once (a checkpoint asked for); else a unit of its
    type is asked of ``--on-scale``.  The move comes at the first checkpoint after one stands by; the slow host is let
    go with it.  Replaced, not joined by one more: each trainer reads its own share of the files, so a slow one
    bounds every pass it is in whatever units are added.  In advise mode the job says so, once a round."""
    if job.rules.adapt.mode != "on" or not job.rules.checkpoints:
        said = f"replace {slow.host}"
        if said in job.seen.advised:
            return job, []
        return _seen(job, advised=job.seen.advised | {said}), [ReplaceAdvice("would replace", why, slow)]
    job = _seen(job, replacing=slow)
    advice = ReplaceAdvice("replace", why, slow)
    standing = sorted(job.seen.spares - job.lost)
    if standing:
        job = replace(job, back={**job.back, **{h: job.newest_checkpoint for h in standing}})
        return _stands_in(job, [advice])
    return job, [advice, OnScale({slow.resource: 1}, {}, f"{why}: a unit of {slow.resource} to stand in for it")]


def _cooled(job: Job) -> bool:
    """Whether ``cooldown`` checkpoints passed since the last adaptive move (a miss does not wait for them)."""
    return job.moved_at is None or job.newest_checkpoint - job.moved_at >= job.rules.adapt.cooldown


def _proposed(job: Job, event: Proposed, now: float) -> tuple[Job, list[Action]]:
    """The shell's proposal: a move at the next complete checkpoint when (a) the target is missed and it reaches
    it, or no plan reaches it (more units neither) and it is at least ``faster`` faster; (b) it meets the target for
    at least ``saving`` less and what it saves over the rest of the job beats the move's own cost; (c) under a
    budget, it is at least ``faster`` faster within it.  A move for speed alone (a's second case, c) must also train
    more over the rest of the job than the running plan, the move's own time included.  Units the job has not are
    wished for when only they reach a missed target.  In advise mode the job does nothing but say so (once a round
    for each plan)."""
    p = event.proposal
    if job.state is not JobState.RUNNING or job.seen.adapting is not None or job.seen.replacing is not None:
        return job, []  # a move decided already (a plan, or a slow host's replacement): the round's decision
    if p is None:
        return job, []
    if p.correction is not None:
        job = replace(job, refit=p.correction)  # the newest correction: later plans are made on it
    if p.same:
        p = replace(p, meets_target=False, samples_per_s=0.0)  # no move to the plan that runs: only a wish
    adapt = job.rules.adapt
    missed = _missed(job, now)
    measured = job.measured.samples_per_s if job.measured is not None else p.current_samples_per_s
    why = None
    if missed and p.meets_target:
        why = f"{missed}; {p.summary} reaches it"
    elif missed and _cooled(job) and not p.wanted and p.samples_per_s >= p.current_samples_per_s * (1 + adapt.faster):
        # out of reach on any plan, more units included: the plan that comes closest, when it does by a margin and
        # what it trains more over the rest of the job beats the training the move stops
        faster = p.samples_per_s / p.current_samples_per_s - 1
        pays = _faster_pays(job, now, p.samples_per_s, p.current_samples_per_s)
        if pays is not None:
            why = f"{missed}, and no plan reaches it; {p.summary} is {faster:.0%} faster on the measured rates: {pays}"
    elif _cooled(job) and p.target and p.meets_target and p.better_by >= adapt.saving:
        horizon = _horizon(job, now)
        saved = (p.current_cost_per_hour - p.cost_per_hour) * horizon
        costs = p.current_cost_per_hour * adapt.move_s  # the job paid while it did not train
        if saved > costs:
            why = (
                f"{p.summary} meets the target for {p.better_by:.0%} less: saves {saved / 3600:.4g} over the next "
                f"{horizon:.0f} s, the move costs {costs / 3600:.4g}"
            )
    elif _cooled(job) and p.budget and p.cost_per_hour <= p.budget and p.samples_per_s >= measured * (1 + adapt.faster):
        pays = _faster_pays(job, now, p.samples_per_s, measured)
        if pays is not None:
            faster = p.samples_per_s / measured - 1
            why = f"{p.summary} is {faster:.0%} faster within the budget of {p.budget:.4g}/h: {pays}"
    elif _cooled(job) and p.target is None and p.budget is None:
        why = _cheaper_per_sample(job, now, p)
    if why is None:
        if missed and p.wanted and not job.seen.wished:
            job = _seen(job, wished=True)
            wish = f"{missed}: the job needs {_units(p.wanted)} more"
            actions: list[Action] = [AdaptAdvice("wish", wish, p)]
            if adapt.mode == "on":
                actions.append(OnScale(dict(p.wanted), dict(p.released), wish))
            return job, actions
        return job, []
    if adapt.mode != "on":
        if p.summary in job.seen.advised:
            return job, []  # said once a round: the log and the console are not flooded by the same advice
        return _seen(job, advised=job.seen.advised | {p.summary}), [AdaptAdvice("would move", why, p)]
    job = _seen(job, adapting=replace(p, why=why), adapt_from=job.newest_checkpoint)
    return job, [AdaptAdvice("move", why, p), AskCheckpoint(f"the plan follows the job: {why}")]


def _cheaper_per_sample(job: Job, now: float, p: Proposal) -> str | None:
    """(e) Without a target or a budget the job's objective is what it pays a sample: why ``p`` is worth a move
    (None: it is not).  It must train at no lower rate than the running plan, both on the corrected model, for at
    least ``saving`` less a sample, and what it saves over the rest of the job must beat the move's own cost (the
    running plan's cost an hour over ``move_s``, training nothing)."""
    adapt = job.rules.adapt
    if p.samples_per_s <= 0 or p.current_samples_per_s <= 0 or p.samples_per_s < p.current_samples_per_s:
        return None
    now_per_sample = p.current_cost_per_hour / p.current_samples_per_s
    new_per_sample = p.cost_per_hour / p.samples_per_s
    less = 1.0 - new_per_sample / now_per_sample if now_per_sample > 0 else 0.0
    if less < adapt.saving:
        return None
    horizon = _horizon(job, now)
    trained = p.samples_per_s * max(0.0, horizon - adapt.move_s)  # samples over the rest of the job, moved
    saved = (now_per_sample - new_per_sample) * trained / 3600.0
    costs = p.current_cost_per_hour * adapt.move_s / 3600.0
    if saved <= costs:
        return None
    return (
        f"{p.summary} trains a sample for {less:.0%} less at no lower rate (no target or budget: the job's cost per "
        f"sample is its objective): saves {saved:.4g} over the next {horizon:.0f} s, the move costs {costs:.4g}"
    )


def _horizon(job: Job, now: float) -> float:
    """How long the job is expected to run on: the setting, or as long again as it has run."""
    return job.rules.adapt.horizon_s or max(0.0, now - job.rules.started_at)


def _faster_pays(job: Job, now: float, faster: float, running: float) -> str | None:
    """Why a move to a plan training ``faster`` samples/s than the ``running`` one pays, or None when it does not:
    over the horizon it must train more than the running plan would, the move's own time (not training) included.
    Without it a short job moved for speed and lost: ``heterps bench adapt`` measured a move decided 26 s into a
    job of about two minutes cost 1.35x the fixed plan's per sample, its restart included."""
    horizon, move = _horizon(job, now), job.rules.adapt.move_s
    more = faster * max(0.0, horizon - move) / (running * horizon) - 1 if horizon > 0 and running > 0 else -1.0
    if more <= 0:
        return None
    return f"over the next {horizon:.0f} s it trains {more:.0%} more, the move's {move:.0f} s included"


def _units(wanted: Any) -> str:
    return ", ".join(f"{units} x {rtype}" for rtype, units in sorted(wanted.items()))


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
    Measured: _measured,
    Proposed: _proposed,
}
