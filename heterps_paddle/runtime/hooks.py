"""Named points in a launched job's processes where an observer adds behaviour, instead of patching the runtime's
methods (a patch breaks silently when a method is renamed or its signature changes; a point is part of this
module's contract, and adding to an unknown one fails by name).  The launched tests' faults use them
(tests/faults/sitecustomize.py): a checkpoint held before its files are persisted, the files each training run
trained, a restore changed after the fact.

- ``before_persist(captured)``: CPU trainer 0, in the background thread that persists a checkpoint
  (runtime/launch_checkpoints.py), before it writes anything; ``captured`` is the checkpoint's ``Captured``.
- ``around_train_run(number, call, run)``: every ``train_from_dataset`` Paddle runs for a script's call on a stage 1
  CPU trainer of a launch with ``--checkpoint-dir`` (runtime/launch_checkpoints.py: ``run_pass``; a slice's, or the
  whole pass's), ``number`` the training pass it is in (an evaluation's call: the next one's); the hook returns
  ``run(call)``'s result, having called it once.
- ``after_restore(runtime)``: a parameter server, once ``init_server`` restored the tables of the checkpoint it was
  given (runtime/patches.py).

No hook is added by the product itself: with none, each point costs a dictionary lookup.
"""

from __future__ import annotations

from typing import Any, Callable

POINTS = ("before_persist", "around_train_run", "after_restore")

_added: dict[str, list[Callable[..., Any]]] = {point: [] for point in POINTS}


def add(point: str, hook: Callable[..., Any]) -> None:
    """``hook`` called at ``point`` from now on, after the hooks added before it."""
    if point not in _added:
        raise ValueError(f"no hook point named {point!r}: the points are {', '.join(POINTS)}")
    _added[point].append(hook)


def remove(point: str, hook: Callable[..., Any]) -> None:
    """``hook`` no longer called at ``point`` (a test's, once it is done)."""
    _added[point].remove(hook)


def call(point: str, *args: Any) -> None:
    """Every hook of ``point``, in the order they were added."""
    for hook in _added[point]:
        hook(*args)


def around_train_run(number: int, run: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``run`` (one ``train_from_dataset`` of pass ``number``) wrapped by the ``around_train_run`` hooks, the first
    added outermost; ``run`` itself when there are none."""
    wrapped = run
    for hook in reversed(_added["around_train_run"]):
        wrapped = _bound(hook, number, wrapped)
    return wrapped


def _bound(hook: Callable[..., Any], number: int, inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda call: hook(number, call, inner)
