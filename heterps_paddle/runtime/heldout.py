"""Held-out evaluation and train metrics of a split job on its CPU trainers.

A CPU trainer of a split plan holds only stage 1's section, so what a fleet script reads for evaluation would
be wrong there: its forward-only clone of the program is stage 1 alone, and the AUC state lives in the last
stage.  So, before the program is tagged and split, the whole model's forward pass and startup are cloned
(:func:`stash`); ``fleet.evaluation.forward_only_program`` of a section returns a copy of that clone; when it
runs through ``train_from_dataset`` (:func:`redirect_hook`) its lookups read the servers' sparse tables, the
persistable vars this process never made are created from the stashed startup, and every dense table is pulled
from the servers first, so the held-out AUC is the servers' model, as in the unsplit job.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator

import paddle
from paddle.base import core

from heterps_paddle import graph_seam
from heterps_paddle.log import logger
from heterps_paddle.runtime import push_queues, seam, stage_metrics
from heterps_paddle.runtime.dense_refresh import pull_dense_into


@dataclass
class HeldOut:
    forward: Any  # the whole model's forward program, cloned before the split
    startup: Any
    loss: str | None
    live: set[str] = field(default_factory=set)  # AUC states an evaluation pass has filled in this process
    logged: set[str] = field(default_factory=set)  # one-time log lines already printed
    converted: dict[int, Any] = field(default_factory=dict)  # id(whole forward copy) -> its servers' version
    sources: list[Any] = field(default_factory=list)  # the copies converted (their ids key ``converted``)
    # the whole forward programs handed out (``forward`` and its copies), known here rather than marked on them
    whole_forward: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)


def stash(program: Any, startup: Any, loss: Any) -> HeldOut:
    """Called before the program is tagged and split (forward ops only at that point)."""
    forward = program.clone(for_test=True)
    held = HeldOut(forward=forward, startup=startup.clone(), loss=getattr(loss, "name", None))
    held.whole_forward.add(forward)
    return held


def whole_forward_program(held: HeldOut) -> Any:
    """A fresh forward-only copy of the whole (pre-split) model, for held-out evaluation."""
    program = held.forward.clone(for_test=True)
    held.whole_forward.add(program)
    return program


def is_whole_forward(held: HeldOut, program: Any) -> bool:
    """Whether ``program`` is the whole forward program or one of the copies :func:`whole_forward_program` made."""
    return program is not None and program in held.whole_forward


def _log_once(held: HeldOut, key: str, message: str) -> None:
    if key not in held.logged:
        held.logged.add(key)
        logger.info("%s", message)


def train_auc_is_elsewhere(held: HeldOut, scope: Any, auc_states: list[Any]) -> bool:
    """On a CPU trainer of a split job the AUC ops run in the last stage's section: the state vars in its global
    scope hold nothing until a pass carried the last stage's counts into them (runtime/stage_metrics.py) or an
    evaluation pass of the whole forward program filled them."""
    if scope is not paddle.static.global_scope():
        return False
    if all(s.name in held.live for s in auc_states):
        return False
    _log_once(
        held,
        "auc",
        "train AUC is not computed on a stage 1 CPU trainer of a split plan (the AUC ops are in "
        "the last stage's section): printed here as nan; the last stage's heterogeneous trainer "
        "prints the train loss and AUC in its log (heterlog.*)",
    )
    return True


def section_fetch(held: HeldOut, program: Any, fetch_list: Any, fetch_info: Any) -> tuple[Any, Any]:
    """The fetch vars this section has (in any of its blocks); the others are dropped, with a log line once."""
    if not fetch_list:
        return fetch_list, fetch_info
    names = {n for blk in program.blocks for n in blk.vars}
    keep, info, dropped = [], [], []
    for i, var in enumerate(fetch_list):
        name = var if isinstance(var, str) else var.name
        if name in names:
            keep.append(var)
            if fetch_info:
                info.append(fetch_info[i])
        else:
            dropped.append(name)
    if dropped:
        _log_once(
            held,
            "fetch",
            f"fetch vars {dropped} are computed by the last stage of the split plan, not by this section: "
            "printed here from the last stage's figures (runtime/stage_metrics.py), and in its own log",
        )
    return (keep or None), (info or None)


def sparse_table_ids(runtime: Any) -> dict[str, int]:
    ids = {}
    for ctx in seam.send_contexts(runtime).values():
        if ctx.is_sparse():
            for grad in ctx.origin_varnames():
                ids[grad.split("@GRAD")[0]] = ctx.table_id()
    return ids


def distributed_eval_program(test_program: Any, runtime: Any) -> Any:
    """A forward-only copy whose lookups read the servers' sparse tables (distributed_lookup_table)."""
    program = test_program.clone(for_test=True)
    block = program.global_block()
    table_ids = sparse_table_ids(runtime)
    for idx in reversed(range(len(block.ops))):
        op = block.ops[idx]
        if op.type not in ("lookup_table", "lookup_table_v2") or not op.attr("remote_prefetch"):
            continue
        w = op.input("W")[0]
        attrs = {
            "is_distributed": op.attr("is_distributed"),
            "padding_idx": op.attr("padding_idx"),
            "table_id": table_ids[w],
            "lookup_table_version": op.type,
        }
        ids, out = op.input("Ids")[0], op.output("Out")[0]
        graph_seam.remove_op(block, idx)
        graph_seam.insert_op(
            block,
            idx,
            type="distributed_lookup_table",
            inputs={"Ids": [block.var(ids)], "W": [block.var(w)]},
            outputs={"Outputs": [block.var(out)]},
            attrs=attrs,
        )
    return program


def materialise(held: HeldOut, executor: Any, program: Any, scope: Any) -> list[str]:
    """Create, in ``scope``, the persistable dense vars of ``program`` that this process's section never made
    (the later stages' parameters, the AUC states), initialised by the whole model's startup program."""
    missing = []
    for blk in program.blocks:
        for name, var in blk.vars.items():
            # Dense tensors only: the sparse table (SELECTED_ROWS) stays on the servers, the lookups read it.
            if not var.persistable or var.type != core.VarDesc.VarType.LOD_TENSOR:
                continue
            found = scope.find_var(name)
            if found is None:
                missing.append(name)
                continue
            try:
                if not graph_seam.is_initialized(found.get_tensor()):
                    missing.append(name)
            except ValueError:  # the scope holds another kind of variable under this name: leave it
                pass
    if not missing:
        return []
    startup = held.startup.clone()
    # Initialise only what is missing: the full startup also initialises the sparse table's local copy.
    block = startup.global_block()
    for idx in reversed(range(len(block.ops))):
        if not set(block.ops[idx].output_arg_names) & set(missing):
            graph_seam.remove_op(block, idx, sync=False)
    graph_seam.sync_with_cpp(startup)
    scratch = paddle.static.Scope()
    with paddle.static.scope_guard(scratch):
        executor.run(startup)
    made = []
    for name in missing:
        source = scratch.find_var(name)
        if source is None or not graph_seam.is_initialized(source.get_tensor()):
            continue  # e.g. a var no startup op writes; the forward pass writes it first
        scope.var(name).get_tensor().set(source.get_tensor(), paddle.CPUPlace())
        made.append(name)
    return made


def whole_model_from_servers(
    held: HeldOut, executor: Any, program: Any, scope: Any, runtime: Any
) -> tuple[list[str], list[str]]:
    """``program``'s persistable dense vars made in ``scope`` and every dense table pulled into them, once every
    push to the servers (this process's, the heterogeneous trainers') has been answered: with one batch per epoch
    the last batch's dense push was still queued when a pull ran.  Returns (made, pulled) names."""
    made = materialise(held, executor, program, scope)
    push_queues.flush_pushes(runtime, "before pulling the whole model")
    stage_metrics.flush_heterogeneous_trainers()
    return made, pull_dense_into(scope, runtime)


def servers_model_program(held: HeldOut, executor: Any, program: Any, scope: Any) -> Any:
    """The program that runs the whole forward ``program`` with the servers' model: its lookups read the servers'
    sparse tables, the vars this process's section never made are created in ``scope``, and every dense table
    is pulled from the servers into it first."""
    runtime = seam.fleet_runtime()
    converted = held.converted.get(id(program))
    if converted is None:
        # Deferred to here: the lookups' table ids come from the runtime's send context (init_worker).
        converted = distributed_eval_program(program, runtime)
        held.converted[id(program)] = converted
        held.sources.append(program)  # keeps id(program) from being reused while the entry exists
    made, pulled = whole_model_from_servers(held, executor, converted, scope, runtime)
    for op in (op for blk in converted.blocks for op in blk.ops if op.type == "auc"):
        held.live.update(op.output("StatPosOut") + op.output("StatNegOut"))
    _log_once(
        held,
        "heldout",
        "held-out evaluation of the whole model (forward program from before the split): "
        f"{len(made)} vars created here, {len(pulled)} dense vars pulled from the servers, sparse rows read from "
        "the servers' tables",
    )
    return converted


@contextlib.contextmanager
def redirect_hook(call: seam.DatasetCall) -> Iterator[None]:
    """``train_from_dataset`` of the whole forward program: run with the servers' parameters (module doc)."""
    held = seam.context().heldout
    if held is None or not is_whole_forward(held, call.program):
        yield
        return
    scope = call.scope if call.scope is not None else paddle.static.global_scope()
    call.program, call.scope = servers_model_program(held, call.executor, call.program, scope), scope
    yield


def run_redirect(executor: Any, program: Any, scope: Any) -> Any:
    """``Executor.run`` of the whole forward program (e.g. predictions of ``forward_only_program``): the same."""
    held = seam.context().heldout
    if held is None or not is_whole_forward(held, program):
        return program
    return servers_model_program(held, executor, program, paddle.static.global_scope() if scope is None else scope)
