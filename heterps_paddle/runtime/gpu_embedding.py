"""Embeddings on a GPU stage: the project's sparse table as a per-pass cache of the parameter servers' table.

A plan whose GPU-kind stage holds a sparse layer (realistically a one-stage plan on a gpu type: the launched
trainers are the stage's units, data-parallel) keeps the parameter servers authoritative, as Paddle's PSGPU
does, and moves each pass's working set in and out of the units' local tables:

* ``prepare`` (meta optimizer, before Paddle's PS optimizer): finds the sparse layers on GPU stages and
  gives their server tables the plain SGD rule with learning rate 1 (``SparseNaiveSGDRule``; Paddle 2.6.2's
  ``Accessor._set`` would otherwise pick ``SparseAdamSGDRule`` whatever the optimizer, but it keeps a rule
  named in ``strategy.sparse_table_configs``), so a pushed "gradient" ``-delta`` adds exactly ``delta``.
* ``apply`` (after the PS optimizer built the trainer program): on trainers, each fused
  ``distributed_lookup_table`` of such a table becomes ``heterps_pull`` ops on a local ``SparseTable`` and its
  ``distributed_push_sparse`` becomes ``heterps_pull_grad`` ops, so training reads and updates the local
  table with its fused optimizer (the job's optimizer type and learning rate) and sends nothing per batch.
  The servers still hold the table (their program and the runtime's send contexts are built from the
  original program).
* a pass is one ``Executor.train_from_dataset`` call on the rewritten program.  Before it, each unit reads
  the ids of the pass's files (MultiSlot text read with ``pipe_command="cat"``: the slots its lookups read),
  pulls those rows from the servers (``distributed_lookup_table`` in a small program), assigns them into its
  local table and waits for every unit (barrier).  After it, each unit pushes ``new - start`` of its rows
  (``distributed_push_sparse``, gradient ``-delta``, one LoD sequence so Paddle does not scale it by a batch
  size), flushes, waits for every unit, and re-pulls the rows, so every unit ends the pass with the servers'
  value ``start + sum of the units' deltas``.

The barrier goes through the servers too (no Gloo needed; Gloo's barrier timed out at once in this wheel's
PS launch): every unit adds ``SYNC_UNIT`` to column 0 of a reserved key of the first such table and polls
until the count reaches ``units * barriers``; the row's initial value is far below ``SYNC_UNIT / 2``.
docs/sparse-table.md ("GPU stages") states the consistency model.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, cast

import numpy as np
import numpy.typing as npt
import paddle
from paddle.distributed import fleet

from heterps_paddle import graph_seam, settings
from heterps_paddle.errors import HeterPSError
from heterps_paddle.log import logger
from heterps_paddle.planning.model import Plan, PlanningInputError
from heterps_paddle.program.partition import program_layers
from heterps_paddle.program.profiler import LayerGroup
from heterps_paddle.runtime import push_queues, seam
from heterps_paddle.table.sparse_table import SparseTable, gpu_call, load_ops

SYNC_KEY = 2**63 - 1  # reserved id: the pass barrier's counter row
SYNC_UNIT = 64.0
# Server-side bounds of the SGD rule (Paddle's default clamps weights to [-10, 10], and the barrier counter
# grows past that).
WEIGHT_BOUND = 1e30
NAIVE_RULE = "SparseNaiveSGDRule"
LOCAL_OPTIMIZERS = {"adam": "adam", "sgd": "sgd", "adagrad": "adagrad"}


class GpuEmbeddingError(HeterPSError, RuntimeError):
    """A job whose GPU-stage embeddings cannot be run as asked (unsupported lookup, data or optimizer)."""


@dataclass
class GpuTable:
    param: str
    layer: str
    dim: int = 0
    table_id: int = -1
    ids_vars: list[str] = field(default_factory=list)  # data variables its lookups read
    options: dict[str, Any] = field(default_factory=dict)  # the local table's optimizer (local_table_options)
    table: Any = None  # heterps_paddle.table.sparse_table.SparseTable (trainers only, set by apply)


# ---- before the PS optimizer ------------------------------------------------------------------------------
def gpu_sparse_layers(program: Any, plan: Plan, layers: list[LayerGroup] | None = None) -> list[tuple[str, str]]:
    """(layer, parameter) of every sparse layer the plan puts on a GPU-kind stage.  ``layers``: the program's,
    checked against the plan, when minimize has them (program/partition.py ``planned_layers``)."""
    gpu_layers = {name for st in plan.stages if st.kind == "gpu" for name in st.layers}
    if not gpu_layers:
        return []
    if layers is None:
        layers = program_layers(program, plan)
    # (a sparse layer always names its table)
    found = [
        (layer.name, cast(str, layer.table)) for layer in layers if layer.kind == "sparse" and layer.name in gpu_layers
    ]
    if found and plan.num_stages > 1:
        # Paddle's heter pipeline reads data on stage 1 and ships activations, not ids, to later stages.
        raise PlanningInputError(
            f"sparse layers {[n for n, _ in found]} are on a GPU stage of a split plan; "
            "embeddings in the project's table are supported on a one-stage GPU plan (data-parallel "
            "units); in a split plan keep them on stage 1"
        )
    return found


def local_table_options(optimizer: Any) -> dict[str, Any]:
    """The local table's optimizer: the job's optimizer type, learning rate and constants."""
    kind = LOCAL_OPTIMIZERS.get(type(optimizer).__name__.lower())
    if kind is None:
        raise GpuEmbeddingError(
            f"embeddings on a GPU stage train with the job's optimizer in the project's table, "
            f"which has {sorted(LOCAL_OPTIMIZERS)}; got {type(optimizer).__name__}"
        )
    lr = graph_seam.optimizer_setting(optimizer, "learning_rate")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)):
        raise GpuEmbeddingError(f"embeddings on a GPU stage need a constant float learning rate, got {lr!r}")
    opts: dict[str, Any] = {"optimizer": kind, "lr": float(lr)}
    if kind == "adam":
        for key in ("beta1", "beta2", "epsilon"):
            value = graph_seam.optimizer_setting(optimizer, key)
            if isinstance(value, (int, float)):
                opts[key] = float(value)
    elif kind == "adagrad":
        epsilon = graph_seam.optimizer_setting(optimizer, "epsilon")
        if isinstance(epsilon, (int, float)):
            opts["epsilon"] = float(epsilon)
    return opts


def use_naive_sgd_on_servers(strategy: Any, params: Iterable[str]) -> None:
    """Give the servers' tables of ``params`` plain SGD with learning rate 1 (pushes of -delta add delta)."""
    tables = strategy.sparse_table_configs  # the repeated TableParameter proto: edited in place
    for param in params:
        proto = next((t for t in tables if t.table_name == param), None)
        if proto is None:
            proto = tables.add()
            proto.table_name = param
        for rule in (proto.accessor.embed_sgd_param, proto.accessor.embedx_sgd_param):
            if rule.HasField("name") and rule.name != NAIVE_RULE:
                raise GpuEmbeddingError(
                    f"table {param!r} is an embedding on a GPU stage: its server table must use {NAIVE_RULE} (the "
                    f"units push their rows' changes), but strategy.sparse_table_configs sets {rule.name!r}"
                )
            rule.name = NAIVE_RULE
            rule.naive.learning_rate = 1.0
            if len(rule.naive.weight_bounds) == 0:
                rule.naive.weight_bounds.extend([-WEIGHT_BOUND, WEIGHT_BOUND])


def prepare(
    program: Any, plan: Plan, optimizer: Any, strategy: Any, layers: list[LayerGroup] | None = None
) -> list[GpuTable]:
    """Called by the meta optimizer before the PS optimizer.  Returns the tables to move to the units."""
    found = gpu_sparse_layers(program, plan, layers)
    if not found:
        return []
    opts = local_table_options(optimizer)
    # The PS runtime builds its table protos from fleet's context copy of the strategy, not from the one the
    # meta optimizers hold: both get the rule.
    strategies = [strategy, *seam.fleet_strategy_copies()]
    params = sorted({param for _, param in found})
    for s in strategies:
        use_naive_sgd_on_servers(s, params)
    tables: list[GpuTable] = []
    for layer, param in found:
        if any(t.param == param for t in tables):
            continue
        t = GpuTable(param=param, layer=layer, options=opts)
        tables.append(t)
    logger.info(
        "GPU-stage embeddings in the project's table: %s (servers authoritative, per-pass sync; local %s)",
        {t.param: t.layer for t in tables},
        opts,
    )
    return tables


# ---- after the PS optimizer: the trainer program -----------------------------------------------------------
def apply(program: Any, startup_programs: Iterable[Any], tables: list[GpuTable]) -> PassSync | None:
    """Rewrite a trainer's program (see the module doc); servers keep theirs.  ``startup_programs``: those the
    script may run (the PS optimizer's clone, now the default, and the one given to minimize, if any); each
    gets the handle's initialiser.  Returns the PassSync."""
    if not tables or seam.context().role != "trainer":
        return None
    load_ops()
    block = program.global_block()
    by_param = {t.param: t for t in tables}
    by_table_id: dict[int, GpuTable] = {}
    for idx in reversed(range(len(block.ops))):
        op = block.ops[idx]
        if op.type != "distributed_lookup_table" or op.input("W")[0] not in by_param:
            continue
        t = by_param[op.input("W")[0]]
        w = block.var(t.param)
        t.dim = int(w.shape[-1])
        t.table_id = int(op.attr("table_id"))
        by_table_id[t.table_id] = t
        if op.attr("padding_idx") not in (-1, None):
            raise GpuEmbeddingError(f"{t.param}: lookups with padding_idx are not supported in the project's table")
        if t.table is None:
            t.table = SparseTable(dim=t.dim, name=f"gpu_emb.{t.param}", seed=t.table_id, **t.options)
        handle = _handle(program, startup_programs, t)
        version = op.attr("lookup_table_version") if op.has_attr("lookup_table_version") else "lookup_table"
        ids_names, out_names = op.input("Ids"), op.output("Outputs")
        graph_seam.remove_op(block, idx)
        at = idx
        for ids_name, out_name in zip(ids_names, out_names):
            ids = block.var(ids_name)
            t.ids_vars.append(ids_name)
            at = _insert_pull(block, at, ids, block.var(out_name), handle, t, version)
    missing = [p for p, t in by_param.items() if t.table is None]
    if missing:
        raise GpuEmbeddingError(
            f"no distributed_lookup_table for {missing} in the trainer program; Paddle's PS "
            "optimizer did not fuse their lookups as expected"
        )
    for idx in reversed(range(len(block.ops))):
        op = block.ops[idx]
        if op.type != "distributed_push_sparse" or int(op.attr("table_id")) not in by_table_id:
            continue
        t = by_table_id[int(op.attr("table_id"))]
        handle = block.var(_handle_name(t))
        ids_names, grad_names = op.input("Ids"), op.output("Outputs")  # the gradients (an output: scaled in place)
        graph_seam.remove_op(block, idx)
        for i, (ids_name, grad_name) in enumerate(zip(ids_names, grad_names)):
            hgrad = block.create_var(name=f"{_handle_name(t)}@GRAD.{i}", shape=[1], dtype="float32")
            # A custom grad op has no Python op proto (block._insert_op refuses it): build its desc the way
            # append_backward does, at the end of the block (the Python block can only sync appended descs;
            # every gradient is computed by then, where Paddle put the push it replaces).
            desc = block.desc.append_op()
            desc.set_type("heterps_pull_grad")
            desc.set_input("Ids", [ids_name])
            desc.set_input("Handle", [handle.name])
            desc.set_input("Out@GRAD", [grad_name])
            desc.set_output("Handle@GRAD", [hgrad.name])
            graph_seam.set_desc_str_attr(desc, "table", t.table.name)
            graph_seam.set_desc_str_attr(desc, "config", t.table.config_string)
            graph_seam.set_desc_int32_attr(desc, "op_role", 1)  # backward
        graph_seam.sync_with_cpp(block)
    sync = PassSync(tables)
    ctx = seam.context()
    ctx.pass_syncs[program] = sync
    ctx.dataset_hooks["gpu_embedding"] = pass_hook
    return sync


def _handle_name(t: GpuTable) -> str:
    return f"heterps_table_handle.{t.table.name}"


def _handle(program: Any, startup_programs: Iterable[Any], t: GpuTable) -> Any:
    """The op's float input (docs/sparse-table.md): a persistable [1] var initialised by the startup programs."""
    name = _handle_name(t)
    for startup in startup_programs:
        sblock = startup.global_block() if startup is not None else None
        if sblock is not None and not sblock.has_var(name):
            svar = sblock.create_var(name=name, shape=[1], dtype="float32", persistable=True)
            sblock.append_op(
                type="fill_constant", outputs={"Out": [svar]}, attrs={"shape": [1], "dtype": svar.dtype, "value": 0.0}
            )
    block = program.global_block()
    if block.has_var(name):
        return block.var(name)
    return block.create_var(name=name, shape=[1], dtype="float32", persistable=True)


def _insert_pull(block: Any, at: int, ids: Any, out: Any, handle: Any, t: GpuTable, version: str) -> int:
    """heterps_pull -> (reshape, for lookup_table v1's [.., 1] ids) -> (lod_reset, for LoD ids) -> out."""
    rows = block.create_var(name=f"{out.name}.heterps_rows", dtype="float32")
    graph_seam.insert_op(
        block,
        at,
        type="heterps_pull",
        inputs={"Ids": [ids], "Handle": [handle]},
        outputs={"Out": [rows]},
        attrs={"table": t.table.name, "config": t.table.config_string},
    )
    at += 1
    cur = rows
    if version == "lookup_table":  # v1 drops the ids' trailing 1: [.., 1] -> [.., dim]
        shaped = block.create_var(name=f"{out.name}.heterps_shaped", dtype="float32")
        xshape = block.create_var(name=f"{out.name}.heterps_xshape", dtype="float32")
        graph_seam.insert_op(
            block,
            at,
            type="reshape2",
            inputs={"X": [cur]},
            outputs={"Out": [shaped], "XShape": [xshape]},
            attrs={"shape": [0] * (len(ids.shape) - 1) + [t.dim]},
        )
        at += 1
        cur = shaped
    if getattr(ids, "lod_level", 0):
        graph_seam.insert_op(
            block,
            at,
            type="lod_reset",
            inputs={"X": [cur], "Y": [ids]},
            outputs={"Out": [out]},
            attrs={"append": False},
        )
    else:
        graph_seam.insert_op(block, at, type="assign", inputs={"X": [cur]}, outputs={"Out": [out]})
    return at + 1


# ---- the working set of a pass ------------------------------------------------------------------------------
_ids_cache: dict[tuple[str, int, int, tuple[int, ...]], npt.NDArray[np.int64]] = {}


def dataset_slots(dataset: Any) -> tuple[list[str], list[str]]:
    """(files, slot names in file order) of a Paddle dataset reading MultiSlot text with ``cat``."""
    desc = dataset.proto_desc
    pipe = desc.pipe_command.strip()
    if pipe != "cat":
        raise GpuEmbeddingError(
            f"embeddings on a GPU stage read each pass's ids from the dataset's files, which "
            f"needs MultiSlot text read with pipe_command='cat'; this dataset uses {pipe!r}"
        )
    slots = [s.name for s in desc.multi_slot_desc.slots]
    return list(getattr(dataset, "filelist", []) or []), slots


def working_set(files: Iterable[str], slot_order: list[str], wanted: list[str]) -> npt.NDArray[np.int64]:
    """Sorted unique int64 ids found in the ``wanted`` slots of MultiSlot text ``files``."""
    pos = [i for i, name in enumerate(slot_order) if name in set(wanted)]
    missing = set(wanted) - set(slot_order)
    if missing:
        raise GpuEmbeddingError(
            f"lookup ids {sorted(missing)} are not slots the dataset reads ({slot_order}): the "
            "pass's working set cannot be known"
        )
    parts: list[npt.NDArray[np.int64]] = []
    for path in files:
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_mtime_ns, st.st_size, tuple(pos))
        ids = _ids_cache.get(key)
        if ids is None:
            ids = _file_ids(path, pos, len(slot_order))
            _ids_cache[key] = ids
        parts.append(ids)
    return np.unique(np.concatenate(parts)) if parts else np.empty(0, np.int64)


def _file_ids(path: str, positions: list[int], nslots: int) -> npt.NDArray[np.int64]:
    want = set(positions)
    out: list[str] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            tok = line.split()
            if not tok:
                continue
            p = 0
            for i in range(nslots):
                try:
                    n = int(tok[p])
                except (IndexError, ValueError):
                    raise GpuEmbeddingError(f"{path}:{lineno}: not MultiSlot text with {nslots} slots") from None
                if i in want:
                    out.extend(tok[p + 1 : p + 1 + n])
                p += 1 + n
    return np.unique(np.array(out, dtype=np.int64)) if out else np.empty(0, np.int64)


# ---- per-pass exchange with the servers -------------------------------------------------------------------
class PassSync:
    """Pull the working set before a pass, push the deltas and re-pull after it (module doc)."""

    def __init__(self, tables: list[GpuTable]):
        self.tables = tables
        self.units = fleet.worker_num()
        self.unit = fleet.worker_index()
        self.barriers = 0
        self.passes = 0
        # Bounds the wait for the slowest unit's pass (and for a unit that died): a pass can be long.
        self.timeout = float(cast(float, settings.get("HETERPS_PASS_SYNC_TIMEOUT")))  # settings.get is typed object
        self.last: dict[str, dict[str, Any]] = {}  # param -> ids, start, trained (local), synced (servers, after)
        self._known: dict[str, npt.NDArray[np.int64]] = {t.param: np.empty(0, np.int64) for t in tables}
        self._progs: dict[str, tuple[Any, Any]] = {}
        # Paddle objects, built on first use (_ensure)
        self.worker: Any = None
        self.exe: Any = None
        self.scope: Any = None

    def _ensure(self) -> None:
        """Built on first use: fleet creates its PS runtime only after minimize, where this object is made."""
        if self.worker is not None:
            return
        self.worker = seam.worker_client(seam.fleet_runtime())
        self.exe = paddle.static.Executor(paddle.CPUPlace())
        self.scope = paddle.static.Scope()
        # A private name generator: names made here must not shift the names of what the script builds next
        # (servers do not build these programs).
        with paddle.utils.unique_name.guard():
            self._progs = {t.param: self._build_programs(t) for t in self.tables}

    # programs (built once; they run in a private scope holding only a [1, dim] stand-in for W, which the
    # distributed ops read for the embedding width)
    def _build_programs(self, t: GpuTable) -> tuple[Any, Any]:
        place = paddle.CPUPlace()
        self.scope.var(t.param).get_tensor().set(np.zeros((1, t.dim), np.float32), place)
        pull, push = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(pull, paddle.static.Program()):
            ids = paddle.static.data("heterps_ws_ids", [-1, 1], "int64", lod_level=1)
            blk = pull.global_block()
            w = blk.create_var(name=t.param, shape=[1, t.dim], dtype="float32", persistable=True)
            rows = blk.create_var(name="heterps_ws_rows", shape=[-1, t.dim], dtype="float32")
            blk.append_op(
                type="distributed_lookup_table",
                inputs={"Ids": [ids], "W": [w]},
                outputs={"Outputs": [rows]},
                attrs={
                    "is_distributed": True,
                    "padding_idx": -1,
                    "table_id": t.table_id,
                    "lookup_table_version": "lookup_table",
                    "is_test": False,
                },
            )
        with paddle.static.program_guard(push, paddle.static.Program()):
            ids = paddle.static.data("heterps_ws_ids", [-1, 1], "int64", lod_level=1)
            grad = paddle.static.data("heterps_ws_grad", [-1, t.dim], "float32")
            blk = push.global_block()
            w = blk.create_var(name=t.param, shape=[1, t.dim], dtype="float32", persistable=True)
            show = paddle.full([1], 1.0, "float32")
            clk = paddle.full([1], 0.0, "float32")
            blk.append_op(
                type="distributed_push_sparse",
                inputs={"Ids": [ids], "W": [w], "Outputs": [grad], "Shows": [show], "Clicks": [clk]},
                outputs={"Outputs": [grad]},
                attrs={
                    "is_distributed": True,
                    "padding_idx": -1,
                    "table_id": t.table_id,
                    "size": t.dim,
                    "use_cvm_op": False,
                    "slots": [0],
                },
            )
        return pull, push

    @staticmethod
    def _one_sequence(ids: npt.NDArray[np.int64]) -> Any:
        """Ids as one LoD sequence: Paddle's push multiplies gradients by the batch size, here 1."""
        return paddle.base.create_lod_tensor(ids.reshape(-1, 1), [[ids.size]], paddle.CPUPlace())

    def server_rows(self, t: GpuTable, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        self._ensure()
        if ids.size == 0:
            return np.empty((0, t.dim), np.float32)
        pull, _ = self._progs[t.param]
        out = self.exe.run(
            pull,
            feed={"heterps_ws_ids": self._one_sequence(ids)},
            fetch_list=["heterps_ws_rows"],
            scope=self.scope,
            return_numpy=False,
        )[0]  # rows carry the ids' LoD
        return np.asarray(out, np.float32).reshape(ids.size, t.dim)

    def push_to_servers(self, t: GpuTable, ids: npt.NDArray[np.int64], delta: npt.NDArray[np.floating[Any]]) -> None:
        """Servers' rows += delta (SGD with learning rate 1 on the gradient -delta)."""
        self._ensure()
        if ids.size == 0:
            return
        _, push = self._progs[t.param]
        self.exe.run(
            push,
            feed={
                "heterps_ws_ids": self._one_sequence(ids),
                "heterps_ws_grad": np.ascontiguousarray(-delta, np.float32),
            },
            scope=self.scope,
        )

    def barrier(self, what: str) -> None:
        """Every unit reaches the same barrier: a counter row on the servers (module doc)."""
        self._ensure()
        self.barriers += 1
        t = self.tables[0]
        key = np.array([SYNC_KEY], np.int64)
        step = np.zeros((1, t.dim), np.float32)
        step[0, 0] = SYNC_UNIT
        self.push_to_servers(t, key, step)
        push_queues.flush_until_empty(self.worker, f"unit {self.unit}: {what}")
        target = self.units * self.barriers
        deadline = time.monotonic() + self.timeout
        wait = 0.005
        while True:
            count = int(round(float(self.server_rows(t, key)[0, 0]) / SYNC_UNIT))
            if count >= target:
                return
            if time.monotonic() > deadline:
                raise GpuEmbeddingError(
                    f"unit {self.unit}: {what}: {count} of {target} unit arrivals after {self.timeout:.0f} s "
                    "(HETERPS_PASS_SYNC_TIMEOUT); every unit must run the same number of passes"
                )
            # Poll fast for units that arrive together, then back off: waiting units must not load the servers.
            wait = min(wait * 2, 0.2)
            time.sleep(wait)

    def begin(self, dataset: Any) -> None:
        files, slots = dataset_slots(dataset)
        for t in self.tables:
            ids = working_set(files, slots, t.ids_vars)
            if ids.size and ids[-1] == SYNC_KEY:
                raise GpuEmbeddingError(f"id {SYNC_KEY} is reserved by the pass barrier; it occurs in {files}")
            start = self.server_rows(t, ids)
            t.table.assign(ids, start)
            self._known[t.param] = np.union1d(self._known[t.param], ids)
            self.last[t.param] = {"ids": ids, "start": start}
        # Nobody trains (and pushes) before every unit holds the same start.
        self.barrier(f"pass {self.passes + 1} start")

    def end(self) -> None:
        for t in self.tables:
            rec = self.last[t.param]
            ids = rec["ids"]
            gpu_call("heterps_gpu_table_flush_to_host", t.table.bname)
            if len(t.table) != self._known[t.param].size:
                raise GpuEmbeddingError(
                    f"unit {self.unit}: table {t.param}: the pass trained {len(t.table)} rows but the working sets "
                    f"held {self._known[t.param].size} ids: some lookups read ids outside the dataset's slots"
                )
            trained = t.table.pull(ids)
            delta = trained - rec["start"]
            moved = np.any(delta != 0, axis=1)
            self.push_to_servers(t, ids[moved], delta[moved])
            rec.update(trained=trained, pushed=int(moved.sum()))
        # Every table's pushes sent before the barrier: a flush can return with a sparse push still queued
        # (runtime/push_queues.py), and the rows read back after the barrier would then miss it.
        push_queues.flush_until_empty(self.worker, f"unit {self.unit}: pass {self.passes + 1} end")
        self.barrier(f"pass {self.passes + 1} end")
        for t in self.tables:
            rec = self.last[t.param]
            synced = self.server_rows(t, rec["ids"])
            t.table.assign(rec["ids"], synced)
            rec["synced"] = synced
        self.passes += 1
        logger.info(
            "gpu embedding pass %d unit %d/%d: %s",
            self.passes,
            self.unit,
            self.units,
            ", ".join(f"{p}: {r['ids'].size} ids, {r['pushed']} rows pushed" for p, r in self.last.items()),
        )


def pass_sync(program: Any) -> PassSync | None:
    """The PassSync of a trainer program :func:`apply` rewrote in this process (None for any other program)."""
    sync: PassSync | None = seam.context().pass_syncs.get(program)
    return sync


@contextlib.contextmanager
def pass_hook(call: seam.DatasetCall) -> Iterator[None]:
    """A pass around each ``train_from_dataset`` of a program :func:`apply` rewrote (it has a PassSync)."""
    sync = pass_sync(call.main_program())
    if sync is None:
        yield
        return
    sync.begin(call.dataset)
    yield
    sync.end()
