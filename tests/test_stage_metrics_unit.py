"""A split pass's end waits for the last stage to count the pass's samples (runtime/stage_metrics.py: PassMetrics).

A CPU trainer's ``train_from_dataset`` can return before the last stage's forward of its last micro-batch has run;
a CI run with one batch a pass then logged the same global AUC for two epochs.  Here a fake last stage counts the
pass's batch only at its third reading."""

import numpy as np
import paddle

from heterps_paddle.runtime import auc_states, stage_metrics

OP = auc_states.AucOp("auc", "pos", "neg", num_thresholds=1, slide_steps=0)  # 2 buckets, accumulating


class LateLastStage(stage_metrics.Client):
    def __init__(self, readings):
        super().__init__(["unused:0"], 1, 0, ops=[OP])
        self.readings = list(readings)
        self.reads = 0

    def snapshot(self):
        self.reads += 1
        pos, neg = self.readings[min(self.reads, len(self.readings)) - 1]
        return {"pos": np.array(pos, dtype="int64"), "neg": np.array(neg, dtype="int64")}, None


def finished(client, expected, monkeypatch):
    monkeypatch.setattr(stage_metrics, "POLL_S", 0.01)
    scope = paddle.static.Scope()
    metrics = stage_metrics.PassMetrics(client, scope, [], 0, 60, None, expected=expected, ops=[OP])
    metrics.before = {"pos": np.array([1, 2]), "neg": np.array([3, 4])}  # the previous pass's end: 10 samples
    metrics.finish()
    pos, neg = (np.array(scope.find_var(name).get_tensor()).reshape(-1) for name in ("pos", "neg"))
    return client, pos, neg


def test_the_pass_end_waits_until_its_samples_are_counted(monkeypatch):
    readings = [([1, 2], [3, 4]), ([1, 2], [3, 4]), ([21, 22], [23, 4])]  # 60 more at the third reading
    client, pos, neg = finished(LateLastStage(readings), 60, monkeypatch)
    assert client.reads == 3
    assert pos.tolist() == [20, 20] and neg.tolist() == [20, 0]  # the growth, added to an empty scope
    assert client.accounted["pos"].tolist() == [21, 22]


def test_no_sample_count_no_wait(monkeypatch):
    client, pos, _ = finished(LateLastStage([([1, 2], [3, 4]), ([21, 22], [23, 4])]), None, monkeypatch)
    assert client.reads == 1 and pos.tolist() == [0, 0]


def test_a_last_stage_that_never_counts_them_is_said_and_the_pass_goes_on(monkeypatch, caplog):
    monkeypatch.setattr(stage_metrics, "SETTLE_WAIT_S", 0.05)
    client, pos, _ = finished(LateLastStage([([1, 2], [3, 4])]), 60, monkeypatch)
    assert client.reads >= 2 and pos.tolist() == [0, 0]
    assert "counted 0 samples" in caplog.text and "pass of 60 samples" in caplog.text
