"""A launched parameter-server job (1 server + 1 worker, async) whose model looks its ids up with
sparse_embedding: the pull and its push grad op run inside the PS trainer's train_from_dataset threads,
and the worker saves the table, which this process then loads and checks."""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import native_ops  # noqa: E402  (builds the native libraries in a source checkout)
import numpy as np
import pytest

pytestmark = pytest.mark.launched  # real parameter-server jobs

pytest.importorskip("paddle")

JOB = textwrap.dedent(r'''
    import zlib  # noqa: F401
    import json, os, sys
    import numpy as np
    import paddle
    import paddle.distributed.fleet as fleet
    from heterps_paddle.table.sparse_table import SparseTable, sparse_embedding, load_ops

    load_ops()  # every process of the job, the server included, before any program exists
    out_dir, data_file = sys.argv[1], sys.argv[2]
    paddle.enable_static()
    fleet.init()
    table = SparseTable(dim=8, optimizer="adagrad", lr=0.2, seed=5, name="ps_emb")
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        ids = paddle.static.data("ids", [None, 3], "int64")
        label = paddle.static.data("label", [None, 1], "int64")
        pooled = paddle.sum(sparse_embedding(ids, table), axis=1)
        logits = paddle.static.nn.fc(pooled, 2)
        loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, label))
        strategy = fleet.DistributedStrategy()
        strategy.a_sync = True
        fleet.distributed_optimizer(paddle.optimizer.Adam(0.01), strategy).minimize(loss)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        sys.exit(0)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    fleet.init_worker()
    types = [op.type for op in main.global_block().ops]
    dataset = paddle.distributed.QueueDataset()
    dataset.init(batch_size=32, thread_num=2, use_var=[ids, label], pipe_command="cat")
    dataset.set_filelist([data_file])
    for _ in range(4):
        exe.train_from_dataset(main, dataset)
    fleet.stop_worker()
    keys = np.arange(100, dtype=np.int64)
    rows, where = table.peek(keys)
    path = table.save(os.path.join(out_dir, "ckpt"))
    json.dump({"ops": types, "stats": table.stats(), "found": where.tolist(), "checkpoint": path,
               "weights": rows[:, :8].tolist()}, open(os.path.join(out_dir, "worker.json"), "w"))
''')


def test_launched_ps_job_trains_the_table(tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 100, size=(1500, 3))
    label = (ids[:, 0] < 50).astype(int)  # learnable from the first id's embedding only
    lines = [f"3 {a} {b} {c} 1 {y}" for (a, b, c), y in zip(ids.tolist(), label.tolist())]
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "job.py").write_text(JOB)
    env = native_ops.package_env()
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        env.pop(var, None)
    cmd = [
        sys.executable,
        "-m",
        "paddle.distributed.launch",
        "--server_num=1",
        "--worker_num=1",
        f"--log_dir={tmp_path / 'log'}",
        str(tmp_path / "job.py"),
        str(tmp_path),
        str(tmp_path / "train.txt"),
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    logs = (
        "".join(p.read_text(errors="replace")[-3000:] for p in sorted((tmp_path / "log").glob("*")) if p.is_file())
        if (tmp_path / "log").exists()
        else ""
    )
    assert proc.returncode == 0 and (tmp_path / "worker.json").exists(), (
        proc.stdout[-2000:] + proc.stderr[-2000:] + logs
    )
    res = json.loads((tmp_path / "worker.json").read_text())
    assert "heterps_pull" in res["ops"] and "heterps_pull_grad" in res["ops"]
    assert res["stats"]["rows_in_memory"] == 100 and all(w == 1 for w in res["found"])
    # The pushes ran in the trainer: rows moved away from their deterministic initial values, and the
    # label's id groups moved apart (the first id decides the label).
    from heterps_paddle.table.sparse_table import SparseTable

    fresh = SparseTable(dim=8, optimizer="adagrad", lr=0.2, seed=5, name="ps_emb")  # same init, this process
    start = fresh.pull(np.arange(100))
    trained = np.array(res["weights"], np.float32)
    assert np.abs(trained - start).max() > 0.05
    gap = np.linalg.norm((trained - start)[:50].mean(0) - (trained - start)[50:].mean(0))
    assert gap > 0.05
    # The checkpoint written inside the job loads here.
    fresh.load(Path(res["checkpoint"]).parent)
    np.testing.assert_array_equal(fresh.pull(np.arange(100)), trained)
    fresh.close()
    shutil.rmtree(tmp_path / "log", ignore_errors=True)
