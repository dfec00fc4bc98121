"""``heterps launch``: this host's rounds of the job, in one loop, one host or many.

Each round runs Paddle's launcher in a child process of its own session (launch/child.py), which reports what
happened (launch/result.py: it succeeded; it failed, naming what, and whether that was Paddle's connect-timeout
abort; it was told a new round).  What comes next is the job's state machine's alone (launch/machine.py):

- **one host** is a job of one member, this host: the machine runs here (``OneHost``), with the same rules as
  across hosts (a connect-timeout abort starts the job again, at most ``HETERPS_CONNECT_RETRIES`` times);
- **across hosts** the machine runs in the coordinator on server 0's host (launch/coordinator.py, served from this
  process there), and this host carries out its word (``HostOfJob``): the next round's part, standing by, the end.

Both step the machine through launch/shell.py (``drive``).  The loop (``_rounds``) is the same for both: run the
round (or stand by), ask the shell what the job decided, say it, go on or end.  Whatever is left in a round's session when it ends is stopped (launch/session.py), and the
launch tells every process of the job what was launched (``HETERPS_LAUNCH``: Paddle tells a process only its own
stage's device).  Every launch appends its life to the event log (launch/event_log.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
import uuid
from dataclasses import replace
from typing import Any, Mapping, cast

from heterps_paddle import settings
from heterps_paddle.data_plan import journal
from heterps_paddle.errors import EXIT_INPUT_ERROR, HeterPSError
from heterps_paddle.files import output_dir
from heterps_paddle.launch import machine as m
from heterps_paddle.launch import render
from heterps_paddle.launch.console import (
    Console,
    failure_lines,
    keep_attempt_logs,
)
from heterps_paddle.launch.coordinator import Coordinator
from heterps_paddle.launch.event_log import EventLog
from heterps_paddle.launch.hosts import HostRound, host_round, own_address
from heterps_paddle.launch.job import JobAborted, ask_round, startup_timeout
from heterps_paddle.launch.leave import ask_to_leave, grace_s
from heterps_paddle.launch.measuring import Measuring
from heterps_paddle.launch.member import Member
from heterps_paddle.launch.metrics_server import MetricsServer
from heterps_paddle.launch.options import LaunchOptions
from heterps_paddle.launch.paddle_round import launch_description
from heterps_paddle.launch.paddle_round import run_round as _run_round
from heterps_paddle.launch.result import Outcome, RunResult
from heterps_paddle.launch.rounds import joined_of, part_of_round, plan_maker, proposer
from heterps_paddle.launch.shell import drive
from heterps_paddle.launch.turns import FAILED_EXIT, LOCAL_ADDRESS, HostEnd, Ran, Shell, Turn, Verdict
from heterps_paddle.rendezvous import DATA_PLAN_DIR, LAUNCH_ID_ENV, FileBoard, launch_files_dir
from heterps_paddle.runtime.checkpoint_files import sweep_memory_staging
from heterps_paddle.version import __version__


def run(options: LaunchOptions) -> int:
    """The launch (module doc): its exit status."""
    try:  # a bad path is one line naming the option before anything starts (not a traceback from a makedirs)
        output_dir("--log_dir", options.log_dir)
        if options.checkpoint_dir is not None:
            output_dir("--checkpoint-dir", options.checkpoint_dir)
    except HeterPSError as exc:
        print(f"heterps launch: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_INPUT_ERROR
    address = LOCAL_ADDRESS if options.hosts is None else options.hosts.host or os.environ.get("POD_IP", "")
    metrics = None
    if options.metrics_port is not None:
        try:  # the job's figures, read-only, on this host's address (launch/metrics_server.py)
            serve_on = address or own_address()
            metrics = MetricsServer(serve_on, options.metrics_port, options.log_dir).start()
        except (OSError, HeterPSError) as exc:
            print(
                f"heterps launch: error: --metrics-port {options.metrics_port}: cannot serve on "
                f"{address or 'this host'}:{options.metrics_port} ({getattr(exc, 'strerror', None) or exc})",
                file=sys.stderr,
                flush=True,
            )
            return EXIT_INPUT_ERROR
    console = Console()
    log = EventLog(options.log_dir)
    log.write(
        "launch_started", host=address, pid=os.getpid(), across_hosts=options.hosts is not None, version=__version__
    )
    started = time.time()
    inert = why_adapt_cannot_act(options)
    if inert is not None:
        console.line(inert)
    end = HostEnd(FAILED_EXIT, "failed", options.log_dir, "heterps launch was stopped")
    try:
        shell: Shell = OneHost(options, console, log) if options.hosts is None else HostOfJob(options, console, log)
        end = _rounds(shell, console, log)
    except SystemExit as exc:  # a signal stopped this launch (launch/paddle_round.py: run_round's handler)
        end = HostEnd(int(exc.code or 0), "failed", options.log_dir, "heterps launch was stopped by a signal")
        raise
    finally:
        console.close()
        log.write("host_ended", how=end.how, code=end.code, reason=end.reason)
        if metrics is not None:
            metrics.close()
    seconds = time.time() - started
    if end.code == 0:
        console.line(f"heterps launch: job finished in {seconds:.1f} s (logs in {end.log_dir})")
        return 0
    if end.code != EXIT_INPUT_ERROR:
        console.error(
            f"heterps launch: job FAILED (exit status {end.code}) after {seconds:.1f} s (logs in {end.log_dir})"
        )
    return end.code


def why_adapt_cannot_act(options: LaunchOptions) -> str | None:
    """One console line when ``--adapt`` or ``--on-scale`` can do nothing on this launch, and what would let it
    (None: they can, or were not asked for).  ``--adapt advise`` is the default: a one-host launch says nothing of
    it unless ``--on-scale`` was given too.  The missing planning inputs are said by the coordinator (it learns
    them when trainer 0 publishes the plan)."""
    if options.hosts is None:
        if options.adapt == "on" or options.on_scale:
            asked = "--adapt on" if options.adapt == "on" else "--on-scale"
            return (
                f"heterps launch: {asked} does nothing on one host: a one-host job's plan is fitted to the processes "
                "its launch started (docs/automatic-path.md); launch across hosts (--hosts) with --checkpoint-dir for "
                "the plan to follow the job"
            )
        return None
    if options.checkpoint_dir is None and (options.adapt == "on" or options.on_scale):
        return (
            f"heterps launch: --adapt {options.adapt} without --checkpoint-dir: the job cannot move (a move resumes "
            "from a checkpoint), so it only says what it would do; give --checkpoint-dir for it to act"
        )
    return None


def adapt_rules(mode: str) -> m.Adapt:
    """--adapt and its margins (HETERPS_ADAPT_*: docs/adaptive.md)."""

    def number(name: str) -> float:
        return float(cast(float, settings.get(name)))

    return m.Adapt(
        mode=mode,
        miss=number("HETERPS_ADAPT_MISS"),
        sustain_s=number("HETERPS_ADAPT_SUSTAIN_S"),
        saving=number("HETERPS_ADAPT_SAVING"),
        faster=number("HETERPS_ADAPT_FASTER"),
        every_s=number("HETERPS_ADAPT_EVERY_S"),
        cooldown=int(number("HETERPS_ADAPT_COOLDOWN")),
        move_s=number("HETERPS_ADAPT_MOVE_S"),
        horizon_s=number("HETERPS_ADAPT_HORIZON_S"),
        straggler_windows=int(number("HETERPS_ADAPT_STRAGGLER_WINDOWS")),
    )


def _rounds(shell: Shell, console: Console, log: EventLog) -> HostEnd:
    """This host's rounds until the job ends for it: run each (or stand by), then what the job decided."""
    first = shell.first()
    if isinstance(first, HostEnd):
        return first
    turn = first
    try:
        while True:
            log.write(
                "host_round",
                round=turn.number,
                part="stands_by" if turn.spare else "runs",
                log_dir=turn.options.log_dir,
            )
            ran = shell.stand_by(turn) if turn.spare else _run_round(turn, console, shell.coordinator())
            sweep_memory_staging()  # a checkpoint staged in memory by a trainer the round's end killed: room freed
            if ran.result.failure:  # the facts first: the machine's decision follows from them
                log.write(
                    "host_failed",
                    round=turn.number,
                    failure=ran.result.failure,
                    log=ran.result.log,
                    connect_timeout=ran.result.connect_timeout,
                )
            verdict = shell.after(turn, ran)
            if ran.result.failure:
                for line in failure_lines(ran.result.failure, ran.result.log, verdict.next is not None):
                    console.error(line)
            for line in verdict.errors:
                console.error(line)
            for line in verdict.lines:
                console.line(line)
            if verdict.next is None:
                assert verdict.end is not None
                return verdict.end
            turn = verdict.next
    finally:
        shell.close()


# ------------------------------------------------------------------------------------------------ one host


class OneHost:
    """One host is the job's machine with one member, this host; its re-planning keeps the plan (the launch itself
    is the plan's)."""

    def __init__(self, options: LaunchOptions, console: Console, log: EventLog):
        self.options = options
        self.console = console
        self.log = log
        rules = m.Rules(
            connect_retries=int(cast(int, settings.get("HETERPS_CONNECT_RETRIES"))),
            settle_s=0.0,
            checkpoints=options.checkpoint_dir is not None,
        )
        self.job = m.first_job(rules, m.Round(0, {LOCAL_ADDRESS: True}, LOCAL_ADDRESS, ""), time.monotonic())
        # --timeout bounds the whole launch of a one-host job, its attempts together
        self.deadline = None if options.timeout is None else time.monotonic() + options.timeout
        self.measuring = Measuring(log, console.line)
        self.devices = tuple(str(d) for d in launch_description(options.paddle_arguments())["heter_devices"])
        self.lock = threading.Lock()  # the machine is stepped by the loop and by the gauge's thread
        self.measured: threading.Event | None = None
        self.board_dir: str | None = None
        self.owns_board = False

    def first(self) -> Turn:
        self._drive(m.Joined(LOCAL_ADDRESS, ""))  # this host is every host of the round
        return self._turn(0)

    def _turn(self, number: int) -> Turn:
        """A round of this host: its launch's board is a directory of the cache (rendezvous.py), named by an id of
        its own rather than by the endpoints Paddle draws, so that it is known here (the gauge reads it) and removed
        when the round ends; a launch id the caller set is kept (and its board too)."""
        given = os.environ.get(LAUNCH_ID_ENV)
        launch_id = given or uuid.uuid4().hex[:16]
        self.board_dir = launch_files_dir(str(settings.get("HETERPS_CACHE")), {LAUNCH_ID_ENV: launch_id})
        self.owns_board = not given
        if given:  # a board the caller keeps: its data plan is an earlier round's, whose shards this round retrains
            journal.remove(os.path.join(cast(str, self.board_dir), DATA_PLAN_DIR))
        self.measured = threading.Event()
        board = FileBoard(cast(str, self.board_dir))
        threading.Thread(target=self._measure, args=(number, board, self.measured), daemon=True).start()
        return Turn(number, self._timed(self.options), launch_id=launch_id)

    def _measure(self, number: int, board: FileBoard, stop: threading.Event) -> None:
        """The gauge, about every second while the round runs (launch/measuring.py)."""
        while not stop.wait(1.0):
            rates = self.measuring.tick(number, board, self.devices)
            if rates is not None:
                with self.lock:
                    self._drive(m.Measured(rates))

    def _stop_measuring(self, last_round: int | None = None) -> None:
        """The round's gauge stopped; its last figures made (``last_round``) and its board removed."""
        if self.measured is None:
            return
        self.measured.set()
        if last_round is not None and self.board_dir is not None:
            rates = self.measuring.tick(last_round, FileBoard(self.board_dir), self.devices, force=True)
            if rates is not None:
                with self.lock:
                    self._drive(m.Measured(rates))
        if self.owns_board and self.board_dir is not None:
            shutil.rmtree(self.board_dir, ignore_errors=True)
        self.measured = None

    def stand_by(self, turn: Turn) -> Ran:
        raise AssertionError("one host never stands by")

    def coordinator(self) -> Coordinator | None:
        return None

    def after(self, turn: Turn, ran: Ran) -> Verdict:
        if ran.code == EXIT_INPUT_ERROR:  # refused before anything started
            return Verdict(end=HostEnd(ran.code, "failed", ran.log_dir, ran.result.failure or ""))
        number = self.job.round.number
        self._stop_measuring(number)
        with self.lock:
            if ran.result.outcome is Outcome.SUCCEEDED:
                lines = self._drive(m.Done(LOCAL_ADDRESS, number))
            else:
                # the failure itself is said with the verdict (failure_lines); the machine's reason names it short
                reason = (
                    "Paddle's connect-timeout abort"
                    if ran.result.connect_timeout
                    else (ran.result.failure or "the job failed")
                )
                lines = self._drive(m.ProcessFailed(LOCAL_ADDRESS, number, reason, ran.result.connect_timeout))
                lines += self._drive(m.Tick())
        if self.job.state is m.JobState.ENDED:
            return Verdict(end=HostEnd(0, "finished", ran.log_dir), errors=tuple(lines))
        if self.job.state is m.JobState.ABORTED:
            code = ran.code if ran.code > 0 else FAILED_EXIT
            return Verdict(end=HostEnd(code, "failed", ran.log_dir, self.job.reason or ""), errors=tuple(lines))
        # a new round (a retry): the job starts again on new ports, from the newest complete checkpoint with
        # --checkpoint-dir; the attempt's logs are kept aside
        kept = keep_attempt_logs(ran.log_dir, number + 1)
        lines.append(
            f"heterps launch: starting the job again (retry {self.job.round.retries_used} of "
            f"{self.job.rules.connect_retries}, HETERPS_CONNECT_RETRIES): attempt {number + 1} was aborted by Paddle "
            f"on a connect timeout; its logs are in {kept}"
        )
        with self.lock:
            lines += self._drive(m.Joined(LOCAL_ADDRESS, ""))
        return Verdict(next=self._turn(self.job.round.number), errors=tuple(lines))

    def close(self) -> None:
        self._stop_measuring()

    def _timed(self, options: LaunchOptions) -> LaunchOptions:
        """A later attempt has what the earlier ones left of --timeout."""
        if self.deadline is None:
            return options
        return replace(options, timeout=max(1.0, self.deadline - time.monotonic()))

    def _drive(self, event: m.Event) -> list[str]:
        """``event`` through this host's machine, and what follows from it; the console lines it says."""
        lines: list[str] = []

        def carry_out(action: m.Action, job: m.Job) -> m.Event | None:
            line = render.line(action, job)
            if line is not None and not isinstance(action, m.Start):
                lines.append(line)
            if isinstance(action, m.Replan):  # one host keeps its plan: the launch is the plan's
                report = {"summary": "the same plan (one host)", "how": "the launch's"}
                r = job.round
                return m.Planned({}, r.members, r.coordinator, r.digest, report, {}, time.strftime("%c"))
            return None

        self.job = drive(self.job, event, time.monotonic, self.log, carry_out)
        return lines


# ------------------------------------------------------------------------------------------------ across hosts


class HostOfJob:
    """This host's part of a job across hosts, round after round, as the coordinator says (on server 0's host, this
    process serves the coordinator too)."""

    def __init__(self, options: LaunchOptions, console: Console, log: EventLog):
        self.options = options
        self.console = console
        self.log = log
        self.firsts: HostRound | None = None  # the first round's part (from the launch's files)
        self.key = b""
        self.served: Coordinator | None = None

    def first(self) -> Turn | HostEnd:
        try:
            part = host_round(self.options, os.environ)
            self.key = part.job.key()  # no insecure default: a launch across hosts proves the job's key (control.py)
        except HeterPSError as exc:
            print(f"heterps launch: error: {exc}", file=sys.stderr, flush=True)
            return HostEnd(EXIT_INPUT_ERROR, "failed", self.options.log_dir, str(exc))
        self.firsts = part
        if part.nothing:
            return HostEnd(0, "finished", self.options.log_dir, "it runs nothing of the plan")
        assert self.options.hosts is not None
        if part.job.is_coordinator or not self.options.hosts.may_stand_by:
            return Turn(0, part.options, part)
        # A host that may stand by (--restarts, --join) asks which round the job is in: started again after it was
        # lost, it finds the job in a later round, runs nothing of its plan, and stands by (the coordinator counts
        # it back).  A coordinator that does not answer is the join's to report.
        try:
            answer = ask_round(part.job.endpoint, self.key, time.monotonic() + startup_timeout())
        except (OSError, HeterPSError):
            return Turn(0, part.options, part)
        number = int(answer.get("round") or 0)
        if number == 0 or not answer.get("plan"):
            return Turn(0, part.options, part)
        lost = frozenset(answer.get("lost") or ()) - {part.address}
        self.console.line(
            f"heterps launch: the job is in round {number} (hosts lost: {', '.join(sorted(lost)) or 'none'})"
        )
        later = self._part_of(number, answer, lost, self.options.log_dir)
        return later if isinstance(later, HostEnd) else Turn(number, later.options, later)

    def coordinator(self) -> Coordinator | None:
        """Server 0's host serves the launch's coordinator for the job's life (None: not this host)."""
        assert self.firsts is not None
        if self.served is None and self.firsts.job.is_coordinator:
            log_dir = self.options.log_dir
            os.makedirs(log_dir, exist_ok=True)
            self.served = Coordinator(
                self.firsts.job,
                self.console.remote,
                self.key,
                restarts=self.firsts.job.restarts,
                next_round=plan_maker(self.firsts, log_dir),
                restarts_path=os.path.join(log_dir, "restarts.json"),
                checkpoint_dir=self.options.checkpoint_dir,
                log=self.log,
                adapt=adapt_rules(self.options.adapt),
                propose=proposer(self.firsts),
                on_scale=self.options.on_scale,
            ).start()
        return self.served

    def stand_by(self, turn: Turn) -> Ran:
        """A spare host: no process of this round's plan runs here; wait for the coordinator's word."""
        assert turn.part is not None and self.firsts is not None
        part = turn.part
        log_dir = part.options.log_dir
        os.makedirs(log_dir, exist_ok=True)
        self.console.line(f"heterps launch: standing by for a restart (coordinator at {part.job.endpoint})")

        def leave(signum: int, frame: Any) -> None:
            accepted, why = ask_to_leave(part.job, grace_s())  # a spare goes at once: the coordinator lets it go
            if not accepted:
                self.console.error(f"heterps launch: SIGTERM: the job cannot let this host go ({why}): it stops now")
                sys.exit(128 + signum)

        signal.signal(signal.SIGTERM, leave)
        try:
            message = Member(part.job, log=self.log).standby(self.firsts.job.digest, part.joining)
        except JobAborted as exc:
            return Ran(RunResult(Outcome.FAILED, str(exc)), log_dir, FAILED_EXIT)
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if message["op"] == "restart":
            return Ran(RunResult(Outcome.NEW_ROUND, told=message), log_dir, 0)
        if message["op"] == "end":
            return Ran(RunResult(Outcome.SUCCEEDED, told=message), log_dir, 0)
        failure = f"the launch across hosts ended: {message.get('reason')}"
        return Ran(RunResult(Outcome.FAILED, failure, told=message), log_dir, FAILED_EXIT)

    def after(self, turn: Turn, ran: Ran) -> Verdict:
        assert turn.part is not None
        result, told = ran.result, ran.result.told or {}
        if result.outcome is Outcome.NEW_ROUND:
            number = int(told["round"])
            released = told.get("released") or {}
            if isinstance(released, Mapping) and turn.part.address in released:
                saves = float(released[turn.part.address] or 0.0)
                line = f"heterps launch: released: the plan no longer needs it (saves {saves:.4g}/h; round {number})"
                return Verdict(end=HostEnd(0, "released", ran.log_dir), lines=(line,))
            if turn.part.address in (told.get("left") or ()):
                line = f"heterps launch: this host left the job; it goes on without it (round {number})"
                return Verdict(end=HostEnd(0, "left", ran.log_dir), lines=(line,))
            later = self._part_of(number, told, frozenset(told["lost"]), ran.log_dir)
            if isinstance(later, HostEnd):
                return Verdict(end=later)
            return Verdict(next=Turn(number, later.options, later))
        if result.outcome is Outcome.SUCCEEDED:
            if told.get("why") == render.LEFT_WHY:
                return Verdict(
                    end=HostEnd(0, "left", ran.log_dir), lines=("heterps launch: this host, standing by, left the job",)
                )
            return Verdict(end=HostEnd(0, "finished", ran.log_dir))
        return Verdict(
            end=HostEnd(ran.code if ran.code > 0 else FAILED_EXIT, "failed", ran.log_dir, result.failure or "")
        )

    def close(self) -> None:
        if self.served is not None:
            self.served.close()

    def _part_of(self, number: int, told: Any, lost: frozenset[str], log_dir: str) -> HostRound | HostEnd:
        """This host's part of round ``number`` (the coordinator's ``told``: its plan and joined machines)."""
        assert self.firsts is not None
        try:
            return part_of_round(
                self.options, self.firsts.expansion, log_dir, number, told["plan"], lost, os.environ, joined_of(told)
            )
        except HeterPSError as exc:
            print(f"heterps launch: error: {exc}", file=sys.stderr, flush=True)
            return HostEnd(EXIT_INPUT_ERROR, "failed", log_dir, str(exc))


# ------------------------------------------------------------------------------------------------ one round
