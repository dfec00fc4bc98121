"""Byte ranges of a large data file trained through Paddle's own dataset (docs/data-plan.md, "Ranges").

The data plan cuts a file over its range size into shards ``<content name>@<start>-<end>``: the lines that begin
in ``[start, end)`` (a line begins at 0 or after a newline), so that a pass of a few files of tens of GB balances
like one of many files.  Paddle's readers take file paths and read each whole (``fopen``, or ``cat PATH |
pipe_command``), so a range is handed to them as a named pipe of this process's, which a thread fills with the
range's lines when Paddle's reader opens it: no copy on disk, the file read once (plus once more, from the page
cache, to count the range's lines for the pass's figures before the call).

Files a range cannot be cut from (compressed: their bytes are not lines) are offered whole
(:func:`cuttable`).  Pure Python, no Paddle.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import BinaryIO

logger = logging.getLogger(__name__)

CHUNK = 1 << 20
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz4", ".snappy", ".zip")
OPEN_POLL_S = 0.02  # how often a feed looks for its reader before Paddle opens the pipe


def cuttable(path: str) -> bool:
    """Whether byte ranges of ``path`` are lines: a local regular file, not compressed."""
    return os.path.isfile(path) and not path.lower().endswith(COMPRESSED)


@dataclass(frozen=True)
class Span:
    """The lines of a range as bytes of its file: ``[first, stop)``, ``lines`` of them."""

    first: int
    stop: int
    lines: int


def _next_line_start(f: BinaryIO, at: int, size: int) -> int:
    """The first line start at or after ``at``: ``at`` itself at 0 or after a newline, else past the next one."""
    if at <= 0:
        return 0
    if at >= size:
        return size
    f.seek(at - 1)
    pos = at - 1
    while True:
        chunk = f.read(CHUNK)
        if not chunk:
            return size
        found = chunk.find(b"\n")
        if found >= 0:
            return pos + found + 1
        pos += len(chunk)


def span(path: str, start: int, end: int) -> Span:
    """The lines of ``path`` that begin in ``[start, end)``, and how many (a last line without a newline counts)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        first = _next_line_start(f, start, size)
        stop = _next_line_start(f, end, size)
        lines, pos, last = 0, first, b"\n"
        f.seek(first)
        while pos < stop:
            chunk = f.read(min(CHUNK, stop - pos))
            if not chunk:
                break
            lines += chunk.count(b"\n")
            pos += len(chunk)
            last = chunk[-1:]
        if stop > first and last != b"\n":
            lines += 1
    return Span(first, stop, lines)


class RangeFeeds:
    """Named pipes, each filled with one range's lines once its reader opens it, for the length of one call:
    :meth:`feed` makes one; leaving the context stops every feed whose reader never came and removes the pipes."""

    def __init__(self) -> None:
        self.directory = ""  # made with the first pipe: a call of whole files makes none
        self.threads: list[threading.Thread] = []
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.lines: dict[str, int] = {}  # each pipe's range's lines

    def __enter__(self) -> RangeFeeds:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def feed(self, path: str, found: Span, label: str) -> str:
        """A pipe whose reader reads ``found``'s bytes of ``path``; ``label`` names it (the shard's name)."""
        if not self.directory:
            self.directory = tempfile.mkdtemp(prefix="heterps-ranges-")
        fifo = os.path.join(self.directory, f"range-{len(self.threads):05d}")
        os.mkfifo(fifo, 0o600)
        self.lines[fifo] = found.lines
        thread = threading.Thread(
            target=self._fill, args=(fifo, path, found, label), name="heterps-range-feed", daemon=True
        )
        thread.start()
        self.threads.append(thread)
        return fifo

    def _fill(self, fifo: str, path: str, found: Span, label: str) -> None:
        fd = None
        while fd is None and not self.stop.is_set():
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until a reader has it open
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    self.errors.append(f"{label}: {exc}")
                    return
                time.sleep(OPEN_POLL_S)
        if fd is None:
            self.errors.append(f"{label}: its reader never opened it")
            return
        os.set_blocking(fd, True)
        try:
            with open(path, "rb") as source:
                source.seek(found.first)
                left = found.stop - found.first
                while left > 0:
                    chunk = source.read(min(CHUNK, left))
                    if not chunk:
                        break
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
                    left -= len(chunk)
        except BrokenPipeError:
            self.errors.append(f"{label}: its reader closed the pipe before the range's end")
        except OSError as exc:
            self.errors.append(f"{label}: {exc}")
        finally:
            os.close(fd)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(5.0)
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
