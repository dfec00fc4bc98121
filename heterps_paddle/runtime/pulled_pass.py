"""A stage 1 CPU trainer's training pass pulled from the job's data plan (data_plan.py), at default settings.

The script's one ``train_from_dataset`` call of a pass is unchanged for it: here the trainer offers the files the
script gave the dataset (named by content, runtime/file_identity.py), then, until the plan says the pass ended for
it, takes the next shards (one a reader thread), trains them by Paddle's own ``train_from_dataset`` on those files,
and says them done.  A fast trainer so trains more of the pass and a slow one less: a slow host no longer bounds the
pass.  Each call costs Paddle 0.1 s or more of its own: its trainer's end flushes the parameter-server client,
which sleeps 100 ms before it looks (``BrpcPsClient::Flush``; docs/data-plan.md has the figures by file size).  The
dataset's file list and thread count are as the script set them again after the pass.

Where it does not apply, the script's own split stands, said once with why: one trainer, an ``InMemoryDataset``
(loaded before the call), a dataset without a file list, a pass that trains nothing (an evaluation program).

A checkpoint inside a pass (runtime/launch_checkpoints.py) comes between two calls: ``wanted`` says whether one is
asked for or due, the plan stops handing out shards, and each trainer, holding none, is told to ``meet``.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, cast

from heterps_paddle import rendezvous, settings
from heterps_paddle.errors import HeterPSError
from heterps_paddle.log import logger
from heterps_paddle.runtime import hooks, seam
from heterps_paddle.runtime.file_identity import name_of

POLL_S = (0.05, 1.0)  # a wait's first poll of the data plan, and its longest (each poll a connection across hosts)
# Ops that write to the parameter servers: a train_from_dataset pass whose program runs one trains the model (an
# evaluation program, fleet.evaluation.forward_only_program or the whole model's forward pass, has none).
WRITE_OPS = frozenset(
    {"distributed_push_sparse", "push_sparse", "push_sparse_v2", "push_dense", "send", "send_and_recv"}
)


def is_training_pass(program: Any) -> bool:
    return any(op.type in WRITE_OPS for block in program.blocks for op in block.ops)


class DataPlanFailed(HeterPSError, RuntimeError):
    """The data plan refused a request or could not be reached: the trainer ends, naming it."""


@dataclass(frozen=True)
class PassTrained:
    """What one trainer's pulled pass did: the paths it trained and the calls."""

    paths: tuple[str, ...]
    calls: int
    waited_s: float


class Puller:
    """This trainer's side of the data plan: trainer ``index`` of ``trainers`` on ``board``."""

    def __init__(self, board: rendezvous.Board, trainers: int, index: int) -> None:
        self.board = board
        self.trainers = trainers
        self.index = index
        self.said: set[str] = set()

    def why_not(self, call: seam.DatasetCall) -> str | None:
        """Why this pass keeps the script's own split (None: it is pulled)."""
        if self.trainers < 2:
            return "one trainer"
        if hasattr(call.dataset, "load_into_memory"):
            return "an InMemoryDataset is loaded before train_from_dataset: its files cannot be handed out"
        if getattr(call.dataset, "filelist", None) is None:
            return "the dataset has no file list"
        if seam.context().pass_syncs.get(call.main_program()) is not None:
            # runtime/gpu_embedding.py: each unit loads the pass's working set, the ids of its own files, into its
            # table as the pass starts, and the units meet at the pass's start and end: a shard of another
            # trainer's files would look up ids outside it
            return "its embeddings are in the GPU table, which loads each pass's ids from this trainer's own files"
        return None

    def say_once(self, why: str) -> None:
        if why not in self.said and why != "one trainer":
            self.said.add(why)
            logger.info("data plan: this trainer trains its script's own split of the files (%s)", why)

    def ask(self, message: Mapping[str, Any]) -> dict[str, Any]:
        try:
            return self.board.shards({**message, "trainer": self.index})
        except HeterPSError as exc:
            raise DataPlanFailed(f"{seam.identity()}: the job's data plan: {exc}") from None

    def run_pass(
        self,
        number: int,
        call: seam.DatasetCall,
        run: Callable[[seam.DatasetCall], Any],
        done_before: frozenset[str] = frozenset(),
        held_before: int = 0,
        wanted: Callable[[], str | None] = lambda: None,
        meet: Callable[[int, int], None] = lambda hold, shards: None,
    ) -> tuple[Any, PassTrained]:
        """Pass ``number`` pulled: ``done_before`` the shards a checkpoint holds already (taken at ``held_before`` of
        the pass's shards: a checkpoint of the pass is named after it); between calls ``wanted()``
        names a checkpoint asked for or due (the plan holds), and ``meet(hold, shards of the pass)`` makes it."""
        dataset = call.dataset
        files, threads = list(dataset.filelist), int(getattr(dataset, "thread_num", 1) or 1)
        offered = [[name_of(path), path] for path in files]
        own = set(files)
        least = progress_bytes(call, files)
        self.ask(
            {
                "do": "offer",
                "pass": number,
                "trainers": self.trainers,
                "files": offered,
                "done_before": sorted(done_before),
                "held_before": held_before,
            }
        )
        result: Any = None
        trained: list[str] = []
        calls, waited = 0, 0.0
        wait_s = float(cast(float, settings.get("HETERPS_CHECKPOINT_WAIT_S")))
        poll = POLL_S[0]
        try:
            while True:
                ask = wanted()
                if ask is not None:
                    self.ask({"do": "hold", "pass": number, "ask": ask})
                reply = self.ask({"do": "take", "pass": number, "want": max(1, threads), "least": least})
                if "wait" in reply:
                    if waited > wait_s:
                        raise DataPlanFailed(
                            f"{seam.identity()}: pass {number} of the job's data plan: waited {waited:.0f} s "
                            f"(HETERPS_CHECKPOINT_WAIT_S): {reply['wait']}"
                        )
                    start = time.monotonic()
                    time.sleep(poll)
                    poll = min(poll * 2, POLL_S[1])
                    waited += time.monotonic() - start
                    continue
                poll = POLL_S[0]
                if "meet" in reply:
                    meet(int(reply["meet"]), int(reply["shards_in_pass"]))
                    continue
                if "end" in reply:
                    break
                paths = self._readable(number, reply["shards"], own)
                if not paths:
                    continue
                dataset.set_filelist([path for _, path in paths])
                dataset.thread_num = threads  # Paddle lowers it to the files of the call, for good
                result = run(call)
                calls += 1
                self.ask({"do": "finish", "pass": number, "shards": [name for name, _ in paths]})
                trained.extend(path for _, path in paths)
        finally:
            dataset.thread_num = threads
        logger.info(
            "data plan: pass %d: %d shards trained here in %d calls (%d of its files offered, %d shards done before; "
            "%.1f s waited for the others)",
            number,
            len(trained),
            calls,
            len(files),
            len(done_before),
            waited,
        )
        return result, PassTrained(tuple(trained), calls, waited)

    def _readable(self, number: int, shards: list[list[str]], own: set[str]) -> list[list[str]]:
        """The shards handed to this trainer that it reads as they are named: its own paths (``own``), else
        another trainer's path holding this content here (a local file is named again: another host's file may
        be a different one here under the same path).  The others are given back, never handed to it again."""
        readable = []
        for name, path in shards:
            if path in own or ("://" in path and name == path):
                readable.append([name, path])
                continue
            try:
                seen = name_of(path) if os.path.isfile(path) else None
            except HeterPSError:
                seen = None
            if seen == name:
                readable.append([name, path])
                continue
            why = "not a file here" if seen is None else f"another content here ({seen})"
            logger.warning("data plan: pass %d: shard %s at %s: %s; given back", number, name, path, why)
            self.ask({"do": "give_back", "pass": number, "shard": name, "unreadable": True})
        return readable


def progress_bytes(call: seam.DatasetCall, files: list[str]) -> int:
    """The bytes of data a call is to train at least for the script's progress lines: Paddle prints them every
    ``print_period`` batches of a call (100 by default), and a call of fewer batches prints none; 0 when the call
    fetches nothing.  A line's bytes from the script's first local file."""
    if not call.options.get("fetch_list"):
        return 0
    period = int(call.options.get("print_period", 100) or 100)
    try:
        batch = int(call.dataset.proto_desc.batch_size) or 1
    except (AttributeError, TypeError, ValueError):
        batch = 1
    sample = next((f for f in files if os.path.isfile(f) and os.path.getsize(f) > 0), None)
    if sample is None:
        return 0
    with open(sample, "rb") as f:
        lines = sum(1 for _ in f)
    return int(period * batch * os.path.getsize(sample) / max(1, lines))


def puller() -> Puller | None:
    """This process's puller: a stage 1 CPU trainer of ``heterps launch`` (its id names the round's data plan,
    served by the coordinator across hosts, a file of the round's board on one host); None elsewhere (a job of
    Paddle's launcher alone has no one plan across its hosts)."""
    board = rendezvous.board()
    if board is None or not os.environ.get(rendezvous.LAUNCH_ID_ENV):
        return None
    if settings.get("HETERPS_DATA_PLAN") == "static":
        logger.info("data plan: HETERPS_DATA_PLAN=static: every trainer trains the files its script gave it")
        return None
    trainers, index = seam.worker_count_and_index(seam.role_maker())
    return Puller(board, trainers, index)


class PulledPasses:
    """A launch without checkpoints: each training pass pulled (the checkpoints' passes do it themselves,
    runtime/launch_checkpoints.py)."""

    def __init__(self) -> None:
        self.passes = 0
        self.puller: Puller | None = None
        self.started = False

    @contextlib.contextmanager
    def hook(self, call: seam.DatasetCall) -> Iterator[None]:
        """The dataset's file list as the script set it, after the pass (registered before the other hooks: their
        ends see the files trained here)."""
        files = getattr(call.dataset, "filelist", None)
        try:
            yield
        finally:
            if files is not None and getattr(call.dataset, "filelist", None) != files:
                call.dataset.set_filelist(files)

    def run_pass(self, call: seam.DatasetCall, run: Callable[[seam.DatasetCall], Any]) -> Any:
        if not is_training_pass(call.main_program()):
            return run(call)
        self.passes += 1
        run = hooks.around_train_run(self.passes, run)
        if not self.started:
            self.started, self.puller = True, puller()
        why = "not launched by heterps launch" if self.puller is None else self.puller.why_not(call)
        if why is not None or self.puller is None:
            if self.puller is not None:
                self.puller.say_once(str(why))
            return run(call)
        result, trained = self.puller.run_pass(self.passes, call, run)
        call.dataset.set_filelist(list(trained.paths))  # the hooks' ends see the files trained here
        return result


def install(ctx: seam.ProcessContext) -> None:
    """On a stage 1 CPU trainer of a launch without checkpoints (which pull their passes themselves)."""
    if ctx.role != "trainer" or ctx.pass_runner is not None or not os.environ.get(rendezvous.LAUNCH_ID_ENV):
        return
    passes = PulledPasses()
    ctx.dataset_hooks["data_plan"] = passes.hook
    ctx.pass_runner = passes.run_pass
