"""A data file named by its content, not its path: ``<base name>:<bytes>:s-<sha256 of sampled blocks>`` (the
format and its one parser: data_plan/names.py).  A checkpoint taken inside a pass names the files every trainer
trained already so, and a round on other hosts, which see the same files under other paths (another mount, a
copy), leaves them out too.  The base name stays in the name: two files of a pass with the same bytes (a shard
copied to train it twice) are two files.  A path that is not a local file (``hdfs://``, a file the script removed)
is named by its path.

The digest reads the file's size and at most :data:`~heterps_paddle.data_plan.names.SAMPLED_BLOCKS` blocks of
64 KiB (the first, the last, evenly spaced ones between), never the whole file: a file of 10 GB is named in
milliseconds, before its first batch.  Two files of one base name and size that differ only between the sampled
blocks would be named alike; part files of a data set differ in their first block.  A name is cached per process
by the file's real path, size and modification time.
"""

from __future__ import annotations

import hashlib
import os

from heterps_paddle.data_plan.names import SAMPLE_BLOCK, content_name, is_content_name, sample_offsets
from heterps_paddle.runtime.checkpoint_files import CheckpointError

_KNOWN: dict[tuple[str, int, int], str] = {}


def name_of(path: str) -> str:
    """The name a checkpoint gives the data file at ``path``: its identity when it is a local file, else the path."""
    return identity(path) if os.path.isfile(path) else path


def sampled_digest(path: str, size: int) -> str:
    """SHA-256 hex of the file's ``size`` and its sampled blocks (data_plan/names.py: sample_offsets)."""
    h = hashlib.sha256(size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        for offset in sample_offsets(size):
            f.seek(offset)
            h.update(f.read(SAMPLE_BLOCK))
    return h.hexdigest()


def identity(path: str) -> str:
    """``<base name>:<bytes>:s-<sha256 hex>`` of the file at ``path``; CheckpointError naming it when it cannot be
    read."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
        key = (real, st.st_size, st.st_mtime_ns)
        found = _KNOWN.get(key)
        if found is None:
            found = _KNOWN[key] = content_name(os.path.basename(real), st.st_size, sampled_digest(real, st.st_size))
        return found
    except OSError as exc:
        raise CheckpointError(f"data file {path}: cannot be read to name it by its content ({exc})") from None


def is_identity(name: str) -> bool:
    """Whether ``name`` names a file by content, sampled or (an earlier version's) of the whole file, not by path."""
    return is_content_name(name)


def done_here(path: str, done: frozenset[str]) -> bool:
    """Whether the file at ``path`` is one of ``done``: by path (a file that is not local), else by content, read
    only when ``done`` names any file by content (a name of an earlier version, of the whole file's digest, never
    matches: that file is trained again)."""
    if path in done:
        return True
    return any(is_identity(name) for name in done) and name_of(path) in done
