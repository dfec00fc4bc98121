"""What each trainer of a job measures of itself, for the launch's gauge (launch/gauge.py; docs/metrics.md).

Every ``HETERPS_METER_S`` seconds (and at the end of each pass) a trainer puts one record on the launch's board
(rendezvous.py), under ``meter.<stage>.<role>.<index>``, replacing its last one:

- ``cpu_s``: the process's CPU seconds so far, and ``cores``: how many cores its training can keep busy (a stage 1
  CPU trainer: its dataset's ``thread_num``; a heterogeneous trainer: 1, its section runs one micro-batch at a
  time), so that the gauge can tell how much of a window the stage worked and how much it waited for its
  neighbours;
- ``samples`` (stage 1 CPU trainers, which read the data): the samples it trained so far, its finished passes'
  and the running pass's.  A finished call's samples (a pass is one call, or a pulled pass's several) are the lines
  of the files it read (one sample a line, PaddleRec's slot format), counted when it starts and cached by file (the
  next epoch reads the same files), so they are exact; the running call's are counted as it runs by the model's
  accumulating AUC op (every sample adds one to its histograms: in the trainer's own scope on a one-stage plan; on
  a split plan, this trainer's share of the last stage's, stage_metrics.Client), never more than the call's
  lines; a model without one shows a call only at its end.  So each trainer's count only grows, and the job's
  (their sum) with it: a split plan's last stage counts every trainer's samples and its shares are even, while
  pulled trainers train uneven shares, so a share uncapped would run ahead of a slow trainer's call and fall back
  at its end.

- ``pass_auc``, ``pass_loss``, ``pass_finite`` (stage 1 CPU trainers, after their first pass): what the last
  finished pass learned, as the script's own metrics give it: the AUC of the model's accumulating AUC op over that
  pass (its histograms' growth), the last stage's latest loss where it is known (a split plan: the side channel; a
  one-stage trainer's loss is in its threads' scopes), and whether what trained was finite (that loss; on one
  stage, the dense parameters the trainer holds).  The gauge flags a job that learns nothing.

A trainer reads nothing but its own scope, its own process's CPU time and, on a split plan, the last stage's side
channel it reads anyway; the records are small and few (``tools/bench/e2e.py --meter`` measures what this costs the
training).  ``HETERPS_METER=0`` turns it off.  Failures to put a record are logged once and never the job's.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, cast

import numpy as np
import paddle
import psutil

from heterps_paddle import rendezvous, settings
from heterps_paddle.data.metrics import auc_from_histograms
from heterps_paddle.log import logger
from heterps_paddle.runtime import seam, stage_metrics
from heterps_paddle.runtime.auc_states import AucOp, accumulating, auc_ops, say_once, windows

VERSION = 1
KEY_PREFIX = rendezvous.METER_PREFIX


def key(stage: int, role: str, index: int) -> str:
    return f"{KEY_PREFIX}{stage}.{role}.{index}"


def count_lines(path: str, cache: dict[tuple[str, int, float], int]) -> int:
    """Lines of ``path`` (a sample each), cached by path, size and modification time (a pipe's as noted:
    :func:`note_samples`)."""
    full = os.path.abspath(path)
    if full in _NOTED:
        return _NOTED[full]
    info = os.stat(path)
    found = (full, info.st_size, info.st_mtime)
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
    count: Callable[[], int | None] | None = None  # the model's AUC count, this trainer's terms (None: none)
    in_pass: bool = False  # a training pass runs (its calls are counted)
    done_in_pass: int = 0  # the running pass's finished calls' samples
    call_from: int | None = None  # ``count()`` when the running call started (None: no call runs, or no count)
    call_lines: int | None = None  # the running call's samples (None: not known)
    learned: dict[str, Any] = field(default_factory=dict)  # the last finished pass's AUC, loss, finiteness
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    failed: bool = False

    def start(self) -> Meter:
        threading.Thread(target=self._loop, name="heterps-meter", daemon=True).start()
        return self

    def record(self) -> dict[str, Any]:
        with self.lock:
            running = self._running() if self.in_pass else 0
            samples = None if self.role != "trainer" else self.samples_done + running
            passes = self.passes
            learned = dict(self.learned)
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
            **learned,
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

    def _running(self) -> int:
        """The running pass's samples so far (module doc): its finished calls', and the running call's as counted,
        never more than its lines."""
        if self.call_from is None or self.count is None:
            return self.done_in_pass
        now = self.count()
        grown = 0 if now is None else max(0, now - self.call_from)
        return self.done_in_pass + (grown if self.call_lines is None else min(grown, self.call_lines))

    @contextlib.contextmanager
    def pass_hook(self, call: seam.DatasetCall) -> Iterator[None]:
        """Around a stage 1 CPU trainer's pass: its live count, and its samples at its end.  A pass of a program
        that does not train (an evaluation: no gradient op) is not counted."""
        if not _trains(call.main_program()):
            yield
            return
        reader = _auc_reader(call)
        before = _read_stats(reader)  # read once: the count and the pass's AUC both start from it
        count = _counter(reader) if before is not None else None
        with self.lock:
            self.cores = max(1, min(os.cpu_count() or 1, _thread_num(call.dataset)))
            self.count, self.in_pass, self.done_in_pass, self.call_from = count, True, 0, None
        try:
            yield
        finally:
            with self.lock:  # every call ended: its files' lines each (else what the call counted)
                final = self._running()
            try:
                learned = pass_learning(reader, before, call)
            except Exception as exc:  # measuring must never fail the job
                logger.warning("measuring: what the pass learned could not be read (%s); going on", exc)
                learned = {}
            with self.lock:
                self.samples_done += max(0, final)
                self.passes += 1
                self.in_pass, self.count, self.call_from = False, None, None
                self.learned = learned
            self.put()

    @contextlib.contextmanager
    def call_hook(self, call: seam.DatasetCall) -> Iterator[None]:
        """Around each Paddle call of a training pass: its samples counted live from its start, exactly at its
        end."""
        if not self.in_pass:  # an evaluation's call
            yield
            return
        try:
            lines = self._counted(call.dataset)
            start = self.count() if self.count is not None else None
        except Exception as exc:  # measuring must never fail the job: this call is shown at the pass's end
            logger.warning("measuring: a call's samples could not be counted (%s); going on", exc)
            lines, start = None, None
        with self.lock:
            self.call_from, self.call_lines = start, lines
        yield  # a call that fails fails its pass: nothing more to count
        with self.lock:
            self.done_in_pass = self._running() if lines is None else self.done_in_pass + lines
            self.call_from, self.call_lines = None, None

    def _counted(self, dataset: Any) -> int | None:
        return dataset_samples(dataset)

    def call_samples(self) -> int | None:
        """The running call's samples so far, as the model's AUC op counted them (never more than its lines); None
        when no call runs or the model has no such op (the data plan's ``progress``: runtime/pulled_pass.py)."""
        with self.lock:
            if self.call_from is None or self.count is None:
                return None
            return self._running() - self.done_in_pass


# this process's meter (a stage 1 CPU trainer's: the data plan reads its running call's count), None without one
_current: Meter | None = None


def current() -> Meter | None:
    return _current


# this process's line count of each data file it read (the next epoch reads the same files; a split pass's end and
# the meter both ask for the same pass's count)
_LINES: dict[tuple[str, int, float], int] = {}
_NOTED: dict[str, int] = {}  # the samples of the running call's range pipes (runtime/range_feed.py)


def dataset_samples(dataset: Any) -> int | None:
    """The samples of a pass over ``dataset``'s files (None: no files to count), counted once per file."""
    return dataset_samples_of(list(getattr(dataset, "filelist", []) or []))


def note_samples(path: str, lines: int | None) -> None:
    """``path`` holds ``lines`` samples, counted where it was made (a range's pipe: runtime/range_feed.py), so
    that counting them never reads it (a pipe read is a pipe emptied); None: forgotten, the pipe gone."""
    if lines is None:
        _NOTED.pop(os.path.abspath(path), None)
    else:
        _NOTED[os.path.abspath(path)] = lines


def dataset_samples_of(files: list[str]) -> int | None:
    """The samples of ``files`` (None: no files to count), counted once per file."""
    if not files:
        return None
    try:
        return sum(count_lines(path, _LINES) for path in files)
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


# The model's AUC states as they stand, as counting windows (runtime/auc_states.py): (their values by state name,
# the last stage's latest loss where it is known)
AucReader = tuple[list[AucOp], Callable[[], tuple[dict[str, Any], float | None]], bool]
NO_PASS_AUC = "its pass AUC is not shown in the launch's figures (heterps status / the gauge)"


def _auc_reader(call: seam.DatasetCall) -> AucReader | None:
    """How to read the model's accumulating AUC states while and after a pass runs (None: the model has none, said
    once): on a split plan the last stage's (summed over its trainers, with its latest loss), else this trainer's
    own scope's.  The third item says whether the states are shared by every trainer (a split's)."""
    ctx = seam.context()
    program = ctx.heldout.forward if ctx.split and ctx.heldout is not None else call.main_program()
    every = auc_ops(program) if program is not None else []
    ops = accumulating(every)
    if not ops:
        say_once(
            "no accumulating auc",
            f"the model has {len(every)} AUC ops, none accumulating (slide_steps=0): {NO_PASS_AUC}",
        )
        return None
    if ctx.split:
        client = stage_metrics.client()
        return None if client is None else (ops, client.snapshot, True)
    scope = call.scope if call.scope is not None else paddle.static.global_scope()
    names = [name for op in ops for name in op.states()]

    def read() -> tuple[dict[str, Any], float | None]:
        # read while the pass runs, as Paddle's own fetch thread reads the scope; a one-stage trainer's loss is in
        # its threads' scopes, not here
        return windows(ops, {name: stage_metrics.read(scope, name) for name in names}, NO_PASS_AUC), None

    return ops, read, False


def _read_stats(reader: AucReader | None) -> dict[str, Any] | None:
    if reader is None:
        return None
    try:
        return reader[1]()[0]
    except OSError:
        return None


def _counter(reader: AucReader | None) -> Callable[[], int | None] | None:
    """The samples the model's accumulating AUC op counted so far, in this trainer's terms: its own scope's, or on
    a split plan its share of the last stage's (None: no such op; a read that fails: None)."""
    if reader is None:
        return None
    ops, read, shared = reader
    client = stage_metrics.client() if shared else None

    def count() -> int | None:
        try:
            total = _most(ops, read()[0])
            return total if client is None else int(client.share(total))
        except OSError:
            return None

    return count


def pass_learning(reader: AucReader | None, before: dict[str, Any] | None, call: seam.DatasetCall) -> dict[str, Any]:
    """What the pass that just ended learned, as the script's own metrics give it: its AUC (the model's
    accumulating AUC op's histograms over the pass: what grew since it started), the last stage's latest loss where
    it is known (a split plan), and whether what it trains is finite (the loss; on one stage, where the loss is in
    the threads' scopes, the dense parameters this trainer holds)."""
    out: dict[str, Any] = {"pass_auc": None, "pass_loss": None, "pass_finite": None}
    if reader is not None and before is not None:
        try:
            after, loss = reader[1]()
        except OSError:
            after, loss = {}, None
        best = max(reader[0], key=lambda op: _grown(op, before, after), default=None)
        if best is not None and _grown(best, before, after) > 0:
            pos = np.asarray(after[best.stat_pos], dtype=np.float64) - np.asarray(before[best.stat_pos])
            neg = np.asarray(after[best.stat_neg], dtype=np.float64) - np.asarray(before[best.stat_neg])
            out["pass_auc"] = round(auc_from_histograms(pos, neg), 6)
        if loss is not None:
            out["pass_loss"] = float(loss) if math.isfinite(loss) else None
            out["pass_finite"] = math.isfinite(loss)
    if out["pass_finite"] is None and not seam.context().split:
        out["pass_finite"] = _parameters_finite(call)
    return out


def _grown(op: AucOp, before: dict[str, Any], after: dict[str, Any]) -> int:
    """The samples ``op`` counted between the two readings (0: it was not read at both)."""
    if any(x.get(name) is None for x in (before, after) for name in (op.stat_pos, op.stat_neg)):
        return 0
    return int(
        np.asarray(after[op.stat_pos]).sum()
        + np.asarray(after[op.stat_neg]).sum()
        - np.asarray(before[op.stat_pos]).sum()
        - np.asarray(before[op.stat_neg]).sum()
    )


def _parameters_finite(call: seam.DatasetCall) -> bool | None:
    """Whether the dense parameters in this trainer's scope are all finite (None: none there to read)."""
    scope = call.scope if call.scope is not None else paddle.static.global_scope()
    seen = False
    for parameter in call.main_program().global_block().all_parameters():
        try:
            value = stage_metrics.read(scope, parameter.name)
        except ValueError:  # not a dense tensor here (a sparse table's parameter: SelectedRows)
            continue
        if value is None or value.dtype.kind != "f":
            continue
        seen = True
        if not np.isfinite(value).all():
            return False
    return True if seen else None


def _heter_index() -> int:
    """This heterogeneous trainer's place among all of the job's (Paddle's launcher lists them in one order)."""
    me = f"{os.environ.get('POD_IP', '127.0.0.1')}:{os.environ.get('PADDLE_PORT', '0')}"
    listed = [e.strip() for e in os.environ.get("PADDLE_ALL_HETER_TRAINER_IP_PORT_LIST", "").split(",") if e.strip()]
    return listed.index(me) if me in listed else int(os.environ.get("PADDLE_PORT", "0") or 0)


def _most(ops: list[AucOp], stats: dict[str, Any]) -> int:
    """The samples the model's accumulating AUC ops counted: the most any one counted (each counts every sample
    since its states were last zeroed; a script may zero one and not another)."""
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
        global _current
        index = int(os.environ.get("PADDLE_TRAINER_ID", "0") or 0)
        meter = _current = Meter(1, "trainer", index, board, every).start()
        ctx.dataset_hooks["meter"] = meter.pass_hook
        ctx.call_hooks["meter"] = meter.call_hook
    else:
        meter = Meter(ctx.stage, "heter", _heter_index(), board, every).start()
    ctx.after_stop_worker["meter"] = meter.put
