"""The launch's checkpoints without a job (tests/test_launch_checkpoints.py launches them): the options, the
choice of the checkpoint to resume from, the refusals by name."""

import json
import os

import pytest

from heterps_paddle import settings
from heterps_paddle.launch.options import parse
from heterps_paddle.runtime import checkpoint_choice as cc
from heterps_paddle.runtime.checkpoint_files import MANIFEST, CheckpointError, add_to_manifest, digests


def make(root, passes, manifest=True, launch_passes=None):
    path = root / cc.checkpoint_name(passes)
    (path / "001").mkdir(parents=True)
    (path / "001" / "part-000").write_text(f"{passes}.0 0 0\n")
    if manifest:
        (path / MANIFEST).write_text(json.dumps({"format": 1, "files": digests(str(path))}))
        done = passes if launch_passes is None else launch_passes
        add_to_manifest(str(path), [], {"launch": {"passes_done": done}})
    return path


def test_newest_that_verifies_is_chosen_and_the_others_named(tmp_path):
    make(tmp_path, 1)
    make(tmp_path, 2)
    corrupt = make(tmp_path, 3)
    (corrupt / "001" / "part-000").write_text("9.0 0 0\n")
    make(tmp_path, 4, manifest=False)
    make(tmp_path, 5, launch_passes=7)
    (tmp_path / ".pass-000006.incomplete").mkdir()
    choice = cc.choose(str(tmp_path))
    assert choice.path == str(tmp_path / "pass-000002") and choice.passes_done == 2
    reasons = dict(choice.refused)
    assert [os.path.basename(p) for p, _ in choice.refused] == ["pass-000005", "pass-000004", "pass-000003"]
    assert "says 7 passes done, its name 5" in reasons[str(tmp_path / "pass-000005")]
    assert "incomplete (no heterps_checkpoint.json" in reasons[str(tmp_path / "pass-000004")]
    assert "001/part-000 does not match its checksum (corrupted)" in reasons[str(tmp_path / "pass-000003")]
    lines = choice.lines()
    assert lines[0].startswith("checkpoint REFUSED: checkpoint ") and "resuming from checkpoint" in lines[-1]


def test_a_stray_file_refuses_the_checkpoint_by_name_and_the_previous_one_is_used(tmp_path):
    """An exact uncompressed copy of a part beside it, as someone inspecting a checkpoint might leave (``gzip -dk``):
    the servers would read it, so the checkpoint is refused naming it, as a corrupted one is."""
    make(tmp_path, 1)
    newest = make(tmp_path, 2)
    (newest / "001" / "part-000.copy").write_text("2.0 0 0\n")
    (newest / ".hidden").write_text("x")
    choice = cc.choose(str(tmp_path))
    assert choice.path == str(tmp_path / "pass-000001"), choice
    why = dict(choice.refused)[str(newest)]
    assert ".hidden is not in its manifest (a stray file: the servers would read it), and 1 more" in why, why
    (newest / ".hidden").unlink()
    assert "001/part-000.copy is not in its manifest" in dict(cc.choose(str(tmp_path)).refused)[str(newest)]
    (newest / "001" / "part-000.copy").unlink()
    assert cc.choose(str(tmp_path)).path == str(newest)


def test_none_usable_starts_fresh_loudly(tmp_path):
    make(tmp_path, 1, manifest=False)
    choice = cc.choose(str(tmp_path))
    assert choice.path is None and choice.passes_done == 0
    assert "NO USABLE CHECKPOINT (1 refused): starting FRESH" in choice.lines()[-1]
    assert "no checkpoint there yet" in cc.choose(str(tmp_path / "new")).lines()[-1]


def test_launch_options_and_environment(tmp_path):
    train = tmp_path / "train.py"
    train.write_text("")
    options = parse(["--checkpoint-dir", str(tmp_path), "--worker_num=1", "--checkpoint-every=10m", str(train)])
    assert (options.checkpoint_dir, options.checkpoint_every) == (str(tmp_path), "10m")
    assert options.launcher_argv() == ["--worker_num=1", str(train)]
    make(tmp_path, 3)
    env, lines = cc.prepare_launch(str(tmp_path), "10m")
    assert env["HETERPS_CHECKPOINT_RESUME"] == str(tmp_path / "pass-000003")
    assert settings.get("HETERPS_CHECKPOINT_EVERY", env) == (10.0, "minutes")
    assert settings.get("HETERPS_CHECKPOINT_EVERY", {}) == (1.0, "passes")
    with pytest.raises(CheckpointError, match="needs --checkpoint-dir"):
        cc.prepare_launch(None, "2")
    for bad in ("0", "-1", "x", "1.5", "0m"):
        with pytest.raises(CheckpointError, match="--checkpoint-every"):
            cc.prepare_launch(str(tmp_path), bad)
