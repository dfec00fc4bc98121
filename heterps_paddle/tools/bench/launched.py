"""What the benchmarks that launch jobs on loopback hosts share (``heterps bench adapt``, ``data``, ``elastic``): a
work directory that outlives a failure, and one job of ``bench_job.py`` on its hosts, run to its end with a host
slowed where asked.  No Paddle import here: the jobs run it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from heterps_paddle.errors import HeterPSError

# a host slowed (a throttled VM, a busy neighbour): its trainers stopped for this share of every second
SLOWED_SHARE = 0.9


@dataclass
class Work:
    """A benchmark's work directory; ``kept``: left in place at the end (``--keep``, or the run failed)."""

    path: str
    kept: bool


@contextlib.contextmanager
def work_dir(bench: str, keep: bool) -> Iterator[Work]:
    """``heterps bench BENCH``'s work directory for the ``with`` block.  SIGTERM exits through the block, so every
    job's own ``finally`` stops its processes; a failure keeps the directory and says where it is."""
    work = Work(tempfile.mkdtemp(prefix=f"heterps-bench-{bench}-"), keep)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        yield work
    except BaseException:
        work.kept = True
        print(f"bench {bench}: failed; its work directory is kept: {work.path}", file=sys.stderr, flush=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not work.kept:
            shutil.rmtree(work.path, ignore_errors=True)


def convert_data(data_dir: str, cache: str) -> None:
    """The passes' files under ``data_dir`` converted to MultiSlot into the jobs' cache ``cache`` before any
    measured job.  Left to the jobs, the first converts them inside its measured span: each trainer its share as its
    pass starts, the hosts starting apart (10 s on this machine) and pass 2 waiting 15 s for its files, so the first
    job ran at half the rate of the same job run second (the cold cache, not the job, measured)."""
    code = "import sys; from heterps_paddle.tools.bench.bench_job import convert_passes; convert_passes(sys.argv[1])"
    env = {**os.environ, "HETERPS_CACHE": cache}
    done = subprocess.run([sys.executable, "-c", code, data_dir], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise HeterPSError(f"bench: converting {data_dir} to MultiSlot failed:\n{done.stderr[-3000:]}")


@dataclass(frozen=True)
class HostsJob:
    """One benchmark job across loopback hosts: ``hosts`` its hosts file's (address, type) in order, the first
    running the servers; ``stages`` its plan; ``argv`` the fleet script and its arguments; ``options`` and ``env``
    each host's ``heterps launch``'s."""

    bench: str
    name: str
    here: str  # the job's directory, made here
    hosts: tuple[tuple[str, str], ...]
    stages: Sequence[Mapping[str, Any]]
    argv: list[str]
    options: tuple[str, ...]
    env: Mapping[str, str]
    timeout: float
    slowed: tuple[str, ...] = ()  # hosts slowed from the job's first measured window on (or from slow_from())
    slow_from: Callable[[], bool] | None = None  # the slowing starts once this says so (None: first measured window)


@dataclass
class Ran:
    """A job that ended 0 on every host: its coordinator's records, and when its slowing started (unix seconds)."""

    run: Any  # tools.jobs.HostsRun
    records: list[dict[str, Any]]
    slowed_at: float | None


def run_hosts_job(job: HostsJob, tick: Callable[[Any], None] = lambda run: None) -> Ran:
    """``job`` to its end, every host started at once; ``tick(run)`` twice a second while it runs (a benchmark that
    starts a machine on the job's ask).  Raises, with each host's console's tail, if a host ended non-zero or
    something was left running."""
    from heterps_paddle.launch import event_log
    from heterps_paddle.tools.jobs import OUTER_GRACE_S, HostsRun, Slowing, free_port_block

    os.makedirs(job.here)
    hosts_path, plan_path = os.path.join(job.here, "hosts.yaml"), os.path.join(job.here, "plan.json")
    with open(hosts_path, "w", encoding="utf-8") as f:
        f.write("format: 1\nhosts:\n")
        for address, kind in job.hosts:
            f.write(f"  - {{address: {address}, type: {kind}, port: {free_port_block(address, 8)}}}\n")
    with open(plan_path, "w", encoding="utf-8") as f:
        json.dump({"format": 1, "feasible": True, "stages": list(job.stages)}, f)
    coordinator = job.hosts[0][0]
    run = HostsRun(hosts_path, plan_path, job.argv, job.here, job.options, dict(job.env), job.timeout)
    slowing = Slowing(run, job.slowed, lambda: SLOWED_SHARE)
    deadline = time.monotonic() + job.timeout + OUTER_GRACE_S
    try:
        for address, _ in job.hosts:
            run.start(address)
        while True:
            codes = run.wait(timeout=0.5)
            if all(code is not None for code in codes.values()) or time.monotonic() > deadline:
                break
            if job.slowed and slowing.started_at is None:
                due = job.slow_from() if job.slow_from is not None else None
                if due is None:
                    due = any(r["samples_per_s"] for r in run.hosts[coordinator].events("rates"))
                if due:
                    slowing.start()
            tick(run)
    finally:
        slowing.stop()
        run.stop()
    left = run.leftovers()
    if any(code != 0 for code in codes.values()) or left:
        tails = "".join(f"\n--- host {a} console\n{h.console()[-2500:]}" for a, h in run.hosts.items())
        raise HeterPSError(
            f"bench {job.bench}: the {job.name} job: exit {codes}, left running {left} (work dir {job.here}){tails}"
        )
    records = event_log.this_launch(event_log.read(run.hosts[coordinator].log_dir))
    return Ran(run, records, slowing.started_at)
