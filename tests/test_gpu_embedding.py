"""Embeddings on a GPU stage (heterps_paddle/runtime/gpu_embedding.py): SparseTable.assign, the pass's
working set, the servers' SGD rule, the trainer program rewrite, and a launched job with two units (1 server +
2 trainers, a one-stage plan on a gpu type) checking that the units' tables and the servers agree after each
pass and that the servers hold start + the sum of the units' deltas."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import native_ops  # noqa: E402  (builds the native libraries in a source checkout)
import numpy as np
import pytest

from heterps_paddle.table.sparse_table import SparseTable, SparseTableError  # noqa: E402


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
    t = SparseTable(
        dim=8, optimizer="sgd", memory_budget_bytes=64 << 10, ssd_dir=str(tmp_path), name="assign_ssd", shards=1
    )
    ids = np.arange(5000, dtype=np.int64)
    rows = np.random.default_rng(0).standard_normal((5000, 8)).astype(np.float32)
    t.assign(ids, rows)
    assert t.stats()["rows_on_ssd"] > 0
    np.testing.assert_array_equal(t.pull(ids), rows)
    t.assign(ids[:10], rows[:10] + 1)  # rows spilled meanwhile are promoted and overwritten
    np.testing.assert_array_equal(t.pull(ids[:10]), rows[:10] + 1)
    t.close()


# ---- pure helpers ---------------------------------------------------------------------------------------------
def test_working_set_reads_only_the_lookups_slots(tmp_path):
    from heterps_paddle.runtime.gpu_embedding import GpuEmbeddingError, working_set

    f1, f2 = tmp_path / "a.txt", tmp_path / "b.txt"
    f1.write_text("2 10 11 1 0.5 1 3\n1 12 1 0.1 1 4\n")
    f2.write_text("3 11 13 2**x 1 0.0 1 5\n".replace(" 2**x", " 14"))
    got = working_set([str(f1), str(f2)], ["ids", "dense", "other"], ["ids"])
    np.testing.assert_array_equal(got, [10, 11, 12, 13, 14])
    np.testing.assert_array_equal(
        working_set([str(f1)], ["ids", "dense", "other"], ["ids", "other"]), [3, 4, 10, 11, 12]
    )
    with pytest.raises(GpuEmbeddingError, match="not slots the dataset reads"):
        working_set([str(f1)], ["ids", "dense", "other"], ["nope"])
    (tmp_path / "c.txt").write_text("2 10\n")
    with pytest.raises(GpuEmbeddingError, match="not MultiSlot text"):
        working_set([str(tmp_path / "c.txt")], ["ids", "dense", "other"], ["ids"])


def _fake_sync(units, other_arrivals):
    """A PassSync whose servers are one counter row; the other units arrive after ``other_arrivals`` polls."""
    import types

    from heterps_paddle.runtime import gpu_embedding as ge

    sync = ge.PassSync.__new__(ge.PassSync)
    sync.tables = [ge.GpuTable(param="E", layer="embedding_0", dim=4)]
    sync.units, sync.unit, sync.barriers, sync.timeout = units, 0, 0, 0.5
    sync.worker = types.SimpleNamespace(client_flush=lambda: None)
    state = {"row": np.array([[0.031, 0, 0, 0]], np.float32), "polls": 0}  # a random-looking initial value

    def push(t, ids, delta):
        assert ids.tolist() == [ge.SYNC_KEY]
        state["row"] += delta

    def pull(t, ids):
        state["polls"] += 1
        if other_arrivals is not None and state["polls"] == other_arrivals:
            state["row"][0, 0] += ge.SYNC_UNIT * (units - 1)
        return state["row"].copy()

    sync.push_to_servers, sync.server_rows = push, pull
    return sync, state


def test_pass_barrier_waits_for_every_unit_and_times_out_naming_the_pass():
    from heterps_paddle.runtime.gpu_embedding import GpuEmbeddingError

    sync, state = _fake_sync(units=3, other_arrivals=4)
    sync.barrier("pass 1 start")
    assert state["polls"] == 4  # it kept polling until all 3 arrivals were counted
    assert sync.barriers == 1
    sync, _ = _fake_sync(units=2, other_arrivals=None)  # the other unit never comes
    with pytest.raises(GpuEmbeddingError, match="pass 2 end: 1 of 2 unit arrivals"):
        sync.barrier("pass 2 end")


def test_servers_get_naive_sgd_rule_and_conflicts_are_refused():
    pytest.importorskip("paddle")
    import paddle.distributed.fleet as fleet

    from heterps_paddle.runtime.gpu_embedding import NAIVE_RULE, GpuEmbeddingError, use_naive_sgd_on_servers

    s = fleet.DistributedStrategy()
    s.sparse_table_configs = {"other": {"table_parameters.other.shard_num": 7}}
    use_naive_sgd_on_servers(s, ["E"])
    use_naive_sgd_on_servers(s, ["E"])  # idempotent: one entry
    entries = [t for t in s.sparse_table_configs if t.table_name == "E"]
    assert len(entries) == 1
    for rule in (entries[0].accessor.embed_sgd_param, entries[0].accessor.embedx_sgd_param):
        assert rule.name == NAIVE_RULE and rule.naive.learning_rate == 1.0
        assert list(rule.naive.weight_bounds)[1] > 1e6
    s2 = fleet.DistributedStrategy()
    s2.sparse_table_configs = {"E": {"table_parameters.E.accessor.embed_sgd_param.name": "SparseAdamSGDRule"}}
    with pytest.raises(GpuEmbeddingError, match="SparseAdamSGDRule"):
        use_naive_sgd_on_servers(s2, ["E"])


def test_split_plan_with_embedding_on_gpu_stage_is_refused(tmp_path):
    pytest.importorskip("paddle")
    code = textwrap.dedent(r'''
        import sys, paddle
        from heterps_paddle.planning.model import plan_from_dict, PlanningInputError as PlanError
        from heterps_paddle.runtime.gpu_embedding import gpu_sparse_layers
        paddle.enable_static()
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            ids = paddle.static.data("ids", [None, 1], "int64", lod_level=1)
            emb = paddle.static.nn.sparse_embedding(ids, [100, 4], param_attr=paddle.ParamAttr(name="E"))
            h = paddle.static.nn.fc(paddle.reshape(emb, [-1, 4]), 2)
            ids2 = paddle.static.data("ids2", [None, 1], "int64", lod_level=1)
            emb2 = paddle.static.nn.sparse_embedding(ids2, [100, 2], param_attr=paddle.ParamAttr(name="F"))
            out = paddle.static.nn.fc(paddle.concat([h, paddle.reshape(emb2, [-1, 2])], axis=1), 1)
        layers = ["embedding_0", "fc_0", "embedding_1", "fc_1"]
        kinds = {"local_gpu": "gpu", "local_cpu": "cpu"}
        one = plan_from_dict({"format": 1, "feasible": True,
                              "stages": [{"resource": "local_gpu", "layers": layers, "units": 2}]}, kinds=kinds)
        assert gpu_sparse_layers(main, one) == [("embedding_0", "E"), ("embedding_1", "F")]
        cpu = plan_from_dict({"format": 1, "feasible": True,
                              "stages": [{"resource": "local_cpu", "layers": layers, "units": 2}]}, kinds=kinds)
        assert gpu_sparse_layers(main, cpu) == []
        split = plan_from_dict({"format": 1, "feasible": True,
                                "stages": [{"resource": "local_cpu", "layers": layers[:2], "units": 1},
                                           {"resource": "local_gpu", "layers": layers[2:], "units": 1}]}, kinds=kinds)
        try:
            gpu_sparse_layers(main, split)
        except PlanError as e:
            print("REFUSED", e)
    ''')
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=native_ops.package_env()
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REFUSED" in proc.stdout and "GPU stage of a split plan" in proc.stdout, proc.stdout


# ---- a launched job with two units ------------------------------------------------------------------------------
JOB = textwrap.dedent(r'''
    import zlib  # noqa: F401
    import json, os, sys
    import numpy as np
    import paddle
    import paddle.distributed.fleet as fleet
    import heterps_paddle  # noqa: F401  (strategy.heterps)
    from heterps_paddle.table.sparse_table import load_ops
    from heterps_paddle.runtime.dense_refresh import pull_dense_into
    from heterps_paddle.runtime.gpu_embedding import pass_sync

    load_ops()
    out_dir, plan, test_file = sys.argv[1], sys.argv[2], sys.argv[3]
    passes = 3
    paddle.enable_static()
    paddle.seed(3)
    fleet.init()
    main, startup = paddle.static.Program(), paddle.static.Program()
    main.random_seed = startup.random_seed = 3
    with paddle.static.program_guard(main, startup):
        ids = paddle.static.data("ids", [None, 1], "int64", lod_level=1)
        label = paddle.static.data("label", [None, 1], "int64")
        init = paddle.nn.initializer.Uniform(-0.05, 0.05)
        emb = paddle.static.nn.sparse_embedding(ids, [1000, 8], param_attr=paddle.ParamAttr(name="E", initializer=init))
        pooled = paddle.static.nn.sequence_lod.sequence_pool(paddle.reshape(emb, [-1, 8]), "sum")
        logits = paddle.static.nn.fc(pooled, 2, name="fc_0")
        loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, label))
        strategy = fleet.DistributedStrategy()
        strategy.a_sync = True
        strategy.heterps = True
        strategy.heterps_configs = {"plan": plan}
        fleet.distributed_optimizer(paddle.optimizer.Adam(0.02), strategy).minimize(loss)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        sys.exit(0)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    fleet.init_worker()
    prog = loss.block.program  # the trainer program the PS optimizer built (and heterps rewrote)
    types = [op.type for op in prog.global_block().ops]
    sync = pass_sync(prog)
    t = sync.tables[0]
    rt = fleet.fleet._runtime_handle
    scope = paddle.static.global_scope()

    lines = [l.split() for l in open(test_file).read().splitlines()]
    test_ids = [np.array(l[1:1 + int(l[0])], np.int64) for l in lines]
    test_y = np.array([int(l[-1]) for l in lines])

    def heldout():
        """log loss and AUC of the model as the servers hold it (numpy forward of pool-sum -> fc -> softmax)."""
        pull_dense_into(scope, rt)
        w = np.array(scope.find_var("fc_0.w_0").get_tensor())
        b = np.array(scope.find_var("fc_0.b_0").get_tensor())
        uniq = np.unique(np.concatenate(test_ids))
        rows = dict(zip(uniq.tolist(), sync.server_rows(t, uniq)))
        pooled = np.stack([sum(rows[i] for i in s.tolist()) for s in test_ids])
        z = pooled @ w + b
        z -= z.max(1, keepdims=True)
        p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
        ll = float(-np.log(p[np.arange(len(test_y)), test_y] + 1e-12).mean())
        s = p[:, 1]
        pos, neg = s[test_y == 1], s[test_y == 0]
        auc = float((pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean())
        return ll, auc

    before = heldout()
    sync.barrier("before training")  # no unit pushes a delta while another still reads the initial model
    dataset = paddle.distributed.QueueDataset()
    dataset.init(batch_size=32, thread_num=1, use_var=[ids, label], pipe_command="cat")
    dataset.set_filelist([os.path.join(out_dir, f"train{fleet.worker_index()}.txt")])
    for _ in range(passes):
        exe.train_from_dataset(prog, dataset)
    rec = sync.last[t.param]
    local_after = t.table.pull(rec["ids"])
    sync.barrier("final check")  # both units are done: what the servers hold now is final
    server_final = sync.server_rows(t, rec["ids"])
    after = heldout()
    sync.barrier("before exit")  # held-out reads do not race the other unit's exit
    json.dump({"ops": types, "passes": sync.passes, "units": sync.units, "ids": rec["ids"].tolist(),
               "start": rec["start"].tolist(), "trained": rec["trained"].tolist(),
               "synced": rec["synced"].tolist(), "local_after": local_after.tolist(),
               "server_final": server_final.tolist(), "before": before, "after": after,
               "table_rows": len(t.table)},
              open(os.path.join(out_dir, f"unit{fleet.worker_index()}.json"), "w"))
    fleet.stop_worker()
''')


def _write_data(tmp_path):
    rng = np.random.default_rng(11)

    def rows(n, lo, hi):
        ids = rng.integers(lo, hi, size=(n, 3))
        label = ((ids % 2 == 0).sum(1) >= 2).astype(int)  # most ids even: linear in the pooled embedding
        return [f"3 {a} {b} {c} 1 {y}" for (a, b, c), y in zip(ids.tolist(), label.tolist())]

    # Overlapping id ranges: ids 100..199 are trained by both units in every pass.
    (tmp_path / "train0.txt").write_text("\n".join(rows(1200, 0, 200)) + "\n")
    (tmp_path / "train1.txt").write_text("\n".join(rows(1200, 100, 300)) + "\n")
    (tmp_path / "test.txt").write_text("\n".join(rows(600, 0, 300)) + "\n")


@pytest.mark.launched
def test_two_units_stay_consistent_with_the_servers(tmp_path):
    pytest.importorskip("paddle")
    _write_data(tmp_path)
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "format": 1,
                "feasible": True,
                "stages": [{"resource": "local_gpu", "kind": "gpu", "layers": ["embedding_0", "fc_0"], "units": 2}],
            }
        )
    )
    (tmp_path / "job.py").write_text(JOB)
    env = native_ops.package_env()
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        env.pop(var, None)
    env["HETERPS_PASS_SYNC_TIMEOUT"] = "60"  # a unit that never arrives fails the job instead of hanging it
    cmd = [
        sys.executable,
        "-m",
        "paddle.distributed.launch",
        "--server_num=1",
        "--worker_num=2",
        f"--log_dir={tmp_path / 'log'}",
        str(tmp_path / "job.py"),
        str(tmp_path),
        str(plan),
        str(tmp_path / "test.txt"),
    ]
    # Own process group: on a timeout the launcher's children (server, trainers) go too.
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=200)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    proc = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    logs = (
        "".join(p.read_text(errors="replace")[-3000:] for p in sorted((tmp_path / "log").glob("*")) if p.is_file())
        if (tmp_path / "log").exists()
        else ""
    )
    units = [tmp_path / f"unit{i}.json" for i in range(2)]
    assert proc.returncode == 0 and all(u.exists() for u in units), proc.stdout[-2000:] + proc.stderr[-2000:] + logs
    a, b = (json.loads(u.read_text()) for u in units)
    for r in (a, b):
        assert r["units"] == 2 and r["passes"] == 3
        # The lookups read the local table; nothing is pulled from or pushed to the servers per batch.
        assert "heterps_pull" in r["ops"] and "heterps_pull_grad" in r["ops"]
        assert "distributed_lookup_table" not in r["ops"] and "distributed_push_sparse" not in r["ops"]
        # No silent divergence: after the pass the unit's rows are the servers' final rows.
        np.testing.assert_array_equal(np.array(r["local_after"]), np.array(r["server_final"]))
        np.testing.assert_array_equal(np.array(r["synced"]), np.array(r["server_final"]))
        assert np.abs(np.array(r["trained"]) - np.array(r["start"])).max() > 1e-3  # the unit trained
    ia, ib = np.array(a["ids"]), np.array(b["ids"])
    common, pa, pb = np.intersect1d(ia, ib, return_indices=True)
    assert common.size > 50
    start_a, start_b = np.array(a["start"])[pa], np.array(b["start"])[pb]
    np.testing.assert_array_equal(start_a, start_b)  # every unit started the pass from the same rows
    da = np.array(a["trained"]) - np.array(a["start"])
    db = np.array(b["trained"]) - np.array(b["start"])
    # Servers after the last pass = start + the sum of the units' deltas (shared rows), start + own delta (the rest).
    np.testing.assert_allclose(np.array(a["server_final"])[pa], start_a + da[pa] + db[pb], atol=2e-6, rtol=0)
    only_a = np.setdiff1d(np.arange(ia.size), pa)
    np.testing.assert_allclose(
        np.array(a["server_final"])[only_a], np.array(a["start"])[only_a] + da[only_a], atol=2e-6, rtol=0
    )
    # Both deltas mattered on shared rows (the sum is not one unit's value).
    assert np.abs(db[pb]).max() > 1e-3 and np.abs(da[pa]).max() > 1e-3
    np.testing.assert_array_equal(np.array(a["server_final"])[pa], np.array(b["server_final"])[pb])
    # The job learns: held-out loss falls and AUC is far above chance (label = most ids even).
    (ll0, _), (ll1, auc1) = a["before"], a["after"]
    assert ll1 < ll0 - 0.1 and auc1 > 0.8, (a["before"], a["after"])


def test_one_stage_gpu_plan_runs_on_the_launched_trainers():
    from heterps_paddle.planning.launch import LaunchMismatchError, LaunchShape, check_launch_matches
    from heterps_paddle.planning.model import plan_from_dict

    plan = plan_from_dict(
        {
            "format": 1,
            "feasible": True,
            "stages": [{"resource": "local_gpu", "kind": "gpu", "layers": ["embedding_0", "fc_0"], "units": 2}],
        },
        "p.json",
    )
    assert plan.stages[0].kind == "gpu"
    for n in (2, 3):  # data parallel: more units than planned only add throughput
        check_launch_matches(plan, LaunchShape(n))
    with pytest.raises(LaunchMismatchError, match=r"needs 2 trainers \(local_gpu, gpu\).*--worker_num=2"):
        check_launch_matches(plan, LaunchShape(1))
