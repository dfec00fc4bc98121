"""How one run of Paddle's launcher ended, as the process that ran it (launch/child.py) tells heterps launch: the
facts, never a decision.  Whether a failure is retried, restarted or ends the job is the machine's
(launch/machine.py).

The launcher runs in a child process of its own session (so that nothing of the job outlives it); the child writes
one RunResult as one JSON line into a pipe heterps launch gave it (``RESULT_FD_ENV``), which heterps launch reads
while the child runs.  No result (the child was killed, or crashed before writing it) reads as a failure.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

RESULT_FD_ENV = "HETERPS_RESULT_FD"  # the pipe the child writes its RunResult to


class Outcome(enum.Enum):
    SUCCEEDED = "succeeded"  # every process did well (across hosts: the job ended)
    FAILED = "failed"  # a process failed, or the launch across hosts ended on a failure
    NEW_ROUND = "new_round"  # across hosts: the coordinator started a new round (``told``: its message)


@dataclass(frozen=True)
class RunResult:
    outcome: Outcome
    failure: str | None = None  # what failed, named, the likeliest cause first (launch/supervisor.py)
    log: str | None = None  # the log of the process that failed first
    connect_timeout: bool = False  # that process was Paddle's connect-timeout abort (launch/paddle_aborts.py)
    told: Mapping[str, Any] | None = None  # across hosts: the coordinator's word that ended the round

    def line(self) -> bytes:
        document = {
            "outcome": self.outcome.value,
            "failure": self.failure,
            "log": self.log,
            "connect_timeout": self.connect_timeout,
            "told": None if self.told is None else dict(self.told),
        }
        return json.dumps(document).encode() + b"\n"

    def send(self, fd: str | None) -> None:
        """To heterps launch, through the pipe it named (``RESULT_FD_ENV``; None: a child run by hand)."""
        if not fd:
            return
        data = self.line()
        try:
            while data:
                data = data[os.write(int(fd), data) :]
        except OSError:
            pass  # heterps launch is gone: nobody to tell
        finally:
            try:
                os.close(int(fd))
            except OSError:
                pass

    @staticmethod
    def parse(data: bytes, exit_code: int) -> RunResult:
        """The child's result from what it wrote, or a failure when it wrote none (``exit_code``: how it ended)."""
        try:
            document = json.loads(data.decode("utf-8"))
            return RunResult(
                Outcome(document["outcome"]),
                document.get("failure"),
                document.get("log"),
                bool(document.get("connect_timeout")),
                document.get("told"),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return RunResult(Outcome.FAILED, f"the launcher process ended (status {exit_code}) without a result")
