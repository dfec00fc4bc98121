"""A launch's checkpoint after the pause (runtime/launch_checkpoints.py captures it): what trainer 0 does in the
background while training goes on (docs/checkpoints.md, "The pause"): the servers' files made a checkpoint
(runtime/checkpoint.py), moved from a staging area (in memory or beside --checkpoint-dir) into --checkpoint-dir,
the launch's fields into the manifest, written last, the rename, and the older checkpoints pruned.  A failure
leaves the previous checkpoint as it was, and says so.

It imports no Paddle at import time (runtime/launch_checkpoints.py says why).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from heterps_paddle import settings
from heterps_paddle.log import logger
from heterps_paddle.runtime import seam
from heterps_paddle.runtime.checkpoint_choice import Progress, chain_names, chain_of, choose, listed
from heterps_paddle.runtime.checkpoint_files import (
    MANIFEST,
    MEMORY_ROOT,
    CheckpointError,
    add_to_manifest,
    file_digest,
    memory_staging_dir,
    read_manifest,
    sweep_memory_staging,
)


@dataclass(frozen=True)
class Decision:
    """Trainer 0's word at a checkpoint point, the same for every trainer: skip, or a checkpoint of a kind (with its
    ``save_persistables`` mode: 0 full, 2 full base of incremental ones, 1 increment), and how long training holds
    once it is captured (an ask for a leave: the round ends at it)."""

    kind: str | None  # "full" | "incremental" | None (no checkpoint)
    mode: int = 0
    staging: str = ""  # where the servers write it (trainer 0 chose: memory or disk, :func:`staging_for`)
    hold_s: float = 0.0

    def text(self) -> str:
        return f"save {self.kind} {self.mode} {self.hold_s:g} {self.staging}" if self.kind else "skip"

    @staticmethod
    def parse(text: str) -> Decision:
        words = text.split(" ", 4)
        if len(words) == 5 and words[0] == "save" and words[1] in ("full", "incremental"):
            return Decision(words[1], int(words[2]), words[4], float(words[3]))
        return Decision(None)


def complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MANIFEST))


@dataclass(frozen=True)
class Captured:
    """A checkpoint the servers wrote to its staging area (the pause over), for trainer 0 to persist."""

    at: Progress
    staging: str
    trainers: int
    decision: Decision
    previous: str | None  # the chain's previous link when it was decided (an increment's base or increment)
    started: float  # monotonic: every trainer at the barrier
    paused: float  # seconds the trainers did not train
    asked: str | None = None  # the ask this checkpoint honours (its file removed once it is complete)
    files_done: tuple[str, ...] = ()  # inside a pass: the files of the pass in progress every trainer trained


class Persist:
    """A checkpoint persisting in a thread of its own (trainer 0): its path when done, its failure re-raised to
    whoever waits for it."""

    def __init__(self, work: Callable[[], str]):
        self.work = work
        self.done = threading.Event()
        self.result: str | None = None
        self.error: BaseException | None = None

    def start(self) -> Persist:
        threading.Thread(target=self._run, name="heterps-checkpoint-persist", daemon=True).start()
        return self

    def _run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as exc:  # re-raised where it is waited for: the trainer's thread
            self.error = exc
        finally:
            self.done.set()

    def wait(self) -> str:
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def staging_for(root: str, name: str, last_bytes: int) -> str:
    """Where the servers write checkpoint ``name`` (HETERPS_CHECKPOINT_STAGING): in memory (shared memory) when it
    has room for twice the last checkpoint (a first one: 256 MiB) and every server writes on this host (a server on
    another host would write its own machine's memory); on disk beside --checkpoint-dir otherwise, or when asked
    for (``disk``); or under a directory given.  Why it is not memory is logged."""
    asked = str(settings.get("HETERPS_CHECKPOINT_STAGING"))
    on_disk = os.path.join(root, f".{name}.incomplete")
    if asked == "disk":
        return on_disk
    if asked != "memory":
        sweep_memory_staging(asked)
        return os.path.join(memory_staging_dir(root=asked), f".{name}.incomplete")
    needed = max(2 * last_bytes, 256 << 20)
    why = None
    if not os.path.isdir(MEMORY_ROOT) or not os.access(MEMORY_ROOT, os.W_OK):
        why = f"{MEMORY_ROOT} is not there to write"
    elif shutil.disk_usage(MEMORY_ROOT).free < needed:
        free = shutil.disk_usage(MEMORY_ROOT).free
        why = f"{MEMORY_ROOT} has {free >> 20} MiB free, under the {needed >> 20} MiB it needs"
    elif not servers_here():
        why = "a parameter server runs on another host (it would write its own machine's memory)"
    if why is not None:
        logger.info("checkpoint %s: staged on disk beside %s (%s)", name, root, why)
        return on_disk
    sweep_memory_staging()
    return os.path.join(memory_staging_dir(), f".{name}.incomplete")


def servers_here() -> bool:
    """Whether every parameter server of the launch runs on this host (its address is this process's)."""
    here = os.environ.get("POD_IP", "127.0.0.1")
    servers = [e for e in os.environ.get("PADDLE_PSERVERS_IP_PORT_LIST", "").split(",") if e]
    return bool(servers) and all(e.rsplit(":", 1)[0] == here for e in servers)


# A save that left less free space than this on the checkpoint's file system may have been cut short by a full
# disk: the servers' writes of the tables do not report a failed write (Paddle 2.6.2), so the files could be short
# and still be checksummed into a manifest that verifies.
MIN_FREE_BYTES = 1 << 20


def check_room(staging: str) -> None:
    """CheckpointError when the file system of ``staging`` is (nearly) full after the servers' save."""
    free = shutil.disk_usage(staging).free
    if free < MIN_FREE_BYTES:
        raise CheckpointError(
            f"the file system of {staging} is full ({free} bytes free after the servers' save): the tables may "
            "not have been written whole; free space there"
        )


def _sync_directory(path: str) -> None:
    """The rename made durable before older checkpoints are removed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def persist(root: str, every: str, runtime: Any, captured: Captured) -> str:
    """Trainer 0, in the background: the servers' files made a checkpoint (runtime/checkpoint.py), moved from a
    memory staging area next to --checkpoint-dir, then completed there (:func:`complete_checkpoint`)."""
    from heterps_paddle.runtime import checkpoint  # lazy: imports Paddle (module doc)

    staging = captured.staging
    target = os.path.join(root, f".{captured.at.name}.incomplete")
    try:
        began = time.monotonic()
        steps = checkpoint.after_save_persistables(runtime, staging, captured.decision.mode, captured.previous)
        copying = time.monotonic()
        if os.path.normpath(staging) != os.path.normpath(target):
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(staging, target)
            check_room(target)
            shutil.rmtree(staging, ignore_errors=True)
        steps["copy_s"] = time.monotonic() - copying
        final = complete_checkpoint(root, every, captured, target, began, steps)
        if captured.asked is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(captured.asked)  # honoured, and complete: whoever asked sees it gone
    except (OSError, CheckpointError) as exc:
        shutil.rmtree(target, ignore_errors=True)  # never resumed from (no manifest): its room given back
        raise failed(root, captured.at, target, exc) from exc
    finally:
        if os.path.normpath(staging) != os.path.normpath(target):  # staged elsewhere: its room given back
            shutil.rmtree(os.path.dirname(staging), ignore_errors=True)
    return final


def failed(root: str, at: Progress, staging: str, exc: BaseException) -> CheckpointError:
    """The previous checkpoint is untouched (this one has its temporary name, without which no launch resumes
    from it): said loudly; the trainer then ends (the launch ends the job, or restarts it)."""
    previous = choose(root).path
    message = (
        f"checkpoint {at.where} FAILED writing {staging}: {exc}; the previous checkpoint "
        f"{previous or '(none)'} is kept and a relaunch resumes from it"
    )
    logger.error("%s", message)
    return CheckpointError(message)


def complete_checkpoint(
    root: str, every: str, captured: Captured, staging: str, began: float, steps: dict[str, float]
) -> str:
    """Trainer 0, in the background, the checkpoint's files in ``staging`` beside --checkpoint-dir: the launch's
    fields into the manifest (with the pause the trainers made, how long persisting took since ``began`` and
    each of its ``steps``), then the rename."""
    from heterps_paddle.planning.model import save_plan

    plan = seam.context().plan
    files = []
    chain: list[dict[str, str]] = []
    at, decision, previous = captured.at, captured.decision, captured.previous
    if decision.kind == "incremental" and previous is not None:
        earlier = chain_of(previous, read_manifest(previous))
        links = [*earlier, (os.path.basename(previous), file_digest(os.path.join(previous, MANIFEST)))]
        chain = [{"name": link, "manifest": digest} for link, digest in links]
    launch: dict[str, Any] = {
        "passes_done": at.passes,
        "slice": at.slice,  # inside a pass: ``slice`` of its ``slices`` shards done, ``files_done`` them by content
        "slices": at.slices,
        "files_done": list(captured.files_done),
        "every": every,
        "trainers": captured.trainers,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "plan_digest": None,
        "kind": decision.kind,
        "mode": decision.mode,
        "chain": chain,
    }
    if plan is not None:
        save_plan(plan, os.path.join(staging, "plan.json"))
        files.append("plan.json")
        launch["plan_digest"] = file_digest(os.path.join(staging, "plan.json"))
    # every file of the directory but the manifest (which holds the count), and the time since the barrier
    launch["bytes"] = sum(
        os.path.getsize(os.path.join(base, f)) for base, _, fs in os.walk(staging) for f in fs if f != MANIFEST
    )
    launch["save_s"] = round(time.monotonic() - captured.started, 3)  # the barrier to the manifest
    launch["pause_s"] = round(captured.paused, 3)  # the barrier to the trainers training again
    launch["persist_s"] = round(time.monotonic() - began, 3)  # the background phase, to the manifest
    launch["steps_s"] = {name: round(seconds, 3) for name, seconds in steps.items()}
    add_to_manifest(staging, files, {"launch": launch})
    final = os.path.join(root, at.name)
    replaced = None
    if os.path.exists(final):
        # an earlier launch's checkpoint of the same name (this launch resumed from an older one, refusing it)
        replaced = os.path.join(root, f".{at.name}.replaced")
        shutil.rmtree(replaced, ignore_errors=True)
        os.rename(final, replaced)
    os.rename(staging, final)
    _sync_directory(root)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
        logger.warning("checkpoint %s: an earlier launch's checkpoint %s replaced", final, at.where)
    logger.info(
        "checkpoint %s: complete (%s; kind=%s bytes=%d seconds=%.3f pause=%.3f persist=%.3f chain=%d; its "
        "manifest written last, then renamed)",
        final,
        at,
        decision.kind,
        launch["bytes"],
        launch["save_s"],
        launch["pause_s"],
        launch["persist_s"],
        len(chain) + 1,
    )
    prune(root, at)
    return final


def prune(root: str, at: Progress) -> None:
    """Keep this checkpoint and the newest complete one before it, with what their chains need (an incremental
    one's base and earlier increments); older ones and crashed saves go."""
    newest = [path for other, path in listed(root) if other <= at and complete(path)][:2]
    needed = {name for path in newest for name in chain_names(path)}
    for other, path in listed(root):
        if other >= at or os.path.basename(path) in needed:
            continue
        shutil.rmtree(path, ignore_errors=True)
        logger.info("checkpoint %s: removed (the launch keeps the last 2 complete checkpoints and their chains)", path)
    for name in os.listdir(root):
        if name.startswith(".pass-") and name != f".{at.name}.incomplete":
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
