"""The sparse tables' shard count (runtime/table_shards.py): what a job chooses, and what it refuses to load."""

import pytest

from heterps_paddle.runtime import table_shards
from heterps_paddle.runtime.checkpoint_files import CheckpointError
from heterps_paddle.settings import SettingError


def saved(path, tables):
    """A saved model's layout: table directory -> shard files (and a dense table's one file beside them)."""
    for name, count in tables.items():
        (path / name).mkdir(parents=True)
        for i in range(count):
            (path / name / f"part-000-{i:05d}.gz").write_text("")
    (path / "009").mkdir(parents=True)
    (path / "009" / "part-000.gz").write_text("")  # a dense table, regrouped: not a shard file
    (path / "heterps_checkpoint.json").write_text("{}")
    return str(path)


def test_a_fresh_job_takes_24_shards_a_server():
    assert table_shards.choose(1, None, {}) == (24, "24 a server, 1 server")
    assert table_shards.choose(3, None, {})[0] == 72
    assert table_shards.choose(0, None, {})[0] == 24  # a process told no servers still agrees with the others


def test_a_resumed_job_takes_its_checkpoints_count(tmp_path):
    old = saved(tmp_path / "pass-000002", {"000": 1000, "002": 1000})  # written before the count was chosen
    count, why = table_shards.choose(2, old, {})
    assert count == 1000 and old in why  # not 48: the servers would refuse the files
    assert table_shards.choose(1, old, {"HETERPS_TABLE_SHARDS": "1000"})[0] == 1000
    with pytest.raises(CheckpointError, match=r"HETERPS_TABLE_SHARDS=24, but .* written with 1000 shard files"):
        table_shards.choose(1, old, {"HETERPS_TABLE_SHARDS": "24"})
    # a directory without a sparse table says nothing: the fresh count
    assert table_shards.choose(1, saved(tmp_path / "dense_only", {}), {})[0] == 24


def test_the_setting_wins_on_a_fresh_start_and_is_checked():
    assert table_shards.choose(4, None, {"HETERPS_TABLE_SHARDS": "7"}) == (7, "HETERPS_TABLE_SHARDS")
    with pytest.raises(SettingError, match="HETERPS_TABLE_SHARDS='0': must be 1 or more"):
        table_shards.choose(1, None, {"HETERPS_TABLE_SHARDS": "0"})
    with pytest.raises(SettingError, match="HETERPS_TABLE_SHARDS='many'"):
        table_shards.choose(1, None, {"HETERPS_TABLE_SHARDS": "many"})


def test_tables_of_different_counts_are_not_one_jobs_save(tmp_path):
    mixed = saved(tmp_path / "mixed", {"000": 24, "001": 1000})
    with pytest.raises(CheckpointError, match=r"different counts of shard files \(000: 24; 001: 1000\)"):
        table_shards.saved_count(mixed)


class _Proto:
    def __init__(self, name=""):
        self.table_name = name
        self._fields = {}

    def HasField(self, field):
        return field in self._fields

    def __setattr__(self, key, value):
        if key == "shard_num":
            self._fields[key] = value
        object.__setattr__(self, key, value)


class _Tables(list):
    def add(self):
        self.append(_Proto())
        return self[-1]


def test_every_table_gets_the_count_unless_the_script_set_its_own():
    tables = _Tables([_Proto("emb_b")])
    table_shards.set_count(tables, ["emb_a", "emb_b"], 24)
    assert {t.table_name: t.shard_num for t in tables} == {"emb_a": 24, "emb_b": 24}
    assert table_shards.script_sets_count(tables, ["emb_a"]) == ["emb_a"]
    mine = _Tables([_Proto("emb_c")])
    mine[0].shard_num = 100
    assert table_shards.script_sets_count(mine, ["emb_c", "emb_d"]) == ["emb_c"]


def test_a_start_directory_in_another_layout_is_refused_by_name(tmp_path, monkeypatch):
    start = saved(tmp_path / "model", {"000": 1000})
    monkeypatch.setattr(table_shards, "_count", 24)
    monkeypatch.setattr(table_shards.seam, "identity", lambda: "parameter server 0")
    with pytest.raises(CheckpointError, match=r"saved in 1000 shard files each, this job's hold 24.*=1000"):
        table_shards.check_start_dir(start)
    monkeypatch.setattr(table_shards, "_count", 1000)
    table_shards.check_start_dir(start)  # the same layout: loaded
