"""The heterps_pull op and its push grad op in Paddle: dynamic mode, static mode (parallel executor
threads), error reporting, and a program run in a second process that only knows the op attributes."""

import subprocess
import sys
import textwrap
import zlib  # noqa: E402,F401  (before paddle, as setup.py does)

import native_ops  # noqa: E402  (builds the native libraries in a source checkout)
import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from heterps_paddle.table.sparse_table import SparseTable, SparseTableError, sparse_embedding  # noqa: E402

_count = iter(range(10**6))


def _name(tag):
    return f"paddle-{tag}-{next(_count)}"


@pytest.fixture
def dygraph():
    paddle.disable_static()
    yield
    paddle.disable_static()


@pytest.fixture
def static():
    paddle.enable_static()
    yield
    paddle.disable_static()


def test_dynamic_forward_and_push(dygraph):
    t = SparseTable(dim=4, optimizer="sgd", lr=0.5, name=_name("dyn"), seed=3)
    ids_np = np.array([[1, 2, 2], [7, 1, 9]], dtype=np.int64)
    before = t.pull([1, 2, 7, 9])
    ids = paddle.to_tensor(ids_np)
    out = sparse_embedding(ids, t)
    assert out.shape == [2, 3, 4]
    np.testing.assert_array_equal(out.numpy(), t.pull(ids_np))
    w = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32)
    (out * paddle.to_tensor(w)).sum().backward()
    # d loss / d row = sum of w over the positions holding that id; SGD: row -= lr * that
    expect = before.copy()
    for k, key in enumerate([1, 2, 7, 9]):
        expect[k] -= 0.5 * w[ids_np == key].sum(axis=0)
    np.testing.assert_allclose(t.pull([1, 2, 7, 9]), expect, rtol=1e-6, atol=1e-7)


def test_dynamic_errors(dygraph):
    t = SparseTable(dim=2, optimizer="adam", name=_name("err"))
    with pytest.raises(SparseTableError, match="int64"):
        sparse_embedding(paddle.to_tensor(np.array([1.0, 2.0], np.float32)), t)
    with pytest.raises(SparseTableError, match="int64"):
        sparse_embedding(paddle.to_tensor(np.array([1, 2], np.int32)), t)
    ids = paddle.to_tensor(np.array([3, 4], np.int64))
    before = t.pull([3, 4])
    out = sparse_embedding(ids, t)
    bad = paddle.to_tensor(np.array([[1.0, float("nan")], [0.0, 0.0]], np.float32))
    with pytest.raises(Exception, match="not finite"):
        (out * bad).sum().backward()
    np.testing.assert_array_equal(t.pull([3, 4]), before)  # the NaN batch never reached a row


def _build_static(tables, lr):
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, 3], "int64")
        y = paddle.static.data("y", [None, 1], "float32")
        embs = [paddle.sum(sparse_embedding(x, t), axis=1) for t in tables]
        h = paddle.concat(embs, axis=1)
        pred = paddle.static.nn.fc(h, 1)
        loss = paddle.mean(paddle.square(pred - y))
        paddle.optimizer.SGD(lr).minimize(loss)
    return main, startup, loss


def test_static_training_pushes_and_learns(static):
    tables = [SparseTable(dim=4, optimizer="adagrad", lr=0.1, name=_name("st")) for _ in range(2)]
    main, startup, loss = _build_static(tables, 0.05)
    types = [op.type for op in main.global_block().ops]
    assert types.count("heterps_pull") == 2 and types.count("heterps_pull_grad") == 2
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 50, size=(64, 3)).astype(np.int64)
    y = (x[:, :1] % 2).astype(np.float32)  # learnable only through the embeddings
    losses = [float(exe.run(main, feed={"x": x, "y": y}, fetch_list=[loss])[0]) for _ in range(60)]
    assert losses[-1] < 0.5 * losses[0]
    for t in tables:
        s = t.stats()
        assert s["rows_in_memory"] == len(np.unique(x)) and s["hits"] > 0


def test_static_many_executor_threads(static):
    # Several independent pull/push pairs that the executor may run concurrently on its threads.
    tables = [SparseTable(dim=8, optimizer="sgd", lr=1.0, init_range=0.0, name=_name("thr")) for _ in range(4)]
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None], "int64")
        total = paddle.add_n([paddle.sum(sparse_embedding(x, t)) for t in tables])
        paddle.optimizer.SGD(0.0).minimize(total)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    ids = np.arange(100, dtype=np.int64) % 37
    for _ in range(5):
        exe.run(main, feed={"x": ids}, fetch_list=[total])
    counts = np.bincount(ids, minlength=37).astype(np.float32)
    for t in tables:  # each step: d total / d row = count of the id in the batch; lr 1, 5 steps
        np.testing.assert_array_equal(t.pull(np.arange(37))[:, 0], -5 * counts)


def test_program_runs_in_a_process_that_only_loaded_the_ops(static, tmp_path):
    # A PS trainer receives a program, not our Python objects: the op's attributes must be enough.
    t = SparseTable(dim=3, optimizer="adam", lr=0.01, seed=11, name=_name("xproc"))
    main, startup, loss = _build_static([t], 0.01)
    (tmp_path / "main.pb").write_bytes(main.desc.serialize_to_string())
    (tmp_path / "startup.pb").write_bytes(startup.desc.serialize_to_string())
    x = np.array([[1, 2, 3], [4, 5, 6]], np.int64)
    expect = t.pull(np.arange(1, 7))
    child = textwrap.dedent(f"""
        import zlib, numpy as np, paddle
        from heterps_paddle.table import sparse_table
        sparse_table.load_ops()  # what a trainer process must do before running the program
        paddle.enable_static()
        main = paddle.static.Program.parse_from_string(open(r"{tmp_path / 'main.pb'}", "rb").read())
        pulls = [op for op in main.global_block().ops if op.type == "heterps_pull"]
        assert len(pulls) == 1
        startup = paddle.static.Program.parse_from_string(open(r"{tmp_path / 'startup.pb'}", "rb").read())
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        exe.run(main, feed={{"x": np.array({x.tolist()}, np.int64), "y": np.ones((2, 1), np.float32)}})
        keys = np.arange(1, 7, dtype=np.int64)
        rows = np.empty((6, 11), np.float32); found = np.empty(6, np.uint8)
        name = pulls[0].attr("table").encode()
        assert sparse_table._core().heterps_table_peek(name, keys.ctypes.data, 6, rows.ctypes.data,
                                                       found.ctypes.data) == 0
        np.save(r"{tmp_path / 'rows.npy'}", rows); np.save(r"{tmp_path / 'found.npy'}", found)
    """)
    out = subprocess.run(
        [sys.executable, "-c", child],
        cwd=tmp_path,
        env=native_ops.package_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows, found = np.load(tmp_path / "rows.npy"), np.load(tmp_path / "found.npy")
    assert (found == 1).all()
    # Same deterministic init as here, then one Adam step: moved, but by at most ~lr per coordinate.
    delta = rows[:, :3] - expect
    assert (np.abs(delta) > 0).all() and (np.abs(delta) <= 0.0101).all()
    np.testing.assert_allclose(rows[:, 9:], np.tile([[0.9, 0.999]], (6, 1)), rtol=1e-6)  # one step taken


def test_static_lod_ids_feed_sequence_pool(static):
    # The CTR examples feed slots as LoD sequences and sum-pool them: rows must carry the ids' LoD.
    t = SparseTable(dim=4, optimizer="sgd", lr=1.0, init_range=0.0, name=_name("lod"))
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, 1], "int64", lod_level=1)
        rows = paddle.squeeze(sparse_embedding(x, t), axis=1)
        pooled = paddle.static.nn.sequence_lod.sequence_pool(rows, "sum")
        loss = paddle.sum(pooled * paddle.to_tensor(np.array([[1.0], [2.0]], np.float32)))
        paddle.optimizer.SGD(0.0).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    ids = paddle.base.create_lod_tensor(np.array([[1], [2], [3], [1], [5]], np.int64), [[2, 3]], paddle.CPUPlace())
    (out,) = exe.run(main, feed={"x": ids}, fetch_list=[pooled])
    assert out.shape == (2, 4)
    # sequence 0 = ids (1, 2) with weight 1, sequence 1 = ids (3, 1, 5) with weight 2; SGD lr 1 from zero
    np.testing.assert_array_equal(t.pull([1, 2, 3, 5])[:, 0], [-3.0, -1.0, -2.0, -2.0])
