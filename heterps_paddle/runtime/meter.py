"""What each trainer of a job measures of itself, for the launch's gauge (launch/gauge.py; docs/metrics.md).

Every ``HETERPS_METER_S`` seconds (and at the end of each pass) a trainer puts one record on the launch's board
(rendezvous.py), under ``meter.<stage>.<role>.<index>``, replacing its last one:

- ``cpu_s``: the process's CPU seconds so far, and ``cores``: how many cores its training can keep busy (a stage 1
  CPU trainer: its dataset's ``thread_num``; a heterogeneous trainer: 1, its section runs one micro-batch at a
  time), so that the gauge can tell how much of a window the stage worked and how much it waited for its
  neighbours;
- ``samples`` (stage 1 CPU trainers, which read the data): the samples it trained so far, its finished passes'
  and the running pass's.  A finished pass's samples are the lines of the files it read (one sample a line,
  PaddleRec's slot format), counted at its end and cached by file (the next epoch reads the same files), so they
  are exact; the running pass's are counted as it runs by the model's accumulating AUC op (every sample adds one to
  its histograms: in the trainer's own scope on a one-stage plan; on a split plan, this trainer's share of the last
  stage's, stage_metrics.Client), close but not exact where the dataset's threads race on its histograms; a model
  without one shows its pass only at its end.

A trainer reads nothing but its own scope, its own process's CPU time and, on a split plan, the last stage's side
channel it reads anyway; the records are small and few (``tools/bench/e2e.py --meter`` measures what this costs the
training).  ``HETERPS_METER=0`` turns it off.  Failures to put a record are logged once and never the job's.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, cast

import numpy as np
import paddle
import psutil

from heterps_paddle import rendezvous, settings
from heterps_paddle.log import logger
from heterps_paddle.runtime import seam, stage_metrics

VERSION = 1
KEY_PREFIX = rendezvous.METER_PREFIX


def key(stage: int, role: str, index: int) -> str:
    return f"{KEY_PREFIX}{stage}.{role}.{index}"


def count_lines(path: str, cache: dict[tuple[str, int, float], int]) -> int:
    """Lines of ``path`` (a sample each), cached by path, size and modification time."""
    info = os.stat(path)
    found = (os.path.abspath(path), info.st_size, info.st_mtime)
    if found not in cache:
        count = 0
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                count += chunk.count(b"\n")
        if info.st_size and not _ends_with_newline(path):
            count += 1
        cache[found] = count
    return cache[found]


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


@dataclass
class Meter:
    """This process's measurements, put on the board by a thread of its own (module doc)."""

    stage: int
    role: str  # trainer | heter
    index: int
    board: Any
    every_s: float
    cores: int = 1
    samples_done: int = 0  # the finished passes'
    passes: int = 0
    live: Callable[[], int | None] | None = None  # the running pass's samples so far (None: not known live)
    lines: dict[tuple[str, int, float], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    failed: bool = False

    def start(self) -> Meter:
        threading.Thread(target=self._loop, name="heterps-meter", daemon=True).start()
        return self

    def record(self) -> dict[str, Any]:
        with self.lock:
            running = None if self.live is None else self.live()
            samples = None if self.role != "trainer" else self.samples_done + max(0, running or 0)
            passes = self.passes
        return {
            "v": VERSION,
            "stage": self.stage,
            "role": self.role,
            "index": self.index,
            "host": os.environ.get("POD_IP", "127.0.0.1"),
            "pid": os.getpid(),
            "t": round(time.time(), 3),
            "cpu_s": round(sum(psutil.Process().cpu_times()[:2]), 3),
            "cores": self.cores,
            "samples": samples,
            "passes": passes,
        }

    def put(self) -> None:
        try:
            self.board.put(key(self.stage, self.role, self.index), self.record())
        except Exception as exc:  # measuring must never fail the job
            if not self.failed:
                self.failed = True
                logger.warning("measuring: a record could not be put on the launch's board (%s); going on", exc)

    def _loop(self) -> None:
        while not self.stop.wait(self.every_s):
            self.put()

    @contextlib.contextmanager
    def pass_hook(self, call: seam.DatasetCall) -> Iterator[None]:
        """Around a stage 1 CPU trainer's pass: its live count, and its samples at its end.  A pass of a program
        that does not train (an evaluation: no gradient op) is not counted."""
        if not _trains(call.main_program()):
            yield
            return
        live = _live_count(call)
        with self.lock:
            self.cores = max(1, min(os.cpu_count() or 1, _thread_num(call.dataset)))
            self.live = live
        try:
            yield
        finally:
            # the pass's samples exactly: its files' lines (cached: the next epoch reads the same files), else what
            # the AUC op counted (it can miss a few where the dataset's threads raced on its histograms)
            final = self._counted(call.dataset)
            if final is None and live is not None:
                final = live()
            with self.lock:
                self.samples_done += max(0, final or 0)
                self.passes += 1
                self.live = None
            self.put()

    def _counted(self, dataset: Any) -> int | None:
        """The samples of a pass over ``dataset``'s files (None: no files to count)."""
        files = list(getattr(dataset, "filelist", []) or [])
        if not files:
            return None
        try:
            return sum(count_lines(path, self.lines) for path in files)
        except OSError as exc:
            logger.warning("measuring: this pass's samples could not be counted (%s)", exc)
            return None


def _trains(program: Any) -> bool:
    """Whether ``program`` trains: it computes gradients (an evaluation's forward-only program does not)."""
    return any(op.type.endswith("_grad") for block in program.blocks for op in block.ops)


def _thread_num(dataset: Any) -> int:
    try:
        return int(dataset.proto_desc.thread_num) or 1
    except (AttributeError, TypeError, ValueError):
        return 1


def _live_count(call: seam.DatasetCall) -> Callable[[], int | None] | None:
    """How many samples the pass has trained so far, as it runs (None: no accumulating AUC op to count them)."""
    ctx = seam.context()
    if ctx.split:
        client = stage_metrics.client()
        if client is None:
            return None
        ops = stage_metrics.auc_ops(ctx.heldout.forward) if ctx.heldout is not None else []
        if not ops:
            return None

        def total() -> int:
            stats, _ = client.snapshot()
            return _most(ops, stats)

        try:
            start = total()
        except OSError:
            return None

        def shared() -> int | None:
            try:  # this trainer's share of what the last stage counted since the pass started
                return int(client.share_of_growth(start, total()))
            except OSError:
                return None

        return shared
    ops = stage_metrics.auc_ops(call.main_program())
    if not ops:
        return None
    scope = call.scope if call.scope is not None else paddle.static.global_scope()
    names = [name for op in ops for name in (op.stat_pos, op.stat_neg)]

    def counted() -> int:
        # read while the pass runs, as Paddle's own fetch thread reads the scope
        return _most(ops, {name: stage_metrics.read(scope, name) for name in names})

    begin = counted()
    return lambda: counted() - begin


def _heter_index() -> int:
    """This heterogeneous trainer's place among all of the job's (Paddle's launcher lists them in one order)."""
    me = f"{os.environ.get('POD_IP', '127.0.0.1')}:{os.environ.get('PADDLE_PORT', '0')}"
    listed = [e.strip() for e in os.environ.get("PADDLE_ALL_HETER_TRAINER_IP_PORT_LIST", "").split(",") if e.strip()]
    return listed.index(me) if me in listed else int(os.environ.get("PADDLE_PORT", "0") or 0)


def _most(ops: list[stage_metrics.AucOp], stats: dict[str, Any]) -> int:
    """The samples the model's AUC ops counted: the most any one counted (a model's accumulating op counts every
    sample; a sliding-window one only its last batches)."""
    counts = [
        int(np.asarray(stats[op.stat_pos]).sum() + np.asarray(stats[op.stat_neg]).sum())
        for op in ops
        if stats.get(op.stat_pos) is not None and stats.get(op.stat_neg) is not None
    ]
    return max(counts, default=0)


def install(ctx: seam.ProcessContext) -> None:
    """A stage 1 CPU trainer's meter (a pass hook) and a heterogeneous trainer's (its CPU time), on a launch."""
    if not settings.get("HETERPS_METER") or ctx.role not in ("trainer", "heter"):
        return
    board = rendezvous.board()
    if board is None:
        return
    every = float(cast(float, settings.get("HETERPS_METER_S")))
    if ctx.role == "trainer":
        index = int(os.environ.get("PADDLE_TRAINER_ID", "0") or 0)
        meter = Meter(1, "trainer", index, board, every).start()
        ctx.dataset_hooks["meter"] = meter.pass_hook
    else:
        meter = Meter(ctx.stage, "heter", _heter_index(), board, every).start()
    ctx.after_stop_worker["meter"] = meter.put
