"""The launch's checkpoints without a job (tests/test_launch_checkpoints.py launches them): the options, the
choice of the checkpoint to resume from, the refusals by name."""

import json
import os

import pytest

from heterps_paddle import settings
from heterps_paddle.data_plan import DataPlan
from heterps_paddle.launch.options import OptionsError, parse
from heterps_paddle.runtime import checkpoint_choice as cc
from heterps_paddle.runtime.checkpoint_files import MANIFEST, CheckpointError, add_to_manifest, digests


def make(root, passes, manifest=True, launch_passes=None):
    path = root / cc.Progress(passes).name
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


# ---------------------------------------------------------------------------- where a checkpoint is staged (the pause)


def test_staging_is_memory_when_it_has_room_and_every_server_is_here(tmp_path, monkeypatch):
    import shutil

    from heterps_paddle.runtime import checkpoint_persist as lc
    from heterps_paddle.runtime.checkpoint_files import memory_staging_dir

    root = str(tmp_path / "ckpt")
    monkeypatch.setenv("POD_IP", "127.0.0.2")
    monkeypatch.setenv("PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.2:6000,127.0.0.2:6001")
    monkeypatch.delenv("HETERPS_CHECKPOINT_STAGING", raising=False)
    room = shutil.disk_usage(lc.MEMORY_ROOT).free if os.path.isdir(lc.MEMORY_ROOT) else 0
    if room < 256 << 20:
        pytest.skip(f"{lc.MEMORY_ROOT} has under 256 MiB free here")
    chosen = lc.staging_for(root, "pass-000001", 0)
    assert chosen == os.path.join(memory_staging_dir(), ".pass-000001.incomplete")
    # a last checkpoint of more than half the free room: on disk, beside the checkpoints
    assert lc.staging_for(root, "pass-000002", room) == os.path.join(root, ".pass-000002.incomplete")
    # a server on another host would write its own machine's memory: on disk
    monkeypatch.setenv("PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.2:6000,127.0.0.3:6001")
    assert lc.staging_for(root, "pass-000003", 0) == os.path.join(root, ".pass-000003.incomplete")
    # asked for: on disk, or under a directory given
    monkeypatch.setenv("PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.2:6000")
    monkeypatch.setenv("HETERPS_CHECKPOINT_STAGING", "disk")
    assert lc.staging_for(root, "pass-000004", 0) == os.path.join(root, ".pass-000004.incomplete")
    monkeypatch.setenv("HETERPS_CHECKPOINT_STAGING", str(tmp_path / "fast"))
    assert lc.staging_for(root, "pass-000005", 0) == os.path.join(
        memory_staging_dir(root=str(tmp_path / "fast")), ".pass-000005.incomplete"
    )
    monkeypatch.setenv("HETERPS_CHECKPOINT_STAGING", "ram")
    with pytest.raises(Exception, match="HETERPS_CHECKPOINT_STAGING.*memory, disk or an absolute directory"):
        lc.staging_for(root, "pass-000006", 0)


def test_a_staging_directory_of_a_dead_process_is_swept_and_a_live_ones_kept(tmp_path):
    import subprocess
    import sys

    import psutil

    from heterps_paddle.runtime.checkpoint_files import MEMORY_PREFIX, memory_staging_dir, sweep_memory_staging

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = memory_staging_dir(child.pid, root=str(tmp_path))
    child.kill()
    child.wait()
    mine = memory_staging_dir(root=str(tmp_path))
    reused = os.path.join(str(tmp_path), f"{MEMORY_PREFIX}{os.getpid()}-{int(psutil.Process().create_time()) - 99}")
    for path in (dead, mine, reused):
        os.makedirs(os.path.join(path, ".pass-000001.incomplete"))
    stray = tmp_path / "heterps-staging-garbage"
    stray.mkdir()
    other = tmp_path / "someone-elses"
    other.mkdir()
    removed = sweep_memory_staging(str(tmp_path))
    # the dead one, the one whose pid a later process reuses (its start time differs), and a name that is no pid
    assert sorted(removed) == sorted([dead, reused, str(stray)])
    assert os.path.isdir(mine) and other.is_dir()


def test_a_background_persist_failure_reaches_the_trainer_that_waits_for_it():
    from heterps_paddle.runtime import checkpoint_persist as lc

    def boom():
        raise CheckpointError("checkpoint after pass 3 FAILED writing /x: [Errno 28] No space left on device")

    persisting = lc.Persist(boom).start()
    with pytest.raises(CheckpointError, match="No space left on device"):
        persisting.wait()
    assert lc.Persist(lambda: "/ckpt/pass-000001").start().wait() == "/ckpt/pass-000001"


def test_a_bad_staging_setting_is_refused_before_the_launch_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("HETERPS_CHECKPOINT_STAGING", "ram")
    with pytest.raises(CheckpointError, match="HETERPS_CHECKPOINT_STAGING='ram': must be memory, disk or an absolute"):
        cc.prepare_launch(str(tmp_path / "ckpt"), "1")
    assert not (tmp_path / "ckpt").exists()


def make_inside(root, at, files_done, said=None):
    """A complete checkpoint taken inside a pass (``at``: a Progress), its manifest saying ``said`` (default: as
    its name)."""
    path = root / at.name
    (path / "001").mkdir(parents=True)
    (path / "001" / "part-000").write_text("1.0 0 0\n")
    (path / MANIFEST).write_text(json.dumps({"format": 1, "files": digests(str(path))}))
    said = said or at
    launch = {"passes_done": said.passes, "slice": said.slice, "slices": said.slices, "files_done": files_done}
    add_to_manifest(str(path), [], {"launch": launch})
    return path


def test_a_checkpoint_inside_a_pass_is_ordered_by_the_training_it_holds(tmp_path):
    make(tmp_path, 2)
    make_inside(tmp_path, cc.Progress(2, 1, 4), ["a"])
    inside = make_inside(tmp_path, cc.Progress(2, 3, 4), ["a", "b", "c"])
    (tmp_path / "pass-000002.4of4").mkdir()  # a slice number out of its pass: not a checkpoint's name
    (tmp_path / "pass-000002.0of4").mkdir()
    assert [at for at, _ in cc.listed(str(tmp_path))] == [cc.Progress(2, 3, 4), cc.Progress(2, 1, 4), cc.Progress(2)]
    choice = cc.choose(str(tmp_path))
    assert choice.path == str(inside) and choice.at.done == 2.75 and choice.files_done == ("a", "b", "c")
    assert "2 passes and 3 of 4 shards of pass 3 done" in choice.lines()[-1]
    assert "the 3 files of the next one trained already" in choice.lines()[-1]
    make(tmp_path, 3)  # the pass's end is newer than any of its slices
    assert cc.choose(str(tmp_path)).at == cc.Progress(3)
    assert json.dumps(cc.Progress(3).done) == "3"  # restarts.json's passes_done of a pass's end: as before slices


def test_a_checkpoint_inside_a_pass_whose_manifest_says_otherwise_is_refused(tmp_path):
    make(tmp_path, 1)
    wrong = make_inside(tmp_path, cc.Progress(1, 1, 2), ["a"], said=cc.Progress(1, 1, 3))
    bad_files = make_inside(tmp_path, cc.Progress(1, 1, 4), "a")  # files_done not a list
    choice = cc.choose(str(tmp_path))
    assert choice.path == str(tmp_path / "pass-000001") and choice.files_done == ()
    reasons = dict(choice.refused)
    assert "says 1 passes and 1 of 3 shards of the next done, its name 1 passes and 1 of 2" in reasons[str(wrong)]
    assert "files_done is not a list of file names" in reasons[str(bad_files)]


def test_the_retired_slices_setting_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("HETERPS_CHECKPOINT_SLICES", "4")
    with pytest.raises(OptionsError, match="HETERPS_CHECKPOINT_SLICES is retired: every pass is pulled"):
        parse(["--server_num=1", "--worker_num=2", "train.py"])
    assert "HETERPS_CHECKPOINT_SLICES" not in settings.SETTINGS


class FakeDataset:
    def __init__(self, files):
        self.filelist = list(files)
        self.thread_num = 1

    def set_filelist(self, files):
        self.filelist = list(files)


class FakeProgram:
    """A program with one op that pushes to the servers: a training pass."""

    class Block:
        ops = [type("Op", (), {"type": "push_dense"})()]

    blocks = [Block()]


def test_a_pass_keeps_the_scripts_split_where_it_cannot_be_pulled_and_says_why():
    from heterps_paddle.runtime import seam
    from heterps_paddle.runtime.pulled_pass import Puller

    seam.reset_context({"TRAINING_ROLE": "TRAINER"})
    try:
        program, puller = FakeProgram(), Puller(board=None, trainers=2, index=0)
        pulled = seam.DatasetCall(None, program, FakeDataset(["a"]), None, {})
        assert puller.why_not(pulled) is None
        assert Puller(None, 1, 0).why_not(pulled) == "one trainer"
        in_memory = type("InMemory", (FakeDataset,), {"load_into_memory": lambda self: None})(["a"])
        assert "InMemoryDataset" in puller.why_not(seam.DatasetCall(None, program, in_memory, None, {}))
        no_files = FakeDataset([])
        no_files.filelist = None
        assert puller.why_not(seam.DatasetCall(None, program, no_files, None, {})) == "the dataset has no file list"
        # a trainer program whose embeddings gpu_embedding.apply moved into the GPU table (it has a PassSync)
        seam.context().pass_syncs[program] = object()
        assert "GPU table" in puller.why_not(pulled)
    finally:
        seam.reset_context()


class PlanBoard:
    """The data plan as the coordinator serves it, in this process (data_plan/)."""

    def __init__(self):
        self.plan = DataPlan()
        self.first_take = None  # what trainer 1 does once the pass opened, before trainer 0's first take

    def shards(self, message):
        if message["do"] == "take" and self.first_take is not None:
            first, self.first_take = self.first_take, None
            first(self)
        reply = self.plan.answer(message)
        assert "error" not in reply, reply
        return reply


def pulled_pass(monkeypatch, tmp_path, choice, files, peer=None, on_meet=None, peer_files=()):
    """One pass of trainer 0 of two through PassCheckpoints.run_pass and its hook, its script's files ``files``, on a
    data plan trainer 1 offered ``peer_files`` to (a pass is the multiset of the offers: a file both offered would be
    two shards; ``peer(board)`` acts as trainer 1 first): the files each train_from_dataset ran, the points the
    trainers met at with the shards done there, the list the hooks' ends saw and the script's list after."""
    from heterps_paddle.runtime import launch_checkpoints, pulled_pass, seam
    from heterps_paddle.runtime.file_identity import name_of

    monkeypatch.setenv("HETERPS_LAUNCH_ID", "unit")
    board = PlanBoard()
    passes = launch_checkpoints.PassCheckpoints(choice, (1.0, "passes"))
    passes.restore_checked = True
    passes.pulling, passes.puller = True, pulled_pass.Puller(board, 2, 0)
    resumed = sorted(passes.done_before(files)) if choice.at.slice else []  # trainer 1's, as trainer 0's
    offer = {"do": "offer", "pass": 1, "trainers": 2, "trainer": 1, "done_before": resumed}
    board.shards({**offer, "files": [[name_of(f), f] for f in peer_files]})
    board.first_take = peer
    met = []

    def meet(executor, at, done=None):
        if on_meet is not None and at.slice:
            on_meet(board)  # trainer 1 at the barrier: trainer 0 asks for the shards done once all are there
        met.append((at, sorted(done()) if done is not None else []))

    monkeypatch.setattr(passes, "meet", meet)
    dataset = FakeDataset(files)
    call = seam.DatasetCall(None, FakeProgram(), dataset, None, {})
    ran = []
    seen_by_hooks = []
    with passes.hook(call):
        passes.run_pass(call, lambda c: ran.append(list(c.dataset.filelist)))
        seen_by_hooks.append(list(dataset.filelist))
    return ran, met, seen_by_hooks[0], dataset.filelist


def data_files(directory, count):
    directory.mkdir()
    for i in range(count):
        (directory / f"part-{i}").write_text(f"1 {i}:{i}\n" * (i + 1))
    return [str(directory / f"part-{i}") for i in range(count)]


def test_a_pass_is_pulled_shard_by_shard_with_a_checkpoint_between_two_when_asked(tmp_path, monkeypatch):
    from heterps_paddle.rendezvous import launch_id
    from heterps_paddle.runtime.file_identity import name_of

    files = data_files(tmp_path / "data", 6)
    choice = cc.Choice(str(tmp_path), None, cc.Progress(0))
    taken = {}
    # trainer 1's script gave it part-0, trainer 0's the rest
    mine, peers = files[1:], files[:1]

    def peer_takes_one(board):  # trainer 1 holds part-0 while trainer 0 trains the rest
        taken["shard"] = board.shards({"do": "take", "pass": 1, "trainer": 1})["shards"][0][0]

    ran, met, seen, after = pulled_pass(monkeypatch, tmp_path, choice, mine, peer_takes_one, peer_files=peers)
    assert ran == [[f] for f in files[1:]] and taken["shard"] == name_of(files[0])
    assert met == [(cc.Progress(1), [])]  # the pass's end only: nothing asked
    assert seen == files[1:] and after == mine  # the hooks' ends count the files trained here; the script's list kept

    # a leave asks for a checkpoint while trainer 1 holds a shard: the trainers meet once both hold none, at K of
    # the pass's 6 shards, K the shards done or in hand at the ask; then the pass goes on
    sync = cc.sync_dir(str(tmp_path), launch_id() or "local")
    os.makedirs(sync, exist_ok=True)

    def peer_asks(board):
        taken["shard"] = board.shards({"do": "take", "pass": 1, "trainer": 1})["shards"][0][0]
        with open(os.path.join(sync, cc.ASKED), "w") as f:
            f.write("a leave\n")

    def peer_meets(board):
        board.shards({"do": "finish", "pass": 1, "trainer": 1, "shards": [taken["shard"]]})
        assert "meet" in board.shards({"do": "take", "pass": 1, "trainer": 1})
        os.remove(os.path.join(sync, cc.ASKED))

    ran, met, _, _ = pulled_pass(monkeypatch, tmp_path, choice, mine, peer_asks, peer_meets, peer_files=peers)
    # trainer 0 trained part-1 when it read the ask, trainer 1 held part-0: both done at the meeting
    assert met[0] == (cc.Progress(0, 2, 6), sorted(name_of(f) for f in files[:2])) and met[-1] == (cc.Progress(1), [])
    assert ran == [[f] for f in files[1:]]


def test_a_pass_resumed_inside_trains_only_the_shards_not_done(tmp_path, monkeypatch):
    from heterps_paddle.runtime.file_identity import identity

    files = data_files(tmp_path / "data", 8)
    done = tuple(identity(files[i]) for i in (0, 1, 4, 5))
    choice = cc.Choice(str(tmp_path), "/ckpt", cc.Progress(0, 4, 8), files_done=done)
    ran, met, seen, after = pulled_pass(monkeypatch, tmp_path, choice, files)
    left = [files[i] for i in (2, 3, 6, 7)]
    assert ran == [[f] for f in left] and seen == left and after == files
    # named by content: the same files under another path (another host's mount) are left out all the same
    copies = data_files(tmp_path / "elsewhere", 8)
    ran, _, _, _ = pulled_pass(monkeypatch, tmp_path, choice, copies)
    assert ran == [[copies[i]] for i in (2, 3, 6, 7)]
    # a checkpoint of an earlier version names its files by path: the same files are left out
    by_path = cc.Choice(str(tmp_path), "/ckpt", cc.Progress(0, 4, 8), files_done=tuple(files[i] for i in (0, 1, 4, 5)))
    ran, _, _, _ = pulled_pass(monkeypatch, tmp_path, by_path, files)
    assert ran == [[f] for f in left]


def test_one_trainer_resumed_inside_a_pass_trains_its_files_not_done_in_one_call(tmp_path, monkeypatch):
    from heterps_paddle.runtime import launch_checkpoints, pulled_pass, seam
    from heterps_paddle.runtime.file_identity import identity

    monkeypatch.setenv("HETERPS_LAUNCH_ID", "unit")
    files = data_files(tmp_path / "data", 4)
    choice = cc.Choice(str(tmp_path), "/ckpt", cc.Progress(0, 2, 4), files_done=(identity(files[0]), files[3]))
    passes = launch_checkpoints.PassCheckpoints(choice, (1.0, "passes"))
    passes.restore_checked = True
    passes.pulling, passes.puller = True, pulled_pass.Puller(PlanBoard(), 1, 0)
    monkeypatch.setattr(passes, "meet", lambda executor, at, done=None: None)
    dataset = FakeDataset(files)
    call = seam.DatasetCall(None, FakeProgram(), dataset, None, {})
    ran = []
    with passes.hook(call):
        passes.run_pass(call, lambda c: ran.append(list(c.dataset.filelist)))
    assert ran == [files[1:3]] and dataset.filelist == files


def test_a_file_is_named_by_its_content_and_an_unreadable_one_refused_by_path(tmp_path):
    """What a checkpoint inside a pass names its files done by (the data plan's shard names): each local
    file's content identity (base name, size and SHA-256, runtime/file_identity.py), not the path this host gave it;
    a path that is no local file (hdfs://) by its path."""
    from heterps_paddle.runtime import file_identity

    files = data_files(tmp_path / "data", 2)
    named = [file_identity.name_of(f) for f in files]
    assert all(file_identity.is_identity(n) for n in named) and not file_identity.is_identity(files[0])
    assert named[0].startswith(f"part-0:{os.path.getsize(files[0])}:") and named[0] != named[1]
    assert file_identity.done_here(files[1], frozenset(named[1:]))
    assert not file_identity.done_here(files[0], frozenset(named[1:]))
    # the same bytes under another base name (a shard copied to be trained twice) is another file
    (tmp_path / "data" / "part-0-again").write_bytes((tmp_path / "data" / "part-0").read_bytes())
    assert not file_identity.done_here(str(tmp_path / "data" / "part-0-again"), frozenset(named))
    remote = "hdfs://cluster/day-1/part-0"
    assert file_identity.name_of(remote) == remote and file_identity.done_here(remote, frozenset({remote}))
    with pytest.raises(CheckpointError, match="cannot be read to name it by its content"):
        file_identity.identity(str(tmp_path / "gone"))


def test_a_shard_at_another_trainers_path_is_trained_only_where_that_path_holds_its_content(tmp_path, monkeypatch):
    """Two hosts may each have a /data/part-0 of their own: a shard handed out at another trainer's path is named
    again here before it is trained, and given back when this host's file there is another one."""
    from heterps_paddle.runtime import pulled_pass, seam
    from heterps_paddle.runtime.file_identity import name_of

    here = data_files(tmp_path / "here", 2)  # what this host has at the paths
    there = data_files(tmp_path / "there", 3)[2]  # trainer 1's content, which this host does not have
    board = PlanBoard()
    board.shards({"do": "offer", "pass": 1, "trainers": 2, "trainer": 1, "files": [[name_of(there), here[0]]]})
    puller = pulled_pass.Puller(board, 2, 0)
    dataset = FakeDataset([here[1]])
    ran = []
    _, trained = puller.run_pass(
        1, seam.DatasetCall(None, FakeProgram(), dataset, None, {}), lambda c: ran.append(list(c.dataset.filelist))
    )
    assert ran == [[here[1]]] and trained.paths == (here[1],)  # its own file; the other given back, untrained
    assert board.plan.passes[1].shards[name_of(there)].unreadable == [0]


def test_every_call_keeps_the_scripts_reader_threads_and_one_of_only_empty_files_is_not_run(tmp_path):
    """Paddle lowers a dataset's thread_num to the files of a call, and a heterogeneous pipeline's kept trainer
    instance refuses another count (issue 60): a call of fewer files than threads is padded with an empty file."""
    from heterps_paddle.runtime import pulled_pass, seam

    files = data_files(tmp_path / "data", 4)
    board = PlanBoard()
    board.shards({"do": "offer", "pass": 1, "trainers": 2, "trainer": 1, "files": []})
    dataset = FakeDataset(files)
    dataset.thread_num = 3
    ran = []
    _, trained = pulled_pass.Puller(board, 2, 0).run_pass(
        1,
        seam.DatasetCall(None, FakeProgram(), dataset, None, {}),
        lambda c: ran.append((list(c.dataset.filelist), c.dataset.thread_num)),
    )
    assert all(len(listed) == 3 and threads == 3 for listed, threads in ran), ran
    real = [f for listed, _ in ran for f in listed if f in files]
    pads = {f for listed, _ in ran for f in listed if f not in files}
    assert sorted(real) == files and sorted(trained.paths) == files and dataset.thread_num == 3
    assert len(pads) == 1 and os.path.getsize(pads.pop()) == 0  # one empty file of this process's pads them

    # a call handed only empty files (Spark's empty part files) trains nothing: Paddle is not called
    empty = [str(tmp_path / f"empty-{k}") for k in range(2)]
    for path in empty:
        open(path, "w").close()
    board = PlanBoard()
    board.shards({"do": "offer", "pass": 1, "trainers": 2, "trainer": 1, "files": []})
    ran.clear()
    _, trained = pulled_pass.Puller(board, 2, 0).run_pass(
        1, seam.DatasetCall(None, FakeProgram(), FakeDataset(empty), None, {}), ran.append
    )
    # (a plan that skips empty files hands none of them out: the pass ends as well, nothing run)
    assert ran == [] and set(trained.paths) <= set(empty) and trained.calls == 0


def test_a_running_calls_progress_is_told_where_the_plan_takes_it_and_once_where_not(tmp_path, monkeypatch):
    import time

    from heterps_paddle.rendezvous import RendezvousError
    from heterps_paddle.runtime import meter, pulled_pass, seam

    class Meter:
        def call_samples(self):
            return 2

    class Board(PlanBoard):
        """A plan without the progress request (as before issue 60), or one that takes it."""

        def __init__(self, takes):
            super().__init__()
            self.takes, self.told = takes, []

        def shards(self, message):
            if message["do"] == "progress":
                self.told.append(message)
                if not self.takes:
                    raise RendezvousError("the data plan: data plan: unknown request 'progress'")
                return {"ok": True}
            return super().shards(message)

    monkeypatch.setattr(meter, "_current", Meter())
    monkeypatch.setattr(pulled_pass, "PROGRESS_S", 0.01)
    files = data_files(tmp_path / "data", 3)  # part-2: 3 lines; the meter's running call has trained 2 of them
    for takes in (False, True):
        board = Board(takes)
        board.shards({"do": "offer", "pass": 1, "trainers": 2, "trainer": 1, "files": []})
        puller = pulled_pass.Puller(board, 2, 0)
        call = seam.DatasetCall(None, FakeProgram(), FakeDataset(files[2:]), None, {})
        puller.run_pass(1, call, lambda c: time.sleep(0.3))
        if takes:
            per_line = os.path.getsize(files[2]) / 3
            assert board.told and board.told[0] == {
                "do": "progress",
                "pass": 1,
                "bytes": int(2 * per_line),
                "trainer": 0,
            }
            assert puller.reports
        else:  # said once, silently: no more is told, and the pass went on
            assert len(board.told) == 1 and not puller.reports


def test_a_pulled_pass_prints_its_progress_where_its_calls_are_too_short_for_paddles_lines(tmp_path, monkeypatch):
    from heterps_paddle.runtime import pulled_pass, seam

    files = data_files(tmp_path / "data", 3)  # 1, 2 and 3 lines
    dataset = FakeDataset(files)
    dataset.proto_desc = type("Desc", (), {"batch_size": 1})()
    said = []
    monkeypatch.setattr(pulled_pass.logger, "info", lambda text, *args: said.append(text % args))
    call = seam.DatasetCall(None, FakeProgram(), dataset, None, {"fetch_list": ["loss"], "print_period": 5})
    progress = pulled_pass.PassProgress(2, call, threads=1)
    periods = []
    for path in files:
        with progress.calling(call, [path]):
            periods.append(call.options["print_period"])  # what Paddle is called with
    assert call.options["print_period"] == 5  # the script's own period, back after each call
    # 6 batches after the third call, past 5, and none of the calls had 5 batches for Paddle's own line: the third
    # runs with a period its thread reaches (half its 3 batches), so Paddle prints its fetched values once there
    assert periods == [5, 5, 1]
    assert said == ["data plan: pass 2: 6 batches (6 samples) trained here so far"]
    long_call = seam.DatasetCall(None, FakeProgram(), dataset, None, {"fetch_list": ["loss"], "print_period": 2})
    with pulled_pass.PassProgress(2, long_call, threads=1).calling(long_call, [files[2]]):
        assert long_call.options["print_period"] == 2  # 3 batches reach 2: Paddle's line comes as the script asked
    unset = seam.DatasetCall(None, FakeProgram(), dataset, None, {"fetch_list": ["loss"]})
    with pulled_pass.PassProgress(2, unset, threads=1).calling(unset, files):
        pass
    assert "print_period" not in unset.options  # Paddle's default stays the call's
    quiet_call = seam.DatasetCall(None, FakeProgram(), dataset, None, {"print_period": 5})
    quiet = pulled_pass.PassProgress(2, quiet_call, 1)
    for path in files:
        with quiet.calling(quiet_call, [path]):
            assert quiet_call.options["print_period"] == 5  # nothing fetched: Paddle prints nothing either
    assert len(said) == 1


def test_the_pass_is_logged_once_at_the_offer_as_the_plans_answer_gives_it(tmp_path, monkeypatch):
    from heterps_paddle.runtime import pulled_pass

    files = data_files(tmp_path / "data", 2)
    (tmp_path / "data" / "empty").write_text("")
    said = []
    monkeypatch.setattr(pulled_pass.logger, "info", lambda text, *args: said.append(text % args))
    figures = {"files": 9, "shards": 18, "shared_files": 9, "empty_files": 1}
    pulled_pass.say_offer(3, {"ok": True, **figures}, [*files, str(tmp_path / "data" / "empty")])
    pulled_pass.say_offer(3, {"ok": True, "shards": 4}, files)  # a plan whose answer has no figures
    assert said == [
        "data plan: pass 3: 3 files offered here (1 empty); the pass: 9 files, 18 shards, 9 offered by more than one "
        "trainer, 1 empty (skipped)",
        "data plan: pass 3: 2 files offered here; 4 shards offered so far",
    ]


def test_an_offer_and_the_shards_done_come_in_pages_under_the_control_lines_limit(tmp_path, monkeypatch):
    import json

    from heterps_paddle.runtime import launch_checkpoints, pulled_pass

    done = [f"d{k}:1:" + "0" * 64 for k in range(5)]
    offered = [[f"f{k}:1:" + "0" * 64, f"/data/part-{k}"] for k in range(40)]
    assert pulled_pass.offer_pages(done, offered) == [(done, offered)]  # all fit: one page, as before pages
    monkeypatch.setattr(pulled_pass, "PAGE_BYTES", 400)
    pages = pulled_pass.offer_pages(done, offered)
    assert len(pages) > 3 and all(len(json.dumps(page)) < 400 + 200 for page in pages)
    assert [n for d, _ in pages for n in d] == done and [p for _, f in pages for p in f] == offered
    # the shards done before come first: no page before the last of them holds a file
    last_done = max(i for i, (d, _) in enumerate(pages) if d)
    assert not any(f for _, f in pages[:last_done]) and not pages[last_done + 1][0]

    class Paged:
        """A plan answering ``done`` two names a page (``next``), as issue 60's plan does."""

        def __init__(self, names):
            self.names, self.asked = names, []

        def ask(self, message):
            at = message["from"]
            self.asked.append(at)
            following = at + 2 if at + 2 < len(self.names) else None
            return {"done": self.names[at : at + 2], "next": following, "total": len(self.names)}

    names = ["a", "a", "b", "c", "d"]  # a file trained as two of its copies is named twice
    choice = cc.Choice(str(tmp_path), None, cc.Progress(0))
    passes = launch_checkpoints.PassCheckpoints(choice, (1.0, "passes"))
    passes.puller = Paged(names)
    assert passes.done_in_plan(1) == names and passes.puller.asked == [0, 2, 4]
    passes.puller = type("Whole", (), {"ask": lambda self, message: {"done": names, "shards": 5}})()
    assert passes.done_in_plan(1) == names  # a plan without pages: the whole list at once
