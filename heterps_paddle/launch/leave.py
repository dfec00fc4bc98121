"""A host leaves a launch across hosts on notice (docs/across-hosts.md, "Elastic: machines join, and leave on
notice").

A preemption notice handler, or ``kubectl delete``, sends SIGTERM to the host's ``heterps launch``; so does
``heterps launch --leave --log_dir LOG`` on that host.  The launch then asks the job's coordinator to let the host go
(a one-shot ``leave`` request on the control port, proving the job's key like every connection): the coordinator
asks the trainers for a checkpoint once the trainers have trained the shards in hand, re-plans without the host and starts the
other hosts again from that checkpoint (launch/machine.py), and this host's launch ends 0 when the job goes on
without it.  A coordinator that refuses (this host is the coordinator's, the job has ended, ...) or cannot be reached
leaves SIGTERM its old meaning: the host's processes are stopped at once.

Each launch's event log (``LOG/heterps-events.jsonl``, launch/event_log.py) says its pid and this host's address
(``launch_started``) and, at its end, how it ended (``host_ended``): that is how ``--leave`` finds it and learns
whether the host left.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any, cast

import psutil

from heterps_paddle import control, settings
from heterps_paddle.errors import EXIT_INPUT_ERROR
from heterps_paddle.launch import event_log
from heterps_paddle.launch.job import HostsJob, host_timeout
from heterps_paddle.launch.session import stop_session

ASK_TIMEOUT_S = 30.0  # a busy coordinator may take a while; the host is still running meanwhile
MAX_GRACE_S = 24 * 3600.0  # a grace time the coordinator takes (a leave is for a notice, not a schedule)
LEAVE_USAGE = "usage: heterps launch --leave --log_dir LOG (the --log_dir of the running heterps launch on this host)"


def grace_s() -> float:
    """HETERPS_LEAVE_GRACE_S, at most MAX_GRACE_S."""
    return min(float(cast(float, settings.get("HETERPS_LEAVE_GRACE_S"))), MAX_GRACE_S)


class Notice:
    """SIGTERM to a host's launch while its round runs: the job asked, from a thread (a signal handler does no
    I/O and takes no lock).  Accepted: the round runs on until the coordinator's word, with a safety net that stops
    it well after the grace time; refused: the round's processes stopped, and ``refused`` set for the launch to
    end as SIGTERM ends it."""

    def __init__(self, job: HostsJob, session: int, console: Any):
        self.job = job
        self.session = session
        self.console = console
        self.taken = False
        self.refused = False
        self.timer: threading.Timer | None = None
        self.lock = threading.Lock()

    def take(self) -> bool:
        """The first SIGTERM: ask (True); a second one: not taken, it stops the host at once (False)."""
        if self.taken:
            return False
        self.taken = True
        threading.Thread(target=self._ask, name="heterps-leave", daemon=True).start()
        return True

    def _ask(self) -> None:
        grace = grace_s()
        accepted, why = ask_to_leave(self.job, grace)
        with self.lock:
            if accepted:
                self.console.error(
                    f"heterps launch: SIGTERM: this host asked to leave the job: {why} (a second SIGTERM stops it now)"
                )
                # the coordinator goes on without it after the grace time at the latest, re-planning included
                self.timer = threading.Timer(grace + 2 * host_timeout() + 60.0, stop_session, args=(self.session,))
                self.timer.daemon = True
                self.timer.start()
                return
            self.refused = True
        self.console.error(f"heterps launch: SIGTERM: the job cannot let this host go ({why}): stopping it now")
        stop_session(self.session)

    def cancel(self) -> None:
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()


def ask_to_leave(job: HostsJob, grace: float) -> tuple[bool, str]:
    """Ask the coordinator to let this host go within ``grace`` seconds: whether it will, and what it said."""
    try:
        answer = control.request(
            job.endpoint, job.key(), {"op": "leave", "host": job.host, "grace_s": grace}, ASK_TIMEOUT_S
        )
    except (OSError, control.Unproven) as exc:
        return False, f"the coordinator at {job.endpoint} could not be asked ({exc})"
    if not answer or answer.get("op") != "leave":
        return False, f"the coordinator at {job.endpoint} gave no answer to the leave ({answer!r:.120})"
    return bool(answer.get("accepted")), str(answer.get("reason", ""))


def is_leave(argv: list[str]) -> bool:
    """Whether ``heterps launch ARGV`` is ``--leave``: the flag before the training script (the first ``.py``
    word), not the script's own argument of that name."""
    for arg in argv:
        if arg == "--leave":
            return True
        if arg.endswith(".py") and not arg.startswith("-"):
            return False
    return False


def leave_command(argv: list[str]) -> int:
    """``heterps launch --leave --log_dir LOG``: SIGTERM to the launch running there, and wait for its end."""
    log_dir = None
    rest = [a for a in argv if a != "--leave"]
    if len(rest) == 1 and rest[0].startswith("--log_dir="):
        log_dir = rest[0].partition("=")[2]
    elif len(rest) == 2 and rest[0] == "--log_dir":
        log_dir = rest[1]
    if not log_dir:
        print(f"heterps launch --leave: {LEAVE_USAGE}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    records = event_log.this_launch(event_log.read(log_dir))
    started = event_log.of_type(records, "launch_started")
    if not started:
        print(
            f"heterps launch --leave: no heterps launch in {log_dir} (its event log {event_log.path_in(log_dir)} "
            "says none started there)",
            file=sys.stderr,
        )
        return EXIT_INPUT_ERROR
    pid, host = int(started[-1]["pid"]), started[-1].get("host")
    if event_log.of_type(records, "host_ended") or not _is_launch(pid):
        print(f"heterps launch --leave: the launch in {log_dir} (pid {pid}) is not running", file=sys.stderr)
        return EXIT_INPUT_ERROR
    print(f"heterps launch --leave: asking the launch of host {host} (pid {pid}) to leave the job")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s() + 2 * host_timeout() + 120.0
    while _is_launch(pid):
        if time.monotonic() > deadline:
            print(f"heterps launch --leave: the launch (pid {pid}) is still running; a second SIGTERM stops it now")
            return 1
        time.sleep(0.5)
    ended = event_log.of_type(event_log.this_launch(event_log.read(log_dir)), "host_ended")
    how = ended[-1].get("how") if ended else None
    if how == "left":
        print(f"heterps launch --leave: host {host} left the job; the job goes on without it")
        return 0
    what = f"{how} (exit status {ended[-1].get('code')})" if ended else "unknown"
    print(f"heterps launch --leave: the launch of host {host} ended: {what}", file=sys.stderr)
    return 1


def _is_launch(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and "launch" in " ".join(proc.cmdline())
    except psutil.Error:
        return False
