"""Fix 5 of the heterogeneous pipeline (docs/sections.md): a section's dense parameters back from the servers.

In Paddle 2.6.2 a heterogeneous section pushes its dense gradients with ``send`` ops that bypass the
Communicator, whose recv thread therefore never pulls them back.  In ``pull`` mode (the default,
HETERPS_DENSE_REFRESH) a thread pulls the section's dense tables every HETERPS_DENSE_PULL_MS while its
``train_from_dataset`` runs, like plain async PS's pull-dense worker.
"""

from __future__ import annotations

import threading
from typing import Any, cast

import paddle
from paddle.distributed.ps.utils.public import get_the_one_recv_context

from heterps_paddle import settings
from heterps_paddle.log import logger
from heterps_paddle.runtime import seam


def dense_tables(runtime: Any) -> dict[int, list[str]]:
    """Table id -> dense var names, as the PS runtime splits them (per section in a heterogeneous job)."""
    tables: dict[int, list[str]] = get_the_one_recv_context(runtime.context, split_dense_table=runtime.is_heter_ps_mode)
    return tables


def pull_dense_into(scope: Any, runtime: Any) -> list[str]:
    """Copy every dense table from the servers into ``scope`` (its vars must exist there)."""
    names = []
    for table_id, var_names in dense_tables(runtime).items():
        seam.worker_client(runtime).pull_dense_params(scope, table_id, var_names)
        names.extend(var_names)
    return names


class DenseRefresher:
    """Pull this section's dense tables from the servers into the global scope, every ``interval_s``."""

    def __init__(self, runtime: Any, program: Any, interval_s: float | None = None):
        self.runtime = runtime
        self.scope = paddle.static.global_scope()
        used = {n for blk in program.blocks for n in blk.vars}
        self.tables = {
            tid: names
            for tid, names in dense_tables(runtime).items()
            if names and all(n in used and self.scope.find_var(n) is not None for n in names)
        }
        ms = float(cast(float, settings.get("HETERPS_DENSE_PULL_MS")))  # settings.get is typed object
        self.interval_s = ms / 1000.0 if interval_s is None else interval_s
        self.pulls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="heterps-dense-refresh", daemon=True)

    def start(self) -> DenseRefresher:
        if self.tables:
            self._thread.start()
        return self

    def pull_once(self) -> None:
        for table_id, names in self.tables.items():
            seam.worker_client(self.runtime).pull_dense_params(self.scope, table_id, names)
        self.pulls += 1
        if self.pulls == 1:
            logger.info("dense refresh every %.0f ms for tables %s", self.interval_s * 1000, self.tables)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.pull_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self.tables:
            logger.info("dense refresh: %d pulls of tables %s", self.pulls, sorted(self.tables))
