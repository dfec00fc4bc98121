"""Incremental checkpoints (docs/checkpoints.md, "Incremental checkpoints"), real jobs, real files: a one-stage job
(one server, two CPU trainers: trainer 0's decisions reach the other at every pass's barrier) whose epochs read different files (tests/scripts/windowed_trainer.py), with
``HETERPS_CHECKPOINT_BASE_EVERY=3`` and ``--checkpoint-every 2``.  One launch sequence:

1. the first launch, 4 epochs, started with a checkpoint asked for (ask_checkpoint, as the coordinator does when a
   host asks to leave): a checkpoint comes in pass 1 or at its end, which is not due (the ask honoured, then
   removed): a full base; passes 2 and 4 are increments (pass 3 is not due); the script's own full save after pass
   4 is the reference;
2. a relaunch over the same directory: it verifies the chain (base, increment, increment), its servers load the
   base and the increments in order, every pass is skipped, and the script's full save after the restore equals the
   reference: sparse tables line for line but the delta_score column, dense tables line for line.
"""

import gzip
import json
import os
import shutil

import pytest

from heterps_paddle.data.generator import generate
from heterps_paddle.planning.launch import launch_arguments
from heterps_paddle.planning.model import load_plan
from heterps_paddle.runtime.checkpoint_choice import ask_checkpoint, verify_chain
from heterps_paddle.runtime.checkpoint_files import MANIFEST
from heterps_paddle.tools.jobs import launch

pytestmark = pytest.mark.launched  # real parameter-server jobs

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "windowed_trainer.py")
ONE_STAGE = [{"resource": "local_cpu", "kind": "cpu", "layers": ["embedding_0", "fc_0", "fc_1", "fc_2"], "units": 2}]
LAUNCH_ID = "incremental-test"
DELTA_SCORE = 3  # the column of a SparseAccessor line: key, slot, unseen_days, delta_score, show, click, ...


def run(tmp, name, checkpoints, epochs, env_extra):
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"format": 1, "feasible": True, "stages": ONE_STAGE}))
    argv = [SCRIPT, "--data", str(tmp / "data"), "--plan", str(plan), "--epochs", str(epochs)]
    argv += ["--save-dir", str(tmp / f"save_{name}")]
    own = ["--checkpoint-dir", str(checkpoints), "--checkpoint-every", "2"]
    env = {**os.environ, "HETERPS_CHECKPOINT_BASE_EVERY": "3", **env_extra}
    arguments = launch_arguments(load_plan(str(plan)), 1, gpu_available=False)
    result = launch(own + arguments, argv, str(tmp / f"log_{name}"), 400, env=env)
    assert result.returncode == 0, f"{name}: {result.failures}\n{result.output[-3000:]}"
    return result


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, heterps_cache):
    tmp = tmp_path_factory.mktemp("incremental-checkpoints")
    generate(str(tmp / "data"), 4000, seed=5, test_fraction=0.1)
    checkpoints = tmp / "checkpoints"
    out = {"tmp": tmp, "dir": checkpoints}
    out["ask"] = ask_checkpoint(str(checkpoints), LAUNCH_ID, "test: a host asks to leave")
    out["first"] = run(tmp, "first", checkpoints, 4, {"HETERPS_LAUNCH_ID": LAUNCH_ID})
    out["after_first"] = sorted(n for n in os.listdir(checkpoints) if not n.startswith("."))
    out["manifests"] = {n: verify_chain(str(checkpoints / n))[0] for n in out["after_first"]}
    shutil.copytree(checkpoints, tmp / "checkpoints.copy")
    out["resumed"] = run(tmp, "resumed", checkpoints, 4, {})
    return out


def honoured(jobs):
    """The checkpoint the ask was honoured at: the first between two shards of pass 1 (pass-000000.1of2, when a
    trainer asked for its next shard while the other's was still to hand out: each pass is 2 files), else pass 1's
    end (each trainer had taken its file: docs/data-plan.md)."""
    first = jobs["after_first"][0]
    assert first in ("pass-000000.1of2", "pass-000001"), jobs["after_first"]
    return first


def test_the_ask_is_honoured_and_increments_follow_their_base(jobs):
    first = honoured(jobs)
    assert jobs["after_first"] == [first, "pass-000002", "pass-000004"]
    manifests = {n: m["launch"] for n, m in jobs["manifests"].items()}
    assert [manifests[n]["kind"] for n in jobs["after_first"]] == ["full", "incremental", "incremental"]
    assert [link["name"] for link in manifests["pass-000004"]["chain"]] == [first, "pass-000002"]
    assert not os.path.exists(jobs["ask"])  # honoured, then removed
    assert {manifests[n]["trainers"] for n in jobs["after_first"]} == {2}
    worker = jobs["first"].logs()["workerlog.0"]
    assert "checkpoint: asked for (test: a host asks to leave)" in worker
    for name in jobs["after_first"]:
        launch = manifests[name]
        assert f"checkpoint {jobs['dir'] / name}: complete (" in worker
        assert f"kind={launch['kind']} bytes={launch['bytes']} seconds=" in worker
        assert launch["bytes"] > 0 and launch["save_s"] >= 0
    # a pass reads 2 of the 8 files: an increment holds the rows pushed since the checkpoint before, part of the
    # table, and base + increments hold every row of the full save after pass 4
    rows = {n: _rows(jobs["tmp"] / "checkpoints.copy" / n / "000") for n in jobs["after_first"]}
    full = _rows(jobs["tmp"] / "save_first" / "000")
    assert set().union(*rows.values()) == full
    assert 0 < len(rows["pass-000004"]) < len(full)
    print(
        "rows:",
        {n: len(r) for n, r in rows.items()},
        "of",
        len(full),
        "bytes:",
        {n: manifests[n]["bytes"] for n in rows},
    )


def _lines(directory, drop=None):
    lines = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        with gzip.open(path, "rt") if name.endswith(".gz") else open(path) as f:
            for line in f:
                if line.strip():
                    fields = line.split()
                    if drop is not None:
                        del fields[drop]
                    lines.append(" ".join(fields))
    return sorted(lines)


def _rows(directory):
    return {line.split()[0] for line in _lines(directory)}


def test_a_chain_restores_what_a_full_save_of_that_pass_holds(jobs):
    servers = jobs["resumed"].logs()["serverlog.0"]
    chain = f"{honoured(jobs)} + pass-000002 + pass-000004"
    assert f"sparse tables loaded from its chain, base first: {chain}" in servers, servers[-3000:]
    reference, restored = jobs["tmp"] / "save_first", jobs["tmp"] / "save_resumed"
    ours, theirs = _lines(restored / "000", DELTA_SCORE), _lines(reference / "000", DELTA_SCORE)
    assert len(theirs) > 100 and ours == theirs
    manifest = json.loads((reference / MANIFEST).read_text())
    for table in manifest["dense_tables"]:
        name = f"{table['table_id']:03d}"
        assert _lines(restored / name) == _lines(reference / name), name
