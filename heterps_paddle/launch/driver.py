"""``heterps launch``: a host's launch, round after round (one host, or its part of a launch across hosts).

Each round runs Paddle's launcher in a child process of its own session (launch/child.py), which writes how it
ended (launch/result.py); what comes next is the job's state machine's (launch/machine.py): on one host, this
module drives it with one member, this host (Paddle's connect-timeout abort starts the job again, at most
``HETERPS_CONNECT_RETRIES`` times); across hosts, the coordinator on server 0's host drives it for every host
(launch/coordinator.py) and this module carries out its word on this host: the next round's part, standing by, the
end.  Whatever is left in a round's session when it ends is stopped (launch/session.py), and the launch tells every
process of the job what was launched (``HETERPS_LAUNCH``: Paddle tells a process only its own stage's device).
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
from dataclasses import dataclass
from typing import Any, cast

from heterps_paddle import control, settings
from heterps_paddle.errors import EXIT_INPUT_ERROR, HeterPSError
from heterps_paddle.files import INPUTS_ENV, output_dir, real
from heterps_paddle.launch import machine as m
from heterps_paddle.launch.console import LAUNCHER_LOG, OWN_PREFIX, Console, echo_logs, keep_attempt_logs, relay
from heterps_paddle.launch.coordinator import Coordinator
from heterps_paddle.launch.hosts import HostRound, host_round
from heterps_paddle.launch.job import JOB_ENV, JobAborted, ask_round, startup_timeout
from heterps_paddle.launch.leave import Notice, ask_to_leave, grace_s, write_info
from heterps_paddle.launch.member import LogForwarder, Member
from heterps_paddle.launch.options import LaunchOptions
from heterps_paddle.launch.ports import PortBlock, claim_port_block
from heterps_paddle.launch.result import RESULT_ENV, RETRIES_LEFT_ENV, RunResult, RunState
from heterps_paddle.launch.rounds import joined_of, part_of_round, plan_maker
from heterps_paddle.launch.session import stop_session
from heterps_paddle.planning.launch import LAUNCH_ENV
from heterps_paddle.rendezvous import LAUNCH_ID_ENV, launch_files_dir
from heterps_paddle.runtime.checkpoint_choice import prepare_launch
from heterps_paddle.runtime.checkpoint_files import CheckpointError

LOCAL_ADDRESS = "127.0.0.1"  # Paddle's launcher's address for the processes of a one-host job
FAILED_EXIT = 1
RESULT_FILE = ".heterps-run-result.json"  # in a round's log directory, while its child runs


@dataclass(frozen=True)
class Ran:
    """One round (or attempt) of this host: how it ended, where its logs are, the child's exit status."""

    result: RunResult
    log_dir: str
    code: int
    left: bool = False  # a spare that left the job on notice


def run(options: LaunchOptions) -> int:
    """The launch (module doc): its exit status."""
    try:  # a bad path is one line naming the option before anything starts (not a traceback from a makedirs)
        output_dir("--log_dir", options.log_dir)
        if options.checkpoint_dir is not None:
            output_dir("--checkpoint-dir", options.checkpoint_dir)
    except HeterPSError as exc:
        print(f"heterps launch: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_INPUT_ERROR
    console = Console()
    started = time.time()
    try:
        if options.hosts is None:
            code, log_dir = _one_host(options, console)
        else:
            code, log_dir = _across_hosts(options, console)
    finally:
        console.close()
    seconds = time.time() - started
    if code == 0:
        console.line(f"heterps launch: job finished in {seconds:.1f} s (logs in {log_dir})")
        return 0
    if code != EXIT_INPUT_ERROR:
        console.error(f"heterps launch: job FAILED (exit status {code}) after {seconds:.1f} s (logs in {log_dir})")
    return code


# ------------------------------------------------------------------------------------------------ one host


def _one_host(options: LaunchOptions, console: Console) -> tuple[int, str]:
    """One host is the job's machine with one member, this host: its re-planning keeps the plan."""
    retries = int(cast(int, settings.get("HETERPS_CONNECT_RETRIES")))
    rules = m.Rules(connect_retries=retries, settle_s=0.0, checkpoints=options.checkpoint_dir is not None)
    here = m.Round(0, {LOCAL_ADDRESS: True}, LOCAL_ADDRESS, "")
    job = m.first_job(rules, here, time.monotonic())
    # --timeout bounds the whole launch of a one-host job, its attempts together
    deadline = None if options.timeout is None else time.monotonic() + options.timeout
    while True:
        job, _ = _drive(job, m.Joined(LOCAL_ADDRESS, ""), console)  # this host is every host of the round
        ran = _run_round(options, console, job.round.number, job.retries_left, deadline)
        if ran.code == EXIT_INPUT_ERROR:  # refused before anything started
            return ran.code, ran.log_dir
        number = job.round.number
        if ran.result.state is RunState.SUCCEEDED:
            job, _ = _drive(job, m.Done(LOCAL_ADDRESS, number), console)
        else:
            retryable = ran.result.state is RunState.RETRYABLE
            # the failure itself is on the console already (the supervisor's FAILED / aborted line)
            reason = "Paddle's connect-timeout abort" if retryable else (ran.result.failure or "the job failed")
            job, _ = _drive(job, m.ProcessFailed(LOCAL_ADDRESS, number, reason, retryable), console)
            job, _ = _drive(job, m.Tick(), console)
        if job.state is m.JobState.ENDED:
            return 0, ran.log_dir
        if job.state is m.JobState.ABORTED:
            return (ran.code if ran.code > 0 else FAILED_EXIT), ran.log_dir
        # a retry: the job starts again on new ports, from the newest complete checkpoint with --checkpoint-dir
        kept = keep_attempt_logs(ran.log_dir, number + 1)
        console.error(
            f"heterps launch: starting the job again (retry {job.round.retries_used} of {retries}, "
            f"HETERPS_CONNECT_RETRIES): attempt {number + 1} was aborted by Paddle on a connect timeout; its logs "
            f"are in {kept}"
        )


def _drive(job: m.Job, event: m.Event, console: Console) -> tuple[m.Job, list[m.Action]]:
    """One host's machine: ``event`` and what follows from it; the console lines said.  Re-planning one host keeps
    its plan (the launch itself is the plan's)."""
    queue: list[m.Event] = [event]
    done: list[m.Action] = []
    while queue:
        job, actions = m.step(job, queue.pop(0), time.monotonic())
        for action in actions:
            if isinstance(action, m.Say):
                console.error(action.text)
            elif isinstance(action, m.Replan):
                report = {"summary": "the same plan (one host)", "how": "the launch's"}
                round_ = job.round
                queue.append(
                    m.Planned({}, round_.members, round_.coordinator, round_.digest, report, {}, time.strftime("%c"))
                )
        done += actions
    return job, done


# ------------------------------------------------------------------------------------------------ across hosts


def _across_hosts(options: LaunchOptions, console: Console) -> tuple[int, str]:
    """This host's part of the job, round after round, as the coordinator says."""
    try:
        part = host_round(options, os.environ)
        key = part.job.key()  # no insecure default: a launch across hosts proves the job's key (control.py)
    except HeterPSError as exc:
        print(f"heterps launch: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_INPUT_ERROR, options.log_dir
    if part.nothing:
        return 0, options.log_dir
    first = part
    number = 0
    write_info(options.log_dir, part.address)
    if not part.job.is_coordinator and (part.job.restarts > 0 or part.joining is not None):
        part, number = _join_the_round(options, first, key, console)
    code, log_dir = FAILED_EXIT, options.log_dir
    try:
        code, log_dir = _rounds(options, console, first, part, number, key)
    finally:
        write_info(options.log_dir, first.address, ended="left" if code == LEFT else f"exit status {code}")
    return max(code, 0), log_dir


LEFT = -1  # this host left the job on notice (its launch ends 0)


def _rounds(
    options: LaunchOptions, console: Console, first: HostRound, part: HostRound, number: int, key: bytes
) -> tuple[int, str]:
    """This host's rounds of the job until its end, or until this host left it (LEFT)."""
    coordinator: Coordinator | None = None
    try:
        while True:
            if part.spare:
                ran = _stand_by(part, first.job.digest, console)
            else:
                if part.job.is_coordinator and coordinator is None:
                    coordinator = _coordinate(part, key, console)
                    if coordinator is None:
                        return FAILED_EXIT, part.options.log_dir
                ran = _run_round(part.options, console, number, 0, None, part, coordinator)
            if ran.result.state is not RunState.NEW_ROUND:
                break
            # The job starts again (launch/machine.py): this host runs its part of the new round's plan.
            restart = ran.result.restart or {}
            number = int(restart["round"])
            if first.address in (restart.get("left") or ()):
                console.line(f"heterps launch: this host left the job; it goes on without it (round {number})")
                return LEFT, ran.log_dir
            try:
                part = part_of_round(
                    options,
                    first.expansion,
                    ran.log_dir,
                    number,
                    restart["plan"],
                    frozenset(restart["lost"]),
                    os.environ,
                    joined_of(restart),
                )
            except HeterPSError as exc:
                print(f"heterps launch: error: {exc}", file=sys.stderr, flush=True)
                return EXIT_INPUT_ERROR, ran.log_dir
    finally:
        if coordinator is not None:
            coordinator.close()
    if ran.result.state is RunState.SUCCEEDED:
        return (LEFT if ran.left else 0), ran.log_dir
    return (ran.code if ran.code > 0 else FAILED_EXIT), ran.log_dir


def _coordinate(part: HostRound, key: bytes, console: Console) -> Coordinator | None:
    """Server 0's host serves the launch's coordinator for the job's life (None: it could not, said why)."""
    log_dir = part.options.log_dir
    try:
        os.makedirs(log_dir, exist_ok=True)
        return Coordinator(
            part.job,
            console.remote,
            key,
            restarts=part.job.restarts,
            next_round=plan_maker(part, log_dir),
            restarts_path=os.path.join(log_dir, "restarts.json"),
            checkpoint_dir=part.options.checkpoint_dir,
        ).start()
    except JobAborted as exc:
        console.error(f"heterps launch: FAILED: {exc}")
        return None


def _join_the_round(options: LaunchOptions, first: HostRound, key: bytes, console: Console) -> tuple[HostRound, int]:
    """A launch that may restart (``--restarts``) asks the coordinator which round the job is in: a host started
    again after it was lost finds the job in a later round, runs nothing of its plan, and stands by (the coordinator
    counts it back).  A coordinator that does not answer is the join's to report."""
    try:
        answer = ask_round(first.job.endpoint, key, time.monotonic() + startup_timeout())
    except (OSError, HeterPSError):
        return first, 0  # the join says why
    number = int(answer.get("round") or 0)
    if number == 0 or not answer.get("plan"):
        return first, 0
    log_dir = options.log_dir
    os.makedirs(log_dir, exist_ok=True)
    lost = frozenset(answer.get("lost") or ()) - {first.address}
    console.line(f"heterps launch: the job is in round {number} (hosts lost: {', '.join(sorted(lost)) or 'none'})")
    joined = joined_of(answer)
    return part_of_round(options, first.expansion, log_dir, number, answer["plan"], lost, os.environ, joined), number


def _stand_by(part: HostRound, files_digest: str, console: Console) -> Ran:
    """A spare host: no process of this round's plan runs here; wait for the coordinator's word."""
    log_dir = part.options.log_dir
    os.makedirs(log_dir, exist_ok=True)
    console.line(f"heterps launch: standing by for a restart (coordinator at {part.job.endpoint})")

    def leave(signum: int, frame: Any) -> None:
        accepted, why = ask_to_leave(part.job, grace_s())  # a spare goes at once: the coordinator lets it go
        if not accepted:
            console.error(f"heterps launch: SIGTERM: the job cannot let this host go ({why}): it stops now")
            sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, leave)
    try:
        message = Member(part.job).standby(files_digest, part.joining)
    except JobAborted as exc:
        console.error(f"heterps launch: FAILED: {exc}")
        return Ran(RunResult(RunState.FAILED, str(exc)), log_dir, FAILED_EXIT)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if message["op"] == "restart":
        return Ran(RunResult(RunState.NEW_ROUND, restart=message), log_dir, 0)
    if message["op"] == "end":
        left = message.get("why") == m.LEFT_WHY
        if left:
            console.line("heterps launch: this host, standing by, left the job")
        return Ran(RunResult(RunState.SUCCEEDED), log_dir, 0, left)
    console.error(f"heterps launch: FAILED: the launch across hosts ended: {message.get('reason')}")
    return Ran(RunResult(RunState.FAILED, str(message.get("reason"))), log_dir, FAILED_EXIT)


# ------------------------------------------------------------------------------------------------ one round


def _run_round(
    options: LaunchOptions,
    console: Console,
    number: int,
    retries_left: int,
    deadline: float | None,
    part: HostRound | None = None,
    coordinator: Coordinator | None = None,
) -> Ran:
    """One run of Paddle's launcher (a launch across hosts with restarts may run several, and a one-host launch one
    per attempt), supervised in a child process of its own session."""
    args = options.paddle_arguments()
    env = dict(os.environ)
    inputs = options.inputs()
    if part is not None:
        env.update(part.env)
        inputs[real(part.job.key_file)] = "the job's key"
        if part.expansion.hosts.cluster is not None:
            inputs.setdefault(real(part.expansion.hosts.cluster), "the cluster file the hosts file names")
    env[INPUTS_ENV] = json.dumps(inputs)  # no process of the job writes over them (fleet/plan_files.py)
    if args.worker_num is not None:
        env[LAUNCH_ENV] = json.dumps(launch_description(args))
    if options.timeout is not None:
        # a later attempt has what the earlier ones left of it (``deadline``)
        timeout_left = options.timeout if deadline is None else max(1.0, deadline - time.monotonic())
        env["HETERPS_LAUNCH_TIMEOUT"] = str(timeout_left)
    if part is None:
        env[RETRIES_LEFT_ENV] = str(retries_left)
    if options.checkpoint_dir is not None or options.checkpoint_every is not None:
        try:
            checkpoint_env, lines = prepare_launch(options.checkpoint_dir, options.checkpoint_every)
        except CheckpointError as exc:
            print(f"{OWN_PREFIX} {exc}", file=sys.stderr)
            return Ran(RunResult(RunState.FAILED), options.log_dir, EXIT_INPUT_ERROR)
        env.update(checkpoint_env)
        for line in lines:
            print(f"{OWN_PREFIX} {line}", flush=True)
    ports = None
    if part is None:
        try:
            ports, options = with_claimed_ports(args, options)
        except HeterPSError as exc:
            print(f"{OWN_PREFIX} {exc}", file=sys.stderr)
            return Ran(RunResult(RunState.FAILED, str(exc)), options.log_dir, FAILED_EXIT)
    board_dir = None
    if part is None and not env.get(LAUNCH_ID_ENV):
        # One host: the launch's board is a directory of the cache (rendezvous.py), named by this id rather than by
        # the endpoints Paddle draws, so that it is known here and removed when the job ends.
        env[LAUNCH_ID_ENV] = uuid.uuid4().hex[:16]
        board_dir = launch_files_dir(str(settings.get("HETERPS_CACHE", env)), env)
    log_dir = options.log_dir
    if number and part is not None:
        # a round's logs beside the first's, so that neither overwrites the other
        log_dir = os.path.join(log_dir, f"round{number}")
        options = options.with_paddle({"--log_dir": log_dir})
    os.makedirs(log_dir, exist_ok=True)
    started = time.time()
    result_path = os.path.join(log_dir, RESULT_FILE)
    env[RESULT_ENV] = result_path
    if part is not None:
        env[JOB_ENV] = part.job.to_json()
        env[control.KEY_FILE_ENV] = os.path.abspath(part.job.key_file)  # the board's clients prove it too
        if not part.job.is_coordinator and console.forwarder is None:
            console.forwarder = LogForwarder(part.job)
    launch_argv = options.launcher_argv()
    # Paddle's launcher prints its arguments and every process's environment: that goes to launcher.log; the
    # console gets heterps launch's own lines and the job's progress.
    child = subprocess.Popen(
        [sys.executable, "-m", "heterps_paddle.launch.child", *launch_argv],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    own_lines = threading.Thread(
        target=relay, args=(child.stdout, os.path.join(log_dir, LAUNCHER_LOG), console), daemon=True
    )
    own_lines.start()
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
        own_lines.join(timeout=5)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        if notice is not None:
            notice.cancel()
        stop_echo.set()
        if echo is not None:
            echo.join(timeout=2)
        left = stop_session(child.pid)
        if ports is not None:
            ports.release()
        if board_dir is not None:
            shutil.rmtree(board_dir, ignore_errors=True)
    if notice is not None and notice.refused:
        sys.exit(128 + signal.SIGTERM)  # the job would not let it go: SIGTERM's old meaning
    if left:
        console.error(
            f"heterps launch: stopped what was still running in the job's session at its end: {'; '.join(left)}"
        )
    result = RunResult.read(result_path, code)
    if result.state is RunState.NEW_ROUND and result.restart is not None:
        console.line(
            f"heterps launch: this host starts again with the job (round {result.restart['round']}) after "
            f"{time.time() - started:.1f} s"
        )
    return Ran(result, log_dir, code)


def launch_description(args: Any) -> dict[str, Any]:
    """The launch as planning/launch.LaunchShape reads it from HETERPS_LAUNCH."""
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
