"""A data file's content name (heterps_paddle/data_plan/names.py, runtime/file_identity.py): one format, one
parser; a file named by its size and sampled blocks, never read whole; an earlier version's names still read."""

import hashlib
import os

from heterps_paddle.data_plan import names
from heterps_paddle.runtime import file_identity

SHA = "ab" * 32


def test_one_parser_reads_sampled_and_whole_file_names_and_refuses_paths():
    sampled = names.parse(f"part:0001:12:s-{SHA}")  # a base name may hold ':'
    assert sampled == ("part:0001", 12, f"s-{SHA}", None, None) and sampled.sampled
    old = names.parse(f"part-1:34:{SHA}")
    assert old == ("part-1", 34, SHA, None, None) and not old.sampled
    for path in ("/data/part-1", "hdfs://c/day:1", f"x:1a:{SHA}", f"x:12:s-{SHA[:-1]}", f"x:12:S-{SHA}"):
        assert names.parse(path) is None and names.size_of(path) == 1
    assert names.size_of(f"e:0:s-{SHA}") == 0
    assert names.content_name("b", 5, SHA) == f"b:5:s-{SHA}"


def test_sampled_blocks_cover_a_small_file_whole_and_a_large_one_at_its_ends_and_evenly_between():
    block = names.SAMPLE_BLOCK
    assert names.sample_offsets(0) == [] and names.sample_offsets(block + 1) == [0, block]
    size = 10 << 30
    offsets = names.sample_offsets(size)
    assert len(offsets) == names.SAMPLED_BLOCKS and offsets[0] == 0 and offsets[-1] == size - block
    assert offsets == sorted(set(offsets))


def test_a_file_of_10_gb_is_named_reading_only_its_sampled_blocks(tmp_path, monkeypatch):
    big = tmp_path / "part-00000"
    with open(big, "wb") as f:
        f.truncate(10 << 30)  # sparse: nothing to read but the blocks asked for
    read = []
    real_open = open

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def seek(self, at):
            self.f.seek(at)

        def read(self, n):
            read.append(n)
            return self.f.read(n)

    monkeypatch.setattr(file_identity, "open", lambda path, mode: Counting(real_open(path, mode)), raising=False)
    named = file_identity.identity(str(big))
    assert named.startswith(f"part-00000:{10 << 30}:s-") and names.parse(named).size == 10 << 30
    assert len(read) == names.SAMPLED_BLOCKS and sum(read) == names.SAMPLED_BLOCKS * names.SAMPLE_BLOCK


def test_the_same_file_under_another_path_is_named_alike_and_a_changed_block_is_another_file(tmp_path):
    size = 3 << 20  # 48 blocks, 16 sampled
    data = bytearray(os.urandom(size))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "part-1").write_bytes(bytes(data))
    (tmp_path / "b" / "part-1").write_bytes(bytes(data))
    first = file_identity.name_of(str(tmp_path / "a" / "part-1"))
    assert first == file_identity.name_of(str(tmp_path / "b" / "part-1"))
    data[size - 1] ^= 1  # in the last block, which is sampled
    (tmp_path / "b" / "part-1").write_bytes(bytes(data))
    assert file_identity.name_of(str(tmp_path / "b" / "part-1")) != first
    # the limit, said in file_identity's doc: a change between the sampled blocks keeps the name
    data[size - 1] ^= 1
    data[names.sample_offsets(size)[1] + names.SAMPLE_BLOCK + 10] ^= 1
    (tmp_path / "b" / "part-1").write_bytes(bytes(data))
    assert file_identity.name_of(str(tmp_path / "b" / "part-1")) == first


def test_an_earlier_versions_whole_file_name_is_read_but_names_the_file_no_more(tmp_path):
    path = tmp_path / "part-0"
    path.write_bytes(b"1 2:3\n" * 10)
    old = f"part-0:60:{hashlib.sha256(path.read_bytes()).hexdigest()}"
    assert file_identity.is_identity(old) and names.size_of(old) == 60
    assert file_identity.name_of(str(path)) != old
    assert not file_identity.done_here(str(path), frozenset({old}))  # trained again, once
