""":class:`DataPlan`: every pass of a round (the newest :data:`KEPT_PASSES`) and the trainers' paces, answering the
trainers' requests (``{"op": "shards", "do": ..., "pass": N, "trainer": t, ...}``), each checked and bounded
(bounds.py); an ``error`` answer names what was refused, and a fault of the plan itself is an answer too, never
an exception out of :meth:`DataPlan.answer` (the coordinator would drop the trainer's connection).

The requests (docs/data-plan.md describes the rules):

- ``offer`` ``trainers``, ``files`` (``[name, path]`` pairs), ``done_before`` (the copies a checkpoint the round
  resumed from holds, a name once a copy), ``held_before``, ``ranges`` (true, or a range's bytes: the trainer reads
  byte ranges of a file, and a file over names.RANGE_BYTES, or over the bytes given, is its ranges, each a shard);
  paged with ``page`` (from 0) of ``pages`` (1 when absent): pages are appended as they come, the offer complete
  with the last.  The reply carries the pass's figures
  (files, shards, files more than one trainer offered, empty files skipped, trainers that offered).
- ``take`` ``want`` (the trainer's reader threads): ``shards``, ``wait``, ``meet`` or ``end``.  ``least`` (an
  earlier version's least bytes of a call) is accepted and not used: a call is sized by paces alone.
- ``progress`` ``bytes``: of the shards in hand, trained so far (its pace while a call runs).
- ``finish`` ``shards``; ``give_back`` ``shard``, ``unreadable``; ``hold`` ``ask``.
- ``done``: the copies done, a name once a copy; with ``from`` (an index), one page of them from there and
  ``next`` (None after the last page), each page within the control line's limit.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from typing import Any, Mapping

from heterps_paddle.data_plan import bounds
from heterps_paddle.data_plan.bounds import (
    MAX_BYTES,
    MIN_RANGE_BYTES,
    DataPlanError,
    integer,
    names,
    pairs,
    seconds,
    text,
)
from heterps_paddle.data_plan.names import RANGE_BYTES
from heterps_paddle.data_plan.shards import OfferPages, Paces, PassShards

REQUESTS = frozenset({"offer", "take", "progress", "finish", "give_back", "hold", "done"})
KEPT_PASSES = 2  # a pass's state is kept while a trainer may still ask about it (the one before the newest)


class DataPlan:
    """Every pass of a round (the newest :data:`KEPT_PASSES`) and each trainer's pace, kept from pass to pass."""

    def __init__(self, passes: Mapping[int, PassShards] | None = None, paces: Paces | None = None) -> None:
        self.paces = paces or Paces()
        self.passes: dict[int, PassShards] = dict(passes or {})

    def answer(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """One request; an ``error`` answer names what was refused, or the plan's own fault."""
        try:
            return self._answer(message)
        except DataPlanError as exc:
            return {"error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a fault of the plan is an answer naming it, not a dropped trainer
            where = ", ".join(f"{key} {_field(message, key)!r}" for key in ("pass", "trainer", "do"))
            return {"error": f"data plan: {where}: the plan failed ({type(exc).__name__}: {exc})"}

    def _answer(self, message: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(message, Mapping):
            raise DataPlanError(f"data plan: malformed request: {type(message).__name__}, not an object")
        do = text(message.get("do"), "'do'", 32) if "do" in message else None
        if do is None:
            raise DataPlanError("data plan: malformed request: no 'do'")
        if do not in REQUESTS:
            raise DataPlanError(f"data plan: unknown request {do!r}")
        number = integer(message, "pass", 1, bounds.MAX_PASS)
        if do == "offer":
            return self._offer(number, message)
        shards = self.passes.get(number)
        if shards is None:
            raise DataPlanError(f"data plan: pass {number} was not offered")
        now = seconds(message, "now", time.time())
        if do == "done":
            return self._done(shards, message)
        if do == "hold":
            refused = shards.hold(text(message.get("ask"), "the ask", bounds.MAX_ASK))
            return {"held": shards.held_at} if refused is None else {"refused": refused}
        trainer = integer(message, "trainer", 0, bounds.MAX_TRAINERS - 1)
        if do == "take":
            return shards.take(trainer, integer(message, "want", 1, bounds.MAX_WANT, 1), now)
        if do == "finish":
            trained = names(message.get("shards"), "the shards finished", bounds.MAX_SHARDS)
            self._measured(trainer, shards.finish(trainer, trained, now))
            return {"ok": True}
        if do == "progress":
            self._measured(trainer, shards.progress(trainer, integer(message, "bytes", 0, bounds.MAX_BYTES), now))
            return {"ok": True}
        if do == "give_back":
            unreadable = message.get("unreadable", False)
            if not isinstance(unreadable, bool):
                raise DataPlanError(f"data plan: malformed request: 'unreadable' is {unreadable!r}, not a boolean")
            shards.give_back(trainer, text(message.get("shard"), "the shard given back"), unreadable)
            return {"ok": True}
        raise DataPlanError(f"data plan: unknown request {do!r}")

    def _measured(self, trainer: int, pace: float | None) -> None:
        """``trainer``'s pace measured (None: nothing measured; a pace is never zero nor infinite)."""
        if pace is None or not math.isfinite(pace) or pace <= 0:
            return
        old = self.paces.get(trainer)
        self.paces.rates[trainer] = pace
        for shards in self.passes.values():
            shards.pace_changed(trainer, old, pace)

    # -- offer --------------------------------------------------------------------------------------------------

    def _pass_for_offer(self, number: int, trainers: int) -> PassShards:
        """Pass ``number`` of ``trainers``; a new one only after the newest, once every trainer offered that."""
        shards = self.passes.get(number)
        if shards is not None:
            if shards.trainers != trainers:
                raise DataPlanError(f"data plan: pass {number} has {shards.trainers} trainers, not {trainers}")
            return shards
        if self.passes:
            newest = max(self.passes)
            if number < newest:
                raise DataPlanError(f"data plan: pass {number} is over")
            if number != newest + 1:
                raise DataPlanError(f"data plan: pass {number} offered while the newest is {newest}")
            if not self.passes[newest].opened:
                raise DataPlanError(
                    f"data plan: pass {number} offered before every trainer offered pass {newest} "
                    f"({len(self.passes[newest].offered)} of {self.passes[newest].trainers})"
                )
        shards = self.passes[number] = PassShards(number, trainers, self.paces)
        before = self.passes.get(number - 1)
        if before is not None and before.trainers == trainers:
            # whose storage the others read, and the asks honoured, go on
            shards.shared_from = set(before.shared_from)
            shards.asks_honoured = list(before.asks_honoured)
        for old in sorted(self.passes)[:-KEPT_PASSES]:
            del self.passes[old]
        return shards

    def _offer(self, number: int, message: Mapping[str, Any]) -> dict[str, Any]:
        trainers = integer(message, "trainers", 1, bounds.MAX_TRAINERS)
        trainer = integer(message, "trainer", 0, trainers - 1)
        pages = integer(message, "pages", 1, bounds.MAX_PAGES, 1)
        page = integer(message, "page", 0, pages - 1, 0)
        files = pairs(message.get("files", []), "the files offered", bounds.MAX_SHARDS)
        resumed = names(message.get("done_before", []), "done_before", bounds.MAX_SHARDS)
        held_before = integer(message, "held_before", 0, bounds.MAX_SHARDS, 0)
        shards = self._pass_for_offer(number, trainers)
        record = shards.offer_pages.get(trainer)
        if record is None:
            record = shards.offer_pages[trainer] = OfferPages(pages)
        elif record.pages != pages:
            raise DataPlanError(f"pass {number}: trainer {trainer} offered in {pages} pages, then in {record.pages}")
        digest = hashlib.sha256(json.dumps([files, resumed]).encode()).hexdigest()[:32]
        if page < len(record.digests):  # a page sent again (its reply lost): the same, or refused
            if record.digests[page] != digest:
                raise DataPlanError(f"pass {number}: trainer {trainer} offered other files a second time")
            return {"ok": True, "page": page, **shards.figures()}
        if page > len(record.digests):
            raise DataPlanError(
                f"pass {number}: trainer {trainer} offered page {page} before page {len(record.digests)}"
            )
        record.digests.append(digest)
        # the copies done before, ahead of this page's files: none of them is handed out
        counted: dict[str, int] = {}
        for name in resumed:
            counted[name] = record.done_before[name] = record.done_before.get(name, 0) + 1
        shards.add_done_before(counted)
        cut = message.get("ranges", False)
        if cut is True:
            cut = RANGE_BYTES
        if cut is False:
            cut = 0
        if isinstance(cut, bool) or not isinstance(cut, int) or not (cut == 0 or MIN_RANGE_BYTES <= cut <= MAX_BYTES):
            raise DataPlanError(
                f"data plan: malformed request: 'ranges' is {str(cut)[:20]}, not a boolean or a range's bytes "
                f"({MIN_RANGE_BYTES}..{MAX_BYTES})"
            )
        shards.add_files(trainer, files, cut)
        # a pass resumed inside: a checkpoint inside it is named after the one resumed from (K of S grows)
        shards.held_at = max(shards.held_at, held_before)
        if record.complete:
            shards.offered.add(trainer)
            record.done_before.clear()  # merged: what a page sent again compares is its digest
        return {"ok": True, "page": page, **shards.figures()}

    # -- done -----------------------------------------------------------------------------------------------------

    def _done(self, shards: PassShards, message: Mapping[str, Any]) -> dict[str, Any]:
        """The copies done, whole (without ``from``) or a page from ``from`` within the control line's limit."""
        done = shards.done_names()
        reply: dict[str, Any] = {"shards": shards.total_shards, "total": len(done)}
        if "from" not in message:
            return {"done": list(done), **reply}
        start = integer(message, "from", 0, len(done))
        end, size = start, 0
        while end < len(done) and (end == start or size + len(done[end]) + 4 <= bounds.DONE_PAGE_BYTES):
            size += len(done[end]) + 4
            end += 1
        return {"done": done[start:end], "from": start, "next": end if end < len(done) else None, **reply}

    # -- JSON -----------------------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The plan as JSON (a files board keeps it in a file)."""
        return {
            "paces": {str(t): r for t, r in self.paces.rates.items()},
            "passes": {str(n): p.to_json() for n, p in self.passes.items()},
        }

    @staticmethod
    def from_json(value: Mapping[str, Any]) -> DataPlan:
        paces = Paces({int(t): float(r) for t, r in value.get("paces", {}).items()})
        return DataPlan({int(n): PassShards.from_json(p, paces) for n, p in value.get("passes", {}).items()}, paces)


def _field(message: Any, key: str) -> Any:
    return message.get(key) if isinstance(message, Mapping) else None
