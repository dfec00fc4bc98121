"""The checkpoint a launch resumes from, chosen by ``heterps launch`` before the job starts (docs/checkpoints.md).

The launcher's half of the launch's checkpoints (runtime/launch_checkpoints.py is the half that runs in the job's
processes): the ``DIR/pass-NNNNNN`` directories listed, the newest whose manifest verifies chosen (every file's
SHA-256, runtime/checkpoint_files.py), each one refused named with its reason, and the environment that gives every
process of the job the same choice (``HETERPS_CHECKPOINT_RESUME``).

Imported by ``heterps launch`` and the hosts job's coordinator before any Paddle is: it imports no Paddle, nor any
module that does.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from heterps_paddle import settings
from heterps_paddle.runtime.checkpoint_files import CheckpointError, verify

NAME = re.compile(r"pass-(\d{6,})")


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


def choose(root: str) -> Choice:
    """The newest checkpoint under ``root`` whose manifest verifies; the newer ones that do not, with why."""
    refused: list[tuple[str, str]] = []
    for passes, path in listed(root):
        try:
            return Choice(root, path, passes_in(path, verify(path), passes), tuple(refused))
        except CheckpointError as exc:
            refused.append((path, str(exc)))
    return Choice(root, None, 0, tuple(refused))


def prepare_launch(directory: str | None, every: str | None) -> tuple[dict[str, str], list[str]]:
    """For ``heterps launch``: the environment every process of the job gets, and the lines to print."""
    if not directory:
        raise CheckpointError("--checkpoint-every needs --checkpoint-dir DIR (where the checkpoints go)")
    every = every or str(settings.SETTINGS["HETERPS_CHECKPOINT_EVERY"].default)
    try:
        count, unit = settings.checkpoint_every(every)
    except ValueError as exc:
        raise CheckpointError(f"--checkpoint-every {every!r}: {exc}") from None
    root = os.path.abspath(directory)
    os.makedirs(root, exist_ok=True)
    choice = choose(root)
    lines = choice.lines()
    lines.append(f"checkpoints to {root} after every {count:g} {'minutes' if unit == 'minutes' else 'passes'}")
    env = {
        "HETERPS_CHECKPOINT_DIR": root,
        "HETERPS_CHECKPOINT_EVERY": every,
        "HETERPS_CHECKPOINT_RESUME": choice.path or "none",
    }
    return env, lines
