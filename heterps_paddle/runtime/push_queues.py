"""Flush a process's PS client until its push queues are empty (Paddle 2.6.2's ``BrpcPsClient``).

Paddle's brpc client does not send a push when it is made.  A dense push (a section's dense ``send``, through
``FleetWrapper::PushDenseVarsAsync``) and a sparse push (``distributed_push_sparse``) go into a per-table queue, and
a consumer thread sends them: a dense queue only once it holds more than ``FLAGS_pserver_push_dense_merge_limit``
(12) tasks, a sparse queue more than one, unless a flush is running.  ``client_flush`` (``BrpcPsClient::Flush``)
marks the client as flushing, sleeps 100 ms and returns as soon as no request is in flight.  If the consumer thread
did not run within that window (a loaded machine: it sleeps 10 ms between rounds), the queued tasks are still queued
when the flush returns, and are sent only at the next flush.  A save that pulled the servers' tables next read them
without those pushes: seen as a heterogeneous trainer's flush that returned with tables 5 and 6 still holding a
dense push each (its own log), and as a saved model that predicted up to 0.04 away from the servers' (docs/sections.md).

Nothing in Python reads the queue sizes, but every flush logs them on the thread that called it (``PrintQueueSize``,
glog INFO, one line per table).  So :func:`flush_until_empty` reads those lines back from this process's stderr and
flushes again until every queue it reports is empty.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Iterator, cast

from heterps_paddle import settings
from heterps_paddle.log import logger
from heterps_paddle.runtime import seam

# glog's prefix ends with the thread id and the source position: "I1124 21:09:12.871330  7678 brpc_ps_client.cc:711] "
QUEUE_SIZE_LINE = re.compile(
    rb"^[IWEF]\d{4} [\d:.]+\s+(\d+) brpc_ps_client\.cc:\d+\] BrpcPsClient::PrintQueueSize: table (\d+) size: (\d+)\s*$",
    re.MULTILINE,
)

# One flush at a time per process: the stderr capture (a non-file stderr) swaps fd 2, which two threads must not
# do at once; and a side channel can be asked to flush by several CPU trainers together.
_one_flush = threading.Lock()
_warned_unreadable = False


def queue_sizes(log: bytes, thread_id: int) -> dict[int, int]:
    """Table id -> queue size, as the flush made on ``thread_id`` logged them (the last line per table wins)."""
    return {int(table): int(size) for tid, table, size in QUEUE_SIZE_LINE.findall(log) if int(tid) == thread_id}


def _flush_python_stderr() -> None:
    """Python's own buffered stderr lines out to fd 2 first (there is none when Python was started without one)."""
    if sys.stderr is not None:
        sys.stderr.flush()


@contextlib.contextmanager
def stderr_written() -> Iterator[Callable[[], bytes]]:
    """What this process writes to its stderr (fd 2) inside the block, every thread's, readable at its end.

    A regular file (the launcher's log, pytest's capture) is read back from where it ended, and nothing is moved.
    Anything else (a terminal, a pipe) is swapped for a temporary file for the block and what it caught is written
    to the real stderr afterwards, so no line is lost, only delayed by the block.  A process without a stderr
    (fd 2 closed) reads nothing: its flushes cannot be checked, which :func:`flush_until_empty` says."""
    _flush_python_stderr()
    try:
        mode = os.fstat(2).st_mode
    except OSError:
        yield lambda: b""
        return
    if stat.S_ISREG(mode):
        start = os.fstat(2).st_size

        def appended() -> bytes:
            _flush_python_stderr()
            with open("/proc/self/fd/2", "rb") as log:
                log.seek(start)
                return log.read()

        yield appended
        return
    caught = b""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lambda: caught
        finally:
            _flush_python_stderr()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            caught = sink.read()
            view = memoryview(caught)
            while view:
                view = view[os.write(2, view) :]


def flush_until_empty(client: Any, what: str, timeout_s: float | None = None) -> int:
    """``client.client_flush()`` until the flush reports every push queue of ``client`` empty; returns how many
    flushes it took.  ``what`` names the caller in messages.

    Gives up with a warning after ``timeout_s`` (HETERPS_FLUSH_TIMEOUT): queues that never read empty mean that
    some process still pushes (another trainer still training its pass), not that pushes were lost."""
    global _warned_unreadable
    limit = float(cast(float, settings.get("HETERPS_FLUSH_TIMEOUT"))) if timeout_s is None else timeout_s
    with _one_flush:
        deadline = time.monotonic() + limit
        thread_id = threading.get_native_id()
        attempt = 0
        while True:
            attempt += 1
            with stderr_written() as written:
                client.client_flush()
            sizes = queue_sizes(written(), thread_id)
            if not sizes:
                if not _warned_unreadable:
                    _warned_unreadable = True
                    logger.warning(
                        "%s: Paddle's PS client logged no queue sizes when flushed (glog INFO lines hidden, e.g. "
                        "GLOG_minloglevel > 0?), so its flushes cannot be checked: pushes still queued after a "
                        "flush may be missing from what is read next",
                        what,
                    )
                return attempt
            pending = {table: size for table, size in sorted(sizes.items()) if size}
            if not pending:
                if attempt > 1:
                    logger.info("%s: push queues empty after %d flushes", what, attempt)
                return attempt
            if time.monotonic() > deadline:
                logger.warning(
                    "%s: after %d flushes in %.0f s (HETERPS_FLUSH_TIMEOUT) Paddle's PS client still queues pushes "
                    "(table: tasks) %s: another process is still pushing, or this client's send thread is starved; "
                    "what is read next may miss them",
                    what,
                    attempt,
                    limit,
                    pending,
                )
                return attempt
            if attempt == 1:
                logger.info("%s: pushes still queued after a flush (table: tasks) %s; flushing again", what, pending)


def flush_pushes(runtime: Any, what: str) -> int:
    """Wait until this process's pushes to the servers have been sent and answered (its PS runtime's client)."""
    return flush_until_empty(seam.worker_client(runtime), what)
