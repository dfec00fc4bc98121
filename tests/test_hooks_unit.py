"""The runtime's named hook points (heterps_paddle/runtime/hooks.py): an unknown point is refused by name, hooks run
in the order added, and the wrapped training run calls each hook around the run once, the first added outermost."""

import pytest

from heterps_paddle.runtime import hooks


def test_an_unknown_point_is_refused_by_name():
    with pytest.raises(ValueError, match="no hook point named 'before_persit'.*before_persist"):
        hooks.add("before_persit", lambda captured: None)


def test_hooks_run_in_the_order_added_and_can_be_removed():
    seen = []
    first, second = (lambda c: seen.append(("first", c))), (lambda c: seen.append(("second", c)))
    hooks.add("before_persist", first)
    hooks.add("before_persist", second)
    try:
        hooks.call("before_persist", "captured")
    finally:
        hooks.remove("before_persist", first)
        hooks.remove("before_persist", second)
    hooks.call("before_persist", "again")
    assert seen == [("first", "captured"), ("second", "captured")]


def test_a_training_run_is_wrapped_by_each_hook_once_the_first_outermost():
    order = []

    def outer(number, call, run):
        order.append(("outer in", number, call))
        result = run(call)
        order.append(("outer out", result))
        return result

    def inner(number, call, run):
        order.append(("inner in", number, call))
        return run(call) + 1

    def train(call):
        order.append(("train", call))
        return 10

    assert hooks.around_train_run(3, train) is train  # none added: the run itself
    hooks.add("around_train_run", outer)
    hooks.add("around_train_run", inner)
    try:
        result = hooks.around_train_run(3, train)("files")
    finally:
        hooks.remove("around_train_run", outer)
        hooks.remove("around_train_run", inner)
    assert result == 11
    assert order == [("outer in", 3, "files"), ("inner in", 3, "files"), ("train", "files"), ("outer out", 11)]
