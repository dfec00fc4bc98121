"""Held-out evaluation of a static (PS) training program.

Two Paddle 2.6.2 facts shape this module:
- ``Program.clone(for_test=True)`` of a PS worker program keeps the sparse push
  (``distributed_push_sparse``, tagged as a forward op by Paddle's pass) and the dense ``send`` ops;
  running them without a backward pass crashes the worker ("Tensor holds no memory").  So the
  evaluation program also drops every op that talks back to the servers.
- ``train_from_dataset`` runs the program in per-thread child scopes: the AUC output is not visible
  afterwards, but its persistable histograms are, so AUC is computed from them.
"""

from __future__ import annotations

import numpy as np

from .metrics import auc_from_histograms

# Ops that write to the parameter servers (or wait on them after a write).
PS_WRITE_OPS = frozenset({"distributed_push_sparse", "push_sparse", "push_sparse_v2", "push_dense", "send",
                          "send_barrier", "fetch_barrier", "send_and_recv"})


def forward_only_program(program):
    """A copy of ``program`` that computes the forward pass and metrics and changes no parameter."""
    test_program = program.clone(for_test=True)
    block = test_program.global_block()
    for index in reversed(range(len(block.ops))):
        if block.ops[index].type in PS_WRITE_OPS:
            block._remove_op(index, sync=False)
    test_program._sync_with_cpp()
    return test_program


def reset_auc(scope, auc_states) -> None:
    """Zero AUC accumulators, so the next pass measures only its own batches."""
    import paddle

    for state in auc_states:
        tensor = scope.find_var(state.name).get_tensor()
        tensor.set(np.zeros(tensor.shape(), dtype=np.array(tensor).dtype), paddle.CPUPlace())


def accumulated_auc(scope, auc_states) -> float:
    """AUC over every batch since the last reset; ``auc_states`` as paddle.static.auc returns them
    (the accumulated positive / negative histograms are the last two)."""
    stat_pos, stat_neg = (np.array(scope.find_var(s.name).get_tensor()) for s in auc_states[-2:])
    return auc_from_histograms(stat_pos, stat_neg)
