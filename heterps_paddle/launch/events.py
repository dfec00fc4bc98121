"""The job's state machine's vocabulary (launch/machine.py): the events it takes (what the shells saw) and the
actions it asks for (what they carry out).  Frozen records, no behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Union

from heterps_paddle.launch.state import Kind, Round

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
    newest_checkpoint: int  # the passes of the newest complete checkpoint as it joined (0: none)
    # a machine from outside the hosts file (heterps launch --join): what it is (type, units, port); None: a host
    # of the file
    joining: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class LeaveAsked:
    """``host`` asks to leave the job (SIGTERM to its heterps launch, or ``heterps launch --leave``): a checkpoint,
    then the job goes on without it; at the latest after ``grace_s``."""

    host: str
    grace_s: float
    newest_checkpoint: int  # the passes of the newest complete checkpoint as it asked (0: none)


@dataclass(frozen=True)
class ProcessFailed:
    """A process of ``host`` failed; ``retryable``: it was Paddle's connect-timeout abort."""

    host: str
    round: int
    reason: str
    retryable: bool = False


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

    passes: int


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
    report: Mapping[str, Any]  # old and new plans, how the new one was chosen (restarts.json)
    checkpoint: Mapping[str, Any]  # the checkpoint the round resumes from and the work redone (restarts.json)
    at: str  # the time, as restarts.json writes it
    better: bool = True


@dataclass(frozen=True)
class PlanFailed:
    """No plan for the round asked for: ``expected`` when the inputs allow none (an error the user can act on)."""

    detail: str
    expected: bool = True


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
]

# ------------------------------------------------------------------------------------------------ the actions


@dataclass(frozen=True)
class Say:
    """A line for the coordinator's console."""

    text: str


@dataclass(frozen=True)
class Refuse:
    """Answer the connection that just joined as ``host`` with an abort (the job goes on without it)."""

    host: str
    reason: str


@dataclass(frozen=True)
class Reply:
    """Answer a standing-by host."""

    host: str
    message: Mapping[str, Any]


@dataclass(frozen=True)
class Start:
    """Every host of the round joined: tell them to start (with a new launch id)."""

    hosts: tuple[str, ...]
    digest: str


@dataclass(frozen=True)
class Beat:
    """Tell every connected host of the round that the coordinator is there."""


@dataclass(frozen=True)
class Tell:
    """Tell every connected host of the round ``message``; ``spares`` too (who are then let go)."""

    message: Mapping[str, Any]
    spares: bool = True


@dataclass(frozen=True)
class LetGo:
    """Tell ``host`` (standing by, or of the round) ``message``: the job goes on without it."""

    host: str
    message: Mapping[str, Any]


@dataclass(frozen=True)
class AskCheckpoint:
    """Ask the round's trainers for a checkpoint at the end of the running pass."""

    reason: str


@dataclass(frozen=True)
class Replan:
    """Plan the next round for the hosts the job has (the hosts file's and ``joined``, less ``lost``); answer
    Planned or PlanFailed."""

    lost: frozenset[str]
    kind: Kind
    joined: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # Job.extra


@dataclass(frozen=True)
class NextRound:
    """Start ``round``: write the history (restarts.json), tell every host and spare ``message``, a new board."""

    round: Round
    message: Mapping[str, Any]
    history: tuple[Mapping[str, Any], ...]


Action = Union[Say, Refuse, Reply, Start, Beat, Tell, LetGo, AskCheckpoint, Replan, NextRound]
