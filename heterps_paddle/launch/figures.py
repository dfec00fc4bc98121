"""A job's figures, folded from its event log (launch/event_log.py): what ``heterps status`` prints and what the
metrics endpoint serves (launch/metrics_server.py), from the same records, so the two agree with each other and with
the console (whose lines are made from the same ``rates`` records: launch/gauge.py).  docs/metrics.md lists them.

Pure: records in, figures out.  The fold is incremental: a reader of a growing log folds only what is new.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from heterps_paddle.files import new_lines
from heterps_paddle.launch import event_log
from heterps_paddle.planning.unit_cost import cost_per_million_samples


@dataclass
class JobFigures:
    """The job as its event log tells it (module doc)."""

    host: str | None = None  # this log's host
    started_at: float | None = None
    ended_at: float | None = None
    state: str = "starting"  # starting | running | ended | aborted, and this host's end: finished | left | failed
    reason: str | None = None
    round: int = 0
    rates: Mapping[str, Any] | None = None  # the newest rates record
    rounds: list[dict[str, Any]] = field(default_factory=list)  # each change of round: number, kind, why, when, plans
    series: list[dict[str, Any]] = field(default_factory=list)  # per rates record: t, round, rates, target, cost
    decisions: list[dict[str, Any]] = field(default_factory=list)  # --adapt: each decision, its figures, and when
    offset: int = 0  # of the log file, folded up to

    def fold(self, record: Mapping[str, Any]) -> None:
        kind, t = record.get("type"), float(record.get("t") or 0.0)
        if kind == "launch_started":
            # a launch started again in the same directory: the figures are its own from here (the job's records
            # before it come again from the coordinator as it joins)
            fresh = JobFigures(host=record.get("host"), started_at=t, offset=self.offset)
            self.__dict__.update(vars(fresh))
        elif kind == "round_started":
            self.round, self.state = int(record.get("round") or 0), "running"
        elif kind == "host_round":
            self.round = max(self.round, int(record.get("round") or 0))
            if self.state == "starting":
                self.state = "running"
        elif kind == "round_planned":
            self.round = int(record.get("round") or self.round)
            self.rounds.append(
                {
                    "round": record.get("round"),
                    "kind": record.get("kind"),
                    "why": record.get("why"),
                    "at": t,
                    "old_plan": record.get("old_plan"),
                    "new_plan": record.get("new_plan"),
                    "resumes_from": record.get("resumes_from"),
                }
            )
        elif kind == "rates":
            self.rates = dict(record)
            self.series.append(
                {
                    "t": t,
                    "round": record.get("round"),
                    "samples_per_s": record.get("samples_per_s"),
                    "predicted_samples_per_s": record.get("predicted_samples_per_s"),
                    "target_samples_per_s": record.get("target_samples_per_s"),
                    "cost_so_far": record.get("cost_so_far"),
                    "cost_per_million_samples_over_round": record.get("cost_per_million_samples_over_round"),
                    "predicted_cost_per_million_samples": _predicted_per_million(record),
                }
            )
        elif kind == "adapt":
            given = record.get("proposal")
            proposal: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
            self.decisions.append(
                {
                    "at": t,
                    "decision": record.get("decision"),
                    "why": record.get("why"),
                    # before and after, predicted on the measured rates (a replacement: the slow host's figures)
                    "summary": proposal.get("summary"),
                    "samples_per_s": proposal.get("samples_per_s"),
                    "current_samples_per_s": proposal.get("current_samples_per_s"),
                    "replace": record.get("replace"),
                }
            )
        elif kind in ("job_ended", "job_aborted"):
            self.state = "ended" if kind == "job_ended" else "aborted"
            self.reason = record.get("reason")
            self.ended_at = t
        elif kind == "host_ended":
            if self.state not in ("ended", "aborted"):
                self.state = {"finished": "ended", "left": "left", "released": "released"}.get(
                    str(record.get("how")), "failed"
                )
                self.reason = record.get("reason") or self.reason
            self.ended_at = self.ended_at or t

    def read(self, log_dir: str) -> JobFigures:
        """Fold what the log at ``log_dir`` gained since the last read."""
        self.offset, lines = new_lines(event_log.path_in(log_dir), self.offset)
        for record in event_log.parse(lines):
            self.fold(record)
        return self

    @property
    def running(self) -> bool:
        return self.state in ("starting", "running")

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        """``heterps status --json``."""
        rates = self.rates or {}
        end = self.ended_at if not self.running else (time.time() if now is None else now)
        return {
            "host": self.host,
            "state": self.state,
            "reason": self.reason,
            "round": self.round,
            "seconds": None if self.started_at is None or end is None else round(end - self.started_at, 1),
            # over the job (never reset by a move, a restart or a leave)
            "samples": rates.get("samples"),
            "seconds_over_job": rates.get("seconds_over_job"),
            "cost_so_far": rates.get("cost_so_far"),
            "samples_per_s_over_job": rates.get("samples_per_s_over_job"),
            "cost_per_million_samples_over_job": rates.get("cost_per_million_samples_over_job"),
            # over the running round
            "samples_over_round": rates.get("samples_over_round"),
            "seconds_over_round": rates.get("seconds_over_round"),
            "cost_over_round": rates.get("cost_over_round"),
            "samples_per_s_over_round": rates.get("samples_per_s_over_round"),
            "cost_per_million_samples_over_round": rates.get("cost_per_million_samples_over_round"),
            # over the last window (how the job goes now)
            "samples_per_s_last_window": rates.get("samples_per_s"),
            "cost_per_million_samples_last_window": rates.get("cost_per_million_samples"),
            "window_s": rates.get("window_s"),
            # is it learning? (the last finished pass's AUC and loss as the script's metrics give them)
            "learning": rates.get("learning"),
            # the running plan's
            "predicted_samples_per_s": rates.get("predicted_samples_per_s"),
            "target_samples_per_s": rates.get("target_samples_per_s"),
            "cost_per_hour": rates.get("cost_per_hour"),  # every unit the job holds
            "idle_cost_per_hour": rates.get("idle_cost_per_hour"),  # of it: hosts held running nothing of the round
            "measured_at": None if not self.series else self.series[-1]["t"],
            "stages": rates.get("stages") or [],
            "trainers": rates.get("trainers") or [],
            "rounds": self.rounds,
            "decisions": self.decisions,
        }

    def lines(self) -> list[str]:
        """``heterps status``: what a person reads."""
        d = self.to_dict()
        out = [f"job: {d['state']}" + (f" ({d['reason']})" if d["reason"] else "") + f", round {d['round']}"]
        if self.rates is None:
            out.append("measured: nothing yet (the trainers measure every HETERPS_METER_S; docs/metrics.md)")
        else:
            over_job = (
                f"over the job: {_n(d['samples'])} samples in {_n(d['seconds_over_job'])} s, "
                f"{_n(d['samples_per_s_over_job'])} samples/s"
                + (
                    ""
                    if d["cost_so_far"] is None
                    else f"; cost {d['cost_so_far']:.4g}, "
                    f"{_n(d['cost_per_million_samples_over_job'], '.4g')} per million samples"
                )
            )
            now = (
                f"samples/s: {_n(d['samples_per_s_last_window'])} measured over the last {_n(d['window_s'])} s, "
                f"{_n(d['predicted_samples_per_s'])} predicted"
                + (f", target {_n(d['target_samples_per_s'])}" if d["target_samples_per_s"] else "")
            )
            # an ended job leads with what it was over the job, never with an idle last window as its rate
            out.extend([over_job, now] if not self.running else [now, over_job])
            if d["round"]:
                out.append(
                    f"round {d['round']}: {_n(d['samples_over_round'])} samples in {_n(d['seconds_over_round'])} s, "
                    f"{_n(d['samples_per_s_over_round'])} samples/s"
                    + (
                        ""
                        if d["cost_over_round"] is None
                        else f"; cost {d['cost_over_round']:.4g}, "
                        f"{_n(d['cost_per_million_samples_over_round'], '.4g')} per million samples"
                    )
                )
            learning = d["learning"] or {}
            if learning.get("verdict"):
                out.append(f"NOT LEARNING: {learning['verdict']}")
            elif learning:
                auc = learning.get("auc")
                loss = learning.get("loss")
                out.append(
                    f"learning: pass {learning.get('passes')}: "
                    + ("AUC not measured" if auc is None else f"AUC {auc:.4f}")
                    + ("" if loss is None else f", loss {loss:.4g}")
                )
            if d["cost_per_hour"] is None:
                out.append("cost: unknown (the plan's resource types have no prices)")
            else:
                idle = d["idle_cost_per_hour"]
                out.append(
                    f"cost: {d['cost_per_hour']:.4g}/h"
                    + (f" ({idle:.4g}/h of it for hosts held that run nothing of the round)" if idle else "")
                    + f", {d['cost_so_far'] or 0:.4g} so far, "
                    f"{_n(d['cost_per_million_samples_last_window'], '.4g')} per million samples over the last window"
                )
            for s in d["stages"]:
                work = "not measured" if s.get("work_share") is None else f"{s['work_share']:.0%}"
                price = "" if s.get("price_per_hour") is None else f" at {s['price_per_hour']:.4g}/h each"
                predicted = s["predicted_samples_per_s"]
                out.append(
                    f"  stage {s['stage']}: {s['units']} x {s['resource']} ({s['kind']}){price}: "
                    f"{_n(s['samples_per_s'])} samples/s measured"
                    + (", not predicted" if predicted is None else f" vs {_n(predicted)} predicted")
                    + f", work {work}, could do {_n(s.get('capacity_samples_per_s'))} alone"
                )
            for t in d["trainers"]:
                if t.get("slow") and t.get("share_of_peers") is not None:
                    out.append(
                        f"  host {t['host']} (trainer {t['index']}): {_n(t['samples_per_s'])} samples/s, "
                        f"{t['share_of_peers']:.0%} of its peers' in the same pass: slow"
                    )
        for a in self.decisions[-3:]:
            out.append(f"adapt ({time.strftime('%H:%M:%S', time.localtime(a['at']))}): {a['decision']}: {a['why']}")
        for r in self.rounds:
            out.append(
                f"round {r['round']} ({r['kind']}, {time.strftime('%H:%M:%S', time.localtime(r['at']))}): {r['why']}"
            )
        return out


def _predicted_per_million(rates: Mapping[str, Any]) -> float | None:
    """What the running plan predicted a million samples would cost: its units' price over its predicted rate (the
    one definition, planning/cost_model.py); None where either is not known."""
    per_hour, idle, predicted = (
        rates.get(k) for k in ("cost_per_hour", "idle_cost_per_hour", "predicted_samples_per_s")
    )
    if per_hour is None or not predicted:
        return None
    return cost_per_million_samples(float(per_hour) - float(idle or 0.0), float(predicted))


def _n(value: Any, spec: str = ",.0f") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "?"
    return format(value, spec)


def of_log(log_dir: str) -> JobFigures:
    """The figures of the log at ``log_dir`` (its newest launch's, and the job's records it holds)."""
    return JobFigures().read(log_dir)
