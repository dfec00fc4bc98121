"""The one cost model (docs/plan-formats.md, "The cost model").

Every scheduler, the benchmark and the CLI evaluate plans here, so "optimal" and "1.01x the optimum" always
mean the same thing. A stage's cost depends only on its first and last layer and its type (boundary traffic
uses the stage's own ``net_bw``, or the cluster's slower ``links`` of that type), so stage options are computed once per ``(start, end, type)`` from prefix sums
and memoised; a plan's evaluation is then a walk over its runs plus the shared ``max_units`` check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, TypedDict

import numpy as np
from numpy.typing import NDArray

from heterps_paddle.planning.model import Cluster, ModelProfile, Plan, PlanningInputError, Stage, lookups_end
from heterps_paddle.planning.unit_cost import cost_per_million_samples

# More units than this are never useful to explore: it bounds the spill scan of one stage.
_UNIT_SCAN_LIMIT = 1_000_000
# Candidate stages (types x layer pairs) up to which a single stage is looked up in the stage tables (built on
# first use); 200 layers x 64 types is 1.3M (three [types, layers + 1, layers + 1] float arrays: 60 MB).
_TABULATE_LIMIT = 2_000_000


@dataclass(frozen=True)
class StageOption:
    """Layers ``[start, end)`` on type ``type_index``, provisioned for the required throughput."""

    start: int
    end: int
    type_index: int
    units: int  # smallest k with k / time_k >= throughput, ignoring max_units
    time_per_sample: float  # time_k at that k
    within_limit: bool  # units <= the type's max_units
    price_per_hour: float

    @property
    def cost_per_hour(self) -> float:
        return self.units * self.price_per_hour


@dataclass(frozen=True)
class Evaluation:
    """A whole assignment run through the cost model."""

    assignment: tuple[int, ...]
    stages: tuple[StageOption, ...]
    feasible: bool
    cost_per_hour: float  # the real cost when feasible; the cost with unbounded units otherwise
    excess_units: int  # units asked beyond max_units, over all types (0 when feasible)
    reason: str | None

    @property
    def throughput(self) -> float:
        return plan_throughput(self.stages)


@dataclass(frozen=True)
class BatchEvaluation:
    cost_per_hour: NDArray[np.float64]  # [batch], with unbounded units where infeasible (as Evaluation.cost_per_hour)
    feasible: NDArray[np.bool_]  # [batch] bool
    excess_units: NDArray[np.float64]  # [batch]
    total_units: NDArray[np.float64]  # [batch]


# ------------------------------------------------------------------ a plan's figures (one place for them all)


def stage_throughput(units: int, time_per_sample: float) -> float:
    """Samples/s of a stage's ``units`` units, each taking ``time_per_sample`` seconds per sample."""
    return units / time_per_sample if time_per_sample > 0 else math.inf


def plan_throughput(stages: Sequence[StageOption], shared_cores: int | None = None) -> float:
    """Samples/s a plan achieves: its slowest stage's. ``shared_cores``: every process of every stage runs on one
    machine with this many cores (``launch_fit``'s ``host_cores``), so a sample takes the sum of its stages' times
    in CPU and no plan beats ``shared_cores`` over that sum."""
    throughput = min(stage_throughput(s.units, s.time_per_sample) for s in stages)
    if shared_cores is not None:
        total_time = sum(s.time_per_sample for s in stages)
        if total_time > 0:
            throughput = min(throughput, shared_cores / total_time)
    return throughput


def plan_cost_per_hour(stages: Sequence[StageOption]) -> float:
    """What a plan's units cost per hour together."""
    return float(sum(s.cost_per_hour for s in stages))


class _PlanCommon(TypedDict):
    """The fields every plan record of ``CostModel.to_plan`` shares, feasible or not."""

    scheduler: str
    model: str
    search_seconds: float
    evaluations: int
    required_throughput: float


class CostModel:
    def __init__(
        self,
        profile: ModelProfile,
        cluster: Cluster,
        throughput: float | None = None,
        first_stage_kinds: tuple[str, ...] | None = None,
        one_stage_kinds: tuple[str, ...] | None = None,
        overlap: bool = False,
        lookups_first: bool = False,
    ):
        """``overlap``: a stage's boundary traffic overlaps its compute (per sample, the larger of the two, not
        their sum), as the heterogeneous pipeline runs it: micro-batches in flight, brpc sending one while the
        section computes the next.  Not part of the reference reading (the sum, the default); ``heterps bench
        hosts`` measures both against shaped links (docs/planning.md "Links, measured").
        ``first_stage_kinds``: resource kinds allowed to run the first stage of a split plan (None: any).  Not
        part of the reference reading; the runtime's rule ("cpu",): Paddle's heterogeneous pipeline reads the
        data on CPU trainers, which therefore run the first stage of a split.  A one-stage plan may be any kind
        (data-parallel trainers of that type) unless ``one_stage_kinds`` says which (the automatic path without
        CUDA: the trainers are CPUs).  ``lookups_first``: the runtime's rule that a split's lookups run on its
        first stage (``model.lookups_end``)."""
        required = throughput if throughput is not None else cluster.throughput
        if required is None:
            raise PlanningInputError("no required throughput: give it in the cluster file or with --throughput")
        if not (required > 0 and math.isfinite(required)):
            raise PlanningInputError(f"throughput must be a positive finite number, got {required!r}")
        self.profile = profile
        self.cluster = cluster
        self.throughput = float(required)
        self.first_stage_kinds = first_stage_kinds
        self.one_stage_kinds = one_stage_kinds
        self.lookups_first = lookups_first
        self.overlap = overlap
        self.types = cluster.resource_types
        self.num_layers = len(profile.layers)
        self.layer_names = tuple(profile.layer_names())
        self.num_types = len(self.types)
        self._cache: dict[tuple[int, int, int], StageOption] = {}
        self._tables: StageTables | None = None
        self.evaluations = 0
        self._prepare()

    # ----------------------------------------------------------------------------------- preparation

    def _prepare(self) -> None:
        layers = self.profile.layers
        n, T = self.num_layers, self.num_types

        def prefix(values: NDArray[np.float64]) -> NDArray[np.float64]:
            return np.concatenate([np.zeros(values.shape[:-1] + (1,)), np.cumsum(values, axis=-1)], axis=-1)

        flops = np.array([layer.flops for layer in layers], dtype=float)
        self.param: NDArray[np.float64] = np.array([layer.param_bytes for layer in layers], dtype=float)
        self.io: NDArray[np.float64] = np.array([layer.io_bytes for layer in layers], dtype=float)
        self.out: NDArray[np.float64] = np.array([layer.out_bytes for layer in layers], dtype=float)
        dense = np.array([layer.kind == "dense" for layer in layers])
        self.lookups_end = lookups_end(self.profile)
        self.param_prefix = prefix(self.param)
        self.dense_param_prefix = prefix(np.where(dense, self.param, 0.0))

        self.measured: NDArray[np.bool_] = np.zeros((T, n), dtype=bool)
        self.compute_time: NDArray[np.float64] = np.zeros((T, n))  # flops / t.flops (estimated layers)
        self.base_time: NDArray[np.float64] = np.zeros((T, n))  # per-layer time with no spill
        for ti, t in enumerate(self.types):
            for li, layer in enumerate(layers):
                if t.name in layer.time:
                    self.measured[ti, li] = True
                    self.base_time[ti, li] = layer.time[t.name]
                else:
                    self.compute_time[ti, li] = flops[li] / t.flops
                    self.base_time[ti, li] = max(self.compute_time[ti, li], self.io[li] / t.mem_bw)
        self.base_prefix = prefix(self.base_time)
        self.measured_io_prefix = prefix(np.where(self.measured, self.io, 0.0))
        # Estimated layers that read parameter rows are the only ones whose time is a non-linear function of
        # the spill fraction (max of compute and memory time); kept apart so spill is evaluated per layer.
        self.spill_sensitive: list[NDArray[np.intp]] = [
            np.flatnonzero(~self.measured[ti] & (self.io > 0)) for ti in range(T)
        ]
        # The GPU table's tiers (docs/plan-formats.md, "The cost model"): on a gpu type the share of a stage's rows
        # off the device is served through its host tier, each such lookup host_tier_slowdown times a resident
        # one; the sparse layers' time with no spill is what that multiplies.
        sparse = np.array([layer.kind == "sparse" for layer in layers])
        self.sparse_base_prefix = prefix(np.where(sparse, self.base_time, 0.0))
        self.price: NDArray[np.float64] = np.array([t.price_per_hour for t in self.types])
        self.memory: NDArray[np.float64] = np.array([t.memory for t in self.types], dtype=float)
        self.mem_bw: NDArray[np.float64] = np.array([t.mem_bw for t in self.types], dtype=float)
        self.ssd_bw: NDArray[np.float64] = np.array([t.ssd_bw for t in self.types], dtype=float)
        self.net_bw: NDArray[np.float64] = np.array([t.net_bw for t in self.types], dtype=float)
        # What a boundary's activations cross at: net_bw, or the cluster's slower link between hosts of the type.
        self.boundary_bw: NDArray[np.float64] = np.array([self.cluster.boundary_bw(t) for t in self.types], dtype=float)
        self.has_ssd: NDArray[np.bool_] = np.array([t.has_ssd for t in self.types])
        self.tier_slowdown: NDArray[np.float64] = np.array([t.host_tier_slowdown for t in self.types])
        self.max_units: NDArray[np.int64] = np.array([t.max_units for t in self.types])

    # ------------------------------------------------------------------------------------ one stage

    def stage_time(self, start: int, end: int, type_index: int, units: int) -> float | None:
        """Per-sample time of layers [start, end) on ``units`` units; None if they cannot hold its parameters."""
        time = float(self._stage_times(*_one(start, end, type_index), np.array([float(units)]))[0])
        return None if math.isnan(time) else time

    def _stage_times(
        self, starts: NDArray[np.intp], ends: NDArray[np.intp], types: NDArray[np.intp], units: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """``stage_time`` of many stages at once (NaN where the units cannot hold the parameters): the one
        implementation, so the stage tables and a single stage agree to the last bit."""
        params = self.param_prefix[ends] - self.param_prefix[starts]
        memory = self.memory[types]
        with np.errstate(divide="ignore", invalid="ignore"):
            spill = np.where(params > 0, np.maximum(0.0, params - units * memory) / params, 0.0)
        time = self.base_prefix[types, ends] - self.base_prefix[types, starts]
        time[(spill > 0) & ~self.has_ssd[types]] = np.nan
        spilling = np.flatnonzero((spill > 0) & self.has_ssd[types])
        if spilling.size:
            t, f = types[spilling], spill[spilling]
            measured_io = self.measured_io_prefix[t, ends[spilling]] - self.measured_io_prefix[t, starts[spilling]]
            time[spilling] += measured_io * f * (1.0 / self.ssd_bw[t] - 1.0 / self.mem_bw[t])
            for type_index in np.unique(t):
                idx = self.spill_sensitive[type_index]
                if not idx.size:
                    continue
                rows = spilling[t == type_index]
                inside = (idx >= starts[rows, None]) & (idx < ends[rows, None])
                fraction = spill[rows, None]
                mem_bw, ssd_bw = self.mem_bw[type_index], self.ssd_bw[type_index]
                memory_time = self.io[idx] * ((1.0 - fraction) / mem_bw + fraction / ssd_bw)
                compute = self.compute_time[type_index, idx]
                delta = np.maximum(compute, memory_time) - self.base_time[type_index, idx]
                time[rows] += np.sum(np.where(inside, delta, 0.0), axis=1)
            # A gpu type's tiers: no cheaper than the host tier's measured slowdown on the share off the device,
            # whatever the SSD figures say (the rows cross the host tier either way).  Still falls as k grows.
            tiered = spilling[self.tier_slowdown[t] > 1.0]
            if tiered.size:
                tt, s, e = types[tiered], starts[tiered], ends[tiered]
                sparse_time = self.sparse_base_prefix[tt, e] - self.sparse_base_prefix[tt, s]
                resident_time = self.base_prefix[tt, e] - self.base_prefix[tt, s]
                floor = resident_time + spill[tiered] * (self.tier_slowdown[tt] - 1.0) * sparse_time
                time[tiered] = np.maximum(time[tiered], floor)
        net_bw = self.net_bw[types]
        boundary: NDArray[np.float64] = self._boundary_bytes(starts, ends) / self.boundary_bw[types]
        dense = self.dense_param_prefix[ends] - self.dense_param_prefix[starts]
        sync = np.where(units > 1, 2.0 * dense / (self.profile.batch_size * net_bw), 0.0)
        if self.overlap:
            # np.maximum keeps NaN (units that cannot hold the stage)
            overlapped: NDArray[np.float64] = np.maximum(time, boundary) + sync
            return overlapped
        reference: NDArray[np.float64] = time + (boundary + sync)  # summed in this order since its first version
        return reference

    def _boundary_bytes(self, starts: NDArray[np.intp], ends: NDArray[np.intp]) -> NDArray[np.float64]:
        """Bytes per sample crossing the cuts of stages [start, end): the activations in and out."""
        into = np.where(starts > 0, self.out[starts - 1], 0.0).astype(np.float64)
        out_of = np.where(ends < self.num_layers, self.out[ends - 1], 0.0).astype(np.float64)
        total: NDArray[np.float64] = into + out_of
        return total

    def boundary_bytes(self, start: int, end: int) -> float:
        """Bytes per sample crossing the cuts of the stage of layers [start, end)."""
        return float(self._boundary_bytes(np.array([start]), np.array([end]))[0])

    def boundary_seconds(self, start: int, end: int, type_index: int) -> float:
        """The share of a stage's time per sample spent on its cuts' traffic (what ``links`` slows)."""
        return self.boundary_bytes(start, end) / float(self.boundary_bw[type_index])

    def _units_for(self, time: NDArray[np.float64]) -> NDArray[np.float64]:
        """Smallest k >= 1 with k / time >= throughput (k >= throughput * time, guarded against rounding); as
        floats: a target far beyond the cluster (--throughput 1e300) asks for more units than int64 holds."""
        with np.errstate(divide="ignore", invalid="ignore"):
            k = np.maximum(1.0, np.ceil(self.throughput * time))
            k = np.where((k > 1) & ((k - 1) / time >= self.throughput), k - 1, k)
            short = (time > 0) & (k / time < self.throughput)
            while short.any():
                # + 1, or the next float up where k is so large that + 1 rounds back to k (a target of 1e300
                # samples/s looped here forever once a stage's time rounded differently)
                k[short] = np.maximum(k[short] + 1, np.nextafter(k[short], np.inf))
                short = (time > 0) & (k / time < self.throughput)
        return k

    def stage(self, start: int, end: int, type_index: int) -> StageOption:
        key = (start, end, type_index)
        option = self._cache.get(key)
        if option is None:
            if self.num_types * self.num_layers * (self.num_layers + 1) // 2 <= _TABULATE_LIMIT:
                # Searches ask for many stages one by one: provisioning them all at once is cheaper from the
                # first few hundred on (a numpy call per stage costs about what a whole row costs).
                tables = self.stage_tables()
                units, time = tables.units[type_index, start, end], tables.time[type_index, start, end]
            else:
                one_units, one_time = self.provision(*_one(start, end, type_index))
                units, time = one_units[0], one_time[0]
            option = self._option(start, end, type_index, float(units), float(time))
            self._cache[key] = option
        return option

    def provision(
        self, starts: NDArray[np.intp], ends: NDArray[np.intp], types: NDArray[np.intp]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Units (the fewest that reach the throughput, ignoring max_units) and time per sample of many stages at
        once; ``_UNIT_SCAN_LIMIT`` units and an infinite time for a stage no number of units can run."""
        kinds = [t.kind for t in self.types]
        # [whole model?, type]: the first-stage rule differs for a one-stage plan
        allowed = np.array([np.isin(kinds, self._first_stage_kinds(end)) for end in (0, self.num_layers)])
        impossible = (starts == 0) & ~allowed[(ends == self.num_layers).astype(np.intp), types]
        if self.lookups_first:  # a later stage of a split holds no lookup
            impossible |= (starts > 0) & (starts < self.lookups_end)
        params = self.param_prefix[ends] - self.param_prefix[starts]
        memory = self.memory[types]
        has_ssd = self.has_ssd[types]
        # Units from which the parameters fit in memory (no spill); 1 when they fit in one unit.
        fit = np.ones(starts.shape)
        over = params > memory
        no_memory = over & (memory <= 0)  # every unit spills everything
        impossible |= no_memory & ~has_ssd
        fit[no_memory] = _UNIT_SCAN_LIMIT
        sharded = np.flatnonzero(over & (memory > 0))
        if sharded.size:
            p, m = params[sharded], memory[sharded]
            k = np.maximum(1.0, np.ceil(p / m))
            while True:  # guard the division's rounding both ways
                down = (k > 1) & (p - (k - 1) * m <= 0)
                up = p - k * m > 0
                if not (down.any() or up.any()):
                    break
                k = k - down + up
            fit[sharded] = k
        units = np.full(starts.shape, float(_UNIT_SCAN_LIMIT))
        time = np.full(starts.shape, np.inf)
        todo = ~impossible
        # Best k among those without spill: time is flat there except the dense sync from k = 2 on.
        single = np.flatnonzero(todo & (fit == 1))
        if single.size:
            one_time = self._stage_times(starts[single], ends[single], types[single], np.ones(single.size))
            with np.errstate(divide="ignore"):
                reaches = 1.0 / one_time >= self.throughput
            done = single[reaches]
            units[done], time[done] = 1.0, one_time[reaches]
            todo[done] = False
        many = np.flatnonzero(todo)
        if many.size:
            k = np.maximum(2.0, fit[many])
            time[many] = self._stage_times(starts[many], ends[many], types[many], k)
            units[many] = np.maximum(k, self._units_for(time[many]))
            # Fewer units may do when the type can spill to SSD: the spilling counts below both bounds.
            scan = many[has_ssd[many] & (fit[many] > 1)]
            limit = np.minimum(np.minimum(units[scan], fit[scan]), _UNIT_SCAN_LIMIT)
            fewest, fewest_time = self._fewest_spilling_units(starts[scan], ends[scan], types[scan], limit)
            found = fewest < limit
            units[scan[found]], time[scan[found]] = fewest[found], fewest_time[found]
        return units, time

    def _fewest_spilling_units(
        self, starts: NDArray[np.intp], ends: NDArray[np.intp], types: NDArray[np.intp], limit: NDArray[np.float64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Per stage (of a type with an SSD tier), the smallest k in [1, limit) with k / time_k >= throughput and
        its time; ``limit`` where there is none.

        k = 1 is tried alone (no dense sync term).  From k = 2 on, when the SSD is no faster than memory, time_k
        only falls as k grows (less spill) and the sync term is constant, so k - throughput * time_k rises by at
        least 1 per unit: the counts that reach the throughput are all those from some k on, and a bisection finds
        the first of them, a few dozen stage times instead of up to ``limit``.  A (strange) SSD faster than memory
        breaks that, and those stages are scanned one count after another."""
        fewest, fewest_time = limit.copy(), np.full(limit.shape, np.nan)

        def reaches(rows: NDArray[np.intp], k: NDArray[np.float64]) -> tuple[NDArray[np.bool_], NDArray[np.float64]]:
            time = self._stage_times(starts[rows], ends[rows], types[rows], k)
            with np.errstate(invalid="ignore"):
                return k / time >= self.throughput, time

        rows = np.flatnonzero(limit > 1)
        ok, time = reaches(rows, np.ones(rows.size))
        fewest[rows[ok]], fewest_time[rows[ok]] = 1.0, time[ok]
        rows = rows[~ok & (limit[rows] > 2)]
        monotone = self.ssd_bw[types[rows]] <= self.mem_bw[types[rows]]
        bisect, scan = rows[monotone], rows[~monotone]
        low, high = np.full(bisect.size, 2.0), limit[bisect]  # the first count that reaches it is in [low, high]
        while (open_ := low < high).any():
            middle = np.floor((low + high) / 2)
            ok, _ = reaches(bisect[open_], middle[open_])
            high[open_] = np.where(ok, middle[open_], high[open_])
            low[open_] = np.where(ok, low[open_], middle[open_] + 1)
        hit = bisect[low < limit[bisect]]
        if hit.size:
            fewest[hit] = low[low < limit[bisect]]
            fewest_time[hit] = self._stage_times(starts[hit], ends[hit], types[hit], fewest[hit])
        k = 2.0
        while (scan := scan[k < limit[scan]]).size:
            ok, time = reaches(scan, np.full(scan.size, k))
            fewest[scan[ok]], fewest_time[scan[ok]] = k, time[ok]
            scan, k = scan[~ok], k + 1.0
        return fewest, fewest_time

    def _lookup_reason(self, start: int) -> str:
        return (
            f"a split plan's lookups run on its first stage (the CPU trainers), and this stage starts at "
            f"{self.layer_names[start]}, before the last sparse layer {self.layer_names[self.lookups_end - 1]}"
        )

    def _first_stage_kinds(self, end: int) -> tuple[str, ...]:
        """Kinds allowed for a plan's first stage ending before layer ``end`` (all of it: a one-stage plan)."""
        kinds = self.one_stage_kinds if end == self.num_layers else self.first_stage_kinds
        return kinds if kinds is not None else ("cpu", "gpu")

    def stage_on_units(self, start: int, end: int, type_index: int, units: int) -> StageOption | None:
        """Layers [start, end) on type ``type_index`` run on ``units`` units given, not provisioned (a launch fixes
        them: ``launch_fit``); None when those units cannot hold the stage's parameters."""
        time = self.stage_time(start, end, type_index, units)
        return None if time is None else self._option(start, end, type_index, float(units), time)

    def _option(self, start: int, end: int, type_index: int, units: float, time: float) -> StageOption:
        return StageOption(
            start,
            end,
            type_index,
            int(units),
            time,
            math.isfinite(time) and units <= self.types[type_index].max_units,
            float(self.price[type_index]),
        )

    # --------------------------------------------------------------------------------------- a plan

    def evaluate(self, assignment: Sequence[int]) -> Evaluation:
        """Cost of an assignment (a type index per layer, program order)."""
        if len(assignment) != self.num_layers:
            raise ValueError(f"assignment has {len(assignment)} entries for {self.num_layers} layers")
        self.evaluations += 1
        assignment = tuple(int(a) for a in assignment)
        stages = []
        start = 0
        for i in range(1, self.num_layers + 1):
            if i == self.num_layers or assignment[i] != assignment[start]:
                stages.append(self.stage(start, i, assignment[start]))
                start = i
        # Python ints: a target far beyond the cluster (--throughput 1e300) asks for more units than int64 holds.
        used = [0] * self.num_types
        for s in stages:
            used[s.type_index] += s.units
        excess = [max(0, u - int(m)) for u, m in zip(used, self.max_units)]
        cost = plan_cost_per_hour(stages)
        reason = None
        impossible = next((s for s in stages if math.isinf(s.time_per_sample)), None)
        if impossible is not None:
            t = self.types[impossible.type_index]
            allowed = self._first_stage_kinds(impossible.end)
            whole = impossible.end == self.num_layers
            reason = f"{t.name} cannot run layers {impossible.start}..{impossible.end - 1}: " + (
                f"the {'only stage' if whole else 'first stage of a split plan'} must run on a "
                + "/".join(allowed)
                + " type"
                if impossible.start == 0 and t.kind not in allowed
                else self._lookup_reason(impossible.start)
                if self.lookups_first and 0 < impossible.start < self.lookups_end
                else "no parameter memory and no SSD tier"
            )
        elif any(excess):
            worst = max(range(self.num_types), key=lambda t: excess[t])
            reason = (
                f"{self.types[worst].name} needs {used[worst]:.4g} units, max_units is {int(self.max_units[worst])}"
            )
        return Evaluation(assignment, tuple(stages), not any(excess), cost, sum(excess), reason)

    def stage_tables(self) -> StageTables:
        """Every candidate stage provisioned once (what exact and the batch evaluation index into)."""
        if self._tables is None:
            self._tables = StageTables(self)
        return self._tables

    def evaluate_batch(self, assignments: NDArray[np.int64]) -> BatchEvaluation:
        """``evaluate`` for many assignments at once ([batch, layers] type indices), from the stage tables:
        same stages, same units, same costs, without a Python loop per plan."""
        tables = self.stage_tables()
        a = np.asarray(assignments, dtype=np.int64)
        batch, n = a.shape
        self.evaluations += batch
        starts = np.ones((batch, n), dtype=bool)
        starts[:, 1:] = a[:, 1:] != a[:, :-1]
        flat = np.flatnonzero(starts.ravel())
        rows, first = flat // n, flat % n
        following = np.append(flat[1:], batch * n)
        last = np.where(following // n == rows, following % n, n)  # a run ends where the next one starts
        types = a[rows, first]
        units = tables.units[types, first, last]
        # numpy's stub types every bincount as intp, but with float weights it returns float64.
        cost: NDArray[np.float64]
        cost = np.bincount(rows, weights=units * self.price[types], minlength=batch)  # type: ignore[assignment]
        used = np.bincount(rows * self.num_types + types, weights=units, minlength=batch * self.num_types).reshape(
            batch, self.num_types
        )
        excess = np.maximum(0.0, used - self.max_units[None, :]).sum(axis=1)
        total_units = used.sum(axis=1)
        return BatchEvaluation(cost, excess == 0, excess, total_units)

    def penalised_costs(self, batch: BatchEvaluation, reference: float) -> NDArray[np.float64]:
        """``penalised_cost`` for a batch."""
        penalised = np.maximum(batch.cost_per_hour, reference) * (
            1.0 + batch.excess_units / np.maximum(batch.total_units, 1.0)
        )
        return np.where(batch.feasible, batch.cost_per_hour, penalised)

    def penalised_cost(self, evaluation: Evaluation, reference: float) -> float:
        """A cost for search: the real one when feasible; otherwise at least ``reference`` (e.g. a known
        feasible cost), growing with the excess units so the search is pulled back towards feasibility."""
        if evaluation.feasible:
            return evaluation.cost_per_hour
        total = sum(s.units for s in evaluation.stages)
        return max(evaluation.cost_per_hour, reference) * (1.0 + evaluation.excess_units / max(total, 1))

    def single_type_evaluations(self) -> list[Evaluation]:
        return [self.evaluate([t] * self.num_layers) for t in range(self.num_types)]

    # ---------------------------------------------------------------------------------- plan record

    def to_plan(
        self,
        assignment: Sequence[int] | None,
        scheduler: str,
        search_seconds: float = 0.0,
        evaluations: int | None = None,
        reason: str | None = None,
        refined_from_cost: float | None = None,
    ) -> Plan:
        names = self.profile.layer_names()
        common = _PlanCommon(
            scheduler=scheduler,
            model=self.profile.name,
            search_seconds=search_seconds,
            evaluations=self.evaluations if evaluations is None else evaluations,
            required_throughput=self.throughput,
        )
        if assignment is None:
            return Plan(feasible=False, assignment={}, reason=reason or "no feasible plan found", **common)
        evaluation = self.evaluate(assignment)
        type_names = [t.name for t in self.types]
        mapping = {names[i]: type_names[a] for i, a in enumerate(evaluation.assignment)}
        if not evaluation.feasible:
            return Plan(feasible=False, assignment=mapping, reason=reason or evaluation.reason, **common)
        cost = evaluation.cost_per_hour
        return Plan(
            feasible=True,
            assignment=mapping,
            stages=tuple(self.stage_record(s) for s in evaluation.stages),
            throughput=evaluation.throughput,
            cost_per_hour=cost,
            cost_per_million_samples=cost_per_million_samples(cost, evaluation.throughput),
            refined_from_cost=refined_from_cost,
            **common,
        )

    def stage_record(self, stage: StageOption) -> Stage:
        """A stage as a plan records it: its type's name and kind, its layers' names, its samples/s."""
        resource = self.types[stage.type_index]
        return Stage(
            resource=resource.name,
            kind=resource.kind,
            layers=self.layer_names[stage.start : stage.end],
            units=stage.units,
            time_per_sample=stage.time_per_sample,
            throughput=stage_throughput(stage.units, stage.time_per_sample),
        )

    def assignment_of(self, plan: Plan) -> list[int]:
        """Type indices of a plan's assignment (e.g. one read back from JSON)."""
        index = {t.name: i for i, t in enumerate(self.types)}
        try:
            return [index[plan.assignment[name]] for name in self.profile.layer_names()]
        except KeyError as exc:
            raise PlanningInputError(f"plan does not fit this model and cluster: {exc.args[0]!r}") from None


def _one(start: int, end: int, type_index: int) -> tuple[NDArray[np.intp], NDArray[np.intp], NDArray[np.intp]]:
    """One stage as the arrays of the batched stage functions."""
    return np.array([start]), np.array([end]), np.array([type_index])


class StageTables:
    """Every candidate stage of a cost model as arrays indexed [type, start, end]: ``cost`` (inf where the stage
    needs more than max_units of its type), ``units`` (the unbounded provisioning), ``time`` (per sample)."""

    def __init__(self, cost_model: CostModel):
        n, T = cost_model.num_layers, cost_model.num_types
        starts, ends = np.triu_indices(n + 1, 1)
        types = np.repeat(np.arange(T), starts.size)
        starts, ends = np.tile(starts, T), np.tile(ends, T)
        units, time = cost_model.provision(starts, ends, types)

        def table(fill: float) -> NDArray[np.float64]:
            # Indexed [type, start, end], laid out [end, start, type] in memory: exact's DP reads every stage
            # ending at one boundary at a time (a contiguous block so), and arithmetic on the tables keeps it.
            return np.full((n + 1, n + 1, T), fill).transpose(2, 1, 0)

        self.units: NDArray[np.float64] = table(0.0)
        self.units[types, starts, ends] = units
        self.time: NDArray[np.float64] = table(np.inf)
        self.time[types, starts, ends] = time
        within = np.isfinite(time) & (units <= cost_model.max_units[types])
        self.cost: NDArray[np.float64] = table(np.inf)
        self.cost[types[within], starts[within], ends[within]] = units[within] * cost_model.price[types[within]]
