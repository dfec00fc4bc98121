"""The checkpoint a launch resumes from, chosen by ``heterps launch`` before the job starts (docs/checkpoints.md).

The launcher's half of the launch's checkpoints (runtime/launch_checkpoints.py is the half that runs in the job's
processes): the ``DIR/pass-NNNNNN`` directories listed, the newest whose manifest verifies chosen (every file's
SHA-256, runtime/checkpoint_files.py; an incremental checkpoint's whole chain, its base and earlier increments, with
it: :func:`verify_chain`), each one refused named with its reason, and the environment that gives every process of
the job the same choice (``HETERPS_CHECKPOINT_RESUME``).  Also :func:`ask_checkpoint`: a checkpoint asked for now,
which trainer 0 honours at the end of the running pass (runtime/launch_checkpoints.py).

Imported by ``heterps launch`` and the hosts job's coordinator before any Paddle is: it imports no Paddle, nor any
module that does.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, cast

from heterps_paddle import settings
from heterps_paddle.files import write_atomic
from heterps_paddle.runtime.checkpoint_files import MANIFEST, CheckpointError, file_digest, read_manifest, verify

NAME = re.compile(r"pass-(\d{6,})")
STAGING = re.compile(r"\.pass-(\d{6,})\.incomplete")  # a save in progress (runtime/launch_checkpoints.py)
SYNC_DIR = ".sync"  # DIR/.sync/<launch id>/: the trainers' barrier files, and the ask for a checkpoint
ASKED = "asked"


def checkpoint_name(passes: int) -> str:
    return f"pass-{passes:06d}"


def listed(root: str) -> list[tuple[int, str]]:
    """The checkpoint directories under ``root`` (complete or not), newest (most passes) first."""
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        match = NAME.fullmatch(name)
        if match and os.path.isdir(os.path.join(root, name)):
            found.append((int(match.group(1)), os.path.join(root, name)))
    return sorted(found, reverse=True)


@dataclass(frozen=True)
class Choice:
    """The checkpoint a launch resumes from (``path`` None: a fresh start) and those refused, newest first."""

    root: str
    path: str | None
    passes_done: int
    refused: tuple[tuple[str, str], ...] = ()  # (directory, why)

    def lines(self) -> list[str]:
        out = [f"checkpoint REFUSED: {why}" for _, why in self.refused]
        if self.path is not None:
            out.append(
                f"resuming from checkpoint {self.path} ({self.passes_done} passes done): the servers restore it at "
                f"init_server, every CPU trainer skips its first {self.passes_done} train_from_dataset passes"
            )
        elif self.refused:
            out.append(
                f"--checkpoint-dir {self.root}: NO USABLE CHECKPOINT ({len(self.refused)} refused): starting FRESH"
            )
        else:
            out.append(f"--checkpoint-dir {self.root}: no checkpoint there yet: starting fresh")
        return out


def passes_in(path: str, manifest: dict[str, Any], passes: int) -> int:
    """``passes`` (the number in the checkpoint's name) once its manifest says as many passes done; else an error."""
    launch = manifest.get("launch")
    done = launch.get("passes_done") if isinstance(launch, dict) else None
    if done != passes:
        raise CheckpointError(
            f"checkpoint {path}: its manifest says {done!r} passes done, its name {passes} (not a checkpoint "
            "heterps launch wrote, or renamed)"
        )
    return passes


def chain_of(path: str, manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """The links an incremental checkpoint loads before itself: (name, SHA-256 of its manifest), its base first;
    none for a full checkpoint (or one written before incremental checkpoints were)."""
    launch = manifest.get("launch")
    chain = launch.get("chain", []) if isinstance(launch, dict) else []
    try:
        links = [(str(link["name"]), str(link["manifest"])) for link in chain]
    except (TypeError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {path}: unreadable chain in its {MANIFEST} ({exc!r})") from None
    if any(not NAME.fullmatch(name) for name, _ in links):
        raise CheckpointError(f"checkpoint {path}: its chain names a link that is not a checkpoint ({links})")
    return links


def verify_chain(path: str) -> tuple[dict[str, Any], list[str]]:
    """``path``'s manifest once it and every link of its chain verify, and the directories to load, in order (the
    base first, ``path`` last; ``[path]`` for a full checkpoint).  A link that is missing, incomplete, not the one
    the checkpoint was saved on (its manifest's digest differs: replaced or changed), corrupted or with a stray
    file refuses the checkpoint, naming the link and why."""
    manifest = verify(path)
    root = os.path.dirname(path)
    order = []
    for number, (name, digest) in enumerate(chain_of(path, manifest)):
        role = "base" if number == 0 else "increment"
        link = os.path.join(root, name)
        where = f"checkpoint {path}: its {role} {link}"
        if not os.path.isdir(link):
            raise CheckpointError(f"{where} is missing (an incremental checkpoint loads its base and increments)")
        if not os.path.isfile(os.path.join(link, MANIFEST)):
            raise CheckpointError(f"{where} is incomplete (no {MANIFEST})")
        if file_digest(os.path.join(link, MANIFEST)) != digest:
            raise CheckpointError(f"{where} is not the one it was saved on (its {MANIFEST} differs: replaced?)")
        try:
            match = NAME.fullmatch(name)
            passes_in(link, verify(link), int(match.group(1)) if match else -1)
        except CheckpointError as exc:
            raise CheckpointError(f"{where} refused: {exc}") from None
        order.append(link)
    return manifest, [*order, path]


def choose(root: str) -> Choice:
    """The newest checkpoint under ``root`` whose manifest (and chain) verifies; the newer ones that do not, with
    why."""
    refused: list[tuple[str, str]] = []
    for passes, path in listed(root):
        try:
            return Choice(root, path, passes_in(path, verify_chain(path)[0], passes), tuple(refused))
        except CheckpointError as exc:
            refused.append((path, str(exc)))
    return Choice(root, None, 0, tuple(refused))


def base_interval(env: Any = None) -> int:
    """``HETERPS_CHECKPOINT_BASE_EVERY``: a full base every N checkpoints (N > 1), incremental ones between; 0 or 1
    (the default): every checkpoint full."""
    try:
        return int(cast(int, settings.get("HETERPS_CHECKPOINT_BASE_EVERY", env)))
    except settings.SettingError as exc:
        raise CheckpointError(str(exc)) from None


def prepare_launch(directory: str | None, every: str | None) -> tuple[dict[str, str], list[str]]:
    """For ``heterps launch``: the environment every process of the job gets, and the lines to print."""
    if not directory:
        raise CheckpointError("--checkpoint-every needs --checkpoint-dir DIR (where the checkpoints go)")
    every = every or str(settings.SETTINGS["HETERPS_CHECKPOINT_EVERY"].default)
    try:
        count, unit = settings.checkpoint_every(every)
    except ValueError as exc:
        raise CheckpointError(f"--checkpoint-every {every!r}: {exc}") from None
    base_every = base_interval()
    try:
        settings.get("HETERPS_CHECKPOINT_STAGING")  # refused here, before anything starts, rather than at a save
    except settings.SettingError as exc:
        raise CheckpointError(str(exc)) from None
    root = os.path.abspath(directory)
    os.makedirs(root, exist_ok=True)
    choice = choose(root)
    lines = choice.lines()
    lines.append(
        f"checkpoints to {root} after every {count:g} {'minutes' if unit == 'minutes' else 'passes'}"
        + (f", a full base every {base_every}, incremental between" if base_every > 1 else "")
    )
    env = {
        "HETERPS_CHECKPOINT_DIR": root,
        "HETERPS_CHECKPOINT_EVERY": every,
        "HETERPS_CHECKPOINT_BASE_EVERY": str(base_every),
        "HETERPS_CHECKPOINT_RESUME": choice.path or "none",
    }
    return env, lines


def sync_dir(root: str, launch: str) -> str:
    """``root/.sync/<launch id>/``: one launch's barrier files (runtime/launch_checkpoints.py) and its ask."""
    return os.path.join(root, SYNC_DIR, launch)


def ask_checkpoint(root: str, launch_id: str, reason: str) -> str:
    """Ask the running launch ``launch_id`` for a checkpoint now: ``root/.sync/<launch id>/asked`` (the reason, one
    line), written atomically.  Trainer 0 honours it at the end of the running training pass (a checkpoint even when
    --checkpoint-every does not make one due), then removes the file.  Returns its path."""
    directory = sync_dir(os.path.abspath(root), launch_id)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, ASKED)
    write_atomic(path, " ".join(reason.split()) + "\n")
    return path


def asked_reason(path: str) -> str | None:
    """The reason of an ask at ``path`` (:func:`ask_checkpoint`), None when there is none."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or "no reason given"
    except FileNotFoundError:
        return None


def chain_names(path: str) -> list[str]:
    """The names of the checkpoints ``path`` needs (itself and its chain's links); just its own when its manifest
    is unreadable (retention keeps what it can read)."""
    try:
        links = chain_of(path, read_manifest(path))
    except CheckpointError:
        links = []
    return [name for name, _ in links] + [os.path.basename(path)]
