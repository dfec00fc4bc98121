"""A checkpoint directory's manifest and checksums (docs/checkpoints.md), without Paddle.

``heterps_checkpoint.json`` is written last into a checkpoint (runtime/checkpoint.py after the servers' save;
runtime/launch_checkpoints.py adds the launch's fields), both through :func:`write_manifest`: the dense layout and
a SHA-256 of every file.  This module writes, reads and checks it, so that ``heterps launch`` (which must not import
Paddle before the job starts) can choose the checkpoint a launch resumes from (runtime/checkpoint_choice.py) with
the same check the servers make.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from heterps_paddle.errors import HeterPSError
from heterps_paddle.files import write_atomic

MANIFEST = "heterps_checkpoint.json"
FORMAT = 1


class CheckpointError(HeterPSError, RuntimeError):
    """A checkpoint that cannot be resumed into this job: incomplete, corrupted, or another model."""


def file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def workers() -> int:
    """Threads that hash or compress a checkpoint's files at once: a table's shard files (a thousand a table) one
    after another made a checkpoint's fixed cost; hashlib and the gzip processes run outside the GIL."""
    return max(1, min(8, os.cpu_count() or 1))


def digests(root: str) -> dict[str, str]:
    """SHA-256 of every file under ``root`` but the manifest and hidden (staging) files, by relative path; the
    files hashed in parallel (:func:`workers`)."""
    paths = {}
    for base, _, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            rel = os.path.relpath(path, root)
            if rel == MANIFEST or rel.startswith("."):
                continue
            paths[rel] = path
    with ThreadPoolExecutor(workers()) as pool:
        hashed = dict(zip(paths, pool.map(file_digest, paths.values())))
    return dict(sorted(hashed.items()))


def dir_bytes(path: str) -> int:
    """The bytes of every file under ``path`` (a checkpoint's size)."""
    return sum(os.path.getsize(os.path.join(base, f)) for base, _, fs in os.walk(path) for f in fs)


def _every_file(root: str) -> list[str]:
    """Every file under ``root``, hidden ones included, by relative path."""
    return [os.path.relpath(os.path.join(base, name), root) for base, _, files in os.walk(root) for name in files]


def read_manifest(dirname: str) -> dict[str, Any]:
    """The manifest of ``dirname``; an error when it is missing (the save never finished) or unreadable."""
    path = os.path.join(dirname, MANIFEST)
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {dirname}: incomplete (no {MANIFEST}: a save that did not finish)")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
        if not isinstance(manifest, dict) or not isinstance(manifest["files"], dict):
            raise TypeError("not a manifest")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {dirname}: unreadable {MANIFEST} ({exc})") from None
    return manifest


def verify(dirname: str) -> dict[str, Any]:
    """The manifest of ``dirname`` once every file it lists is there with its checksum and no other file is (Paddle's
    servers read every file of a table's directory: a stray one, such as an uncompressed copy of a part left by
    someone inspecting the checkpoint, would be restored over the listed ones); else an error naming the first file
    that is not as listed."""
    manifest = read_manifest(dirname)
    stray = sorted(set(_every_file(dirname)) - set(manifest["files"]) - {MANIFEST})
    if stray:
        raise CheckpointError(
            f"checkpoint {dirname}: {stray[0]} is not in its manifest (a stray file: the servers would read it)"
            + (f", and {len(stray) - 1} more" if len(stray) > 1 else "")
        )
    actual = digests(dirname)
    for rel, digest in manifest["files"].items():
        if rel not in actual:
            raise CheckpointError(f"checkpoint {dirname}: {rel} is missing (the manifest lists it)")
        if actual[rel] != digest:
            raise CheckpointError(f"checkpoint {dirname}: {rel} does not match its checksum (corrupted)")
    return manifest


def write_manifest(dirname: str, manifest: dict[str, Any]) -> None:
    """The one writer of a checkpoint's manifest: ``manifest`` (its ``files`` sorted by path) as ``dirname``'s
    ``heterps_checkpoint.json``, written whole or not at all (a reader never sees half a manifest)."""
    manifest = {**manifest, "files": dict(sorted(manifest["files"].items()))}
    write_atomic(os.path.join(dirname, MANIFEST), json.dumps(manifest, indent=1) + "\n")


def add_to_manifest(dirname: str, files: list[str], fields: dict[str, Any]) -> None:
    """Checksum ``files`` (relative to ``dirname``, written after the manifest) into it and add ``fields``; the
    manifest is replaced atomically, so it stays the last thing written."""
    manifest = read_manifest(dirname)
    for rel in files:
        manifest["files"][rel] = file_digest(os.path.join(dirname, rel))
    manifest.update(fields)
    write_manifest(dirname, manifest)


# Checkpoints staged in memory (runtime/checkpoint_persist.staging_for): a directory of shared memory per trainer 0
# process, named by its pid and start time, so that one left by a process killed before it removed it (kill -9)
# is known for a dead one's and removed by the next launch on the machine (:func:`sweep_memory_staging`).
MEMORY_ROOT = "/dev/shm"
MEMORY_PREFIX = "heterps-staging-"


def memory_staging_dir(pid: int | None = None, root: str = MEMORY_ROOT) -> str:
    """This process's (``pid``'s) memory staging directory."""
    import psutil

    process = psutil.Process(pid)
    return os.path.join(root, f"{MEMORY_PREFIX}{process.pid}-{int(process.create_time())}")


def sweep_memory_staging(root: str = MEMORY_ROOT) -> list[str]:
    """The memory staging directories whose owner process is gone, removed (what they held was never a checkpoint:
    only a complete one, under --checkpoint-dir, is resumed from); their paths."""
    import shutil

    import psutil

    removed: list[str] = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(MEMORY_PREFIX):
            continue
        try:
            pid, started = (int(part) for part in name[len(MEMORY_PREFIX) :].split("-"))
            alive = int(psutil.Process(pid).create_time()) == started
        except (ValueError, psutil.Error):
            alive = False
        if not alive:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(os.path.join(root, name))
    return removed
