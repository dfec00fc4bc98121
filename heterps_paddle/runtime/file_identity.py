"""A data file named by its content, not its path: ``<base name>:<bytes>:<sha256>``.  A checkpoint taken inside a
pass names the files every trainer trained already so, and a round on other hosts, which see the same files under
other paths (another mount, a copy), leaves them out too.  The base name stays in the name: two files of a pass with
the same bytes (a shard copied to train it twice) are two files.  A path that is not a local file (``hdfs://``, a
file the script removed) is named by its path, as before content names.

Each file is read once per process and size and modification time (the digest is cached by its real path, size and
mtime): a checkpoint inside a pass hashes the files a trainer just trained, in the page cache then, and a resume the
files of the pass it goes on in.
"""

from __future__ import annotations

import os

from heterps_paddle.runtime.checkpoint_files import CheckpointError, file_digest

_KNOWN: dict[tuple[str, int, int], str] = {}


def name_of(path: str) -> str:
    """The name a checkpoint gives the data file at ``path``: its identity when it is a local file, else the path."""
    return identity(path) if os.path.isfile(path) else path


def identity(path: str) -> str:
    """``<base name>:<bytes>:<sha256 hex>`` of the file at ``path``; CheckpointError naming it when it cannot be
    read."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
        key = (real, st.st_size, st.st_mtime_ns)
        found = _KNOWN.get(key)
        if found is None:
            found = _KNOWN[key] = f"{os.path.basename(real)}:{st.st_size}:{file_digest(real)}"
        return found
    except OSError as exc:
        raise CheckpointError(f"data file {path}: cannot be read to name it by its content ({exc})") from None


def is_identity(name: str) -> bool:
    """Whether ``name`` is an identity (a checkpoint of an earlier version names files by path instead)."""
    parts = name.rsplit(":", 2)
    if len(parts) != 3:
        return False
    _, size, digest = parts
    return size.isdigit() and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)


def done_here(path: str, done: frozenset[str]) -> bool:
    """Whether the file at ``path`` is one of ``done``: by path (an earlier version's names, a file that is not
    local), else by content, read only when ``done`` names any file by content."""
    if path in done:
        return True
    return any(is_identity(name) for name in done) and name_of(path) in done
