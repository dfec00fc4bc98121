"""What one host's launch goes through, round by round (launch/driver.py's loop): a turn, how it ran, what the job
decided after it, how the job ended for the host; and the shell the loop asks (one host or a host of a job across
hosts)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from heterps_paddle.launch.hosts import HostRound
from heterps_paddle.launch.options import LaunchOptions
from heterps_paddle.launch.result import RunResult

LOCAL_ADDRESS = "127.0.0.1"  # Paddle's launcher's address for the processes of a one-host job
FAILED_EXIT = 1


@dataclass(frozen=True)
class Turn:
    """One round of this host: its number, the launcher's options, and across hosts this host's part of it."""

    number: int
    options: LaunchOptions
    part: HostRound | None = None  # None: one host
    launch_id: str | None = None  # one host: the id its board is named by (rendezvous.py)

    @property
    def spare(self) -> bool:
        return self.part is not None and self.part.spare


@dataclass(frozen=True)
class Ran:
    """One round of this host, as its child reported it: the facts, where its logs are, the child's exit status."""

    result: RunResult
    log_dir: str
    code: int


@dataclass(frozen=True)
class HostEnd:
    """How the job ended for this host: its launch's exit status, and what the event log says of it."""

    code: int
    how: str  # finished | left | released | failed
    log_dir: str
    reason: str = ""


@dataclass(frozen=True)
class Verdict:
    """What the job decided after a round of this host: the next round, or this host's end; the lines that say it."""

    next: Turn | None = None
    end: HostEnd | None = None
    lines: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()  # the same, for stderr


class JobMaster(Protocol):
    """What a round on the coordinator's host asks of the job's coordinator (launch/coordinator.py), which it holds
    only to close: on a signal, every member hears why before the host goes."""

    def close(self, wait_s: float = 15.0, late_joiners_s: float = 30.0) -> None: ...


class Shell(Protocol):
    """Where the job's decisions come from (module doc)."""

    def first(self) -> Turn | HostEnd: ...

    def stand_by(self, turn: Turn) -> Ran: ...

    def coordinator(self) -> JobMaster | None: ...

    def after(self, turn: Turn, ran: Ran) -> Verdict: ...

    def close(self) -> None: ...
