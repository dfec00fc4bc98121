"""Seconds per sample of a program in the C++ trainer loop of ``train_from_dataset``, measured in a process of
its own.

Why not in the job's process: Paddle 2.6.2's dataset trainers share one process-wide thread pool
(``GetThreadPool`` in ``multi_trainer.cc`` / ``dist_multi_trainer.cc``) sized by the *first* trainer the process
builds.  A calibration pass of one thread, run inside ``minimize``, fixed that pool at one thread, and the
script's own ``train_from_dataset`` with a dataset of 8 files and 16 threads then aborted its trainer:
``dist_multi_trainer.cc:115] Check failed: static_cast<int>(pool.size()) == thread_num_ (1 vs. 8)``.  Planning
inside a job must leave the job's own Paddle state alone, so the trainer loop runs here, in a child process,
on the serialised program.

    python -m heterps_paddle.program.trainer_loop DIR      # the child: reads DIR/job.json, writes DIR/result.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np

from heterps_paddle.errors import HeterPSError
from heterps_paddle.planning.launch import env_outside_the_launch

CHILD_TIMEOUT_S = 300.0


class TrainerLoopFailed(HeterPSError):
    """The calibration child did not produce a measurement."""


def _multislot_line(values_by_var: list[Any], row: int) -> str:
    parts = []
    for values in values_by_var:
        row_values = values[row].reshape(-1)
        parts.append(str(row_values.size))
        parts.append(" ".join(map(str, row_values.tolist())))
    return " ".join(parts)


def seconds_per_sample(
    main: Any, startup: Any, feed: dict[str, Any], batch_size: int, batches: int = 24, timeout: float = CHILD_TIMEOUT_S
) -> float:
    """Seconds per sample of ``main`` run by ``train_from_dataset`` (one thread) over ``batches`` batches made by
    repeating the profiling feed: what one trainer unit does per sample.  Runs in a child process (module doc)."""
    feed_vars = [var for var in main.global_block().vars.values() if getattr(var, "is_data", False)]
    values = [np.array(feed[var.name]) for var in feed_vars]
    with tempfile.TemporaryDirectory(prefix="heterps-calibrate-") as tmp:
        with open(os.path.join(tmp, "data"), "w", encoding="utf-8") as f:
            lines = "\n".join(_multislot_line(values, row) for row in range(batch_size)) + "\n"
            for _ in range(batches):
                f.write(lines)
        with open(os.path.join(tmp, "main.pb"), "wb") as f:
            f.write(main.desc.serialize_to_string())
        with open(os.path.join(tmp, "startup.pb"), "wb") as f:
            f.write(startup.desc.serialize_to_string())
        with open(os.path.join(tmp, "job.json"), "w", encoding="utf-8") as f:
            json.dump({"feeds": [var.name for var in feed_vars], "batch_size": batch_size}, f)
        command = [sys.executable, "-m", __name__, tmp]
        try:
            done = subprocess.run(
                command,
                env=env_outside_the_launch(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise TrainerLoopFailed(
                f"calibrating the profile: the trainer-loop run ({' '.join(command)}) took more than {timeout:.0f} s"
            ) from None
        try:
            with open(os.path.join(tmp, "result.json"), encoding="utf-8") as f:
                result = json.load(f)
        except (OSError, ValueError):
            tail = done.stdout.decode("utf-8", "replace").strip().splitlines()[-8:]
            raise TrainerLoopFailed(
                f"calibrating the profile: the trainer-loop run exited {done.returncode} without a result; "
                f"its output ends: {' | '.join(tail) or '(nothing)'}"
            ) from None
    return float(result["elapsed"]) / (batches * batch_size)


def _child(work: str) -> None:
    import time

    import paddle  # the child is the only place this module uses Paddle

    paddle.enable_static()
    with open(os.path.join(work, "job.json"), encoding="utf-8") as f:
        job = json.load(f)
    with open(os.path.join(work, "main.pb"), "rb") as f:
        main = paddle.static.Program.parse_from_string(f.read())
    with open(os.path.join(work, "startup.pb"), "rb") as f:
        startup = paddle.static.Program.parse_from_string(f.read())
    feed_vars = [main.global_block().var(name) for name in job["feeds"]]
    dataset = paddle.distributed.QueueDataset()
    dataset.init(batch_size=job["batch_size"], thread_num=1, pipe_command="cat", use_var=feed_vars)
    dataset.set_filelist([os.path.join(work, "data")])
    executor = paddle.static.Executor(paddle.CPUPlace())
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        executor.run(startup)
        executor.train_from_dataset(main, dataset, scope=scope, print_period=10**9)  # warm-up pass
        started = time.perf_counter()
        executor.train_from_dataset(main, dataset, scope=scope, print_period=10**9)
        elapsed = time.perf_counter() - started
    with open(os.path.join(work, "result.json"), "w", encoding="utf-8") as f:
        json.dump({"elapsed": elapsed}, f)


if __name__ == "__main__":
    _child(sys.argv[1])
