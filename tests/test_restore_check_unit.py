"""A checkpoint's contents in figures that do not depend on its layout (runtime/restore_check.py): the same model
laid out as any plan the launch's machine moves between (one stage, a split, another split; any shard count; a full
save or an incremental chain) gives the same figures, and any change to a value, an optimizer column or a row is a
difference named by parameter or table."""

import json
import os
import subprocess
from dataclasses import dataclass

import numpy as np
import pytest

from heterps_paddle.runtime import restore_check
from heterps_paddle.runtime.checkpoint_files import CheckpointError


@dataclass(frozen=True)
class Table:  # as runtime/checkpoint.DenseTable
    table_id: int
    names: tuple
    numels: tuple


PARAMS = {"fc_0.w_0": 6, "fc_0.b_0": 2, "fc_1.w_0": 4, "fc_1.b_0": 1}
ONE_STAGE = (Table(1, tuple(PARAMS), tuple(PARAMS.values())),)
SPLIT = tuple(Table(i + 1, (name,), (numel,)) for i, (name, numel) in enumerate(PARAMS.items()))
# another split: the first layer's two parameters in one table, the second layer's in another
OTHER_SPLIT = (Table(1, ("fc_0.w_0", "fc_0.b_0"), (6, 2)), Table(2, ("fc_1.w_0", "fc_1.b_0"), (4, 1)))


def model(seed=0):
    rng = np.random.default_rng(seed)
    dense = {name: [f"{v:g} {m:g} {s:g}" for v, m, s in rng.normal(size=(n, 3))] for name, n in PARAMS.items()}
    rows = {int(k): f"{k} 0 0 0 {i % 5} 0 {i / 7:g} 0.5" for i, k in enumerate(rng.integers(1, 2**40, 400))}
    return dense, rows


def write(root, layout, dense, rows, shards=24, servers=1, gz=False):
    """A save: dense tables in ``layout`` (each cut in ``servers`` parts, in order), the sparse table in ``shards``
    files."""
    for table in layout:
        lines = [line for name in table.names for line in dense[name]]
        directory = root / f"{table.table_id:03d}"
        directory.mkdir(parents=True)
        for part in range(servers):
            chunk = lines[part * len(lines) // servers : (part + 1) * len(lines) // servers]
            (directory / f"part-{part:03d}").write_text("".join(line + "\n" for line in chunk))
    sparse = root / "000"
    sparse.mkdir(parents=True)
    for index in range(shards):
        path = sparse / f"part-000-{index:05d}"
        path.write_text("".join(line + "\n" for k, line in sorted(rows.items()) if k % shards == index))
        if gz:
            subprocess.run(["gzip", "-n", str(path)], check=True)
    return str(root)


def contents(root, layout, links=()):
    return restore_check.contents(root, layout, [0], links)


@pytest.mark.parametrize(
    ("saved", "restored"),
    [(ONE_STAGE, SPLIT), (SPLIT, ONE_STAGE), (SPLIT, OTHER_SPLIT), (OTHER_SPLIT, SPLIT), (ONE_STAGE, ONE_STAGE)],
    ids=["one-stage->split", "split->one-stage", "split->another", "another->split", "one-stage->one-stage"],
)
def test_the_same_model_in_any_layout_has_the_same_contents(tmp_path, saved, restored):
    dense, rows = model()
    captured = contents(write(tmp_path / "captured", saved, dense, rows, shards=24, gz=True), saved)
    held = contents(write(tmp_path / "held", restored, dense, rows, shards=1000, servers=2), restored)
    assert held == captured and captured.sparse[0].rows == len(rows)
    line = restore_check.compare(captured, held, "pass-000003")
    assert (
        line
        == f"4 dense parameters (13 values and their optimizer state); sparse table 000 ({len(rows)} rows, every row)"
    )
    # the record travels in the manifest
    assert restore_check.Contents.from_dict(captured.to_dict(), "pass-000003") == captured


def test_an_incremental_chain_counts_each_keys_newest_row(tmp_path):
    dense, rows = model()
    keys = sorted(rows)
    base = write(tmp_path / "base", ONE_STAGE, dense, {k: rows[k] for k in keys[:300]})
    # the increment: 50 rows changed, 100 new ones
    changed = {k: rows[k].replace(" 0.5", " 0.75") for k in keys[250:400]}
    increment = write(tmp_path / "increment", ONE_STAGE, dense, changed)
    chain = contents(increment, ONE_STAGE, links=[base])
    merged = {**{k: rows[k] for k in keys[:300]}, **changed}
    whole = contents(write(tmp_path / "whole", SPLIT, dense, merged, shards=7), SPLIT)
    assert chain == whole and chain.sparse[0].rows == 400
    # without its base it is another table: fewer rows
    assert contents(increment, ONE_STAGE).sparse[0].rows == 150


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ("value", r"dense parameter fc_1\.w_0's values digest: the servers hold [0-9a-f]{32}, the checkpoint captured"),
        ("state", r"dense parameter fc_1\.w_0's optimizer state digest"),
        ("row", r"sparse table 000's rows \(their values and optimizer state\): the servers hold [0-9a-f]{32}, the"),
        ("optimizer column", r"sparse table 000's rows \(their values and optimizer state\)"),
        ("lost row", r"sparse table 000's row count: the servers hold 399, the checkpoint captured 400"),
        ("extra row", r"sparse table 000's row count: the servers hold 401"),
    ],
)
def test_any_change_is_refused_naming_what_and_both_digests(tmp_path, change, named):
    dense, rows = model()
    captured = contents(write(tmp_path / "captured", ONE_STAGE, dense, rows), ONE_STAGE)
    dense = {name: list(lines) for name, lines in dense.items()}
    rows = dict(rows)
    if change == "value":
        columns = dense["fc_1.w_0"][2].split(" ")
        dense["fc_1.w_0"][2] = " ".join([f"{float(columns[0]) + 0.5:g}", *columns[1:]])
    elif change == "state":
        dense["fc_1.w_0"][0] += "1"
    elif change == "row":  # one value of one row, whatever its key (keys multiples of 61 were all an earlier proof saw)
        changed = next(k for k in sorted(rows) if k % 61)
        rows[changed] = rows[changed].replace(" 0.5", " 0.25")
    elif change == "optimizer column":
        last = sorted(rows)[-1]
        rows[last] = rows[last].replace(" 0 ", " 1 ", 1)
    elif change == "lost row":
        del rows[sorted(rows)[0]]
    else:
        rows[12345] = "12345 0 0 0 1 0 0.1 0.5"
    held = contents(write(tmp_path / "held", SPLIT, dense, rows), SPLIT)
    with pytest.raises(
        CheckpointError, match="the restore from checkpoint pass-000003 does not reproduce what it captured: " + named
    ):
        restore_check.compare(captured, held, "pass-000003")


def test_a_parameter_or_table_on_one_side_only_is_named(tmp_path):
    dense, rows = model()
    captured = contents(write(tmp_path / "captured", ONE_STAGE, dense, rows), ONE_STAGE)
    fewer = (Table(1, ("fc_0.w_0", "fc_0.b_0", "fc_1.w_0"), (6, 2, 4)),)
    held = restore_check.contents(write(tmp_path / "held", fewer, dense, rows), fewer, [0])
    with pytest.raises(CheckpointError, match=r"dense parameter fc_1\.b_0: the servers hold no such parameter"):
        restore_check.compare(captured, held, "c")
    no_table = restore_check.Contents(captured.dense, {})
    with pytest.raises(
        CheckpointError, match=r"sparse table 000: the servers hold no such table, the checkpoint captured 400 rows"
    ):
        restore_check.compare(captured, no_table, "c")


def test_a_dense_table_of_another_size_or_an_unreadable_record_is_an_error(tmp_path):
    dense, rows = model()
    root = write(tmp_path / "save", ONE_STAGE, dense, rows)
    with open(os.path.join(root, "001", "part-000"), "a") as f:
        f.write("1 2 3\n")
    with pytest.raises(CheckpointError, match=r"dense table 1 has 14 values, its parameters .* have 13"):
        contents(root, ONE_STAGE)
    with pytest.raises(CheckpointError, match=r"checkpoint c: unreadable contents in its manifest"):
        restore_check.Contents.from_dict({"format": 2, "dense": {"x": {"numel": 1}}, "sparse": {}}, "c")
    with pytest.raises(CheckpointError, match=r"format 7, this version reads 2"):
        restore_check.Contents.from_dict({"format": 7, "dense": {}, "sparse": {}}, "c")


def test_a_row_in_another_shard_than_its_keys_is_refused_naming_it(tmp_path):
    dense, rows = model()
    root = write(tmp_path / "save", ONE_STAGE, dense, rows, shards=7)
    key = next(k for k in sorted(rows) if k % 7 != 3)
    with open(os.path.join(root, "000", "part-000-00003"), "a") as f:  # a wrong re-cut: the row also in shard 3
        f.write(rows[key] + "\n")
    with pytest.raises(
        CheckpointError,
        match=rf"part-000-00003: the row of key {key} sits in shard 3, its key's shard of 7 is {key % 7}",
    ):
        contents(root, ONE_STAGE)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("x1 0 0.5", "a row starts with its key and a space"),
        ("12\t0 0.5", "a row starts with its key and a space"),
        (f"{2**64} 0 0.5", r"its key is over 2\^64 - 1"),
        ("1" * 21 + " 0", "a row starts with its key and a space"),
    ],
)
def test_a_line_that_is_not_a_row_is_an_error_naming_its_file_and_line(tmp_path, line, why):
    dense, rows = model()
    root = write(tmp_path / "save", ONE_STAGE, dense, rows, shards=1)
    path = os.path.join(root, "000", "part-000-00000")
    with open(path, "a") as f:
        f.write("\n  \n" + line + "\n")  # blank lines are no rows, and no error
    with pytest.raises(CheckpointError, match=rf"part-000-00000:{len(rows) + 3}: not a sparse table row \({why}"):
        contents(root, ONE_STAGE)


def test_each_rows_hash_is_the_polynomial_of_its_line_across_blocks(tmp_path, monkeypatch):
    """The vectorised hash against the same polynomial computed a byte at a time, with blocks so small that lines
    cross them, and a file whose last line has no newline."""
    from heterps_paddle.runtime import row_digest, shard_lines

    monkeypatch.setattr(shard_lines, "BLOCK_BYTES", 37)
    rng = np.random.default_rng(4)
    lines = [
        f"{int(k) * 5 + 2} " + " ".join(f"{v:g}" for v in rng.normal(size=int(rng.integers(0, 9))))
        for k in rng.integers(0, 2**50, 300)
    ]
    lines.append(f"{2**64 - 4} 1")  # the largest keys: 20 digits (this one in shard 2 of 5)
    path = tmp_path / "part-000-00002"
    path.write_bytes(("\n".join(lines)).encode())  # no newline at the end
    keys, hashes = row_digest.file_rows(str(path), 5)
    mask = 2**64 - 1
    expected = []
    for line in lines:
        h, power = 0, 1
        for byte in line.encode() + b"\n":
            h = (h + (byte + 1) * power) & mask
            power = (power * int(row_digest._BASE)) & mask
        expected.append(h)
    assert [int(k) for k in keys] == [int(line.split(" ")[0]) for line in lines]
    assert [int(h) for h in hashes] == expected


def test_an_earlier_versions_manifest_has_its_rows_counted(tmp_path):
    dense, rows = model()
    captured = contents(write(tmp_path / "captured", ONE_STAGE, dense, rows), ONE_STAGE).to_dict()
    earlier = {
        "sample_every": 61,
        "dense": captured["dense"],
        "sparse": {"000": {"rows": 400, "sample_rows": 7, "sample": "ab"}},
    }
    held = contents(write(tmp_path / "held", SPLIT, dense, rows), SPLIT)
    line = restore_check.compare(restore_check.Contents.from_dict(earlier, "c"), held, "c")
    assert line.endswith("sparse table 000 (400 rows counted: captured by an earlier version)")


def test_a_cut_gzip_part_is_named_as_such_and_any_byte_hashes_as_its_polynomial(tmp_path):
    from heterps_paddle.runtime import row_digest

    path = tmp_path / "part-000-00000"
    path.write_bytes(b"".join(b"%d 1.0 2.0 3.0\n" % (2 * i) for i in range(300_000)))
    subprocess.run(["gzip", "-n", str(path)], check=True)
    gz = tmp_path / "part-000-00000.gz"
    gz.write_bytes(gz.read_bytes()[: gz.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"part-000-00000\.gz: not a readable gzip file"):
        row_digest.file_rows(str(gz), 2)
    # a byte of 255 counts as 256 in its line's polynomial (numpy 1 would wrap it to 0 in uint8)
    keys, hashes = row_digest._block_rows(b"5 \xff\n", "p", 1)
    base, mask = int(row_digest._BASE), 2**64 - 1
    expected = sum((byte + 1) * pow(base, i, 2**64) for i, byte in enumerate(b"5 \xff\n")) & mask
    assert int(keys[0]) == 5 and int(hashes[0]) == expected
    with pytest.raises(CheckpointError, match="unreadable contents in its manifest"):
        restore_check.Contents.from_dict([], "c")


def test_the_restore_proof_bench_prints_its_fields(tmp_path, capsys):
    from conftest import run_cli

    code, out, _ = run_cli(capsys, "bench", "restore-proof", "--rows", "3000", "--dir", str(tmp_path), "--json")
    figures = json.loads(out)
    assert code == 0 and figures["rows"] == 3000 and figures["bytes"] > 3000 * 50
    assert figures["proof_s"] > 0 and figures["per_row_python_s"] > 0 and figures["proof_over_read"] > 0
    # the table is kept and reused: a second run writes nothing
    code, out, _ = run_cli(capsys, "bench", "restore-proof", "--rows", "3000", "--dir", str(tmp_path), "--json")
    assert code == 0 and json.loads(out)["rows"] == 3000
