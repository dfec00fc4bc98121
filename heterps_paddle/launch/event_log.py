"""The job's event log: everything a tool or a test needs to know about a launch's life, as JSON lines.

``LOG_DIR/heterps-events.jsonl`` on every host: each ``heterps launch`` appends its own records (it started, each
round it ran or stood by in, how it ended), and the launch that runs the job's state machine (the coordinator's
host across hosts; the one host otherwise) appends the job's (rounds started and planned, failures settling, hosts
back, leaves, checkpoints asked, the end).  Nothing parses console wording: ``heterps bench elastic``, ``heterps
launch --leave`` and the tests read this log.  ``restarts.json`` (the coordinator's) is derived from its
``round_planned`` records.

Every record is one JSON object on one line: ``{"v": 1, "t": <unix seconds>, "type": <type>, ...}``; the types and
their fields are documented in docs/event-log.md (``SCHEMA`` below is that list, checked by the tests).  A record is
written whole (one ``write`` of one line, flushed); a reader skips a last line still being written.  A launch that
appends to a log an earlier launch wrote begins with its own ``launch_started``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable, Iterable, Mapping

from heterps_paddle.launch import events as e
from heterps_paddle.launch.state import Job

FILE = "heterps-events.jsonl"
VERSION = 1

# type -> its fields besides v, t and type (docs/event-log.md)
SCHEMA: dict[str, tuple[str, ...]] = {
    # a host's own launch
    "launch_started": ("host", "pid", "across_hosts", "version"),
    "host_round": ("round", "part", "log_dir"),  # part: "runs" | "stands_by"
    "host_failed": ("round", "failure", "log", "connect_timeout"),
    "host_ended": ("how", "code", "reason"),  # how: "finished" | "left" | "failed"
    # the job's, written where its state machine runs
    "round_started": ("round", "hosts", "digest"),
    "settling": ("reason", "kind", "left"),
    "replanning": ("kind", "lost"),
    "round_planned": (
        "round",
        "kind",
        "at",
        "why",
        "lost",
        "lost_so_far",
        "left",
        "released",
        "joined",
        "hosts",
    ),  # and the checkpoint's and the re-planning's report's fields (restarts.json's record)
    "host_back": ("host", "joined", "moves"),
    "spare_left": ("host",),
    "spare_lost": ("host",),
    "leave_asked": ("host", "grace_s"),
    "move_declined": ("hosts", "plan"),
    "move_impossible": ("hosts", "detail"),
    "checkpoint_asked": ("reason", "hold_s"),
    "refused": ("host", "reason"),
    "rates": (
        "round",
        "window_s",
        "samples",
        "samples_per_s",
        "predicted_samples_per_s",
        "target_samples_per_s",
        "cost_per_hour",
        "cost_so_far",
        "idle_cost_per_hour",
        "cost_per_million_samples",
        "seconds_over_job",
        "samples_per_s_over_job",
        "cost_per_million_samples_over_job",
        "samples_over_round",
        "seconds_over_round",
        "cost_over_round",
        "samples_per_s_over_round",
        "cost_per_million_samples_over_round",
        "learning",
        "stages",
    ),
    "measured": ("round", "resource", "host", "seconds", "seconds_per_sample", "file_seconds_per_sample", "why_not"),
    "reconsidering": ("why", "missed"),
    "proposed": ("proposal", "detail"),
    "adapt": ("decision", "why", "proposal"),
    "on_scale": ("wanted", "released", "why"),
    "on_scale_ran": ("command", "code", "output"),
    "job_ended": (),
    "job_aborted": ("reason",),
}


def path_in(log_dir: str) -> str:
    return os.path.join(log_dir, FILE)


class EventLog:
    """Appends records to one launch's log (module doc); safe to share between threads."""

    def __init__(self, log_dir: str):
        os.makedirs(log_dir, exist_ok=True)
        self.path = path_in(log_dir)
        self.lock = threading.Lock()

    def write(self, kind: str, /, **fields: Any) -> dict[str, Any]:
        if kind not in SCHEMA:
            raise ValueError(f"event log: no record type {kind!r}")
        record = {"v": VERSION, "t": round(time.time(), 3), "type": kind, **fields}
        line = json.dumps(record, default=str) + "\n"
        with self.lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
        return record

    def append(self, record: Mapping[str, Any]) -> None:
        """A job record the coordinator streamed, as it sent it; ValueError for what is not one (the caller's peer
        sent it: its line is refused, the log keeps nothing of it)."""
        line = json.dumps(dict(record), default=str)
        if (
            record.get("v") != VERSION
            or record.get("type") not in SCHEMA
            or record.get("type") in HOST_TYPES
            or not isinstance(record.get("seq"), int)
            or len(line) > MAX_RECORD
        ):
            raise ValueError(f"not a job record of this log's version: {line[:120]}")
        with self.lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def actions(self, actions: Iterable[Any], job: Job) -> None:
        """The job's records of the machine's ``actions`` (``job``: the machine's job after the step)."""
        for action in actions:
            found = record_of(action, job)
            if found is not None:
                kind, fields = found
                self.write(kind, **fields)


HOST_TYPES = frozenset({"launch_started", "host_round", "host_failed", "host_ended"})  # a host's own records
MAX_RECORD = 1 << 20  # bytes: a record streamed from the coordinator, at most (control.MAX_LINE)


class JobLog:
    """The job's records, written where its state machine runs: each names the job (``job``) and is numbered
    (``seq``), is kept, and is handed to ``send`` (the coordinator streams them to every host, which writes them into
    its own log: ``heterps status`` reads the job on any host).  Writes as :class:`EventLog` does."""

    def __init__(self, log: EventLog, job: str, keep: int = 100_000):
        self.log = log
        self.job = job
        self.keep = keep
        self.kept: list[dict[str, Any]] = []
        self.seq = 0
        self.send: Callable[[dict[str, Any]], None] | None = None
        self.lock = threading.Lock()

    def write(self, kind: str, /, **fields: Any) -> dict[str, Any]:
        with self.lock:
            self.seq += 1
            record = self.log.write(kind, job=self.job, seq=self.seq, **fields)
            self.kept.append(record)
            del self.kept[: max(0, len(self.kept) - self.keep)]
        if self.send is not None:
            self.send(record)
        return record

    def actions(self, actions: Iterable[Any], job: Job) -> None:
        for action in actions:
            found = record_of(action, job)
            if found is not None:
                kind, fields = found
                self.write(kind, **fields)

    def since(self, job: str | None, seq: int) -> list[dict[str, Any]]:
        """The kept records a host that has this job's records up to ``seq`` lacks (all, for another job's)."""
        with self.lock:
            return [r for r in self.kept if job != self.job or r["seq"] > seq]


def last_of_job(log_dir: str) -> tuple[str | None, int]:
    """The job and number of the newest job record a host's log holds (what it asks the coordinator after)."""
    for record in reversed(read(log_dir)):
        if record["type"] not in HOST_TYPES and isinstance(record.get("seq"), int):
            return record.get("job"), int(record["seq"])
    return None, 0


def record_of(action: Any, job: Job) -> tuple[str, dict[str, Any]] | None:
    """The event-log record of one of the machine's actions (None: it is not one of the job's facts)."""
    if isinstance(action, e.Start):
        return "round_started", {"round": job.round.number, "hosts": list(action.hosts), "digest": action.digest}
    if isinstance(action, e.Settling):
        return "settling", {"reason": action.reason, "kind": action.kind.value, "left": action.left}
    if isinstance(action, e.Replan):
        return "replanning", {"kind": action.kind.value, "lost": sorted(action.lost)}
    if isinstance(action, e.NextRound):
        return "round_planned", job.history[-1].to_dict()
    if isinstance(action, e.HostBack):
        joined = None if action.joining is None else dict(action.joining)
        return "host_back", {"host": action.host, "joined": joined, "moves": action.moves}
    if isinstance(action, e.SpareLeft):
        return "spare_left", {"host": action.host}
    if isinstance(action, e.SpareLost):
        return "spare_lost", {"host": action.host}
    if isinstance(action, e.LeaveNoted):
        return "leave_asked", {"host": action.host, "grace_s": action.grace_s}
    if isinstance(action, e.MoveDeclined):
        return "move_declined", {"hosts": list(action.hosts), "plan": action.plan}
    if isinstance(action, e.MoveImpossible):
        return "move_impossible", {"hosts": list(action.hosts), "detail": action.detail}
    if isinstance(action, e.Reconsider):
        return "reconsidering", {"why": action.why, "missed": action.missed}
    if isinstance(action, e.AdaptAdvice):
        return "adapt", {"decision": action.decision, "why": action.why, "proposal": proposal_record(action.proposal)}
    if isinstance(action, e.ReplaceAdvice):
        slow = action.replacement
        replacing = {
            "host": slow.host,
            "resource": slow.resource,
            "price_per_hour": slow.price_per_hour,
            "share_of_peers": round(slow.share, 3),
            "windows": slow.windows,
        }
        return "adapt", {"decision": action.decision, "why": action.why, "proposal": None, "replace": replacing}
    if isinstance(action, e.OnScale):
        return "on_scale", {"wanted": dict(action.wanted), "released": dict(action.released), "why": action.why}
    if isinstance(action, e.AskCheckpoint):
        return "checkpoint_asked", {"reason": action.reason, "hold_s": action.hold_s}
    if isinstance(action, e.Refuse):
        return "refused", {"host": action.host, "reason": action.reason}
    if isinstance(action, e.EndAll):
        return "job_ended", {}
    if isinstance(action, e.AbortAll):
        return "job_aborted", {"reason": action.reason}
    return None


def proposal_record(p: e.Proposal) -> dict[str, Any]:
    return {
        "summary": p.summary,
        # the plan itself, stage by stage: the plan a move runs, as decided
        "plan": {
            "stages": [
                {k: stage.get(k) for k in ("resource", "kind", "layers", "units")}
                for stage in (p.plan.get("stages") or ())
                if isinstance(stage, dict)
            ]
        },
        "samples_per_s": round(p.samples_per_s, 3),
        "cost_per_hour": p.cost_per_hour,
        "meets_target": p.meets_target,
        "current_samples_per_s": round(p.current_samples_per_s, 3),
        "current_cost_per_hour": p.current_cost_per_hour,
        "target": p.target,
        "budget": p.budget,
        "released": dict(p.released),
        "wanted": dict(p.wanted),
        "refit": dict(p.refit),
        "priced_from_file": list(p.from_file),
    }


def read(log_dir_or_path: str) -> list[dict[str, Any]]:
    """Every whole record of a log (a directory: its FILE), oldest first; [] when there is none.  A line that is
    not a record of this schema's version (cut, foreign) is skipped."""
    path = log_dir_or_path if log_dir_or_path.endswith(".jsonl") else path_in(log_dir_or_path)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    return parse(text.split("\n")[: -1 if not text.endswith("\n") else None])


def parse(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The records among whole ``lines`` of a log (module doc: what is not a record of this version is skipped)."""
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("v") == VERSION and record.get("type") in SCHEMA:
            records.append(record)
    return records


def this_launch(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of the newest launch that appended to a log (from its ``launch_started`` on)."""
    starts = [i for i, r in enumerate(records) if r["type"] == "launch_started"]
    return records[starts[-1] :] if starts else records


def of_type(records: Iterable[Mapping[str, Any]], *kinds: str) -> list[Mapping[str, Any]]:
    return [r for r in records if r.get("type") in kinds]
