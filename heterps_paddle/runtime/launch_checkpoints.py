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
  checkpoint holds (:meth:`PassCheckpoints.gate`), so the script's epoch loop goes on at the next epoch; from a
  checkpoint inside a pass, that pass trains only the files the checkpoint does not say done.
- **Inside a pass.**  Each training pass is pulled from the job's data plan, a call of Paddle's
  ``train_from_dataset`` per shard (runtime/pulled_pass.py): a checkpoint asked for (a leave, a move) or due by
  minutes comes between two calls, once every trainer holds no shard, ``DIR/pass-NNNNNN.KofS``, its manifest naming
  the shards done.
- **Save.**  After a due pass every stage 1 CPU trainer flushes its pushes and meets the others at a barrier (files
  under ``DIR/.sync/<launch id>/``: it needs nothing of the script, no gloo); then the servers write every table
  to a staging area (``fleet.save_persistables``) and the trainers train again once it returned (captured: the
  pause).  In the background trainer 0 regroups a split job's dense tables, compresses and hashes the files
  (runtime/checkpoint.py), adds the plan and the passes done to the manifest, written last, and renames the
  directory to ``DIR/pass-NNNNNN``: a crash at any point leaves the previous checkpoint as it was, and a directory
  without a verifying manifest is never resumed from.  The last two complete ones are kept.  No trainer pushes
  before the servers' save returned, so a checkpoint is the model after exactly N passes of every trainer.

This module is the half that runs in the job's processes.  It imports no Paddle at import time (a test's
sitecustomize imports it before Paddle is): Paddle and the modules that import it are imported inside the functions
that use them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from typing import Any, Callable, Iterable, Iterator, cast

from heterps_paddle import settings
from heterps_paddle.files import write_atomic
from heterps_paddle.log import logger
from heterps_paddle.rendezvous import launch_id
from heterps_paddle.runtime import checkpoint_persist, hooks, pulled_pass, push_queues, seam, table_shards
from heterps_paddle.runtime.checkpoint_choice import (
    ASKED,
    CAPTURED,
    NAME,
    Ask,
    Choice,
    Progress,
    base_interval,
    captured_in,
    chain_names,
    choose,
    files_done_in,
    progress_in,
    read_ask,
    sync_dir,
)
from heterps_paddle.runtime.checkpoint_files import (
    CheckpointError,
    dir_bytes,
    read_manifest,
)
from heterps_paddle.runtime.checkpoint_persist import (
    Captured,
    Decision,
    Persist,
    check_room,
    staging_for,
)
from heterps_paddle.runtime.file_identity import done_here, is_identity, name_of
from heterps_paddle.runtime.pulled_pass import is_training_pass

POLL_S = 0.2
RESTORE = "restore"  # the barrier's mark of trainer 0's word on a resume's restore: "proven", or why it was refused

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
            _choice = Choice(root, None, Progress(0))
        elif chosen:
            # chosen and verified by heterps launch (the servers verify the files again when they load them)
            manifest = read_manifest(chosen)
            at = progress_in(chosen, manifest, Progress.named(os.path.basename(chosen)) or Progress(-1))
            _choice = Choice(root, chosen, at, files_done=files_done_in(chosen, manifest))
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
        return dirname  # the script's own model (loaded in this job's shard count: runtime/table_shards.py)
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


class Barrier:
    """Files under ``DIR/.sync/<launch id>/``: the stage 1 CPU trainers' meeting points after a pass, and inside a
    pulled pass for a checkpoint (named by the checkpoint such a point would make)."""

    def __init__(self, root: str) -> None:
        self.dir = sync_dir(root, launch_id() or "local")
        self.wait_s = float(cast(float, settings.get("HETERPS_CHECKPOINT_WAIT_S")))

    def mark(self, at: Progress, what: str, text: str = "") -> None:
        os.makedirs(self.dir, exist_ok=True)
        write_atomic(os.path.join(self.dir, f"{at.name}.{what}"), text)

    def wait(self, at: Progress, what: str, who: str) -> str:
        path = os.path.join(self.dir, f"{at.name}.{what}")
        deadline = time.monotonic() + self.wait_s
        while not os.path.isfile(path):
            if time.monotonic() > deadline:
                raise CheckpointError(
                    f"checkpoint {at.where} on {seam.identity()}: {who} did not get there within "
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

    def drop_before(self, at: Progress) -> None:
        """Trainer 0, once every trainer arrived at ``at``: the files of the points before (every trainer has read
        them), so a long job's barrier directory stays small; the newest checkpoint's captured marker stays (the
        launch reads it: a leave waits for a checkpoint newer than one persisting, coordinator.newest_captured)."""
        names = os.listdir(self.dir)
        newest = max(captured_in(names), default=None)
        kept = f"{newest.name}.{CAPTURED}" if newest is not None else None
        for name in names:
            match = NAME.match(name)
            earlier = Progress.of(match) if match else None
            if earlier is not None and earlier < at and name != kept:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.dir, name))


class PassCheckpoints:
    """A stage 1 CPU trainer's passes: the first ones skipped on a resume (and the shards of a pass the checkpoint
    was taken inside), each pass pulled from the data plan, and a checkpoint at a pass's end or between two of its
    calls when one is due or asked for."""

    def __init__(self, choice: Choice, every: tuple[float, str]) -> None:
        self.root = choice.root
        self.resumed_from = choice.path
        self.skip = choice.passes_done
        # a checkpoint taken inside a pass: where in the next pass, and the shards of it done (named by content; a
        # name repeats where a file offered by N trainers was trained as more than one of its N shards)
        self.resumed_at = choice.at
        self.resumed_files = tuple(choice.files_done)
        self.every, self.unit = every
        self.pulling = False  # whether the data plan's puller was looked for (once fleet is up)
        self.puller: pulled_pass.Puller | None = None
        self.passes = 0  # training passes of the job so far, the skipped ones included
        self.last_save = time.monotonic()
        self.restore_checked = False
        self.base_every = base_interval()
        # the checkpoint the servers' tables were last saved to or restored from: an increment's previous link
        self.previous = choice.path
        self.asked: Ask | None = None  # the ask honoured by the checkpoint being saved
        self.persisting: Persist | None = None  # trainer 0: the checkpoint being persisted in the background
        self.persisting_honours_ask = False  # ... and whether it is the one an ask asked for
        self.last_bytes = 0  # the last checkpoint's bytes (how much room a staging area needs)
        # save_persistables' mode of a full checkpoint when every checkpoint is full: 2 ("base": every row as plain
        # text, compressed in the background) where that writes every row, else 0 (gzipped inside the pause)
        self.full_mode = 0

    def gate(self, call: seam.DatasetCall) -> bool:
        """Whether this ``train_from_dataset`` call is a pass the checkpoint already holds (not run)."""
        if self.passes >= self.skip or not is_training_pass(call.main_program()):
            return False
        self.check_restored()
        self.passes += 1
        logger.info(
            "checkpoint: pass %d skipped (train_from_dataset not run): checkpoint %s holds %d passes",
            self.passes,
            self.resumed_from,
            self.skip,
        )
        return True

    def check_restored(self) -> None:
        """Before a pass or a file is skipped: the servers restored the checkpoint that says it is done."""
        if self.restore_checked:
            return
        from heterps_paddle.runtime import checkpoint  # lazy: imports Paddle (module doc)

        restored = checkpoint.servers_restored()
        if restored is None or os.path.normpath(restored) != self.resumed_from:
            raise CheckpointError(
                f"{seam.identity()}: this launch resumes from {self.resumed_from}, but the servers say they "
                f"restored {restored or 'nothing'}: its passes are not skipped over another model"
            )
        barrier = Barrier(self.root)  # what they hold proven what it captured, before any batch trains
        checkpoint.prove_restored(
            self.resumed_from,
            lambda word: barrier.mark(self.resumed_at, RESTORE, word),
            lambda: barrier.wait(self.resumed_at, RESTORE, "CPU trainer 0's check of the restore"),
            os.path.join(barrier.dir, "restore-check"),
        )
        self.restore_checked = True

    @contextlib.contextmanager
    def hook(self, call: seam.DatasetCall) -> Iterator[None]:
        """Around a pass that runs: a checkpoint after it, when due (registered first: it ends last, after the
        other hooks' ends, dense refresh and metrics included); the dataset's file list as the script set it."""
        training = is_training_pass(call.main_program())
        files = getattr(call.dataset, "filelist", None)
        try:
            yield
        finally:
            if files is not None and getattr(call.dataset, "filelist", None) != files:
                call.dataset.set_filelist(files)  # as the script set it: its next pass may not set it again
        if training:
            self.passes += 1
            self.meet(call.executor, Progress(self.passes))

    def run_pass(self, call: seam.DatasetCall, run: Callable[[seam.DatasetCall], Any]) -> Any:
        """A training pass pulled from the job's data plan (runtime/pulled_pass.py), a checkpoint between two of its
        calls when one is asked for or due by minutes (``DIR/pass-NNNNNN.KofS``: K of the pass's S shards done or
        in hand when it was asked for); a pass a checkpoint was taken inside trains the shards it does not hold.
        Where the pass keeps the script's own split (one trainer, an InMemoryDataset), it runs as one call, of the
        files the checkpoint does not hold."""
        number = self.passes + 1
        run = hooks.around_train_run(number, run)
        files = getattr(call.dataset, "filelist", None)
        if not is_training_pass(call.main_program()) or files is None:
            return run(call)
        resumed = self.resumed_at.slice > 0 and number == self.resumed_at.passes + 1
        if resumed:
            self.check_restored()
        if not self.pulling:
            self.pulling, self.puller = True, pulled_pass.puller()
        why = "not launched by heterps launch" if self.puller is None else self.puller.why_not(call)
        if why is None and self.puller is not None:
            puller = self.puller
            result, trained = puller.run_pass(
                number,
                call,
                run,
                self.done_before(files) if resumed else [],
                self.resumed_at.slice if resumed else 0,
                wanted=lambda: self.wanted(puller.index),
                meet=lambda hold, shards: self.meet(
                    call.executor, Progress(number - 1, hold, shards), lambda: self.done_in_plan(number)
                ),
            )
            call.dataset.set_filelist(list(trained.paths))  # the hooks' ends see the files trained here
            return result
        if self.puller is not None:
            self.puller.say_once(str(why))
        if resumed and hasattr(call.dataset, "load_into_memory"):
            raise CheckpointError(
                f"{seam.identity()}: checkpoint {self.resumed_from} was taken inside pass {number}, which this "
                "script trains from an InMemoryDataset (loaded before train_from_dataset): its files cannot be "
                "left out; resume from a checkpoint at a pass's end, or read the files with a QueueDataset"
            )
        if not resumed:
            return run(call)
        todo = [f for f in files if not done_here(f, frozenset(self.resumed_files))]  # by content: other hosts' paths
        logger.info(
            "checkpoint: pass %d goes on from %s: %d of its %d files here trained already, left out",
            number,
            self.resumed_from,
            len(files) - len(todo),
            len(files),
        )
        call.dataset.set_filelist(todo)  # the files this pass trains here
        return run(call) if todo else None

    def done_before(self, files: list[str]) -> list[str]:
        """The shards of the pass resumed inside that its checkpoint holds, by content, each as often as the
        checkpoint names it (a file offered by N trainers is N shards): a checkpoint of an earlier version names its
        files by path, which this trainer's files are matched against."""
        by_path = {f: name_of(f) for f in set(files) if f in self.resumed_files}
        return [n if is_identity(n) else by_path[n] for n in self.resumed_files if is_identity(n) or n in by_path]

    def wanted(self, index: int) -> str | None:
        """Between two calls of a pulled pass: a checkpoint asked for (any trainer reads the ask), or due by
        --checkpoint-every in minutes (trainer 0's clock decides); the data plan honours each once."""
        path = os.path.join(sync_dir(self.root, launch_id() or "local"), ASKED)
        ask = read_ask(path)
        if ask is not None:
            with contextlib.suppress(OSError):  # the same ask is honoured once a round; another, written later, too
                return f"asked at {os.stat(path).st_mtime_ns}: {ask.reason}"
        if ask is not None:
            return f"asked: {ask.reason}"
        if index == 0 and self.unit == "minutes" and time.monotonic() - self.last_save >= self.every * 60:
            return f"due after {self.last_save:.3f}"
        return None

    def done_in_plan(self, number: int) -> list[str]:
        """Trainer 0 at a checkpoint inside pass ``number``: the shards the data plan says done (every trainer
        holds none then), named by content, a name once a copy done; asked a page at a time (``from``, ``next``:
        the whole list would pass the control line's limit at a few thousand shards), a plan without pages answers
        the whole list at once."""
        assert self.puller is not None
        for _ in range(3):  # the list cannot change while the trainers meet: a total that does, asked again
            done: list[str] = []
            at: int | None = 0
            totals = set()
            while at is not None:
                reply = self.puller.ask({"do": "done", "pass": number, "from": at})
                done.extend(reply["done"])
                totals.add(reply.get("total"))
                at = reply.get("next")
            if len(totals) == 1:
                return done
        raise CheckpointError(f"{seam.identity()}: pass {number}'s shards done changed while the trainers met")

    def meet(self, executor: Any, at: Progress, done_in_plan: Callable[[], list[str]] | None = None) -> None:
        """At a pass's end, or between two calls of a pulled pass: the barrier (every trainer gets trainer 0's
        decision, so a checkpoint asked for reaches all), then the checkpoint when it is due or asked for.
        ``done_in_plan`` (inside a pass): the shards of the pass done, as the data plan says."""
        if self.persisting is not None and self.persisting.done.is_set():
            # a failure in the background ends the trainer now
            self.wait_persisted(f"the trainers' meeting {at.where}")
        # due by --checkpoint-every (in minutes, maybe: trainer 0's clock decides): pushes flushed before arriving
        scheduled = self.scheduled(at)
        runtime = seam.fleet_runtime()
        trainers, index = seam.worker_count_and_index(seam.role_maker())
        # This trainer's pushes answered before the barrier.  A split job's heterogeneous trainers are flushed by
        # fleet.save_persistables below (runtime/saves.py), once every CPU trainer has ended its call: flushed
        # here, they could still be serving another trainer's micro-batches.
        if scheduled:
            push_queues.flush_pushes(runtime, f"checkpoint {at.where}")
        barrier = Barrier(self.root)
        barrier.mark(at, f"arrived.{index}")
        if index == 0:
            for other in range(1, trainers):
                barrier.wait(at, f"arrived.{other}", f"CPU trainer {other}")
            barrier.drop_before(at)
            decision = self.decide(at, scheduled, barrier)
            barrier.mark(at, "decision", decision.text())
        else:
            decision = Decision.parse(barrier.wait(at, "decision", "CPU trainer 0's decision"))
        if decision.kind is None:
            return
        started = time.monotonic()
        # the plan's done shards as it lists them: a name repeats for a file trained as more than one shard
        done = sorted(done_in_plan()) if at.slice and index == 0 and done_in_plan is not None else []
        if not scheduled:
            # asked for at a point that was not due: every trainer's pushes answered before the servers save
            push_queues.flush_pushes(runtime, f"checkpoint {at.where} (asked for)")
            barrier.mark(at, f"flushed.{index}")
            if index == 0:
                for other in range(1, trainers):
                    barrier.wait(at, f"flushed.{other}", f"CPU trainer {other}")
        self.save(executor, at, decision, barrier, (trainers, index), started, tuple(done))
        if decision.hold_s > 0:
            self.hold(at, decision.hold_s)

    def scheduled(self, at: Progress) -> bool:
        """Whether --checkpoint-every may make a checkpoint due at ``at``: N passes, at every Nth pass's end; N
        minutes, at any meeting (trainer 0 decides whether the minutes are over)."""
        return self.unit == "minutes" or (not at.slice and at.passes % int(self.every) == 0)

    def hold(self, at: Progress, hold_s: float) -> None:
        """After a checkpoint asked for by a leave: no more training (it would be redone from the checkpoint), until
        the launch ends the round, or for ``hold_s`` at most (the leave's grace time: then the round went on)."""
        logger.info(
            "checkpoint %s: captured for a leave; this trainer trains no further until the round ends (%.0f s at most)",
            at.where,
            hold_s,
        )
        time.sleep(hold_s)
        logger.warning("checkpoint %s: the round did not end within %.0f s of it: training goes on", at.where, hold_s)

    def decide(self, at: Progress, scheduled: bool, barrier: Barrier) -> Decision:
        """Trainer 0: whether a checkpoint comes at ``at`` (due by --checkpoint-every, or asked for), and which."""
        # minutes: trainer 0's clock decides for all, so every trainer saves or goes on together
        due = scheduled and (self.unit == "passes" or time.monotonic() - self.last_save >= self.every * 60)
        # an ask the checkpoint persisting now honours is still there (its file goes once that one is complete)
        honoured = self.persisting is not None and self.persisting_honours_ask
        self.asked = None if honoured else read_ask(os.path.join(barrier.dir, ASKED))
        if self.asked is not None:
            logger.info("checkpoint: asked for (%s)", self.asked.reason)
        if not due and self.asked is None:
            return Decision(None)
        # at most one checkpoint in flight: this one waits for the last one's persisting (its chain may need it)
        self.wait_persisted(f"checkpoint {at.where}")
        staging = staging_for(self.root, at.name, self.last_bytes)
        hold_s = self.asked.hold_s if self.asked is not None else 0.0
        if self.base_every <= 1:
            return Decision("full", self.full_mode, staging, hold_s)
        # an increment holds what changed since the previous checkpoint of this chain: the one this launch wrote
        # last, or resumed from (its servers restored it); a base every base_every checkpoints
        if self.previous is None or len(chain_names(self.previous)) >= self.base_every:
            return Decision("full", 2, staging, hold_s)
        return Decision("incremental", 1, staging, hold_s)

    def save(
        self,
        executor: Any,
        at: Progress,
        decision: Decision,
        barrier: Barrier,
        where: tuple[int, int],
        started: float,
        files_done: tuple[str, ...],
    ) -> None:
        """Two phases (docs/checkpoints.md, "The pause"): the servers write the tables to the staging area while the
        trainers wait (the pause), then training goes on while trainer 0 finishes the checkpoint in the background
        (regrouping, compression, checksums, the manifest, the move into --checkpoint-dir and the rename).
        ``started``: when every trainer was at the barrier; ``files_done`` (trainer 0): the files of the pass in
        progress every trainer trained."""
        from paddle.distributed import fleet  # lazy (module doc)

        trainers, index = where
        staging = decision.staging
        if index == 0:
            barrier.drop_other_launches()
            shutil.rmtree(staging, ignore_errors=True)  # a crashed save's leftovers
            os.makedirs(staging)
        ctx = seam.context()
        try:
            # every trainer calls it (fleet's own barriers, with gloo, pair up); the servers write: the pause
            ctx.deferred_save = os.path.normpath(staging)
            fleet.save_persistables(executor, staging, mode=decision.mode)
            if index == 0:
                check_room(staging)
        except (OSError, CheckpointError) as exc:
            raise checkpoint_persist.failed(self.root, at, staging, exc) from exc
        finally:
            ctx.deferred_save = None
        final = os.path.join(self.root, at.name)
        if index == 0:
            asked = os.path.join(barrier.dir, ASKED) if self.asked is not None else None
            paused = time.monotonic() - started
            captured = Captured(at, staging, trainers, decision, self.previous, started, paused, asked, files_done)
            runtime = seam.fleet_runtime()
            self.persisting = Persist(lambda: self.persist(runtime, captured)).start()
            self.persisting_honours_ask = asked is not None
            self.asked = None  # honoured: its file goes once the checkpoint is complete (persist)
            barrier.mark(at, CAPTURED, final)
            self.last_save = time.monotonic()
            logger.info(
                "checkpoint %s: captured in %.3f s (%s; persisting %s in the background)",
                at.where,
                captured.paused,
                at,
                staging,
            )
        else:
            final = barrier.wait(at, CAPTURED, "CPU trainer 0's capture")
        # the next increment's previous link (complete once this one persisted: the next decision waits for it)
        self.previous = final

    def persist(self, runtime: Any, captured: Captured) -> str:
        """Trainer 0, in the background (runtime/checkpoint_persist.py; a test's fault holds it at the hook)."""
        hooks.call("before_persist", captured)
        label = f"{self.every:g}m" if self.unit == "minutes" else f"{int(self.every)}"
        return checkpoint_persist.persist(self.root, label, runtime, captured)

    def wait_persisted(self, what: str) -> None:
        """Until the checkpoint persisting in the background is complete (its failure raised here: the trainer
        ends, loudly, as a failed checkpoint ends it)."""
        persisting, self.persisting = self.persisting, None
        if persisting is None:
            return
        if not persisting.done.is_set():
            logger.info("%s: waits for the previous checkpoint to persist (at most one in flight)", what)
        final = persisting.wait()
        self.last_bytes = dir_bytes(final)


def full_save_mode() -> int:
    """The ``save_persistables`` mode of a full checkpoint when every checkpoint is full (:func:`base_save_mode`,
    over every copy of the job's strategy); said in the log when it is 0."""
    from heterps_paddle.runtime import checkpoint_deltas  # lazy: imports Paddle when it runs

    runtime = seam.fleet_runtime()
    names = checkpoint_deltas.sparse_table_names(runtime)
    mode, why = base_save_mode([s.sparse_table_configs for s in seam.job_strategies(runtime)], names)
    if why:
        logger.info("checkpoints: full saves gzipped inside the pause (mode 0): %s", why)
    return mode


def base_save_mode(table_configs: Iterable[Any], names: Iterable[str]) -> tuple[int, str | None]:
    """2, Paddle's "base" save (every row as plain text, which trainer 0 compresses after the pause), where it writes
    every row of the sparse tables ``names``: their accessor's ``base_threshold`` is 0 in every one of
    ``table_configs`` (strategies' ``sparse_table_configs``; the_one_ps sets 0 unless the script sets it; a base also
    leaves out rows unseen for more than ``delta_keep_days`` saves of mode 3, which the launch never makes).  Else
    0, Paddle's "checkpoint" save, which the servers gzip inside the pause (docs/checkpoints.md, "The pause"), with
    the setting that rules the base out."""
    from heterps_paddle.runtime.checkpoint_deltas import KEY, base_threshold

    wanted = set(names)
    for tables in table_configs:
        for entry in tables:
            param = entry.accessor.ctr_accessor_param
            if entry.table_name in wanted and base_threshold(param) > 0:
                field = KEY.format(table=entry.table_name, field="base_threshold")
                return 0, f"{field} = {base_threshold(param):g} would leave rows out of a base save"
    return 2, None


def install(ctx: seam.ProcessContext) -> None:
    """On every process of a launch keeping checkpoints: the sparse tables' shard count (runtime/table_shards.py)
    and, keeping incremental ones, their delta threshold (after minimize); on a stage 1 CPU trainer: the pass gate
    and the save hook."""
    if not settings.get("HETERPS_CHECKPOINT_DIR"):
        return
    ctx.after_minimize["table_shards"] = lambda fleet: table_shards.configure(getattr(resume_choice(), "path", None))
    if base_interval() > 1:
        from heterps_paddle.runtime import checkpoint_deltas  # lazy: imports Paddle when it runs

        ctx.after_minimize["incremental_checkpoints"] = checkpoint_deltas.configure
    if ctx.role != "trainer":
        return
    choice = resume_choice()
    if choice is None:
        return
    every = cast(tuple[float, str], settings.get("HETERPS_CHECKPOINT_EVERY"))
    passes = PassCheckpoints(choice, every)
    if base_interval() <= 1:
        ctx.after_minimize["full_checkpoint_mode"] = lambda fleet: setattr(passes, "full_mode", full_save_mode())
    # the last checkpoint complete (or its failure raised) before the trainer's process ends
    ctx.after_stop_worker["checkpoint_persisted"] = lambda: passes.wait_persisted("the trainer's end")
    ctx.pass_gate = passes.gate
    ctx.pass_runner = passes.run_pass
    ctx.dataset_hooks["launch_checkpoints"] = passes.hook
