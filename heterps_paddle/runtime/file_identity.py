"""A data file named by its content, not its path: ``<bytes>:<sha256>``.  A checkpoint taken inside a pass names the
files every trainer trained already by it, so that a round on other hosts, which see the same files under other
paths (another mount, a copy), leaves them out too.

Each file is read once per process and size and modification time (the digest is cached by its real path, size and
mtime): a checkpoint inside a pass hashes the files a trainer just trained, in the page cache then, and a resume the
files of the pass it goes on in.
"""

from __future__ import annotations

import hashlib
import os

from heterps_paddle.runtime.checkpoint_files import CheckpointError

_CHUNK = 1 << 20
_KNOWN: dict[tuple[str, int, int], str] = {}


def identity(path: str) -> str:
    """``<bytes>:<sha256 hex>`` of the file at ``path``; CheckpointError naming it when it cannot be read."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
        key = (real, st.st_size, st.st_mtime_ns)
        found = _KNOWN.get(key)
        if found is None:
            digest = hashlib.sha256()
            with open(real, "rb") as f:
                while chunk := f.read(_CHUNK):
                    digest.update(chunk)
            found = _KNOWN[key] = f"{st.st_size}:{digest.hexdigest()}"
        return found
    except OSError as exc:
        raise CheckpointError(f"data file {path}: cannot be read to name it by its content ({exc})") from None


def is_identity(name: str) -> bool:
    """Whether ``name`` is an identity (a checkpoint of an earlier version names files by path instead)."""
    size, _, digest = name.partition(":")
    return size.isdigit() and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)


def done_here(path: str, done: frozenset[str]) -> bool:
    """Whether the file at ``path`` is one of ``done``, by content, or by path for names an earlier version wrote."""
    return path in done or identity(path) in done
