"""One pass's shards (:class:`PassShards`): who offered which file, how many copies of each are free, held, done.

A pass is the multiset of the trainers' offers: a file (one content name) that N trainers offered, or one trainer
listed N times, is N shards, its copies, each trained once by whoever is free, as plain Paddle trains a file
every trainer was given once in each of them.  A copy has no name of its own: a trainer holds, finishes and gives
back copies of a name, and the pass keeps counts per name.  An empty file (0 bytes by its content name) is no
shard: it is counted, never handed out.

Every request costs O(log n) or amortised O(1) in the pass's shards, whatever the trainers: each figure a rule
reads (the bytes free, each trainer's bytes in hand, the paces of the trainers still in the pass) is a running
total kept as the copies move, and the next shard comes off its trainer's heap of its own files (by the order
they were first offered; an entry of a name no longer free leaves it lazily), then off a tree of the names with a
free copy (free_index.py).
"""

from __future__ import annotations

import heapq
from typing import Any, Mapping

from heterps_paddle.data_plan.bounds import MAX_SHARDS, DataPlanError
from heterps_paddle.data_plan.free_index import FreeIndex
from heterps_paddle.data_plan.names import parse, ranges, size_of

# The longest a call trains once paces are known: each call costs Paddle 0.1-0.3 s of its own (its trainer's end
# flushes the parameter-server client, which sleeps 100 ms first: docs/data-plan.md), 1-3% of a call of 10 s.
CALL_S = 10.0
QUEUED_OFFERERS = 16  # a name free again goes back on its offerers' own heaps where it has at most this many


class Paces:
    """Each trainer's pace, bytes a second: of its last call, or of its call so far (a progress report), kept from
    pass to pass.  A pace is never zero nor guessed: a trainer without one has none (:meth:`get` is None)."""

    def __init__(self, rates: dict[int, float] | None = None) -> None:
        self.rates: dict[int, float] = dict(rates or {})

    def get(self, trainer: int) -> float | None:
        return self.rates.get(trainer)


class Shard:
    """One content name of a pass: ``copies`` offered, ``done`` this round, ``done_before`` by the checkpoint the
    round resumed from, ``held`` in trainers' hands; ``paths``: where each trainer that offered it sees it."""

    __slots__ = ("index", "name", "size", "first", "paths", "copies", "done", "done_before", "held", "unreadable")

    def __init__(self, index: int, name: str) -> None:
        self.index = index
        self.name = name
        parsed = parse(name)
        self.size = 1 if parsed is None else parsed.shard_bytes
        self.first = parsed is None or not parsed.start  # a whole file, or its first range (a file, counted once)
        self.paths: dict[int, str] = {}
        self.copies = 0
        self.done = 0
        self.done_before = 0
        self.held = 0
        self.unreadable: list[int] = []  # trainers that gave it back unread: it is never handed to them again

    def resumed(self) -> int:
        """Copies the checkpoint resumed from holds, of those offered."""
        return min(self.done_before, self.copies)

    def free(self) -> int:
        return max(0, self.copies - self.resumed() - self.done - self.held)

    def finished(self) -> bool:
        return self.done + self.resumed() >= self.copies


class OfferPages:
    """One trainer's offer as it comes, a page a request: each page's digest (a page sent again must be the same),
    the copies of each name its pages said the checkpoint resumed from holds, and how many pages there are."""

    __slots__ = ("pages", "digests", "done_before")

    def __init__(self, pages: int, digests: list[str] | None = None, done_before: dict[str, int] | None = None):
        self.pages = pages
        self.digests: list[str] = list(digests or [])
        self.done_before: dict[str, int] = dict(done_before or {})

    @property
    def complete(self) -> bool:
        return len(self.digests) == self.pages


class PassShards:
    """One pass's shards, taken by ``trainers`` trainers at their ``paces`` (shared with the plan's other passes)."""

    def __init__(self, number: int, trainers: int, paces: Paces) -> None:
        self.number = number
        self.trainers = trainers
        self.paces = paces
        self.shards: dict[str, Shard] = {}  # by content name, in the order first offered
        self.empty: dict[str, None] = {}  # empty files offered (no shard)
        self.offered: set[int] = set()  # trainers whose offer is complete
        self.offer_pages: dict[int, OfferPages] = {}
        self.held_by: dict[int, dict[str, int]] = {}  # trainer -> copies in hand, by name
        self.held_bytes: dict[int, int] = {}
        self.call_start: dict[int, float] = {}  # trainer -> when its call in hand was taken (the plan's clock)
        self.foreign: dict[str, dict[int, int]] = {}  # copies held by trainers that did not offer the name
        self.ended: set[int] = set()
        self.holding: set[int] = set()  # trainers still to be told to meet for the checkpoint asked last
        self.held_at = 0
        self.asks_honoured: list[str] = []
        self.shared_from: set[int] = set()  # trainers whose paths another trainer trained a shard at
        self.unreadable_pairs = 0
        # running totals
        self.total_shards = self.free_shards = self.free_bytes = 0
        self.done_shards = self.held_shards = self.held_total = self.resumed_shards = self.shared_files = 0
        self.files = 0  # names offered (not empty)
        self.sole_unfinished: dict[int, int] = {}  # trainer -> its names no other offered, not all copies done
        self.active_sum = 0.0  # the paces of the trainers that have not ended the pass
        self.active_unknown = trainers  # ... and how many of them have none
        for trainer, rate in paces.rates.items():
            self.pace_changed(trainer, None, rate)
        self._own: dict[int, list[tuple[int, str]]] = {}  # trainer -> heap of its names that may be free
        self._free = FreeIndex()  # the indices of the names with a free copy
        self._by_index: list[Shard] = []
        self._done_sorted: list[str] | None = None

    # -- the running totals -------------------------------------------------------------------------------------

    def _count(self, shard: Shard, sign: int) -> None:
        free = shard.free()
        self.total_shards += sign * shard.copies
        self.free_shards += sign * free
        self.free_bytes += sign * free * shard.size
        self.resumed_shards += sign * shard.resumed()
        if len(shard.paths) > 1:
            self.shared_files += sign
        elif shard.paths and not shard.finished():
            only = next(iter(shard.paths))
            self.sole_unfinished[only] = self.sole_unfinished.get(only, 0) + sign

    def _queue(self, shard: Shard) -> None:
        """A name free again on its offerers' own heaps: where it has few (a file every one of a thousand trainers
        offered would cost a thousand pushes each time a copy came free), it stays in the tree of free names
        alone, which hands it out in the same order and at the trainer's own path."""
        if len(shard.paths) > QUEUED_OFFERERS:
            return
        entry = (shard.index, shard.name)
        for trainer in shard.paths:
            heapq.heappush(self._own.setdefault(trainer, []), entry)

    def _new_shard(self, name: str) -> Shard:
        if len(self.shards) >= MAX_SHARDS:
            raise DataPlanError(f"pass {self.number}: over {MAX_SHARDS} names")
        shard = self.shards[name] = Shard(len(self.shards), name)
        self._by_index.append(shard)
        return shard

    def _change(self, shard: Shard, sign: int, was_free: int = 0) -> None:
        """Before (``sign`` -1) and after (+1) a change to ``shard``: the totals; after, a name free again queued."""
        self._count(shard, sign)
        if sign > 0:
            free = shard.free()
            self._free.set(shard.index, free > 0)
            if free > 0 and was_free == 0:
                self._queue(shard)

    def pace_changed(self, trainer: int, old: float | None, new: float) -> None:
        """The plan measured ``trainer``'s pace ``new`` (it was ``old``)."""
        if not 0 <= trainer < self.trainers or trainer in self.ended:
            return
        self.active_sum += new - (old or 0.0)
        if old is None:
            self.active_unknown -= 1

    def _end(self, trainer: int) -> None:
        if trainer in self.ended:
            return
        pace = self.paces.get(trainer)
        if pace is None:
            self.active_unknown -= 1
        else:
            self.active_sum -= pace
        self.ended.add(trainer)

    # -- offers -------------------------------------------------------------------------------------------------

    @property
    def opened(self) -> bool:
        return len(self.offered) == self.trainers

    def add_files(self, trainer: int, files: list[tuple[str, str]], cut: int = 0) -> None:
        """Trainer ``trainer``'s files (a page of its offer): a copy of each name each time it lists it; ``cut``
        (the trainer reads byte ranges, of at most so many bytes; 0: it does not): a file over ``cut`` bytes is its
        ranges, a copy of each."""
        pieces = [(piece, path) for name, path in files for piece in ranges(name, cut)] if cut else files
        for name, path in pieces:
            shard = self.shards.get(name)
            if shard is None:
                if size_of(name) == 0:
                    if len(self.empty) >= MAX_SHARDS:
                        raise DataPlanError(f"pass {self.number}: over {MAX_SHARDS} empty files")
                    self.empty[name] = None
                    continue
                shard = self._new_shard(name)
            if self.total_shards >= MAX_SHARDS:
                raise DataPlanError(f"pass {self.number}: over {MAX_SHARDS} shards")
            was_free, new_offerer = shard.free(), trainer not in shard.paths
            self._change(shard, -1)
            if not shard.copies and shard.first:
                self.files += 1
            shard.copies += 1
            shard.paths.setdefault(trainer, path)
            self._change(shard, +1, was_free)
            if new_offerer and shard.free() > 0 and (was_free > 0 or len(shard.paths) > QUEUED_OFFERERS):
                heapq.heappush(self._own.setdefault(trainer, []), (shard.index, name))
        self._done_sorted = None

    def add_done_before(self, counts: dict[str, int]) -> None:
        """The copies of each name the checkpoint the round resumed from holds (every trainer says the same: the
        most any says)."""
        for name, count in counts.items():
            shard = self.shards.get(name)
            if shard is None:  # not offered (yet): kept, for the done list and for an offer to come
                if size_of(name) == 0:
                    continue
                shard = self._new_shard(name)
            if count > shard.done_before:
                self._change(shard, -1)
                shard.done_before = count
                self._change(shard, +1, 1)
        self._done_sorted = None

    def figures(self) -> dict[str, int]:
        """The pass's figures, for its log line: files and shards offered, files more than one trainer offered,
        empty files skipped, trainers that offered of all."""
        return {
            "files": self.files,
            "shards": self.total_shards,
            "shared_files": self.shared_files,
            "empty_files": len(self.empty),
            "offered": len(self.offered),
            "trainers": self.trainers,
        }

    # -- take -----------------------------------------------------------------------------------------------------

    def take(self, trainer: int, want: int, now: float) -> dict[str, Any]:
        """What ``trainer``, holding no shard now, does next: ``shards`` (each ``[name, path]``), ``wait``, ``meet``
        (a checkpoint inside the pass) or ``end`` (none left for it, or it would still train one when the others
        have trained all: the straggler's tail).

        A call is ``want`` shards (one a reader thread) when the trainer's pace, or another's still in the pass, is
        unknown; once all are known, more while it trains for less than :data:`CALL_S`, its bytes stay within the
        trainer's share of what is free at the trainers' paces, and what is left after it keeps every trainer busy
        for more than :data:`CALL_S` (the pass's tail goes a shard a reader thread, so that no one holds much)."""
        self.check_trainer(trainer)
        if self.held_by.get(trainer):
            raise DataPlanError(
                f"pass {self.number}: trainer {trainer} asks for shards holding {next(iter(self.held_by[trainer]))}"
            )
        if trainer in self.holding:
            self.holding.discard(trainer)
            return {"meet": self.held_at, "shards_in_pass": self.total_shards}
        if self.holding:
            return {"wait": f"pass {self.number}: the trainers meet for a checkpoint after {self.held_at} shards"}
        pace = self.paces.get(trainer)
        # the paces of the trainers still in the pass, this one's included (it may take after it ended)
        paces = self.active_sum + (pace if pace is not None and trainer in self.ended else 0.0)
        grow = pace is not None and self.active_unknown == 0 and paces > 0
        share = self.free_bytes * pace / paces if grow and pace is not None else 0.0
        taken: dict[str, str] = {}
        call_bytes = 0
        put_back: list[tuple[list[tuple[int, str]], tuple[int, str]]] = []
        while True:
            if len(taken) >= want:
                if not grow or pace is None or call_bytes / pace >= CALL_S:
                    break
                if self.free_bytes / paces <= CALL_S:
                    break  # the pass's tail
            shard = self._next(trainer, taken, put_back)
            if shard is None:
                break
            if len(taken) >= want and call_bytes + shard.size > share:
                break
            if not taken and self._outpaced(trainer, shard.size):
                break
            self._hand(trainer, shard)
            taken[shard.name] = shard.paths.get(trainer) or next(iter(shard.paths.values()))
            call_bytes += shard.size
        for heap, entry in put_back:
            heapq.heappush(heap, entry)
        if taken:
            self.call_start[trainer] = now
            return {"shards": [[name, path] for name, path in taken.items()]}
        if not self.opened:  # more shards may come with the files still to be offered
            return {"wait": f"pass {self.number}: {self.trainers - len(self.offered)} trainer(s) to offer their files"}
        holder = self._may_come_back(trainer)
        if holder is not None:  # another trainer holds a file of this one's that may prove unreadable there
            return {"wait": f"pass {self.number}: trainer {holder[1]} has this trainer's file {holder[0]}"}
        self._end(trainer)
        if self.free_shards and len(self.ended) == self.trainers:
            left = self._next(None, {}, [])
            where = ", ".join(sorted(set(left.paths.values()))) if left is not None else "?"
            raise DataPlanError(
                f"pass {self.number}: every trainer ended with {self.free_shards} shard(s) none could take "
                f"({left.name if left is not None else '?'}, offered at {where})"
            )
        return {"end": self.number}

    def _next(
        self, trainer: int | None, taken: dict[str, str], put_back: list[tuple[list[tuple[int, str]], tuple[int, str]]]
    ) -> Shard | None:
        """The next shard free for ``trainer`` (None: any trainer's), not among ``taken``: its own files first (off
        its heap, whose entries of names no longer free leave it; those in this call are set aside in
        ``put_back``, for the heap again after the take), then every trainer's by the order first offered."""
        heap = self._own.get(trainer, []) if trainer is not None else []
        while heap:
            shard = self.shards[heap[0][1]]
            if shard.free() == 0 or trainer in shard.unreadable:
                heapq.heappop(heap)
            elif shard.name in taken:
                put_back.append((heap, heapq.heappop(heap)))
            else:
                return shard
        index = self._free.first_from(0)
        while index is not None:
            shard = self._by_index[index]
            if shard.name not in taken and (trainer is None or trainer not in shard.unreadable):
                return shard
            index = self._free.first_from(index + 1)
        return None

    def _hand(self, trainer: int, shard: Shard) -> None:
        self._change(shard, -1)
        shard.held += 1
        self._change(shard, +1, 1)
        mine = self.held_by.setdefault(trainer, {})
        mine[shard.name] = mine.get(shard.name, 0) + 1
        self.held_bytes[trainer] = self.held_bytes.get(trainer, 0) + shard.size
        self.held_shards += 1
        self.held_total += shard.size
        if trainer not in shard.paths:
            holders = self.foreign.setdefault(shard.name, {})
            holders[trainer] = holders.get(trainer, 0) + 1

    def _outpaced(self, trainer: int, size: int) -> bool:
        """Whether ``trainer`` would still be training a shard of ``size`` bytes when the others still in the pass,
        at their paces, have trained every shard left and this one too: then it takes none (a slow trainer's last
        shard would bound the pass, the straggler's tail).  Only once every such trainer's pace is known."""
        mine = self.paces.get(trainer)
        if mine is None or self.active_unknown or self.unreadable_pairs:
            return False  # (a shard some trainer cannot read: it may be this one's to train)
        others = self.trainers - len(self.ended) - (0 if trainer in self.ended else 1)
        others_sum = self.active_sum - (0.0 if trainer in self.ended else mine)
        if others <= 0 or others_sum <= 0:
            return False
        if self.sole_unfinished.get(trainer, 0) > 0 and trainer not in self.shared_from:
            return False  # a file only it offered, no other trainer shown to read: it may be this one's to train
        left = self.free_bytes + self.held_total - self.held_bytes.get(trainer, 0)
        return size / mine > left / others_sum

    def _may_come_back(self, trainer: int) -> tuple[str, int] | None:
        """A file ``trainer`` offered that another trainer, not shown to read any offerer's storage, holds: it may
        come back unread (name, holder); None when there is none."""
        if trainer in self.shared_from:
            return None
        for name, holders in self.foreign.items():
            shard = self.shards[name]
            if trainer in shard.paths and not any(o in self.shared_from for o in shard.paths):
                return name, next(iter(holders))
        return None

    # -- finish, give back --------------------------------------------------------------------------------------

    def _release(self, trainer: int, names: list[str], done: bool) -> None:
        """``trainer``'s copies of ``names`` out of its hands, ``done`` or free again (every one checked held
        before any moves)."""
        self.check_trainer(trainer)
        mine = self.held_by.get(trainer, {})
        wanted: dict[str, int] = {}
        for name in names:
            wanted[name] = wanted.get(name, 0) + 1
            if wanted[name] > mine.get(name, 0):
                raise DataPlanError(f"pass {self.number}: trainer {trainer} does not hold shard {name!r}")
        for name, count in wanted.items():
            shard = self.shards[name]
            was_free = shard.free()
            self._change(shard, -1)
            shard.held -= count
            if done:
                shard.done += count
                self.done_shards += count
            self._change(shard, +1, was_free)
            mine[name] -= count
            if not mine[name]:
                del mine[name]
            self.held_bytes[trainer] -= count * shard.size
            self.held_shards -= count
            self.held_total -= count * shard.size
            holders = self.foreign.get(name)
            if holders is not None and trainer in holders:
                holders[trainer] -= count
                if not holders[trainer]:
                    del holders[trainer]
                if not holders:
                    del self.foreign[name]
        if not mine:
            self.held_by.pop(trainer, None)

    def finish(self, trainer: int, names: list[str], now: float) -> float | None:
        """``trainer`` trained the copies ``names`` (one call's, a name once a copy); its pace over the call, their
        bytes over the time since their take, or None when it measured nothing (no bytes, no time)."""
        self._release(trainer, names, done=True)
        for name in names:
            shard = self.shards[name]
            if trainer not in shard.paths:
                self.shared_from.update(shard.paths)
        self._done_sorted = None
        trained = sum(self.shards[name].size for name in names)
        took = now - self.call_start.get(trainer, now)
        if self.held_by.get(trainer):
            self.call_start[trainer] = now  # the rest of the call is timed from here
        else:
            self.call_start.pop(trainer, None)
        return trained / took if trained > 0 and took > 0 else None

    def progress(self, trainer: int, trained: int, now: float) -> float | None:
        """``trainer`` trained ``trained`` bytes of the copies it holds so far: its pace so far, or None."""
        self.check_trainer(trainer)
        if not self.held_by.get(trainer):
            raise DataPlanError(f"pass {self.number}: trainer {trainer} reports progress holding no shard")
        if trained > self.held_bytes[trainer]:
            raise DataPlanError(
                f"pass {self.number}: trainer {trainer} reports {trained} bytes trained of the "
                f"{self.held_bytes[trainer]} it holds"
            )
        took = now - self.call_start.get(trainer, now)
        return trained / took if trained > 0 and took > 0 else None

    def give_back(self, trainer: int, name: str, unreadable: bool) -> None:
        """``trainer`` hands a copy of ``name`` back untrained (it cannot read it where it was told, or it stops)."""
        self._release(trainer, [name], done=False)
        shard = self.shards[name]
        if unreadable and trainer not in shard.unreadable:
            shard.unreadable.append(trainer)
            self.unreadable_pairs += 1
            if len(shard.unreadable) >= self.trainers:
                raise DataPlanError(
                    f"pass {self.number}: no trainer can read shard {name} (offered at "
                    f"{', '.join(sorted(set(shard.paths.values())))})"
                )

    # -- checkpoints ----------------------------------------------------------------------------------------------

    def hold(self, ask: str) -> str | None:
        """A checkpoint inside the pass, for ``ask`` (an ask's text, or the minutes it is due by); None when it
        holds (at the shards done or in hand: :attr:`held_at`), else why it is refused."""
        if not self.opened:
            return "not every trainer offered its files yet"
        if self.holding:
            return "a checkpoint inside the pass is under way"
        if ask in self.asks_honoured:
            return "honoured already"
        if self.ended:
            return "a trainer ended the pass: the checkpoint comes at its end"
        if not self.free_shards:
            return "no shard left to hand out: the checkpoint comes at the pass's end"
        at = self.resumed_shards + self.done_shards + self.held_shards
        if at <= max(self.held_at, self.resumed_shards):
            return "no shard taken since the pass began or its last checkpoint"
        self.held_at = at
        self.holding = set(range(self.trainers))
        self.asks_honoured.append(ask)
        return None

    def done_names(self) -> list[str]:
        """Every copy of the pass done, before the resume and in this round: a name once a copy (sorted)."""
        if self._done_sorted is None:
            self._done_sorted = [
                shard.name
                for shard in sorted(self.shards.values(), key=lambda s: s.name)
                for _ in range(shard.done + shard.done_before)
            ]
        return self._done_sorted

    def check_trainer(self, trainer: int) -> None:
        if not 0 <= trainer < self.trainers:
            raise DataPlanError(f"pass {self.number}: no trainer {trainer} among {self.trainers}")

    # -- JSON ---------------------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The pass as JSON: each name's counts and paths, who holds what, the checkpoint's and offers' records;
        the running totals and heaps are rebuilt from them (:meth:`from_json`)."""
        return {
            "number": self.number,
            "trainers": self.trainers,
            "shards": [[s.name, s.copies, s.done, s.done_before, s.paths, s.unreadable] for s in self.shards.values()],
            "empty": list(self.empty),
            "offered": sorted(self.offered),
            "offer_pages": {str(t): [r.pages, r.digests, r.done_before] for t, r in self.offer_pages.items()},
            "held_by": {str(t): held for t, held in self.held_by.items()},
            "call_start": {str(t): s for t, s in self.call_start.items()},
            "ended": sorted(self.ended),
            "holding": sorted(self.holding),
            "held_at": self.held_at,
            "asks_honoured": self.asks_honoured,
            "shared_from": sorted(self.shared_from),
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any], paces: Paces) -> PassShards:
        """The pass of :meth:`to_json`, its running totals and heaps rebuilt (in O(n): each heap is appended to in
        the order names were first offered, which keeps it a heap)."""
        p = cls(int(value["number"]), int(value["trainers"]), paces)
        held: dict[str, int] = {}
        for trainer, names_held in value["held_by"].items():
            p.held_by[int(trainer)] = dict(names_held)
            for name, count in names_held.items():
                held[name] = held.get(name, 0) + count
        for name, copies, done, done_before, paths, unreadable in value["shards"]:
            shard = p._new_shard(name)
            shard.copies, shard.done, shard.done_before, shard.held = copies, done, done_before, held.get(name, 0)
            shard.paths = {int(t): path for t, path in paths.items()}
            shard.unreadable = list(unreadable)
            p._count(shard, +1)
            p.files += 1 if copies and shard.first else 0
            p.done_shards += done
            p.unreadable_pairs += len(unreadable)
            if shard.free():
                entry = (shard.index, name)
                p._free.set(shard.index, True)
                for trainer in shard.paths:
                    p._own.setdefault(trainer, []).append(entry)
        for trainer, names_held in p.held_by.items():
            for name, count in names_held.items():
                shard = p.shards[name]
                p.held_bytes[trainer] = p.held_bytes.get(trainer, 0) + count * shard.size
                p.held_shards += count
                p.held_total += count * shard.size
                if trainer not in shard.paths:
                    holders = p.foreign.setdefault(name, {})
                    holders[trainer] = holders.get(trainer, 0) + count
        p.empty = dict.fromkeys(value["empty"])
        p.offered = set(value["offered"])
        p.offer_pages = {int(t): OfferPages(pages, d, b) for t, (pages, d, b) in value["offer_pages"].items()}
        p.call_start = {int(t): float(s) for t, s in value["call_start"].items()}
        for trainer in value["ended"]:
            p._end(int(trainer))
        p.holding = set(value["holding"])
        p.held_at = int(value["held_at"])
        p.asks_honoured = list(value["asks_honoured"])
        p.shared_from = set(value["shared_from"])
        return p
