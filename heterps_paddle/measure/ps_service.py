"""What the parameter servers cost per sparse row on this machine: the probe behind the local cluster's
sparse-layer times.

The profile (auto_plan) times the program with its tables local to the process: the lookup, the lazy
Adam update of the touched rows.  In a parameter-server job the same rows are pulled from and pushed to
the servers instead: the trainer serialises ids and rows, the server hashes the keys, copies the rows
and runs the sparse rule, and both sides spend CPU on brpc.  On this machine the servers run on the same
cores as the trainers, so that work takes samples/s away from the job (measured on the example CTR-DNN
before this probe existed: 0.57-0.74 of the predicted samples/s, 1 server + 2 trainers on 2 cores).

The probe runs one small job twice: a one-slot model (``ids_per_sample`` ids summed into one vector, a
one-unit fc, log loss) in one process with a local table, and launched as 1 server + 1 trainer with the
table on the server; both train the same generated rows with ``train_from_dataset``.  The CPU seconds
of every process during training (trainer and server, read with psutil at the trainer's start and end
marks) minus the local run's, per looked-up row, is the parameter server's service cost per row.  It is
cached per machine and Paddle version (measure/cache.py).

    python -m heterps_paddle.measure.ps_service            # measure (or read the cache) and print JSON
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any, cast

import numpy as np
import psutil

# Absolute imports: the launched probe runs this file as a script.
from heterps_paddle.errors import HeterPSError
from heterps_paddle.measure.cache import cached, paddle_version
from heterps_paddle.planning.launch import env_outside_the_launch

PROBE_VERSION = 1  # bump when the probe measures differently: cached figures are then measured again


class ProbeFailed(HeterPSError):
    pass


@dataclass(frozen=True)
class PsServiceCost:
    row_seconds: float  # CPU seconds (all processes) per sparse row pulled and pushed through a server
    local_sample_seconds: float  # CPU seconds per sample of the probe model with a local table
    ps_sample_seconds: float  # the same with the table on a server (trainer + server CPU)
    ids_per_sample: int
    dim: int
    samples: int
    paddle_version: str


def ps_row_cost(refresh: bool = False, **probe_options: Any) -> PsServiceCost:
    """The figure for this machine and Paddle version: measured on first use, then read from the cache."""
    measurement = cached(
        "ps_service",
        {"probe": PROBE_VERSION, **probe_options},
        lambda: asdict(measure(**probe_options)),
        refresh=refresh,
    )
    return PsServiceCost(**measurement.value)


def _write_rows(path: str, samples: int, ids_per_sample: int, vocab: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ids = (rng.zipf(1.1, (samples, ids_per_sample)) - 1) % vocab  # CTR-like skew
    labels = rng.integers(0, 2, samples)
    with open(path, "w", encoding="utf-8") as f:
        for row, label in zip(ids, labels):
            f.write(f"{ids_per_sample} {' '.join(map(str, row.tolist()))} 1 {label}\n")


def _wait_for(path: str, proc: subprocess.Popen[bytes], deadline: float) -> None:
    while not os.path.exists(path):
        if proc.poll() is not None and not os.path.exists(path):
            raise ProbeFailed(f"parameter-server probe: the job ended before writing {os.path.basename(path)}")
        if time.monotonic() > deadline:
            raise ProbeFailed("parameter-server probe: timed out")
        time.sleep(0.005)


def _server_processes(launcher_pid: int) -> list[Any]:
    found = []
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            if child.environ().get("TRAINING_ROLE") == "PSERVER":
                found.append(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _cpu_seconds(processes: list[Any]) -> float:
    total = 0.0
    for proc in processes:
        try:
            times = proc.cpu_times()
        except psutil.Error as exc:
            raise ProbeFailed(f"parameter-server probe: the server process went away ({exc})") from None
        total += times.user + times.system
    return total


def measure(
    samples: int = 60_000, ids_per_sample: int = 26, dim: int = 9, batch_size: int = 512, timeout: float = 180.0
) -> PsServiceCost:
    """Run the probe job locally and launched (1 server + 1 trainer); see the module docstring."""
    work = tempfile.mkdtemp(prefix="heterps-ps-probe-")
    try:
        data = os.path.join(work, "rows.txt")
        _write_rows(data, samples, ids_per_sample, vocab=1_000_000, seed=0)
        job = [
            os.path.abspath(__file__),
            "job",
            "--data",
            data,
            "--ids",
            str(ids_per_sample),
            "--dim",
            str(dim),
            "--batch",
            str(batch_size),
        ]
        env = env_outside_the_launch()
        deadline = time.monotonic() + timeout

        local_out = os.path.join(work, "local")
        os.makedirs(local_out)
        try:
            subprocess.run(
                [sys.executable, *job, "--out", local_out],
                env=env,
                check=False,
                timeout=timeout,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise ProbeFailed(f"parameter-server probe: the local run took more than {timeout:.0f} s") from None
        local = _read_result(local_out)

        ps_out = os.path.join(work, "ps")
        os.makedirs(ps_out)
        launch = [
            sys.executable,
            "-m",
            "paddle.distributed.launch",
            "--server_num=1",
            "--worker_num=1",
            "--log_dir",
            os.path.join(work, "log"),
            *job,
            "--out",
            ps_out,
        ]
        proc = subprocess.Popen(
            launch, env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            _wait_for(os.path.join(ps_out, "start"), proc, deadline)
            servers = _server_processes(proc.pid)
            if not servers:
                raise ProbeFailed("parameter-server probe: no server process found under the launcher")
            server_before = _cpu_seconds(servers)
            _wait_for(os.path.join(ps_out, "end"), proc, deadline)
            server_cpu = _cpu_seconds(servers) - server_before
            launched = _read_result(ps_out)
        except ProbeFailed as exc:
            raise ProbeFailed(f"{exc}; {_log_tail(os.path.join(work, 'log'))}") from None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the server never exits by itself
            except ProcessLookupError:
                pass
            proc.wait()
        rows = launched["samples"] * ids_per_sample
        ps_seconds = launched["cpu_seconds"] + server_cpu
        local_seconds = local["cpu_seconds"] * launched["samples"] / local["samples"]
        return PsServiceCost(
            row_seconds=max(0.0, (ps_seconds - local_seconds) / rows),
            local_sample_seconds=local["cpu_seconds"] / local["samples"],
            ps_sample_seconds=ps_seconds / launched["samples"],
            ids_per_sample=ids_per_sample,
            dim=dim,
            samples=samples,
            paddle_version=paddle_version(),
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _log_tail(log_dir: str, lines: int = 5) -> str:
    """The last lines of the probe's worker log: what the error message shows of a failed launch."""
    path = os.path.join(log_dir, "workerlog.0")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            tail = [line.rstrip() for line in f.readlines()[-lines:]]
    except OSError:
        return "no worker log"
    return "worker log ends: " + " | ".join(tail)


def _read_result(out_dir: str) -> dict[str, Any]:
    path = os.path.join(out_dir, "result.json")
    try:
        with open(path, encoding="utf-8") as f:
            return cast("dict[str, Any]", json.load(f))
    except (OSError, ValueError) as exc:
        raise ProbeFailed(f"parameter-server probe: no result from the job ({exc})") from exc


def _job(args: argparse.Namespace) -> None:
    """One probe run: a local table when not launched, else a server table (fleet, async)."""
    # Imported here: only the probe job (this file run as a script) uses Paddle; the module is also imported to read
    # the cached figure and to launch the probe.
    import paddle

    paddle.enable_static()
    paddle.seed(0)
    distributed = "TRAINING_ROLE" in os.environ
    ids = paddle.static.data("ids", [None, 1], "int64", lod_level=1)
    label = paddle.static.data("label", [None, 1], "int64")
    init = paddle.ParamAttr(initializer=paddle.nn.initializer.Uniform(-0.05, 0.05))
    size = [1_000_000, args.dim]
    if distributed:
        emb = paddle.static.nn.sparse_embedding(input=ids, size=size, param_attr=init)
    else:
        emb = paddle.static.nn.embedding(input=ids, size=size, is_sparse=True, param_attr=init)
    pooled = paddle.static.nn.sequence_lod.sequence_pool(emb, pool_type="sum")
    logit = paddle.static.nn.fc(pooled, 1)
    loss = paddle.mean(paddle.nn.functional.binary_cross_entropy_with_logits(logit, paddle.cast(label, "float32")))
    optimizer = paddle.optimizer.Adam(learning_rate=0.001, lazy_mode=not distributed)
    if distributed:
        import paddle.distributed.fleet as fleet  # here too: only the probe job uses Paddle

        fleet.init()
        strategy = fleet.DistributedStrategy()
        strategy.a_sync = True
        optimizer = fleet.distributed_optimizer(optimizer, strategy)
    optimizer.minimize(loss)
    if distributed and fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return
    # After minimize: fleet switches the default programs to the ones it rewrote for the servers.
    main, startup = paddle.static.default_main_program(), paddle.static.default_startup_program()
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    if distributed:
        fleet.init_worker()
    dataset = paddle.distributed.QueueDataset()
    dataset.init(batch_size=args.batch, thread_num=1, pipe_command="cat", use_var=[ids, label])
    dataset.set_filelist([args.data])
    exe.train_from_dataset(main, dataset, print_period=10**9)  # warm-up pass: threads, allocations, first rows
    open(os.path.join(args.out, "start"), "w").close()
    started_cpu, started = time.process_time(), time.perf_counter()
    exe.train_from_dataset(main, dataset, print_period=10**9)
    cpu, wall = time.process_time() - started_cpu, time.perf_counter() - started
    with open(args.data, encoding="utf-8") as f:
        samples = sum(1 for _ in f)
    with open(os.path.join(args.out, "result.json"), "w", encoding="utf-8") as f:
        json.dump({"cpu_seconds": cpu, "wall_seconds": wall, "samples": samples}, f)
    open(os.path.join(args.out, "end"), "w").close()
    if distributed:
        fleet.stop_worker()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m heterps_paddle.measure.ps_service", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command")
    job = sub.add_parser("job")
    job.add_argument("--data", required=True)
    job.add_argument("--out", required=True)
    job.add_argument("--ids", type=int, required=True)
    job.add_argument("--dim", type=int, required=True)
    job.add_argument("--batch", type=int, required=True)
    parser.add_argument("--no-cache", action="store_true", help="measure even if a cached figure exists")
    args = parser.parse_args(argv)
    if args.command == "job":
        _job(args)
        return 0
    cost = ps_row_cost(refresh=args.no_cache)
    print(json.dumps(asdict(cost)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
