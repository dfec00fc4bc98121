"""``heterps launch``: this host's rounds of the job, in one loop, one host or many.

Each round runs Paddle's launcher in a child process of its own session (launch/child.py), which reports what
happened (launch/result.py: it succeeded; it failed, naming what, and whether that was Paddle's connect-timeout
abort; it was told a new round).  What comes next is the job's state machine's alone (launch/machine.py):

- **one host** is a job of one member, this host: the machine runs here (``OneHost``), with the same rules as
  across hosts (a connect-timeout abort starts the job again, at most ``HETERPS_CONNECT_RETRIES`` times);
- **across hosts** the machine runs in the coordinator on server 0's host (launch/coordinator.py, served from this
  process there), and this host carries out its word (``HostOfJob``): the next round's part, standing by, the end.

The loop (``_rounds``) is the same for both: run the round (or stand by), ask the shell what the job decided, say
it, go on or end.  Whatever is left in a round's session when it ends is stopped (launch/session.py), and the
launch tells every process of the job what was launched (``HETERPS_LAUNCH``: Paddle tells a process only its own
stage's device).  Every launch appends its life to the event log (launch/event_log.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Protocol, cast

from heterps_paddle import control, settings
from heterps_paddle.errors import EXIT_INPUT_ERROR, HeterPSError
from heterps_paddle.files import INPUTS_ENV, output_dir, real
from heterps_paddle.launch import event_log, render
from heterps_paddle.launch import machine as m
from heterps_paddle.launch.console import (
    LAUNCHER_LOG,
    OWN_PREFIX,
    Console,
    echo_logs,
    failure_lines,
    keep_attempt_logs,
    relay,
)
from heterps_paddle.launch.coordinator import Coordinator
from heterps_paddle.launch.event_log import EventLog
from heterps_paddle.launch.hosts import HostRound, host_round, own_address
from heterps_paddle.launch.job import JOB_ENV, JobAborted, ask_round, startup_timeout
from heterps_paddle.launch.leave import Notice, ask_to_leave, grace_s
from heterps_paddle.launch.measuring import Measuring
from heterps_paddle.launch.member import LogForwarder, Member
from heterps_paddle.launch.metrics_server import MetricsServer
from heterps_paddle.launch.options import LaunchOptions
from heterps_paddle.launch.ports import PortBlock, claim_port_block
from heterps_paddle.launch.result import RESULT_FD_ENV, Outcome, RunResult
from heterps_paddle.launch.rounds import joined_of, part_of_round, plan_maker, proposer
from heterps_paddle.launch.session import stop_session
from heterps_paddle.planning.launch import LAUNCH_ENV
from heterps_paddle.rendezvous import LAUNCH_ID_ENV, FileBoard, launch_files_dir
from heterps_paddle.runtime.checkpoint_choice import prepare_launch
from heterps_paddle.runtime.checkpoint_files import CheckpointError, sweep_memory_staging
from heterps_paddle.version import __version__

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


class Shell(Protocol):
    """Where the job's decisions come from (module doc)."""

    def first(self) -> Turn | HostEnd: ...

    def stand_by(self, turn: Turn) -> Ran: ...

    def coordinator(self) -> Coordinator | None: ...

    def after(self, turn: Turn, ran: Ran) -> Verdict: ...

    def close(self) -> None: ...


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
    except SystemExit as exc:  # a signal stopped this launch (launch/driver.py: _run_round's handler)
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
        queue: list[m.Event] = [event]
        lines: list[str] = []
        while queue:
            self.job, actions = m.step(self.job, queue.pop(0), time.monotonic())
            self.log.actions(actions, self.job)
            for action in actions:
                line = render.line(action, self.job)
                if line is not None and not isinstance(action, m.Start):
                    lines.append(line)
                if isinstance(action, m.Replan):
                    report = {"summary": "the same plan (one host)", "how": "the launch's"}
                    r = self.job.round
                    queue.append(m.Planned({}, r.members, r.coordinator, r.digest, report, {}, time.strftime("%c")))
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


def _run_round(turn: Turn, console: Console, coordinator: Coordinator | None) -> Ran:
    """One run of Paddle's launcher (a launch across hosts with restarts may run several, and a one-host launch one
    per attempt), supervised in a child process of its own session."""
    options, part, number = turn.options, turn.part, turn.number
    args = options.paddle_arguments()
    env = dict(os.environ)
    inputs = options.inputs()
    if part is not None:
        env.update(part.env)
        inputs[real(part.job.key_file)] = "the job's key"
        if part.expansion.hosts.cluster is not None:
            inputs.setdefault(real(part.expansion.hosts.cluster), "the cluster file the hosts file names")
    env[INPUTS_ENV] = json.dumps(inputs)  # no process of the job writes over them (fleet/plan_files.py)
    if part is not None:  # placed on a hosts file's hosts: each group's hosts' type too
        env[LAUNCH_ENV] = json.dumps(part.expansion.launch_description())
    elif args.worker_num is not None:
        env[LAUNCH_ENV] = json.dumps(launch_description(args))
    if options.timeout is not None:
        env["HETERPS_LAUNCH_TIMEOUT"] = str(options.timeout)
    if options.checkpoint_dir is not None or options.checkpoint_every is not None:
        try:
            checkpoint_env, lines = prepare_launch(options.checkpoint_dir, options.checkpoint_every)
        except CheckpointError as exc:
            print(f"{OWN_PREFIX} {exc}", file=sys.stderr)
            return Ran(RunResult(Outcome.FAILED), options.log_dir, EXIT_INPUT_ERROR)
        env.update(checkpoint_env)
        for line in lines:
            print(f"{OWN_PREFIX} {line}", flush=True)
    ports = None
    if part is None:
        try:
            ports, options = with_claimed_ports(args, options)
        except HeterPSError as exc:
            return Ran(RunResult(Outcome.FAILED, str(exc)), options.log_dir, FAILED_EXIT)
    if turn.launch_id is not None:
        env[LAUNCH_ID_ENV] = turn.launch_id
    log_dir = options.log_dir
    events = event_log.path_in(log_dir)  # the host's, beside its rounds' logs
    if number and part is not None:
        # a round's logs beside the first's, so that neither overwrites the other
        log_dir = os.path.join(log_dir, f"round{number}")
        options = options.with_paddle({"--log_dir": log_dir})
    os.makedirs(log_dir, exist_ok=True)
    started = time.time()
    if part is not None:
        # the job's records streamed to this host go to its log (the coordinator's host writes them itself)
        env[JOB_ENV] = replace(part.job, event_log="" if part.job.is_coordinator else events).to_json()
        env[control.KEY_FILE_ENV] = os.path.abspath(part.job.key_file)  # the board's clients prove it too
        if not part.job.is_coordinator and console.forwarder is None:
            console.forwarder = LogForwarder(part.job)
    launch_argv = options.launcher_argv()
    # The child's result comes back through a pipe of its own (launch/result.py), read while it runs.
    result_read, result_write = os.pipe()
    env[RESULT_FD_ENV] = str(result_write)
    # Paddle's launcher prints its arguments and every process's environment: that goes to launcher.log; the
    # console gets heterps launch's own lines and the job's progress.
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "heterps_paddle.launch.child", *launch_argv],
            env=env,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(result_write,),
        )
    finally:
        os.close(result_write)
    said = _Collected()
    readers = [
        threading.Thread(target=relay, args=(child.stdout, os.path.join(log_dir, LAUNCHER_LOG), console), daemon=True),
        threading.Thread(target=said.collect, args=(result_read,), daemon=True),
    ]
    for reader in readers:
        reader.start()
    print(
        f"heterps launch: {' '.join(launch_argv)} (Paddle's launcher output: {os.path.join(log_dir, LAUNCHER_LOG)})",
        flush=True,
    )
    stop_echo = threading.Event()
    echo = None
    if not options.quiet:
        echo = threading.Thread(target=echo_logs, args=(log_dir, started, stop_echo, console), daemon=True)
        echo.start()

    # SIGTERM on a host of the round that is not the coordinator's: a notice, asked of the job (launch/leave.py)
    notice = None if part is None or part.job.is_coordinator else Notice(part.job, child.pid, console)

    def forward(signum: int, frame: Any) -> None:
        if signum == signal.SIGTERM and notice is not None and notice.take():
            return  # asked in a thread of its own: a signal handler does no I/O
        stop_session(child.pid)
        if coordinator is not None:
            coordinator.close(wait_s=2.0, late_joiners_s=0.0)
        sys.exit(128 + signum)

    handlers = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        code = child.wait()
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        if notice is not None:
            notice.cancel()
        stop_echo.set()
        if echo is not None:
            echo.join(timeout=2)
        left = stop_session(child.pid)
        for reader in readers:
            reader.join(timeout=5)
        os.close(result_read)
        if ports is not None:
            ports.release()
    if notice is not None and notice.refused:
        sys.exit(128 + signal.SIGTERM)  # the job would not let it go: SIGTERM's old meaning
    if left:
        console.error(
            f"heterps launch: stopped what was still running in the job's session at its end: {'; '.join(left)}"
        )
    result = RunResult.parse(said.data, code)
    if result.outcome is Outcome.NEW_ROUND and result.told is not None:
        console.line(
            f"heterps launch: this host starts again with the job (round {result.told['round']}) after "
            f"{time.time() - started:.1f} s"
        )
    return Ran(result, log_dir, code)


@dataclass
class _Collected:
    """What the child wrote to its result pipe, read until its end."""

    data: bytes = field(default=b"")

    def collect(self, fd: int) -> None:
        chunks = []
        try:
            while True:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        except OSError:
            pass
        self.data = b"".join(chunks)


def launch_description(args: Any) -> dict[str, Any]:
    """The launch as planning/launch.LaunchShape reads it from HETERPS_LAUNCH, from a one-host launch's arguments
    (a launch across hosts tells what launch/placement.Expansion.launch_description says)."""
    units = [int(u) for u in str(args.heter_worker_num or "").split(";") if u.strip()]
    devices = [d.strip().lower() or None for d in str(args.heter_devices or "").split(";")] if units else []
    if units and len(devices) == 1 and len(units) > 1:
        devices = devices * len(units)  # Paddle's launcher reads one device for every stage the same way
    if len(devices) != len(units):
        devices = [None] * len(units)
    return {
        "worker_num": args.worker_num,
        "server_num": args.server_num,
        "heter_worker_num": units,
        "heter_devices": devices,
    }


def with_claimed_ports(args: Any, options: LaunchOptions) -> tuple[PortBlock | None, LaunchOptions]:
    """One host's PS launch given by process counts: its endpoints made explicit, from ports this launch claims
    below the ephemeral range (launch/ports.py), instead of the ports Paddle's launcher would draw inside it.  A
    launch that names its endpoints, or is not a parameter-server launch, is left as it is."""
    if not args.server_num or not args.worker_num or args.servers or args.workers or args.heter_workers:
        return None, options
    units = [int(u) for u in str(args.heter_worker_num or "").split(";") if u.strip()]
    block = claim_port_block(LOCAL_ADDRESS, args.server_num + args.worker_num + sum(units) + 1)
    ports = iter(block.ports)

    def endpoints(count: int) -> str:
        return ",".join(f"{LOCAL_ADDRESS}:{next(ports)}" for _ in range(count))

    explicit: dict[str, str] = {"--servers": endpoints(args.server_num), "--workers": endpoints(args.worker_num)}
    if units:
        explicit["--heter_workers"] = ";".join(endpoints(n) for n in units)
    explicit["--http_port"] = str(next(ports))  # gloo's HTTP store, on server 0's address
    return block, options.with_paddle(explicit)
