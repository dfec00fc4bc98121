"""The example trainer outside a launch: one process, real files, bad input."""

import shutil
import subprocess
import sys

import pytest

from heterps_paddle.examples import MODELS, TRAINER_SCRIPT, build_program, model_config_path, random_feed


def run_trainer(tmp_path, *args, timeout=300):
    return subprocess.run(
        [sys.executable, TRAINER_SCRIPT, *args], cwd=tmp_path, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("name", MODELS)
def test_models_build_and_train_a_few_steps(name):
    import numpy as np
    import paddle

    main, startup, model = build_program(name, embedding="local", sparse_feature_number=100_001)
    with paddle.static.program_guard(main, startup):
        paddle.optimizer.Adam(0.01).minimize(model.loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe.run(startup)
        feed = random_feed(model, 128, seed=0)
        losses = [float(exe.run(main, feed=feed, fetch_list=[model.loss])[0]) for _ in range(15)]
        predict = exe.run(main, feed=feed, fetch_list=[model.predict])[0]
    assert predict.shape == (128, 2) and np.allclose(predict.sum(axis=1), 1, atol=1e-5)
    assert losses[-1] < losses[0]  # fits one batch


def one_epoch_on(data):
    """Trainer arguments: CTR-DNN, one epoch of batch 16 over the files in ``data`` (train and held-out alike)."""
    return ["-m", model_config_path("ctr_dnn"), "-o", f"train_dir={data}", "-o", f"test_dir={data}",
            "-o", "batch_size=16", "-o", "epochs=1"]  # fmt: skip


def test_single_process_run_on_the_real_criteo_sample(tmp_path, criteo_sample):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(criteo_sample, data / "part-0")
    result = run_trainer(tmp_path, *one_epoch_on(data))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RESULT model=ctr_dnn heterps=off workers=1 held-out AUC=" in result.stdout
    assert "(on 80 rows)" in result.stdout


def test_malformed_data_stops_the_trainer_naming_file_and_line(tmp_path, criteo_sample):
    data = tmp_path / "data"
    data.mkdir()
    lines = open(criteo_sample).read().splitlines()
    lines[6] = lines[6].replace("dense_feature:0.0 ", "dense_feature:zero ", 1)
    (data / "part-0").write_text("\n".join(lines) + "\n")
    args = one_epoch_on(data)
    result = run_trainer(tmp_path, *args)
    assert result.returncode != 0
    assert f"{data / 'part-0'}:7: dense_feature: 'zero' is not a number" in result.stderr
    skipped = run_trainer(tmp_path, *args, "-o", "skip_malformed=true")
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    assert "skipped 1 malformed line(s)" in skipped.stdout and "(on 79 rows)" in skipped.stdout


@pytest.mark.parametrize(
    "override, message",
    [
        ("bogus=1", "unknown key 'bogus'"),
        ("batch_size=0", "batch_size must be positive"),
        ("epochs=two", "epochs must be int"),
    ],
)
def test_bad_run_config_is_an_error(tmp_path, override, message):
    result = run_trainer(tmp_path, "-m", model_config_path("ctr_dnn"), "-o", override)
    assert result.returncode != 0 and message in result.stderr
