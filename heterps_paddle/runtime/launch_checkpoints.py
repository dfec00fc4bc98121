"""Checkpoints the launch owns: ``heterps launch --checkpoint-dir DIR --checkpoint-every N|Nm`` (docs/checkpoints.md).

An unchanged fleet script (one ``train_from_dataset`` per epoch, as PaddleRec's) gets complete checkpoints and
resumes from them, one-stage or split:

- **Choice, at launch.**  ``heterps launch`` picks the newest ``DIR/pass-NNNNNN`` whose manifest verifies
  (runtime/checkpoint_choice.py, the launcher's half: every file's SHA-256); each one refused is named with its
  reason, loudly; none usable means a fresh start, said so.  Every process gets the choice
  (``HETERPS_CHECKPOINT_RESUME``, read here by :func:`resume_choice`), so the servers and the trainers act on the
  same checkpoint.
- **Resume.**  A server's ``init_server`` loads the chosen checkpoint (:func:`server_start_dir`: also when the
  script passes no directory; a script's own, different directory is an error, since its model and the passes the
  checkpoint says are done cannot both be the start); trainer 0 skips its initial dense push as after any restore
  (checkpoint.servers_restored); every stage 1 CPU trainer skips its first K training passes, K the passes the
  checkpoint holds (:meth:`PassCheckpoints.gate`), so the script's epoch loop goes on at the next epoch.
- **Save.**  After a due pass every stage 1 CPU trainer flushes its pushes and meets the others at a barrier (files
  under ``DIR/.sync/<launch id>/``: it needs nothing of the script, no gloo); then the servers write every table
  into ``DIR/.pass-NNNNNN.incomplete`` (``fleet.save_persistables``: trainer 0 regroups a split job's dense tables
  and writes the manifest last, runtime/checkpoint.py), trainer 0 adds the plan and the passes done to the manifest
  and renames the directory to ``DIR/pass-NNNNNN``: a crash at any point leaves the previous checkpoint as it was,
  and a directory without a verifying manifest is never resumed from.  The last two complete ones are kept.  The
  other trainers wait until the rename, so a checkpoint is the model after exactly N passes of every trainer.

This module is the half that runs in the job's processes.  It imports no Paddle at import time (a test's
sitecustomize imports it before Paddle is): Paddle and the modules that import it are imported inside the functions
that use them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from typing import Any, Iterator, cast

from heterps_paddle import settings
from heterps_paddle.files import write_atomic
from heterps_paddle.log import logger
from heterps_paddle.rendezvous import launch_id
from heterps_paddle.runtime import push_queues, seam
from heterps_paddle.runtime.checkpoint_choice import NAME, Choice, checkpoint_name, choose, listed, passes_in
from heterps_paddle.runtime.checkpoint_files import (
    MANIFEST,
    CheckpointError,
    add_to_manifest,
    file_digest,
    read_manifest,
)

SYNC_DIR = ".sync"
POLL_S = 0.2
# Ops that write to the parameter servers: a train_from_dataset pass whose program runs one trains the model (an
# evaluation program, fleet.evaluation.forward_only_program or the whole model's forward pass, has none).
WRITE_OPS = frozenset(
    {"distributed_push_sparse", "push_sparse", "push_sparse_v2", "push_dense", "send", "send_and_recv"}
)


_choice: Choice | None = None


def resume_choice() -> Choice | None:
    """This process's view of the launch's choice; None when the launch keeps no checkpoints."""
    global _choice
    root = str(settings.get("HETERPS_CHECKPOINT_DIR"))
    if not root:
        return None
    if _choice is None:
        chosen = str(settings.get("HETERPS_CHECKPOINT_RESUME"))
        if chosen == "none":
            _choice = Choice(root, None, 0)
        elif chosen:
            # chosen and verified by heterps launch (the servers verify the files again when they load them)
            match = NAME.fullmatch(os.path.basename(chosen))
            passes = int(match.group(1)) if match else -1
            _choice = Choice(root, chosen, passes_in(chosen, read_manifest(chosen), passes))
        else:
            # HETERPS_CHECKPOINT_DIR set by hand, not by heterps launch: the same choice, made here
            _choice = choose(root)
            for line in _choice.lines():
                logger.warning("%s", line)
    return _choice


# ------------------------------------------------------------------------------------------------ servers


def server_start_dir(dirname: str | None) -> str | None:
    """What a server's ``init_server(dirname)`` loads: the launch's checkpoint when there is one to resume from."""
    choice = resume_choice()
    if choice is None or choice.path is None:
        return dirname
    if dirname and os.path.normpath(os.path.abspath(dirname)) != choice.path:
        raise CheckpointError(
            f"init_server({dirname}) on {seam.identity()}: this launch resumes from its checkpoint {choice.path} "
            f"({choice.passes_done} passes done); the script's own start directory cannot be used with it (its "
            "passes would be skipped from another model).  Relaunch without the script's init directory (the "
            "checkpoint holds the model that started from it), or with another --checkpoint-dir to start from it"
        )
    logger.info(
        "init_server: resuming from the launch's checkpoint %s (%d passes done)", choice.path, choice.passes_done
    )
    return choice.path


# ------------------------------------------------------------------------------------------ stage 1 trainers


def is_training_pass(program: Any) -> bool:
    return any(op.type in WRITE_OPS for block in program.blocks for op in block.ops)


class Barrier:
    """Files under ``DIR/.sync/<launch id>/``: the stage 1 CPU trainers' meeting points after a pass."""

    def __init__(self, root: str) -> None:
        self.dir = os.path.join(root, SYNC_DIR, launch_id() or "local")
        self.wait_s = float(cast(float, settings.get("HETERPS_CHECKPOINT_WAIT_S")))

    def mark(self, passes: int, what: str, text: str = "") -> None:
        os.makedirs(self.dir, exist_ok=True)
        write_atomic(os.path.join(self.dir, f"{checkpoint_name(passes)}.{what}"), text)

    def wait(self, passes: int, what: str, who: str) -> str:
        path = os.path.join(self.dir, f"{checkpoint_name(passes)}.{what}")
        deadline = time.monotonic() + self.wait_s
        while not os.path.isfile(path):
            if time.monotonic() > deadline:
                raise CheckpointError(
                    f"checkpoint after pass {passes} on {seam.identity()}: {who} did not get there within "
                    f"{self.wait_s:.0f} s (HETERPS_CHECKPOINT_WAIT_S)"
                )
            time.sleep(POLL_S)
        with open(path, encoding="utf-8") as f:
            return f.read()

    def drop_other_launches(self) -> None:
        parent = os.path.dirname(self.dir)
        for name in os.listdir(parent):
            if os.path.join(parent, name) != self.dir:
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


class PassCheckpoints:
    """A stage 1 CPU trainer's passes: the first ones skipped on a resume, a checkpoint after each due one."""

    def __init__(self, choice: Choice, every: tuple[float, str]) -> None:
        self.root = choice.root
        self.resumed_from = choice.path
        self.skip = choice.passes_done
        self.every, self.unit = every
        self.passes = 0  # training passes of the job so far, the skipped ones included
        self.last_save = time.monotonic()
        self.restore_checked = False

    def gate(self, call: seam.DatasetCall) -> bool:
        """Whether this ``train_from_dataset`` call is a pass the checkpoint already holds (not run)."""
        if self.passes >= self.skip or not is_training_pass(call.main_program()):
            return False
        if not self.restore_checked:
            from heterps_paddle.runtime import checkpoint  # lazy: imports Paddle (module doc)

            restored = checkpoint.servers_restored()
            if restored is None or os.path.normpath(restored) != self.resumed_from:
                raise CheckpointError(
                    f"{seam.identity()}: this launch resumes from {self.resumed_from}, but the servers say they "
                    f"restored {restored or 'nothing'}: its passes are not skipped over another model"
                )
            self.restore_checked = True
        self.passes += 1
        logger.info(
            "checkpoint: pass %d skipped (train_from_dataset not run): checkpoint %s holds %d passes",
            self.passes,
            self.resumed_from,
            self.skip,
        )
        return True

    @contextlib.contextmanager
    def hook(self, call: seam.DatasetCall) -> Iterator[None]:
        """Around a pass that runs: a checkpoint after it, when due (registered first: it ends last, after the
        other hooks' ends, dense refresh and metrics included)."""
        training = is_training_pass(call.main_program())
        yield
        if training:
            self.passes += 1
            self.after_pass(call.executor)

    def after_pass(self, executor: Any) -> None:
        passes = self.passes
        if self.unit == "passes" and passes % int(self.every):
            return
        from paddle.distributed import fleet  # lazy (module doc)

        runtime = seam.fleet_runtime()
        trainers, index = seam.worker_count_and_index(seam.role_maker())
        # This trainer's pushes of the pass answered before the barrier.  A split job's heterogeneous trainers are
        # flushed by fleet.save_persistables below (runtime/saves.py), once every CPU trainer has ended its pass:
        # flushed here, they could still be serving another trainer's micro-batches.
        push_queues.flush_pushes(runtime, f"checkpoint after pass {passes}")
        barrier = Barrier(self.root)
        barrier.mark(passes, f"arrived.{index}")
        if index == 0:
            for other in range(1, trainers):
                barrier.wait(passes, f"arrived.{other}", f"CPU trainer {other}")
            # minutes: trainer 0's clock decides for all, so every trainer saves or goes on together
            due = self.unit == "passes" or time.monotonic() - self.last_save >= self.every * 60
            barrier.mark(passes, "decision", "save" if due else "skip")
        else:
            due = barrier.wait(passes, "decision", "CPU trainer 0's decision") == "save"
        if not due:
            return
        name = checkpoint_name(passes)
        staging = os.path.join(self.root, f".{name}.incomplete")
        if index == 0:
            barrier.drop_other_launches()
            shutil.rmtree(staging, ignore_errors=True)  # a crashed save's leftovers
            os.makedirs(staging)
        try:
            # every trainer calls it (fleet's own barriers, with gloo, pair up); the servers write, trainer 0
            # regroups and writes the manifest (runtime/saves.py, runtime/checkpoint.py)
            fleet.save_persistables(executor, staging)
            if index == 0:
                check_room(staging)
                final = self.complete(passes, staging, trainers)
        except (OSError, CheckpointError) as exc:
            # The previous checkpoint is untouched (this one has its temporary name, without which no launch
            # resumes from it): say so, loudly, and end this trainer (the launch then ends the job, or restarts it).
            previous = choose(self.root).path
            message = (
                f"checkpoint after pass {passes} FAILED writing {staging}: {exc}; the previous checkpoint "
                f"{previous or '(none)'} is kept and a relaunch resumes from it"
            )
            logger.error("%s", message)
            raise CheckpointError(message) from exc
        if index == 0:
            barrier.mark(passes, "saved", final)
            self.last_save = time.monotonic()
        else:
            barrier.wait(passes, "saved", "CPU trainer 0's save")

    def complete(self, passes: int, staging: str, trainers: int) -> str:
        """Trainer 0, after the servers' save: the launch's fields into the manifest, then the rename."""
        from heterps_paddle.planning.model import save_plan

        plan = seam.context().plan
        files = []
        launch: dict[str, Any] = {
            "passes_done": passes,
            "every": f"{self.every:g}m" if self.unit == "minutes" else f"{int(self.every)}",
            "trainers": trainers,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "plan_digest": None,
        }
        if plan is not None:
            save_plan(plan, os.path.join(staging, "plan.json"))
            files.append("plan.json")
            launch["plan_digest"] = file_digest(os.path.join(staging, "plan.json"))
        add_to_manifest(staging, files, {"launch": launch})
        final = os.path.join(self.root, checkpoint_name(passes))
        replaced = None
        if os.path.exists(final):
            # an earlier launch's checkpoint of the same pass (this launch resumed from an older one, refusing it)
            replaced = os.path.join(self.root, f".{checkpoint_name(passes)}.replaced")
            shutil.rmtree(replaced, ignore_errors=True)
            os.rename(final, replaced)
        os.rename(staging, final)
        _sync_directory(self.root)
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)
            logger.warning("checkpoint %s: an earlier launch's checkpoint of the same pass replaced", final)
        logger.info("checkpoint %s: complete (%d passes done; its manifest written last, then renamed)", final, passes)
        self.prune(passes)
        return final

    def prune(self, passes: int) -> None:
        """Keep this checkpoint and the newest complete one before it; older ones and crashed saves go."""
        kept = None
        for number, path in listed(self.root):
            if number >= passes:
                continue
            if kept is None and os.path.isfile(os.path.join(path, MANIFEST)):
                kept = path
                continue
            shutil.rmtree(path, ignore_errors=True)
            logger.info("checkpoint %s: removed (the launch keeps the last 2 complete checkpoints)", path)
        for name in os.listdir(self.root):
            if name.startswith(".pass-") and name != f".{checkpoint_name(passes)}.incomplete":
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)


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


def install(ctx: seam.ProcessContext) -> None:
    """On a stage 1 CPU trainer of a launch that keeps checkpoints: the pass gate and the save hook."""
    if ctx.role != "trainer":
        return
    choice = resume_choice()
    if choice is None:
        return
    passes = PassCheckpoints(choice, cast(tuple[float, str], settings.get("HETERPS_CHECKPOINT_EVERY")))
    ctx.pass_gate = passes.gate
    ctx.dataset_hooks["launch_checkpoints"] = passes.hook
