"""``heterps bench elastic``: what losing, and giving back, a host costs a job, and what its checkpoints cost it
(issue 34, item 4).  Three hosts on loopback addresses (127.0.0.2: the server and a CPU trainer, .3: a CPU trainer,
.4: the heterogeneous stage), each its own ``heterps launch --hosts ... --restarts 1 --checkpoint-dir D
--checkpoint-every 1`` (tools/jobs.py: HostsRun), the automatic path on a what-if cluster (the plan is the split
whatever the load, and a lost host is re-planned).  The job runs this module as its script (``train`` below):
pass 1 reads a large generated set (``--rows``), which fills the sparse table; each later pass a fresh small one
(``--pass-rows``), so that it touches a small share of the table's rows (``touched_share``, counted in the data).

- **steady** (undisturbed): per checkpoint its bytes (its directory), kind, seconds (the save: the barrier's
  decision to trainer 0's ``saved`` mark; the wait at the barrier apart) and the training before it; the overhead.
- **recovery**: the heterogeneous host's launch and processes SIGKILLed once checkpoint 1 is complete; the kill to
  the new round's first batch in phases (``split_recovery``).
- **leave**: SIGTERM to that host's launch (a leave on notice) to the other hosts' first batch of the next round;
  ``null`` with the reason while the launch has no leave (``leave_support``).

The job's life (a failure settling, a new round decided and started, a leave asked) is read from the coordinator's
event log, whose records carry their time; the processes' log lines carry no clock: each is stamped when this
harness reads it (``Tail``, every ``POLL_S``); the barrier's files and the checkpoints by their mtimes.  Every host's session is killed on any exit; a phase that
does not happen within ``--timeout`` fails the benchmark, naming it.  No Paddle import at module level.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, NamedTuple, Sequence, Tuple

from heterps_paddle.errors import HeterPSError
from heterps_paddle.files import new_lines
from heterps_paddle.launch import event_log
from heterps_paddle.runtime.checkpoint_choice import Progress
from heterps_paddle.runtime.checkpoint_files import dir_bytes
from heterps_paddle.tools.bench import bench_job
from heterps_paddle.tools.bench.launched import work_dir

A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"
HOSTS = (A, B, C)
# What-if types (tests/conftest.py: split_cluster): the fc layers slow on cpu_small and fast on gpu_fast, whose
# memory cannot hold the embedding table, so the plan splits whatever the load, and re-plans on the CPU hosts alone.
CLUSTER = (
    "format: 1\nresource_types:\n"
    "  - {name: cpu_small, kind: cpu, price_per_hour: 1.0, max_units: 2, flops: 1.0e+8, mem_bw: 1.0e+10,\n"
    "     memory: 1.0e+10, net_bw: 1.0e+9}\n"
    "  - {name: gpu_fast, kind: gpu, price_per_hour: 2.0, max_units: 1, flops: 1.0e+13, mem_bw: 1.0e+11,\n"
    "     memory: 1.0e+8, net_bw: 1.0e+9}\n"
)
FIRST_STAGES = [
    {"resource": "cpu_small", "kind": "cpu", "layers": ["embedding_0"], "units": 2},
    {"resource": "gpu_fast", "kind": "gpu", "layers": ["fc_0", "fc_1", "fc_2"], "units": 1},
]
POLL_S = 0.05
RECOVERY_GOAL_S = 30.0
INCREMENTAL_GOAL = 0.1  # an incremental checkpoint's bytes over a full one's
OVERHEAD_GOAL = 0.01  # checkpoint seconds over job seconds
PHASES = ("detection", "settling", "replanning", "restart", "restore")

# the job's life, from the coordinator's event log (launch/event_log.py): record type, and what else must hold
Record = Tuple[str, Dict[str, Any]]  # a record type and the fields it must have
DETECTED: Record = ("settling", {})
DECIDED: Record = ("round_planned", {"kind": "restart"})
LEFT: Record = ("round_planned", {"kind": "leave"})
LEAVE_ASKED: Record = ("leave_asked", {})
STARTS: Record = ("round_started", {})
BATCH = re.compile(r"\bbatch: \[\d+\]")
RESUMING = re.compile(r"init_server: resuming from the launch's checkpoint")
RESTORED = re.compile(r"init_server\(.*\): \d+ dense tables restored")
COMPLETE = re.compile(
    r"checkpoint (\S+): complete \((\d+) passes done;(?: kind=(\w+) bytes=(\d+) seconds=([0-9.eE+-]+))?"
)
PASS_START = re.compile(r"elastic-bench: pass (\d+) starts at ([0-9.]+)")


class PhaseMissing(HeterPSError):
    """A phase of the benchmark did not happen within its bound (the message names it)."""


@dataclass
class Tail:
    """Files followed as they grow: every whole line stamped with ``clock()`` when it was read."""

    clock: Callable[[], float] = time.monotonic
    offsets: dict[str, int] = field(default_factory=dict)
    lines: dict[str, list[tuple[float, str]]] = field(default_factory=dict)

    def poll(self, paths: Iterable[str]) -> None:
        for path in paths:
            self.offsets[path], lines = new_lines(path, self.offsets.get(path, 0))
            if lines:
                now = self.clock()
                self.lines.setdefault(path, []).extend((now, line) for line in lines)

    def first(self, path: str, pattern: re.Pattern[str], after: float = float("-inf")) -> float | None:
        """When the first line of ``path`` matching ``pattern`` read after ``after`` was read (None: none yet)."""
        return next((t for t, line in self.lines.get(path, []) if t >= after and pattern.search(line)), None)

    def matches(self, path: str, pattern: re.Pattern[str]) -> list[re.Match[str]]:
        return [m for _, line in self.lines.get(path, []) for m in [pattern.search(line)] if m]


def first_event(records: Iterable[dict[str, Any]], which: Record, after: float, wall: float) -> float | None:
    """When the first of ``records`` (an event log's) of type ``which[0]``, with ``which[1]``'s fields, happened at
    or after ``after`` on a clock ``wall`` seconds behind the log's (None: none)."""
    kind, fields = which
    for record in records:
        at = float(record["t"]) - wall
        if record["type"] == kind and at >= after and all(record.get(k) == v for k, v in fields.items()):
            return at
    return None


# ------------------------------------------------------------------------------------------ the phases (pure)


RECOVERY_MARKS = ("kill", "detected", "decided", "resuming", "first_batch")
LEAVE_MARKS = ("notice", "saved", "decided", "resuming", "first_batch")
LEAVE_PHASES = ("checkpoint", "replanning", "restart", "restore")


def _marks(marks: dict[str, float | None], what: str, names: Sequence[str]) -> list[float]:
    """The marks ``names`` in order; PhaseMissing naming the first one missing."""
    missing = [n for n in names if marks.get(n) is None]
    if missing:
        raise PhaseMissing(f"bench elastic: {what}: no {missing[0].replace('_', ' ')} mark")
    return [float(marks[n] or 0.0) for n in names]


def split_recovery(marks: dict[str, float | None], settle_s: float) -> dict[str, Any]:
    """The recovery's phases from its marks (seconds, one clock): ``kill``, ``detected`` (the coordinator's ``the
    job will start again``), ``decided`` (``restart 1 (...)``), ``resuming`` (the new round's server's ``init_server:
    resuming from the launch's checkpoint``: the hosts joined, their processes started and built the model),
    ``first_batch``.  The re-plan is asked ``settle_s`` after the detection (the state machine's rule: no line says
    so), or at the decision if sooner.  Other marks (``joined``, ``restored``) are reported after the kill."""
    kill, detected, decided, resuming, first = _marks(marks, "recovery", RECOVERY_MARKS)
    bounds = [kill, detected, min(detected + settle_s, decided), decided, resuming, first]
    return {
        "phases_s": {name: round(bounds[i + 1] - bounds[i], 3) for i, name in enumerate(PHASES)},
        "total_s": round(first - kill, 3),
        "goal_s": RECOVERY_GOAL_S,
        "within_goal": first - kill <= RECOVERY_GOAL_S,
        "marks_after_kill_s": {k: round(v - kill, 3) for k, v in marks.items() if v and k != "kill"},
        "settling_estimated": f"the re-plan asked taken as SETTLE_S ({settle_s:g} s) after the detection",
    }


def split_leave(marks: dict[str, float | None]) -> dict[str, Any]:
    """A leave's phases: the notice to the checkpoint after it (``saved``), to the new round decided (``decided``:
    the coordinator's ``going on without the host(s) that left``), to ``resuming`` and ``first_batch`` as for a
    recovery (``split_recovery``)."""
    bounds = _marks(marks, "leave", LEAVE_MARKS)
    return {
        "phases_s": {name: round(bounds[i + 1] - bounds[i], 3) for i, name in enumerate(LEAVE_PHASES)},
        "total_s": round(bounds[-1] - bounds[0], 3),
        "marks_after_notice_s": {k: round(v - bounds[0], 3) for k, v in marks.items() if v and k != "notice"},
    }


class Barrier(NamedTuple):  # one checkpoint's barrier marks (mtimes, wall clock)
    arrived: float  # trainer 0's arrival
    decision: float  # every trainer arrived: save (or not)
    captured: float  # the pause's end: the servers wrote the tables, the trainers train again (the rest persists
    # in the background: the manifest's persist_s)


def barrier_marks(files: dict[str, float]) -> dict[int, Barrier]:
    """Per checkpoint (passes done), from the mtimes of ``DIR/.sync/<launch id>/pass-NNNNNN.{arrived.0,decision,
    captured}`` (name -> mtime: trainer 0 removes a pass's files after the next pass, so ``Job`` records them)."""
    marks: dict[int, dict[str, float]] = {}
    for name, mtime in files.items():
        found = re.fullmatch(r"pass-(\d+)\.(arrived\.0|decision|captured)", name)
        if found:
            marks.setdefault(int(found.group(1)), {})[found.group(2)] = mtime
    return {
        k: Barrier(v["arrived.0"], v["decision"], v["captured"])
        for k, v in marks.items()
        if {"arrived.0", "decision", "captured"} <= set(v)
    }


def checkpoint_rows(
    barriers: dict[int, Barrier],
    pass_starts: dict[int, float],
    sizes: dict[float, int],
    logged: dict[int, dict[str, Any]],
    manifests: dict[int, dict[str, Any]],
) -> list[dict[str, Any]]:
    """One row per checkpoint: bytes, kind, seconds (the barrier's decision to the pause's end, when the trainers
    train again), the wait at the barrier (trainer 0's arrival to the decision) and the training before it (trainer
    0's pass: its start to its arrival); the launch's own figures too (its log line, its manifest) once it gives
    them."""
    rows = []
    for passes, mark in sorted(barriers.items()):
        launch, line, start = (
            manifests.get(passes, {}).get("launch", {}),
            logged.get(passes, {}),
            pass_starts.get(passes),
        )
        rows.append(
            {
                "passes_done": passes,
                "kind": line.get("kind") or launch.get("kind") or "full",
                "bytes": sizes.get(passes),
                "seconds": round(mark.captured - mark.decision, 3),
                "barrier_seconds": round(mark.decision - mark.arrived, 3),
                "train_seconds_before": None if start is None else round(mark.arrived - start, 3),
                "bytes_logged": line.get("bytes", launch.get("bytes")),
                "seconds_logged": line.get("seconds", launch.get("save_s")),
                "pause_seconds_logged": line.get("pause", launch.get("pause_s")),
                "persist_seconds_logged": line.get("persist", launch.get("persist_s")),
                "persist_steps_seconds": launch.get("steps_s"),  # regroup, compress, hash, manifest, copy
            }
        )
    return rows


def checkpoint_summary(rows: list[dict[str, Any]], job_s: float, incremental_setting: bool) -> dict[str, Any]:
    """Full against incremental checkpoints (bytes, seconds), and the overhead: the checkpoints' seconds over the
    job's, and for each kind as if every checkpoint were of it (its seconds over them and the mean training)."""
    train = [r["train_seconds_before"] for r in rows if r["train_seconds_before"] is not None]
    between = sum(train) / len(train) if train else None
    kinds: dict[str, Any] = {}
    for kind in ("full", "incremental"):
        mine = [r for r in rows if r["kind"] == kind]
        sized = [r["bytes"] for r in mine if r["bytes"] is not None]
        seconds = sum(r["seconds"] for r in mine) / max(len(mine), 1)
        kinds[kind] = {"count": len(mine), "bytes": round(sum(sized) / len(sized)) if sized else None}
        kinds[kind]["seconds"] = round(seconds, 3)
        kinds[kind]["overhead_if_every"] = None if between is None else round(seconds / (between + seconds), 4)
        kinds[kind] = kinds[kind] if mine else None
    full, incremental = kinds["full"], kinds["incremental"]
    why = None
    if incremental is not None:
        ratio = incremental["bytes"] / full["bytes"] if full and full["bytes"] and incremental["bytes"] else None
        incremental["bytes_over_full"] = None if ratio is None else round(ratio, 4)
        incremental["within_goal"] = None if ratio is None else ratio <= INCREMENTAL_GOAL
    elif incremental_setting:
        why = "the launch wrote no incremental checkpoint in this run (every one full: HETERPS_CHECKPOINT_BASE_EVERY)"
    else:
        why = "the launch has no incremental checkpoints yet (no HETERPS_CHECKPOINT_BASE_EVERY setting)"
    spent = sum(r["seconds"] for r in rows)
    overhead = spent / job_s if job_s > 0 else None
    return {
        "full": full,
        "incremental": incremental,
        "incremental_missing": why,
        "incremental_goal": INCREMENTAL_GOAL,
        "checkpoint_seconds": round(spent, 3),
        "barrier_seconds": round(sum(r["barrier_seconds"] for r in rows), 3),
        "train_seconds_between_mean": None if between is None else round(between, 3),
        "job_seconds": round(job_s, 3),
        "overhead": None if overhead is None else round(overhead, 4),
        "overhead_goal": OVERHEAD_GOAL,
        "overhead_within_goal": None if overhead is None else overhead <= OVERHEAD_GOAL,
    }


def logged_checkpoints(lines: Iterable[str]) -> dict[int, dict[str, Any]]:
    """Trainer 0's ``checkpoint P: complete (N passes done; kind=K bytes=B seconds=S ...)`` lines, by N."""
    out: dict[int, dict[str, Any]] = {}
    for found in (COMPLETE.search(line) for line in lines):
        if found:
            kind, size, seconds = found.group(3, 4, 5)
            out[int(found.group(2))] = {
                "kind": kind,
                "bytes": size and int(size),
                "seconds": seconds and float(seconds),
            }
    return out


def pass_starts(lines: Iterable[str]) -> dict[int, float]:
    """The trainer's ``elastic-bench: pass K starts at T`` lines (wall clock), by K."""
    return {int(m.group(1)): float(m.group(2)) for line in lines for m in [PASS_START.search(line)] if m}


def touched_shares(passes: Sequence[Sequence[str]]) -> list[float]:
    """Per pass, the share of the table's rows (every id pushed so far) that its data touches."""
    import numpy as np

    seen = np.zeros(0, dtype=np.int64)
    shares = []
    for files in passes:
        ids: list[int] = []
        for path in files:
            with open(path) as f:
                for line in f:
                    ids += [int(t.split(":", 1)[1]) for t in line.split() if not t.startswith(("click", "dense"))]
        mine = np.unique(np.array(ids, dtype=np.int64))
        seen = np.union1d(seen, mine)
        shares.append(round(len(mine) / max(len(seen), 1), 4))
    return shares


def leave_support() -> str | None:
    """None when ``heterps launch`` takes a leave on notice; else why this benchmark cannot measure one."""
    from heterps_paddle.launch import events

    if any("leave" in name.lower() for name in dir(events)):
        return None
    return "heterps launch has no leave on notice yet (no Leave event in heterps_paddle/launch/events.py)"


# ------------------------------------------------------------------------------------------ the jobs


@dataclass
class Setup:
    work: str
    data: str
    cluster: str
    plan: str
    args: argparse.Namespace
    env: dict[str, str]


class Job:
    """One launch of the three hosts, followed: its lines (``Tail``) and its complete checkpoints (when first seen,
    and their bytes, before the launch removes them)."""

    def __init__(self, setup: Setup, name: str):
        from heterps_paddle.tools.jobs import HostsRun, free_port_block

        self.work, self.name = os.path.join(setup.work, name), name
        os.makedirs(self.work)
        self.checkpoints = os.path.join(self.work, "checkpoints")
        hosts = os.path.join(self.work, "hosts.yaml")
        with open(hosts, "w") as f:
            f.write("format: 1\nhosts:\n")
            for address, kind, servers in ((A, "cpu_small", ", servers: 1"), (B, "cpu_small", ""), (C, "gpu_fast", "")):
                f.write(f"  - {{address: {address}, type: {kind}{servers}, port: {free_port_block(address, 8)}}}\n")
        args = setup.args
        argv = [bench_job.__file__, *f"--passes {args.passes} --batch {args.batch}".split()]
        argv += ["--data", setup.data, "--cluster", setup.cluster, "--out", os.path.join(self.work, "out")]
        options = (*"--devices cpu --restarts 1 --checkpoint-every 1".split(), "--checkpoint-dir", self.checkpoints)
        self.run = HostsRun(hosts, setup.plan, argv, self.work, options, env=setup.env, timeout=args.timeout)
        self.tail = Tail()
        self.wall = time.time() - time.monotonic()  # the event log's clock (unix seconds) on this harness's
        self.deadline = time.monotonic() + args.timeout
        self.sizes: dict[float, int] = {}  # passes done (a fraction inside a pass) -> bytes
        self.seen: dict[float, float] = {}  # ... -> when first seen complete
        self.names: dict[float, str] = {}
        self.barrier_files: dict[str, float] = {}  # the barrier's files (one launch: the steady job's) -> mtime
        for address in HOSTS:
            self.run.start(address)

    def log(self, address: str, round_number: int, name: str = "workerlog.0") -> str:
        where = os.path.join(self.work, f"log_{address}")
        return os.path.join(where, f"round{round_number}", name) if round_number else os.path.join(where, name)

    def poll(self) -> None:
        paths = [h.console_path for h in self.run.hosts.values()]
        paths += [self.log(a, n, log) for a in (A, B) for n in range(4) for log in ("workerlog.0", "serverlog.0")]
        for name in os.listdir(self.checkpoints) if os.path.isdir(self.checkpoints) else ():
            at, path = Progress.named(name), os.path.join(self.checkpoints, name)
            passes = at.done if at is not None else 0.0  # a fraction for one inside a pass (HETERPS_CHECKPOINT_SLICES)
            if passes and passes not in self.seen and os.path.isfile(os.path.join(path, "heterps_checkpoint.json")):
                self.seen[passes], self.sizes[passes] = time.monotonic(), dir_bytes(path)
                self.names[passes] = name
        for path in glob.glob(os.path.join(self.checkpoints, ".sync", "*", "pass-*")):
            with contextlib.suppress(OSError):  # removed since
                self.barrier_files.setdefault(os.path.basename(path), os.stat(path).st_mtime)
        self.tail.poll(paths)  # after the checkpoints: a line about a checkpoint is read after it is seen

    def wait(self, what: str, ready: Callable[[], float | None], to_the_end: bool = False) -> float:
        """Poll until ``ready`` gives a time; PhaseMissing naming ``what`` past the bound or when the job ended (or,
        ``to_the_end``, ended badly)."""
        while True:
            self.poll()
            found = ready()
            if found is not None:
                return found
            ended = self.run.hosts[A].proc.poll()
            if (ended is not None and not (to_the_end and ended == 0)) or time.monotonic() > self.deadline:
                why = "in time" if ended is None else f"the coordinator's launch ended first, exit {ended}"
                raise PhaseMissing(f"bench elastic: {self.name}: {what} did not happen ({why}){self.tails()}")
            time.sleep(POLL_S)

    def event(self, which: Record, after: float) -> float | None:
        """When the first record of the coordinator's event log of type ``which[0]`` (with ``which[1]``'s fields)
        happened at or after ``after`` (this harness's clock; None: none yet)."""
        records = event_log.this_launch(event_log.read(os.path.join(self.work, f"log_{A}")))
        return first_event(records, which, after, self.wall)

    def first(self, pattern: re.Pattern[str], after: float, name: str = "workerlog.0") -> float | None:
        """The first line of a new round's logs of the CPU hosts matching ``pattern``, read after ``after``."""
        seen = [self.tail.first(self.log(a, n, name), pattern, after) for a in (A, B) for n in range(1, 4)]
        return min((t for t in seen if t is not None), default=None)

    def tails(self) -> str:
        from heterps_paddle.tools.jobs import log_tails

        consoles = "".join(f"\n--- host {a} console\n{h.console()[-2500:]}" for a, h in self.run.hosts.items())
        return f"\n(work dir {self.work}){consoles}\n{log_tails(os.path.join(self.work, f'log_{A}'), 8)}"

    def stop(self) -> list[str]:
        self.run.stop()
        return self.run.leftovers()


def _json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        found: dict[str, Any] = json.load(f)
    return found


def steady(setup: Setup) -> dict[str, Any]:
    """The undisturbed job: its checkpoints against its training."""
    from heterps_paddle import settings

    job = Job(setup, "steady")
    try:
        job.wait(
            "the job's end", lambda: None if any(h.proc.poll() is None for h in job.run.hosts.values()) else 1.0, True
        )
        codes = job.run.wait(timeout=0)
        if any(codes.values()):
            raise PhaseMissing(f"bench elastic: steady: the job failed (exit {codes}){job.tails()}")
    finally:
        left = job.stop()
    barriers = barrier_marks(job.barrier_files)
    if len(barriers) != setup.args.passes:
        raise PhaseMissing(f"bench elastic: steady: barrier marks of passes {sorted(barriers)}, not every one")
    worker = {a: [line for _, line in job.tail.lines.get(job.log(a, 0), [])] for a in (A, B)}
    starts, logged = pass_starts(worker[A]), logged_checkpoints(worker[A] + worker[B])
    manifests = {k: _json(os.path.join(job.checkpoints, f"pass-{k:06d}", "heterps_checkpoint.json")) for k in barriers}
    rows = checkpoint_rows(barriers, starts, job.sizes, logged, manifests)
    job_s = barriers[max(barriers)].captured - starts[min(starts)] if starts else 0.0
    summary = checkpoint_summary(rows, job_s, "HETERPS_CHECKPOINT_BASE_EVERY" in settings.SETTINGS)
    return {"checkpoints": rows, **summary, "left_running": left}


def disrupted(setup: Setup, name: str) -> dict[str, Any]:
    """``recovery``: the heterogeneous host's launch and processes SIGKILLed once checkpoint 1 is complete; ``leave``:
    SIGTERM to its launch alone (a leave on notice).  The marks to the other hosts' first batch of the next round."""
    from heterps_paddle.launch.coordinator import SETTLE_S

    job = Job(setup, name)
    try:
        job.wait("checkpoint 1", lambda: job.seen.get(1))
        # the mark before the signal: killing a host's processes one by one takes long on a busy machine, and its
        # peers may notice the first one dead before the last is
        at = time.monotonic()
        job.run.hosts[C].proc.send_signal(signal.SIGTERM) if name == "leave" else job.run.kill(C)
        marks: dict[str, float | None] = {"kill" if name == "recovery" else "notice": at}
        saved_from = None  # a leave: the checkpoint it went from
        if name == "recovery":
            marks["detected"] = job.wait("the loss's detection", lambda: job.event(DETECTED, at))
        else:
            newer = lambda: min((t for k, t in job.seen.items() if k > 1), default=None)  # noqa: E731
            marks["saved"] = job.wait("the checkpoint after the notice", newer)
            saved_from = job.names[min(k for k in job.seen if k > 1)]
        decided = DECIDED if name == "recovery" else LEFT
        marks["decided"] = job.wait("the new round's decision", lambda: job.event(decided, at))
        joined = job.wait("the new round's start", lambda: job.event(STARTS, at))
        marks["first_batch"] = job.wait("the new round's first batch", lambda: job.first(BATCH, joined))
        marks.update(joined=joined, resuming=job.first(RESUMING, at, "serverlog.0"))
        marks["restored"] = job.first(RESTORED, at, "serverlog.0")
        marks["asked"] = job.event(LEAVE_ASKED, at) if name == "leave" else None
    finally:
        left = job.stop()
    if name == "recovery":
        result = split_recovery(marks, SETTLE_S)
        first = (_json(os.path.join(job.work, f"log_{A}", "restarts.json")).get("restarts") or [{}])[0]
        result["restart"] = {k: first.get(k) for k in ("kind", "lost", "passes_done", "how", "summary")}
    else:
        # inside the pass running at the notice, between two of its shards (the data plan, runtime/pulled_pass.py)
        result = {**split_leave(marks), "checkpoint": saved_from}
    return {**result, "left_running": left}


# ------------------------------------------------------------------------------------------ the command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=20000, help="rows of pass 1, which fills the table (default 20000)")
    # 450 of 20000: a pass touches about 5% of the table's rows (ids are Zipf-distributed: fewer than rows)
    parser.add_argument("--pass-rows", type=int, default=450, help="rows of each later pass (default 450)")
    parser.add_argument("--passes", type=int, default=3, help="passes, a checkpoint after each (>= 3; default 3)")
    parser.add_argument("--batch", type=int, default=128, help="batch size (default 128)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--phases", nargs="+", choices=("steady", "recovery", "leave"), default=["steady", "recovery", "leave"]
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per job (default 600)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (kept anyway on a failure)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def prepare(args: argparse.Namespace, work: str) -> tuple[Setup, list[float]]:
    """The data (pass 1 large, the later passes small and fresh), the cluster and the first round's placement."""
    from heterps_paddle import settings
    from heterps_paddle.data.generator import generate

    data = os.path.join(work, "data")
    passes = [
        generate(os.path.join(data, f"pass-{k:03d}"), args.pass_rows if k > 1 else args.rows, args.seed + k, 0.01)
        for k in range(1, args.passes + 1)
    ]
    cluster, plan = os.path.join(work, "cluster.yaml"), os.path.join(work, "plan.json")
    with open(cluster, "w") as f:
        f.write(CLUSTER)
    with open(plan, "w") as f:
        json.dump({"format": 1, "feasible": True, "stages": FIRST_STAGES}, f)
    env = {**os.environ, "HETERPS_CACHE": os.path.join(work, "cache")}
    if "HETERPS_CHECKPOINT_BASE_EVERY" in settings.SETTINGS:  # a full checkpoint after pass 1, incremental ones after
        env.setdefault("HETERPS_CHECKPOINT_BASE_EVERY", str(args.passes))
    return Setup(work, data, cluster, plan, args, env), touched_shares([p.train_files for p in passes])


def run(args: argparse.Namespace) -> int:
    if args.passes < 3 or args.rows < 16 or args.pass_rows < 16:
        raise HeterPSError("bench elastic: --passes must be >= 3, --rows and --pass-rows >= 16")
    report: dict[str, Any] = {"benchmark": "elastic", "hosts": list(HOSTS), "rows": args.rows}
    report.update(pass_rows=args.pass_rows, passes=args.passes, batch=args.batch, cpu_count=os.cpu_count())
    with work_dir("elastic", args.keep) as work:
        print("bench elastic: generating the passes' data ...", file=sys.stderr, flush=True)
        setup, report["touched_share"] = prepare(args, work.path)
        report["base_every"] = setup.env.get("HETERPS_CHECKPOINT_BASE_EVERY")
        for phase in ("steady", "recovery", "leave"):
            missing = leave_support() if phase == "leave" else None
            if phase not in args.phases or missing is not None:
                report[phase] = None
                if phase in args.phases:
                    report["leave_missing"] = missing
                continue
            print(f"bench elastic: the {phase} job ...", file=sys.stderr, flush=True)
            report[phase] = steady(setup) if phase == "steady" else disrupted(setup, phase)
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    report["work_dir"] = work.path if work.kept else None
    print(json.dumps(report) if args.json else table(report))
    return 0


def table(report: dict[str, Any]) -> str:
    """The report, readable: one line per figure."""
    out = [f"passes {report['passes']} (pass 1: {report['rows']} rows, then {report['pass_rows']} each), share of "]
    out[0] += f"the table's rows each touches {report.get('touched_share')}"
    steady, recovered, left = report.get("steady"), report.get("recovery"), report.get("leave")
    for r in (steady or {}).get("checkpoints", []):
        out.append(f"checkpoint {r['passes_done']}: {r['kind']} {r['bytes']} bytes {r['seconds']:.2f} s (barrier ")
        out[-1] += f"{r['barrier_seconds']:.2f} s), after {r['train_seconds_before']} s of training"
    if steady:
        out.append(f"full {steady['full']}, incremental {steady['incremental'] or steady['incremental_missing']}")
        out.append(f"overhead {steady['overhead']} of {steady['job_seconds']} s (goal <= {OVERHEAD_GOAL})")
    if recovered:
        out.append("recovery: " + ", ".join(f"{k} {v:.2f} s" for k, v in recovered["phases_s"].items()))
        out[-1] += f"; total {recovered['total_s']:.2f} s (goal <= {RECOVERY_GOAL_S:g} s)"
    if left or report.get("leave_missing"):
        what = (
            f"{left['phases_s']}, total {left['total_s']:.2f} s, from {left['checkpoint']}"
            if left
            else report["leave_missing"]
        )
        out.append(f"leave: {what}")
    return "\n".join(out + [f"base every {report['base_every']}, load average {report['load_average']}"])
