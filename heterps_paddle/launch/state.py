"""The job's state as its state machine (launch/machine.py) keeps it, in records by how long they last: the rules
(the job's whole life, fixed), the job (its whole life), a round (its plan, fixed when it is decided) and what a
round has seen so far (replaced whole when the next round starts).  Frozen records, no behaviour."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from heterps_paddle.launch.gauge import Rates

# ------------------------------------------------------------------------------------------------ the records


class JobState(enum.Enum):
    JOINING = "joining"  # the round's hosts are joining; nothing of it runs yet
    RUNNING = "running"  # every host joined: the round runs
    SETTLING = "settling"  # a failure was seen; waiting to learn what else it takes with it
    REPLANNING = "replanning"  # a new round's plan was asked for (Replan out; Planned or PlanFailed back)
    ENDED = "ended"  # every host's CPU trainers finished
    ABORTED = "aborted"  # the launch ended on a failure (Job.reason)

    @property
    def over(self) -> bool:
        return self in (JobState.ENDED, JobState.ABORTED)


class Kind(enum.Enum):
    """Why a round follows another (``kind`` in the event log and restarts.json)."""

    RESTART = "restart"  # hosts were lost or a process failed: re-planned for what is left, uses up --restarts
    RETRY = "retry"  # Paddle's connect-timeout abort: the same plan on the same hosts, uses up a retry only
    MOVE = "move"  # a lost host is back, or a machine joined: a better plan at a checkpoint, uses up nothing
    LEAVE = "leave"  # a host asked to leave: re-planned without it at a checkpoint, uses up nothing
    ADAPT = "adapt"  # the measured rates say another plan does better: at a checkpoint, uses up nothing


@dataclass(frozen=True)
class Adapt:
    """How the job follows its measurements (--adapt, docs/adaptive.md): every margin a setting."""

    mode: str = "off"  # off | advise (log what it would do) | on (do it)
    miss: float = 0.10  # the target missed by more than this share ...
    sustain_s: float = 45.0  # ... for this long is a miss (noise under it never moves the job)
    saving: float = 0.15  # a plan that meets the target for at least this share less is worth a move ...
    faster: float = 0.15  # ... and under a budget, one at least this share faster
    every_s: float = 30.0  # seconds between two reconsiderations (each plans again)
    cooldown: int = 2  # checkpoints after a move before another, unless the target is missed
    move_s: float = 60.0  # what a move costs, seconds of the job (checkpoint, restart, restore) until one is measured
    horizon_s: float = 0.0  # how long the job is expected to run on (0: as long again as it has run)
    straggler_windows: int = 3  # a host slow in this many of its comparisons in a row (and a miss) is replaced

    @property
    def active(self) -> bool:
        return self.mode in ("advise", "on")


@dataclass(frozen=True)
class Rules:
    """What the launch allows: its options and settings, fixed for the job's life."""

    restarts: int = 0  # --restarts N
    connect_retries: int = 0  # HETERPS_CONNECT_RETRIES
    settle_s: float = 5.0
    startup_s: float = 120.0  # HETERPS_STARTUP_TIMEOUT, per round
    can_replan: bool = True  # a re-planner is there: without one any failure ends the launch
    checkpoints: bool = False  # --checkpoint-dir: a host back moves the job at the next complete checkpoint
    # who may stand by: a host of the hosts file that was given the same files (the first round's digest); an
    # empty file_hosts admits none
    file_hosts: frozenset[str] = frozenset()
    files_digest: str = ""
    adapt: Adapt = Adapt()
    started_at: float = 0.0  # the job's start, on the machine's clock (how long it has run)


@dataclass(frozen=True)
class Round:
    """One round of the job: its plan and placement, the hosts out, and what was used up to get here.  Fixed when
    the round is decided."""

    number: int
    members: Mapping[str, bool]  # every host that runs a process of the plan -> whether it runs CPU trainers
    coordinator: str  # server 0's host
    digest: str  # of the plan and placement: every host of the round has the same
    plan: Mapping[str, Any] | None = None  # as its file holds it (None: the first round's, from the launch's files)
    lost: frozenset[str] = frozenset()  # the hosts lost when the round was planned
    resumes_from: str | None = None  # the complete checkpoint the round resumes from, when it was decided
    joined: frozenset[str] = frozenset()  # the machines from outside the hosts file its plan was made with
    retries_used: int = 0
    restarts_used: int = 0

    @property
    def trainer_hosts(self) -> frozenset[str]:
        return frozenset(host for host, trains in self.members.items() if trains)


@dataclass(frozen=True)
class Replacement:
    """A host whose CPU trainers measured slow against their peers in the same pass, window after window, while the
    job missed its target: a unit of its type is asked for, and the job moves onto it and lets the host go."""

    host: str
    resource: str  # its type (stage 1's)
    price_per_hour: float  # what letting it go saves (0.0: the plan has no prices)
    share: float  # its trainers' samples/s over their peers' median, in the newest window that compared them
    windows: int  # the comparisons in a row that found it slow


@dataclass(frozen=True)
class Change:
    """A new round asked for and not yet planned."""

    kind: Kind
    lost: frozenset[str]  # every host lost when it was decided
    lost_now: tuple[str, ...]  # those this change lost
    reason: str
    back: tuple[str, ...] = ()  # a move: the hosts back (or joined)
    left: tuple[str, ...] = ()  # a leave: the hosts that asked to leave
    proposal: Any = None  # an adaptive move: the Proposal that decided it (launch/events.py)
    replaced: Mapping[str, float] = field(default_factory=dict)  # slow hosts it lets go -> what each saves an hour


@dataclass(frozen=True)
class RoundChange:
    """One change of round, as the job's history keeps it (the event log's ``round_planned`` record, and
    restarts.json, derived from it)."""

    round: int  # the new round's number
    kind: Kind
    at: str  # when it was decided, as the log writes times
    why: str
    lost: tuple[str, ...]  # the hosts this change lost
    lost_so_far: tuple[str, ...]  # every host lost when it was decided
    left: tuple[str, ...]  # the hosts that left on notice with it
    released: tuple[str, ...]  # the hosts an adaptive move let go
    joined: tuple[Mapping[str, Any], ...]  # machines from outside the hosts file it takes in (address, type, ...)
    hosts: tuple[str, ...]  # the hosts the new round runs on
    checkpoint: Mapping[str, Any]  # the checkpoint it resumes from, and the work redone
    report: Mapping[str, Any]  # the old and new plans, how the new one was chosen

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "kind": self.kind.value,
            "at": self.at,
            "why": self.why,
            "lost": list(self.lost),
            "lost_so_far": list(self.lost_so_far),
            "left": list(self.left),
            "released": list(self.released),
            "joined": [dict(j) for j in self.joined],
            "hosts": list(self.hosts),
            **dict(self.checkpoint),
            **dict(self.report),
        }


@dataclass(frozen=True)
class Seen:
    """What the running round has seen so far.  A new round starts from a fresh one: nothing of it carries over."""

    startup_deadline: float = 0.0  # every host of the round joins before it
    started: bool = False  # every host joined and was told to start
    joined: frozenset[str] = frozenset()  # the round's hosts connected
    gone: frozenset[str] = frozenset()  # the round's hosts whose connection closed (or that were refused late)
    silent: frozenset[str] = frozenset()  # the round's hosts that stopped answering
    done: frozenset[str] = frozenset()  # the round's hosts whose CPU trainers finished
    spares: frozenset[str] = frozenset()  # hosts standing by (they run nothing of this round)
    trouble: tuple[str, ...] = ()  # the failures being settled
    settle_at: float | None = None
    connect_timeout: bool = False  # the failure being settled began with Paddle's connect-timeout abort
    pending: Change | None = None  # the new round asked for (state REPLANNING)
    rates: tuple[tuple[float, Rates], ...] = ()  # the round's measured rates (when, Rates), the newest last
    # the round's last WINDOWS_KEPT whole windows (a round's first, shorter ones are not what its plan trains):
    # what a reconsideration corrects the cost model by (planning/refit.py: the median of their corrections)
    windows: tuple[Rates, ...] = ()
    # when the round's first window that trained was measured: the windows of its processes starting (seconds on a
    # busy machine) trained nothing, and are no miss
    trained_at: float | None = None
    # every window's samples/s since then, summed, and how many: the round's mean (a wish for a machine is judged on it)
    trained_sum: float = 0.0
    trained_windows: int = 0
    asked_at: float | None = None  # when the machine last asked to reconsider the plan
    adapting: Any = None  # an adaptive move decided: the Proposal, waiting for the next complete checkpoint
    adapt_from: float = 0.0  # ... the newest checkpoint's passes done when it was decided
    wished: bool = False  # units asked for (--on-scale) in this round
    advised: frozenset[str] = frozenset()  # advise mode: the moves said already this round (once each)
    # each host's comparisons with its peers in a row that found its trainers slow (launch/gauge.py: TrainerRate)
    slow_windows: Mapping[str, int] = field(default_factory=dict)
    replacing: Replacement | None = None  # a slow host to be replaced: waiting for a machine to stand in for it


@dataclass(frozen=True)
class Job:
    """The job as the machine knows it, for its whole life.  Build the first with :func:`first_job`."""

    rules: Rules
    round: Round
    seen: Seen
    state: JobState = JobState.JOINING
    lost: frozenset[str] = frozenset()  # every host lost and not back
    back: Mapping[str, float] = field(default_factory=dict)  # lost hosts back -> newest checkpoint's passes then
    # machines that joined from outside the hosts file (heterps launch --join) -> what they said they are: type,
    # units, port (planning/hosts.py: Host); for the job's life, lost or not
    extra: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # hosts that asked to leave -> (the time they go at the latest, the newest checkpoint's passes done when they
    # asked: complete or captured)
    leaving: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    reason: str | None = None  # why the launch aborted
    measured: Rates | None = None  # the running round's measured rates, the newest
    moved_at: float | None = None  # the checkpoint (passes done) the last adaptive move resumed from
    newest_checkpoint: float = 0.0  # passes done in the newest complete checkpoint the machine was told of (a
    # fraction inside a pass)
    history: tuple[RoundChange, ...] = ()  # every change of round
    # the cost model's correction by the measured rates (planning/refit.py: Refit): the newest proposal's, which
    # merges the earlier rounds'; every later plan (a move, a restart, a host back) is made on it
    refit: Any = None

    @property
    def restarts_left(self) -> int:
        return self.rules.restarts - self.round.restarts_used

    @property
    def retries_left(self) -> int:
        return self.rules.connect_retries - self.round.retries_used


def first_job(rules: Rules, round_: Round, now: float) -> Job:
    if not rules.started_at:
        rules = replace(rules, started_at=now)
    return Job(rules, round_, Seen(startup_deadline=now + rules.startup_s))


def with_seen(job: Job, **changes: Any) -> Job:
    """``job`` with what its round has seen changed."""
    return replace(job, seen=replace(job.seen, **changes))
