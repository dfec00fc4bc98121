"""A stage 1 CPU trainer's training pass pulled from the job's data plan (data_plan.py), at default settings.

The script's one ``train_from_dataset`` call of a pass is unchanged for it: here the trainer offers the files the
script gave the dataset (named by content, runtime/file_identity.py), then, until the plan says the pass ended for
it, takes the next shards (one a reader thread), trains them by Paddle's own ``train_from_dataset`` on those files,
and says them done.  A fast trainer so trains more of the pass and a slow one less: a slow host no longer bounds the
pass.  Every call keeps the dataset's reader threads as the script set them: a call handed fewer files than threads
is padded with an empty file of this process's (0 samples).  Paddle would otherwise lower the dataset's
``thread_num`` to the files of the call, and a heterogeneous pipeline's trainer instance, which Paddle keeps from
the first call of a program to the next (``Executor._run_from_dataset``, ``HeterPipelineTrainer::ResetDataset``),
refuses any other count: ``change Dataset thread_num is not supported``.  A call of only empty files is not run (it
trains nothing).  While a call runs, its bytes trained so far (the meter's count of its samples) are told to the
plan once a second, where the plan takes them (``progress``).  Each call costs Paddle 0.1 s or more of its own: its trainer's end flushes the parameter-server client,
which sleeps 100 ms before it looks (``BrpcPsClient::Flush``; docs/data-plan.md has the figures by file size).  The
dataset's file list and thread count are as the script set them again after the pass.

Where it does not apply, the script's own split stands, said once with why: one trainer, an ``InMemoryDataset``
(loaded before the call), a dataset without a file list, a pass that trains nothing (an evaluation program).

A checkpoint inside a pass (runtime/launch_checkpoints.py) comes between two calls: ``wanted`` says whether one is
asked for or due, the plan stops handing out shards, and each trainer, holding none, is told to ``meet``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence, cast

from heterps_paddle import rendezvous, settings
from heterps_paddle.data_plan.names import parse
from heterps_paddle.errors import HeterPSError
from heterps_paddle.log import logger
from heterps_paddle.runtime import hooks, range_feed, seam
from heterps_paddle.runtime.file_identity import name_of

POLL_S = (0.05, 1.0)  # a wait's first poll of the data plan, and its longest (each poll a connection across hosts)
PROGRESS_S = 1.0  # a running call's progress told to the data plan at most this often
PAGE_BYTES = 3 << 18  # an offer's names and paths a request (768 KiB as JSON): the control line is 1 MiB at most
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
        self.reports = True  # whether the plan takes ``progress`` (a plan without the request says so once)

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
        done_before: Sequence[str] = (),
        held_before: int = 0,
        wanted: Callable[[], str | None] = lambda: None,
        meet: Callable[[int, int], None] = lambda hold, shards: None,
    ) -> tuple[Any, PassTrained]:
        """Pass ``number`` pulled: ``done_before`` the shards a checkpoint holds already (a name may repeat: a file
        offered by N trainers is N shards), taken at ``held_before`` of the pass's shards (a checkpoint of the pass
        is named after it); between calls ``wanted()`` names a checkpoint asked for or due (the plan holds), and
        ``meet(hold, shards of the pass)`` makes it."""
        dataset = call.dataset
        files, threads = list(dataset.filelist), int(getattr(dataset, "thread_num", 1) or 1)
        offered = [[name_of(path), path] for path in files]
        own = set(files)
        range_bytes = int(cast(int, settings.get("HETERPS_RANGE_BYTES")))
        # every file of the offer local and uncompressed: its large files are cut into ranges (runtime/range_feed.py)
        cut = range_bytes if range_bytes and all(range_feed.cuttable(path) for path in files) else 0
        pages = offer_pages(sorted(done_before), offered)
        for page, (done_page, files_page) in enumerate(pages):
            offer = {
                "do": "offer",
                "pass": number,
                "trainers": self.trainers,
                "files": files_page,
                "done_before": done_page,
                "held_before": held_before,
                **({"ranges": cut} if cut else {}),
            }
            reply = self.ask(offer if len(pages) == 1 else {**offer, "page": page, "pages": len(pages)})
        say_offer(number, reply, files)
        progress = PassProgress(number, call, threads)
        result: Any = None
        trained: list[str] = []
        calls, padded, waited = 0, 0, 0.0
        wait_s = float(cast(float, settings.get("HETERPS_CHECKPOINT_WAIT_S")))
        poll = POLL_S[0]
        try:
            while True:
                ask = wanted()
                if ask is not None:
                    self.ask({"do": "hold", "pass": number, "ask": ask})
                reply = self.ask({"do": "take", "pass": number, "want": max(1, threads)})
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
                with handed_to_paddle(number, paths) as (handed, trains):
                    if not trains:
                        # nothing to train: Paddle is not called (a call costs 0.1 s of its own, and trains no batch)
                        self.ask({"do": "finish", "pass": number, "shards": [name for name, _ in paths]})
                        trained.extend(path for _, path in paths)
                        continue
                    dataset.set_filelist(call_files(handed, threads))
                    dataset.thread_num = threads  # Paddle lowers it to the files of the call, for good
                    with self._reporting(number, handed), progress.calling(call, handed):
                        result = run(call)
                calls += 1
                padded += len(handed) < threads
                self.ask({"do": "finish", "pass": number, "shards": [name for name, _ in paths]})
                trained.extend(path for _, path in paths)
        finally:
            dataset.thread_num = threads
        logger.info(
            "data plan: pass %d: %d shards trained here in %d calls (%d padded to the dataset's %d reader threads; %d "
            "of its files offered, %d shards done before; %.1f s waited for the others)",
            number,
            len(trained),
            calls,
            padded,
            threads,
            len(files),
            len(done_before),
            waited,
        )
        return result, PassTrained(tuple(trained), calls, waited)

    @contextlib.contextmanager
    def _reporting(self, number: int, paths: list[str]) -> Iterator[None]:
        """While a call of the shards at ``paths`` runs: its bytes trained so far told to the plan (``progress``)
        at most every :data:`PROGRESS_S`, from the meter's count of its samples times the shards' bytes a line."""
        from heterps_paddle.runtime import meter  # lazy: imports Paddle (launch_checkpoints' module doc)

        running = meter.current()
        lines = meter.dataset_samples_of(paths) if running is not None and self.reports else None
        if running is None or not lines:
            yield
            return
        per_line = sum(os.path.getsize(p) for p in paths if os.path.isfile(p)) / lines
        stop = threading.Event()

        def report() -> None:
            told = 0
            while self.reports and not stop.wait(PROGRESS_S):
                samples = running.call_samples()
                done = int((samples or 0) * per_line)
                if done > told:
                    told = done
                    self._progress(number, done)

        thread = threading.Thread(target=report, name="heterps-data-plan-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(PROGRESS_S * 5)

    def _progress(self, number: int, done: int) -> None:
        """``progress``: this trainer's running call has trained ``done`` bytes.  A plan that does not take the
        request (it answers an error naming it unknown) is told no more, silently; any other error is said once,
        and no more progress is told (it is never the job's end)."""
        try:
            self.ask({"do": "progress", "pass": number, "bytes": done})
        except DataPlanFailed as exc:
            self.reports = False
            if "unknown request" not in str(exc):
                logger.warning("data plan: a call's progress could not be told to the plan (%s); no more is", exc)

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
            if seen == whole_file(name):
                readable.append([name, path])
                continue
            why = "not a file here" if seen is None else f"another content here ({seen})"
            logger.warning("data plan: pass %d: shard %s at %s: %s; given back", number, name, path, why)
            self.ask({"do": "give_back", "pass": number, "shard": name, "unreadable": True})
        return readable


def offer_pages(done_before: list[str], offered: list[list[str]]) -> list[tuple[list[str], list[list[str]]]]:
    """An offer cut into pages whose request stays under the control line's limit (control.MAX_LINE; each page's
    names and paths at most :data:`PAGE_BYTES` as JSON): ``done_before`` first (a copy done before must be counted
    before any file is handed out), then the files; one page where all fit."""
    pages: list[tuple[list[str], list[list[str]]]] = [([], [])]
    size = 0
    items: list[str | list[str]] = [*done_before, *offered]
    for item in items:
        cost = len(json.dumps(item)) + 2
        if size + cost > PAGE_BYTES and (pages[-1][0] or pages[-1][1]):
            pages.append(([], []))
            size = 0
        if isinstance(item, str):
            pages[-1][0].append(item)
        else:
            pages[-1][1].append(item)
        size += cost
    return pages


def is_empty(path: str) -> bool:
    """Whether ``path`` is a local file of no bytes (it trains no sample)."""
    return os.path.isfile(path) and os.path.getsize(path) == 0


@contextlib.contextmanager
def handed_to_paddle(number: int, paths: list[list[str]]) -> Iterator[tuple[list[str], bool]]:
    """For one call of the shards ``paths`` (``[name, path]``): what Paddle's readers are handed (a byte range's
    pipe for a range: :func:`readable_path`), and whether any of it holds a sample.  A range its reader did not
    read whole, once the call is over, ends the pass, named."""
    with range_feed.RangeFeeds() as feeds:
        handed = [readable_path(name, path, feeds) for name, path in paths]
        try:
            yield handed, not all(is_empty(path) for path in handed)
        finally:
            for path in feeds.lines:
                meter_note(path, None)
    if feeds.errors:
        raise DataPlanFailed(f"{seam.identity()}: pass {number}: a byte range not read whole: {feeds.errors[0]}")


def whole_file(name: str) -> str:
    """The content name of the file a shard is of (itself, or the file a range of it is cut from)."""
    parsed = parse(name)
    return name if parsed is None else parsed.file


def readable_path(name: str, path: str, feeds: range_feed.RangeFeeds) -> str:
    """What Paddle's reader is handed for the shard ``name`` at ``path``: the file itself, or for a byte range of
    it a pipe of ``feeds`` that gives the range's lines (its samples counted for the pass's figures)."""
    parsed = parse(name)
    if parsed is None or parsed.start is None or parsed.end is None:
        return path
    found = range_feed.span(path, parsed.start, parsed.end)
    if not found.lines:
        return empty_file()  # a range inside one line: nothing to read, and no pipe that no reader would open
    fifo = feeds.feed(path, found, name)
    meter_note(fifo, found.lines)
    return fifo


def meter_note(path: str, lines: int | None) -> None:
    from heterps_paddle.runtime import meter  # lazy: imports Paddle (launch_checkpoints' module doc)

    meter.note_samples(path, lines)


_padding: list[str] = []  # this process's empty file (made once), that pads a call to the dataset's threads


def call_files(paths: list[str], threads: int) -> list[str]:
    """The file list of one call of the shards at ``paths``: padded to ``threads`` files (the dataset's reader
    threads as the script set them) with an empty file of this process's, so that Paddle keeps the thread count
    (module doc)."""
    if len(paths) >= threads:
        return list(paths)
    return [*paths, *[empty_file()] * (threads - len(paths))]


def empty_file() -> str:
    """This process's empty file (made once, removed at its exit)."""
    if not _padding or not os.path.isfile(_padding[0]):
        handle, path = tempfile.mkstemp(prefix="heterps-empty-", suffix=".data")
        os.close(handle)
        atexit.register(_remove, path)
        _padding[:] = [path]
    return _padding[0]


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def say_offer(number: int, reply: Mapping[str, Any], files: list[str]) -> None:
    """Once a pass, at this trainer's offer: what it offered, and the pass as the plan's answer gives it (its files,
    shards, those offered by more than one trainer, the empty ones) where it does, else the shards offered so far."""
    empty = sum(1 for path in files if is_empty(path))
    here = f"{len(files)} files offered here" + (f" ({empty} empty)" if empty else "")
    shared, empty_files = reply.get("shared", reply.get("shared_files")), reply.get("empty", reply.get("empty_files"))
    if "files" in reply and "shards" in reply and shared is not None:
        whole = (
            f"the pass: {reply['files']} files, {reply['shards']} shards, {shared} offered by more than one trainer"
            + (f", {empty_files} empty (skipped)" if empty_files is not None else "")
        )
    else:
        whole = f"{reply.get('shards', '?')} shards offered so far"
    logger.info("data plan: pass %d: %s; %s", number, here, whole)


class PassProgress:
    """A pulled pass's progress lines.  Paddle prints a call's fetched values (loss, AUC) every ``print_period``
    batches of that call's thread 0, so a pass pulled in calls shorter than that would print none.  A call that
    takes the pass's batches past a multiple of ``print_period`` but is too short for Paddle's line runs with a
    period its thread 0 reaches (half its share of the call's batches): Paddle's own line, with the script's
    fetched values, comes once there, and a line of the pass's batches so far beside it.  A split plan's stage 1
    prints its pass's lines from the last stage's figures already (runtime/stage_metrics.py)."""

    def __init__(self, number: int, call: seam.DatasetCall, threads: int) -> None:
        self.number = number
        self.threads = max(1, threads)
        self.period = int(call.options.get("print_period", 100) or 100)
        try:
            self.batch = int(call.dataset.proto_desc.batch_size) or 1
        except (AttributeError, TypeError, ValueError):
            self.batch = 1
        self.on = bool(call.options.get("fetch_list")) and not seam.is_heter_section(call.main_program())
        self.samples = 0

    @contextlib.contextmanager
    def calling(self, call: seam.DatasetCall, paths: list[str]) -> Iterator[None]:
        """Around the call of the shards at ``paths``: its print period, and after it the pass's count."""
        if not self.on:
            yield
            return
        from heterps_paddle.runtime import meter  # lazy: imports Paddle (launch_checkpoints' module doc)

        lines = meter.dataset_samples_of(paths) or 0
        every = self.period * self.batch
        before, after = self.samples, self.samples + lines
        crosses = after // every > before // every
        short = lines < every * self.threads  # thread 0 of this call reads fewer than print_period batches
        asked = call.options.get("print_period")
        if crosses and short:
            call.options["print_period"] = max(1, lines // (self.batch * self.threads) // 2)
        try:
            yield
        finally:
            call.options["print_period"] = asked
            if asked is None:
                del call.options["print_period"]
        self.samples = after
        if crosses and short:
            logger.info(
                "data plan: pass %d: %d batches (%d samples) trained here so far",
                self.number,
                self.samples // self.batch,
                self.samples,
            )


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
