"""Launched jobs for the benchmarks and the tests: one launcher, the one users run (``heterps launch``).

:func:`launch` runs any fleet script under ``heterps launch`` and returns its exit status, time and console
output; :func:`run_job` runs the example trainer (examples/static_ps_trainer.py) and collects the figures its
workers write.  Both measure exactly what a user runs: the same script, the same launcher, real server and
trainer processes.  A job is bounded in time, and nothing of it is left running (``heterps launch`` stops its
whole session; if that launcher itself had to be killed, what it started is killed here).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import psutil

from heterps_paddle import control
from heterps_paddle.errors import HeterPSError
from heterps_paddle.launch import event_log
from heterps_paddle.launch.hosts import job_key_path
from heterps_paddle.launch.ports import PortBlock, claim_port_block

OUTER_GRACE_S = 30.0  # beyond the job's own --timeout: heterps launch's teardown


class JobFailed(HeterPSError):
    """A launched job exited badly or left no results; the message carries its log tails."""


@dataclass(frozen=True)
class Launched:
    returncode: int
    seconds: float
    output: str  # heterps launch's console (its FAILED lines name the process and its log)
    log_dir: str

    @property
    def failures(self) -> list[str]:
        return [line for line in self.output.splitlines() if "FAILED" in line]

    def logs(self) -> dict[str, str]:
        out = {}
        for name in sorted(os.listdir(self.log_dir)):
            path = os.path.join(self.log_dir, name)
            if os.path.isfile(path):
                with open(path, errors="replace") as f:
                    out[name] = f.read()
        return out


def launch_command(timeout: float, launch_args: Sequence[str], log_dir: str, script_argv: Sequence[str]) -> list[str]:
    """The one command line of a launched job, this interpreter running ``heterps launch --timeout T LAUNCH_ARGS
    --log_dir LOG SCRIPT...`` (:func:`launch`'s job, each emulated host of a :class:`HostsRun`)."""
    return [
        sys.executable,
        "-m",
        "heterps_paddle.tools.launch",
        "--timeout",
        str(timeout),
        *launch_args,
        "--log_dir",
        log_dir,
        *script_argv,
    ]


def launch(
    launch_args: list[str],
    script_argv: list[str],
    log_dir: str,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> Launched:
    """``heterps launch --timeout T LAUNCH_ARGS --log_dir LOG SCRIPT...``; never leaves a process behind."""
    os.makedirs(log_dir, exist_ok=True)
    cmd = launch_command(timeout, launch_args, log_dir, script_argv)
    started = time.time()
    out_path = os.path.join(log_dir, "launcher.out")
    with open(out_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        created = created_at(proc.pid)
        try:
            code = proc.wait(timeout=timeout + OUTER_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # heterps launch stops its job's session on SIGTERM
            try:
                code = proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                code = -9
        finally:
            _kill_descendants_and_group(proc.pid, created)
            proc.wait()
    with open(out_path, errors="replace") as f:
        output = f.read()
    return Launched(code, time.time() - started, output, log_dir)


def created_at(pid: int) -> float | None:
    """When process ``pid`` started (None: it is gone already)."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def _kill_descendants_and_group(pid: int, created: float | None) -> None:
    """SIGKILL to the descendants of the process ``pid`` that started at ``created``, and to its process group.
    Once that process ended and was reaped its pid is free: with pid_max at 32,768 a loaded machine gives it to
    another process within minutes (a test's cleanup killed another suite's launcher so), so a live ``pid`` that
    started at another time is another's, and neither it nor its group is touched.  While a member of the group
    lives the kernel gives its number to no new process: the group of a gone leader is still ours."""
    try:
        proc = psutil.Process(pid)
        if created is None or abs(proc.create_time() - created) > 0.01:
            return
        victims = proc.children(recursive=True)
    except psutil.NoSuchProcess:
        victims = []
    for victim in victims:
        try:
            victim.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class JobSpec:
    model: str = "ctr_dnn"
    heterps: bool = False
    servers: int = 1
    workers: int = 2  # 0: one process, no parameter server (the learning reference)
    overrides: dict[str, Any] = field(default_factory=dict)  # run config keys, e.g. {"generate_rows": 200000}
    heterps_configs: dict[str, Any] = field(default_factory=dict)
    launch_args: tuple[str, ...] = ()  # extra launch arguments (heterogeneous trainers...)
    timeout: float = 600.0
    env: dict[str, str] = field(default_factory=dict)  # set for the job's processes besides this one's


@dataclass
class JobResult:
    spec: JobSpec
    samples_per_second: float  # summed over workers
    test_auc: float
    wall_seconds: float
    log_dir: str
    worker_results: list[dict[str, Any]]

    def summary(self) -> dict[str, Any]:
        return {
            "model": self.spec.model,
            "heterps": self.spec.heterps,
            "workers": self.spec.workers,
            "servers": self.spec.servers if self.spec.workers else 0,
            "samples_per_second": round(self.samples_per_second, 1),
            "test_auc": round(self.test_auc, 4),
            "wall_seconds": round(self.wall_seconds, 1),
        }


def log_tails(log_dir: str, lines: int = 15) -> str:
    out = []
    if os.path.isdir(log_dir):
        for name in sorted(os.listdir(log_dir)):
            path = os.path.join(log_dir, name)
            if os.path.isfile(path):
                with open(path, errors="replace") as f:
                    tail = [line for line in f.read().splitlines() if line.strip()][-lines:]
                out.append(f"--- {path} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "\n".join(out)


def trainer_argv(spec: JobSpec, result_dir: str) -> list[str]:
    # lazy: heterps_paddle.examples exists only once installed (setup.py maps examples/ to it)
    from heterps_paddle.examples import TRAINER_SCRIPT, model_config_path

    script = [TRAINER_SCRIPT, "-m", model_config_path(spec.model), "--result-dir", result_dir]
    for key, value in spec.overrides.items():
        script += ["-o", f"{key}={json.dumps(value)}"]
    if spec.heterps:
        script.append("--heterps")
        for key, value in spec.heterps_configs.items():
            script += ["--heterps-config", f"{key}={json.dumps(value)}"]
    return script


def run_job(spec: JobSpec, work_dir: str) -> JobResult:
    """Run ``spec`` with ``work_dir`` as its working directory; raise JobFailed with the logs' tails if it fails,
    times out or leaves no result."""
    log_dir = os.path.join(work_dir, "log")
    result_dir = os.path.join(work_dir, "results")
    script = trainer_argv(spec, result_dir)
    if spec.workers == 0:
        os.makedirs(log_dir, exist_ok=True)
        started = time.time()
        with open(os.path.join(log_dir, "single.log"), "w") as out:
            try:
                code = subprocess.run(
                    [sys.executable, "-u", *script],
                    cwd=work_dir,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=spec.timeout,
                ).returncode
            except subprocess.TimeoutExpired:
                code = -9
        launched = Launched(code, time.time() - started, "", log_dir)
    else:
        launched = launch(
            [f"--server_num={spec.servers}", f"--worker_num={spec.workers}", *spec.launch_args],
            script,
            log_dir,
            spec.timeout,
            env={**os.environ, **spec.env} if spec.env else None,
            cwd=work_dir,
        )
    expected = max(spec.workers, 1)
    results = []
    for i in range(expected):
        path = os.path.join(result_dir, f"worker-{i}.json")
        if os.path.isfile(path):
            with open(path) as f:
                results.append(json.load(f))
    if launched.returncode != 0 or len(results) != expected or "test_auc" not in results[0]:
        raise JobFailed(
            f"job failed (exit status {launched.returncode}, results from {len(results)} of {expected} "
            f"workers): {' '.join(script)}\n{launched.output[-3000:]}\n{log_tails(log_dir)}"
        )
    return JobResult(
        spec=spec,
        samples_per_second=sum(r["samples_per_second"] for r in results),
        test_auc=results[0]["test_auc"],
        wall_seconds=launched.seconds,
        log_dir=log_dir,
        worker_results=results,
    )


# ------------------------------------------------------------------------------ a launch across (emulated) hosts


# Claimed for as long as this process runs: the hosts it emulates bind them when their launches start.
_CLAIMED_BLOCKS: list[PortBlock] = []


def free_port_block(address: str, count: int) -> int:
    """The first port of ``count`` consecutive ports free on ``address`` (for a hosts file's ``port:``), below the
    ephemeral range and claimed from every other launch on this machine (launch/ports.py)."""
    block = claim_port_block(address, count)
    _CLAIMED_BLOCKS.append(block)
    return block.first


@dataclass
class HostLaunch:
    """One host's ``heterps launch --hosts``: its process and its console file."""

    address: str
    proc: subprocess.Popen[bytes]
    console_path: str
    log_dir: str
    started: float
    created: float | None  # the launch process's start (psutil): its pid is its own only while it is
    ended: float | None = None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def console(self) -> str:
        with open(self.console_path, errors="replace") as f:
            return f.read()

    def logs(self) -> dict[str, str]:
        return Launched(self.returncode or 0, 0.0, "", self.log_dir).logs()

    def events(self, *kinds: str, **fields: Any) -> list[dict[str, Any]]:
        """This host's event log's records of its newest launch (launch/event_log.py), of ``kinds`` (all: none
        given) whose ``fields`` are as given."""
        records = event_log.this_launch(event_log.read(self.log_dir))
        return [
            r for r in records if (not kinds or r["type"] in kinds) and all(r.get(k) == v for k, v in fields.items())
        ]


class HostsRun:
    """``heterps launch --hosts HOSTS --plan PLAN --host ADDR ...`` for each of ``addresses``, at once, each host
    in its own session, as if each were a machine: the tests' and ``heterps bench hosts``'s emulated hosts.
    ``prefix`` gives a host's command a prefix (``ip netns exec NS``: a host in a network namespace).

    ``own_dirs``: each host works in a directory of its own, ``WORK/host_ADDR``, holding its copy of the files
    (the hosts file, the job's key, the plan, and ``files``), made when the host first starts and kept when it
    starts again, and runs the command ``heterps launch-args`` prints, with those names, relative to it (as a user
    runs the job on machines that share no storage).  Otherwise every host runs in ``work_dir``, with the paths
    given."""

    def __init__(
        self,
        hosts_path: str,
        plan_path: str,
        script_argv: list[str],
        work_dir: str,
        launch_options: tuple[str, ...] = ("--devices", "cpu"),
        env: dict[str, str] | None = None,
        timeout: float = 600.0,
        prefix: dict[str, list[str]] | None = None,
        own_dirs: bool = False,
        files: tuple[str, ...] = (),
    ):
        self.hosts_path, self.plan_path = hosts_path, plan_path
        self.script_argv = script_argv
        self.work_dir = work_dir
        self.launch_options = launch_options
        self.env = env
        self.timeout = timeout
        self.prefix = prefix or {}
        self.own_dirs = own_dirs
        self.files = files
        self.hosts: dict[str, HostLaunch] = {}
        # the job's key, as `heterps launch-args --hosts` makes it for a user: every host proves it
        self.key_path = job_key_path(hosts_path)
        control.make_key(self.key_path)

    def host_dir(self, address: str) -> str:
        """Where ``address``'s launch runs (its working directory)."""
        return os.path.join(self.work_dir, f"host_{address}") if self.own_dirs else self.work_dir

    def host_files(self, address: str) -> list[str]:
        """The files ``address`` was given, as paths in its directory (own_dirs) or as given."""
        given = [self.hosts_path, self.key_path, self.plan_path, *self.files]
        if not self.own_dirs:
            return given
        return [os.path.join(self.host_dir(address), os.path.basename(path)) for path in given]

    def _copy_files(self, address: str) -> None:
        folder = self.host_dir(address)
        if os.path.isdir(folder):
            return  # started again: the same files, in the same directory
        os.makedirs(folder)
        for source, copy in zip(
            [self.hosts_path, self.key_path, self.plan_path, *self.files], self.host_files(address)
        ):
            shutil.copy2(source, copy)

    def start(
        self,
        address: str,
        plan_path: str | None = None,
        script_argv: list[str] | None = None,
        options: tuple[str, ...] = (),
    ) -> HostLaunch:
        """``options``: this host's own launch options besides the run's (``--join ...``: a machine from outside
        the hosts file)."""
        if self.own_dirs:
            self._copy_files(address)
            if plan_path is not None and not os.path.exists(
                os.path.join(self.host_dir(address), os.path.basename(plan_path))
            ):
                shutil.copy2(plan_path, self.host_dir(address))
            hosts, plan = os.path.basename(self.hosts_path), os.path.basename(plan_path or self.plan_path)
            log_dir, given_log_dir = os.path.join(self.host_dir(address), "log"), "log"
        else:
            hosts, plan = self.hosts_path, plan_path or self.plan_path
            log_dir = given_log_dir = os.path.join(self.work_dir, f"log_{address}")
        os.makedirs(log_dir, exist_ok=True)
        hosts_args = ["--hosts", hosts, "--plan", plan, "--host", address, *options]
        cmd = [
            *self.prefix.get(address, []),
            *launch_command(
                self.timeout, [*hosts_args, *self.launch_options], given_log_dir, script_argv or self.script_argv
            ),
        ]
        # a host started again (it was lost and comes back) keeps its first launch's console
        starts = 1 + sum(1 for name in os.listdir(self.work_dir) if name.startswith(f"console_{address}."))
        suffix = "" if starts == 1 else f".{starts}"
        console_path = os.path.join(self.work_dir, f"console_{address}{suffix}.txt")
        with open(console_path, "w") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.host_dir(address),
                start_new_session=True,
            )
        self.hosts[address] = HostLaunch(address, proc, console_path, log_dir, time.monotonic(), created_at(proc.pid))
        return self.hosts[address]

    def kill(self, address: str) -> None:
        """The host dies: its launch and everything it started, SIGKILL, no chance to say anything."""
        host = self.hosts[address]
        _kill_descendants_and_group(host.proc.pid, host.created)
        try:
            host.proc.kill()
        except ProcessLookupError:
            pass

    def wait(self, timeout: float | None = None) -> dict[str, int | None]:
        """Every host's exit status (None: still running after ``timeout``; then ``stop`` it)."""
        deadline = time.monotonic() + (self.timeout + OUTER_GRACE_S if timeout is None else timeout)
        while time.monotonic() < deadline and any(h.proc.poll() is None for h in self.hosts.values()):
            for h in self.hosts.values():
                if h.ended is None and h.proc.poll() is not None:
                    h.ended = time.monotonic()
            time.sleep(0.2)
        for h in self.hosts.values():
            if h.ended is None and h.proc.poll() is not None:
                h.ended = time.monotonic()
        return {a: h.proc.poll() for a, h in self.hosts.items()}

    def stop(self) -> None:
        """Whatever is still running of any host, killed (a test's cleanup)."""
        for address in self.hosts:
            self.kill(address)
        for h in self.hosts.values():
            h.proc.wait()

    def leftovers(self) -> list[str]:
        """Processes still running whose command line names this run's directory."""
        found = []
        for proc in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.info["pid"] == os.getpid():
                    continue
                line = " ".join(proc.info["cmdline"] or [])
            except psutil.Error:
                continue
            if self.work_dir in line:
                found.append(f"pid {proc.info['pid']}: {line[:200]}")
        return found

    def trainers(self, address: str) -> list[psutil.Process]:
        """The CPU trainer processes ``address``'s launch started: its descendants whose role is TRAINER, not
        counting their own children (a dataset's pipe command, ``cat``, inherits the trainer's environment)."""
        try:
            children = psutil.Process(self.hosts[address].proc.pid).children(recursive=True)
        except (KeyError, psutil.Error):
            return []
        trainers = {}
        for proc in children:
            try:
                if proc.environ().get("TRAINING_ROLE") == "TRAINER":
                    trainers[proc.pid] = proc
            except psutil.Error:
                continue
        found = []
        for proc in trainers.values():
            try:
                if proc.ppid() not in trainers:
                    found.append(proc)
            except psutil.Error:
                continue
        return found


class Slowing:
    """A slowed or noisy host (a throttled VM, a busy neighbour) where the emulated hosts share one machine's CPUs:
    every CPU trainer of ``hosts`` stopped (SIGSTOP, then SIGCONT) for ``share()`` of each second, in a thread of its
    own, from :meth:`start` until :meth:`stop`.  ``stops``: how many trainers were stopped, each second."""

    def __init__(self, run: HostsRun, hosts: Sequence[str], share: Callable[[], float]):
        self.run, self.hosts, self.share = run, tuple(hosts), share
        self.stops: list[int] = []
        self.started_at: float | None = None  # unix seconds, as the event log's records
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="heterps-slowing", daemon=True)

    def start(self) -> Slowing:
        self.started_at = time.time()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stopped, every trainer it stopped let go on (SIGCONT) before it returns."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._done.is_set():
            stopped = [p for address in self.hosts for p in self.run.trainers(address)]
            self.stops.append(len(stopped))
            share = min(1.0, max(0.0, self.share()))
            try:
                for proc in stopped:
                    with contextlib.suppress(psutil.Error):
                        proc.send_signal(signal.SIGSTOP)
                time.sleep(share)
            finally:
                for proc in stopped:
                    with contextlib.suppress(psutil.Error):
                        proc.send_signal(signal.SIGCONT)
            self._done.wait(1.0 - share)
