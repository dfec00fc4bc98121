"""heterps launch's console and logs: its own lines, the job's progress echoed from the processes' logs, and, on a
host of a launch across hosts other than the coordinator's, every line also sent there (launch/member.py:
LogForwarder), whose console prints the lines other hosts send it."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from typing import Any

from heterps_paddle.files import new_lines
from heterps_paddle.launch.member import LogForwarder

OWN_PREFIX = "heterps launch:"
LAUNCHER_LOG = "launcher.log"
# The logs Paddle's launcher writes into --log_dir, one per process.  A one-host attempt that is started again has
# these and LAUNCHER_LOG moved aside (aborted-N/), so that the log directory holds the attempt that ran last.
PROCESS_LOG = re.compile(r"(worker|server|heter)log\.\d+")
# Progress and failures (Paddle's "C++ Traceback" / "FatalError: Termination signal" of processes its launcher stops
# at the end of a good job are neither).
ECHO = re.compile(
    r"^heterps: |HETERPS-FATAL|\bepoch \d+|^RESULT |^Traceback \(most recent call last\)|^(?!Fatal)\w+Error: "
)
BATCH_LINE = re.compile(r"batch: \[\d+\]")
BATCH_ECHO_EVERY_S = 10.0


class Console:
    """This host's console; on a host of a launch across hosts other than the coordinator's, every line is also
    sent there (launch/coordinator.py), and the coordinator's prints the lines other hosts send it."""

    def __init__(self) -> None:
        self.forwarder: LogForwarder | None = None
        self.lock = threading.Lock()

    def line(self, text: str, stream: Any = None) -> None:
        with self.lock:
            try:
                print(text, file=stream or sys.stdout, flush=True)
            except OSError:
                pass
        if self.forwarder is not None:
            self.forwarder.send(text)

    def error(self, text: str) -> None:
        self.line(text, sys.stderr)

    def remote(self, text: str) -> None:
        with self.lock:
            print(text, flush=True)

    def close(self) -> None:
        if self.forwarder is not None:
            self.forwarder.close()


def relay(stream: Any, path: str, console: Console) -> None:
    """Everything the launcher process prints into ``path``; heterps launch's own lines also to the console."""
    with open(path, "wb") as log:
        for raw in iter(stream.readline, b""):
            log.write(raw)
            log.flush()
            if raw.startswith(OWN_PREFIX.encode()):
                console.error(raw.decode("utf-8", "replace").rstrip("\n"))


def echo_logs(log_dir: str, started: float, stop: threading.Event, console: Console) -> None:
    """Print the job's progress lines as they are written (a best effort: partial lines wait for their end)."""
    offsets: dict[str, int] = {}
    last_batch: dict[str, float] = {}
    while not stop.wait(1.0):
        _echo_once(log_dir, offsets, last_batch, console)
    _echo_once(log_dir, offsets, last_batch, console)


def _echo_once(log_dir: str, offsets: dict[str, int], last_batch: dict[str, float], console: Console) -> None:
    try:
        names = sorted(n for n in os.listdir(log_dir) if PROCESS_LOG.fullmatch(n))
    except OSError:
        return
    for name in names:
        offsets[name], lines = new_lines(os.path.join(log_dir, name), offsets.get(name, 0))
        for line in lines:
            show = bool(ECHO.search(line))
            if not show and BATCH_LINE.search(line):
                now = time.monotonic()
                show = now - last_batch.get(name, 0.0) >= BATCH_ECHO_EVERY_S
                if show:
                    last_batch[name] = now
            if show:
                console.line(f"[{name}] {line.strip()}")


def keep_attempt_logs(log_dir: str, attempt: int) -> str:
    """Move one attempt's logs (PROCESS_LOG and LAUNCHER_LOG) from ``log_dir`` into a new ``log_dir/aborted-N``; its path.  Only the
    files the launch writes are moved: a log directory may hold the user's own files too."""
    number = attempt
    while os.path.exists(os.path.join(log_dir, f"aborted-{number}")):
        number += 1
    kept = os.path.join(log_dir, f"aborted-{number}")
    os.makedirs(kept)
    for name in sorted(os.listdir(log_dir)):
        if (PROCESS_LOG.fullmatch(name) or name == LAUNCHER_LOG) and os.path.isfile(os.path.join(log_dir, name)):
            os.replace(os.path.join(log_dir, name), os.path.join(kept, name))
    return kept


def failure_lines(failure: str, log: str | None, job_goes_on: bool) -> list[str]:
    """What a failure of this host's processes is on its console: ``aborted`` when the job starts again after it
    (a retry, a restart), ``FAILED`` when it ends the job here; then the failed process's log's last lines."""
    lines = [f"{OWN_PREFIX} {'aborted' if job_goes_on else 'FAILED'}: {failure}"]
    if log:
        lines.append(log_tail(log))
    return lines


def log_tail(path: str, lines: int = 12) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            tail = [line.rstrip() for line in f.readlines()[-lines:]]
    except OSError:
        return f"{OWN_PREFIX} {path}: unreadable"
    return f"{OWN_PREFIX} last {len(tail)} lines of {path}:\n" + "\n".join(f"{OWN_PREFIX} | {t}" for t in tail)
