"""The job's state as its state machine (launch/machine.py) keeps it, in records by how long they last: the rules
(the job's whole life, fixed), the job (its whole life), a round (its plan, fixed when it is decided) and what a
round has seen so far (replaced whole when the next round starts).  Frozen records, no behaviour."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping

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
class Change:
    """A new round asked for and not yet planned."""

    kind: Kind
    lost: frozenset[str]  # every host lost when it was decided
    lost_now: tuple[str, ...]  # those this change lost
    reason: str
    back: tuple[str, ...] = ()  # a move: the hosts back (or joined)
    left: tuple[str, ...] = ()  # a leave: the hosts that asked to leave


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


@dataclass(frozen=True)
class Job:
    """The job as the machine knows it, for its whole life.  Build the first with :func:`first_job`."""

    rules: Rules
    round: Round
    seen: Seen
    state: JobState = JobState.JOINING
    lost: frozenset[str] = frozenset()  # every host lost and not back
    back: Mapping[str, int] = field(default_factory=dict)  # lost hosts back -> newest checkpoint's passes then
    # machines that joined from outside the hosts file (heterps launch --join) -> what they said they are: type,
    # units, port (planning/hosts.py: Host); for the job's life, lost or not
    extra: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # hosts that asked to leave -> (the time they go at the latest, the newest checkpoint's passes when they asked)
    leaving: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    reason: str | None = None  # why the launch aborted
    measured: Any = None  # the running round's measured rates, the newest (launch/gauge.py: Rates)
    history: tuple[RoundChange, ...] = ()  # every change of round

    @property
    def restarts_left(self) -> int:
        return self.rules.restarts - self.round.restarts_used

    @property
    def retries_left(self) -> int:
        return self.rules.connect_retries - self.round.retries_used


def first_job(rules: Rules, round_: Round, now: float) -> Job:
    return Job(rules, round_, Seen(startup_deadline=now + rules.startup_s))
