"""The seam's static-graph half: Paddle 2.6.2's private methods on its static-graph objects, behind named functions.

Editing a program in place (removing and inserting ops, setting an op's attribute, syncing the Python blocks with
their C++ descs), asking whether a tensor holds memory, reading an optimizer's settings and running a custom op in
dynamic mode have no public API in Paddle 2.6.2; every package that does one of them (program, runtime, fleet,
table) calls these functions, so this module sits with the base modules, below all of them.  It imports Paddle only
inside functions (and nothing of Paddle at all for the methods it calls on objects it is given).  The other half of
the seam, over Paddle's parameter-server runtime and fleet, is runtime/seam.py (and runtime/patches.py).
"""

from __future__ import annotations

from typing import Any


def remove_op(block: Any, index: int, sync: bool = True) -> None:
    """Remove the op at ``index`` of ``block`` (``sync=False``: the caller syncs the program once at the end)."""
    block._remove_op(index, sync=sync)


def insert_op(block: Any, index: int, **op: Any) -> Any:
    """Insert an op (``type``, ``inputs``, ``outputs``, ``attrs``) at ``index`` of ``block``; returns it."""
    return block._insert_op(index, **op)


def set_op_attr(op: Any, name: str, value: Any) -> None:
    op._set_attr(name, value)


def set_desc_str_attr(desc: Any, name: str, value: str) -> None:
    """An attribute of an op desc built directly (a custom grad op has no Python op proto)."""
    desc._set_str_attr(name, value)


def set_desc_int32_attr(desc: Any, name: str, value: int) -> None:
    desc._set_int32_attr(name, value)


def sync_with_cpp(program_or_block: Any) -> None:
    """Rebuild the Python ops of a program (or block) from its C++ descs, after edits made on the descs."""
    program_or_block._sync_with_cpp()


def is_initialized(tensor: Any) -> bool:
    """Whether a scope's tensor holds memory (a var can exist in a scope before anything wrote it)."""
    return bool(tensor._is_initialized())


def learning_rate(optimizer: Any) -> Any:
    """The learning rate the optimizer was made with (a float, or Paddle's LRScheduler)."""
    return optimizer._learning_rate


def optimizer_setting(optimizer: Any, name: str) -> Any:
    """The optimizer's setting ``name`` (``learning_rate``, ``beta1``, ``epsilon``, ...), None when it has none."""
    return getattr(optimizer, "_" + name, None)


def run_custom_op(name: str, *inputs: Any) -> Any:
    """Run a registered custom op in dynamic mode, as the Python API Paddle generates for custom ops does."""
    import paddle.base.core as core  # lazy: this module never imports Paddle at import time

    return core.eager._run_custom_op(name, *inputs)
