"""Paddle's aborts that a fresh start of the job gets past, told from a process's log (docs/paddle-notes.md).

Paddle 2.6.2's ``HeterClient`` builds its channels to the next and previous pipeline stages without
``connect_timeout_ms``, so brpc's 200 ms default applies, and a failed RPC ends the process (a ``PADDLE_ENFORCE`` in
``OnHeterRpcDone``, SIGABRT).  On a busy machine the 200 ms can run out while the client's own brpc threads wait for
a CPU, with the peer listening: brpc's health check revives the socket about 10 ms later.  Three suite runs in six,
at a load average of 30-60 on two cores, lost a job so.  Nothing outside Paddle's C++ sets those options, so
``heterps launch`` starts such a job again (``HETERPS_CONNECT_RETRIES`` times), from its newest complete checkpoint
when it keeps them, from the start when not.

Only this one abort is retried, and only when it is the first thing that went wrong in the job (the supervisor
ranks what ended: launch/supervisor.py), so a process killed from outside, or a host that is gone, still fails the job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Paddle's message (heter_client.cc, OnHeterRpcDone): "HeterClient::SendAndRecv meets brpc error, error message is
# [E110]Fail to connect Socket{id=7 addr=127.0.0.3:19128} (0x...): Connection timed out [R1][E112]Not connected..."
_CONNECT_TIMEOUT = re.compile(
    r"HeterClient::SendAndRecv meets brpc error, error message is \[E110\]Fail to connect"
    r"(?: Socket\{id=\d+ addr=(?P<peer>[^}\s]+)\})?"
)
TAIL_BYTES = 64 * 1024  # the abort is among a process's last lines; a log can be long


@dataclass(frozen=True)
class ConnectTimeoutAbort:
    """A process that Paddle aborted because one brpc connect took longer than 200 ms."""

    peer: str  # the endpoint it was connecting to ("?" when the message does not say)

    def describe(self) -> str:
        return (
            f"Paddle's HeterClient gave up connecting to {self.peer} after brpc's fixed 200 ms connect timeout, "
            "which a busy machine can run out: docs/paddle-notes.md"
        )


def connect_timeout_abort(log_path: str | None) -> ConnectTimeoutAbort | None:
    """The abort above, if the end of the log at ``log_path`` shows it."""
    if not log_path:
        return None
    try:
        with open(log_path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = list(_CONNECT_TIMEOUT.finditer(tail))
    if not found:
        return None
    return ConnectTimeoutAbort(found[-1].group("peer") or "?")
