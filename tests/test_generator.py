import filecmp
import json

import numpy as np

from heterps_paddle.data.criteo import read_all
from heterps_paddle.data.generator import CRITEO_CARDINALITIES, generate, load_meta
from heterps_paddle.data.metrics import auc_score


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    a = generate(str(tmp_path / "a"), 3000, seed=5)
    b = generate(str(tmp_path / "b"), 3000, seed=5)
    c = generate(str(tmp_path / "c"), 3000, seed=6)
    assert len(a.train_files) == 8  # small sets are still split for up to 8 workers
    for fa, fb in zip(a.train_files + a.test_files, b.train_files + b.test_files):
        assert filecmp.cmp(fa, fb, shallow=False)
    assert not filecmp.cmp(a.train_files[0], c.train_files[0], shallow=False)
    assert load_meta(str(tmp_path / "a")) == a
    assert json.load(open(tmp_path / "a" / "meta.json"))["format"] == 1


def test_rows_are_valid_criteo_slot_format_with_zipf_ids(tmp_path):
    data = generate(str(tmp_path), 4000, seed=1)
    samples, report = read_all(data.train_files)
    assert report.rows == 4000 and report.skipped == 0
    labels = np.array([s.label for s in samples])
    assert 0.15 < labels.mean() < 0.35  # Criteo-like click rate
    # Zipf skew: the most frequent id of a large slot covers far more than 1/cardinality of rows
    big_slot = int(np.argmax(CRITEO_CARDINALITIES))
    ids = np.array([s.sparse[big_slot][0] for s in samples])
    _, counts = np.unique(ids, return_counts=True)
    assert counts.max() / len(ids) > 0.05
    # small slots never exceed their cardinality
    tiny_slot = int(np.argmin(CRITEO_CARDINALITIES))
    assert len({s.sparse[tiny_slot][0] for s in samples}) <= CRITEO_CARDINALITIES[tiny_slot]


def _fit_and_score(train, test):
    """A small learner: logistic regression on the dense features plus per-slot smoothed log-odds of
    each id (target encoding).  The encodings come from one half of the training rows and the
    regression is fitted on the other half, so no row's own label leaks into its features."""
    half = len(train) // 2
    encode_rows, train = train[:half], train[half:]
    y = np.array([s.label for s in train], dtype=np.float64)
    prior = np.mean([s.label for s in encode_rows])
    tables = []
    for slot in range(26):
        pos, tot = {}, {}
        for s in encode_rows:
            label = s.label
            key = s.sparse[slot][0]
            pos[key] = pos.get(key, 0.0) + label
            tot[key] = tot.get(key, 0.0) + 1
        tables.append((pos, tot))

    def features(rows):
        dense = np.array([s.dense for s in rows])
        enc = np.empty((len(rows), 26))
        for slot, (pos, tot) in enumerate(tables):
            for i, s in enumerate(rows):
                key = s.sparse[slot][0]
                p = (pos.get(key, 0.0) + 10 * prior) / (tot.get(key, 0.0) + 10)
                enc[i, slot] = np.log(p / (1 - p))
        return np.hstack([dense, enc, np.ones((len(rows), 1))])

    x, x_test = features(train), features(test)
    mean, std = x[:, :-1].mean(axis=0), x[:, :-1].std(axis=0) + 1e-9
    x[:, :-1] = (x[:, :-1] - mean) / std
    x_test[:, :-1] = (x_test[:, :-1] - mean) / std
    w = np.zeros(x.shape[1])
    for _ in range(300):  # plain gradient descent on the log loss
        p = 1 / (1 + np.exp(-x @ w))
        w -= 0.5 * x.T @ (p - y) / len(y)
    return auc_score([s.label for s in test], x_test @ w)


def test_planted_signal_is_learnable_and_a_constant_gets_half(tmp_path):
    data = generate(str(tmp_path), 20000, seed=3, test_fraction=0.2)
    assert data.bayes_test_auc > 0.8  # the true probabilities rank the held-out rows well
    train, _ = read_all(data.train_files)
    test, _ = read_all(data.test_files)
    assert _fit_and_score(train, test) >= 0.70
    labels = [s.label for s in test]
    assert auc_score(labels, np.zeros(len(labels))) == 0.5
