"""The adaptive rules of a job's life (docs/adaptive.md): what the launch's pure machine (launch/machine.py) does with
measured rates and with a proposal, and when a slow host is replaced.  The one module where a move is decided: a
window (``Measured``) may ask the shell to reconsider the plan (``Reconsider``); its answer (``Proposed``) is judged
here, once, by rules (a) to (e); a decided move waits for the next complete checkpoint (machine.py:
``_checkpoint_complete``), and its plan is the plan the next round runs (``Replan.decided``), never planned again.

Pure, as the machine: no I/O, no thread, no clock.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any, Mapping, Sequence

from heterps_paddle.launch.events import (
    Action,
    AdaptAdvice,
    AskCheckpoint,
    Measured,
    OnScale,
    Proposal,
    Proposed,
    Reconsider,
    ReplaceAdvice,
)
from heterps_paddle.launch.gauge import Rates
from heterps_paddle.launch.state import Job, JobState, Replacement, with_seen

WINDOWS_KEPT = 6  # whole windows a reconsideration corrects the model by (by default a window every 10 s: a minute)


def stands_in(job: Job, actions: list[Action]) -> tuple[Job, list[Action]]:
    """A machine standing by while a slow host waits for one to replace it: a checkpoint at the end of the running
    pass, and the move onto it from there (``_checkpoint_complete``)."""
    slow = job.seen.replacing
    if slow is None or job.state is not JobState.RUNNING or not job.back:
        return job, actions
    hosts = ", ".join(sorted(job.back))
    return job, [*actions, AskCheckpoint(f"host(s) {hosts} stand in for host {slow.host}, slow")]


def on_measured(job: Job, event: Measured, now: float) -> tuple[Job, list[Action]]:
    """The running round's rates, kept: what the plan delivers.  With --adapt, a reconsideration asked for, at most
    every ``every_s``: when the target has been missed over ``sustain_s``, or (past the cooldown after a move) to
    look for a cheaper or faster plan."""
    if job.state is not JobState.RUNNING or event.rates.round != job.round.number:
        return job, []
    adapt = job.rules.adapt
    kept = tuple(r for r in job.seen.rates if now - r[0] <= 2 * adapt.sustain_s) + ((now, event.rates),)
    # the windows a refit can correct the model by: whole, and trained (a round's start says nothing of the plan)
    trained = event.whole and event.rates.samples_per_s > 0
    windows = (*job.seen.windows, event.rates)[-WINDOWS_KEPT:] if trained else job.seen.windows
    slow = _slow_windows(job.seen.slow_windows, event.rates)
    trained_at = job.seen.trained_at
    if trained_at is None and event.rates.samples_per_s > 0:
        trained_at = now
    counted = trained_at is not None
    job = with_seen(
        replace(job, measured=event.rates),
        rates=kept,
        windows=windows,
        slow_windows=slow,
        trained_at=trained_at,
        trained_sum=job.seen.trained_sum + (event.rates.samples_per_s if counted else 0.0),
        trained_windows=job.seen.trained_windows + counted,
    )
    if not adapt.active or job.leaving or job.back or job.seen.adapting is not None:
        return job, []
    if job.seen.replacing is not None:
        return job, []  # the round's decision is made: a machine to stand in for the slow host
    # a host is replaced only past the cooldown after a move: the round after one starts its processes anew (a fresh
    # machine's first pass reads cold files), and under load the machine that stood in for a slow host was judged
    # on its first seconds, named slow in turn and a second machine asked of --on-scale
    cooled = _cooled(job)
    straggler = _straggler(job, now) if cooled else None
    if straggler is not None:
        return _replace(job, *straggler)
    slow_host = any(n and h != job.round.coordinator for h, n in job.seen.slow_windows.items())
    if cooled and slow_host and _short_of_target(job, now):
        # a host measured slow may explain the miss: its next comparisons decide first.  The refit corrects a type,
        # and more units of it would not help: the slow host bounds every pass it is in
        return job, []
    if job.seen.asked_at is not None and now - job.seen.asked_at < adapt.every_s:
        return job, []
    if not job.seen.windows:
        # no whole window yet to correct the model by: a reconsideration could only say "no proposal" (a fresh
        # clone's default-settings run said it once a round, at its first measured window)
        return job, []
    missed = _missed(job, now)
    if missed is None and not _cooled(job):
        return job, []
    why = missed or _looking_for(job)
    return with_seen(job, asked_at=now), [Reconsider(why, missed is not None, job.seen.windows, job.refit)]


def _looking_for(job: Job) -> str:
    """What a reconsideration past the cooldown looks for, by the job's objective (the newest window's)."""
    rates = job.measured
    if rates is not None and rates.target_samples_per_s:
        return "looking for a plan that meets the target for less, on the measured rates"
    # no target: under a budget the fastest plan within it, else the cheapest a sample (the proposal says which)
    return "looking for a faster plan within the budget, or one cheaper a sample, on the measured rates"


def _missed(job: Job, now: float) -> str | None:
    """Why the target counts as missed (None: it does not): every rates of the last ``sustain_s`` under it by more
    than ``miss``, and the round has trained that long (Seen.trained_at: its start is no miss)."""
    adapt, rates = job.rules.adapt, job.seen.rates
    judged = _judged(job, now)
    if judged is None:
        return None
    target, started = judged
    window = [r for t, r in rates if now - t <= adapt.sustain_s and t >= started]
    floor = _floor(job, target)
    if not window or any(r.samples_per_s >= floor for r in window):
        return None
    worst = max(r.samples_per_s for r in window)
    if worst <= 0:
        # a span that trained nothing is a pause, not a slow plan: under two busy loops a checkpoint's capture outlasted
        # the tests' 10 s sustain, and the job "missed" at 0 samples/s and moved to a smaller plan that mends nothing
        return None
    return (
        f"the target of {target:,.0f} samples/s was missed for {adapt.sustain_s:.0f} s "
        f"(at most {worst:,.0f} samples/s measured, under {floor:,.0f})"
    )


def _slow_windows(counts: Mapping[str, int], rates: Rates) -> dict[str, int]:
    """Each host's slow comparisons in a row after ``rates``' window: a host whose trainers had peers in the same
    pass (launch/gauge.py: TrainerRate) counts one more when every one of them was slow, and starts again from 0 when
    one was not; a host no window compared (its trainers alone in their pass, or waiting) keeps its count.  Rows in
    a row, not windows in a span of time: a slow trainer has peers only at the start of each pass, until they end
    their share and wait for it."""
    compared: dict[str, bool] = {}
    for t in rates.trainers:
        if t.share is not None:  # peers that trained in the window (none trains across a checkpoint: no comparison)
            compared[t.host] = compared.get(t.host, True) and bool(t.slow)
    out = dict(counts)
    for host, slow in compared.items():
        out[host] = out.get(host, 0) + 1 if slow else 0
    return out


def _straggler(job: Job, now: float) -> tuple[Replacement, str] | None:
    """The host to replace, and why, or None: a host of the round (not the coordinator's, which cannot go) whose
    trainers were slow in ``straggler_windows`` comparisons in a row while the job missed its target on average over
    the rates kept (at least ``sustain_s`` of them).  On average, not every window: the windows that see the fast
    trainers' burst at a pass's start meet the target, and those of the slow one's tail miss it by far; the pass as
    a whole is what the target is about."""
    adapt, rates = job.rules.adapt, job.seen.rates
    counts = job.seen.slow_windows
    hosts = [
        h
        for h, n in counts.items()
        if n >= adapt.straggler_windows and h in job.round.members and h != job.round.coordinator and h not in job.lost
    ]
    short = _short_of_target(job, now)
    if not hosts or short is None:
        return None
    target, mean, floor, span = short
    shares = {h: _newest_share(rates, h) for h in hosts}
    host = min(hosts, key=lambda h: (shares[h], h))
    stages = rates[-1][1].stages
    first = stages[0] if stages else None
    resource = first.resource if first is not None else "?"
    price = float(first.price_per_hour or 0.0) if first is not None else 0.0
    found = Replacement(host, resource, price, shares[host], counts[host])
    why = (
        f"host {host} is slow: its trainers trained {found.share:.0%} of their peers' samples/s in the same pass, "
        f"slow in {found.windows} comparisons in a row, and the job missed its target of {target:,.0f} samples/s "
        f"({mean:,.0f} on average over the last {span:.0f} s, under {floor:,.0f})"
    )
    return found, why


def _judged(job: Job, now: float) -> tuple[float, float] | None:
    """(target, since) when the round can be judged against its target: it has one, and it has trained for at least
    ``sustain_s`` since ``since`` (Seen.trained_at: the windows of its processes starting are no miss)."""
    rates = job.seen.rates
    target = rates[-1][1].target_samples_per_s if rates else None
    started = job.seen.trained_at
    if not target or started is None or now - started < job.rules.adapt.sustain_s:
        return None
    return float(target), started


def _short_of_target(job: Job, now: float) -> tuple[float, float, float, float] | None:
    """(target, mean, floor, span) when the windows kept since the round first trained (``_judged``) trained under
    the target by more than ``miss`` on average over their ``span`` seconds; None when they did not, or the round
    cannot be judged yet.  A checkpoint's idle windows count."""
    judged = _judged(job, now)
    if judged is None:
        return None
    target, started = judged
    kept = [(t, r) for t, r in job.seen.rates if t >= started]
    mean = statistics.fmean(r.samples_per_s for _, r in kept)
    floor = _floor(job, target)
    return (target, mean, floor, now - kept[0][0]) if mean < floor else None


def _floor(job: Job, target: float) -> float:
    """What a window must train not to count as missing ``target``: the one home of the miss margin."""
    return target * (1.0 - job.rules.adapt.miss)


def _round_misses(job: Job) -> bool:
    """Whether the round's windows since it first trained missed its target by more than ``miss`` on average."""
    rates, seen = job.measured, job.seen
    if rates is None or not rates.target_samples_per_s or not seen.trained_windows:
        return False
    floor = _floor(job, rates.target_samples_per_s)
    return seen.trained_sum / seen.trained_windows < floor


def _newest_share(rates: Sequence[tuple[float, Rates]], host: str) -> float:
    """``host``'s trainers' lowest share of their peers' samples/s in the newest window that compared them."""
    for _, r in reversed(rates):
        shares = [t.share for t in r.trainers if t.host == host and t.share is not None]
        if shares:
            return float(min(shares))
    return 0.0


def _replace(job: Job, slow: Replacement, why: str) -> tuple[Job, list[Action]]:
    """A slow host replaced: a machine standing by stands in at once (a checkpoint asked for); else a unit of its
    type is asked of ``--on-scale``.  The move comes at the first checkpoint after one stands by; the slow host is let
    go with it.  Replaced, not joined by one more: each trainer reads its own share of the files, so a slow one
    bounds every pass it is in whatever units are added.  In advise mode the job says so, once a round."""
    if job.rules.adapt.mode != "on" or not job.rules.checkpoints:
        said = f"replace {slow.host}"
        if said in job.seen.advised:
            return job, []
        return with_seen(job, advised=job.seen.advised | {said}), [ReplaceAdvice("would replace", why, slow)]
    job = with_seen(job, replacing=slow)
    advice = ReplaceAdvice("replace", why, slow)
    standing = sorted(job.seen.spares - job.lost)
    if standing:
        job = replace(job, back={**job.back, **{h: job.newest_checkpoint for h in standing}})
        return stands_in(job, [advice])
    return job, [advice, OnScale({slow.resource: 1}, {}, f"{why}: a unit of {slow.resource} to stand in for it")]


def _cooled(job: Job) -> bool:
    """Whether ``cooldown`` checkpoints passed since the last adaptive move.  A miss a proposal reaches does not wait
    for them (rule a); a replacement, a wish for units, and the hold for a slow host's judgment do."""
    return job.moved_at is None or job.newest_checkpoint - job.moved_at >= job.rules.adapt.cooldown


def on_proposed(job: Job, event: Proposed, now: float) -> tuple[Job, list[Action]]:
    """The shell's proposal: a move at the next complete checkpoint when (a) the target is missed and it reaches
    it, or no plan reaches it (more units neither) and it is at least ``faster`` faster; (b) it meets the target for
    at least ``saving`` less and what it saves over the rest of the job beats the move's own cost; (c) under a
    budget, it is at least ``faster`` faster within it.  A move for speed alone (a's second case, c) must also train
    more over the rest of the job than the running plan, the move's own time included.  Units the job has not are
    wished for when only they reach a missed target.  In advise mode the job does nothing but say so (once a round
    for each plan)."""
    p = event.proposal
    if job.state is not JobState.RUNNING or job.seen.adapting is not None or job.seen.replacing is not None:
        return job, []  # a move decided already (a plan, or a slow host's replacement): the round's decision
    if p is None:
        return job, []
    if p.correction is not None:
        job = replace(job, refit=p.correction)  # the newest correction: later plans are made on it
    if p.same:
        p = replace(p, meets_target=False, samples_per_s=0.0)  # no move to the plan that runs: only a wish
    adapt = job.rules.adapt
    missed = _missed(job, now)
    measured = job.measured.samples_per_s if job.measured is not None else p.current_samples_per_s
    why = None
    if missed and p.meets_target:
        why = f"{missed}; {p.summary} reaches it"
    elif missed and _cooled(job) and not p.wanted and p.samples_per_s >= p.current_samples_per_s * (1 + adapt.faster):
        # out of reach on any plan, more units included: the plan that comes closest, when it does by a margin and
        # what it trains more over the rest of the job beats the training the move stops
        faster = p.samples_per_s / p.current_samples_per_s - 1
        pays = _faster_pays(job, now, p.samples_per_s, p.current_samples_per_s)
        if pays is not None:
            why = f"{missed}, and no plan reaches it; {p.summary} is {faster:.0%} faster on the measured rates: {pays}"
    elif _cooled(job) and p.target and p.meets_target and p.better_by >= adapt.saving:
        horizon = _horizon(job, now)
        saved = (p.current_cost_per_hour - p.cost_per_hour) * horizon
        costs = p.current_cost_per_hour * adapt.move_s  # the job paid while it did not train
        if saved > costs:
            why = (
                f"{p.summary} meets the target for {p.better_by:.0%} less: saves {saved / 3600:.4g} over the next "
                f"{horizon:.0f} s, the move costs {costs / 3600:.4g}"
            )
    elif _cooled(job) and p.budget and p.cost_per_hour <= p.budget and p.samples_per_s >= measured * (1 + adapt.faster):
        pays = _faster_pays(job, now, p.samples_per_s, measured)
        if pays is not None:
            faster = p.samples_per_s / measured - 1
            why = f"{p.summary} is {faster:.0%} faster within the budget of {p.budget:.4g}/h: {pays}"
    elif _cooled(job) and p.target is None and p.budget is None:
        why = _cheaper_per_sample(job, now, p)
    if why is None:
        # a wish costs the user a machine: only when the round's mean since it first trained misses too, not when a
        # run of noisy windows (a checkpoint's pause among them) dipped under the floor: the jittering job wished so
        # nor right after a move (before the cooldown): the new round has not yet shown what it trains
        if missed and p.wanted and not job.seen.wished and _round_misses(job) and _cooled(job):
            job = with_seen(job, wished=True)
            wish = f"{missed}: the job needs {_units(p.wanted)} more"
            actions: list[Action] = [AdaptAdvice("wish", wish, p)]
            if adapt.mode == "on":
                actions.append(OnScale(dict(p.wanted), dict(p.released), wish))
            return job, actions
        return job, []
    if adapt.mode != "on":
        if p.summary in job.seen.advised:
            return job, []  # said once a round: the log and the console are not flooded by the same advice
        return with_seen(job, advised=job.seen.advised | {p.summary}), [AdaptAdvice("would move", why, p)]
    job = with_seen(job, adapting=replace(p, why=why), adapt_from=job.newest_checkpoint)
    return job, [AdaptAdvice("move", why, p), AskCheckpoint(f"the plan follows the job: {why}")]


def _cheaper_per_sample(job: Job, now: float, p: Proposal) -> str | None:
    """(e) Without a target or a budget the job's objective is what it pays a sample: why ``p`` is worth a move
    (None: it is not).  It must train at no lower rate than the running plan, both on the corrected model, for at
    least ``saving`` less a sample, and what it saves over the rest of the job must beat the move's own cost (the
    running plan's cost an hour over ``move_s``, training nothing)."""
    adapt = job.rules.adapt
    if p.samples_per_s <= 0 or p.current_samples_per_s <= 0 or p.samples_per_s < p.current_samples_per_s:
        return None
    now_per_sample = p.current_cost_per_hour / p.current_samples_per_s
    new_per_sample = p.cost_per_hour / p.samples_per_s
    less = 1.0 - new_per_sample / now_per_sample if now_per_sample > 0 else 0.0
    if less < adapt.saving:
        return None
    horizon = _horizon(job, now)
    trained = p.samples_per_s * max(0.0, horizon - adapt.move_s)  # samples over the rest of the job, moved
    saved = (now_per_sample - new_per_sample) * trained / 3600.0
    costs = p.current_cost_per_hour * adapt.move_s / 3600.0
    if saved <= costs:
        return None
    return (
        f"{p.summary} trains a sample for {less:.0%} less at no lower rate (no target or budget: the job's cost per "
        f"sample is its objective): saves {saved:.4g} over the next {horizon:.0f} s, the move costs {costs:.4g}"
    )


def _horizon(job: Job, now: float) -> float:
    """How long the job is expected to run on: the setting, or as long again as it has run."""
    return job.rules.adapt.horizon_s or max(0.0, now - job.rules.started_at)


def _faster_pays(job: Job, now: float, faster: float, running: float) -> str | None:
    """Why a move to a plan training ``faster`` samples/s than the ``running`` one pays, or None when it does not:
    over the horizon it must train more than the running plan would, the move's own time (not training) included.
    Without it a short job moved for speed and lost: ``heterps bench adapt`` measured a move decided 26 s into a
    job of about two minutes cost 1.35x the fixed plan's per sample, its restart included."""
    horizon, move = _horizon(job, now), job.rules.adapt.move_s
    more = faster * max(0.0, horizon - move) / (running * horizon) - 1 if horizon > 0 and running > 0 else -1.0
    if more <= 0:
        return None
    return f"over the next {horizon:.0f} s it trains {more:.0%} more, the move's {move:.0f} s included"


def _units(wanted: Any) -> str:
    return ", ".join(f"{units} x {rtype}" for rtype, units in sorted(wanted.items()))
