"""The checkpoint a launch resumes from, chosen by ``heterps launch`` before the job starts (docs/checkpoints.md).

The launcher's half of the launch's checkpoints (runtime/launch_checkpoints.py is the half that runs in the job's
processes): the ``DIR/pass-NNNNNN`` directories listed, the newest whose manifest verifies chosen (every file's
SHA-256, runtime/checkpoint_files.py; an incremental checkpoint's whole chain, its base and earlier increments, with
it: :func:`verify_chain`), each one refused named with its reason, and the environment that gives every process of
the job the same choice (``HETERPS_CHECKPOINT_RESUME``).  Also :func:`ask_checkpoint`: a checkpoint asked for now,
which the trainers honour between two shards of a pass, or at its end (runtime/launch_checkpoints.py).

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

NAME = re.compile(r"pass-(\d{6,})(?:\.(\d+)of(\d+))?")
STAGING = re.compile(r"\.pass-(\d{6,})(?:\.\d+of\d+)?\.incomplete")  # a save in progress (launch_checkpoints.py)
SYNC_DIR = ".sync"  # DIR/.sync/<launch id>/: the trainers' barrier files, and the ask for a checkpoint
ASKED = "asked"


@dataclass(frozen=True, order=True)
class Progress:
    """How much training a checkpoint holds: ``passes`` whole passes of train_from_dataset and, of the next pass
    of ``slices`` shards (its data plan's, docs/data-plan.md), ``slice`` done (0: a pass's end; the names are the
    manifests' since issue 44's slices, kept so that its checkpoints still read).  Its name
    is ``pass-NNNNNN``, or ``pass-NNNNNN.KofS`` inside a pass; ordered as the training it holds."""

    passes: int
    slice: int = 0
    slices: int = 1

    @property
    def done(self) -> float:
        """Passes done, a fraction inside a pass (the launch's machine compares checkpoints by it); a whole pass's
        count is an int (2, not 2.0, in restarts.json and the event log)."""
        return self.passes + self.slice / self.slices if self.slice else self.passes

    @property
    def name(self) -> str:
        return f"pass-{self.passes:06d}" + (f".{self.slice}of{self.slices}" if self.slice else "")

    @property
    def where(self) -> str:
        """Where training stood: ``after pass N``, or ``after K of S shards of pass N+1``."""
        if not self.slice:
            return f"after pass {self.passes}"
        return f"after {self.slice} of {self.slices} shards of pass {self.passes + 1}"

    def __str__(self) -> str:
        if not self.slice:
            return f"{self.passes} passes done"
        return f"{self.passes} passes and {self.slice} of {self.slices} shards of pass {self.passes + 1} done"

    @staticmethod
    def of(match: re.Match[str]) -> Progress | None:
        """The progress a :data:`NAME` match names (None: a shard count out of its pass)."""
        passes = int(match.group(1))
        if match.group(2) is None:
            return Progress(passes)
        at = Progress(passes, int(match.group(2)), int(match.group(3)))
        return at if 0 < at.slice < at.slices else None

    @staticmethod
    def named(name: str) -> Progress | None:
        match = NAME.fullmatch(name)
        return Progress.of(match) if match else None


def listed(root: str) -> list[tuple[Progress, str]]:
    """The checkpoint directories under ``root`` (complete or not), newest (most training) first."""
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        at = Progress.named(name)
        if at is not None and os.path.isdir(os.path.join(root, name)):
            found.append((at, os.path.join(root, name)))
    return sorted(found, reverse=True)


@dataclass(frozen=True)
class Choice:
    """The checkpoint a launch resumes from (``path`` None: a fresh start) and those refused, newest first."""

    root: str
    path: str | None
    at: Progress
    refused: tuple[tuple[str, str], ...] = ()  # (directory, why)
    files_done: tuple[str, ...] = ()  # inside a pass: the files of pass ``at.passes + 1`` every trainer trained

    @property
    def passes_done(self) -> int:
        return self.at.passes

    def lines(self) -> list[str]:
        out = [f"checkpoint REFUSED: {why}" for _, why in self.refused]
        if self.path is not None:
            out.append(
                f"resuming from checkpoint {self.path} ({self.at}): the servers restore it at init_server, every "
                f"CPU trainer skips its first {self.passes_done} train_from_dataset passes"
                + (f" and the {len(self.files_done)} files of the next one trained already" if self.at.slice else "")
            )
        elif self.refused:
            out.append(
                f"--checkpoint-dir {self.root}: NO USABLE CHECKPOINT ({len(self.refused)} refused): starting FRESH"
            )
        else:
            out.append(f"--checkpoint-dir {self.root}: no checkpoint there yet: starting fresh")
        return out


def progress_in(path: str, manifest: dict[str, Any], at: Progress) -> Progress:
    """``at`` (what the checkpoint's name says) once its manifest says as much training done; else an error."""
    launch = manifest.get("launch")
    launch = launch if isinstance(launch, dict) else {}
    said = (launch.get("passes_done"), launch.get("slice", 0), launch.get("slices", 1) if at.slice else at.slices)
    if said != (at.passes, at.slice, at.slices):
        told = f"{said[0]!r} passes" + (f" and {said[1]!r} of {said[2]!r} shards of the next" if said[1] else "")
        raise CheckpointError(
            f"checkpoint {path}: its manifest says {told} done, its name {at} (not a checkpoint heterps launch "
            "wrote, or renamed)"
        )
    return at


def files_done_in(path: str, manifest: dict[str, Any]) -> tuple[str, ...]:
    """The files of the pass in progress a checkpoint inside a pass says every trainer trained (none: a pass's
    end)."""
    launch = manifest.get("launch")
    files = launch.get("files_done", []) if isinstance(launch, dict) else []
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise CheckpointError(f"checkpoint {path}: its {MANIFEST}'s files_done is not a list of file names")
    return tuple(files)


def chain_of(path: str, manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """The links an incremental checkpoint loads before itself: (name, SHA-256 of its manifest), its base first;
    none for a full checkpoint (or one written before incremental checkpoints were)."""
    launch = manifest.get("launch")
    chain = launch.get("chain", []) if isinstance(launch, dict) else []
    try:
        links = [(str(link["name"]), str(link["manifest"])) for link in chain]
    except (TypeError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {path}: unreadable chain in its {MANIFEST} ({exc!r})") from None
    if any(Progress.named(name) is None for name, _ in links):
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
            progress_in(link, verify(link), Progress.named(name) or Progress(-1))
        except CheckpointError as exc:
            raise CheckpointError(f"{where} refused: {exc}") from None
        order.append(link)
    return manifest, [*order, path]


def choose(root: str) -> Choice:
    """The newest checkpoint under ``root`` whose manifest (and chain) verifies; the newer ones that do not, with
    why."""
    refused: list[tuple[str, str]] = []
    for at, path in listed(root):
        try:
            manifest = verify_chain(path)[0]
            return Choice(root, path, progress_in(path, manifest, at), tuple(refused), files_done_in(path, manifest))
        except CheckpointError as exc:
            refused.append((path, str(exc)))
    return Choice(root, None, Progress(0), tuple(refused))


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


CAPTURED = "captured"  # DIR/.sync/<launch id>/<checkpoint>.captured: its state fixed, persisting or complete


def captured(root: str, launch: str) -> list[Progress]:
    """The checkpoints the running launch ``launch`` captured whose markers are still there (trainer 0 drops those
    of earlier points as the trainers meet at later ones)."""
    try:
        return captured_in(os.listdir(sync_dir(os.path.abspath(root), launch)))
    except OSError:
        return []


def captured_in(names: list[str]) -> list[Progress]:
    """The checkpoints whose captured markers are among the barrier files ``names``."""
    found = [Progress.named(name[: -len(CAPTURED) - 1]) for name in names if name.endswith(f".{CAPTURED}")]
    return [at for at in found if at is not None]


def ask_checkpoint(root: str, launch_id: str, reason: str, hold_s: float = 0.0) -> str:
    """Ask the running launch ``launch_id`` for a checkpoint now: ``root/.sync/<launch id>/asked`` (the reason, one
    line; ``hold S`` on a second when the trainers are to train no further for up to S seconds once it is captured,
    since the round ends at it: a leave), written atomically.  The trainers honour it once each has trained the shard
    of the pass it holds (a checkpoint even when --checkpoint-every does not make one due), then trainer 0 removes
    the file.  Returns
    its path."""
    directory = sync_dir(os.path.abspath(root), launch_id)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, ASKED)
    write_atomic(path, " ".join(reason.split()) + "\n" + (f"hold {hold_s:g}\n" if hold_s > 0 else ""))
    return path


@dataclass(frozen=True)
class Ask:
    """A checkpoint asked for (:func:`ask_checkpoint`): why, and how long the trainers hold once it is captured."""

    reason: str
    hold_s: float = 0.0


def read_ask(path: str) -> Ask | None:
    """The ask at ``path`` (:func:`ask_checkpoint`), None when there is none; a second line that is not
    ``hold S`` (S seconds, finite, not negative) holds nothing."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read(4096).splitlines()
    except FileNotFoundError:
        return None
    reason = (lines[0].strip() if lines else "") or "no reason given"
    words = lines[1].split() if len(lines) > 1 else []
    try:
        hold_s = float(words[1]) if len(words) == 2 and words[0] == "hold" else 0.0
    except ValueError:
        hold_s = 0.0
    return Ask(reason, hold_s if 0.0 <= hold_s < float("inf") else 0.0)


def chain_names(path: str) -> list[str]:
    """The names of the checkpoints ``path`` needs (itself and its chain's links); just its own when its manifest
    is unreadable (retention keeps what it can read)."""
    try:
        links = chain_of(path, read_manifest(path))
    except CheckpointError:
        links = []
    return [name for name, _ in links] + [os.path.basename(path)]
