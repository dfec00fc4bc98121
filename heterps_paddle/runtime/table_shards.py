"""How many shard files each sparse table is saved in (docs/checkpoints.md, "Shard files").

Paddle's MemorySparseTable saves one file per shard (``part-SSS-NNNNN``), and its local file system opens each one
through a shell of its own (``mkdir -p $(dirname ...)``): with Paddle's default of 1,000 shards a table, the shells
alone took 3 s of a checkpoint's pause here on a quiet machine.  A shard is also what a server's table threads work
on (24 a server: ``MemorySparseTable::_task_pool_size``), so 24 shards a server keep every one of those threads and
write 40x fewer files on one server.

The count is the table's layout: a server loads file i into shard i and refuses a directory holding another count,
and the clients route a key by it.  So every process of a job uses one count, and a job resumed uses the count its
checkpoint was written with.  In order: ``HETERPS_TABLE_SHARDS``; the checkpoint the launch resumes from (its files
counted); 24 a server.  It is set after ``minimize`` on every process (before the servers and clients build their
table protos), on every sparse table, unless the script's strategy sets a ``shard_num`` itself: then the layout is
the script's, and is left as it is.

Every loader loads a saved table whole, whatever count it was saved with (:func:`load_sparse`): a server's
``init_server(dirname)`` (a script's own start directory, PaddleRec's ``init_model_path``, ``heterps eval``'s model,
a launch's checkpoint) reads each sparse table's files, and when they were saved with another count than this job's
tables hold, re-cuts them into this job's count first (a key's shard is ``key % count``), in a temporary directory
beside the save; a table the save lacks, or a line that is not a row, is refused by name.  Paddle's own server would
load nothing from a directory of another count and say only a warning in its log (the job trained from an empty
table, and ended 0).  Beside every fleet save of a job, trainer 0 writes :data:`LAYOUT_FILE`: the count, the
tables' names, and how a plain Paddle job loads it (docs/checkpoints.md, "Shard files").

Imports no Paddle at import time: Paddle inside the functions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from typing import IO, Any, Optional, cast

from heterps_paddle import settings
from heterps_paddle.files import write_atomic
from heterps_paddle.log import logger
from heterps_paddle.runtime import seam, shard_lines
from heterps_paddle.runtime.checkpoint_files import CheckpointError

PER_SERVER = 24  # MemorySparseTable::_task_pool_size in Paddle 2.6.2: the threads a server's table works with
SHARD_FILE = re.compile(r"part-\d{3}-\d{5}(\.gz)?")  # a sparse table's shard file, as Paddle's servers name them
LAYOUT_FILE = "heterps_tables.json"  # beside a save: its sparse tables' shard count, and how to load it
PADDLE_DEFAULT = 1000  # a sparse table's shard_num when the strategy sets none (Paddle 2.6.2, CPU PS)
OPEN_OUTPUTS = 256  # shard files written at once when re-cutting a table (each pass reads the table again)


def shard_files(table: str) -> list[str]:
    """A saved sparse table directory's shard files, in the order Paddle's server loads them (by name)."""
    if not os.path.isdir(table):
        return []
    return sorted(os.path.join(table, f) for f in os.listdir(table) if SHARD_FILE.fullmatch(f))


def saved_count(directory: str) -> int | None:
    """The shard files each sparse table of a saved model holds (None: it holds no sparse table)."""
    counts: dict[int, list[str]] = {}
    for name in sorted(os.listdir(directory)):
        files = len(shard_files(os.path.join(directory, name)))
        if files:
            counts.setdefault(files, []).append(name)
    if len(counts) > 1:
        listed = "; ".join(f"{', '.join(tables)}: {files}" for files, tables in sorted(counts.items()))
        raise CheckpointError(
            f"{directory}: its sparse tables hold different counts of shard files ({listed}): not one job's save"
        )
    return next(iter(counts), None)


def choose(servers: int, resumed: str | None, env: Any = None) -> tuple[int, str]:
    """The shard count of this job's sparse tables, and why (module doc)."""
    told = cast(Optional[int], settings.get("HETERPS_TABLE_SHARDS", env))
    saved = saved_count(resumed) if resumed else None
    if told is not None:
        if saved is not None and saved != told:
            raise CheckpointError(
                f"HETERPS_TABLE_SHARDS={told}, but the checkpoint this launch resumes from ({resumed}) was written "
                f"with {saved} shard files a table, and Paddle's servers load only the count they were built with: "
                f"unset HETERPS_TABLE_SHARDS (or set it to {saved}) to resume from it"
            )
        return told, "HETERPS_TABLE_SHARDS"
    if saved is not None:
        return saved, f"the count the checkpoint resumed from ({resumed}) was written with"
    servers = max(1, servers)
    return PER_SERVER * servers, f"{PER_SERVER} a server, {servers} server{'s' * (servers != 1)}"


def script_sets_count(tables: Any, names: list[str]) -> list[str]:
    """The tables of ``names`` whose ``shard_num`` the script's strategy sets: then the script owns the layout."""
    return [t.table_name for t in tables if t.table_name in names and t.HasField("shard_num")]


def set_count(tables: Any, names: list[str], count: int) -> None:
    """In ``tables`` (a strategy's ``sparse_table_configs``, edited in place): ``shard_num`` = ``count`` on every
    table of ``names``."""
    for name in names:
        seam.sparse_table_config(tables, name).shard_num = count


def configure(resumed: str | None) -> None:
    """After ``minimize`` on every process of a launch keeping checkpoints (``resumed``: the checkpoint it resumes
    from): the sparse tables' shard count."""
    from heterps_paddle.runtime.checkpoint_deltas import sparse_table_names  # lazy: imports Paddle

    runtime = seam.fleet_runtime()
    names = sparse_table_names(runtime)
    strategies = seam.job_strategies(runtime)
    own = sorted({name for s in strategies for name in script_sets_count(s.sparse_table_configs, names)})
    if not names or own:
        if own:
            logger.info("sparse tables: the script sets shard_num (%s): its layout is kept as it is", own)
        return
    count, why = choose(len(seam.server_endpoints(seam.role_maker())), resumed)
    for strategy in strategies:
        set_count(strategy.sparse_table_configs, names, count)
    logger.info("sparse tables %s: %d shard files each (%s)", names, count, why)


def write_layout(directory: str, tables: dict[int, tuple[str, int]]) -> None:
    """Beside a fleet save (trainer 0, once the servers wrote it): :data:`LAYOUT_FILE`, naming each sparse table's
    directory, name and shard count, and how a plain Paddle job loads it.  ``tables``: table id -> (name, count),
    as this job's tables were built (:func:`heterps_paddle.runtime.seam.sparse_table_layout`)."""
    if not tables or not os.path.isdir(directory):
        return
    counts = sorted({count for _, count in tables.values()})
    document = {
        "format": 1,
        "shard_num": counts[0] if len(counts) == 1 else None,
        "tables": {f"{table_id:03d}": {"name": name, "shard_num": count} for table_id, (name, count) in tables.items()},
        "how_to_load": (
            "Paddle's parameter servers load a sparse table only into the shard_num it was saved with (another count "
            "loads nothing, with a warning in the server's log). A plain Paddle job sets it before "
            "fleet.distributed_optimizer, for each table here: entry = strategy.sparse_table_configs.add(); "
            "entry.table_name = NAME; entry.shard_num = SHARD_NUM. A job with strategy.heterps = True loads any "
            "count by itself."
        ),
    }
    write_atomic(os.path.join(directory, LAYOUT_FILE), json.dumps(document, indent=2) + "\n")


def row_key(line: bytes, path: str, number: int) -> int:
    head = line.split(b" ", 1)[0].strip()
    if not head.isdigit():
        raise CheckpointError(
            f"{path}:{number}: not a sparse table row (a row starts with its key, got {head[:40]!r}); the save is "
            "damaged or is not a sparse table's"
        )
    return int(head)


def recut(source: str, target: str, count: int, wanted: range | None = None) -> int:
    """The rows of the saved sparse table directory ``source`` re-cut into ``count`` shard files under ``target``,
    as a table of ``count`` shards saves them (row of key k in file ``k % count``); only the files of ``wanted``
    (a server's own shards) get rows, the others are written empty, since a server refuses a directory of another
    count.  Returns the rows written."""
    files = shard_files(source)
    os.makedirs(target, exist_ok=True)
    wanted = range(count) if wanted is None else wanted
    for index in range(count):
        if index not in wanted:
            open(os.path.join(target, f"part-000-{index:05d}"), "wb").close()
    rows = 0
    for start in range(wanted.start, wanted.stop, OPEN_OUTPUTS):
        group = range(start, min(start + OPEN_OUTPUTS, wanted.stop))
        outputs: dict[int, IO[bytes]] = {i: open(os.path.join(target, f"part-000-{i:05d}"), "wb") for i in group}
        try:
            for path in files:
                for number, line in enumerate(shard_lines.lines(path), 1):
                    if not line.strip():
                        continue
                    shard = row_key(line, path, number) % count
                    if shard in outputs:
                        outputs[shard].write(line)
                        rows += 1
        finally:
            for out in outputs.values():
                out.close()
    return rows


def load_sparse(runtime: Any, directory: str, table_id: int, required: bool = True) -> None:
    """On a server whose tables are built: load sparse table ``table_id`` from the save ``directory``, whole, in
    this job's shard count (module doc).  ``required``: a table the save lacks is an error (else nothing loads)."""
    name, count = seam.sparse_table_layout(runtime).get(table_id, (str(table_id), PADDLE_DEFAULT))
    table = os.path.join(directory, f"{table_id:03d}")
    saved = len(shard_files(table))
    if not saved:
        if not required:
            return
        raise CheckpointError(
            f"init_server({directory}) on {seam.identity()}: no shard files of sparse table {name} (table "
            f"{table_id:03d}/) there: the save holds another model, or only its dense parameters; nothing was loaded"
        )
    service = seam.server_service(runtime)
    if saved == count:
        service.load_sparse(directory, "0", table_id)
        return
    servers = max(1, len(seam.server_endpoints(runtime.role_maker)))
    per_server = -(-count // servers)
    index = seam.role_id(runtime.role_maker)
    mine = range(min(count, index * per_server), min(count, (index + 1) * per_server))
    # in the temporary directory (TMPDIR), never inside the save: other servers may be verifying it (a file its
    # manifest does not list refuses a checkpoint)
    staging = tempfile.mkdtemp(prefix="heterps-recut-")
    try:
        rows = recut(table, os.path.join(staging, f"{table_id:03d}"), count, mine)
        service.load_sparse(staging, "0", table_id)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info(
        "init_server(%s): sparse table %s saved in %d shard files, this job's holds %d: re-cut and loaded (%d rows "
        "for this server's shards %d-%d)",
        directory,
        name,
        saved,
        count,
        rows,
        mine.start,
        mine.stop - 1,
    )
