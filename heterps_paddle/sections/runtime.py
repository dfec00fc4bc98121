"""What a fleet script needs around a sectioned job: preparing minimize, the heter workers' dataset,
held-out evaluation from the servers' parameters.

Imports Paddle (only used inside launched processes).
"""

from __future__ import annotations

import os

import numpy as np
import paddle

from .partition import tag_program
from .plan import SectionPlan

# Communicator settings under which routing dense grads through Communicator::Send (fix 5) ran near the
# speed of plain async PS (notes/paddle-2.6.2.md); defaults made it ~7x slower. Only defaults: a user's
# own FLAGS_* environment wins.
COMMUNICATOR_ENV_DEFAULTS = {
    "FLAGS_communicator_send_queue_size": "16",
    "FLAGS_communicator_max_merge_var_num": "16",
    "FLAGS_communicator_send_wait_times": "1",
    "FLAGS_communicator_thread_pool_size": "8",
}


def prepare_sections(program, plan: SectionPlan, strategy) -> dict[str, int]:
    """Called from HeterPSOptimizer.minimize_impl before backward: tag ops, install the fixed builder."""
    from . import paddle_fixes

    layer_stage = tag_program(program, plan)
    paddle_fixes.install()
    paddle_fixes.FixedHeterProgramBuilder.expected_stages = plan.num_stages
    for k, v in COMMUNICATOR_ENV_DEFAULTS.items():
        os.environ.setdefault(k, v)  # read by TrainerRuntimeConfig inside the PS optimizer's minimize
    return layer_stage


def role() -> str:
    """'server' | 'trainer' | 'heter' from the launcher's environment."""
    r = os.environ.get("TRAINING_ROLE", "TRAINER")
    return {"PSERVER": "server", "HETER_TRAINER": "heter"}.get(r, "trainer")


def stage_id() -> int:
    return int(os.environ.get("STAGE_ID", "1"))


def heter_worker_dataset(program=None):
    """A one-slot QueueDataset for heterogeneous trainers.

    They read no data (micro-batches arrive from the previous stage), but the pipeline options Paddle
    sets (``is_fl_mode``) make ``train_from_dataset`` require a dataset object; its slot description
    must be valid or the data feed refuses to initialise.
    """
    program = program or paddle.static.default_main_program()
    block = program.global_block()
    name = "heterps_dummy_slot"
    var = block.vars.get(name) or block.create_var(name=name, shape=[-1, 1], dtype="int64", lod_level=1)
    ds = paddle.distributed.QueueDataset()
    ds.init(batch_size=1, thread_num=1, use_var=[var], pipe_command="cat")
    ds.set_filelist([])
    return ds


def _sparse_table_ids(runtime) -> dict[str, int]:
    ids = {}
    for ctx in runtime._send_ctx.values():
        if ctx.is_sparse():
            for grad in ctx.origin_varnames():
                ids[grad.split("@GRAD")[0]] = ctx.table_id()
    return ids


def distributed_eval_program(test_program, runtime):
    """A forward-only copy whose lookups read the servers' sparse tables (distributed_lookup_table)."""
    prog = test_program.clone(for_test=True)
    block = prog.global_block()
    table_ids = _sparse_table_ids(runtime)
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
        block._remove_op(idx)
        block._insert_op(idx, type="distributed_lookup_table",
                         inputs={"Ids": [block.var(ids)], "W": [block.var(w)]},
                         outputs={"Outputs": [block.var(out)]}, attrs=attrs)
    return prog


def pull_dense_into(scope, runtime) -> list[str]:
    """Copy every dense table from the servers into ``scope`` (its vars must exist there)."""
    from paddle.distributed.ps.utils.public import get_the_one_recv_context

    dense_map = get_the_one_recv_context(runtime.context, split_dense_table=runtime.is_heter_ps_mode)
    names = []
    for table_id, var_names in dense_map.items():
        runtime._worker.pull_dense_params(scope, table_id, var_names)
        names.extend(var_names)
    return names


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Rank AUC (ties averaged)."""
    labels = np.asarray(labels).reshape(-1)
    scores = np.asarray(scores).reshape(-1)
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    s = scores[order]
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1
        i = j + 1
    pos = labels == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))
