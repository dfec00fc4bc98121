"""Checkpoints of the servers' tables that resume into any plan (docs/sections.md, "Checkpoints").

``fleet.save_persistables`` makes every server write its tables (``save_all_model``): ``DIR/000`` for the sparse
table, ``DIR/001``... for the dense ones, one text line per element (the value, then the optimizer's columns).
A one-stage job keeps all dense parameters in one table; a split job's PS runtime keeps one table per parameter
(``split_dense_table``), so the same model's checkpoint came in two layouts, and a plain job loading a split
job's checkpoint read the first parameter's lines as the whole dense table.  Here:

- **Save.**  After the servers wrote a split job's checkpoint, trainer 0 regroups the dense tables into the
  one-stage layout (the lines of each parameter, in the one-stage table's order), then writes
  ``heterps_checkpoint.json`` last: the layout and a SHA-256 of every file.  A checkpoint without the manifest is
  incomplete (a crash mid-save) unless it has none at all (a plain Paddle checkpoint, taken as one-stage layout).
- **Resume.**  ``fleet.init_server(DIR)`` loads the sparse tables (Paddle); the extension also loads the dense
  tables, regrouped into this job's layout when it differs, after checking the files against the manifest and
  every parameter's size against the program (a mismatch is an error naming the table and parameter).  Trainer
  0's ``init_worker`` would then push its freshly initialised dense values over them: it does not when the
  servers of its launch restored them (:func:`servers_restored`), so training resumes from the checkpoint.

Regrouping needs each parameter's lines in one file: with more than one server (each holds a slice of every dense
table) a checkpoint resumes only into the layout it was saved in, and says so otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from paddle.distributed.ps.utils.public import get_the_one_recv_context

from heterps_paddle import rendezvous
from heterps_paddle.log import logger
from heterps_paddle.runtime import restore_check, seam, table_shards
from heterps_paddle.runtime.checkpoint_choice import chain_of, verify_chain
from heterps_paddle.runtime.checkpoint_files import (
    FORMAT,
    MANIFEST,
    CheckpointError,
    digests,
    read_manifest,
    workers,
    write_manifest,
)

__all__ = ["FORMAT", "MANIFEST", "CheckpointError"]  # (their home is checkpoint_files.py, Paddle-free)


@dataclass(frozen=True)
class DenseTable:
    table_id: int
    names: tuple[str, ...]  # the parameters, in the table's order
    numels: tuple[int, ...]  # elements (lines) of each

    def to_dict(self) -> dict[str, Any]:
        return {"table_id": self.table_id, "names": list(self.names), "numels": list(self.numels)}

    @staticmethod
    def from_dict(value: dict[str, Any]) -> DenseTable:
        return DenseTable(int(value["table_id"]), tuple(value["names"]), tuple(int(n) for n in value["numels"]))


def dense_layout(runtime: Any, split: bool) -> tuple[DenseTable, ...]:
    """The dense tables of this job's model as a split job (one per parameter) or a one-stage job lays them out."""
    tables = get_the_one_recv_context(runtime.context, split_dense_table=split)
    block = seam.origin_program(runtime).global_block()
    return tuple(
        DenseTable(table_id, tuple(names), tuple(int(np.prod(block.var(n).shape)) for n in names))
        for table_id, names in sorted(tables.items())
    )


def table_dir(root: str, table_id: int) -> str:
    return os.path.join(root, f"{table_id:03d}")


def _parts(directory: str) -> list[str]:
    return sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.startswith("part-"))


# Python's zlib must not run in a process that loaded Paddle 2.6.2 first (libpaddle exports zlib's symbols: the
# checkpoint code crashed in inflateReset2, docs/paddle-notes.md); the gzip program does the compression, as
# Paddle's own table save and load do (and the reading: runtime/shard_lines.py).
def _gzip_to(path: str, data: bytes) -> None:
    with open(path, "wb") as out:
        subprocess.run(["gzip", "-c"], input=data, stdout=out, check=True)


def regroup(root: str, source: tuple[DenseTable, ...], target: tuple[DenseTable, ...]) -> dict[int, list[bytes]]:
    """Each target table's lines, taken parameter by parameter from the source tables under ``root``."""
    by_name = restore_check.parameter_lines(root, source)
    out: dict[int, list[bytes]] = {}
    for table in target:
        lines = []
        for name, numel in zip(table.names, table.numels):
            if name not in by_name:
                raise CheckpointError(f"checkpoint {root}: no values for the dense parameter {name}")
            if len(by_name[name]) != numel:
                raise CheckpointError(
                    f"checkpoint {root}: dense parameter {name} has {len(by_name[name])} values, the program's has "
                    f"{numel} (another model?)"
                )
            lines.extend(by_name[name])
        out[table.table_id] = lines
    return out


def _write_tables(root: str, tables: dict[int, list[bytes]]) -> None:
    for table_id, lines in tables.items():
        directory = table_dir(root, table_id)
        os.makedirs(directory, exist_ok=True)
        _gzip_to(os.path.join(directory, "part-000.gz"), b"\n".join(lines) + b"\n")


def servers_of(runtime: Any) -> int:
    return len(seam.server_endpoints(runtime.role_maker))


def sparse_tables(dirname: str, dense: tuple[DenseTable, ...]) -> list[int]:
    """The sparse tables saved in ``dirname``: its table directories that are not the dense ones."""
    dense_ids = {t.table_id for t in dense}
    return sorted(
        int(name)
        for name in os.listdir(dirname)
        if len(name) == 3
        and name.isdigit()
        and int(name) not in dense_ids
        and os.path.isdir(os.path.join(dirname, name))
    )


GZIP_BATCH = 256  # files per gzip run


def compress_sparse(dirname: str, tables: list[int]) -> None:
    """The plain-text part files of ``tables`` (Paddle's modes 1 and 2 write them uncompressed) gzipped in place,
    as a full save (mode 0) writes them: ``part-*.gz``, which Paddle's loader reads by the suffix.  Batches of files
    run in gzip processes side by side (checkpoint_files.workers)."""
    plain = [p for t in tables for p in _parts(table_dir(dirname, t)) if not p.endswith(".gz")]
    batch = max(1, min(GZIP_BATCH, -(-len(plain) // workers())))

    def gzip(files: list[str]) -> str | None:
        done = subprocess.run(["gzip", "-n", "-f", "--", *files], capture_output=True)
        return None if done.returncode == 0 else done.stderr.decode(errors="replace").strip()

    with ThreadPoolExecutor(workers()) as pool:
        failed = [err for err in pool.map(gzip, [plain[i : i + batch] for i in range(0, len(plain), batch)]) if err]
    if failed:
        raise CheckpointError(f"{dirname}: gzip failed ({failed[0]})")


def after_save_persistables(runtime: Any, dirname: str, mode: int = 0, previous: str | None = None) -> dict[str, float]:
    """On trainer 0, after the servers saved their tables to ``dirname`` (``save_persistables`` mode ``mode``: 0
    every row, 2 every row as a base, 1 the rows pushed since the last mode 1/2 save, ``previous`` the chain's
    newest link): what they wrote, in figures a resume proves (runtime/restore_check.py), the one-stage layout, the
    sparse parts compressed (modes 1 and 2), then the manifest.  The seconds of each step, by name."""
    steps: dict[str, float] = {}
    began = time.monotonic()
    split = bool(runtime.is_heter_ps_mode)
    layout = dense_layout(runtime, split)
    # in the layout the servers wrote (a regrouping is among what a restore must be proven against), each sparse
    # table as loading the whole chain leaves it
    links = chain_links(previous) if mode == 1 and previous else []
    captured = restore_check.contents(dirname, layout, sparse_tables(dirname, layout), links)
    steps["contents_s"], began = time.monotonic() - began, time.monotonic()
    if split and servers_of(runtime) == 1:
        one_stage = dense_layout(runtime, False)
        tables = regroup(dirname, layout, one_stage)
        staging = tempfile.mkdtemp(prefix=".heterps-dense-", dir=dirname)
        try:
            _write_tables(staging, tables)
            for table in layout:
                shutil.rmtree(table_dir(dirname, table.table_id), ignore_errors=True)
            for table in one_stage:
                os.replace(table_dir(staging, table.table_id), table_dir(dirname, table.table_id))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        layout, split = one_stage, False
    steps["regroup_s"], began = time.monotonic() - began, time.monotonic()
    if mode in (1, 2):
        compress_sparse(dirname, sparse_tables(dirname, layout))
    steps["compress_s"], began = time.monotonic() - began, time.monotonic()
    table_shards.write_layout(dirname, seam.sparse_table_layout(runtime))  # listed in the manifest with the rest
    files = digests(dirname)
    steps["hash_s"], began = time.monotonic() - began, time.monotonic()
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "sparse_mode": mode,
        "layout": "split" if split else "one-stage",
        "servers": servers_of(runtime),
        "dense_tables": [t.to_dict() for t in layout],
        "contents": captured.to_dict(),
        "files": files,
    }
    write_manifest(dirname, manifest)
    steps["manifest_s"] = time.monotonic() - began
    logger.info(
        "checkpoint %s: dense tables in the %s layout (%d tables), %d files checksummed",
        dirname,
        manifest["layout"],
        len(layout),
        len(files),
    )
    return steps


def chain_links(newest: str) -> list[str]:
    """The directories an increment saved after checkpoint ``newest`` is loaded after: ``newest``'s chain, its base
    first, then ``newest``."""
    root = os.path.dirname(newest)
    return [os.path.join(root, name) for name, _ in chain_of(newest, read_manifest(newest))] + [newest]


def verify_restored(runtime: Any, checkpoint: str, scratch: str) -> str | None:
    """Stage 1's trainer 0, on a resume, before any batch trains: the servers save what they hold to ``scratch``
    (every row: a save that changes nothing on them), and its figures are compared with what ``checkpoint``
    captured (runtime/restore_check.py): a CheckpointError names the first difference.  What was compared, in a
    line; None for a checkpoint that recorded no contents (written by an earlier version)."""
    manifest = read_manifest(checkpoint)
    if "contents" not in manifest:
        return None
    expected = restore_check.Contents.from_dict(manifest["contents"], checkpoint)
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    try:
        seam.worker_client(runtime).save_all_model(scratch, 0)
        layout = dense_layout(runtime, bool(runtime.is_heter_ps_mode))
        actual = restore_check.contents(scratch, layout, sparse_tables(scratch, layout))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return restore_check.compare(expected, actual, checkpoint)


def prove_restored(checkpoint: str, say: Callable[[str], None], hear: Callable[[], str], scratch: str) -> None:
    """A stage 1 CPU trainer on a resume, before any batch trains: trainer 0 compares what the servers hold with
    what ``checkpoint`` captured (:func:`verify_restored`) and ``say``s its word ("proven", or why not) to the
    other trainers, which ``hear`` it; a restore not proven ends every trainer, naming why."""
    if seam.worker_count_and_index(seam.role_maker())[1] != 0:
        word = hear()
        if word != "proven":
            raise CheckpointError(f"{seam.identity()}: {word}")
        return
    try:
        proven = verify_restored(seam.fleet_runtime(), checkpoint, scratch)
    except CheckpointError as exc:
        say(f"refused by CPU trainer 0: {exc}")
        raise
    say("proven")
    if proven is None:
        logger.warning(
            "checkpoint %s records no contents (an earlier version's): its restore is not proven", checkpoint
        )
    else:
        logger.info("checkpoint %s: restore proven, the servers hold what it captured: %s", checkpoint, proven)


def _source_layout(runtime: Any, dirname: str) -> tuple[tuple[DenseTable, ...], int] | None:
    """The checkpoint's dense layout and server count (checked against the manifest's checksums, an incremental
    checkpoint's whole chain with it), or None when ``dirname`` holds no dense tables (a saved inference model, a
    sparse-only save)."""
    if os.path.isfile(os.path.join(dirname, MANIFEST)):
        manifest, links = verify_chain(dirname)
        try:
            layout = tuple(DenseTable.from_dict(t) for t in manifest["dense_tables"])
            servers = int(manifest["servers"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"checkpoint {dirname}: unreadable {MANIFEST} ({exc})") from None
        if len(links) > 1:
            _load_chain(runtime, links, layout)
        return layout, servers
    layout = dense_layout(runtime, False)  # a plain Paddle checkpoint: a one-stage job's layout
    if not all(os.path.isdir(table_dir(dirname, t.table_id)) for t in layout):
        return None
    return layout, servers_of(runtime)


def _load_chain(runtime: Any, links: list[str], dense: tuple[DenseTable, ...]) -> None:
    """An incremental checkpoint's sparse rows: its base, then each increment in order, the newest last (Paddle's
    load upserts row by row, so each row ends as the newest link that holds it left it; ``init_server`` loaded the
    newest link alone before this)."""
    for link in links:
        for table_id in sparse_tables(link, dense):
            table_shards.load_sparse(runtime, link, table_id, required=False)
    logger.info(
        "init_server(%s): sparse tables loaded from its chain, base first: %s",
        links[-1],
        " + ".join(os.path.basename(link) for link in links),
    )


def restore_tables(runtime: Any, dirname: str) -> None:
    """On a server whose tables are built, ``init_server(dirname)``: every sparse table, whole, in this job's shard
    count (runtime/table_shards.py), then the dense tables.  A directory that does not exist, or holds no saved
    table, is an error (Paddle's loader skips it silently, and the job would train from scratch while the user
    believes it resumed)."""
    if not os.path.isdir(dirname):
        raise CheckpointError(f"init_server({dirname}): no such directory; nothing to start the servers from")
    if not os.path.isfile(os.path.join(dirname, MANIFEST)) and not os.path.isdir(table_dir(dirname, 0)):
        raise CheckpointError(
            f"init_server({dirname}): no saved tables there (neither {MANIFEST} nor a 000/ table directory): "
            "give a fleet.save_persistables or fleet.save_inference_model directory"
        )
    for table_id in sorted(seam.sparse_table_layout(runtime)):
        table_shards.load_sparse(runtime, dirname, table_id)
    restore_dense(runtime, dirname)


def restore_dense(runtime: Any, dirname: str) -> None:
    """On a server, after its sparse tables were loaded from ``dirname``: the dense tables too (regrouped into this
    job's layout when the plan changed)."""
    found = _source_layout(runtime, dirname)
    if found is None:
        logger.info("init_server(%s): no dense tables there; dense parameters start from trainer 0's values", dirname)
        return
    source, saved_servers = found
    target = dense_layout(runtime, bool(runtime.is_heter_ps_mode))
    if source == target:
        load_from, staging = dirname, None
    else:
        if saved_servers != 1 or servers_of(runtime) != 1:
            raise CheckpointError(
                f"checkpoint {dirname} keeps the dense parameters in {len(source)} tables, this job in "
                f"{len(target)}; regrouping them needs one parameter server on both sides (saved with "
                f"{saved_servers}, resumed with {servers_of(runtime)}): resume with the plan it was saved with"
            )
        staging = tempfile.mkdtemp(prefix="heterps-resume-")
        _write_tables(staging, regroup(dirname, source, target))
        load_from = staging
    try:
        for table in target:
            seam.server_service(runtime).load_sparse(
                load_from, "0", table.table_id
            )  # any table's Load (dense ones too)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    mark_restored(runtime, dirname)
    logger.info(
        "init_server(%s): %d dense tables restored (%s)",
        dirname,
        len(target),
        "same layout" if staging is None else f"regrouped from {len(source)} tables",
    )


def mark_restored(runtime: Any, dirname: str) -> None:
    board = rendezvous.board()
    if board is not None:
        board.put(f"dense-restored.server{seam.role_id(runtime.role_maker)}", {"checkpoint": dirname})


def servers_restored() -> str | None:
    """The checkpoint this launch's servers restored the dense tables from, if they did.

    Paddle's trainer 0 pushes its initial dense values in ``init_worker`` (the servers' own initial values are
    random draws too, so the values alone cannot tell a resumed table from a fresh one); the servers say so on the
    launch's board instead (rendezvous.py).  Read when the trainer pushes: its client reaches the servers only once
    they serve, after ``init_server`` returned."""
    board = rendezvous.board()
    for value in (board.entries("dense-restored.") if board is not None else {}).values():
        return str(value["checkpoint"])
    return None
