"""Incremental checkpoints without a job (tests/test_incremental_checkpoints.py launches them): a chain's manifests,
its verification (a missing, corrupted, replaced or stray link refuses the chain by name, and the launch falls back),
retention of what the newest two checkpoints need, the base interval, a checkpoint asked for, and the sparse tables'
settings a delta needs."""

import os

import pytest

from heterps_paddle import settings
from heterps_paddle.runtime import checkpoint_choice as cc
from heterps_paddle.runtime import checkpoint_deltas, checkpoint_persist, launch_checkpoints
from heterps_paddle.runtime.checkpoint_files import MANIFEST, CheckpointError, file_digest, write_manifest
from heterps_paddle.runtime.launch_checkpoints import Barrier, Decision, PassCheckpoints


def make(root, passes, chain=(), kind=None):
    """A checkpoint as trainer 0 completes it: a sparse part and a dense part, the launch's fields, and for an
    increment the chain (its base first, with each link's manifest digest)."""
    path = root / cc.Progress(passes).name
    for table in ("000", "001"):
        (path / table).mkdir(parents=True)
        (path / table / "part-000.gz").write_text(f"{passes} {table}\n")
    links = [
        {"name": cc.Progress(p).name, "manifest": file_digest(str(root / cc.Progress(p).name / MANIFEST))}
        for p in chain
    ]
    files = {f"{t}/part-000.gz": file_digest(str(path / t / "part-000.gz")) for t in ("000", "001")}
    launch = {"passes_done": passes, "kind": kind or ("incremental" if chain else "full"), "chain": links}
    write_manifest(str(path), {"format": 1, "files": files, "launch": launch})
    return path


@pytest.fixture
def chain(tmp_path):
    """pass 1 a base, passes 2 and 3 its increments, pass 4 a full base again, pass 5 its increment."""
    make(tmp_path, 1)
    make(tmp_path, 2, chain=[1])
    make(tmp_path, 3, chain=[1, 2])
    make(tmp_path, 4)
    make(tmp_path, 5, chain=[4])
    return tmp_path


def test_a_chain_verifies_and_lists_its_links_base_first(chain):
    manifest, links = cc.verify_chain(str(chain / "pass-000003"))
    assert manifest["launch"]["kind"] == "incremental"
    assert [os.path.basename(p) for p in links] == ["pass-000001", "pass-000002", "pass-000003"]
    assert cc.verify_chain(str(chain / "pass-000004"))[1] == [str(chain / "pass-000004")]
    assert cc.choose(str(chain)).path == str(chain / "pass-000005")
    assert cc.chain_names(str(chain / "pass-000003")) == ["pass-000001", "pass-000002", "pass-000003"]


@pytest.mark.parametrize(
    "damage, why",
    [
        ("missing", "its base {root}/pass-000004 is missing"),
        (
            "corrupted",
            "its base {root}/pass-000004 refused: checkpoint {root}/pass-000004: 000/part-000.gz does not "
            "match its checksum (corrupted)",
        ),
        (
            "stray",
            "its base {root}/pass-000004 refused: checkpoint {root}/pass-000004: 000/part-000 is not in its "
            "manifest (a stray file",
        ),
        ("replaced", "its base {root}/pass-000004 is not the one it was saved on"),
        ("incomplete", "its base {root}/pass-000004 is incomplete (no heterps_checkpoint.json)"),
    ],
)
def test_a_bad_link_refuses_the_chain_by_name_and_the_launch_falls_back(chain, damage, why):
    base = chain / "pass-000004"
    if damage == "missing":
        os.rename(base, chain / "elsewhere")
    elif damage == "corrupted":
        (base / "000" / "part-000.gz").write_text("4 999\n")
    elif damage == "stray":
        (base / "000" / "part-000").write_text("4 000\n")  # as `gzip -dk` leaves
    elif damage == "replaced":
        # a later launch's checkpoint of the same pass in its place: whole, but not the one pass 5 follows
        manifest = cc.read_manifest(str(base))
        manifest["launch"]["saved_at"] = "later"
        write_manifest(str(base), manifest)
    else:
        os.remove(base / MANIFEST)
    choice = cc.choose(str(chain))
    refused = dict(choice.refused)
    assert why.format(root=chain) in refused[str(chain / "pass-000005")], refused
    # the base itself is refused too (or missing): the older chain is whole, resumed from pass 3; a replaced base is
    # itself a checkpoint that verifies, resumed from
    fallback = 4 if damage == "replaced" else 3
    assert choice.path == str(chain / f"pass-00000{fallback}") and choice.passes_done == fallback
    assert any("checkpoint REFUSED: checkpoint" in line for line in choice.lines())


def test_a_bad_increment_refuses_the_later_ones_and_not_the_earlier(chain):
    (chain / "pass-000002" / "001" / "part-000.gz").write_text("corrupt\n")
    (chain / "pass-000004").rename(chain / "gone")
    choice = cc.choose(str(chain))
    reasons = dict(choice.refused)
    assert f"its increment {chain}/pass-000002 refused" in reasons[str(chain / "pass-000003")]
    assert "does not match its checksum (corrupted)" in reasons[str(chain / "pass-000002")]
    assert choice.path == str(chain / "pass-000001")


def test_an_unreadable_chain_is_refused(chain):
    path = chain / "pass-000005"
    manifest = cc.read_manifest(str(path))
    manifest["launch"]["chain"] = [{"name": "../elsewhere", "manifest": "x"}]
    write_manifest(str(path), manifest)
    assert "its chain names a link that is not a checkpoint" in dict(cc.choose(str(chain)).refused)[str(path)]


def checkpoints(tmp_path, monkeypatch, base_every, previous=None, every=(1.0, "passes")):
    monkeypatch.setenv("HETERPS_CHECKPOINT_BASE_EVERY", str(base_every))
    monkeypatch.setenv("HETERPS_LAUNCH_ID", "unit")
    passes = PassCheckpoints(cc.Choice(str(tmp_path), previous, cc.Progress(0)), every)
    return passes, Barrier(str(tmp_path))


def test_retention_keeps_the_newest_two_and_their_chains(chain, tmp_path, monkeypatch):
    passes, _ = checkpoints(tmp_path, monkeypatch, 3)
    make(chain, 6, chain=[4, 5])
    (chain / ".pass-000007.incomplete").mkdir()
    checkpoint_persist.prune(passes.root, cc.Progress(6))
    assert sorted(n for n in os.listdir(chain) if n.startswith("pass-")) == [
        "pass-000004",
        "pass-000005",
        "pass-000006",
    ]
    make(chain, 7)  # a new base: pass 6's chain still needed (the second newest), nothing older
    checkpoint_persist.prune(passes.root, cc.Progress(7))
    assert sorted(n for n in os.listdir(chain) if n.startswith("pass-")) == [
        "pass-000004",
        "pass-000005",
        "pass-000006",
        "pass-000007",
    ]
    make(chain, 8, chain=[7])
    checkpoint_persist.prune(passes.root, cc.Progress(8))
    assert sorted(n for n in os.listdir(chain) if n.startswith("pass-")) == ["pass-000007", "pass-000008"]


def kind(decision):
    """A decision's kind and mode (its staging directory is the staging rule's: tests/test_launch_checkpoints_unit.py)."""
    return decision.kind, decision.mode


def test_a_base_every_n_checkpoints(chain, tmp_path, monkeypatch):
    passes, barrier = checkpoints(tmp_path, monkeypatch, 3)
    first = passes.decide(cc.Progress(1), True, barrier)
    assert kind(first) == ("full", 2)  # nothing to follow: a base
    # no parameter server named on this host: staged on disk, beside the checkpoints
    assert first.staging == os.path.join(passes.root, ".pass-000001.incomplete")
    passes.previous = str(chain / "pass-000004")
    assert kind(passes.decide(cc.Progress(2), True, barrier)) == ("incremental", 1)
    passes.previous = str(chain / "pass-000005")
    assert kind(passes.decide(cc.Progress(3), True, barrier)) == ("incremental", 1)
    passes.previous = str(chain / "pass-000003")  # base + 2 increments: the chain is as long as it gets
    assert kind(passes.decide(cc.Progress(4), True, barrier)) == ("full", 2)
    for full in (0, 1):
        passes, barrier = checkpoints(tmp_path, monkeypatch, full, previous=str(chain / "pass-000004"))
        assert kind(passes.decide(cc.Progress(2), True, barrier)) == ("full", 0)  # today's full save
    assert passes.decide(cc.Progress(2), False, barrier) == Decision(None)


def test_a_checkpoint_asked_for_is_taken_when_not_due(tmp_path, monkeypatch, caplog):
    passes, barrier = checkpoints(tmp_path, monkeypatch, 1, every=(10.0, "minutes"))
    assert passes.decide(cc.Progress(1), True, barrier) == Decision(None)  # not ten minutes yet
    path = cc.ask_checkpoint(str(tmp_path), "unit", "host b asks to leave\n(spot notice)")
    assert path == os.path.join(barrier.dir, "asked")
    assert cc.read_ask(path) == cc.Ask("host b asks to leave (spot notice)")
    with caplog.at_level("INFO"):
        decision = passes.decide(cc.Progress(2), False, barrier)
    assert kind(decision) == ("full", 0) and decision.hold_s == 0
    assert "checkpoint: asked for (host b asks to leave (spot notice))" in caplog.text
    assert passes.asked == cc.Ask("host b asks to leave (spot notice)")
    assert cc.read_ask(os.path.join(tmp_path, "nothing")) is None


def test_an_ask_for_a_leave_holds_the_trainers_once_captured(tmp_path, monkeypatch):
    passes, barrier = checkpoints(tmp_path, monkeypatch, 1, every=(10.0, "minutes"))
    path = cc.ask_checkpoint(str(tmp_path), "unit", "host b leaves", hold_s=45)
    assert cc.read_ask(path) == cc.Ask("host b leaves", 45.0)
    decision = passes.decide(cc.Progress(1, 2, 4), False, barrier)
    assert decision.hold_s == 45.0 and Decision.parse(decision.text()) == decision
    assert decision.staging.endswith(".pass-000001.2of4.incomplete")
    # a second line that is not "hold S" (garbage, a negative or endless time) holds nothing
    for line in ("hold", "hold x", "hold -3", "hold inf", "wait 5", "hold 5 6"):
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"why\n{line}\n")
        assert cc.read_ask(path) == cc.Ask("why"), line


def test_an_ask_is_honoured_once_while_its_checkpoint_persists(tmp_path, monkeypatch):
    import threading

    passes, barrier = checkpoints(tmp_path, monkeypatch, 1, every=(10.0, "minutes"))
    cc.ask_checkpoint(str(tmp_path), "unit", "host b asks to leave")
    assert kind(passes.decide(cc.Progress(1), False, barrier)) == ("full", 0)
    # its checkpoint captured and persisting (the ask's file goes once it is complete): the next pass's end does
    # not take the same ask for another checkpoint
    release = threading.Event()
    passes.persisting = launch_checkpoints.Persist(lambda: release.wait(30) and str(tmp_path)).start()
    passes.persisting_honours_ask = True
    assert passes.decide(cc.Progress(2), False, barrier) == Decision(None) and passes.asked is None
    release.set()
    passes.wait_persisted("the test")
    os.remove(os.path.join(barrier.dir, "asked"))  # as the persisting thread does once the checkpoint is complete
    assert passes.decide(cc.Progress(3), False, barrier) == Decision(None)


def test_decisions_read_back_and_barrier_files_of_earlier_passes_go(tmp_path, monkeypatch):
    decisions = (Decision(None), Decision("full", 0), Decision("full", 2), Decision("incremental", 1, "/d/.p 1"))
    for decision in decisions:
        assert Decision.parse(decision.text()) == decision
    _, barrier = checkpoints(tmp_path, monkeypatch, 1)
    for at in (cc.Progress(1), cc.Progress(1, 1, 2), cc.Progress(2), cc.Progress(2, 1, 2), cc.Progress(3)):
        barrier.mark(at, "arrived.0")
    for at in (cc.Progress(1), cc.Progress(1, 1, 2)):
        barrier.mark(at, cc.CAPTURED)
        barrier.mark(at, "decision")  # as long a suffix as "captured"
    cc.ask_checkpoint(str(tmp_path), "unit", "x")
    barrier.drop_before(cc.Progress(2, 1, 2))
    # the newest captured marker stays: a checkpoint persisting (coordinator.newest_captured)
    assert sorted(os.listdir(barrier.dir)) == [
        "asked",
        "pass-000001.1of2.captured",
        "pass-000002.1of2.arrived.0",
        "pass-000003.arrived.0",
    ]
    assert cc.captured(str(tmp_path), "unit") == [cc.Progress(1, 1, 2)]
    from heterps_paddle.launch.coordinator import newest_captured

    assert newest_captured(str(tmp_path), "unit") == 1.5 and newest_captured(str(tmp_path), "other") == 0


def test_base_interval_setting(tmp_path, monkeypatch):
    assert settings.get("HETERPS_CHECKPOINT_BASE_EVERY", {}) == 1  # every checkpoint full unless asked
    monkeypatch.setenv("HETERPS_CHECKPOINT_BASE_EVERY", "4")
    env, lines = cc.prepare_launch(str(tmp_path), "1")
    assert env["HETERPS_CHECKPOINT_BASE_EVERY"] == "4" and "a full base every 4" in lines[-1]
    monkeypatch.setenv("HETERPS_CHECKPOINT_BASE_EVERY", "x")
    with pytest.raises(CheckpointError, match="HETERPS_CHECKPOINT_BASE_EVERY"):
        cc.prepare_launch(str(tmp_path), "1")


def test_staging_directories_are_known_to_saves():
    assert cc.STAGING.fullmatch(".pass-000012.incomplete") and not cc.STAGING.fullmatch("pass-000012")
    assert cc.STAGING.fullmatch(".pass-000012.3of8.incomplete")
    assert checkpoint_persist.complete.__name__ == "complete"


def test_the_sparse_tables_get_the_delta_threshold_and_bad_settings_are_refused():
    from paddle.distributed.fleet.proto import distributed_strategy_pb2 as pb

    strategy = pb.DistributedStrategy()
    tables = strategy.downpour_table_param
    checkpoint_deltas.set_delta_threshold(tables, ["emb"])
    param = next(t for t in tables if t.table_name == "emb").accessor.ctr_accessor_param
    assert param.delta_threshold == pytest.approx(checkpoint_deltas.DELTA_THRESHOLD)
    for field, value, why in (
        ("base_threshold", 1.5, "leaves rows scoring under it out of a save"),
        ("nonclk_coeff", 0.0, "scores a push under the delta threshold"),
        ("click_coeff", 0.0, "scores a push under the delta threshold"),
        ("delta_threshold", 0.25, "leaves rows pushed less than that out of a delta"),
    ):
        strategy = pb.DistributedStrategy()
        table = strategy.downpour_table_param.add()
        table.table_name = "emb"
        setattr(table.accessor.ctr_accessor_param, field, value)
        key = f"strategy.sparse_table_configs[emb].accessor.ctr_accessor_param.{field} = {value:g} {why}"
        with pytest.raises(CheckpointError, match=key.replace("[", r"\[").replace("]", r"\]")):
            checkpoint_deltas.set_delta_threshold(strategy.downpour_table_param, ["emb"])


def test_full_checkpoints_save_as_a_base_unless_a_base_would_leave_rows_out():
    """Every checkpoint full: Paddle's base save (mode 2: plain text, compressed after the pause) where it writes
    every row; a script's base_threshold on a sparse table keeps the gzipped checkpoint save (mode 0), said why."""
    from paddle.distributed.fleet.proto import distributed_strategy_pb2 as pb

    strategy, other = pb.DistributedStrategy(), pb.DistributedStrategy()
    assert launch_checkpoints.base_save_mode([strategy.downpour_table_param], ["emb"]) == (2, None)
    table = other.downpour_table_param.add()
    table.table_name = "emb"
    table.accessor.ctr_accessor_param.delta_threshold = 0.5  # not what a base reads
    assert launch_checkpoints.base_save_mode([strategy.downpour_table_param, other.downpour_table_param], ["emb"]) == (
        2,
        None,
    )
    table.accessor.ctr_accessor_param.base_threshold = 1.5
    assert launch_checkpoints.base_save_mode([other.downpour_table_param], ["dnn_only"]) == (2, None)  # not sparse
    mode, why = launch_checkpoints.base_save_mode([strategy.downpour_table_param, other.downpour_table_param], ["emb"])
    assert mode == 0 and why == (
        "strategy.sparse_table_configs[emb].accessor.ctr_accessor_param.base_threshold = 1.5 would leave rows out of "
        "a base save"
    )


def test_checkpoint_every_minutes_is_due_at_a_slice_and_passes_only_at_a_pass_end(tmp_path, monkeypatch):
    passes, barrier = checkpoints(tmp_path, monkeypatch, 1, every=(2.0, "passes"))
    assert [passes.scheduled(at) for at in (cc.Progress(1), cc.Progress(2), cc.Progress(2, 1, 4))] == [
        False,
        True,
        False,
    ]
    passes, barrier = checkpoints(tmp_path, monkeypatch, 1, every=(10.0, "minutes"))
    inside = cc.Progress(3, 1, 4)
    assert passes.scheduled(inside) and passes.decide(inside, True, barrier) == Decision(None)  # not 10 minutes yet
    passes.last_save -= 601
    decision = passes.decide(inside, True, barrier)
    assert kind(decision) == ("full", 0) and decision.staging.endswith(".pass-000003.1of4.incomplete")
