"""The job's state machine's vocabulary (launch/machine.py): the events it takes (what the shells saw: facts) and
the actions it asks for (what they carry out).  Frozen records, no behaviour, no wording: the shells render wire
messages, console lines and event-log records from the actions (launch/render.py)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping, Union

from heterps_paddle.launch.gauge import Rates
from heterps_paddle.launch.state import Change, Kind, Replacement, Round

# ------------------------------------------------------------------------------------------------ the events


@dataclass(frozen=True)
class Joined:
    """A host of the round's placement joined (``digest``: of the plan and placement it was given)."""

    host: str
    digest: str


@dataclass(frozen=True)
class SpareJoined:
    """A host stands by: it runs nothing of this round (a spare, or a lost host started again).  ``digest``: of the
    first round's plan and placement, from the files it was given."""

    host: str
    digest: str
    newest_checkpoint: float  # passes done in the newest complete checkpoint as it joined (0: none)
    # a machine from outside the hosts file (heterps launch --join): what it is (type, units, port); None: a host
    # of the file
    joining: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class LeaveAsked:
    """``host`` asks to leave the job (SIGTERM to its heterps launch, or ``heterps launch --leave``): a checkpoint,
    then the job goes on without it; at the latest after ``grace_s``."""

    host: str
    grace_s: float
    # passes done in the newest checkpoint complete or captured as it asked (0: none; coordinator.newest_captured)
    newest_checkpoint: float


@dataclass(frozen=True)
class ProcessFailed:
    """A process of ``host`` failed; ``connect_timeout``: the first that failed was Paddle's connect-timeout abort
    (launch/paddle_aborts.py), which a fresh start gets past."""

    host: str
    round: int
    reason: str
    connect_timeout: bool = False


@dataclass(frozen=True)
class HostGone:
    """``host``'s launch went away: its connection closed (``why``: the coordinator closed it, saying why)."""

    host: str
    round: int
    why: str = ""


@dataclass(frozen=True)
class HostSilent:
    """``host`` said nothing for ``seconds`` (HETERPS_HOST_TIMEOUT)."""

    host: str
    round: int
    seconds: float


@dataclass(frozen=True)
class SpareGone:
    """A standing-by host's connection closed before it was told anything."""

    host: str


@dataclass(frozen=True)
class Done:
    """``host``'s CPU trainers finished (a host without any says so when its processes are all up and well)."""

    host: str
    round: int


@dataclass(frozen=True)
class CheckpointComplete:
    """The newest complete checkpoint holds ``passes`` passes."""

    passes: float  # a fraction for a checkpoint inside a pass (the shards done of the next one)


@dataclass(frozen=True)
class Tick:
    """Time passed (the shells send one about every second): the startup and settling deadlines."""


@dataclass(frozen=True)
class Planned:
    """The plan of the round asked for (Replan).  ``better``: it beats the running one (planning/replan.py)."""

    plan: Mapping[str, Any]
    members: Mapping[str, bool]
    coordinator: str
    digest: str
    report: Mapping[str, Any]  # old and new plans, how the new one was chosen (the event log, restarts.json)
    checkpoint: Mapping[str, Any]  # the checkpoint the round resumes from and the work redone
    at: str  # the time, as the event log writes it
    better: bool = True
    released: Mapping[str, float] = field(default_factory=dict)  # an adaptive move: hosts it lets go -> saves/h


@dataclass(frozen=True)
class PlanFailed:
    """No plan for the round asked for: ``expected`` when the inputs allow none (an error the user can act on)."""

    detail: str
    expected: bool = True


@dataclass(frozen=True)
class Proposal:
    """What another plan would do, on the cost model the measurements corrected (planning/refit.py), beside the
    running plan on the same corrected model: the shell's answer to Reconsider (launch/rounds.py: propose)."""

    plan: Mapping[str, Any]  # the proposed plan, as its file holds it
    summary: str  # the running plan -> the proposed one
    samples_per_s: float  # the proposed plan's, predicted on the corrected model
    cost_per_hour: float
    meets_target: bool
    current_samples_per_s: float  # the running plan's, predicted on the corrected model
    current_cost_per_hour: float
    target: float | None = None
    budget: float | None = None
    released: Mapping[str, float] = field(default_factory=dict)  # hosts it runs nothing on -> what each costs an hour
    wanted: Mapping[str, int] = field(default_factory=dict)  # units a plan meeting the target needs beyond the hosts
    refit: Mapping[str, Any] = field(default_factory=dict)  # the correction (planning/refit.py: Refit.to_dict)
    why: str = ""  # why the machine asked
    same: bool = False  # the proposed plan is the running one (its stages, layers and units)
    # the resource types of the proposed plan with a layer the job never measured on them (no host of that type was
    # timed, no window ran it there): those layers are priced on the cluster file's figures alone
    from_file: tuple[str, ...] = ()
    correction: Any = field(default=None, compare=False, repr=False)  # the Refit itself, for the rounds after

    @property
    def better_by(self) -> float:
        """The share of the running plan's cost per hour the proposal saves."""
        if self.current_cost_per_hour <= 0:
            return 0.0
        return 1.0 - self.cost_per_hour / self.current_cost_per_hour


@dataclass(frozen=True)
class Proposed:
    """The shell's answer to Reconsider: another plan (or None: no plan runs the job on what it has)."""

    proposal: Proposal | None
    detail: str = ""  # why there is none


@dataclass(frozen=True)
class Measured:
    """The job's measured rates over the last window (launch/gauge.py: Rates), made by the shell from the trainers'
    measurements."""

    rates: Rates
    whole: bool = True  # a whole window (a round's first windows are shorter): the refit corrects by whole ones


Event = Union[
    Joined,
    SpareJoined,
    LeaveAsked,
    ProcessFailed,
    HostGone,
    HostSilent,
    SpareGone,
    Done,
    CheckpointComplete,
    Tick,
    Planned,
    PlanFailed,
    Measured,
    Proposed,
]
EVENTS: tuple[type, ...] = Event.__args__  # type: ignore[attr-defined]

# ------------------------------------------------------------------------------------------------ the actions
# What to tell a connection, a round's hosts or the spares; what to do; and the facts worth a console line and a
# record of the event log (the notes at the end).


class Dismissal(enum.Enum):
    """Why a connection is told the job is over for it."""

    ENDED = "ended"  # the job ended
    ABORTED = "aborted"  # the job ended on a failure
    LEFT = "left"  # the host left the job on notice


@dataclass(frozen=True)
class Refuse:
    """Answer the connection that just joined as ``host`` with an abort (the job goes on without it)."""

    host: str
    reason: str


@dataclass(frozen=True)
class StandBy:
    """Answer a spare that joined: it stands by in round ``round``."""

    host: str
    round: int


@dataclass(frozen=True)
class LeaveAnswer:
    """Answer ``host``'s request to leave."""

    host: str
    accepted: bool
    reason: str


@dataclass(frozen=True)
class Dismiss:
    """Tell ``host`` (standing by, or of the round) that the job is over for it, and why."""

    host: str
    why: Dismissal
    reason: str = ""  # the abort's


@dataclass(frozen=True)
class Start:
    """Every host of the round joined: tell them to start (with a new launch id)."""

    hosts: tuple[str, ...]
    digest: str


@dataclass(frozen=True)
class Beat:
    """Tell every connected host of the round that the coordinator is there."""


@dataclass(frozen=True)
class EndAll:
    """Every host's CPU trainers finished: tell every host of the round, and every spare, the end."""


@dataclass(frozen=True)
class AbortAll:
    """The launch ends on a failure: tell every host of the round, and every spare, why."""

    reason: str


@dataclass(frozen=True)
class AskCheckpoint:
    """Ask the round's trainers for a checkpoint once the trainers have trained the shards in hand; with ``hold_s``, they train
    no further once it is captured, for that long at most (the round ends at it: a leave)."""

    reason: str
    hold_s: float = 0.0


@dataclass(frozen=True)
class Replan:
    """Plan the next round for the hosts the job has (the hosts file's and ``joined``, less ``lost``); answer
    Planned or PlanFailed."""

    lost: frozenset[str]
    kind: Kind
    joined: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # Job.extra
    # an adaptive move the machine decided: its plan is the next round's, as decided (never planned again)
    decided: Proposal | None = None
    refit: Any = field(default=None, compare=False)  # Job.refit: the correction later plans are made on


@dataclass(frozen=True)
class NextRound:
    """Start ``round`` (``change`` led to it; ``joined``: every machine from outside the hosts file, as every host
    expands them): tell every host and spare, write the history, a new board.  ``released``: hosts the new plan lets
    go (an adaptive move), and what each costs an hour."""

    round: Round
    change: Change
    summary: str  # the old plan -> the new plan, how it was chosen
    joined: tuple[Mapping[str, Any], ...]
    released: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Reconsider:
    """Plan again on the cost model the measured rates correct, over the job's hosts and standing spares; answer
    Proposed.  ``missed``: the target has been missed over a window."""

    why: str
    missed: bool
    windows: tuple[Rates, ...] = field(default=(), compare=False)  # Seen.windows: what corrects the model
    refit: Any = field(default=None, compare=False)  # Job.refit: the earlier rounds' correction, merged under it


@dataclass(frozen=True)
class OnScale:
    """Ask the user's command (--on-scale) for units the plan needs and the job has not, and say what was let go."""

    wanted: Mapping[str, int]
    released: Mapping[str, float]
    why: str


# ---- notes: facts of the job's life, for the console and the event log


@dataclass(frozen=True)
class Settling:
    """A failure was seen: the job will start again after settling, as a ``kind`` (retry or restart), with
    ``left`` of that kind left."""

    reason: str
    kind: Kind
    left: int


@dataclass(frozen=True)
class HostBack:
    """A lost host stands by again, or a machine from outside the hosts file joined (``joining``: what it is);
    ``moves``: the job moves to a plan with it at the next checkpoint, if better (it keeps checkpoints)."""

    host: str
    joining: Mapping[str, Any] | None
    moves: bool


@dataclass(frozen=True)
class SpareLeft:
    """A standing-by host left the job on notice."""

    host: str


@dataclass(frozen=True)
class SpareLost:
    """A standing-by host went away: counted as lost."""

    host: str


@dataclass(frozen=True)
class LeaveNoted:
    """A host of the round asked to leave: a checkpoint, then the job goes on without it (within ``grace_s``)."""

    host: str
    grace_s: float


@dataclass(frozen=True)
class MoveDeclined:
    """With ``hosts`` back, the plan would be ``plan`` (summary), no better than the running one: no move."""

    hosts: tuple[str, ...]
    plan: str


@dataclass(frozen=True)
class AdaptAdvice:
    """What the measurements say the job should do (``decision``: move, would-move in advise mode, wish for units),
    with the figures that decided it."""

    decision: str
    why: str
    proposal: Proposal


@dataclass(frozen=True)
class ReplaceAdvice:
    """A slow host to replace (``decision``: replace, or would replace in advise mode): a unit of its type is asked
    for, and at the first checkpoint after one stands by the job moves onto it and lets the slow host go."""

    decision: str
    why: str
    replacement: Replacement


@dataclass(frozen=True)
class MoveImpossible:
    """No plan with ``hosts`` back (``detail``): the job goes on."""

    hosts: tuple[str, ...]
    detail: str


Action = Union[
    Refuse,
    StandBy,
    LeaveAnswer,
    Dismiss,
    Start,
    Beat,
    EndAll,
    AbortAll,
    AskCheckpoint,
    Replan,
    NextRound,
    Settling,
    HostBack,
    SpareLeft,
    SpareLost,
    LeaveNoted,
    MoveDeclined,
    MoveImpossible,
    Reconsider,
    OnScale,
    AdaptAdvice,
    ReplaceAdvice,
]
NOTES: tuple[type, ...] = (
    Settling,
    HostBack,
    SpareLeft,
    SpareLost,
    LeaveNoted,
    MoveDeclined,
    MoveImpossible,
    AdaptAdvice,
    ReplaceAdvice,
)
