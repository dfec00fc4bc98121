"""Embeddings on a GPU stage: SparseTable.assign (rows loaded from the parameter servers)."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("heterps_ensure_built", ROOT / "custom_ops" / "ensure_built.py")
_eb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_eb)
_eb.ensure_built()

from heterps_paddle.sparse_table import SparseTable, SparseTableError  # noqa: E402


# ---- SparseTable.assign -----------------------------------------------------------------------------------
def test_assign_sets_weights_and_keeps_optimizer_state(tmp_path):
    t = SparseTable(dim=4, optimizer="adagrad", lr=0.1, seed=3, name="assign_state")
    ids = np.array([5, 9], np.int64)
    t.push(ids, np.ones((2, 4), np.float32))  # accumulators now 1
    before, _ = t.peek(ids)
    rows = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.float32)
    t.assign(ids, rows)
    np.testing.assert_array_equal(t.pull(ids), rows)
    after, _ = t.peek(ids)
    np.testing.assert_array_equal(after[:, 4:], before[:, 4:])  # Adagrad state untouched
    # The next push continues from the assigned weights with the kept accumulator: a = 1 + 1, w -= lr*g/sqrt(a).
    t.push(ids[:1], np.ones((1, 4), np.float32))
    expect = rows[0] - np.float32(0.1) / (np.sqrt(np.float32(2.0)) + np.float32(1e-8))
    np.testing.assert_allclose(t.pull(ids[:1])[0], expect, rtol=1e-6)
    t.close()


def test_assign_creates_rows_with_initial_state_last_duplicate_wins():
    t = SparseTable(dim=2, optimizer="adam", lr=0.01, name="assign_new")
    t.assign([7, 7, 8], np.array([[1, 1], [2, 2], [3, 3]], np.float32))
    np.testing.assert_array_equal(t.pull([7, 8]), [[2, 2], [3, 3]])
    rows, found = t.peek([7])
    assert found.tolist() == [1]
    np.testing.assert_array_equal(rows[0, 2:], [0, 0, 0, 0, 1, 1])  # m, v zero; beta powers 1
    assert len(t) == 2
    t.close()


def test_assign_rejects_bad_input_and_changes_nothing():
    t = SparseTable(dim=2, name="assign_bad")
    t.assign([1], [[0.5, 0.5]])
    with pytest.raises(SparseTableError, match="not finite"):
        t.assign([1, 2], [[9.0, 9.0], [np.nan, 0.0]])
    np.testing.assert_array_equal(t.pull([1]), [[0.5, 0.5]])
    assert len(t) == 1
    with pytest.raises(SparseTableError, match="shape"):
        t.assign([1, 2], [[1.0, 1.0]])
    with pytest.raises(SparseTableError, match="floating"):
        t.assign([1], np.array([[1, 1]]))
    t.close()


def test_assign_through_the_ssd_tier(tmp_path):
    t = SparseTable(dim=8, optimizer="sgd", memory_budget_bytes=64 << 10, ssd_dir=str(tmp_path), name="assign_ssd",
                    shards=1)
    ids = np.arange(5000, dtype=np.int64)
    rows = np.random.default_rng(0).standard_normal((5000, 8)).astype(np.float32)
    t.assign(ids, rows)
    assert t.stats()["rows_on_ssd"] > 0
    np.testing.assert_array_equal(t.pull(ids), rows)
    t.assign(ids[:10], rows[:10] + 1)  # rows spilled meanwhile are promoted and overwritten
    np.testing.assert_array_equal(t.pull(ids[:10]), rows[:10] + 1)
    t.close()
