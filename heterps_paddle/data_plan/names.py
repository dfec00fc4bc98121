"""A data file's content name, ``<base name>:<bytes>:<digest>``: its one format and its one parser.

runtime/file_identity.py names a local file so; the data plan reads a shard's bytes from it; a checkpoint taken
inside a pass records the shards done by it.  The digest is one of:

- ``s-<sha256 hex>``: of the file's size and sampled blocks (its first and last 64 KiB and evenly spaced 64 KiB
  blocks between: :data:`SAMPLED_BLOCKS` in all; the whole file when it is no larger), so that a file of 10 GB is
  named in milliseconds, without reading it whole;
- ``<sha256 hex>``: of the whole file, as an earlier version named files.  Still read (a checkpoint naming files so
  resumes): such a name never equals a sampled one, so the files it names are trained again, once.

A shard may be a byte range of a large file: ``<content name>@<start>-<end>``, the lines that begin in
``[start, end)`` (a line begins at 0 or after a newline; the runtime's range reader finds them), of ``end - start``
bytes.  A name that is none of these (a path: a file that is not local, ``hdfs://...``) is a shard of unknown
bytes, 1.
"""

from __future__ import annotations

import re
from typing import NamedTuple

SAMPLED_PREFIX = "s-"  # the digest of sampled blocks, as opposed to an earlier version's digest of the whole file
SAMPLE_BLOCK = 64 << 10  # bytes of a sampled block
SAMPLED_BLOCKS = 16  # blocks a sampled digest reads: the first, the last and evenly spaced ones between
# the size and digest never hold ':'; the base name may (the name is split from the right)
_NAME = re.compile(r"(.*):([0-9]+):((?:s-)?[0-9a-f]{64})(?:@([0-9]+)-([0-9]+))?", re.DOTALL)
RANGE_BYTES = 256 << 20  # a file larger than this is cut into ranges of it, where the trainers read ranges
_SHA256 = re.compile(r"[0-9a-f]{64}")


class ContentName(NamedTuple):
    """A parsed content name: the file's base name, its bytes, the digest (with its prefix, as written), and the
    byte range ``[start, end)`` of the file when it names a range of it (None: the whole file)."""

    base: str
    size: int
    digest: str
    start: int | None = None
    end: int | None = None

    @property
    def sampled(self) -> bool:
        return self.digest.startswith(SAMPLED_PREFIX)

    @property
    def file(self) -> str:
        """The whole file's name."""
        return f"{self.base}:{self.size}:{self.digest}"

    @property
    def shard_bytes(self) -> int:
        """The shard's bytes: the range's, else the file's."""
        return self.size if self.start is None or self.end is None else self.end - self.start

    def __str__(self) -> str:
        return self.file if self.start is None else f"{self.file}@{self.start}-{self.end}"


def parse(name: str) -> ContentName | None:
    """``name`` as a content name (of a file or of a byte range of it), or None when it is not one (a path, or a
    range outside its file)."""
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    if match[4] is None:
        return ContentName(match[1], int(match[2]), match[3])
    size, start, end = int(match[2]), int(match[4]), int(match[5])
    return ContentName(match[1], size, match[3], start, end) if start < end <= size else None


def ranges(name: str, range_bytes: int = RANGE_BYTES) -> list[str]:
    """The shards of the file ``name``: itself when it is at most ``range_bytes`` (or no content name, or a range
    already), else its ranges of ``range_bytes`` (the last one shorter), in order."""
    parsed = parse(name)
    if parsed is None or parsed.start is not None or parsed.size <= range_bytes:
        return [name]
    return [f"{name}@{s}-{min(s + range_bytes, parsed.size)}" for s in range(0, parsed.size, range_bytes)]


def content_name(base: str, size: int, sampled_sha256: str) -> str:
    """The content name of a file of base name ``base`` and ``size`` bytes, its sampled blocks' digest
    ``sampled_sha256`` (64 hex digits)."""
    if not _SHA256.fullmatch(sampled_sha256):
        raise ValueError(f"not a SHA-256 hex digest: {sampled_sha256!r}")
    return str(ContentName(base, size, SAMPLED_PREFIX + sampled_sha256))


def is_content_name(name: str) -> bool:
    """Whether ``name`` names a file by content (sampled or whole-file digest), not by path."""
    return parse(name) is not None


def size_of(name: str) -> int:
    """A shard's bytes, from its content name; 1 for a name by path (a file that is not local: all such shards
    count alike)."""
    parsed = parse(name)
    return 1 if parsed is None else parsed.shard_bytes


def sample_offsets(size: int) -> list[int]:
    """Where a sampled digest reads its blocks in a file of ``size`` bytes: every block of a file of at most
    :data:`SAMPLED_BLOCKS` blocks, else the first, the last and evenly spaced ones between (each block
    :data:`SAMPLE_BLOCK` bytes, the last one ending at the file's end)."""
    if size <= SAMPLE_BLOCK * SAMPLED_BLOCKS:
        return list(range(0, size, SAMPLE_BLOCK))
    last = size - SAMPLE_BLOCK
    return [last * k // (SAMPLED_BLOCKS - 1) for k in range(SAMPLED_BLOCKS)]
