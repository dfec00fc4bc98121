"""``genetic``: a seeded genetic algorithm over assignments (tournament selection, two-point crossover,
per-layer and segment mutation, elitism), the evolutionary baseline of the HeterPS paper."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.schedulers.base import Schedule, Scheduler, no_plan_reason


class GeneticScheduler(Scheduler):
    name = "genetic"

    def __init__(self, seed: int = 0, population: int = 48, generations: int = 120, elite: int = 2):
        super().__init__(seed)
        self.population = population
        self.generations = generations
        self.elite = elite

    def search(self, cost_model: CostModel) -> Schedule:
        rng = np.random.default_rng(self.seed)
        n, T = cost_model.num_layers, cost_model.num_types
        # Single-type plans are always in the first generation, so the GA never does worse than them.
        seeds = [np.full(n, t) for t in range(min(T, self.population))]
        pop = np.array(seeds + [rng.integers(0, T, n) for _ in range(self.population - len(seeds))])
        best_cost, best = np.inf, None
        reference = np.inf  # a feasible cost: infeasible plans are ranked above it

        def fitness(individuals: NDArray[np.int64]) -> NDArray[np.float64]:
            nonlocal best_cost, best, reference
            evaluations = [cost_model.evaluate(ind) for ind in individuals]
            for e in evaluations:
                if e.feasible and e.cost_per_hour < best_cost:
                    best_cost, best = e.cost_per_hour, list(e.assignment)
            if np.isfinite(best_cost):
                reference = best_cost
            worst_seen = max(e.cost_per_hour for e in evaluations)
            ref = reference if np.isfinite(reference) else worst_seen
            return np.array([cost_model.penalised_cost(e, ref) for e in evaluations])

        scores = fitness(pop)
        for _ in range(self.generations):
            order = np.argsort(scores)
            children = [pop[i].copy() for i in order[: self.elite]]
            while len(children) < self.population:
                a, b = (self._tournament(rng, scores) for _ in range(2))
                child = pop[a].copy()
                if n > 1:
                    lo, hi = sorted(rng.integers(0, n + 1, 2))
                    child[lo:hi] = pop[b][lo:hi]
                flip = rng.random(n) < 1.0 / n
                child[flip] = rng.integers(0, T, int(flip.sum()))
                if rng.random() < 0.3:  # segment mutation: whole runs move together, as stages do
                    lo, hi = sorted(rng.integers(0, n + 1, 2))
                    child[lo:hi] = rng.integers(0, T)
                children.append(child)
            pop = np.array(children)
            scores = fitness(pop)
        if best is None:
            return Schedule(None, reason=no_plan_reason(cost_model) + " (genetic found none)")
        return Schedule(best)

    @staticmethod
    def _tournament(rng: np.random.Generator, scores: NDArray[np.float64], size: int = 3) -> int:
        contenders = rng.integers(0, scores.size, size)
        return int(contenders[np.argmin(scores[contenders])])


SCHEDULER = GeneticScheduler
