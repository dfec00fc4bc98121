"""The supervisor: watches the processes of Paddle's ParameterServerLauncher, in the process that runs it.

Paddle 2.6.2's PS launcher (``fleet/launch_utils.py: ParameterServerLauncher``) waits only for the CPU trainers,
ignores every exit status (a job whose trainer crashed, or whose server was killed, ends 0), and leaves its server
and heterogeneous-trainer children to a SIGTERM they may not die of.  Every 0.1 s the supervisor reads each
process's exit status: a trainer that exits non-zero, a server or heterogeneous trainer that ends while trainers
still run (except a heterogeneous trainer's own clean exit 0), or ``--timeout`` passing, fails the job: a message
names the process, its exit status and its log with the log's last lines, and every process of the job is stopped
(SIGTERM, then SIGKILL).  Paddle's launcher is read only through the seam (runtime/seam.py: launched_processes).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from heterps_paddle.launch.member import Member
from heterps_paddle.launch.paddle_aborts import ConnectTimeoutAbort, connect_timeout_abort
from heterps_paddle.runtime import seam
from heterps_paddle.runtime.seam import LaunchedProcess

OWN_PREFIX = "heterps launch:"
POLL_S = 0.1
SETTLE_S = 1.0
STOP_GRACE_S = 5.0
# How a process ended, most likely a cause first (see Supervisor.check_once); exit statuses > 0 rank 1.
_END_RANK = {-signal.SIGKILL: 0, -signal.SIGTERM: 0, -signal.SIGINT: 0, -signal.SIGABRT: 3}
_ROLE_RANK = {"server": 0, "heter_worker": 1, "worker": 2}
ROLE_NAMES = {"worker": "CPU trainer", "server": "parameter server", "heter_worker": "heterogeneous trainer"}


@dataclass
class Failure:
    message: str
    log: str | None = None  # the failed process's log
    connect_timeout: ConnectTimeoutAbort | None = None  # that process was Paddle's connect-timeout abort


class Supervisor:
    """Watches the processes of Paddle's ParameterServerLauncher (module doc)."""

    def __init__(self, timeout: float | None, member: Member | None = None):
        self.launcher: Any = None
        self.member = member  # this host's part of a launch across hosts (launch/member.py), or None
        self.failure: Failure | None = None
        self.first_seen: dict[tuple[str, int], float] = {}
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.timeout = timeout
        # heterps launch's own process: if it is killed (SIGKILL gives it no chance to stop the job's session),
        # this process sees its parent change and stops the job itself.
        self.parent = os.getppid()
        self._thread = threading.Thread(target=self._loop, name="heterps-supervisor", daemon=True)
        self._done = threading.Event()

    def attach(self, launcher: Any) -> None:
        self.launcher = launcher
        self._thread.start()

    def workers_started(self, launcher: Any) -> None:
        """Across hosts: when this host's CPU trainers end, Paddle's launcher stops its servers and heterogeneous
        trainers, which another host's trainers may still use.  Its wait on the last trainer then also waits for
        the job's end (every host's trainers finished), or its failure."""
        if self.member is not None:
            seam.hold_after_last_worker(launcher, self.hold_until_job_ends)

    def hold_until_job_ends(self) -> None:
        member = self.member
        workers = [p for p in self.processes() if p.role == "worker"]
        if member is None or self.failure is not None or any(p.proc.poll() != 0 for p in workers):
            return  # a failed trainer: the supervisor stops the job
        member.report_done()
        say(f"{OWN_PREFIX} this host's CPU trainers finished; its servers serve until every host's have")
        while not member.ended.is_set() and not member.aborted.is_set() and self.failure is None:
            time.sleep(POLL_S)

    def stop(self) -> None:
        """Stop watching; a failure being settled is still reported before this returns."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def processes(self) -> list[LaunchedProcess]:
        return seam.launched_processes(self.launcher) if self.launcher is not None else []

    @staticmethod
    def describe(process: LaunchedProcess) -> str:
        name = ROLE_NAMES.get(process.role, process.role)
        if process.stage is not None:
            name = f"stage {process.stage} {name}"
        log = f", log {process.log}" if process.log else ""
        return f"{name} {process.index} (pid {process.proc.pid}{log})"

    def check_once(self, failing: bool = False) -> Failure | None:
        """Every process that ended badly, as one failure, the likeliest cause first.

        Order: when each was first seen dead (polls are POLL_S apart); within one poll, how it ended (killed from
        outside, then an error exit, then a crash, then an abort: Paddle's RPC layer aborts a process whose peer
        vanished); then servers, heterogeneous trainers, CPU trainers.  ``failing``: a failure was seen; every end
        but a clean one or Paddle's own SIGTERM counts, whether trainers still run or not."""
        entries = self.processes()
        workers = [p for p in entries if p.role == "worker"]
        if not workers and (self.member is None or not entries):
            return None  # not started yet
        now = time.monotonic()
        # Across hosts, training goes on until the job's end: another host's trainers use this host's processes.
        training = (
            failing
            or any(p.proc.poll() is None for p in workers)
            or (self.member is not None and not self.member.ended.is_set())
        )
        bad = []
        for p in entries:
            code = p.proc.poll()
            if code is None:
                continue
            self.first_seen.setdefault((p.role, p.index), now)
            if code == 0 and p.role != "server":
                continue
            if failing and code == -signal.SIGTERM and p.role != "worker":
                continue  # stopped by Paddle's launcher once the CPU trainers had ended
            if p.role == "worker" or training:
                # a trainer that failed, or a server / heterogeneous trainer that ended while trainers run
                # (after the trainers, Paddle's launcher stops servers and heterogeneous trainers itself)
                key = (
                    self.first_seen[(p.role, p.index)],
                    _END_RANK.get(code, 1 if code > 0 else 2),
                    _ROLE_RANK[p.role],
                )
                while_running = "" if p.role == "worker" else " while the CPU trainers were still running"
                bad.append((key, f"{self.describe(p)} {_status(code)}{while_running}", p.log))
        if bad:
            bad.sort(key=lambda item: item[0])
            return Failure("; then ".join(message for _, message, _ in bad), bad[0][2])
        if self.deadline is not None and time.monotonic() > self.deadline:
            return Failure(f"the job did not finish within --timeout {self.timeout:.0f} s")
        return None

    def _loop(self) -> None:
        while not self._done.wait(POLL_S):
            if os.getppid() != self.parent:
                self.fail(Failure(f"the heterps launch process (pid {self.parent}) went away; stopping the job"))
                return
            member = self.member
            if member is not None and member.aborted.is_set():
                if member.restart is not None:
                    say(f"{OWN_PREFIX} stopping this host's processes: {member.abort_reason}")
                    self.stop_all()
                    return
                self.fail(Failure(f"the launch across hosts ended: {member.abort_reason}"), report=False)
                return
            if member is not None and member.ended.is_set():
                if not any(p.proc.poll() is None for p in self.processes() if p.role == "worker"):
                    # The job ended on every host: what this host still runs (servers, heterogeneous trainers)
                    # has served its last trainer.
                    self.stop_all()
                    return
            failure = self.check_once()
            if failure is not None:
                # A process killed from outside can still be on its way out (its threads exiting) when the peers
                # it served have already aborted: give it a moment, so the report names it, and names it first.
                time.sleep(SETTLE_S)
                self.fail(self.check_once(failing=True) or failure)
                return

    def after_the_launcher(self) -> Failure | None:
        """What ended badly between the last poll and Paddle's launcher returning.

        On one host, and on a host with CPU trainers, the launcher returns when its trainers are gone (it stops the
        rest itself): a trainer that failed counts, with what it depended on.  Across hosts, on a host without CPU
        trainers, the launcher waits on this host's servers and heterogeneous trainers, so it returns the moment
        one ends, and can win the race with the next poll: a bad end while the job still ran counts as it would
        have there."""
        if self.member is not None:
            failure = self.check_once()
            if failure is not None:
                return failure
        failure = self.check_once(failing=True)
        if failure is not None and any(p.role == "worker" and p.proc.poll() != 0 for p in self.processes()):
            return failure
        return None

    def fail(self, failure: Failure, report: bool = True) -> None:
        """Record the failure (the first process that ended badly: was it an abort a fresh start gets past,
        launch/paddle_aborts.py?), tell the coordinator across hosts, and stop every process.  What follows, and the
        line that says it, is heterps launch's (launch/driver.py), once the job's machine has decided."""
        failure.connect_timeout = connect_timeout_abort(failure.log)
        if failure.connect_timeout is not None:
            failure.message += f" ({failure.connect_timeout.describe()})"
        self.failure = failure
        try:
            if self.member is not None and report:
                self.member.report_failure(failure.message, connect_timeout=failure.connect_timeout is not None)
        finally:
            self.stop_all()

    def stop_all(self) -> None:
        entries = self.processes()
        for p in entries:
            if p.proc.poll() is None:
                p.proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(p.proc.poll() is None for p in entries):
            time.sleep(0.1)
        for p in entries:
            if p.proc.poll() is None:
                p.proc.kill()


def say(text: str) -> None:
    """A line for heterps launch's console; when that process is gone (its end of the pipe closed), the job is
    still stopped: a failed write must not end the supervisor."""
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:
        pass


def _status(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"
