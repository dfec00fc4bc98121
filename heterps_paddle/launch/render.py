"""The machine's actions (launch/events.py) rendered for people and peers: the console line a note or a decision
is, and the message a connection of the control port is told.  The machine decides; this module only words it, in
one place, so that the wording a user reads is written once.  What tools read is the event log
(launch/event_log.py), never these lines."""

from __future__ import annotations

from typing import Any

from heterps_paddle.launch import events as e
from heterps_paddle.launch.state import Job, Kind

PREFIX = "heterps launch: "
LEFT_WHY = "it left the job"  # the word to a host that left (the driver reads it as this host's end)


def message(action: Any) -> dict[str, Any]:
    """What a peer is told for ``action`` (Start's launch id and the beat are the coordinator's own)."""
    if isinstance(action, e.Refuse):
        return {"op": "abort", "reason": action.reason}
    if isinstance(action, e.StandBy):
        return {"op": "standby", "round": action.round}
    if isinstance(action, e.LeaveAnswer):
        return {"op": "leave", "accepted": action.accepted, "reason": action.reason}
    if isinstance(action, e.Dismiss):
        if action.why is e.Dismissal.ABORTED:
            return {"op": "abort", "reason": action.reason}
        if action.why is e.Dismissal.LEFT:
            return {"op": "end", "why": LEFT_WHY}
        return {"op": "end"}
    if isinstance(action, e.EndAll):
        return {"op": "end"}
    if isinstance(action, e.AbortAll):
        return {"op": "abort", "reason": action.reason}
    if isinstance(action, e.NextRound):
        change = action.change
        return {
            "op": "restart",
            "round": action.round.number,
            "plan": dict(action.round.plan or {}),
            "lost": sorted(change.lost),
            "why": change.reason,
            "joined": [dict(j) for j in action.joined],
            "left": list(change.left),
            "released": {host: round(saves, 6) for host, saves in action.released.items()},
        }
    raise TypeError(f"no message for {type(action).__name__}")


def line(action: Any, job: Job) -> str | None:
    """The console line of ``action`` (None: it has none), ``job``: the machine's job after the step."""
    if isinstance(action, e.Start):
        return (
            f"{PREFIX}every host joined ({', '.join(action.hosts)}; plan and placement digest {action.digest}); "
            "the job starts"
        )
    if isinstance(action, e.Settling):
        left = (
            f"{action.left} retry(-ies) of this abort left, HETERPS_CONNECT_RETRIES"
            if action.kind is Kind.RETRY
            else f"{action.left} restart(s) left"
        )
        return f"{PREFIX}{action.reason}; the job will start again ({left})"
    if isinstance(action, e.HostBack):
        if action.joining is not None:
            what = f"{action.joining.get('units', 1)} x {action.joining.get('type')}"
            came = f"host {action.host} ({what}) joined the job from outside the hosts file"
        else:
            came = f"host {action.host} is back"
        if not action.moves:
            return (
                f"{PREFIX}{came} and stands by; without --checkpoint-dir the job stays on its plan (a restart's plan "
                "may use it)"
            )
        return f"{PREFIX}{came} and stands by; at the next checkpoint the job moves to a plan with it, if that plan is better"
    if isinstance(action, e.SpareLeft):
        return f"{PREFIX}host {action.host}, standing by, left the job"
    if isinstance(action, e.SpareLost):
        return f"{PREFIX}host {action.host}, standing by, went away: counted as lost"
    if isinstance(action, e.LeaveNoted):
        return (
            f"{PREFIX}host {action.host} asks to leave: a checkpoint once the trainers have trained the shards in hand, then the "
            f"job goes on without it (within {action.grace_s:.0f} s, else from the newest checkpoint)"
        )
    if isinstance(action, e.MoveDeclined):
        return (
            f"{PREFIX}with host(s) {', '.join(action.hosts)} back the plan would be {action.plan}, no better than the "
            "one running: the job goes on with it (the host(s) stand by)"
        )
    if isinstance(action, e.MoveImpossible):
        return f"{PREFIX}no plan with host(s) {', '.join(action.hosts)} back ({action.detail}); the job goes on"
    if isinstance(action, e.NextRound):
        released = ""
        if action.released:
            released = f"; released {', '.join(sorted(action.released))} (saves {sum(action.released.values()):.4g}/h)"
        return f"{PREFIX}{round_title(action, job)}: {_what(action)}; {action.summary}{released}"
    if isinstance(action, e.AdaptAdvice):
        p = action.proposal
        figures = (
            f"(predicted on the measured rates: {p.samples_per_s:,.0f} samples/s at {p.cost_per_hour:.4g}/h, "
            f"against the running plan's {p.current_samples_per_s:,.0f} at {p.current_cost_per_hour:.4g}/h)"
        )
        if p.from_file:
            figures += f" ({', '.join(p.from_file)}: never measured by this job, priced from the cluster file)"
        if action.decision == "move":
            return f"{PREFIX}adapt: moving at the next checkpoint: {action.why} {figures}"
        if action.decision == "would move":
            return f"{PREFIX}adapt (advise: doing nothing): would move: {action.why} {figures}"
        return f"{PREFIX}adapt: {action.why} {figures}"
    if isinstance(action, e.ReplaceAdvice):
        slow = action.replacement
        if action.decision == "replace":
            return (
                f"{PREFIX}adapt: replacing host {slow.host}: {action.why}; at the first checkpoint after a machine of "
                f"type {slow.resource} stands by the job moves onto it and lets {slow.host} go"
            )
        return f"{PREFIX}adapt (advise: doing nothing): would replace host {slow.host}: {action.why}"
    if isinstance(action, e.OnScale):
        return (
            f"{PREFIX}adapt: asking --on-scale for {', '.join(f'{u} x {t}' for t, u in sorted(action.wanted.items()))}"
        )
    return None


def round_title(action: e.NextRound, job: Job) -> str:
    new, kind = action.round, action.change.kind
    if kind is Kind.RETRY:
        left = job.rules.connect_retries - new.retries_used
        return f"retry {new.retries_used} after Paddle's connect-timeout abort ({left} left; round {new.number})"
    if kind is Kind.RESTART:
        return f"restart {new.restarts_used} ({job.rules.restarts - new.restarts_used} left; round {new.number})"
    if kind is Kind.LEAVE:
        return f"going on without the host(s) that left (round {new.number})"
    if kind is Kind.ADAPT:
        return f"the plan follows the job: moving to another plan (round {new.number})"
    return f"moving to another plan (round {new.number})"


def _what(action: e.NextRound) -> str:
    change = action.change
    return f"lost {', '.join(change.lost_now)}" if change.lost_now else change.reason
