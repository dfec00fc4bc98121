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
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from heterps_paddle import settings
from heterps_paddle.planning.launch import LAUNCH_ENV
from heterps_paddle.runtime import launch_checkpoints, patches, seam
from heterps_paddle.runtime.checkpoint_files import CheckpointError
from heterps_paddle.runtime.seam import PaddleBehaviourChanged
from heterps_paddle.tools.launch_hosts import take_hosts_options

CHILD_FLAG = "--heterps-supervised-child"
OWN_PREFIX = "heterps launch:"
LAUNCHER_LOG = "launcher.log"
POLL_S = 0.1
SETTLE_S = 1.0
# How a process ended, most likely a cause first (see Supervisor.check_once); exit statuses > 0 rank 1.
_END_RANK = {-signal.SIGKILL: 0, -signal.SIGTERM: 0, -signal.SIGINT: 0, -signal.SIGABRT: 3}
_ROLE_RANK = {"server": 0, "heter_worker": 1, "worker": 2}
STOP_GRACE_S = 5.0
FAILED_EXIT = 1
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


# ------------------------------------------------------------------------------------------------ the parent


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [CHILD_FLAG]:
        return _child(argv[1:])
    hosts = take_hosts_options(argv)  # --hosts/--plan: this host's part of a plan across hosts (launch_hosts.py)
    if hosts.exit_code is not None:
        return hosts.exit_code
    argv = hosts.argv
    os.environ.update(hosts.env)
    own, launch_argv = split_own_options(argv)
    args = paddle_arguments(launch_argv) if launch_argv else None
    if args is None or not getattr(args, "training_script", None):
        print(
            "usage: heterps launch [--timeout S] [--quiet] [--checkpoint-dir DIR [--checkpoint-every N|Nm]] "
            "PADDLE_LAUNCH_ARGS... train.py [ARGS...]\n"
            "(the arguments of python -m paddle.distributed.launch; see `python -m paddle.distributed.launch -h`)",
            file=sys.stderr,
        )
        return 2
    env = dict(os.environ)
    if args.worker_num is not None:
        env[LAUNCH_ENV] = json.dumps(launch_description(args))
    if own.timeout is not None:
        env["HETERPS_LAUNCH_TIMEOUT"] = str(own.timeout)
    if own.checkpoint:
        try:
            checkpoint_env, lines = launch_checkpoints.prepare_launch(
                own.checkpoint.get("--checkpoint-dir"), own.checkpoint.get("--checkpoint-every")
            )
        except CheckpointError as exc:
            print(f"{OWN_PREFIX} {exc}", file=sys.stderr)
            return 2
        env.update(checkpoint_env)
        for line in lines:
            print(f"{OWN_PREFIX} {line}", flush=True)
    log_dir = args.log_dir or "log"
    os.makedirs(log_dir, exist_ok=True)
    started = time.time()
    # Paddle's launcher prints its arguments and every process's environment: that goes to launcher.log; the
    # console gets heterps launch's own lines and the job's progress.
    child = subprocess.Popen(
        [sys.executable, "-m", "heterps_paddle.tools.launch", CHILD_FLAG, *launch_argv],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    own_lines = threading.Thread(target=_relay, args=(child.stdout, os.path.join(log_dir, LAUNCHER_LOG)), daemon=True)
    own_lines.start()
    print(
        f"heterps launch: {' '.join(launch_argv)} (Paddle's launcher output: {os.path.join(log_dir, LAUNCHER_LOG)})",
        flush=True,
    )
    stop_echo = threading.Event()
    echo = None
    if not own.quiet:
        echo = threading.Thread(target=_echo_logs, args=(log_dir, started, stop_echo), daemon=True)
        echo.start()

    def forward(signum: int, frame: Any) -> None:
        _stop_session(child.pid)
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
    seconds = time.time() - started
    if left:
        print(
            f"heterps launch: stopped what was still running in the job's session at its end: {'; '.join(left)}",
            file=sys.stderr,
            flush=True,
        )
    if code == 0:
        print(f"heterps launch: job finished in {seconds:.1f} s (logs in {log_dir})", flush=True)
        return 0
    print(
        f"heterps launch: job FAILED (exit status {code}) after {seconds:.1f} s (logs in {log_dir})",
        file=sys.stderr,
        flush=True,
    )
    return code if code > 0 else FAILED_EXIT


def _relay(stream: Any, path: str) -> None:
    """Everything the launcher process prints into ``path``; heterps launch's own lines also to the console."""
    with open(path, "wb") as log:
        for raw in iter(stream.readline, b""):
            log.write(raw)
            log.flush()
            if raw.startswith(OWN_PREFIX.encode()):
                sys.stderr.write(raw.decode("utf-8", "replace"))
                sys.stderr.flush()


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


def _echo_logs(log_dir: str, started: float, stop: threading.Event) -> None:
    """Print the job's progress lines as they are written (a best effort: partial lines wait for their end)."""
    offsets: dict[str, int] = {}
    last_batch: dict[str, float] = {}
    while not stop.wait(1.0):
        _echo_once(log_dir, offsets, last_batch)
    _echo_once(log_dir, offsets, last_batch)


def _echo_once(log_dir: str, offsets: dict[str, int], last_batch: dict[str, float]) -> None:
    try:
        names = sorted(n for n in os.listdir(log_dir) if re.fullmatch(r"(worker|server|heter)log\.\d+", n))
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
                print(f"[{name}] {line.strip()}", flush=True)


# ----------------------------------------------------------------------------------- the child: the launcher


@dataclass
class Failure:
    message: str
    log: str | None = None  # the failed process's log


class Supervisor:
    """Watches the processes of Paddle's ParameterServerLauncher (module doc)."""

    ROLE_NAMES = {"worker": "CPU trainer", "server": "parameter server", "heter_worker": "heterogeneous trainer"}

    def __init__(self, timeout: float | None):
        self.launcher: Any = None
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
        if not workers:
            return None  # not started yet
        now = time.monotonic()
        training = failing or any(tp.proc.poll() is None for tp in workers)
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
            failure = self.check_once()
            if failure is not None:
                # A process killed from outside can still be on its way out (its threads exiting) when the peers
                # it served have already aborted: give it a moment, so the report names it, and names it first.
                time.sleep(SETTLE_S)
                self.fail(self.check_once(failing=True) or failure)
                return

    def fail(self, failure: Failure) -> None:
        self.failure = failure
        try:
            _say(f"{OWN_PREFIX} FAILED: {failure.message}")
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
    # Imported here: tools/cli.py imports this module at start-up, and `heterps --help` must not import Paddle.
    from paddle.distributed.fleet import launch as paddle_launch

    timeout = str(settings.get("HETERPS_LAUNCH_TIMEOUT"))
    supervisor = Supervisor(float(timeout) if timeout else None)
    sys.argv = ["paddle.distributed.launch", *launch_argv]
    try:
        # Paddle's launcher tells the supervisor the processes it starts; its class is restored when it returns.
        with patches.supervised_launcher(supervisor.attach):
            paddle_launch.launch()
    except PaddleBehaviourChanged as exc:
        print(f"{OWN_PREFIX} {exc}", file=sys.stderr, flush=True)
        return FAILED_EXIT
    finally:
        supervisor.stop()
    if supervisor.failure is None and supervisor.launcher is not None:
        # What ended badly between the last poll and Paddle's launcher returning (its trainers gone, it stopped
        # the rest): a trainer that failed, and what it depended on.
        failure = supervisor.check_once(failing=True)
        if failure is not None and any(
            role == "worker" and tp.proc.poll() != 0 for role, _, tp in supervisor.processes()
        ):
            supervisor.fail(failure)
        supervisor.stop_all()
    return FAILED_EXIT if supervisor.failure is not None else 0


if __name__ == "__main__":
    sys.exit(main())
