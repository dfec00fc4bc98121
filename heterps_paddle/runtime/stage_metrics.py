"""The metrics a fleet script reads on a stage 1 CPU trainer of a split job carry the last stage's values.

Under a split, the loss and the AUC ops run in the last stage's section, on heterogeneous trainers; a stage 1 CPU
trainer's ``train_from_dataset`` has neither, so what PaddleRec-style scripts read was wrong: fetched loss / AUC
were dropped, and the AUC state variables a script reads from its scope after a pass (``stat_pos`` /
``stat_neg``, PaddleRec's ``get_global_auc``) stayed zero (an AUC of 0.5 every epoch).  So:

- each last-stage heterogeneous trainer serves its current metrics on a TCP port of its own (:class:`Service`):
  every auc op's state variables (persistable: they live in its root scope) as their counting windows, whatever
  the op's thresholds and sliding window (runtime/auc_states.py), and the loss, which an ``assign`` appended to its
  section copies into a persistable mirror variable each batch;
- a stage 1 CPU trainer reads them when its ``train_from_dataset`` ends (:class:`Client`) and adds its share of
  what the counts grew by since its last read (since zero, the job's start, for its first pass) to its own state
  variables, so a script's
  scope reads as after the same pass of the one-stage job (its resets between passes included).  With ``w`` CPU
  trainers each count is shared out so that the ``w`` shares add up to it exactly (trainer ``i`` owns
  ``(count + i) // w`` of it), and a trainer adds what its share of the cumulative counts grew by: the trainers'
  passes need not start or end together (one may have no batch at all), and nothing is lost between a trainer's
  passes, so once every trainer has read the final counts a global AUC (summed over trainers, as
  ``get_global_auc`` does) is exact; one trainer's own AUC is the last stage's over all trainers' batches.  Only
  accumulating ops (``slide_steps=0``) are shared out: a sliding op's window counts the last stage's last batches,
  and its fetched AUC is printed as that window's;
- while the pass runs, the fetched loss and AUC are printed every ``print_period`` batches in Paddle's format
  (``time: [...], batch: [N], <fetch_info>[1]:[value]``), and a ``fetch_handler`` gets them every period, from
  the same figures; the batch count is the last stage's samples over ``w`` and the batch size.

A metric never stops training: what fails in a pass's start, prints or end is logged once, naming where, and the
pass goes on.  The port is found on the launch's board (rendezvous.py: files under ``HETERPS_CACHE/launches/<launch id>/`` on one
host, the launch's coordinator across hosts).  A trainer that finds none within ``FIND_WAIT_S`` says so
once and goes on as before (the last stage's log prints the metrics).
"""

from __future__ import annotations

import json
import os
import socketserver
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import numpy as np
import paddle

from heterps_paddle import graph_seam, rendezvous, settings
from heterps_paddle.log import logger
from heterps_paddle.runtime import push_queues, seam
from heterps_paddle.runtime.auc_states import AucOp, UnreadableState, accumulating, auc_ops, say_once, windows

LOSS_MIRROR = "heterps_last_stage_loss"
POLL_S = 0.5
FIND_WAIT_S = 10.0
# How long a pass's end waits for the last stage to count the pass's last batches: a CPU trainer's pass can end
# before the last stage's forward of its last micro-batch has run (seen in CI with one batch a pass: that epoch's
# AUC states did not grow), so its end waits until the counts have grown by the pass's samples.
SETTLE_WAIT_S = 60.0


def client() -> Client | None:
    """This stage 1 CPU trainer's client, found once (None: none found)."""
    ctx = seam.context()
    if ctx.stage_metrics is None:
        ctx.stage_metrics = Client.find() or False
    return ctx.stage_metrics or None


def flush_heterogeneous_trainers() -> None:
    """Before a save pulls the servers' dense tables: the heterogeneous trainers' last pushes have landed (with one
    batch per epoch the last batch's dense push was still queued in the heter trainer's client when a save
    pulled, and every epoch's save held the same weights)."""
    found = client()
    if found is None:
        return
    try:
        found.flush()
    except OSError as exc:
        logger.warning("the heterogeneous trainers could not be asked to flush their pushes (%s)", exc)


def mirror_loss(program: Any, scope: Any, loss: str | None) -> str | None:
    """Append to the block that computes ``loss`` an ``assign`` into a persistable mirror (read from the root
    scope, where the per-micro-batch loss is not)."""
    if not loss:
        return None
    for blk in program.blocks:
        if loss in blk.vars:
            var = blk.vars[loss]
            blk.create_var(name=LOSS_MIRROR, shape=var.shape, dtype=var.dtype, persistable=True)
            blk.append_op(type="assign", inputs={"X": [var]}, outputs={"Out": [blk.vars[LOSS_MIRROR]]})
            graph_seam.sync_with_cpp(program)
            shape = [d if d > 0 else 1 for d in var.shape] or [1]
            scope.var(LOSS_MIRROR).get_tensor().set(np.zeros(shape, dtype="float32"), paddle.CPUPlace())
            return LOSS_MIRROR
    return None


# The ops whose persistable inputs a forward pass updates in place without a gradient: never a parameter, so never on
# the servers, and a split's later stages hold them on their heterogeneous trainers only.
RUNNING_STATISTICS = {"batch_norm": ("Mean", "Variance"), "sync_batch_norm": ("Mean", "Variance")}


def running_statistics(program: Any) -> list[str]:
    """The names of ``program``'s running statistics (:data:`RUNNING_STATISTICS`), in program order."""
    names: list[str] = []
    for block in program.blocks:
        for op in block.ops:
            for slot in RUNNING_STATISTICS.get(op.type, ()):
                names += [name for name in op.input(slot) if name not in names]
    return names


def read(scope: Any, name: str) -> Any:
    """A variable of ``scope`` as an array (None: absent or not set yet)."""
    var = scope.find_var(name)
    if var is None or not graph_seam.is_initialized(var.get_tensor()):
        return None
    return np.array(var.get_tensor())


class Service:
    """A heterogeneous trainer's side channel, one request line and one JSON reply per connection: ``metrics`` (the
    last stage's AUC states and loss) or ``flush`` (wait until this process's pushes to the servers are answered:
    a save must not pull dense tables a last batch's push has not reached yet)."""

    def __init__(self, program: Any, scope: Any, loss: str | None, runtime: Any, last: bool):
        self.scope = scope
        self.runtime = runtime
        self.last = last
        self.statistics = running_statistics(program)
        self.ops = auc_ops(program) if last else []
        self.loss = mirror_loss(program, scope, loss) if last else None
        self.server: socketserver.TCPServer | None = None

    def snapshot(self) -> dict[str, Any]:
        # each state's counting window only (auc_states.py): a sliding op's whole state is ~(slide_steps + 1) times
        # as long, and it is read every half second
        raw = {name: read(self.scope, name) for op in self.ops for name in op.states()}
        counts = windows(self.ops, raw, "the CPU trainers are not sent its counts")
        stats = {name: window.tolist() for name, window in counts.items()}
        loss = read(self.scope, self.loss) if self.loss else None
        return {"stats": stats, "loss": None if loss is None else float(np.mean(loss))}

    def answer(self, request: bytes) -> dict[str, Any]:
        if request.strip() == b"flush":
            push_queues.flush_pushes(self.runtime, "heterogeneous trainer flush (asked by a CPU trainer)")
            return {"flushed": True}
        if request.strip() == b"statistics":
            held = {name: read(self.scope, name) for name in self.statistics}
            return {"statistics": {name: value.tolist() for name, value in held.items() if value is not None}}
        return self.snapshot()

    def start(self) -> Service:
        service = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                self.wfile.write(json.dumps(service.answer(self.rfile.readline())).encode() + b"\n")

        host = os.environ.get("POD_IP", "127.0.0.1")
        self.server = socketserver.ThreadingTCPServer((host, 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="heterps-stage-metrics", daemon=True).start()
        endpoint = f"{host}:{self.server.server_address[1]}"
        board = rendezvous.board()
        if board is not None:
            ctx = seam.context()
            board.put(
                f"heter.{ctx.stage}.{os.environ.get('PADDLE_TRAINER_ID', '0')}",
                {"endpoint": endpoint, "stage": ctx.stage, "last": self.last},
            )
        logger.info(
            "side channel of this heterogeneous trainer on %s (flush%s)",
            endpoint,
            f"; last-stage metrics: {len(self.ops)} auc ops, loss {self.loss}" if self.last else "",
        )
        return self


def _fetch(endpoint: str, request: bytes = b"metrics", timeout: float = 60.0) -> dict[str, Any]:
    return cast("dict[str, Any]", json.loads(rendezvous.exchange_line(endpoint, request, timeout)))


def _heter_count() -> int:
    groups = [g for g in os.environ.get("PADDLE_ALL_HETER_TRAINER_IP_PORT_LIST", "").split(";") if g]
    return sum(len(g.split(",")) for g in groups)


@dataclass
class Client:
    """A stage 1 CPU trainer's view of the heterogeneous trainers' side channels."""

    endpoints: list[str]  # the last stage's (metrics)
    trainers: int  # CPU trainers sharing the last stage's counts
    index: int  # this trainer's index among them
    every_heter: list[str] = field(default_factory=list)  # every heterogeneous trainer's (flush)
    first_of_stage: list[str] = field(default_factory=list)  # each later stage's trainer 0 (its running statistics)
    ops: list[AucOp] = field(default_factory=list)  # the whole model's AUC ops (their layouts)
    # the last stage's counts as this trainer last accounted for them (its previous pass's end; None: zero)
    accounted: dict[str, Any] | None = None

    @staticmethod
    def find() -> Client | None:
        board, expected = rendezvous.board(), _heter_count()
        # The services are up before the heter servers listen, and this trainer's init_worker waited for its next
        # stage's: a short wait covers a slow file system and later stages starting, not a slow peer.
        deadline = time.monotonic() + FIND_WAIT_S
        while board is not None and expected:
            found = board.entries("heter.")
            if len(found) >= expected:
                entries = list(found.values())
                trainers, index = seam.worker_count_and_index(seam.role_maker())
                held = seam.context().heldout
                return Client(
                    [str(e["endpoint"]) for e in entries if e["last"]],
                    trainers,
                    index,
                    [str(e["endpoint"]) for e in entries],
                    [str(e["endpoint"]) for key, e in found.items() if key.rsplit(".", 1)[-1] == "0"],
                    auc_ops(held.forward) if held is not None else [],
                )
            if time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        logger.warning(
            "the heterogeneous trainers' side channels were not found on %s: fetched loss/AUC and "
            "the AUC states in this trainer's scope are not the model's (the last stage's log prints them), and "
            "saves do not wait for their last pushes",
            "no board (not a launch)" if board is None else board.where,
        )
        return None

    def snapshot(self) -> tuple[dict[str, Any], float | None]:
        """The last stage's AUC states' counting windows (summed over its trainers), by state name, and its mean
        latest loss.  A window whose length is not its op's bucket count is left out (said once)."""
        stats: dict[str, Any] = {}
        losses = []
        buckets = {name: op.buckets for op in self.ops for name in op.states()}
        for endpoint in self.endpoints:
            reply = _fetch(endpoint)
            for name, values in reply["stats"].items():
                array = np.array(values, dtype="int64")
                if array.size != buckets.get(name):
                    say_once(
                        f"window {name}",
                        f"the last stage sent {array.size} buckets of AUC state {name}, the model's AUC op has "
                        f"{buckets.get(name, 'no such state')}: its pass AUC is not shown here",
                    )
                    continue
                stats[name] = stats[name] + array if name in stats else array
            if reply["loss"] is not None:
                losses.append(reply["loss"])
        return stats, (float(np.mean(losses)) if losses else None)

    def flush(self) -> None:
        """Wait until every heterogeneous trainer's pushes to the servers have been answered."""
        # Its flushes may go on for HETERPS_FLUSH_TIMEOUT (runtime/push_queues.py) before it answers.
        timeout = float(cast(float, settings.get("HETERPS_FLUSH_TIMEOUT"))) + 60.0
        for endpoint in self.every_heter:
            _fetch(endpoint, b"flush", timeout)

    def running_statistics(self) -> dict[str, Any]:
        """The running statistics (batch norms' moving mean and variance) each later stage's trainer 0 holds, by
        name: what a one-stage job's trainer 0 saves of its own."""
        held: dict[str, Any] = {}
        for endpoint in self.first_of_stage:
            for name, values in _fetch(endpoint, b"statistics")["statistics"].items():
                held[name] = np.array(values, dtype="float32")
        return held

    def share(self, count: Any) -> Any:
        """This trainer's share of a count: the shares of all trainers add up to ``count`` exactly."""
        return (count + self.index) // self.trainers

    def share_of_growth(self, before: Any, after: Any) -> Any:
        """What this trainer's share grew by while the count went from ``before`` to ``after``: summed over the
        trainers it is ``after - before`` for any one window, and a trainer's growths over consecutive windows add
        up to its share of the whole (so windows of different trainers need not agree)."""
        return self.share(after) - self.share(before)


def add_to_scope(scope: Any, op: AucOp, name: str, growth: Any) -> None:
    """Add ``growth`` (a counting window) to the state ``name`` of the accumulating ``op`` in ``scope``, which is
    left in the kernel's shape (``[1, buckets]``) whatever shape it had (startup's is one longer)."""
    value = read(scope, name)
    base = np.zeros(op.buckets, dtype="int64")
    if value is not None:
        try:
            base = op.window(name, value)
        except UnreadableState as exc:
            say_once(f"scope {name}", f"{exc}: this trainer's scope gets the last stage's counts alone")
    tensor = (scope.find_var(name) or scope.var(name)).get_tensor()
    tensor.set((base + growth).reshape(1, op.buckets).astype("int64"), paddle.CPUPlace())


def auc_of(stat_pos: Any, stat_neg: Any) -> float:
    from heterps_paddle.data.metrics import auc_from_histograms

    return float(auc_from_histograms(np.asarray(stat_pos), np.asarray(stat_neg)))


@dataclass
class PassMetrics:
    """One ``train_from_dataset`` of a stage 1 section: what the script's scope and prints get."""

    client: Client
    scope: Any
    fetch: list[tuple[str, str]]  # (var name, fetch_info) the script asked for
    print_period: int
    batch_size: int
    handler: Any
    expected: int | None = None  # the samples of this trainer's pass (its files' lines; None: not known)
    before: dict[str, Any] = field(default_factory=dict)
    local: dict[str, Any] = field(default_factory=dict)  # the scope's states when the pass started
    ops: list[AucOp] = field(default_factory=list)  # the whole model's auc ops (what the fetches name)
    copies: dict[str, str] = field(default_factory=dict)  # a fetched copy of an AUC -> the op's AUC output
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    broken: bool = False  # its start failed (said): the pass's end leaves the scope alone

    def start(self) -> PassMetrics:
        """Read where the pass starts from (an OSError: the last stage could not be read, for the caller to say)."""
        try:
            held = seam.context().heldout
            self.ops = auc_ops(held.forward) if held is not None else []
            self.copies = auc_copies(held.forward, self.ops) if held is not None else {}
            now, _ = self.client.snapshot()
            # From where this trainer's previous pass left off, and for its first pass from zero (the last stage's
            # states start at zero with the job): what other trainers' batches added before or between this
            # trainer's passes is its share too (a trainer can start late, or end a pass while another's batch is on
            # its way).  Only accumulating ops: a sliding op's window is not a count that grows.
            accounted = self.client.accounted or {}
            for op in accumulating(self.ops):
                for name in op.states():
                    if name not in now:
                        continue
                    self.before[name] = accounted.get(name, np.zeros_like(now[name]))
                    self.local[name] = self._scope_window(op, name)
        except OSError:
            raise
        except Exception as exc:  # a metric never stops training
            self._failed("its start", exc)
            return self
        if self.fetch or self.handler is not None:
            self.thread = threading.Thread(target=self._loop, name="heterps-stage-metrics-print", daemon=True)
            self.thread.start()
        return self

    def _failed(self, where: str, exc: Exception) -> None:
        self.broken = True
        logger.warning(
            "stage metrics (runtime/stage_metrics.py) failed at %s (%s: %s): this pass's loss/AUC prints and the "
            "AUC states of this trainer's scope are not the last stage's; training goes on",
            where,
            type(exc).__name__,
            exc,
        )

    def _scope_window(self, op: AucOp, name: str) -> Any:
        value = read(self.scope, name)
        if value is None:
            return np.zeros(op.buckets, dtype="int64")
        try:
            return op.window(name, value)
        except UnreadableState as exc:
            say_once(f"scope {name}", f"{exc}: this trainer's scope gets the last stage's counts alone")
            return np.zeros(op.buckets, dtype="int64")

    def _mine(self, op: AucOp, stats: dict[str, Any]) -> dict[str, Any] | None:
        """This trainer's view of an accumulating op's states: its scope's at the pass's start plus its share of
        what the last stage counted since (None: not read at both ends)."""
        if not all(name in stats and name in self.before for name in op.states()):
            return None
        return {n: self.local[n] + self.client.share_of_growth(self.before[n], stats[n]) for n in op.states()}

    def _values(self) -> tuple[dict[str, float], int]:
        """Each fetchable metric's current value for this trainer, and the samples it has seen this pass."""
        stats, loss = self.client.snapshot()
        values: dict[str, float] = {}
        samples = 0
        held = seam.context().heldout
        for op in self.ops:
            if not op.accumulates:
                if all(name in stats for name in op.states()):  # the last stage's last batches, every trainer's
                    values[op.auc] = auc_of(stats[op.stat_pos], stats[op.stat_neg])
                continue
            mine = self._mine(op, stats)
            if mine is None:
                continue
            values[op.auc] = auc_of(mine[op.stat_pos], mine[op.stat_neg])
            seen = (mine[op.stat_pos] - self.local[op.stat_pos]) + (mine[op.stat_neg] - self.local[op.stat_neg])
            samples = max(samples, int(seen.sum()))  # an accumulating op counts every sample of the pass
        values.update({copy: values[source] for copy, source in self.copies.items() if source in values})
        if loss is not None and held is not None and held.loss:
            values[held.loss] = loss
        return values, samples

    def _loop(self) -> None:
        printed = 0
        last_handler = time.monotonic()
        while not self.stop.wait(POLL_S):
            try:
                printed, last_handler = self._print(printed, last_handler)
            except OSError:
                continue  # the last stage is going away with the job; the pass's end says what is owed
            except Exception as exc:  # a metric never stops training
                say_once("print loop", f"stage metrics: the pass's prints failed ({type(exc).__name__}: {exc})")

    def _print(self, printed: int, last_handler: float) -> tuple[int, float]:
        values, samples = self._values()
        batches = samples // max(1, self.batch_size)
        if self.fetch and self.print_period > 0 and batches // self.print_period > printed:
            printed = batches // self.print_period
            shown = [f"{info}[1]:[{values[name]:.6f}]" for name, info in self.fetch if name in values]
            if shown:
                now = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
                print(f"time: [{now}], batch: [{printed * self.print_period}], {', '.join(shown)}", flush=True)
        if self.handler is not None and time.monotonic() - last_handler >= float(self.handler.period_secs):
            last_handler = time.monotonic()
            wanted = {key: var for key, var in self.handler.var_dict.items()}
            self.handler.handler(
                {
                    key: np.array([values[getattr(var, "name", var)]])
                    for key, var in wanted.items()
                    if getattr(var, "name", var) in values
                }
            )
        return printed, last_handler

    def finish(self) -> None:
        """After the pass: the scope's AUC states get this trainer's share of the last stage's counts.  Never
        raises: a metric that fails is said and training goes on."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
        if self.broken:
            return
        try:
            after = self._settled()
        except OSError as exc:
            logger.warning(
                "the last stage's metrics could not be read after the pass (%s): this trainer's AUC "
                "states are not updated for it",
                exc,
            )
            return
        try:
            carried: list[str] = []
            for op in accumulating(self.ops):
                if all(name in after and name in self.before for name in op.states()):
                    for name in op.states():
                        add_to_scope(self.scope, op, name, self.client.share_of_growth(self.before[name], after[name]))
                    carried += op.states()
            self.client.accounted = after
            held = seam.context().heldout
            if held is not None:
                held.live.update(carried)  # the scope's states are the model's now (fleet.evaluation reads them)
        except Exception as exc:  # a metric never stops training
            self._failed("the pass's end", exc)

    def _settled(self) -> dict[str, Any]:
        """The last stage's counts once they hold this pass's samples: grown since this trainer's last reading by
        at least its pass's samples (other trainers' batches only add to them), or as they are after
        ``SETTLE_WAIT_S`` (then said)."""
        deadline = time.monotonic() + SETTLE_WAIT_S
        while True:
            after, _ = self.client.snapshot()
            counted = self._counted(after)
            # the histograms of an AUC op run by several threads can miss a rare sample: a thousandth is allowed
            if self.expected is None or counted is None or counted >= self.expected - self.expected // 1000:
                return after
            if time.monotonic() > deadline:
                logger.warning(
                    "the last stage counted %d samples since this trainer's last pass, %.0f s after this pass of "
                    "%d samples ended: the AUC states of this trainer's scope miss the rest",
                    counted,
                    SETTLE_WAIT_S,
                    self.expected,
                )
                return after
            time.sleep(POLL_S)

    def _counted(self, after: dict[str, Any]) -> int | None:
        """What the model's accumulating AUC ops counted since ``before`` (None: none read at both ends)."""
        grown = [
            int(np.sum(after[op.stat_pos]) + np.sum(after[op.stat_neg]))
            - int(np.sum(self.before[op.stat_pos]) + np.sum(self.before[op.stat_neg]))
            for op in accumulating(self.ops)
            if all(name in after and name in self.before for name in op.states())
        ]
        return max(grown) if grown else None


COPY_OPS = ("cast", "assign")


def auc_copies(program: Any, ops: list[AucOp]) -> dict[str, str]:
    """The vars that copy an AUC op's output (a script may fetch ``paddle.cast(auc, "float32")``, as PaddleRec's
    Wide&Deep does), each with the AUC output it copies: printed with its value."""
    sources = {op.auc: op.auc for op in ops}
    for blk in program.blocks:
        for op in blk.ops:
            if op.type in COPY_OPS and op.input("X") and op.input("X")[0] in sources:
                sources[op.output("Out")[0]] = sources[op.input("X")[0]]
    return {copy: source for copy, source in sources.items() if copy != source}


def dataset_batch_size(dataset: Any) -> int:
    try:
        return int(dataset.proto_desc.batch_size)
    except AttributeError:
        return 1
