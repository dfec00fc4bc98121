"""What the job costs, live: the trainers' measurements (runtime/meter.py) made into each stage's measured rate
beside the plan's prediction, and the job's cost per hour, cost so far and cost per million samples
(docs/metrics.md).

The launch that runs the job's state machine (the one host, or the coordinator's) keeps one gauge.  The shell
hands it, about every second, the meter records on the round's board and the plan record trainer 0 published
(fleet/plan_agreement.py); the gauge keeps a short history and, every ``HETERPS_RATES_WINDOW_S / 3`` seconds,
makes a :class:`Rates` over the last window (``HETERPS_RATES_WINDOW_S``, 30 s): a ``rates`` record of the event log
and a ``Measured`` event of the machine (the shell does both).  Every ``HETERPS_STATUS_EVERY_S`` the console gets
one line per stage and one for the job.

- **The job's samples/s** is what the stage 1 CPU trainers (which read the data) trained over the window, summed;
  in a pipeline every stage trains the same samples, so it is every stage's measured samples/s too, and the
  slowest stage's capacity bounds it.
- **A stage's work share** is the CPU seconds its processes used over the window over the cores they can keep
  busy in it (runtime/meter.py: ``cores``), at most 1; the rest is waiting: for the stage after for stage 1 (its
  trainers send micro-batches on and wait for the gradients back), for the stage before for the last stage, for
  either for a middle one.  A stage's capacity, what it could train alone, is the measured samples/s over its
  work share.  A GPU stage's work is on its device, which CPU time does not see: its work share is not measured
  (None) where Paddle runs it on a GPU.
- **Each host's trainers.** A stage 1 CPU trainer's own samples/s over the window, beside its peers' in the same
  pass (those that neither finished a pass in the window nor are a pass ahead: a trainer that ended its share of
  the pass waits, and is no peer).  One under ``straggler_share`` (``HETERPS_STRAGGLER_SHARE``) of its peers'
  median is *slow*: a busy or throttled host, a stopped process.  Each trainer reads its own share of the data, so a
  slow one bounds every pass it is in; the console says so, where the job's rate alone would not say which host.
- **Cost.** Cost per hour is the plan's (each stage's units times its type's price); cost so far adds it up over
  the time each round ran; cost per million samples is cost per hour over the samples trained per hour
  (planning/unit_cost.py: cost_per_million_samples, the one definition), at the measured rate.
- **Spans.** The last window's rate says how the job goes now; what the job costs its user is over the job: the
  samples trained so far, the time since the gauge first saw the job, the cost so far and their quotients (cost
  over samples: unit_cost.cost_per_million_of), and the same over the running round.  None of them is reset by a
  move, a restart or a leave (the gauge lives as long as the launch that runs the job's machine).

Pure: no I/O, no clock of its own (times come with the calls), no Paddle.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping

from heterps_paddle.planning.unit_cost import cost_per_million_of, cost_per_million_samples

UNKNOWN = "?"  # a stage's resource before the round's plan record is on the board


@dataclass(frozen=True)
class TrainerRate:
    """A stage 1 CPU trainer over the window: its samples/s, and against its peers' in the same pass."""

    host: str
    index: int
    samples_per_s: float
    peers_samples_per_s: float | None  # the median of its peers' (None: no peer trained in the same pass)
    slow: bool

    @property
    def share(self) -> float | None:
        if not self.peers_samples_per_s:
            return None
        return self.samples_per_s / self.peers_samples_per_s

    def to_dict(self) -> dict[str, Any]:
        share = self.share
        return {
            "host": self.host,
            "index": self.index,
            "samples_per_s": _round(self.samples_per_s),
            "peers_samples_per_s": _round(self.peers_samples_per_s),
            "share_of_peers": None if share is None else round(share, 3),
            "slow": self.slow,
        }


NOT_LEARNING_WITHIN = 0.01  # a pass's AUC this close to 0.5, after the first, says the model learns nothing


@dataclass(frozen=True)
class Learning:
    """Is it learning?  The stage 1 CPU trainers' last finished pass, as the script's own metrics give it: its AUC
    (their mean), the last stage's loss where it is known, and whether what trains is finite."""

    passes: int  # the pass these figures are of (the trainers' finished passes, the fewest)
    auc: float | None
    loss: float | None
    finite: bool | None

    @property
    def verdict(self) -> str | None:
        """Why the job is flagged (None: it is not)."""
        if self.finite is False:
            return f"pass {self.passes} trained on values that are not finite (NaN or inf)"
        if self.passes >= 2 and self.auc is not None and abs(self.auc - 0.5) <= NOT_LEARNING_WITHIN:
            return (
                f"pass {self.passes}'s AUC is {self.auc:.4f}, within {NOT_LEARNING_WITHIN} of 0.5 after the first "
                "pass: the model is not learning"
            )
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "passes": self.passes,
            "auc": self.auc,
            "loss": self.loss,
            "finite": self.finite,
            "verdict": self.verdict,
        }

    def text(self) -> str:
        figures = [f"AUC {self.auc:.4f}" if self.auc is not None else "AUC not measured"]
        if self.loss is not None:
            figures.append(f"loss {self.loss:.4g}")
        return f"pass {self.passes}: " + ", ".join(figures)


@dataclass(frozen=True)
class StageRate:
    stage: int
    resource: str
    kind: str
    units: int
    predicted_samples_per_s: float | None
    samples_per_s: float
    work_share: float | None  # None: not measured (a GPU stage on its device, or no record yet)
    waiting_for: str  # "next" | "previous" | "either" | "nothing" (a one-stage plan)
    price_per_hour: float | None  # per unit

    @property
    def capacity_samples_per_s(self) -> float | None:
        """What the stage could train on its own: the measured rate over its work share."""
        if self.work_share is None or self.work_share <= 0:
            return None
        return self.samples_per_s / self.work_share

    def to_dict(self) -> dict[str, Any]:
        capacity = self.capacity_samples_per_s
        return {
            "stage": self.stage,
            "resource": self.resource,
            "kind": self.kind,
            "units": self.units,
            "predicted_samples_per_s": _round(self.predicted_samples_per_s),
            "samples_per_s": _round(self.samples_per_s),
            "work_share": None if self.work_share is None else round(self.work_share, 4),
            "wait_share": None if self.work_share is None else round(1.0 - self.work_share, 4),
            "waiting_for": self.waiting_for,
            "capacity_samples_per_s": _round(capacity),
            "price_per_hour": self.price_per_hour,
        }


@dataclass(frozen=True)
class Rates:
    """The job over one window: what the event log's ``rates`` record holds (docs/metrics.md)."""

    round: int
    at: float  # unix seconds, the window's end
    window_s: float
    samples: int  # trained so far in the job (every round)
    samples_per_s: float
    predicted_samples_per_s: float | None
    target_samples_per_s: float | None
    cost_per_hour: float | None
    cost_so_far: float | None
    stages: tuple[StageRate, ...]
    trainers: tuple[TrainerRate, ...] = ()
    learning: Learning | None = None  # the last finished pass's (None: no pass finished in this round yet)
    idle_cost_per_hour: float | None = None  # of cost_per_hour: the hosts held that run nothing of the round
    seconds_over_job: float = 0.0  # since the gauge first saw the job
    samples_over_round: int = 0
    seconds_over_round: float = 0.0  # since the round was first seen
    cost_over_round: float | None = None

    @property
    def cost_per_million_samples(self) -> float | None:
        """Over the last window (at its measured rate)."""
        if self.cost_per_hour is None or self.samples_per_s <= 0:
            return None
        return cost_per_million_samples(self.cost_per_hour, self.samples_per_s)

    @property
    def samples_per_s_over_job(self) -> float | None:
        return self.samples / self.seconds_over_job if self.seconds_over_job > 0 else None

    @property
    def cost_per_million_samples_over_job(self) -> float | None:
        return cost_per_million_of(self.cost_so_far, self.samples)

    @property
    def samples_per_s_over_round(self) -> float | None:
        return self.samples_over_round / self.seconds_over_round if self.seconds_over_round > 0 else None

    @property
    def cost_per_million_samples_over_round(self) -> float | None:
        return cost_per_million_of(self.cost_over_round, self.samples_over_round)

    def to_record(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "window_s": round(self.window_s, 3),
            "samples": self.samples,
            "samples_per_s": _round(self.samples_per_s),
            "predicted_samples_per_s": _round(self.predicted_samples_per_s),
            "target_samples_per_s": self.target_samples_per_s,
            "cost_per_hour": self.cost_per_hour,
            "cost_so_far": None if self.cost_so_far is None else round(self.cost_so_far, 6),
            "idle_cost_per_hour": self.idle_cost_per_hour,
            "cost_per_million_samples": _round(self.cost_per_million_samples, 6),
            "seconds_over_job": round(self.seconds_over_job, 3),
            "samples_per_s_over_job": _round(self.samples_per_s_over_job),
            "cost_per_million_samples_over_job": _round(self.cost_per_million_samples_over_job, 6),
            "samples_over_round": self.samples_over_round,
            "seconds_over_round": round(self.seconds_over_round, 3),
            "cost_over_round": None if self.cost_over_round is None else round(self.cost_over_round, 6),
            "samples_per_s_over_round": _round(self.samples_per_s_over_round),
            "cost_per_million_samples_over_round": _round(self.cost_per_million_samples_over_round, 6),
            "learning": None if self.learning is None else self.learning.to_dict(),
            "stages": [s.to_dict() for s in self.stages],
            "trainers": [t.to_dict() for t in self.trainers],
        }

    def lines(self) -> list[str]:
        """The console's lines: one per stage, one for the job."""
        out = []
        for s in self.stages:
            # a hand-written plan's stages carry no prediction: said so, never a "?"
            predicted = (
                ", not predicted"
                if s.predicted_samples_per_s is None
                else f" vs {s.predicted_samples_per_s:,.0f} predicted"
            )
            work = "not measured" if s.work_share is None else f"{s.work_share:.0%}"
            units = "no plan published yet" if s.resource == UNKNOWN else f"{s.units} x {s.resource}"
            out.append(
                f"heterps launch: stage {s.stage} ({units}, {s.kind}): {s.samples_per_s:,.0f} "
                f"samples/s measured{predicted}, work {work}"
            )
        cost = (
            "cost unknown (no prices)"
            if self.cost_per_hour is None
            else (
                f"{self.cost_per_hour:.4g}/h"
                + (
                    f" ({self.idle_cost_per_hour:.4g}/h of it for hosts held that run nothing of the round)"
                    if self.idle_cost_per_hour
                    else ""
                )
                + f", {self.cost_so_far or 0.0:.4g} so far, "
                + (
                    f"{self.cost_per_million_samples:.4g} per million samples measured"
                    if self.cost_per_million_samples is not None
                    else "no samples yet"
                )
            )
        )
        for t in self.trainers:
            if t.slow and t.share is not None:
                out.append(
                    f"heterps launch: host {t.host} (trainer {t.index}): {t.samples_per_s:,.0f} samples/s, "
                    f"{t.share:.0%} of its peers' in the same pass: slow (a busy or throttled host, a stopped process); "
                    "it bounds every pass it is in"
                )
        out.append(
            f"heterps launch: job (round {self.round}): {self.samples_per_s:,.0f} samples/s over the last "
            f"{self.window_s:.0f} s, {self.samples:,} samples trained; {cost}"
        )
        out.append(f"heterps launch: {self.over_job_line()}")
        verdict = None if self.learning is None else self.learning.verdict
        if verdict is not None:
            cost = "what it costs" if self.cost_per_hour is None else f"{self.cost_per_hour:.4g}/h"
            out.append(f"heterps launch: NOT LEARNING: {verdict}; the job costs {cost} all the same")
        return out

    def over_job_line(self) -> str:
        """The job's figures over the job, and over the running round when it is not the first."""
        per_million = self.cost_per_million_samples_over_job
        line = (
            f"over the job: {self.samples:,} samples in {self.seconds_over_job:,.0f} s, "
            f"{_figure(self.samples_per_s_over_job)} samples/s; "
            + (
                "cost not known (no prices)"
                if self.cost_so_far is None
                else f"cost {self.cost_so_far:.4g}, {_figure(per_million, '.4g')} per million samples"
            )
        )
        if self.learning is not None:
            line += f"; last {self.learning.text()}"
        if self.round > 0:
            line += f" (round {self.round}: {self.samples_over_round:,} samples in {self.seconds_over_round:,.0f} s" + (
                f", {_figure(self.cost_per_million_samples_over_round, '.4g')} per million samples)"
                if self.cost_over_round is not None
                else ")"
            )
        return line


def _figure(value: float | None, spec: str = ",.0f") -> str:
    return "none yet" if value is None or not math.isfinite(value) else format(value, spec)


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


@dataclass
class _Snapshot:
    at: float
    samples: int  # the round's stage 1 trainers' samples, summed
    cpu: dict[str, tuple[int, float, int]]  # process key -> (stage, cpu seconds, cores)
    trainers: dict[str, tuple[str, int, int, int]] = field(
        default_factory=dict
    )  # key -> (host, index, samples, passes)
    learned: dict[str, tuple[int, float | None, float | None, bool | None]] = field(
        default_factory=dict
    )  # key -> (passes, its last pass's AUC, loss, finite)


@dataclass
class Gauge:
    """One job's measured figures (module doc).  ``window_s``: the moving window; ``every_s``: how often a Rates is
    made; ``gpu_stages``: the stages whose trainers run on a GPU (CPU time does not see their work)."""

    window_s: float = 30.0
    every_s: float = 10.0
    gpu_stages: frozenset[int] = frozenset()
    straggler_share: float = 0.6  # a trainer under this share of its peers' median samples/s is slow
    history: list[_Snapshot] = field(default_factory=list)
    round: int = -1
    samples_before: int = 0  # trained by the rounds before this one
    cost_so_far: float = 0.0
    cost_until: float | None = None  # the time cost_so_far counts up to
    job_started: float | None = None  # when the gauge first saw the job
    round_started: float = 0.0  # ... and the running round
    cost_before_round: float = 0.0  # cost_so_far when the running round was first seen
    last_made: float = -math.inf
    priced_late: bool = False  # the round's plan came after its first snapshot: the next Rates is due at once
    plan: Mapping[str, Any] | None = None
    prices: Mapping[str, float] = field(default_factory=dict)
    idle: Mapping[str, int] = field(default_factory=dict)  # units by type held but running nothing of the round

    def observe(
        self, now: float, round_number: int, meters: Mapping[str, Mapping[str, Any]], plan: Mapping[str, Any] | None
    ) -> Rates | None:
        """The round's meter records and plan record at ``now`` (unix seconds); a Rates when one is due."""
        if self.job_started is None:
            self.job_started = now
        if round_number != self.round:
            self._new_round(now, round_number)
        if plan is not None and plan.get("plan"):
            # a plan published once the round ran a while prices the time before it: its cost is shown at once,
            # not an interval later (a short job could end unpriced on a dashboard)
            self.priced_late = self.priced_late or (self.plan is None and bool(self.history))
            self.plan = plan["plan"]
            self.prices = {str(k): float(v) for k, v in (plan.get("prices") or {}).items()}
        self._add_cost(now)
        self.history.append(_snapshot(now, meters))
        while len(self.history) > 2 and self.history[1].at <= now - self.window_s:
            self.history.pop(0)
        if (now - self.last_made < self.every_s and not self.priced_late) or len(self.history) < 2:
            return None
        self.last_made, self.priced_late = now, False
        return self._rates(now)

    def _new_round(self, now: float, number: int) -> None:
        if self.history:
            self.samples_before += self.history[-1].samples
        self._add_cost(now)
        self.cost_until = now  # the new round's units from now, priced once its plan says their prices
        self.round_started, self.cost_before_round = now, self.cost_so_far
        # the round's first figures a whole interval after it is first seen
        self.round, self.history, self.plan, self.prices, self.last_made = number, [], None, {}, now

    def _add_cost(self, now: float) -> None:
        """Cost so far up to ``now``.  A round's units are paid for from the round's start: until the plan record
        says their prices (trainer 0 publishes it once it planned, seconds in), the time waits to be priced."""
        per_hour = self.cost_per_hour()
        if self.cost_until is None:
            self.cost_until = now
        elif per_hour is not None:
            self.cost_so_far += per_hour * max(0.0, now - self.cost_until) / 3600.0
            self.cost_until = now

    def cost_per_hour(self) -> float | None:
        """What the job pays an hour: the running plan's units, and every unit it holds that runs nothing of the
        round (a host standing by, one back or joined and waiting for the checkpoint); None where a price is not
        known (never a cost that leaves something out)."""
        running, idle = self.plan_cost_per_hour(), self.idle_cost_per_hour()
        return None if running is None or idle is None else running + idle

    def plan_cost_per_hour(self) -> float | None:
        if self.plan is None or not self.prices:
            return None
        stages = self.plan.get("stages") or ()
        if any(str(s.get("resource")) not in self.prices for s in stages):
            return None
        return float(sum(int(s.get("units", 0)) * self.prices[str(s["resource"])] for s in stages))

    def idle_cost_per_hour(self) -> float | None:
        if any(kind not in self.prices for kind in self.idle):
            return None
        return float(sum(units * self.prices[kind] for kind, units in self.idle.items()))

    def _rates(self, now: float) -> Rates:
        first, last = self.history[0], self.history[-1]
        span = max(1e-9, last.at - first.at)
        rate = max(0, last.samples - first.samples) / span
        stages = tuple(self._stage(n, s, first, last, span, rate) for n, s in enumerate(self._stages(), 1))
        plan = self.plan or {}
        predicted = plan.get("throughput") or None
        return Rates(
            round=self.round,
            at=now,
            window_s=span,
            samples=self.samples_before + last.samples,
            samples_per_s=rate,
            predicted_samples_per_s=float(predicted) if predicted else None,
            target_samples_per_s=plan.get("required_throughput"),
            cost_per_hour=self.cost_per_hour(),
            cost_so_far=self.cost_so_far if self.cost_per_hour() is not None else None,
            stages=stages,
            trainers=self._trainers(first, last, span),
            learning=_learning(last),
            idle_cost_per_hour=self.idle_cost_per_hour() if self.idle else None,
            seconds_over_job=now - (self.job_started if self.job_started is not None else now),
            samples_over_round=last.samples,
            seconds_over_round=now - self.round_started,
            cost_over_round=self.cost_so_far - self.cost_before_round if self.cost_per_hour() is not None else None,
        )

    def _trainers(self, first: _Snapshot, last: _Snapshot, span: float) -> tuple[TrainerRate, ...]:
        """Each stage 1 CPU trainer seen at both ends of the window, against its peers in the same pass."""
        seen = {key: (now, first.trainers[key]) for key, now in last.trainers.items() if key in first.trainers}
        if not seen:
            return ()
        rate = {key: max(0, now[2] - before[2]) / span for key, (now, before) in seen.items()}
        current = min(now[3] for now, _ in seen.values())  # the pass the slowest is in
        in_pass = {key for key, (now, before) in seen.items() if now[3] == before[3] == current}
        out = []
        for key in sorted(seen, key=lambda k: seen[k][0][1]):
            host, index = seen[key][0][0], seen[key][0][1]
            peers = [rate[k] for k in in_pass if k != key]
            median = statistics.median(peers) if key in in_pass and peers else None
            slow = median is not None and median > 0 and rate[key] < self.straggler_share * median
            out.append(TrainerRate(host, index, rate[key], median, slow))
        return tuple(out)

    def _stages(self) -> list[Mapping[str, Any]]:
        stages = list((self.plan or {}).get("stages") or ())
        if stages:
            return stages
        seen = sorted({stage for snap in self.history for stage, _, _ in snap.cpu.values()})
        return [{"resource": UNKNOWN, "kind": "cpu", "units": 0} for _ in seen] or [
            {"resource": UNKNOWN, "kind": "cpu"}
        ]

    def _stage(
        self, number: int, stage: Mapping[str, Any], first: _Snapshot, last: _Snapshot, span: float, rate: float
    ) -> StageRate:
        kind = str(stage.get("kind", "cpu"))
        count = len(self._stages())
        waiting = "nothing" if count == 1 else "next" if number == 1 else "previous" if number == count else "either"
        work = None
        if number not in self.gpu_stages:
            used, cores = 0.0, 0
            for proc, (proc_stage, cpu, proc_cores) in last.cpu.items():
                if proc_stage != number or proc not in first.cpu:
                    continue
                used += max(0.0, cpu - first.cpu[proc][1])
                cores += proc_cores
            if cores:
                work = min(1.0, used / (span * cores))
        predicted = stage.get("throughput") or None
        resource = str(stage.get("resource", UNKNOWN))
        return StageRate(
            stage=number,
            resource=resource,
            kind=kind,
            units=int(stage.get("units", 0)),
            predicted_samples_per_s=float(predicted) if predicted else None,
            samples_per_s=rate,
            work_share=work,
            waiting_for=waiting,
            price_per_hour=self.prices.get(resource),
        )


def _snapshot(now: float, meters: Mapping[str, Mapping[str, Any]]) -> _Snapshot:
    samples = 0
    cpu: dict[str, tuple[int, float, int]] = {}
    trainers: dict[str, tuple[str, int, int, int]] = {}
    learned: dict[str, tuple[int, float | None, float | None, bool | None]] = {}
    for name, record in meters.items():
        try:
            stage, cpu_s, cores = int(record["stage"]), float(record["cpu_s"]), max(1, int(record.get("cores") or 1))
        except (KeyError, TypeError, ValueError):
            continue  # a record of another version, or garbage: not counted
        if record.get("role") == "trainer" and isinstance(record.get("samples"), int):
            samples += max(0, int(record["samples"]))
            passes, index = record.get("passes"), record.get("index")
            if stage == 1 and isinstance(passes, int) and isinstance(index, int):
                trainers[name] = (str(record.get("host") or "?"), index, max(0, int(record["samples"])), passes)
                if passes > 0 and "pass_auc" in record:  # a trainer that says what its last pass learned
                    finite = record.get("pass_finite")
                    learned[name] = (
                        passes,
                        _number(record.get("pass_auc")),
                        _number(record.get("pass_loss")),
                        finite if isinstance(finite, bool) else None,
                    )
        cpu[name] = (stage, cpu_s, cores)
    return _Snapshot(now, samples, cpu, trainers, learned)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _learning(snapshot: _Snapshot) -> Learning | None:
    """The stage 1 trainers' last finished pass: at the fewest passes any of them finished, their mean AUC and
    loss; not finite when any says so."""
    if not snapshot.learned:
        return None
    values = list(snapshot.learned.values())
    aucs = [auc for _, auc, _, _ in values if auc is not None]
    losses = [loss for _, _, loss, _ in values if loss is not None]
    finite = [ok for _, _, _, ok in values if ok is not None]
    return Learning(
        passes=min(passes for passes, _, _, _ in values),
        auc=round(statistics.fmean(aucs), 6) if aucs else None,
        loss=statistics.fmean(losses) if losses else None,
        finite=all(finite) if finite else None,
    )
