"""How one run of Paddle's launcher ended, as the process that ran it (launch/child.py) tells heterps launch.

The launcher runs in a child process of its own session (so that nothing of the job outlives it); the child writes
one RunResult, whole or not at all, to the file the parent named (``RESULT_ENV``).  No result (the child was
killed, or crashed before writing it) reads as a failure.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

from heterps_paddle.files import write_atomic

RESULT_ENV = "HETERPS_RUN_RESULT"  # where the child writes its RunResult
RETRIES_LEFT_ENV = "HETERPS_CONNECT_RETRIES_LEFT"  # one host: whether a connect-timeout abort will be retried


class RunState(enum.Enum):
    SUCCEEDED = "succeeded"  # every process did well (across hosts: the job ended)
    FAILED = "failed"  # a process failed, or the launch across hosts ended on a failure
    RETRYABLE = "retryable"  # failed first on Paddle's connect-timeout abort (launch/paddle_aborts.py), one host
    NEW_ROUND = "new_round"  # across hosts: the coordinator started a new round (``restart``: its message)


@dataclass(frozen=True)
class RunResult:
    state: RunState
    failure: str | None = None
    restart: Mapping[str, Any] | None = None

    def write(self, path: str) -> None:
        document = {"state": self.state.value, "failure": self.failure, "restart": self.restart}
        write_atomic(path, json.dumps(document) + "\n")

    @staticmethod
    def read(path: str, exit_code: int) -> RunResult:
        """The child's result, or a failure when it left none (``exit_code``: how it ended)."""
        try:
            with open(path, encoding="utf-8") as f:
                document = json.load(f)
            return RunResult(RunState(document["state"]), document.get("failure"), document.get("restart"))
        except (OSError, ValueError, KeyError, TypeError):
            return RunResult(RunState.FAILED, f"the launcher process ended (status {exit_code}) without a result")
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass
