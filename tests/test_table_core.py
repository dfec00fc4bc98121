"""Sparse table core through the ctypes binding: a randomised differential test against a Python model of
the same init and optimizer math (through spills, promotions, saves and loads), input validation,
corrupted checkpoints, failed writes, and concurrent pushes."""

import json
import os
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import native_ops  # noqa: E402  (builds the native libraries in a source checkout)
import numpy as np
import pytest

from heterps_paddle.errors import HeterPSError  # noqa: E402
from heterps_paddle.table import sparse_table as st  # noqa: E402
from heterps_paddle.table.sparse_table import SparseTable, SparseTableError  # noqa: E402

M64 = (1 << 64) - 1


# ---- the Python model ------------------------------------------------------------------------------------
def _mix64(x):
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    x ^= x >> 31
    return x


class Model:
    """Dict of rows with the optimizer math written independently in numpy float32."""

    def __init__(self, dim, optimizer, lr, seed, init_range=0.01, beta1=0.9, beta2=0.999, eps=1e-8):
        self.dim, self.opt, self.seed = dim, optimizer, seed
        f = np.float32
        self.lr, self.b1, self.b2, self.eps, self.r = f(lr), f(beta1), f(beta2), f(eps), f(init_range)
        self.rows = {}

    def _init(self, key):
        base = _mix64(self.seed ^ _mix64(key & M64))
        w = np.empty(self.dim, np.float32)
        for j in range(self.dim):
            unit = np.float32(_mix64((base + j) & M64) >> 40) * np.float32(1.0 / 16777216.0)
            w[j] = (unit * np.float32(2) - np.float32(1)) * self.r
        d = self.dim
        state = {"sgd": 0, "adagrad": d, "adam": 2 * d + 2}[self.opt]
        row = np.concatenate([w, np.zeros(state, np.float32)])
        if self.opt == "adam":
            row[3 * d :] = 1.0
        return row

    def row(self, key):
        if key not in self.rows:
            self.rows[key] = self._init(key)
        return self.rows[key]

    def pull(self, ids):
        return np.stack([self.row(int(k))[: self.dim] for k in ids])

    def push(self, ids, grads):
        summed = {}
        for k, g in zip(ids.tolist(), grads.astype(np.float32)):
            summed[k] = summed[k] + g if k in summed else g.copy()
        d = self.dim
        for k, g in summed.items():
            row = self.row(k)
            w = row[:d]
            if self.opt == "sgd":
                w -= self.lr * g
            elif self.opt == "adagrad":
                acc = row[d : 2 * d]
                acc += g * g
                w -= self.lr * g / (np.sqrt(acc) + self.eps)
            else:
                m, v, pw = row[d : 2 * d], row[2 * d : 3 * d], row[3 * d :]
                pw[0] *= self.b1
                pw[1] *= self.b2
                c1, c2 = np.float32(1) - pw[0], np.float32(1) - pw[1]
                m[:] = self.b1 * m + (np.float32(1) - self.b1) * g
                v[:] = self.b2 * v + (np.float32(1) - self.b2) * g * g
                w -= self.lr * (m / c1) / (np.sqrt(v / c2) + self.eps)


_names = iter(range(10**6))


def _name(tag):
    return f"test-{tag}-{os.getpid()}-{next(_names)}"


# ---- differential -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("optimizer,eviction", [("sgd", "lru"), ("adagrad", "lfu"), ("adam", "lru"), ("adam", "lfu")])
def test_differential_against_python_model(tmp_path, optimizer, eviction):
    rng = np.random.default_rng(hash((optimizer, eviction)) % 2**32)
    dim, seed, keyspace = 5, 1234, 3000
    stride = dim + {"sgd": 0, "adagrad": dim, "adam": 2 * dim + 2}[optimizer]
    budget = 300 * (stride * 4 + 32)  # ~300 resident rows out of up to 3000: the SSD tier is busy
    kwargs = dict(
        dim=dim,
        optimizer=optimizer,
        lr=0.05,
        seed=seed,
        eviction=eviction,
        shards=4,
        memory_budget_bytes=budget,
        ssd_dir=str(tmp_path / "ssd"),
        init_range=0.1,
    )
    table = SparseTable(name=_name("diff"), **kwargs)
    model = Model(dim, optimizer, 0.05, seed, init_range=0.1)
    for step in range(50):
        ids = rng.integers(-keyspace // 2, keyspace // 2, size=int(rng.integers(1, 400)))
        if rng.random() < 0.1:
            ids[: len(ids) // 2] = ids[0]  # heavy duplicates
        if step % 3 == 0:
            np.testing.assert_array_equal(table.pull(ids), model.pull(ids))
        grads = rng.normal(0, 1, size=(len(ids), dim)).astype(np.float32)
        table.push(ids, grads)
        model.push(ids, grads)
        if step in (20, 40):
            # round trip through a checkpoint into a fresh table (its own SSD tier), then continue on it
            table.save(tmp_path / "ckpt")
            fresh = SparseTable(name=table.name + "-reloaded", **kwargs)
            os.replace(table.checkpoint_path(tmp_path / "ckpt"), fresh.checkpoint_path(tmp_path / "ckpt"))
            fresh.load(tmp_path / "ckpt")
            table.close()
            table = fresh
    s = table.stats()
    assert s["evictions"] > 0 and s["ssd_promotions"] > 0 and s["rows_on_ssd"] > 0
    assert s["rows_in_memory"] <= s["capacity_rows"]
    keys = np.array(sorted(model.rows), dtype=np.int64)
    rows, where = table.peek(keys)
    assert set(where.tolist()) <= {1, 2} and (where == 2).any()
    # The whole stored row, optimizer state included, matches the model bit for bit (same float32 ops).
    np.testing.assert_array_equal(rows, np.stack([model.rows[int(k)] for k in keys]))
    assert len(table) == len(model.rows)
    table.close()


def test_init_is_the_same_in_another_process(tmp_path):
    ids = [0, 1, -7, 2**62, 123456789]
    t = SparseTable(dim=6, seed=99, name=_name("xproc"))
    here = t.pull(ids)
    code = (
        "import json,numpy as np\nfrom heterps_paddle.table.sparse_table import SparseTable\n"
        f"t=SparseTable(dim=6, seed=99, name='other')\nprint(json.dumps(t.pull({ids!r}).tolist()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=native_ops.package_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    np.testing.assert_array_equal(np.array(json.loads(out.stdout), np.float32), here)
    other = SparseTable(dim=6, seed=100, name=_name("xproc"))
    assert not np.array_equal(other.pull(ids), here)


# ---- validation -----------------------------------------------------------------------------------------------
def test_bad_inputs_raise_clear_errors(tmp_path):
    t = SparseTable(dim=3, optimizer="adam", name=_name("bad"))
    before = t.pull([1, 2])
    with pytest.raises(SparseTableError, match="int64"):
        t.pull([2**63])
    with pytest.raises(SparseTableError, match="int64"):
        t.pull(np.array([2**63 + 5], dtype=np.uint64))
    with pytest.raises(SparseTableError, match="integer"):
        t.pull([1.5, 2.0])
    with pytest.raises(SparseTableError, match="reserved"):
        t.pull([-(2**63)])
    with pytest.raises(SparseTableError, match="shape"):
        t.push([1, 2], np.zeros((2, 4), np.float32))
    g = np.ones((2, 3), np.float32)
    g[1, 2] = np.nan
    with pytest.raises(SparseTableError, match=r"id 2 .*not finite"):
        t.push([1, 2], g)
    with pytest.raises(SparseTableError, match="not finite"):
        t.push([1, 1], np.full((2, 3), 3e38, np.float32))  # the sum overflows
    np.testing.assert_array_equal(t.pull([1, 2]), before)  # nothing was applied
    assert issubclass(SparseTableError, HeterPSError)
    with pytest.raises(SparseTableError, match="optimizer"):
        SparseTable(dim=3, optimizer="rmsprop")
    with pytest.raises(SparseTableError, match="ssd_dir"):
        SparseTable(dim=3, memory_budget_bytes=1000)
    with pytest.raises(SparseTableError, match="dim"):
        SparseTable(dim=0)
    with pytest.raises(SparseTableError, match="already exists"):
        SparseTable(dim=4, optimizer="adam", name=t.name)
    with pytest.raises(SparseTableError, match="already exists"):
        SparseTable(dim=3, optimizer="adam", lr=0.5, name=t.name)  # same name, different training math
    assert SparseTable(dim=3, optimizer="adam", name=t.name, shards=4).name == t.name  # placement may differ
    assert t.pull(np.zeros((2, 0), np.int64)).shape == (2, 0, 3)


# ---- checkpoints --------------------------------------------------------------------------------------------
def _filled(tmp_path, tag):
    t = SparseTable(
        dim=4,
        optimizer="adagrad",
        name=_name(tag),
        memory_budget_bytes=100 * 64,
        ssd_dir=str(tmp_path / "ssd"),
        shards=2,
    )
    ids = np.arange(500)
    t.push(ids, np.random.default_rng(0).normal(size=(500, 4)).astype(np.float32))
    return t, ids


def test_checkpoint_is_checksummed_and_versioned(tmp_path):
    t, ids = _filled(tmp_path, "ckpt")
    path = Path(t.save(tmp_path / "c"))
    data = path.read_bytes()
    assert data[:8] == b"HETERPST" and int.from_bytes(data[8:12], "little") == 1
    assert data[-16:-8] == b"HPSTEND1"
    assert int.from_bytes(data[-8:-4], "little") == zlib.crc32(data[:-16])  # standard CRC-32
    good = t.peek(ids)[0]
    cases = {
        "flipped": data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 1]) + data[len(data) // 2 + 1 :],
        "truncated": data[:-100],
        "empty": b"",
        "zeros": bytes(len(data)),
        "future": data[:8] + (2).to_bytes(4, "little") + data[12:],
    }
    for label, blob in cases.items():
        path.write_bytes(blob)
        with pytest.raises(SparseTableError, match=str(path).replace(".", r"\.")) as info:
            t.load(tmp_path / "c")
        assert any(w in str(info.value) for w in ("corrupted", "truncated", "not a heterps", "version")), label
        np.testing.assert_array_equal(t.peek(ids)[0], good)  # a rejected load leaves the table as it was
    with pytest.raises(SparseTableError, match="does not exist"):
        t.load(tmp_path / "nowhere")


def test_failed_save_keeps_old_checkpoint(tmp_path):
    t, ids = _filled(tmp_path, "fail")
    t.save(tmp_path / "c")
    saved = t.peek(ids)[0]
    t.push(ids, np.ones((500, 4), np.float32))
    st._inject_write_failure_after(1)
    try:
        with pytest.raises(SparseTableError, match=r"\.tmp\..*No space left"):
            t.save(tmp_path / "c")
    finally:
        st._inject_write_failure_after(0)
    assert sorted(os.listdir(tmp_path / "c")) == [t.name + ".htbl"]  # no temp file left behind
    other = SparseTable(dim=4, optimizer="adagrad", name=t.name + "-2")
    os.rename(t.checkpoint_path(tmp_path / "c"), other.checkpoint_path(tmp_path / "c"))
    other.load(tmp_path / "c")
    np.testing.assert_array_equal(other.peek(ids)[0], saved)


_FSIZE_CHILD = r"""
import json, resource, signal, sys
import numpy as np
from heterps_paddle.table.sparse_table import SparseTable, SparseTableError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)       # so write() returns EFBIG instead of killing us
tmp = sys.argv[1]
t = SparseTable(dim=16, optimizer="sgd", lr=1.0, init_range=0.0, name="fsize",
                memory_budget_bytes=200 * 96, ssd_dir=tmp + "/ssd", shards=1)
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))   # a "disk" of 20 kB per file
ids = np.arange(3000)
for batch in np.array_split(ids, 30):  # a push spills once its batch is in: batches of 100 spill as they go
    t.push(batch, np.ones((batch.size, 16), np.float32))
res = {"stats": t.stats()}
try:
    t.save(tmp + "/ckpt")
    res["save"] = "ok"
except SparseTableError as e:
    res["save"] = str(e)
rows = t.pull(ids)
res["all_minus_one"] = bool((rows == -1.0).all())
print(json.dumps(res))
"""


def test_full_disk_via_rlimit_fsize(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", _FSIZE_CHILD, str(tmp_path)],
        cwd=tmp_path,
        env=native_ops.package_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["stats"]["spill_errors"] > 0  # spills hit the limit ...
    assert res["stats"]["rows_on_ssd"] > 0  # ... after some succeeded
    assert res["all_minus_one"]  # and no update was lost
    assert "File too large" in res["save"] and ".tmp." in res["save"]
    assert "spilling rows to" in out.stderr and "File too large" in out.stderr  # the failed spill was reported
    assert not list((tmp_path / "ckpt").glob("*"))  # nothing half-written remains


# ---- concurrency ---------------------------------------------------------------------------------------------
def test_concurrent_pushes_from_threads(tmp_path):
    # ctypes releases the GIL, so these really run in parallel in the core.
    t = SparseTable(
        dim=2,
        optimizer="sgd",
        lr=1.0,
        init_range=0.0,
        name=_name("threads"),
        shards=4,
        memory_budget_bytes=200 * 40,
        ssd_dir=str(tmp_path / "ssd"),
    )
    counts = np.zeros(1000, np.int64)
    lock = threading.Lock()

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(100):
            ids = rng.integers(0, 1000, 128)
            t.push(ids, np.ones((128, 2), np.float32))
            with lock:
                np.add.at(counts, ids, 1)
            t.pull(rng.integers(0, 1000, 128))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    np.testing.assert_array_equal(t.pull(np.arange(1000))[:, 0], -counts.astype(np.float32))
    assert t.stats()["evictions"] > 0


def test_stats_and_budget(tmp_path):
    t = SparseTable(
        dim=8,
        optimizer="sgd",
        name=_name("stats"),
        memory_budget_bytes=1000 * (8 * 4 + 32),
        ssd_dir=str(tmp_path / "ssd"),
        shards=4,
    )
    t.pull(np.arange(4000))
    s = t.stats()
    assert 800 <= s["capacity_rows"] <= 1000
    assert s["rows_in_memory"] <= s["capacity_rows"] and s["rows_in_memory"] + s["rows_on_ssd"] == 4000
    assert s["bytes_in_memory"] <= s["memory_budget_bytes"]  # rows and their index fit the budget
    assert s["bytes_ssd_index"] >= 16 * s["rows_on_ssd"]
    assert s["misses"] == 4000 and s["hits"] == 0 and s["bytes_on_ssd"] >= s["rows_on_ssd"] * 48
    t.pull(np.arange(4000))
    assert t.stats()["ssd_promotions"] > 0
    ssd_dirs = list((tmp_path / "ssd").iterdir())
    assert len(ssd_dirs) == 1 and list(ssd_dirs[0].glob("shard-*.log"))


# ---- the host tier's batch calls ------------------------------------------------------------------------------
@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_take_and_put_rows_against_the_model(tmp_path, eviction):
    """take_rows / put_rows (the GPU table's promotions and evictions on the host, batched over the shards on
    host_threads threads) against the Python model of whole rows: take gives the row and removes it (an absent id
    its initial row; a repeated id its row, then its initial row), put overwrites (a repeated id: the last row),
    through a budget that spills and promotes; 1 and 3 threads alike."""
    dim, keyspace = 4, 3000
    model = Model(dim, "adam", 0.01, seed=5)
    stride = 3 * dim + 2
    tables = [
        SparseTable(
            dim,
            "adam",
            0.01,
            seed=5,
            shards=8,
            host_threads=threads,
            memory_budget_bytes=400 * (stride * 4 + 32),
            ssd_dir=str(tmp_path / f"ssd{threads}"),
            eviction=eviction,
            name=_name(f"tier{threads}"),
        )
        for threads in (1, 3)
    ]
    rng = np.random.default_rng(3)
    try:
        for _ in range(25):
            ids = rng.integers(0, keyspace, 500)
            rows = rng.normal(0, 1, (ids.size, stride)).astype(np.float32)
            scores = rng.integers(0, 1000, ids.size).astype(np.uint32) if rng.random() < 0.5 else None
            for t in tables:
                t.put_rows(ids, rows, scores)
            for k, row in zip(ids.tolist(), rows):
                model.rows[k] = row.copy()
            ids = rng.integers(0, keyspace + 300, 400)
            expected = []
            for k in ids.tolist():
                expected.append(model.row(k).copy())
                del model.rows[k]
            for t in tables:
                got = t.take_rows(ids)
                assert got.shape == (ids.size, stride) and np.array_equal(got, np.stack(expected))
        everything = np.arange(keyspace + 300)
        for t in tables:
            stats = t.stats()
            assert stats["evictions"] > 0 and stats["ssd_promotions"] > 0  # the tiers below were used
            rows, where = t.peek(everything)
            assert [int(k) for k in everything[where > 0]] == sorted(model.rows)
            assert np.array_equal(rows[where > 0], np.stack([model.rows[k] for k in sorted(model.rows)]))
    finally:
        for t in tables:
            t.close()


def test_take_and_put_rows_refuse_bad_input():
    with pytest.raises(SparseTableError, match="host_threads"):
        SparseTable(4, host_threads=-1)
    with pytest.raises(SparseTableError, match="host_threads"):
        SparseTable(4, host_threads=True)
    with pytest.raises(SparseTableError, match="host_threads"):
        SparseTable(4, host_threads=2000)
    t = SparseTable(4, "sgd", host_threads=2, name=_name("tier-bad"))
    try:
        assert "host_threads=2" in t.config_string
        with pytest.raises(SparseTableError, match="shape"):
            t.put_rows([1, 2], np.zeros((2, 5), np.float32))
        with pytest.raises(SparseTableError, match="scores"):
            t.put_rows([1, 2], np.zeros((2, 4), np.float32), scores=[1])
        t.put_rows([1, 2], np.ones((2, 4), np.float32))
        with pytest.raises(SparseTableError, match="reserved"):
            t.take_rows(np.array([1, -(2**63)], dtype=np.int64))
        assert len(t) == 2  # the refused take took nothing
        with pytest.raises(SparseTableError, match="out must be"):
            t.take_rows([1, 2], out=np.empty((2, 3), np.float32))
        buffer = np.full((2, 4), 9.0, np.float32)
        assert t.take_rows([2, 1], out=buffer) is buffer
        assert np.array_equal(buffer, np.ones((2, 4), np.float32)) and len(t) == 0
    finally:
        t.close()
