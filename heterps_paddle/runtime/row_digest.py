"""Every row of a saved sparse table in one digest that does not depend on its layout, and every row checked to sit
in the shard file its key maps to (runtime/restore_check.py proves a resume with it; issue 63).

A table of 10^8 rows is tens of GB of Paddle's text: parsing it a row at a time in Python (about 1.4 M rows/s here)
would take longer than the restore it proves.  So the rows are read in blocks of whole lines and hashed with numpy,
a line at a time but with no Python loop over lines:

- a row's hash: a polynomial over its line's bytes (the key, the values, the optimizer's columns) in 64-bit
  arithmetic with an odd base, so that a line differing from another in any one byte hashes differently; then mixed
  (splitmix64's finaliser) so that sums of hashes spread;
- a table's digest: two sums of its rows' mixed hashes (two finalisers), mod 2^64, each key's newest row once: a sum
  does not depend on the order the rows come in, so a table cut into 24 shards or 1,000, saved whole or as an
  incremental chain, gives one digest;
- a row's place: a table of ``count`` shard files holds key k in file ``k % count`` (Paddle's MemorySparseTable
  names them ``part-<server>-<shard>``, the shard over all servers); a row in another file is an error naming it.

Pure numpy and file reading: imports no Paddle.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from heterps_paddle.runtime import shard_lines
from heterps_paddle.runtime.checkpoint_files import CheckpointError

_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd: a power of it is odd, so one byte's change moves the line's hash
_SECOND = np.uint64(0xD6E8FEB86659FD93)  # the second sum's mixing constant
THREADS = 8  # at most, hashing a table's shards (each thread holds a block's arrays, about 100 MB)
_KEY_DIGITS = 20  # a uint64 key has at most 20 decimal digits
_LARGEST_KEY = str(2**64 - 1).encode()
Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class TableRows:
    """A saved sparse table in figures: its distinct keys, and the digest of each key's newest row."""

    rows: int
    digest: str  # 32 hex digits: the two sums


def _mix(x: Array) -> Array:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    mixed: Array = x ^ (x >> np.uint64(31))
    return mixed


class _Scratch(threading.local):
    """A thread's _BASE ** i and its inverse's (mod 2^64: the base is odd) for i up to a block's bytes, and a block's
    work array: made once and reused, since this machine spends more making a new array of a block's size than
    computing in it."""

    def __init__(self) -> None:
        self.up = self.down = self.work = np.ones(1, dtype=np.uint64)

    def upto(self, size: int) -> tuple[Array, Array, Array]:
        if size > self.up.size:
            # a block is shard_lines.BLOCK_BYTES and the part line before it (its arrays about 24 times its
            # bytes): room for a quarter more, so that one a little over the last one's size reuses the tables
            block = shard_lines.BLOCK_BYTES
            grown = max(size + size // 4, block + block // 4)
            for name, base in (("up", int(_BASE)), ("down", pow(int(_BASE), -1, 2**64))):
                steps = np.full(grown, base, dtype=np.uint64)
                steps[0] = 1
                setattr(self, name, np.cumprod(steps, dtype=np.uint64))
            self.work = np.empty(grown, dtype=np.uint64)
        return self.up[:size], self.down, self.work[:size]


_SCRATCH = _Scratch()


def _not_a_row(path: str, number: int, line: bytes, why: str) -> CheckpointError:
    return CheckpointError(
        f"{path}:{number}: not a sparse table row ({why}, got {line[:40]!r}); the save is damaged or is not a sparse "
        "table's"
    )


def _block_rows(data: bytes, path: str, first_line: int) -> tuple[Array, Array]:
    """(keys, line hashes) of a block of whole lines; blank lines skipped, any other line that does not start with
    its key followed by a space or the line's end is an error naming it."""
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts
    # the key: the run of digits a line starts with (at most 20 of them: more cannot be a uint64); a run ends at
    # its line's newline at the latest, so only the block's last line can reach past the block
    keys = np.zeros(ends.size, dtype=np.uint64)
    digits = np.zeros(ends.size, dtype=np.int64)
    running = np.ones(ends.size, dtype=bool)
    last = buf.size - 1
    for d in range(_KEY_DIGITS + 1):
        value = buf[np.minimum(starts + d, last)] - np.uint8(48)  # a digit's value; any other byte wraps over 9
        running &= value <= 9
        if not running.any():
            break
        keys = np.where(running, keys * np.uint64(10) + value.astype(np.uint64), keys)
        digits += running
    after = buf[np.minimum(starts + digits, last)]
    rows = (digits > 0) & (digits <= _KEY_DIGITS) & ((digits == lengths) | (after == 32))
    for i in np.flatnonzero(~rows | (digits == _KEY_DIGITS)):
        line = data[starts[i] : ends[i]]
        if not rows[i]:
            if line.strip():
                raise _not_a_row(path, first_line + int(i), line, "a row starts with its key and a space")
        elif len(line.split(b" ", 1)[0]) == _KEY_DIGITS and line[:_KEY_DIGITS] > _LARGEST_KEY:
            raise _not_a_row(path, first_line + int(i), line, "its key is over 2^64 - 1")
    # each line's hash: the sum of (byte + 1) * BASE^(its offset in the line), its newline included; summed with
    # the byte's offset in the block, then brought back by BASE^-(the line's start): no array of offsets is made
    up, down, terms = _SCRATCH.upto(buf.size)
    np.add(buf, 1, out=terms, dtype=np.uint64)  # in uint64: numpy 1's value-based casting would wrap 255 + 1
    np.multiply(terms, up, out=terms)
    hashes = np.add.reduceat(terms, starts) * down[starts]
    return keys[rows], hashes[rows]


def shard_index(path: str) -> int:
    """The shard a file ``part-SSS-NNNNN[.gz]`` holds: NNNNN, over all the table's servers."""
    return int(os.path.basename(path).split(".", 1)[0].rsplit("-", 1)[1])


def file_rows(path: str, count: int) -> tuple[Array, Array]:
    """(keys, line hashes) of a shard file of a table of ``count`` shards, in file order; a row whose key is not
    the file's shard (``key % count``) is an error naming the file, the line and the shard the key belongs to."""
    index = shard_index(path)
    keys, hashes, line = [], [], 1
    for block in shard_lines.line_blocks(path):
        found, hashed = _block_rows(block, path, line)
        stray = np.flatnonzero(found % np.uint64(count) != np.uint64(index))
        if stray.size:
            key = int(found[stray[0]])
            raise CheckpointError(
                f"{path}: the row of key {key} sits in shard {index}, its key's shard of {count} is {key % count}: "
                "the save is damaged or was cut wrong"
            )
        keys.append(found)
        hashes.append(hashed)
        line += block.count(b"\n")
    if not keys:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint64)
    return np.concatenate(keys), np.concatenate(hashes)


def table_rows(links: Sequence[Sequence[str]]) -> TableRows:
    """The table that loading ``links`` in order leaves (each link a save's shard files of the table: an
    incremental chain, its base first; one link for a full save): each key's newest row counts once."""
    counts = {len(files) for files in links if files}
    for files in links:
        for path in files:
            if shard_index(path) >= len(files):
                raise CheckpointError(f"{path}: shard {shard_index(path)} of a table saved in {len(files)} files")
    # Rows of a key are in the same shard of every link when the links have one count: compare shard by shard
    by_shard: dict[int, list[str]] = {}
    for files in links:
        for path in files:
            by_shard.setdefault(shard_index(path) if len(counts) == 1 else 0, []).append(path)
    count_of = {path: len(files) for files in links for path in files}

    def shard(paths: list[str]) -> tuple[int, int, int]:
        read = [file_rows(path, count_of[path]) for path in paths]
        keys = np.concatenate([k for k, _ in read])
        hashes = np.concatenate([h for _, h in read])
        order = np.argsort(keys, kind="stable")  # a key's rows in link order: its newest one last
        newest = np.ones(order.size, dtype=bool)
        newest[:-1] = keys[order[1:]] != keys[order[:-1]]
        chosen = hashes[order[newest]]
        first = int(np.add.reduce(_mix(chosen), dtype=np.uint64))
        return int(chosen.size), first, int(np.add.reduce(_mix(chosen ^ _SECOND), dtype=np.uint64))

    # numpy lets go of the interpreter in a block's arithmetic: shards hashed in threads run on the host's cores
    with ThreadPoolExecutor(max(1, min(os.cpu_count() or 1, THREADS, len(by_shard)))) as pool:
        figures = list(pool.map(shard, by_shard.values()))
    first = sum(f[1] for f in figures) % 2**64
    second = sum(f[2] for f in figures) % 2**64
    return TableRows(sum(f[0] for f in figures), f"{first:016x}{second:016x}")
