"""``heterps launch``: ``python -m paddle.distributed.launch`` for parameter-server jobs, with failures that fail.

    heterps launch --server_num=1 --worker_num=2 [--heter_worker_num=1 --heter_devices=cpu] --log_dir log \\
        train.py ARGS                     # the same arguments as paddle.distributed.launch

Paddle 2.6.2's parameter-server launcher (``fleet/launch_utils.py: ParameterServerLauncher``) waits only for the
CPU trainers, ignores every exit status (a job whose trainer crashed, or whose server was killed, ends 0), and
leaves its server and heterogeneous-trainer children to a SIGTERM they may not die of.  ``heterps launch`` is that
launcher with three things added, and otherwise unchanged:

- **Supervision** (in the process that runs Paddle's launcher, which owns the job's processes): every 0.1 s each
  process's exit status is read.  A trainer that exits non-zero, a server or heterogeneous trainer that ends while
  trainers still run (except a heterogeneous trainer's own clean exit 0), or ``--timeout`` passing, fails the job:
  a message names the process, its exit status and its log with the log's last lines, every process of the job is
  stopped (SIGTERM, then SIGKILL), and the exit status is 1.
- **Nothing left behind**: the launcher runs in its own session; whatever is left in that session when it ends
  (orphans of killed processes included) is killed.
- **The launch told to the job** (``HETERPS_LAUNCH``): Paddle tells a process only its own stage's device; the
  automatic path plans within the whole launch (planning/launch.py).  Progress lines of the job's logs (heterps
  lines, epochs, results) are echoed to the console as the job runs (``--quiet`` turns that off).

Why a wrapper rather than only a watchdog inside the job: a process of the job can end itself (runtime/watchdog.py
does, when a peer dies), but nothing inside the job can change what Paddle's launcher returns.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, cast

import psutil

from heterps_paddle import settings
from heterps_paddle.errors import HeterPSError
from heterps_paddle.files import write_atomic
from heterps_paddle.planning.hosts import Expansion
from heterps_paddle.planning.launch import LAUNCH_ENV
from heterps_paddle.rendezvous import LAUNCH_ID_ENV, RENDEZVOUS_ENV, launch_files_dir
from heterps_paddle.runtime import checkpoint_choice, patches, seam
from heterps_paddle.runtime.checkpoint_files import CheckpointError
from heterps_paddle.runtime.seam import PaddleBehaviourChanged
from heterps_paddle.tools.hosts_job import (
    JOB_ENV,
    RESTART_EXIT,
    RESTART_FILE_ENV,
    Coordinator,
    HostsJob,
    JobAborted,
    LogForwarder,
    Member,
    NextRound,
    RoundRequest,
    ask_round,
    startup_timeout,
)
from heterps_paddle.tools.launch_hosts import HostsLaunch, Round, job_for_round, take_hosts_options
from heterps_paddle.tools.paddle_aborts import ConnectTimeoutAbort, connect_timeout_abort
from heterps_paddle.tools.ports import PortBlock, claim_port_block

CHILD_FLAG = "--heterps-supervised-child"
LOCAL_ADDRESS = "127.0.0.1"  # Paddle's launcher's address for the processes of a one-host job
OWN_PREFIX = "heterps launch:"
LAUNCHER_LOG = "launcher.log"
POLL_S = 0.1
SETTLE_S = 1.0
# How a process ended, most likely a cause first (see Supervisor.check_once); exit statuses > 0 rank 1.
_END_RANK = {-signal.SIGKILL: 0, -signal.SIGTERM: 0, -signal.SIGINT: 0, -signal.SIGABRT: 3}
_ROLE_RANK = {"server": 0, "heter_worker": 1, "worker": 2}
STOP_GRACE_S = 5.0
FAILED_EXIT = 1
# One host: the process that runs Paddle's launcher ends so when the job failed on an abort a fresh start gets past
# (tools/paddle_aborts.py) and heterps launch said it had retries left (RETRIES_LEFT_ENV); heterps launch starts it again.
RETRY_EXIT = 76
RETRIES_LEFT_ENV = "HETERPS_CONNECT_RETRIES_LEFT"
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


@dataclass(frozen=True)
class OwnOptions:
    timeout: float | None
    quiet: bool
    checkpoint: dict[str, str] = field(default_factory=dict)  # --checkpoint-dir / --checkpoint-every


CHECKPOINT_OPTIONS = ("--checkpoint-dir", "--checkpoint-every")  # runtime/launch_checkpoints.py


def split_own_options(argv: list[str]) -> tuple[OwnOptions, list[str]]:
    """Leading ``--timeout S`` / ``--timeout=S``, ``--quiet``, ``--checkpoint-dir DIR`` and ``--checkpoint-every
    N|Nm`` are heterps launch's; everything after the first other argument is paddle.distributed.launch's (and then
    the training script's)."""
    timeout, quiet, checkpoint, i = None, False, {}, 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--quiet":
            quiet, i = True, i + 1
        elif arg == "--timeout" and i + 1 < len(argv):
            timeout, i = _seconds(argv[i + 1]), i + 2
        elif arg.startswith("--timeout="):
            timeout, i = _seconds(arg.split("=", 1)[1]), i + 1
        elif arg in CHECKPOINT_OPTIONS and i + 1 < len(argv):
            checkpoint[arg], i = argv[i + 1], i + 2
        elif arg.split("=", 1)[0] in CHECKPOINT_OPTIONS and "=" in arg:
            checkpoint[arg.split("=", 1)[0]], i = arg.split("=", 1)[1], i + 1
        else:
            break
    return OwnOptions(timeout, quiet, checkpoint), argv[i:]


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SystemExit(f"heterps launch: --timeout: {text!r} is not a number of seconds") from None
    if not value > 0:
        raise SystemExit(f"heterps launch: --timeout must be positive, got {text!r}")
    return value


def paddle_arguments(argv: list[str]) -> Any:
    """Paddle's own reading of the launch arguments (its legacy PS launcher's parser)."""
    return seam.paddle_launch_arguments(argv)


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


def with_claimed_ports(args: Any, launch_argv: list[str]) -> tuple[PortBlock | None, list[str]]:
    """One host's PS launch given by process counts: its endpoints made explicit, from ports this launch claims
    below the ephemeral range (tools/ports.py), instead of the ports Paddle's launcher would draw inside it.  A
    launch that names its endpoints, or is not a parameter-server launch, is left as it is."""
    if not args.server_num or not args.worker_num or args.servers or args.workers or args.heter_workers:
        return None, launch_argv
    units = [int(u) for u in str(args.heter_worker_num or "").split(";") if u.strip()]
    block = claim_port_block(LOCAL_ADDRESS, args.server_num + args.worker_num + sum(units) + 1)
    ports = iter(block.ports)

    def endpoints(count: int) -> str:
        return ",".join(f"{LOCAL_ADDRESS}:{next(ports)}" for _ in range(count))

    explicit = ["--servers", endpoints(args.server_num), "--workers", endpoints(args.worker_num)]
    if units:
        explicit += ["--heter_workers", ";".join(endpoints(n) for n in units)]
    explicit += ["--http_port", str(next(ports))]  # gloo's HTTP store, on server 0's address
    try:
        script = script_index(args, launch_argv)
    except PaddleBehaviourChanged:
        block.release()
        raise
    return block, launch_argv[:script] + explicit + launch_argv[script:]


def script_index(args: Any, launch_argv: list[str]) -> int:
    """Where the training script stands in ``launch_argv``, as Paddle's parser read it: the launcher's options come
    before it, the script's own after it.  Counted from the end, so that an option's separate value (``--opt v``)
    is never taken for the script."""
    script = len(launch_argv) - len(args.training_script_args) - 1
    if script < 0 or launch_argv[script] != args.training_script:
        raise PaddleBehaviourChanged(
            f"heterps launch: cannot find the training script {args.training_script!r} in {launch_argv}"
        )
    return script


# ------------------------------------------------------------------------------------------------ the parent


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [CHILD_FLAG]:
        return _child(argv[1:])
    hosts = take_hosts_options(argv)  # --hosts/--plan: this host's part of a plan across hosts (launch_hosts.py)
    if hosts.exit_code is not None:
        return hosts.exit_code
    console = Console()
    coordinator: Coordinator | None = None
    first = hosts
    started = time.time()
    round_number = 0
    # One host: Paddle's connect-timeout abort starts the job again (across hosts the coordinator decides that).
    retries = int(cast(int, settings.get("HETERPS_CONNECT_RETRIES"))) if hosts.job is None else 0
    retries_left = retries
    # --timeout bounds the whole launch of a one-host job, its attempts together
    first_timeout = split_own_options(hosts.argv)[0].timeout if hosts.job is None else None
    deadline = None if first_timeout is None else time.monotonic() + first_timeout
    if hosts.job is not None and not hosts.job.is_coordinator and hosts.restarts > 0:
        hosts, round_number = _join_the_round(argv, hosts, console)
        if hosts.exit_code is not None:
            return hosts.exit_code
    while True:
        if hosts.spare:
            outcome: Coordinator | tuple[int, str, dict[str, Any] | None] = _stand_by(hosts, console)
        else:
            outcome = _run_round(hosts, console, coordinator, round_number, retries_left, deadline)
        if isinstance(outcome, Coordinator):  # round 0 on the coordinator's host made it; run the round now
            coordinator = outcome
            continue
        code, log_dir, restart = outcome
        if code == RETRY_EXIT and hosts.job is None and retries_left > 0:
            attempt = retries - retries_left + 1  # the one that was aborted
            retries_left -= 1
            kept = keep_attempt_logs(log_dir, attempt)
            console.error(
                f"heterps launch: starting the job again (retry {attempt} of {retries}, HETERPS_CONNECT_RETRIES): "
                f"attempt {attempt} was aborted by Paddle on a connect timeout; its logs are in {kept}"
            )
            continue
        if restart is None:
            break
        # The job starts again (tools/hosts_job.py): this host runs its part of the restart's plan.
        round_number = int(restart["round"])
        assert first.round is not None and first.expansion is not None
        hosts = _hosts_of_round(
            argv, first.expansion, log_dir, round_number, restart["plan"], frozenset(restart["lost"])
        )
        if hosts.exit_code is not None:
            code = hosts.exit_code
            break
    if coordinator is not None:
        coordinator.close()
    seconds = time.time() - started
    if code == 0:
        console.line(f"heterps launch: job finished in {seconds:.1f} s (logs in {log_dir})")
        console.close()
        return 0
    console.error(f"heterps launch: job FAILED (exit status {code}) after {seconds:.1f} s (logs in {log_dir})")
    console.close()
    return code if code > 0 else FAILED_EXIT


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


def _join_the_round(argv: list[str], hosts: HostsLaunch, console: Console) -> tuple[HostsLaunch, int]:
    """A launch that may restart (``--restarts``) asks the coordinator which round the job is in: a host started
    again after it was lost finds the job in a later round, runs nothing of its plan, and stands by (the coordinator
    counts it back: tools/hosts_job.py).  A coordinator that does not answer is the join's to report."""
    assert hosts.job is not None and hosts.expansion is not None
    try:
        answer = ask_round(hosts.job.endpoint, time.monotonic() + startup_timeout())
    except (OSError, ValueError):
        return hosts, 0
    number = int(answer.get("round") or 0)
    if number == 0 or not answer.get("plan"):
        return hosts, 0
    log_dir = _given_log_dir(hosts.argv)
    os.makedirs(log_dir, exist_ok=True)
    lost = frozenset(answer.get("lost") or ()) - {hosts.job.host}
    console.line(f"heterps launch: the job is in round {number} (hosts lost: {', '.join(sorted(lost)) or 'none'})")
    return _hosts_of_round(argv, hosts.expansion, log_dir, number, answer["plan"], lost), number


def _hosts_of_round(
    argv: list[str], first: Expansion, log_dir: str, number: int, plan: Mapping[str, Any], lost: frozenset[str]
) -> HostsLaunch:
    """This host's part of round ``number`` of the job whose first round ``first`` placed: ``plan`` (the
    coordinator's, as its file holds it) written beside this host's logs, without the ``lost`` hosts."""
    plan_path = os.path.join(log_dir, f"plan.round{number}.json")
    write_atomic(plan_path, json.dumps(plan, indent=2) + "\n")
    return take_hosts_options(argv, round_=Round.after(first, plan_path, lost))


def _run_round(
    hosts: HostsLaunch,
    console: Console,
    coordinator: Coordinator | None,
    round_number: int,
    retries_left: int = 0,
    deadline: float | None = None,
) -> Coordinator | tuple[int, str, dict[str, Any] | None]:
    """One run of Paddle's launcher (a launch across hosts with restarts may run several, and a one-host launch
    one per attempt): its exit status, its log directory, and the restart's message when the job starts again."""
    argv = hosts.argv
    os.environ.update(hosts.env)
    own, launch_argv = split_own_options(argv)
    args = paddle_arguments(launch_argv) if launch_argv else None
    if args is None or not getattr(args, "training_script", None):
        print(
            "usage: heterps launch [--timeout S] [--quiet] [--checkpoint-dir DIR [--checkpoint-every N|Nm]] "
            "PADDLE_LAUNCH_ARGS... train.py [ARGS...]\n"
            "(the arguments of python -m paddle.distributed.launch; see `python -m paddle.distributed.launch -h`)\n"
            "   or: heterps launch [--timeout S] [--quiet] [--checkpoint-dir DIR ...] --hosts HOSTS --plan PLAN "
            "[--host ADDR] [--restarts N] [--devices plan|cpu] --log_dir LOG train.py [ARGS...]\n"
            "(across hosts, the same command on every host: docs/across-hosts.md)",
            file=sys.stderr,
        )
        return 2, "log", None
    env = dict(os.environ)
    if args.worker_num is not None:
        env[LAUNCH_ENV] = json.dumps(launch_description(args))
    if own.timeout is not None:
        # a later attempt has what the earlier ones left of it (``deadline``)
        timeout_left = own.timeout if deadline is None else max(1.0, deadline - time.monotonic())
        env["HETERPS_LAUNCH_TIMEOUT"] = str(timeout_left)
    if hosts.job is None:
        env[RETRIES_LEFT_ENV] = str(retries_left)
    if own.checkpoint:
        try:
            checkpoint_env, lines = checkpoint_choice.prepare_launch(
                own.checkpoint.get("--checkpoint-dir"), own.checkpoint.get("--checkpoint-every")
            )
        except CheckpointError as exc:
            print(f"{OWN_PREFIX} {exc}", file=sys.stderr)
            return 2, args.log_dir or "log", None
        env.update(checkpoint_env)
        for line in lines:
            print(f"{OWN_PREFIX} {line}", flush=True)
    ports = None
    if hosts.job is None:
        try:
            ports, launch_argv = with_claimed_ports(args, launch_argv)
        except HeterPSError as exc:
            print(f"{OWN_PREFIX} {exc}", file=sys.stderr)
            return FAILED_EXIT, args.log_dir or "log", None
    board_dir = None
    if hosts.job is None and not env.get(LAUNCH_ID_ENV):
        # One host: the launch's board is a directory of the cache (rendezvous.py), named by this id rather than by
        # the endpoints Paddle draws, so that it is known here and removed when the job ends.
        env[LAUNCH_ID_ENV] = uuid.uuid4().hex[:16]
        board_dir = launch_files_dir(str(settings.get("HETERPS_CACHE", env)), env)
    log_dir = args.log_dir or "log"
    if round_number:
        # a round's logs beside the first's, so that neither overwrites the other
        log_dir = os.path.join(log_dir, f"round{round_number}")
        launch_argv = with_log_dir(args, launch_argv, log_dir)
    os.makedirs(log_dir, exist_ok=True)
    started = time.time()
    restart_file = os.path.join(log_dir, "restart.json")
    if hosts.job is not None:
        env[JOB_ENV] = hosts.job.to_json()
        env[RESTART_FILE_ENV] = restart_file
        if hosts.job.is_coordinator and coordinator is None:
            try:
                return Coordinator(
                    hosts.job,
                    console.remote,
                    restarts=hosts.restarts,
                    next_round=_next_round_maker(hosts, log_dir),
                    restarts_path=os.path.join(log_dir, "restarts.json"),
                    checkpoint_dir=own.checkpoint.get("--checkpoint-dir"),
                ).start()
            except JobAborted as exc:
                print(f"heterps launch: FAILED: {exc}", file=sys.stderr, flush=True)
                return FAILED_EXIT, log_dir, None
        if not hosts.job.is_coordinator and console.forwarder is None:
            console.forwarder = LogForwarder(hosts.job)
    # Paddle's launcher prints its arguments and every process's environment: that goes to launcher.log; the
    # console gets heterps launch's own lines and the job's progress.
    child = subprocess.Popen(
        [sys.executable, "-m", "heterps_paddle.tools.launch", CHILD_FLAG, *launch_argv],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    own_lines = threading.Thread(
        target=_relay, args=(child.stdout, os.path.join(log_dir, LAUNCHER_LOG), console), daemon=True
    )
    own_lines.start()
    print(
        f"heterps launch: {' '.join(launch_argv)} (Paddle's launcher output: {os.path.join(log_dir, LAUNCHER_LOG)})",
        flush=True,
    )
    stop_echo = threading.Event()
    echo = None
    if not own.quiet:
        echo = threading.Thread(target=_echo_logs, args=(log_dir, started, stop_echo, console), daemon=True)
        echo.start()

    def forward(signum: int, frame: Any) -> None:
        _stop_session(child.pid)
        if coordinator is not None:
            coordinator.close(wait_s=2.0, late_joiners_s=0.0)
        sys.exit(128 + signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    try:
        code = child.wait()
        own_lines.join(timeout=5)
    finally:
        stop_echo.set()
        if echo is not None:
            echo.join(timeout=2)
        left = _stop_session(child.pid)
        if ports is not None:
            ports.release()
        if board_dir is not None:
            shutil.rmtree(board_dir, ignore_errors=True)
    if left:
        console.error(
            f"heterps launch: stopped what was still running in the job's session at its end: {'; '.join(left)}"
        )
    restart = None
    if code == RESTART_EXIT and os.path.isfile(restart_file):
        with open(restart_file, encoding="utf-8") as f:
            restart = json.load(f)
        console.line(
            f"heterps launch: this host starts again with the job (round {restart['round']}) after "
            f"{time.time() - started:.1f} s"
        )
    return code, log_dir, restart


def _stand_by(hosts: HostsLaunch, console: Console) -> tuple[int, str, dict[str, Any] | None]:
    """A spare host (launch_hosts.py): no process of this round's plan runs here; wait for the coordinator's word."""
    assert hosts.job is not None
    log_dir = _given_log_dir(hosts.argv)
    os.makedirs(log_dir, exist_ok=True)
    console.line(f"heterps launch: standing by for a restart (coordinator at {hosts.job.endpoint})")
    try:
        message = Member(hosts.job).standby()
    except JobAborted as exc:
        console.error(f"heterps launch: FAILED: {exc}")
        return FAILED_EXIT, log_dir, None
    if message["op"] == "restart":
        return RESTART_EXIT, log_dir, message
    if message["op"] == "end":
        return 0, log_dir, None
    console.error(f"heterps launch: FAILED: the launch across hosts ended: {message.get('reason')}")
    return FAILED_EXIT, log_dir, None


def _given_log_dir(argv: list[str]) -> str:
    """The launcher's ``--log_dir`` as Paddle's parser reads it, not a ``--log_dir`` among the script's arguments."""
    _, launch_argv = split_own_options(argv)
    args = paddle_arguments(launch_argv) if launch_argv else None
    return (args.log_dir if args is not None else None) or "log"


def with_log_dir(args: Any, launch_argv: list[str], log_dir: str) -> list[str]:
    """``launch_argv`` with the launcher's ``--log_dir`` replaced by ``log_dir``; the script's own arguments (which
    may have a ``--log_dir`` of their own) are left as they are."""
    script = script_index(args, launch_argv)
    launcher, rest = launch_argv[:script], launch_argv[script:]
    out, i = [], 0
    while i < len(launcher):
        arg = launcher[i]
        if arg == "--log_dir" and i + 1 < len(launcher):
            i += 2
            continue
        if arg.startswith("--log_dir="):
            i += 1
            continue
        out.append(arg)
        i += 1
    return [*out, "--log_dir", log_dir, *rest]


def _next_round_maker(hosts: HostsLaunch, log_dir: str) -> Callable[[RoundRequest], NextRound]:
    """The coordinator's re-planning (tools/hosts_job.py): the plan for the hosts the job has."""
    from heterps_paddle.planning.model import plan_from_dict, save_plan
    from heterps_paddle.planning.replan import PlanningInputs, better, replan

    assert hosts.expansion is not None and hosts.round is not None and hosts.job is not None
    first = hosts.expansion
    address = hosts.job.host

    def next_round(request: RoundRequest) -> NextRound:
        published = request.published
        inputs = published.get("inputs")
        if published.get("plan"):
            old = plan_from_dict(published["plan"], "the job's published plan")
        elif request.plan_now is not None:
            old = plan_from_dict(request.plan_now, "the round's plan")
        else:
            old = first.plan
        better_plan = True
        if request.lost != request.lost_before:
            if inputs is None:
                raise HeterPSError(
                    "the job published no planning inputs to re-plan with (the automatic path, "
                    "heterps_configs['cluster'], publishes them)"
                )
            planning = PlanningInputs.from_dict(inputs)
            replanned = replan(planning, first.hosts, request.lost)
            new, how = replanned.plan, replanned.note
            better_plan = better(new, old, planning.target_throughput)
        else:
            new, how = old, "the same plan (no host was lost)"
        path = os.path.join(log_dir, f"plan.round{request.number}.coordinator.json")
        save_plan(new, path)
        again = job_for_round(hosts.given, Round.after(first, path, request.lost), address)
        report = {
            "old_plan": plan_summary(old),
            "new_plan": plan_summary(new),
            "how": how,
            "summary": f"{describe_plan(old)} -> {describe_plan(new)} ({how})",
            "new_summary": describe_plan(new),
        }
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
        plan_from_dict(document)  # what every host reads back
        return NextRound(document, again, report, better_plan)

    return next_round


def plan_summary(plan: Any) -> dict[str, Any]:
    """A plan as restarts.json reports it."""
    return {
        "stages": [
            f"{s.units} x {s.resource} ({len(s.layers)} layer{'s' * (len(s.layers) != 1)})" for s in plan.stages
        ],
        "cost_per_hour": round(plan.cost_per_hour, 4),
        "predicted_samples_per_s": round(plan.throughput, 1),
    }


def describe_plan(plan: Any) -> str:
    stages = " | ".join(f"{s.units} x {s.resource}" for s in plan.stages)
    return f"{stages} ({plan.cost_per_hour:.3g}/h, {plan.throughput:,.0f} samples/s predicted)"


class Console:
    """This host's console; on a host of a launch across hosts other than the coordinator's, every line is also
    sent there (tools/hosts_job.py), and the coordinator's prints the lines other hosts send it."""

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


def _relay(stream: Any, path: str, console: Console) -> None:
    """Everything the launcher process prints into ``path``; heterps launch's own lines also to the console."""
    with open(path, "wb") as log:
        for raw in iter(stream.readline, b""):
            log.write(raw)
            log.flush()
            if raw.startswith(OWN_PREFIX.encode()):
                console.error(raw.decode("utf-8", "replace").rstrip("\n"))


def _session_members(sid: int) -> list[int]:
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            # A zombie (the launcher child this process has not reaped yet, when a signal interrupted its
            # wait) has ended: counting it made every stop wait out the whole grace period.
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.info["pid"] == os.getpid():
                continue
            if os.getsid(proc.info["pid"]) == sid:
                members.append(proc.info["pid"])
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def _stop_session(sid: int) -> list[str]:
    """SIGTERM every process of the job's session, then SIGKILL what is left; returns what they were."""
    members = _session_members(sid)
    described = []
    for pid in members:
        try:
            described.append(f"pid {pid} ({' '.join(psutil.Process(pid).cmdline())[:120]})")
        except psutil.Error:
            described.append(f"pid {pid}")
    for pid in members:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and _session_members(sid):
        time.sleep(0.1)
    for pid in _session_members(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return described


def _echo_logs(log_dir: str, started: float, stop: threading.Event, console: Console) -> None:
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
        path = os.path.join(log_dir, name)
        try:
            with open(path, "rb") as f:
                f.seek(offsets.get(name, 0))
                data = f.read()
        except OSError:
            continue
        end = data.rfind(b"\n")
        if end < 0:
            continue
        offsets[name] = offsets.get(name, 0) + end + 1
        for line in data[:end].decode("utf-8", "replace").splitlines():
            show = bool(ECHO.search(line))
            if not show and BATCH_LINE.search(line):
                now = time.monotonic()
                show = now - last_batch.get(name, 0.0) >= BATCH_ECHO_EVERY_S
                if show:
                    last_batch[name] = now
            if show:
                console.line(f"[{name}] {line.strip()}")


# ----------------------------------------------------------------------------------- the child: the launcher


@dataclass
class Failure:
    message: str
    log: str | None = None  # the failed process's log
    connect_timeout: ConnectTimeoutAbort | None = None  # that process was Paddle's connect-timeout abort


class Supervisor:
    """Watches the processes of Paddle's ParameterServerLauncher (module doc)."""

    ROLE_NAMES = {"worker": "CPU trainer", "server": "parameter server", "heter_worker": "heterogeneous trainer"}

    def __init__(self, timeout: float | None, member: Member | None = None, retries_left: int = 0):
        self.launcher: Any = None
        self.retries_left = retries_left  # one host: whether heterps launch starts the job again (RETRY_EXIT)
        self.member = member  # this host's part of a launch across hosts (tools/hosts_job.py), or None
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
        workers = (getattr(launcher, "procs", None) or {}).get("worker") or []
        if self.member is None or not workers:
            return
        proc = workers[-1].proc
        wait = proc.wait

        def wait_for_the_job(timeout: float | None = None) -> Any:
            code = wait(timeout)
            self.hold_until_job_ends(workers)
            return code

        proc.wait = wait_for_the_job

    def hold_until_job_ends(self, workers: list[Any]) -> None:
        member = self.member
        if member is None or self.failure is not None or any(tp.proc.poll() != 0 for tp in workers):
            return  # a failed trainer: the supervisor stops the job
        member.report_done()
        _say(f"{OWN_PREFIX} this host's CPU trainers finished; its servers serve until every host's have")
        while not member.ended.is_set() and not member.aborted.is_set() and self.failure is None:
            time.sleep(POLL_S)

    def stop(self) -> None:
        """Stop watching; a failure being settled is still reported before this returns."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def processes(self) -> list[tuple[str, int, Any]]:
        procs = getattr(self.launcher, "procs", None) or {}
        return [
            (role, i, tp) for role in ("worker", "server", "heter_worker") for i, tp in enumerate(procs.get(role, []))
        ]

    def describe(self, role: str, index: int, tp: Any) -> str:
        name = self.ROLE_NAMES.get(role, role)
        if role == "heter_worker":
            stage = getattr(tp, "stage", None) or self._heter_stage(index)
            if stage is not None:
                name = f"stage {stage} {name}"
        log = getattr(getattr(tp, "log_fn", None), "name", None)
        return f"{name} {index} (pid {tp.proc.pid}{', log ' + log if log else ''})"

    def _heter_stage(self, index: int) -> int | None:
        stages = getattr(self.launcher, "stage_list", None)
        return stages[index] if stages and index < len(stages) else None

    def check_once(self, failing: bool = False) -> Failure | None:
        """Every process that ended badly, as one failure, the likeliest cause first.

        Order: when each was first seen dead (polls are POLL_S apart); within one poll, how it ended (killed from
        outside, then an error exit, then a crash, then an abort: Paddle's RPC layer aborts a process whose peer
        vanished); then servers, heterogeneous trainers, CPU trainers.  ``failing``: a failure was seen; every end
        but a clean one or Paddle's own SIGTERM counts, whether trainers still run or not."""
        entries = self.processes()
        workers = [tp for role, _, tp in entries if role == "worker"]
        if not workers and (self.member is None or not entries):
            return None  # not started yet
        now = time.monotonic()
        # Across hosts, training goes on until the job's end: another host's trainers use this host's processes.
        training = (
            failing
            or any(tp.proc.poll() is None for tp in workers)
            or (self.member is not None and not self.member.ended.is_set())
        )
        bad = []
        for role, index, tp in entries:
            code = tp.proc.poll()
            if code is None:
                continue
            self.first_seen.setdefault((role, index), now)
            if code == 0 and role != "server":
                continue
            if failing and code == -signal.SIGTERM and role != "worker":
                continue  # stopped by Paddle's launcher once the CPU trainers had ended
            if role == "worker" or training:
                # a trainer that failed, or a server / heterogeneous trainer that ended while trainers run
                # (after the trainers, Paddle's launcher stops servers and heterogeneous trainers itself)
                key = (self.first_seen[(role, index)], _END_RANK.get(code, 1 if code > 0 else 2), _ROLE_RANK[role])
                bad.append(
                    (
                        key,
                        f"{self.describe(role, index, tp)} {_status(code)}"
                        + ("" if role == "worker" else " while the CPU trainers were still running"),
                        getattr(getattr(tp, "log_fn", None), "name", None),
                    )
                )
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
                    _say(f"{OWN_PREFIX} stopping this host's processes: {member.abort_reason}")
                    self.stop_all()
                    return
                self.fail(Failure(f"the launch across hosts ended: {member.abort_reason}"), report=False)
                return
            if member is not None and member.ended.is_set():
                if not any(tp.proc.poll() is None for role, _, tp in self.processes() if role == "worker"):
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
        have there.  (Before, such a host reported its part done, and the trainers it served waited for it until
        their startup timeout.)"""
        if self.member is not None:
            failure = self.check_once()
            if failure is not None:
                return failure
        failure = self.check_once(failing=True)
        if failure is not None and any(role == "worker" and tp.proc.poll() != 0 for role, _, tp in self.processes()):
            return failure
        return None

    def fail(self, failure: Failure, report: bool = True) -> None:
        # The first process that ended badly: an abort a fresh start gets past (tools/paddle_aborts.py)?
        failure.connect_timeout = connect_timeout_abort(failure.log)
        if failure.connect_timeout is not None:
            failure.message += f" ({failure.connect_timeout.describe()})"
        self.failure = failure
        if self.member is not None and report:
            self.member.report_failure(failure.message, retryable=failure.connect_timeout is not None)
        retrying = failure.connect_timeout is not None and self.retries_left > 0
        try:
            _say(f"{OWN_PREFIX} {'aborted' if retrying else 'FAILED'}: {failure.message}")
            if failure.log:
                _say(_tail(failure.log))
        finally:
            self.stop_all()

    def stop_all(self) -> None:
        entries = self.processes()
        for _, _, tp in entries:
            if tp.proc.poll() is None:
                tp.proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(tp.proc.poll() is None for _, _, tp in entries):
            time.sleep(0.1)
        for _, _, tp in entries:
            if tp.proc.poll() is None:
                tp.proc.kill()


def _say(text: str) -> None:
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


def _tail(path: str, lines: int = 12) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            tail = [line.rstrip() for line in f.readlines()[-lines:]]
    except OSError:
        return f"{OWN_PREFIX} {path}: unreadable"
    return f"{OWN_PREFIX} last {len(tail)} lines of {path}:\n" + "\n".join(f"{OWN_PREFIX} | {t}" for t in tail)


def _child(launch_argv: list[str]) -> int:
    """Run Paddle's launcher in this process, supervised; the exit status says whether every process did well."""
    timeout = str(settings.get("HETERPS_LAUNCH_TIMEOUT"))
    member = None
    job = HostsJob.from_env()
    if job is not None:
        member = Member(job)
        _say(f"{OWN_PREFIX} joining the launch's coordinator at {job.endpoint} (host {job.coordinator})")
        try:
            launch = member.join()
        except JobAborted as exc:
            _say(f"{OWN_PREFIX} FAILED: the launch across hosts did not start: {exc}")
            member.close()
            return FAILED_EXIT
        # Every process of the job reads the launch's board there, and names the launch by the coordinator's id.
        os.environ[RENDEZVOUS_ENV] = job.endpoint
        os.environ[LAUNCH_ID_ENV] = launch
        _say(f"{OWN_PREFIX} every host joined (launch {launch}); starting this host's processes")
    # Imported here: tools/cli.py imports this module at start-up, and `heterps --help` must not import Paddle.
    # And after joining: importing Paddle takes seconds (tens on a busy machine), which the coordinator's
    # HETERPS_STARTUP_TIMEOUT would count against a host that is there (a suite run at load average 20-30 saw
    # the coordinator's own host reported as never joined within a test's 8 s).
    from paddle.distributed.fleet import launch as paddle_launch

    retries_left = int(os.environ.get(RETRIES_LEFT_ENV) or 0) if member is None else 0
    supervisor = Supervisor(float(timeout) if timeout else None, member, retries_left)
    sys.argv = ["paddle.distributed.launch", *launch_argv]
    try:
        # Paddle's launcher tells the supervisor the processes it starts; its class is restored when it returns.
        with patches.supervised_launcher(supervisor.attach, supervisor.workers_started):
            paddle_launch.launch()
    except PaddleBehaviourChanged as exc:
        print(f"{OWN_PREFIX} {exc}", file=sys.stderr, flush=True)
        return FAILED_EXIT
    finally:
        supervisor.stop()
    if supervisor.failure is None and supervisor.launcher is not None and (member is None or member.restart is None):
        failure = supervisor.after_the_launcher()
        if failure is not None:
            supervisor.fail(failure)
        supervisor.stop_all()
    if member is not None:
        if member.restart is None and supervisor.failure is not None and member.job.may_start_again:
            # The coordinator may start the job again rather than end it: wait for its word.
            while not member.settled():
                time.sleep(POLL_S)
        _end_membership(supervisor, member)
        if member.restart is not None:
            member.close()
            write_atomic(str(os.environ.get(RESTART_FILE_ENV)), json.dumps(member.restart) + "\n")
            return RESTART_EXIT
    if supervisor.failure is not None and supervisor.failure.connect_timeout is not None and retries_left > 0:
        return RETRY_EXIT
    return FAILED_EXIT if supervisor.failure is not None else 0


def _end_membership(supervisor: Supervisor, member: Member) -> None:
    """Across hosts, after Paddle's launcher returned: a host whose processes all ended well says so and waits for
    the job's end (closing its connection earlier would read as a lost host); a failure was already reported."""
    if member.restart is not None:
        return  # the job starts again: this round's end is not the job's
    try:
        if supervisor.failure is None:
            member.report_done()
            while not member.settled():
                time.sleep(POLL_S)
            if member.restart is not None:
                return
            if member.aborted.is_set() and not member.ended.is_set():
                supervisor.fail(Failure(f"the launch across hosts ended: {member.abort_reason}"), report=False)
    finally:
        if member.restart is None:
            member.close()


if __name__ == "__main__":
    sys.exit(main())
