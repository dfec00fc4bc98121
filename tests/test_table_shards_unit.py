"""The sparse tables' shard count (runtime/table_shards.py): what a job chooses, and what it refuses to load."""

import json
import os
import subprocess
import types

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


class _Service:
    def __init__(self):
        self.loaded = []

    def load_sparse(self, directory, mode, table_id):
        table = os.path.join(directory, f"{table_id:03d}")
        rows = {}
        for name in sorted(os.listdir(table)):
            with open(os.path.join(table, name), "rb") as f:
                rows[name] = f.read().splitlines()
        self.loaded.append((directory, table_id, rows))


class _Runtime:
    """A server of ``servers`` whose sparse table 0 is built with ``count`` shards."""

    def __init__(self, count, servers=1, index=0):
        self._server = _Service()
        self.layout = {0: ("emb", count)}
        self.role_maker = types.SimpleNamespace(
            _get_pserver_endpoints=lambda: [f"127.0.0.1:{i}" for i in range(servers)], _role_id=lambda: index
        )


def _table(path, count, keys):
    """A sparse table saved in ``count`` shard files: the row of key k in file k % count, gzipped as a full save."""
    path.mkdir(parents=True)
    for index in range(count):
        lines = b"".join(f"{k} 0 0 0 1 0 {k / 7:.6f}\n".encode() for k in keys if k % count == index)
        plain = path / f"part-000-{index:05d}"
        plain.write_bytes(lines)
        subprocess.run(["gzip", "-n", str(plain)], check=True)


@pytest.fixture
def server(monkeypatch):
    def make(count, servers=1, index=0):
        runtime = _Runtime(count, servers, index)
        monkeypatch.setattr(table_shards.seam, "sparse_table_layout", lambda r: r.layout)
        monkeypatch.setattr(table_shards.seam, "server_service", lambda r: r._server)
        monkeypatch.setattr(table_shards.seam, "identity", lambda: f"parameter server {index}")
        return runtime

    return make


KEYS = [3, 24, 25, 1000, 1001, 393216, 786433, 2**63 + 5, 77]


def test_a_table_saved_in_another_count_is_recut_and_loaded_whole(tmp_path, server):
    """Issue 52: a model saved in 24 shard files loaded into a job of Paddle's 1,000 (heterps eval, init_model_path)
    loaded nothing; it is re-cut into the job's count, every row in the file its key routes to."""
    _table(tmp_path / "model" / "000", 24, KEYS)
    runtime = server(1000)
    table_shards.load_sparse(runtime, str(tmp_path / "model"), 0)
    ((directory, table_id, files),) = runtime._server.loaded
    assert table_id == 0 and len(files) == 1000 and directory != str(tmp_path / "model")
    placed = {int(line.split()[0]): int(name.rsplit("-", 1)[1]) for name, lines in files.items() for line in lines}
    assert placed == {k: k % 1000 for k in KEYS}
    assert not os.path.exists(directory)  # the re-cut copy is removed once loaded


def test_each_server_gets_the_rows_of_its_own_shards(tmp_path, server):
    _table(tmp_path / "model" / "000", 24, KEYS)
    seen = {}
    for index in range(3):
        runtime = server(10, servers=3, index=index)
        table_shards.load_sparse(runtime, str(tmp_path / "model"), 0)
        ((_, _, files),) = runtime._server.loaded
        assert len(files) == 10  # a server refuses a directory of another count: the others' files are empty
        seen.update({int(line.split()[0]): index for lines in files.values() for line in lines})
    # Paddle's routing: 10 shards on 3 servers, 4 a server (the last holds 2)
    assert seen == {k: (k % 10) // 4 for k in KEYS}


def test_the_same_count_loads_the_save_itself(tmp_path, server):
    _table(tmp_path / "model" / "000", 24, KEYS)
    runtime = server(24)
    table_shards.load_sparse(runtime, str(tmp_path / "model"), 0)
    assert runtime._server.loaded[0][0] == str(tmp_path / "model")


def test_a_missing_table_or_a_line_that_is_not_a_row_is_refused_by_name(tmp_path, server):
    (tmp_path / "dense_only" / "001").mkdir(parents=True)
    with pytest.raises(CheckpointError, match=r"no shard files of sparse table emb \(table 000/\)"):
        table_shards.load_sparse(server(24), str(tmp_path / "dense_only"), 0)
    table_shards.load_sparse(server(24), str(tmp_path / "dense_only"), 0, required=False)  # a chain's link: none
    bad = tmp_path / "bad" / "000"
    bad.mkdir(parents=True)
    (bad / "part-000-00000").write_bytes(b"12 0 0\nGARBAGE 1 2\n")
    with pytest.raises(CheckpointError, match=r"part-000-00000:2: not a sparse table row"):
        table_shards.load_sparse(server(1000), str(tmp_path / "bad"), 0)


def test_the_layout_file_names_each_table_and_says_how_to_load_it(tmp_path):
    table_shards.write_layout(str(tmp_path), {0: ("SparseFeatFactors", 24)})
    document = json.loads((tmp_path / table_shards.LAYOUT_FILE).read_text())
    assert document["shard_num"] == 24 and document["tables"] == {"000": {"name": "SparseFeatFactors", "shard_num": 24}}
    assert "strategy.sparse_table_configs.add()" in document["how_to_load"]


def test_a_row_refused_in_a_large_gzip_part_is_the_error_and_no_gzip_is_left(tmp_path, monkeypatch):
    """The re-cut stops at a bad row while gzip still has most of the file to write: the row's error is raised,
    gzip is stopped (not judged as a broken file), and no second error comes when the reader is collected."""
    import gc
    import sys

    import psutil

    unraised = []
    monkeypatch.setattr(sys, "unraisablehook", unraised.append)

    source = tmp_path / "saved"
    source.mkdir()
    rows = ["not a row"] + [f"{k} 0.1 0.2 0.3 0.4 0.5 0.6 0.7" for k in range(200_000)]  # several MB: gzip blocks
    part = source / "part-000-00000"
    part.write_text("\n".join(rows) + "\n")
    subprocess.run(["gzip", "-n", str(part)], check=True)
    with pytest.raises(CheckpointError, match=r"part-000-00000\.gz:1: not a sparse table row") as refused:
        table_shards.recut(str(source), str(tmp_path / "recut"), 2)
    assert "gzip" not in str(refused.value.__context__ or "")
    del refused  # its traceback holds the reader
    gc.collect()
    assert not [u.exc_value for u in unraised]
    assert not [p for p in psutil.Process().children(recursive=True) if p.name() == "gzip"]


def test_rows_of_parts_whose_last_line_has_no_newline_never_run_together(tmp_path):
    source = tmp_path / "saved"
    source.mkdir()
    (source / "part-000-00000").write_bytes(b"4 0.5\n2 0.25")  # no newline at the end
    (source / "part-000-00001").write_bytes(b"6 0.75\n")
    assert table_shards.recut(str(source), str(tmp_path / "recut"), 1) == 3
    assert (tmp_path / "recut" / "part-000-00000").read_bytes() == b"4 0.5\n2 0.25\n6 0.75\n"
