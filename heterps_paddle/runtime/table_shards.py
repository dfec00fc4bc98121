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

Imports no Paddle at import time: Paddle inside the functions.
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional, cast

from heterps_paddle import settings
from heterps_paddle.log import logger
from heterps_paddle.runtime import seam
from heterps_paddle.runtime.checkpoint_files import CheckpointError

PER_SERVER = 24  # MemorySparseTable::_task_pool_size in Paddle 2.6.2: the threads a server's table works with
SHARD_FILE = re.compile(r"part-\d{3}-\d{5}(\.gz)?")  # a sparse table's shard file, as Paddle's servers name them

_count: int | None = None  # this process's choice, once minimize made it


def saved_count(directory: str) -> int | None:
    """The shard files each sparse table of a saved model holds (None: it holds no sparse table)."""
    counts: dict[int, list[str]] = {}
    for name in sorted(os.listdir(directory)):
        table = os.path.join(directory, name)
        if not os.path.isdir(table):
            continue
        files = sum(1 for f in os.listdir(table) if SHARD_FILE.fullmatch(f))
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
    global _count
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
    _count = count
    logger.info("sparse tables %s: %d shard files each (%s)", names, count, why)


def check_start_dir(dirname: str) -> None:
    """A server's ``init_server(dirname)`` from the script's own saved model: refused, naming both counts, when
    its tables hold another count of shard files than this job's (Paddle's server would load nothing and say only
    a warning)."""
    if _count is None or not os.path.isdir(dirname):
        return
    saved = saved_count(dirname)
    if saved is not None and saved != _count:
        raise CheckpointError(
            f"init_server({dirname}) on {seam.identity()}: its sparse tables were saved in {saved} shard files each, "
            f"this job's hold {_count} (docs/checkpoints.md, 'Shard files'); set HETERPS_TABLE_SHARDS={saved} on "
            "every host to start from it"
        )
