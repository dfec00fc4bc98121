"""Paddle 2.6.2's heterogeneous PS program builder, made to work and to save exactly (no installed file is changed).

Paddle builds a heter job's programs in ``ps/utils/ps_program_builder.py: HeterAsyncPsProgramBuilder``
with passes from ``passes/ps_trainer_pass.py``.  As shipped it does not run, and once made to run it does
not learn (see docs/sections.md and docs/paddle-notes.md).  ``FixedHeterProgramBuilder``
replaces it (runtime/patches.py points Paddle's builder factory at it) and differs in exactly these places:

1. ``SplitTrainerOpsPass._remove_var_pair_by_grad`` reads ``merged_*_pairs`` as flat lists; they hold one
   list per program.                                                   -> ``_FixedSplitTrainerOpsPass``
2. Both split passes build the section program and then drop it (they rebind a local name).
                                                                       -> the split program is kept
3. The builder never switches the default programs and applies ``set_heter_pipeline_opt_pass`` to the
   unsplit clone.                                                      -> switched; applied to the section
4. No sparse push: ``DistributedOpsPass._get_pull_sparse_ops`` keys pull ops as ``param + Ids[0][0]`` in
   heter mode but grad ops as ``param``.                               -> ``_FixedDistributedOpsPass``
   Follow-ups: the now dangling ``sum`` of never-written ``W@GRAD@RENAME`` vars is removed, and the
   ``slots`` attribute that ``create_backward_block`` loses is restored.
5. Dense parameters of a heterogeneous section are never pulled back from the servers: ``send`` with
   ``is_sparse == 0`` pushes through ``FleetWrapper::PushDenseVarsAsync`` behind the Communicator's back,
   and the Communicator's recv thread only pulls after sends it saw.  Default: a pull thread per
   section (runtime.DenseRefresher, started around train_from_dataset).  Alternative
   (HETERPS_DENSE_REFRESH=communicator): dense ``send`` ops are re-marked ``is_sparse = 1`` so they go
   through ``Communicator::Send`` and its recv thread pulls.          -> ``_route_dense_sends``
6. A heterogeneous section's dense ``send`` ops come after its backward ``send_and_recv``, so the first stage can
   end its pass, and a save pull the servers' tables, before the last micro-batch's dense push is even queued.
                                                                       -> ``_push_before_backward_message``

Every fix checks the shape of what it fixes and raises ``PaddleBehaviourChanged`` when Paddle does not
look as expected, so a different Paddle fails loudly at ``minimize`` instead of training silently wrong.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import paddle
from paddle import base
from paddle.distributed.fleet.base.private_helper_function import wait_server_ready
from paddle.distributed.passes import new_pass
from paddle.distributed.passes.ps_trainer_pass import (
    DistributedOpsPass,
    SplitHeterWorkerOpsPass,
    SplitTrainerOpsPass,
)
from paddle.distributed.ps.utils.ps_program_builder import HeterAsyncPsProgramBuilder
from paddle.distributed.ps.utils.public import (
    SPARSE_GRAD_OP_TYPE_DICT,
    find_block_joints,
    find_heter_ops,
    union_forward_gradient_op,
)

from heterps_paddle import graph_seam, settings
from heterps_paddle.log import logger
from heterps_paddle.runtime import first_send
from heterps_paddle.runtime.seam import PaddleBehaviourChanged, context

SECTION_PROGRAM_KEY = "heterps_section_program"
PUSH_SLOTS_KEY = "heterps_push_sparse_slots"


def _run_pass(pass_obj: Any, attrs: dict[str, Any], mains: list[Any], startups: list[Any], ctx: Any) -> None:
    for k, v in attrs.items():
        pass_obj.set_attr(k, v)
    pass_obj.apply(mains, startups, ctx)


# Paddle ships no type information, so its pass and builder classes are Any to mypy (subclassing-any); the
# unused-ignore code keeps these quiet under a configuration without that check.
class _FixedDistributedOpsPass(DistributedOpsPass):  # type: ignore[misc, unused-ignore]
    """Fix 4: key sparse grad ops like their pull ops, so the push is fused into distributed_push_sparse."""

    def _get_pull_sparse_ops(self, _program: Any, attrs: dict[str, Any]) -> tuple[Any, Any, Any]:
        pull, push, use_cvm = super()._get_pull_sparse_ops(_program, attrs)
        if not (attrs["is_heter_ps_mode"] and not attrs["is_fl_ps_mode"]):
            return pull, push, use_cvm
        pull_ids = {key: [op.input("Ids")[0] for op in ops] for key, ops in pull.items()}
        fixed: dict[str, list[Any]] = {}
        for op in _program.global_block().ops:
            if op.type not in SPARSE_GRAD_OP_TYPE_DICT:
                continue
            ids = op.input("Ids")[0]
            # Same key as the pull side (Paddle's "trick for matchnet": param + first char of the ids var).
            key = op.input(SPARSE_GRAD_OP_TYPE_DICT[op.type])[0] + ids[0]
            if key in pull_ids and ids in pull_ids[key]:
                fixed.setdefault(key, []).append(op)
        if pull and not fixed and not push:
            has_grads = any(op.type in SPARSE_GRAD_OP_TYPE_DICT for op in _program.global_block().ops)
            if has_grads:
                raise PaddleBehaviourChanged(
                    "heterps: sparse grad ops exist but none matches a pull op under Paddle 2.6.2's heter key "
                    f"(param + Ids[0][0]); pull keys were {sorted(pull)}. Paddle's distributed_ops_pass changed."
                )
        return pull, (push or fixed), use_cvm

    def _apply_single_impl(self, main_program: Any, startup_program: Any, pass_ctx: Any) -> None:
        pull, push, _ = self._get_pull_sparse_ops(main_program, pass_ctx._attrs)
        # Remember each push's slots: create_backward_block drops the attribute (follow-up of fix 4).
        slots = {}
        for ops in push.values():
            slots[tuple(op.input("Ids")[0] for op in ops)] = [
                op.attr("slot") if op.has_attr("slot") else 0 for op in ops
            ]
        pass_ctx._attrs[PUSH_SLOTS_KEY] = slots
        super()._apply_single_impl(main_program, startup_program, pass_ctx)
        if pass_ctx._attrs["is_heter_ps_mode"]:
            n_push = sum(op.type == "distributed_push_sparse" for op in main_program.global_block().ops)
            if push and n_push == 0:
                raise PaddleBehaviourChanged(
                    "heterps: sparse push ops were found but no distributed_push_sparse "
                    "was generated; Paddle's _push_sparse_fuse changed."
                )
            _remove_dangling_sums(main_program.global_block())


def _remove_dangling_sums(block: Any) -> int:
    """Drop ``sum`` ops none of whose inputs is written by any op (grads of lookups fused away by fix 4).

    Left in, find_block_joints counts their inputs as section inputs and the next stage's backward
    send_and_recv asks for tensors nobody produced ("Tensor not initialized").
    """
    written = set()
    for op in block.ops:
        written.update(op.output_arg_names)
    doomed = []
    for idx, op in enumerate(block.ops):
        ins = op.input_arg_names
        if op.type == "sum" and ins and all("@GRAD" in n and n not in written for n in ins):
            doomed.append(idx)
    for idx in reversed(doomed):
        block._remove_op(idx)
    return len(doomed)


class _FixedSplitTrainerOpsPass(SplitTrainerOpsPass):  # type: ignore[misc, unused-ignore]  # Paddle is Any
    def _remove_var_pair_by_grad(self, var_name: str, attrs: dict[str, Any]) -> None:
        # Fix 1: one list of (param, grad) pairs per program, not a flat list.
        for key in ("merged_variables_pairs", "merged_dense_pairs", "merged_sparse_pairs"):
            per_program = attrs[key]
            if not isinstance(per_program, list) or any(not isinstance(p, list) for p in per_program):
                raise PaddleBehaviourChanged(f"heterps: attrs[{key!r}] is no longer a list of per-program lists")
            for pairs in per_program:
                pairs[:] = [p for p in pairs if p[1].merged_var.name != var_name]

    def _apply_single_impl(self, main_program: Any, startup_program: Any, pass_ctx: Any) -> None:
        attrs = pass_ctx._attrs
        program, heter_ops, _, program_block_ops = find_heter_ops(main_program, "cpu")
        program_block_ops = union_forward_gradient_op(program_block_ops)
        block_vars_detail = find_block_joints(program, program_block_ops, heter_ops)
        trainer_program = program.clone()
        self._create_trainer_program(trainer_program, program, attrs, program_block_ops, block_vars_detail)
        attrs[SECTION_PROGRAM_KEY] = trainer_program  # fix 2: keep what was built


class _FixedSplitHeterWorkerOpsPass(SplitHeterWorkerOpsPass):  # type: ignore[misc, unused-ignore]  # Paddle is Any
    def _apply_single_impl(self, main_program: Any, startup_program: Any, pass_ctx: Any) -> None:
        attrs = pass_ctx._attrs
        program, heter_ops, _, program_block_ops = find_heter_ops(main_program, "cpu")
        if not heter_ops:
            raise PaddleBehaviourChanged("heterps: no heterogeneous ops found in a heter worker's program")
        program_block_ops = union_forward_gradient_op(program_block_ops)
        block_vars_detail = find_block_joints(program, program_block_ops, heter_ops)
        heter_program = paddle.framework.Program()
        self._create_heter_program(program, attrs, heter_program, program_block_ops, heter_ops, block_vars_detail)
        attrs[SECTION_PROGRAM_KEY] = heter_program  # fix 2


def _fill_untagged_ops(block: Any) -> int:
    """Ops added without a device (the loss-grad fill_constant, sends, ...) take the previous op's tag.

    Program order is stage 1..N forward then N..1 backward, so the previous op is in the same section;
    an untagged op would otherwise read as ``cpu`` and cut a heterogeneous section in two.
    """
    prev = "cpu"
    filled = 0
    for op in block.ops:
        dev = op.attr("op_device") if op.has_attr("op_device") else ""
        if not dev:
            op._set_attr("op_device", prev)
            filled += 1
        else:
            prev = dev.split(":")[0]
    return filled


def _restore_push_slots(program: Any, slots_by_ids: dict[tuple[str, ...], list[int]]) -> None:
    for block in program.blocks:
        for op in block.ops:
            if op.type != "distributed_push_sparse":
                continue
            ids = tuple(op.input("Ids"))
            if list(op.attr("slots")) != [] and len(op.attr("slots")) == len(ids):
                continue
            op._set_attr("slots", slots_by_ids.get(ids, [0] * len(ids)))


def _route_dense_sends(program: Any) -> int:
    """Fix 5: dense grads go through Communicator::Send, so its recv thread pulls the dense tables back."""
    n = 0
    for block in program.blocks:
        for op in block.ops:
            if _is_dense_push(op):
                op._set_attr("is_sparse", 1)
                n += 1
    return n


def _is_dense_push(op: Any) -> bool:
    """A section's dense ``send`` (the step counter's send has no inputs: not a push of gradients)."""
    return bool(op.type == "send" and op.has_attr("is_sparse") and op.attr("is_sparse") == 0 and op.input_arg_names)


def _push_before_backward_message(program: Any) -> int:
    """Fix 6: a heterogeneous section queues its dense pushes before it sends the previous stage its backward message.

    Paddle appends the dense ``send`` ops after the backward ``send_and_recv``, so the previous stage could end its
    pass (its last backward message received), flush every client and pull the servers' tables before this section
    had queued its last micro-batch's dense push: a save then missed it (docs/sections.md).  Moved ahead, by the
    time the first stage holds its last backward message every later stage's pushes are in their clients' queues,
    which the flushes before a save empty (runtime/push_queues.py).  Nothing between them depends on the other:
    the sends read parameter gradients, the message carries the boundary's.  Returns how many sends moved."""
    moved = 0
    for block in program.blocks:
        ops = list(block.ops)
        messages = [i for i, op in enumerate(ops) if op.type == "send_and_recv" and op.attr("mode") == "backward"]
        if not messages:
            continue
        if len(messages) > 1:
            raise PaddleBehaviourChanged(
                f"heterps: block {block.idx} of a heterogeneous section sends {len(messages)} backward messages "
                "(send_and_recv, mode backward); Paddle 2.6.2's split gives each section one"
            )
        at = messages[0]
        late = [op for op in ops[at + 1 :] if _is_dense_push(op)]
        for op in late:
            graph_seam.insert_op(
                block,
                at,
                type=op.type,
                inputs={name: [block._var_recursive(v) for v in op.input(name)] for name in op.input_names},
                outputs={name: [block._var_recursive(v) for v in op.output(name)] for name in op.output_names},
                attrs=op.all_attrs(),
            )
            at += 1
            graph_seam.remove_op(block, list(block.ops).index(op))
            moved += 1
        after = list(block.ops)[at + 1 :]
        if block.ops[at].type != "send_and_recv" or any(_is_dense_push(op) for op in after):
            raise PaddleBehaviourChanged(f"heterps: the dense sends of block {block.idx} could not be moved")
    return moved


def _retag_for_place(program: Any, device_type: str) -> None:
    """Split tags are markers; ops run on the device of the process that holds the section."""
    dev = "gpu" if device_type.lower() == "gpu" else "cpu"
    for block in program.blocks:
        for op in block.ops:
            if op.has_attr("op_device") and op.attr("op_device").split(":")[0] in ("gpu", "xpu"):
                op._set_attr("op_device", dev)


def device_runs(program: Any) -> list[tuple[str, int, list[str]]]:
    """(device, op count, op types) of each run of ops Paddle's splitter cuts block 0 into."""
    _, _, _, blocks = find_heter_ops(program.clone(), "cpu")
    return [(ops[0].attr("op_device") if ops else "", len(ops), [op.type for op in ops]) for ops in blocks]


def section_summary(program: Any) -> str:
    """What a section does with the servers and its neighbours (logged; the tests read it)."""
    types = Counter(op.type for blk in program.blocks for op in blk.ops)
    push = [op for blk in program.blocks for op in blk.ops if op.type == "distributed_push_sparse"]
    sends = sorted(
        name for blk in program.blocks for op in blk.ops if op.type == "send" for name in op.attr("send_varnames")
    )
    return (
        f"{sum(types.values())} ops; lookups={types['distributed_lookup_table']} "
        f"sparse_pushes={len(push)} (slots {[list(op.attr('slots')) for op in push]}) "
        f"dense_sends={sends} send_and_recv={types['send_and_recv']} "
        f"listen={types['heter_listen_and_serv']}"
    )


class FixedHeterProgramBuilder(HeterAsyncPsProgramBuilder):  # type: ignore[misc, unused-ignore]  # Paddle is Any
    cloned_main: Any  # set by Paddle's builder (an annotation only: no class attribute)

    def _build_trainer_programs(self) -> None:
        a, ctx = self.attrs, self.pass_ctx
        new_pass("add_lr_decay_table_pass", a).apply([], [], ctx)
        _run_pass(_FixedDistributedOpsPass(), a, [self.cloned_main], [None], ctx)
        new_pass("delete_optimizer_pass", a).apply([self.cloned_main], [None], ctx)
        new_pass("append_send_ops_pass", a).apply([self.cloned_main], [None], ctx)
        new_pass("delete_extra_optimizer_pass", a).apply([a["origin_main_program"]], [self.cloned_startup], ctx)
        new_pass("fake_init_ops_pass", a).apply([None], [self.cloned_startup], ctx)

        _fill_untagged_ops(self.cloned_main.global_block())
        runs = device_runs(self.cloned_main)
        plan = context().plan
        want = plan.num_stages if plan is not None else int(a["role_maker"]._get_num_stage())
        if len(runs) != 2 * want - 1:
            raise PaddleBehaviourChanged(
                f"heterps: Paddle's splitter cuts the program into {len(runs)} runs of ops, but a plan of {want} "
                f"stages needs {2 * want - 1} (forward 1..N, then backward N-1..1); runs: "
                + "; ".join(f"{d} x{n}: {t[:3]}..{t[-3:]}" for d, n, t in runs)
            )

        split_cls = _FixedSplitHeterWorkerOpsPass if self.is_heter_worker else _FixedSplitTrainerOpsPass
        a.pop(SECTION_PROGRAM_KEY, None)
        _run_pass(split_cls(), a, [self.cloned_main], [None], ctx)
        section = a.get(SECTION_PROGRAM_KEY)
        if section is None:
            raise PaddleBehaviourChanged("heterps: the split pass produced no section program")
        _restore_push_slots(section, a.get(PUSH_SLOTS_KEY, {}))
        if settings.get("HETERPS_DENSE_REFRESH") == "communicator":
            _route_dense_sends(section)
        moved = 0
        if self.is_heter_worker:
            moved = _push_before_backward_message(section)
            _retag_for_place(section, a["role_maker"]._heter_device_type())
        first_send.install(section, context(), float(cast(float, settings.get("HETERPS_STARTUP_TIMEOUT"))))
        self.cloned_main = section
        a["cloned_main"] = section
        logger.info(
            "section of stage %s: %s; dense sends moved ahead of the backward message: %d",
            a["role_maker"]._get_stage_id(),
            section_summary(section),
            moved,
        )

        # Fix 3: the pipeline options go on the section program and the startup program that will run.
        new_pass("set_heter_pipeline_opt_pass", a).apply([self.cloned_main], [self.cloned_startup], ctx)
        if self.launch_barrier and self.launch_barrier_flag:
            wait_server_ready(self.server_endpoints)

    def _build_programs(self) -> None:
        if self.attrs["is_worker"] or self.attrs["is_heter_worker"]:
            self._build_trainer_programs()
            base.framework.switch_startup_program(self.cloned_startup)
            paddle.framework.switch_main_program(self.cloned_main)
            # fleet switches the default main program to loss.block.program after minimize.
            self.loss.block.program = self.cloned_main
        elif self.attrs["is_server"]:
            self._build_pserver_programs()
            self.loss.block.program = self.attrs["_main_server"]
            base.framework.switch_startup_program(self.attrs["_startup_server"])
