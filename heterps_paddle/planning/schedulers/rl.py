"""``rl``: the HeterPS scheduler, an LSTM policy trained by REINFORCE on the cost model.

The policy reads one feature vector per layer (program order) with a bidirectional LSTM, so each layer's choice
sees the whole model, and gives per layer a distribution over resource types and two move logits: keep the
previous layer's type, go back to the type of the run before, or draw a type (see ``_rollout``). Each iteration
samples a batch of assignments, scores them with the cost model (log cost relative to the best single-type plan,
with a penalty for plans over ``max_units``), and follows the policy gradient with a risk-seeking baseline (only
the batch's top-quantile samples are reinforced) and a small entropy bonus; the policy's best plan is replayed in
every batch. Restarts with fresh policies explore other modes. The starting preference (prior) and a feature per
layer and type come from ``stage_share``: the least per-layer share of any stage of that type holding the layer.

The best distinct samples of the training (``Elites``) are then refined by descent over moves scored from the
stage tables (``refine.py``: segment and split moves, from ``plan_moves.py``; ejections where shared limits
bind; re-covers of a few stages, from ``window_covers.py``), best first, until 60% of the time budget; the
cheapest is improved by a priced re-cover (window DPs under unit prices steered by the shared limits), a
strategic oscillation and kicks while the budget lasts; the cheapest refined plan wins, and the cheapest
sample's own cost is reported as ``refined_from_cost``. It never calls ``exact`` or ``brute``. With a seed it gives the same
plan every time where the fixed restarts x iterations end before the budget (small and medium models); where
the budget ends training (hundreds of layers x dozens of types) the plan can depend on the machine's speed.

The policy is numpy (``policy.py``: the LSTM's forward and backward written out, and Adam): rl, like the rest
of the planning half, runs without Paddle.
"""

from __future__ import annotations

import time

import numpy as np
from numpy.typing import ArrayLike, NDArray

from heterps_paddle.planning.cost_model import CostModel, Evaluation
from heterps_paddle.planning.schedulers.base import Schedule, Scheduler, no_plan_reason
from heterps_paddle.planning.schedulers.plan_moves import MoveScorer
from heterps_paddle.planning.schedulers.policy import (
    RETURN_FEATURES,
    STAY_FEATURES,
    Adam,
    Policy,
    RolloutRecord,
)
from heterps_paddle.planning.schedulers.refine import descend, oscillate, reprice

KICK_ROUNDS = 4  # oscillation rounds after each kick (the best plan's own oscillation has refine's default)
# The elites' descents end at this share of the time budget (the first always runs): on hundreds of layers x dozens
# of types one descent takes seconds, and the priced re-cover after them does more with the time.
STARTS_SHARE = 0.6


def fractional_cost(cost_model: CostModel) -> NDArray[np.float64]:
    """[layers, types]: what a layer would cost per hour on a type if units were fractional (its busy time at
    the target rate, or the memory share its parameters need, times the price). Ignores the unit granularity and
    the boundaries that make the real problem hard, but says which types suit which layers."""
    busy_units = cost_model.base_time.T * cost_model.throughput
    holding_units = np.array(
        [
            [layer.param_bytes / t.memory if t.memory > 0 else 1e9 for t in cost_model.types]
            for layer in cost_model.profile.layers
        ]
    )
    cost: NDArray[np.float64] = np.maximum(busy_units, holding_units) * cost_model.price[None, :] + 1e-12
    return cost


def stage_share(cost_model: CostModel) -> NDArray[np.float64]:
    """[layers, types]: the least share of any stage of a type that holds the layer, a stage's cost per hour split
    evenly over its layers (inf where every stage of the type holding it breaks the type's limit alone). Where a
    layer belongs depends on the stages around it more than on the layer: one that is slow on a cheap type alone
    can ride in a long stage whose one unit is cheap, and a layer cheap alone on a type may only ever come with
    neighbours that make every stage of that type dear."""
    cost = cost_model.stage_tables().cost  # [type, start, end], inf where the stage breaks its type's limit
    n = cost_model.num_layers
    bounds = np.arange(n + 1)
    length = bounds[None, :] - bounds[:, None]  # [start, end]
    with np.errstate(divide="ignore", invalid="ignore"):
        per_layer = np.where(length[None] > 0, cost / np.maximum(length, 1)[None], np.inf)
    # best[t, s, l] = the cheapest share of a stage [s, e) with e > l; then the cheapest over s <= l.
    from_end = np.minimum.accumulate(per_layer[:, :, ::-1], axis=2)[:, :, ::-1][:, :, 1:]
    holding = np.minimum.accumulate(from_end, axis=1)
    share: NDArray[np.float64] = holding[:, bounds[:n], bounds[:n]].T
    return share


def prior_logits(
    cost_model: CostModel, strength: float, share: NDArray[np.float64] | None = None
) -> NDArray[np.float32]:
    """A starting preference per layer for the types whose stages holding it are cheapest per layer
    (``stage_share``, computed here unless given): -strength * log(share / least share); the fractional cost
    where no stage fits."""
    share = (stage_share(cost_model) if share is None else share).copy()
    unplaceable = ~np.isfinite(share.min(axis=1))
    if unplaceable.any():
        share[unplaceable] = fractional_cost(cost_model)[unplaceable]
    with np.errstate(divide="ignore"):
        relative = np.log(share / share.min(axis=1, keepdims=True))
    logits: NDArray[np.float32] = np.maximum(-strength * relative, -20.0).astype("float32")
    return logits


def layer_features(cost_model: CostModel, in_stage: NDArray[np.float64] | None = None) -> NDArray[np.float32]:
    """[layers, features]: kind, sizes, and per type: fractional and in-stage cost (and whether least), time,
    price, units limit, memory fit, alone-cost, whether alone fits the limit. ``in_stage``: ``stage_share``,
    computed here unless given."""
    profile = cost_model.profile
    n, T = cost_model.num_layers, cost_model.num_types

    def log_standardised(values: ArrayLike) -> NDArray[np.float64]:
        logged: NDArray[np.float64] = np.log10(np.asarray(values, dtype=float) + 1e-12)
        spread = logged.std()
        standardised: NDArray[np.float64] = (logged - logged.mean()) / (spread if spread > 0 else 1.0)
        return standardised

    kind = np.array([[layer.kind == "sparse", layer.kind == "dense"] for layer in profile.layers], dtype=float)
    sizes = np.stack(
        [
            log_standardised([getattr(layer, field) + 1 for layer in profile.layers])
            for field in ("flops", "param_bytes", "io_bytes", "out_bytes")
        ],
        axis=1,
    )
    # Cost of each layer as a stage of its own on each type: the strongest single hint of where it belongs.
    tables = cost_model.stage_tables()
    at, on = np.arange(n)[:, None], np.arange(T)[None, :]
    alone = tables.units[on, at, at + 1] * cost_model.price[None, :]
    within = np.isfinite(tables.cost[on, at, at + 1]).astype(float)
    share = fractional_cost(cost_model)
    in_stage = stage_share(cost_model) if in_stage is None else in_stage
    finite = np.isfinite(in_stage)
    in_stage_capped = np.where(finite, in_stage, in_stage[finite].max() * 10 if finite.any() else 1.0)
    per_type = [
        log_standardised(share + 1e-12),
        (share <= share.min(axis=1, keepdims=True) * 1.0001).astype(float),
        log_standardised(in_stage_capped + 1e-12),
        (in_stage_capped <= in_stage_capped.min(axis=1, keepdims=True) * 1.0001).astype(float),
        log_standardised(cost_model.base_time.T + 1e-15),
        np.broadcast_to(log_standardised(cost_model.price), (n, T)),
        np.broadcast_to(log_standardised(cost_model.max_units.astype(float)), (n, T)),
        np.log10(
            1.0
            + np.array([[layer.param_bytes / max(t.memory, 1.0) for t in cost_model.types] for layer in profile.layers])
        ),
        log_standardised(alone),
        within,
    ]
    features: NDArray[np.float32] = np.concatenate(
        [kind, sizes] + [np.asarray(f, dtype=float) for f in per_type], axis=1
    ).astype("float32")
    return features


class Elites:
    """The best distinct samples of the training (fewest units over the limits, then cheapest): the starts of
    the refinement. Samples of one policy crowd around one mode; those of several restarts do not."""

    def __init__(self, size: int):
        self.size = size
        self._found: dict[bytes, tuple[float, float, NDArray[np.int64]]] = {}

    def offer(self, samples: NDArray[np.int64], excess: NDArray[np.float64], cost: NDArray[np.float64]) -> None:
        for index in np.lexsort((cost, excess))[: self.size]:
            key = samples[index].tobytes()
            if key not in self._found:
                self._found[key] = (float(excess[index]), float(cost[index]), samples[index].copy())
        if len(self._found) > 4 * self.size:
            self._found = dict(sorted(self._found.items(), key=lambda item: item[1][:2])[: self.size])

    def ranked(self) -> list[NDArray[np.int64]]:
        return [entry[2] for entry in sorted(self._found.values(), key=lambda entry: entry[:2])[: self.size]]


class RLScheduler(Scheduler):
    name = "rl"

    def __init__(
        self,
        seed: int = 0,
        batch_size: int = 128,
        iterations: int = 120,
        restarts: int = 6,
        time_budget: float = 25.0,
        training_share: float = 0.4,
        elites: int = 8,
        hidden_size: int = 32,
        learning_rate: float = 0.02,
        entropy_bonus: float = 0.005,
        top_fraction: float = 0.15,
        patience: int = 30,
        kick_patience: int = 40,
        prior_strengths: tuple[float, ...] = (2.0, 1.0, 3.0, 0.5),
    ):
        super().__init__(seed)
        self.batch_size = batch_size
        self.iterations = iterations  # per restart
        self.restarts = restarts
        # Seconds for training and refinement together; training stops at ``training_share`` of them. On small
        # models the fixed restarts x iterations end first, so a seed gives the same plan on any machine; where
        # the budget binds (hundreds of layers and dozens of types) the plan can depend on the machine's speed.
        self.time_budget = time_budget
        self.training_share = training_share
        self.elites = elites  # distinct samples refined, best first, while the budget lasts
        self.hidden_size = hidden_size
        self.learning_rate = learning_rate
        self.entropy_bonus = entropy_bonus
        self.top_fraction = top_fraction
        self.patience = patience  # a restart ends once its policy is nearly deterministic and stuck this long
        self.kick_patience = kick_patience  # the refinement stops after this many kicks in a row found nothing
        self.prior_strengths = prior_strengths  # cycled over restarts: how much the prior steers the start
        # (restart, iteration, best cost, entropy, stay share) when set to a list
        self.trace: list[tuple[int, int, float | None, float, float]] | None = None

    def search(self, cost_model: CostModel) -> Schedule:
        started = time.perf_counter()
        elites, sampled = self._train(cost_model, started)
        scorer = MoveScorer(cost_model)
        best: Evaluation | None = None
        deadline = started + self.time_budget
        starts = elites.ranked()
        for start in starts:
            # Without the jumps at its end (ejections, re-covers: most of a descent's time on a large plan); the
            # best start gets them in the priced re-cover and the oscillation after it.
            refined = descend(cost_model, start, scorer, deadline, jumps=False)
            if refined.feasible and (best is None or refined.cost_per_hour < best.cost_per_hour):
                best = refined
            if time.perf_counter() > started + STARTS_SHARE * self.time_budget:
                break
        if best is not None:
            best = reprice(cost_model, np.array(best.assignment), scorer, deadline)
            best = self._improve(cost_model, scorer, best, starts, deadline)
        if best is None:
            return Schedule(None, reason=no_plan_reason(cost_model) + " (rl found none)")
        return Schedule(list(best.assignment), refined_from_cost=sampled.cost_per_hour if sampled else None)

    def _improve(
        self,
        cost_model: CostModel,
        scorer: MoveScorer,
        best: Evaluation,
        starts: list[NDArray[np.int64]],
        deadline: float,
    ) -> Evaluation:
        """The refined best plan, improved while it keeps improving and the budget lasts: strategic oscillation
        around the shared limits (``refine.oscillate``), then kicks: a window of the best plan replaced by the
        same window of another of the policy's samples, or a few windows by random types, descended and
        oscillated again, kept where cheaper. Stops after ``kick_patience`` kicks in a row that found nothing
        cheaper (seeded: the same plan on any machine unless the budget ends it first)."""
        best = oscillate(cost_model, np.array(best.assignment), scorer, deadline)
        rng = np.random.default_rng(self.seed * 7919 + 17)
        n, T = cost_model.num_layers, cost_model.num_types
        stale = 0
        while stale < self.kick_patience and time.perf_counter() < deadline:
            kicked = np.array(best.assignment, dtype=np.intp)
            if len(starts) > 1 and rng.random() < 0.5:
                other = starts[int(rng.integers(len(starts)))]
                first = int(rng.integers(n))
                last = first + int(rng.integers(1, max(2, n // 4) + 1))
                kicked[first:last] = other[first:last]
            else:
                for _ in range(int(rng.integers(1, 4))):
                    first = int(rng.integers(n))
                    kicked[first : first + int(rng.integers(1, max(2, n // 8) + 1))] = int(rng.integers(T))
            refined = descend(cost_model, kicked, scorer, deadline)
            if refined.feasible:
                refined = oscillate(cost_model, np.array(refined.assignment), scorer, deadline, KICK_ROUNDS)
            if refined.feasible and refined.cost_per_hour < best.cost_per_hour * (1 - 1e-12):
                best, stale = refined, 0
            else:
                stale += 1
        return best

    def _train(self, cost_model: CostModel, started: float) -> tuple[Elites, Evaluation | None]:
        """Train the policy; the best distinct samples, and the cheapest feasible one."""
        singles = cost_model.single_type_evaluations()
        feasible_singles = [e.cost_per_hour for e in singles if e.feasible]
        # Single-type plans only set the reward's scale; the answer comes from the policy's own samples.
        reference = min(feasible_singles) if feasible_singles else max(e.cost_per_hour for e in singles)
        share = stage_share(cost_model)  # O(n^2 T): once, for the features and every restart's prior
        features = layer_features(cost_model, share).astype(np.float64)
        elites = Elites(self.elites)
        best: Evaluation | None = None
        stop = started + self.training_share * self.time_budget
        # Restarts: one policy converges to one mode of a rugged landscape (unit counts are integers), so
        # fresh policies with differently strong priors explore others; the best sample over all wins. Past the
        # fixed number, another restart follows while the last one found a cheaper plan than all before it.
        restart, improved = 0, True
        while restart < self.restarts or improved:
            strength = self.prior_strengths[restart % len(self.prior_strengths)]
            prior = prior_logits(cost_model, strength, share).astype(np.float64)
            before = best.cost_per_hour if best is not None else np.inf
            best = self._train_one(cost_model, features, prior, reference, best, restart, elites, stop)
            improved = best is not None and best.cost_per_hour < before * (1 - 1e-12)
            restart += 1
            if time.perf_counter() > stop:
                break
        return elites, best

    def _train_one(
        self,
        cost_model: CostModel,
        features: NDArray[np.float64],
        prior: NDArray[np.float64],
        reference: float,
        best: Evaluation | None,
        restart: int,
        elites: Elites,
        stop: float,
    ) -> Evaluation | None:
        seed = self.seed * 1009 + restart
        rng = np.random.default_rng(seed)
        T = cost_model.num_types
        policy = Policy.create(features.shape[-1], self.hidden_size, T, rng)
        optimizer = Adam(policy.params, self.learning_rate)
        unit_table = cost_model.stage_tables().units
        reach = free_reach(unit_table)
        own_best: Evaluation | None = None
        since_better = 0
        iteration = 0
        # The fixed iterations, then more while the best sample still improves (until the training's time).
        while iteration < self.iterations or since_better < self.patience:
            forward = policy.forward(features)
            logits = forward.type_logits + prior
            logits -= logits.max(axis=1, keepdims=True)
            probs = np.exp(logits)
            probs /= probs.sum(axis=1, keepdims=True)
            weights = (policy.params["stay_weights"], policy.params["return_weights"])
            rollout = _rollout(
                rng,
                probs,
                forward.move_logits,
                weights,
                unit_table,
                reach,
                self.batch_size,
                forced=None if own_best is None else np.array(own_best.assignment),
            )
            samples = rollout.samples
            batch = cost_model.evaluate_batch(samples)
            elites.offer(samples, batch.excess_units, batch.cost_per_hour)
            penalised = cost_model.penalised_costs(batch, reference)
            rewards = -np.log(np.maximum(penalised, 1e-12) / max(reference, 1e-12))
            improved = False
            feasible_costs = np.where(batch.feasible, batch.cost_per_hour, np.inf)
            winner = int(np.argmin(feasible_costs))
            if np.isfinite(feasible_costs[winner]) and (
                own_best is None or feasible_costs[winner] < own_best.cost_per_hour - 1e-12
            ):
                own_best, improved = cost_model.evaluate(samples[winner]), True
            since_better = 0 if improved else since_better + 1
            # Risk-seeking baseline: we want the best plan, not a good average one, so only samples in the top
            # quantile of the batch are reinforced (relative to that quantile); the rest carry no gradient.
            threshold = np.quantile(rewards, 1.0 - self.top_fraction)
            advantages = np.maximum(rewards - threshold, 0.0)
            spread = rewards.std()
            if spread > 1e-9:
                advantages /= spread
            _, entropy, grads = policy.loss_and_gradients(forward, prior, rollout, advantages, self.entropy_bonus)
            optimizer.step(grads)
            if self.trace is not None and iteration % 10 == 0:
                self.trace.append(
                    (
                        restart,
                        iteration,
                        own_best.cost_per_hour if own_best else None,
                        entropy,
                        float(rollout.moves[:, 1:, 0].mean()),
                    )
                )
            if time.perf_counter() > stop:
                break
            if entropy < 0.2 and since_better >= self.patience:
                break
            iteration += 1
        if own_best is not None and (best is None or own_best.cost_per_hour < best.cost_per_hour):
            return own_best
        return best


# ---------------------------------------------------------------------------------------------- the policy
#
# Per layer the LSTM (``policy.py``) gives a distribution over types and two "move" logits. A sample is drawn
# layer by layer: keep the previous layer's type (stay), go back to the type of the run before the current one
# (return: a short stage of another type between two stages of one type is a common shape of optimal plans,
# because a stage that grows past one unit pays the dense gradient sync), or draw a fresh type. The move logits
# are shifted by features of the partial sample (what staying would add to the current run's units, how long the
# run is) with learned weights, so the policy can learn where stages should end.


Rollout = RolloutRecord  # [batch, n] samples and what their log-probability needs (``policy.RolloutRecord``)


def free_reach(unit_table: NDArray[np.float64]) -> NDArray[np.int64]:
    """[type, start]: the furthest end of a stage from ``start`` that needs no more units than its first layer
    alone (layers up to there come "for free" on that type). Not monotone in between: boundary traffic depends
    on where a stage ends, so a longer stage can be cheaper than a shorter one."""
    T, n1, _ = unit_table.shape
    n = n1 - 1
    reach = np.zeros((T, n + 1), dtype=np.int64)
    for start in range(n):
        alone = unit_table[:, start, start + 1][:, None]
        free = unit_table[:, start, start + 1 :] <= alone  # [T, ends]
        last_free = free.shape[1] - 1 - np.argmax(free[:, ::-1], axis=1)
        reach[:, start] = start + 1 + last_free
    reach[:, n] = n
    return reach


def _rollout(
    rng: np.random.Generator,
    probs: NDArray[np.float64],
    move_logits: NDArray[np.float64],
    weights: tuple[NDArray[np.float64], NDArray[np.float64]],
    unit_table: NDArray[np.float64],
    reach: NDArray[np.int64],
    count: int,
    forced: NDArray[np.int64] | None = None,
) -> Rollout:
    """Draw ``count`` samples (row 0 is ``forced`` when given: the replayed best plan), recording the features
    their log-probability needs. Stay features: is this layer before, at or past the current run's free reach
    (``free_reach``), does keeping the type add units to the run if it ended here, the run's length."""
    stay_weights, return_weights = weights
    n = probs.shape[0]
    unit_count = unit_table.shape[1] - 1
    cumulative = np.cumsum(probs, axis=-1)
    cumulative[:, -1] = 1.0
    fresh = (rng.random((count, n, 1)) > cumulative[None]).sum(axis=-1).astype(np.int64)
    uniform = rng.random((count, n))
    samples = fresh.copy()
    if forced is not None:
        samples[0] = forced
    stay_features = np.zeros((count, n, STAY_FEATURES), dtype="float32")
    return_features = np.zeros((count, n, RETURN_FEATURES), dtype="float32")
    can_return = np.zeros((count, n), dtype=bool)
    moves = np.zeros((count, n, 2), dtype="float32")
    run_start = np.zeros(count, dtype=np.int64)
    previous_run = np.full(count, -1, dtype=np.int64)
    for layer in range(1, n):
        current = samples[:, layer - 1]
        added = unit_table[current, run_start, layer + 1] - unit_table[current, run_start, layer]
        run_length = layer - run_start
        run_reach = reach[current, run_start]
        stay_features[:, layer] = np.stack(
            [layer < run_reach, layer == run_reach, layer > run_reach, added > 0, run_length / unit_count], axis=1
        )
        return_features[:, layer] = np.stack([run_length == 1, np.minimum(run_length, 4) / 4], axis=1)
        can_return[:, layer] = previous_run >= 0
        z_stay = move_logits[layer, 0] + stay_features[:, layer] @ stay_weights
        z_return = np.where(
            can_return[:, layer], move_logits[layer, 1] + return_features[:, layer] @ return_weights, -np.inf
        )
        top = np.maximum(np.maximum(z_stay, z_return), 0.0)
        e_stay, e_return, e_fresh = np.exp(z_stay - top), np.exp(z_return - top), np.exp(-top)
        total = e_stay + e_return + e_fresh
        u = uniform[:, layer] * total
        chosen = np.where(u < e_stay, current, np.where(u < e_stay + e_return, previous_run, fresh[:, layer]))
        if forced is not None:
            chosen[0] = forced[layer]
        samples[:, layer] = chosen
        moves[:, layer, 0] = chosen == current
        moves[:, layer, 1] = can_return[:, layer] & (chosen == previous_run)
        switched = chosen != current
        previous_run = np.where(switched, current, previous_run)
        run_start = np.where(switched, layer, run_start)
    return Rollout(samples, stay_features, return_features, can_return, moves)


SCHEDULER = RLScheduler
