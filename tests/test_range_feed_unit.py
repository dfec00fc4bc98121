"""Byte ranges of large files (runtime/range_feed.py): the lines that begin in a range, and the pipe that gives
them to Paddle's reader; a pulled pass that cuts its large files into ranges and trains each line once."""

import os
import subprocess
import threading

import pytest

from heterps_paddle.data_plan import DataPlan
from heterps_paddle.runtime import range_feed


def lines_file(path, count, width=37, end_newline=True):
    text = "".join(f"{k} " + "x" * (k % width) + "\n" for k in range(count))
    path.write_bytes(text.encode() if end_newline else text.encode()[:-1])
    return str(path)


@pytest.mark.parametrize("end_newline", [True, False])
@pytest.mark.parametrize("step", [1, 7, 64, 4096, 1 << 20])
def test_consecutive_ranges_hold_every_line_once_at_any_cut(tmp_path, step, end_newline):
    path = lines_file(tmp_path / "f", 300, end_newline=end_newline)
    data = open(path, "rb").read()
    pieces, lines = [], 0
    for start in range(0, len(data), step):
        found = range_feed.span(path, start, min(start + step, len(data)))
        pieces.append(data[found.first : found.stop])
        lines += found.lines
        # each range starts a line (or is empty) and ends one
        assert found.first == found.stop or found.first == 0 or data[found.first - 1 : found.first] == b"\n"
    assert b"".join(pieces) == data and lines == 300


def test_a_range_inside_one_line_holds_none(tmp_path):
    path = tmp_path / "long"
    path.write_bytes(b"a" * 10_000 + b"\n" + b"b\n")
    found = range_feed.span(str(path), 100, 200)
    assert found.first == found.stop and found.lines == 0
    assert range_feed.span(str(path), 5000, 10_002).lines == 1  # "b": it begins in the range


def test_a_pipe_gives_its_range_to_a_reader_as_paddle_opens_it_and_one_never_read_is_named(tmp_path):
    path = lines_file(tmp_path / "f", 5000)
    data = open(path, "rb").read()
    found = range_feed.span(path, 1000, 60_000)
    with range_feed.RangeFeeds() as feeds:
        fifo = feeds.feed(path, found, "f@1000-60000")
        never = feeds.feed(path, found, "never read")  # a call that failed before its reader opened it
        # Paddle's local reader: fopen(path), or ``cat path | pipe_command``
        read = subprocess.run(["sh", "-c", f"cat {fifo} | cat"], capture_output=True, timeout=60).stdout
        assert feeds.lines == {fifo: found.lines, never: found.lines}
    assert read == data[found.first : found.stop]
    assert feeds.errors == ["never read: its reader never opened it"]  # the range was not trained: the pass says so
    assert feeds.directory and not os.path.exists(feeds.directory)  # the pipes removed, the unread feed ended
    with range_feed.RangeFeeds() as whole:
        pass
    assert whole.directory == ""  # a call of whole files makes no directory


def test_a_reader_that_closes_early_is_an_error_named_by_the_shard(tmp_path):
    path = lines_file(tmp_path / "f", 200_000)
    with range_feed.RangeFeeds() as feeds:
        fifo = feeds.feed(path, range_feed.span(path, 0, os.path.getsize(path)), "big@0-end")
        with open(fifo, "rb") as f:
            f.read(10)
        feeds.threads[0].join(30)
    assert feeds.errors and feeds.errors[0].startswith("big@0-end: its reader closed the pipe")


def test_the_range_setting_refuses_what_the_plan_refuses(monkeypatch):
    from heterps_paddle import settings
    from heterps_paddle.data_plan.bounds import MIN_RANGE_BYTES

    monkeypatch.setenv("HETERPS_RANGE_BYTES", str(MIN_RANGE_BYTES))
    assert settings.get("HETERPS_RANGE_BYTES") == MIN_RANGE_BYTES
    monkeypatch.setenv("HETERPS_RANGE_BYTES", str(MIN_RANGE_BYTES - 1))
    with pytest.raises(settings.SettingError, match=f"{MIN_RANGE_BYTES} or more"):
        settings.get("HETERPS_RANGE_BYTES")


def test_only_local_uncompressed_files_are_cut(tmp_path):
    plain = lines_file(tmp_path / "part-0", 3)
    packed = tmp_path / "part-1.gz"
    packed.write_bytes(b"\x1f\x8b")
    assert range_feed.cuttable(plain) and not range_feed.cuttable(str(packed))
    assert not range_feed.cuttable("hdfs://cluster/part-0") and not range_feed.cuttable(str(tmp_path))


class Board:
    def __init__(self):
        self.plan, self.offers = DataPlan(), []

    def shards(self, message):
        if message["do"] == "offer":
            self.offers.append(message)
        reply = self.plan.answer(message)
        assert "error" not in reply, reply
        return reply


class Dataset:
    def __init__(self, files, threads):
        self.filelist, self.thread_num = list(files), threads

    def set_filelist(self, files):
        self.filelist = list(files)


class Program:
    class Block:
        ops = [type("Op", (), {"type": "push_dense"})()]

    blocks = [Block()]


def read_as_paddle(call, got):
    """Each reader thread of the call reads its file whole, at once (a pipe's feed waits for its reader)."""

    def read(path):
        with open(path, "rb") as f:
            got.append(f.read())

    threads = [threading.Thread(target=read, args=(p,)) for p in call.dataset.filelist]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


@pytest.mark.parametrize("packed", [False, True])
def test_a_pulled_pass_trains_a_large_file_by_its_ranges_each_line_once(tmp_path, monkeypatch, packed):
    from heterps_paddle.runtime import meter, pulled_pass, seam

    monkeypatch.setenv("HETERPS_RANGE_BYTES", "4096")
    (tmp_path / "data").mkdir()
    large = lines_file(tmp_path / "data" / "large", 2000)  # ~40 KB: about ten ranges
    small = lines_file(tmp_path / "data" / "small", 20)
    files = [large, small]
    if packed:  # a compressed file in the offer: nothing is cut (its bytes are not lines)
        packed_path = tmp_path / "data" / "other.gz"
        packed_path.write_bytes(b"")
        files.append(str(packed_path))
    board = Board()
    board.shards({"do": "offer", "pass": 1, "trainers": 2, "trainer": 1, "files": []})
    got, samples = [], []
    call = seam.DatasetCall(None, Program(), Dataset(files, 3), None, {})

    def run(c):
        samples.append(meter.dataset_samples_of([p for p in c.dataset.filelist if not pulled_pass.is_empty(p)]))
        read_as_paddle(c, got)

    _, trained = pulled_pass.Puller(board, 2, 0).run_pass(1, call, run)
    offer = board.offers[-1]
    assert offer.get("ranges") == (None if packed else 4096)
    every = sorted(line for chunk in got for line in chunk.splitlines())
    expected = sorted(open(large, "rb").read().splitlines() + open(small, "rb").read().splitlines())
    assert every == expected and sum(samples) == 2020  # each line once, counted without reading a pipe twice
    shards = board.plan.passes[1].done_names()
    assert (len(shards) > 10) != packed and all(("@" in s) != packed for s in shards if s.startswith("large"))
    assert sorted(set(trained.paths)) == sorted(p for p in files if not p.endswith(".gz"))


def test_a_call_of_ranges_inside_one_line_each_is_not_run_and_its_pass_ends(tmp_path, monkeypatch):
    """A range that holds no line start (inside one long line) trains nothing: no pipe is made for it, and a call
    of only such ranges is not run."""
    from heterps_paddle.runtime import pulled_pass, seam

    monkeypatch.setenv("HETERPS_RANGE_BYTES", "4096")
    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "one-line"
    path.write_bytes(b"1 " + b"7" * 20_000 + b"\n")  # one line over five ranges: the first holds it
    board = Board()
    board.shards({"do": "offer", "pass": 1, "trainers": 2, "trainer": 1, "files": []})
    got = []
    _, trained = pulled_pass.Puller(board, 2, 0).run_pass(
        1, seam.DatasetCall(None, Program(), Dataset([str(path)], 1), None, {}), lambda c: read_as_paddle(c, got)
    )
    assert b"".join(got) == path.read_bytes()  # the line once, from its first range
    assert trained.calls == 1 and len(board.plan.passes[1].done_names()) == 5  # four empty ranges, none called
