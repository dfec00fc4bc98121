"""Every AUC op's state, whatever its thresholds and sliding window (runtime/auc_states.py), read by what reads a
model's AUC state (runtime/stage_metrics.py on a split's CPU trainers, runtime/meter.py on any trainer).

PaddleRec's DLRM builds ``paddle.static.auc(slide_steps=0)``: its "batch" op's state is 4097 entries after the
startup program and 4096 after the first batch, and a split's first pass crashed in ``share_of_growth``
(``operands could not be broadcast together with shapes (4096,) (4097,)``).  Here real Paddle programs with the
layouts PaddleRec's rank models build (DNN and Wide&Deep: ``num_thresholds=2**12, slide_steps=20``; DeepFM and DLRM:
the defaults with ``slide_steps=0``) and small ones run batches, and each op's counting window must be the
histogram of the batch's predictions, and its AUC the op's own."""

import json
import logging
from types import SimpleNamespace

import numpy as np
import paddle
import pytest

from heterps_paddle.data.metrics import auc_from_histograms
from heterps_paddle.runtime import auc_states, heldout, meter, seam, stage_metrics

# (num_thresholds, slide_steps) of paddle.static.auc calls: PaddleRec's DNN / Wide&Deep, DeepFM / DLRM, Paddle's
# default, and small ones
LAYOUTS = [(2**12, 20), (4095, 0), (4095, 1), (99, 3), (7, 0)]


def auc_program(layouts):
    """A program of ``paddle.static.auc`` calls on one softmax prediction, its startup, and its feeds."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, 2], "float32")
        label = paddle.static.data("label", [None, 1], "int64")
        predict = paddle.nn.functional.softmax(x)
        outputs = [paddle.static.auc(predict, label, num_thresholds=t, slide_steps=s)[0] for t, s in layouts]
    return main, startup, outputs


def batch(seed, rows=64):
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, (rows, 1))
    x = rng.normal(size=(rows, 2)).astype("float32")
    x[:, 1] += label[:, 0]  # predictions that carry the label
    return {"x": x, "label": label}


def positive_probability(feed):
    e = np.exp(feed["x"] - feed["x"].max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True))[:, 1]


def histogram(feeds, num_thresholds):
    """What an op counts for these batches: bucket int(p * T) of each positive-class probability, by label."""
    pos, neg = np.zeros(num_thresholds + 1, "int64"), np.zeros(num_thresholds + 1, "int64")
    for feed in feeds:
        bins = (positive_probability(feed) * num_thresholds).astype("int64")
        np.add.at(pos, bins[feed["label"][:, 0] == 1], 1)
        np.add.at(neg, bins[feed["label"][:, 0] == 0], 1)
    return pos, neg


def states(scope, ops):
    return {name: np.array(scope.find_var(name).get_tensor()) for op in ops for name in op.states()}


@pytest.fixture(autouse=True)
def fresh_once(monkeypatch):
    monkeypatch.setattr(auc_states, "_SAID", set())  # what was said once, per test


@pytest.fixture
def job():
    """The program run for two batches in a scope of its own; the raw states after startup and after each batch."""
    main, startup, outputs = auc_program(LAYOUTS)
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace())
    ops = auc_states.auc_ops(main)
    feeds = [batch(1), batch(2)]
    with paddle.static.scope_guard(scope):
        exe.run(startup)
        readings = [states(scope, ops)]
        fetched = []
        for feed in feeds:
            fetched.append(exe.run(main, feed=feed, fetch_list=outputs))
            readings.append(states(scope, ops))
    return SimpleNamespace(main=main, startup=startup, ops=ops, feeds=feeds, readings=readings, fetched=fetched)


def test_the_layout_comes_from_each_ops_attributes(job):
    assert [(op.num_thresholds, op.slide_steps) for op in job.ops] == [
        (t, s)
        for t, slide in LAYOUTS
        for s in (slide, 0)  # each call: its batch op, then the accumulating one
    ]
    assert [op.accumulates for op in job.ops] == [s == 0 for _, slide in LAYOUTS for s in (slide, 0)]
    # the shape change seen with DLRM: startup declares one entry more than the kernel writes
    dlrm_batch = job.ops[2]
    assert job.readings[0][dlrm_batch.stat_pos].size == 4097 and job.readings[1][dlrm_batch.stat_pos].size == 4096


def test_every_states_window_is_the_histogram_its_op_counted(job):
    for op in job.ops:
        for reading in job.readings:
            for name in op.states():
                assert op.window(name, reading[name]).shape == (op.buckets,)
        counted = job.feeds if op.accumulates else job.feeds[-op.slide_steps :]  # a sliding op: its last batches
        pos, neg = histogram(counted, op.num_thresholds)
        assert op.window(op.stat_pos, job.readings[-1][op.stat_pos]).tolist() == pos.tolist(), op
        assert op.window(op.stat_neg, job.readings[-1][op.stat_neg]).tolist() == neg.tolist(), op


def test_the_accumulating_windows_auc_is_the_ops_own(job):
    last = job.readings[-1]
    for call, op in enumerate(job.ops[1::2]):  # each paddle.static.auc call's accumulating op, whose AUC it returns
        fetched = float(np.array(job.fetched[-1][call]).reshape(-1)[0])
        window = [op.window(name, last[name]) for name in op.states()]
        assert abs(auc_from_histograms(*window) - fetched) < 1e-9, (op, fetched)


def test_a_state_of_another_size_is_named_and_said_once(caplog):
    op = auc_states.AucOp("auc_9.tmp_0", "p", "n", num_thresholds=4095, slide_steps=0)
    with pytest.raises(auc_states.UnreadableState, match=r"auc_9.tmp_0 .*state p has 10 entries, .*4096 or 4097"):
        op.window("p", np.zeros(10))
    with caplog.at_level(logging.WARNING, logger="heterps"):
        for _ in range(3):
            got = auc_states.windows([op], {"p": np.zeros(10), "n": np.zeros(4096)}, "its pass AUC is not shown")
            assert list(got) == ["n"] and got["n"].shape == (4096,)
    assert caplog.text.count("state p has 10 entries") == 1 and "its pass AUC is not shown" in caplog.text


class Wire:
    """A last stage's Service answered in this process (the same JSON a socket carries)."""

    def __init__(self, service):
        self.service = service

    def __call__(self, endpoint, request=b"metrics", timeout=60.0):
        return json.loads(json.dumps(self.service.answer(request)))


def split_trainers(monkeypatch, main, startup, trainers):
    """A last stage's service over ``main``'s states and ``trainers`` CPU trainers' clients reading it."""
    ctx = seam.reset_context({"TRAINING_ROLE": "TRAINER"})
    ctx.heldout = heldout.HeldOut(forward=main, startup=startup, loss=None)
    last = paddle.static.Scope()
    service = stage_metrics.Service(main, last, None, runtime=None, last=True)
    monkeypatch.setattr(stage_metrics, "_fetch", Wire(service))
    ops = auc_states.auc_ops(main)
    clients = [stage_metrics.Client(["last:0"], trainers, i, ops=ops) for i in range(trainers)]
    return last, clients


@pytest.mark.parametrize("trainers", [1, 2])
def test_a_split_carries_every_layout_into_the_cpu_trainers_scopes(monkeypatch, trainers):
    main, startup, outputs = auc_program(LAYOUTS)
    last, clients = split_trainers(monkeypatch, main, startup, trainers)
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(last):
        exe.run(startup)  # the last stage's states in startup's shapes: DLRM's 4097
    scopes = [paddle.static.Scope() for _ in clients]
    for scope in scopes:  # each CPU trainer's own scope starts from the whole model's startup (runtime/heldout.py)
        with paddle.static.scope_guard(scope):
            exe.run(startup)
    feeds = [batch(3), batch(4), batch(5)]
    for feed in feeds:
        passes = [stage_metrics.PassMetrics(c, s, [], 0, 64, None).start() for c, s in zip(clients, scopes)]
        with paddle.static.scope_guard(last):
            fetched = exe.run(main, feed=feed, fetch_list=outputs)  # the kernel's shapes from the first batch on
        for metrics in passes:
            metrics.finish()
            assert not metrics.broken
    ops = auc_states.auc_ops(main)
    for op in auc_states.accumulating(ops):
        pos, neg = histogram(feeds, op.num_thresholds)
        summed = [sum(np.array(s.find_var(n).get_tensor()).reshape(-1) for s in scopes) for n in op.states()]
        assert summed[0].tolist() == pos.tolist() and summed[1].tolist() == neg.tolist(), op
        assert np.array(scopes[0].find_var(op.stat_pos).get_tensor()).shape == (1, op.buckets)  # the kernel's
    for call, op in enumerate(ops[1::2]):  # the global AUC a script computes over the trainers is the model's
        summed = [sum(np.array(s.find_var(n).get_tensor()).reshape(-1) for s in scopes) for n in op.states()]
        assert abs(auc_from_histograms(*summed) - float(np.array(fetched[call]).reshape(-1)[0])) < 1e-9


def test_fetched_metrics_of_every_op_while_a_split_pass_runs(monkeypatch):
    main, startup, outputs = auc_program(LAYOUTS)
    last, (client,) = split_trainers(monkeypatch, main, startup, 1)
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(last):
        exe.run(startup)
    metrics = stage_metrics.PassMetrics(client, paddle.static.Scope(), [], 0, 64, None).start()
    with paddle.static.scope_guard(last):
        fetched = exe.run(main, feed=batch(6), fetch_list=outputs)
    values, samples = metrics._values()
    assert samples == 64
    for call, op in enumerate(auc_states.auc_ops(main)[1::2]):
        assert abs(values[op.auc] - float(np.array(fetched[call]).reshape(-1)[0])) < 1e-9
    sliding = [op for op in auc_states.auc_ops(main) if not op.accumulates]
    assert all(op.auc in values for op in sliding)  # the last stage's last batches


class Broken(stage_metrics.Client):
    def snapshot(self):
        raise ValueError("operands could not be broadcast together with shapes (4096,) (4097,)")


def test_a_metric_that_fails_is_said_and_never_stops_training(monkeypatch, caplog):
    seam.reset_context({"TRAINING_ROLE": "TRAINER"})
    op = auc_states.AucOp("auc", "pos", "neg", num_thresholds=1, slide_steps=0)
    with caplog.at_level(logging.WARNING, logger="heterps"):
        metrics = stage_metrics.PassMetrics(Broken([], 1, 0, ops=[op]), paddle.static.Scope(), [], 0, 1, None)
        metrics.ops = [op]
        metrics.start().finish()  # neither raises
    assert metrics.broken
    assert "stage metrics (runtime/stage_metrics.py) failed at its start (ValueError: operands could" in caplog.text


def test_the_meter_reads_a_pass_auc_across_the_states_change_of_shape():
    seam.reset_context({"TRAINING_ROLE": "TRAINER"})
    main, startup, _ = auc_program([(4095, 0)])  # DLRM's and DeepFM's
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace())
    call = SimpleNamespace(scope=scope, main_program=lambda: main)
    feeds = [batch(7), batch(8)]
    with paddle.static.scope_guard(scope):
        exe.run(startup)
        reader = meter._auc_reader(call)
        before = meter._read_stats(reader)
        for feed in feeds:
            exe.run(main, feed=feed)
    learned = meter.pass_learning(reader, before, call)
    pos, neg = histogram(feeds, 4095)
    assert learned["pass_auc"] == round(auc_from_histograms(pos, neg), 6)
    assert meter._counter(reader)() == 2 * 64


def test_a_model_without_an_accumulating_auc_op_says_once_why_no_pass_auc(caplog):
    seam.reset_context({"TRAINING_ROLE": "TRAINER"})
    main, _, _ = auc_program([(99, 3)])
    main.global_block().ops[-1]._set_attr("slide_steps", 2)  # both ops sliding
    call = SimpleNamespace(scope=paddle.static.Scope(), main_program=lambda: main)
    with caplog.at_level(logging.WARNING, logger="heterps"):
        assert meter._auc_reader(call) is None and meter._auc_reader(call) is None
    assert caplog.text.count("none accumulating (slide_steps=0): its pass AUC is not shown") == 1


def test_a_fetched_copy_of_an_auc_is_printed_with_its_value(monkeypatch):
    main, startup, outputs = auc_program([(2**12, 20)])
    with paddle.static.program_guard(main, startup):
        copy = paddle.cast(outputs[0], "float32")  # what PaddleRec's Wide&Deep fetches as its auc
    last, (client,) = split_trainers(monkeypatch, main, startup, 1)
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(last):
        exe.run(startup)
    metrics = stage_metrics.PassMetrics(client, paddle.static.Scope(), [], 0, 64, None).start()
    with paddle.static.scope_guard(last):
        (fetched,) = exe.run(main, feed=batch(9), fetch_list=[copy])
    values, _ = metrics._values()
    assert abs(values[copy.name] - float(np.array(fetched).reshape(-1)[0])) < 1e-6
