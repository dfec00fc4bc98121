"""Saves, checkpoints and metrics of split jobs, without launching one (the launched checks are in
tests/test_style_trainer.py)."""

import json
import os

import numpy as np
import pytest

from heterps_paddle.planning.model import Plan, Stage
from heterps_paddle.runtime import checkpoint, saves, seam, stage_metrics


@pytest.fixture
def heter_context():
    ctx = seam.reset_context({"TRAINING_ROLE": "HETER_TRAINER", "STAGE_ID": "2", "STAGE_NUM": "2"})
    ctx.plan = Plan(
        scheduler="file",
        model="ctr_dnn",
        feasible=True,
        assignment={"embedding_0": "local_cpu", "fc_0": "local_gpu"},
        stages=(
            Stage(resource="local_cpu", kind="cpu", layers=("embedding_0",), units=1),
            Stage(resource="local_gpu", kind="gpu", layers=("fc_0",), units=1),
        ),
    )
    yield ctx
    seam.reset_context({})


def test_a_save_on_a_heterogeneous_trainer_is_refused(heter_context, tmp_path):
    with pytest.raises(saves.SaveNotPossibleHere, match="save on the stage 1 CPU trainers"):
        saves.before_fleet_save("_save_inference_model", None, {"dirname": str(tmp_path)})
    written = []
    with pytest.raises(saves.SaveNotPossibleHere, match="heterogeneous trainer"):
        saves.static_save(lambda *a, **k: written.append(a), None, str(tmp_path / "model"))
    assert written == [] and os.listdir(tmp_path) == []  # nothing half-written


SPLIT = (
    checkpoint.DenseTable(1, ("fc.b",), (2,)),
    checkpoint.DenseTable(2, ("fc.w",), (3,)),
    checkpoint.DenseTable(3, ("out.b",), (1,)),
)
ONE_STAGE = (checkpoint.DenseTable(1, ("fc.b", "fc.w", "out.b"), (2, 3, 1)),)


def _lines(n, start):
    return [f"{start + i}.5 {i} {i * 2}".encode() for i in range(n)]


def test_dense_tables_regroup_between_layouts_bit_for_bit(tmp_path):
    split = {1: _lines(2, 0), 2: _lines(3, 10), 3: _lines(1, 20)}
    checkpoint._write_tables(str(tmp_path / "split"), split)
    one = checkpoint.regroup(str(tmp_path / "split"), SPLIT, ONE_STAGE)
    assert one == {1: split[1] + split[2] + split[3]}
    checkpoint._write_tables(str(tmp_path / "one"), one)
    assert checkpoint.regroup(str(tmp_path / "one"), ONE_STAGE, SPLIT) == split


def test_a_checkpoint_of_another_model_is_refused_naming_the_parameter(tmp_path):
    checkpoint._write_tables(str(tmp_path), {1: _lines(6, 0)})
    other = (checkpoint.DenseTable(1, ("fc.b", "fc.w", "out.b"), (2, 2, 2)),)
    with pytest.raises(checkpoint.CheckpointError, match="fc.w has 2 values, the program's has 3"):
        checkpoint.regroup(str(tmp_path), other, ONE_STAGE)
    with pytest.raises(checkpoint.CheckpointError, match="dense table 1 has 6 values, its parameters fc.b have 2"):
        checkpoint.regroup(str(tmp_path), SPLIT, ONE_STAGE)
    partial = tmp_path / "partial"
    checkpoint._write_tables(str(partial), {1: _lines(2, 0)})
    with pytest.raises(checkpoint.CheckpointError, match=r"dense table 2 \(fc.w\) is missing"):
        checkpoint.regroup(str(partial), SPLIT, ONE_STAGE)


def test_a_corrupted_or_incomplete_checkpoint_is_refused_by_name(tmp_path):
    checkpoint._write_tables(str(tmp_path), {1: _lines(6, 0)})
    manifest = {
        "format": checkpoint.FORMAT,
        "layout": "one-stage",
        "servers": 1,
        "dense_tables": [t.to_dict() for t in ONE_STAGE],
        "files": checkpoint.digests(str(tmp_path)),
    }
    (tmp_path / checkpoint.MANIFEST).write_text(json.dumps(manifest))
    layout, servers = checkpoint._source_layout(None, str(tmp_path))
    assert layout == ONE_STAGE and servers == 1
    part = tmp_path / "001" / "part-000.gz"
    part.write_bytes(part.read_bytes()[:-3] + b"xyz")
    with pytest.raises(checkpoint.CheckpointError, match=r"001/part-000.gz does not match its checksum"):
        checkpoint._source_layout(None, str(tmp_path))
    part.unlink()
    with pytest.raises(checkpoint.CheckpointError, match=r"001/part-000.gz is missing"):
        checkpoint._source_layout(None, str(tmp_path))


@pytest.mark.parametrize("trainers", [1, 2, 3, 5])
def test_the_last_stages_counts_are_shared_out_exactly(trainers):
    delta = np.array([0, 1, 2, 7, 1000, 12345], dtype="int64")
    clients = [stage_metrics.Client([], trainers, i) for i in range(trainers)]
    shares = [c.share(delta) for c in clients]
    assert np.array_equal(sum(shares), delta)
    assert all(np.all(s >= 0) for s in shares)


def test_trainers_whose_passes_do_not_line_up_still_add_up_to_the_last_stages_counts():
    # The last stage's cumulative counts over time; trainer 1 has no batch and its passes are instants, trainer 0's
    # batches land at other times (stage_metrics.PassMetrics: each adds its share of the growth since its last read).
    counts = [np.array(c, dtype="int64") for c in ([0, 0, 0], [1, 0, 3], [1, 1, 3], [2, 1, 8], [3, 3, 9])]
    reads = {0: [0, 1, 3, 4], 1: [0, 2, 4]}  # the moments each trainer reads (its passes' ends), indices of counts
    totals = []
    for index, moments in reads.items():
        client = stage_metrics.Client([], 2, index)
        growth = [client.share_of_growth(counts[a], counts[b]) for a, b in zip(moments, moments[1:])]
        assert all(np.all(g >= 0) for g in growth)
        totals.append(sum(growth))
    assert np.array_equal(totals[0] + totals[1], counts[-1])  # both read the final counts: nothing lost or doubled


def test_static_savers_refuse_parameter_server_tables(tmp_path):
    import paddle
    from paddle.base import core

    paddle.enable_static()
    try:
        main = paddle.static.Program()
        main.global_block().create_var(
            name="SparseFeatFactors",
            type=core.VarDesc.VarType.SELECTED_ROWS,
            persistable=True,
            shape=[10, 2],
            dtype="float32",
        )
        seam.reset_context({"TRAINING_ROLE": "TRAINER"})
        written = []
        with pytest.raises(saves.SaveNotPossibleHere, match="SparseFeatFactors live on the parameter servers"):
            saves.static_save(lambda *a, **k: written.append(a), main, str(tmp_path / "all"))
        with pytest.raises(saves.SaveNotPossibleHere, match="fleet.save_inference_model"):
            saves.static_save_inference_model(
                lambda *a, **k: written.append(a), str(tmp_path / "model"), [], [], None, program=main
            )
        assert written == [] and os.listdir(tmp_path) == []
    finally:
        seam.reset_context({})
        paddle.disable_static()


def test_init_server_from_a_missing_or_empty_directory_is_an_error(tmp_path):
    # Paddle's own loader skips a missing directory silently: the job would train from scratch
    with pytest.raises(checkpoint.CheckpointError, match="no such directory"):
        checkpoint.restore_tables(None, str(tmp_path / "nope"))
    with pytest.raises(checkpoint.CheckpointError, match="no saved tables there"):
        checkpoint.restore_tables(None, str(tmp_path))


def _program_with_batch_norms():
    import paddle

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, 4], "float32")
        hidden = paddle.static.nn.batch_norm(paddle.static.nn.fc(x, 4), moving_mean_name="bn_mean")
        paddle.static.nn.batch_norm(hidden, moving_mean_name="bn2_mean", moving_variance_name="bn2_var")
    return main, startup


def test_a_programs_running_statistics_are_its_batch_norms_moving_mean_and_variance():
    main, _ = _program_with_batch_norms()
    names = stage_metrics.running_statistics(main)
    assert names[0] == "bn_mean" and names[2:] == ["bn2_mean", "bn2_var"] and len(names) == 4, names


def test_a_later_stages_running_statistics_are_saved_as_its_heterogeneous_trainer_holds_them(monkeypatch):
    """The whole model's startup left a later stage's batch-norm statistics at 0 and 1 on the CPU trainer; a split's
    save takes them from that stage's trainer 0 (DLRM's top MLP), and says which it could not get."""
    import paddle

    main, startup = _program_with_batch_norms()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    held = {"bn2_mean": np.arange(4, dtype="float32"), "bn2_var": np.full(4, 7, dtype="float32")}
    client = stage_metrics.Client([], 1, 0, first_of_stage=["heter.2.0"])
    monkeypatch.setattr(client, "running_statistics", lambda: dict(held))
    monkeypatch.setattr(stage_metrics, "client", lambda: client)
    # this process's section holds the first batch norm (its own, trained here): it is left as it is
    section = paddle.static.Program()
    with paddle.static.program_guard(section, paddle.static.Program()):
        paddle.static.nn.batch_norm(paddle.static.data("y", [None, 4], "float32"), moving_mean_name="bn_mean")
    with paddle.static.program_guard(section):
        saves.later_stages_statistics(main, scope, "test save")
    assert np.array(scope.find_var("bn2_mean").get_tensor()).tolist() == [0, 1, 2, 3]
    assert np.array(scope.find_var("bn2_var").get_tensor()).tolist() == [7, 7, 7, 7]
    assert np.array(scope.find_var("bn_mean").get_tensor()).tolist() == [0, 0, 0, 0]  # startup's, untouched
    warnings = []
    monkeypatch.setattr(saves.logger, "warning", lambda *args: warnings.append(args[0] % args[1:]))
    held.pop("bn2_var")
    with paddle.static.program_guard(section):
        saves.later_stages_statistics(main, scope, "test save")
    assert len(warnings) == 1 and "saved at their startup values" in warnings[0] and "bn2_var" in warnings[0]
