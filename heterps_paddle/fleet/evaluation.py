"""Held-out evaluation of a static parameter-server training program (what a fleet script calls).

Two Paddle 2.6.2 facts shape this module:
- ``Program.clone(for_test=True)`` of a PS worker program keeps the sparse push (``distributed_push_sparse``,
  tagged as a forward op by Paddle's pass) and the dense ``send`` ops; running them without a backward pass
  crashes the worker ("Tensor holds no memory").  So the evaluation program also drops every op that talks back
  to the servers.
- ``train_from_dataset`` runs the program in per-thread child scopes: the AUC output is not visible afterwards,
  but its persistable histograms are, so AUC is computed from them.

On a CPU trainer of a split plan the program holds stage 1 only; the whole model's forward pass is used instead,
with the servers' parameters (runtime/heldout.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle

from heterps_paddle import graph_seam
from heterps_paddle.data.metrics import auc_from_histograms
from heterps_paddle.runtime import seam
from heterps_paddle.runtime.heldout import train_auc_is_elsewhere, whole_forward_program

# Ops that write to the parameter servers (or wait on them after a write).
PS_WRITE_OPS = frozenset(
    {
        "distributed_push_sparse",
        "push_sparse",
        "push_sparse_v2",
        "push_dense",
        "send",
        "send_barrier",
        "fetch_barrier",
        "send_and_recv",
    }
)


def forward_only_program(program: Any) -> Any:
    """A copy of ``program`` that computes the forward pass and metrics and changes no parameter.

    For a section of a split plan (``program`` holds only this stage's layers) it is the whole model's forward
    pass, cloned before the split; when it runs with ``train_from_dataset`` its lookups read the servers' tables
    and the dense parameters are pulled from the servers first, so it evaluates the servers' model, as the unsplit
    job's evaluation does.
    """
    held = seam.context().heldout
    if held is not None and seam.is_heter_section(program):
        return whole_forward_program(held)
    test_program = program.clone(for_test=True)
    block = test_program.global_block()
    for index in reversed(range(len(block.ops))):
        if block.ops[index].type in PS_WRITE_OPS:
            graph_seam.remove_op(block, index, sync=False)
    graph_seam.sync_with_cpp(test_program)
    return test_program


def reset_auc(scope: Any, auc_states: list[Any]) -> None:
    """Zero AUC accumulators, so the next pass measures only its own batches."""
    for state in auc_states:
        var = scope.find_var(state.name)
        if var is None:
            # A stage 1 CPU trainer of a split plan has no AUC vars until the held-out pass creates them (zeroed)
            # from the whole model's startup program (runtime/heldout.py).
            continue
        tensor = var.get_tensor()
        if not graph_seam.is_initialized(tensor):
            continue
        tensor.set(np.zeros(tensor.shape(), dtype=np.array(tensor).dtype), paddle.CPUPlace())


def accumulated_auc(scope: Any, auc_states: list[Any]) -> float:
    """AUC over every batch since the last reset; ``auc_states`` as paddle.static.auc returns them (the
    accumulated positive / negative histograms are the last two).

    nan on a stage 1 CPU trainer of a split plan before a held-out pass: the AUC ops run in the last stage's
    section there, which prints the train AUC in its own log."""
    held = seam.context().heldout
    # the states it reads, the accumulated ones: a split's CPU trainers are sent those, not a sliding window's
    accumulated = auc_states[-2:]
    if held is not None and seam.context().role == "trainer" and train_auc_is_elsewhere(held, scope, accumulated):
        return float("nan")
    stat_pos, stat_neg = (np.array(scope.find_var(s.name).get_tensor()) for s in accumulated)
    return auc_from_histograms(stat_pos, stat_neg)
