"""One round of this host: Paddle's launcher run in a child process of its own session (launch/child.py), supervised,
its output relayed and its result read (launch/result.py); and what every process of the job is told of the launch
(``HETERPS_LAUNCH``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from heterps_paddle import control
from heterps_paddle.errors import EXIT_INPUT_ERROR, HeterPSError
from heterps_paddle.files import INPUTS_ENV, real
from heterps_paddle.launch import event_log
from heterps_paddle.launch.console import (
    LAUNCHER_LOG,
    OWN_PREFIX,
    Console,
    echo_logs,
    relay,
)
from heterps_paddle.launch.job import JOB_ENV
from heterps_paddle.launch.leave import Notice
from heterps_paddle.launch.member import LogForwarder
from heterps_paddle.launch.options import LaunchOptions
from heterps_paddle.launch.ports import PortBlock, claim_port_block
from heterps_paddle.launch.result import RESULT_FD_ENV, Outcome, RunResult
from heterps_paddle.launch.session import stop_session
from heterps_paddle.launch.turns import FAILED_EXIT, LOCAL_ADDRESS, JobMaster, Ran, Turn
from heterps_paddle.planning.launch import LAUNCH_ENV
from heterps_paddle.rendezvous import LAUNCH_ID_ENV
from heterps_paddle.runtime.checkpoint_choice import prepare_launch
from heterps_paddle.runtime.checkpoint_files import CheckpointError


def run_round(turn: Turn, console: Console, coordinator: JobMaster | None) -> Ran:
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
