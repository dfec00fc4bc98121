"""A catalog of real resource kinds and a seeded generator of planning workloads (for the scheduler benchmark
and the tests).

Figures are per unit (one VM, or one GPU of a multi-GPU VM) from public vendor datasheets and on-demand cloud
prices (AWS us-east-1 list prices, 2024); ``flops`` is the datasheet peak FP32 rate (TF32 tensor rate for
A100/H100) times a sustained fraction of 0.4, the order seen for recommendation MLPs. They only need to be
realistic relative to each other: the benchmark compares schedulers on the same cost model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.model import Cluster, LayerProfile, ModelProfile, ResourceType
from heterps_paddle.planning.schedulers.exact import ExactScheduler, dp_assignment

GB = 1e9
GIB = 2.0**30
_SUSTAINED = 0.4


def _gbps(gigabits: float) -> float:
    return gigabits * 1e9 / 8


def _cpu(
    name: str,
    price: float,
    vcpus: int,
    memory_gib: float,
    net_gbit: float,
    ssd_bw: float = 0.0,
    max_units: int = 64,
) -> ResourceType:
    # Ice Lake Xeon (c6i/r6i/i4i): 2 AVX-512 FMA units -> 32 FP32 FLOP/cycle/core at ~3.0 GHz; a vCPU is half a
    # core. Memory bandwidth ~ 2.5 GB/s per vCPU is what STREAM shows on these instances for a share of a socket.
    return ResourceType(
        name=name,
        kind="cpu",
        price_per_hour=price,
        max_units=max_units,
        flops=vcpus / 2 * 32 * 3.0e9 * _SUSTAINED,
        mem_bw=vcpus * 2.5 * GB,
        memory=memory_gib * GIB,
        net_bw=_gbps(net_gbit),
        ssd_bw=ssd_bw,
    )


def _gpu(
    name: str,
    price: float,
    peak_tflops: float,
    mem_bw_gbs: float,
    memory_gb: float,
    net_gbit: float,
    ssd_bw: float = 0.0,
    max_units: int = 16,
) -> ResourceType:
    return ResourceType(
        name=name,
        kind="gpu",
        price_per_hour=price,
        max_units=max_units,
        flops=peak_tflops * 1e12 * _SUSTAINED,
        mem_bw=mem_bw_gbs * GB,
        memory=memory_gb * GB,
        net_bw=_gbps(net_gbit),
        ssd_bw=ssd_bw,
    )


# name -> resource type. Sources: AWS EC2 instance-type pages and on-demand pricing; NVIDIA datasheets
# (T4: 8.1 TFLOPS FP32, 320 GB/s, 16 GB; V100 SXM2: 15.7 TFLOPS, 900 GB/s, 16 GB; A10: 31.2 TFLOPS, 600 GB/s,
# 24 GB; L4: 30.3 TFLOPS, 300 GB/s, 24 GB; A100 SXM: 156 TF32, 1555 GB/s (40 GB) / 2039 GB/s (80 GB);
# H100 SXM: 495 TF32 dense, 3350 GB/s, 80 GB). Multi-GPU instances are priced per GPU, network share per GPU.
CATALOG: dict[str, ResourceType] = {
    t.name: t
    for t in (
        _cpu("cpu_c6i_2xl", 0.34, 8, 16, 12.5),
        _cpu("cpu_c6i_4xl", 0.68, 16, 32, 12.5),
        _cpu("cpu_c6i_8xl", 1.36, 32, 64, 12.5),
        _cpu("cpu_c6i_16xl", 2.72, 64, 128, 25),
        _cpu("cpu_r6i_4xl", 1.008, 16, 128, 12.5),
        _cpu("cpu_r6i_16xl", 4.032, 64, 512, 25),
        _cpu("cpu_i4i_4xl", 1.373, 16, 128, 25, ssd_bw=2.8 * GB),  # 1 x 3750 GB NVMe, ~2.8 GB/s read
        _cpu("cpu_i4i_16xl", 5.491, 64, 512, 37.5, ssd_bw=11.2 * GB),  # 4 NVMe drives
        _gpu("gpu_t4", 0.526, 8.1, 320, 16, 25, ssd_bw=1.0 * GB),  # g4dn.xlarge, 125 GB NVMe
        _gpu("gpu_v100", 3.06, 15.7, 900, 16, 10),  # p3.2xlarge, EBS only
        _gpu("gpu_a10", 1.006, 31.2, 600, 24, 10, ssd_bw=1.5 * GB),  # g5.xlarge, 250 GB NVMe
        _gpu("gpu_l4", 0.805, 30.3, 300, 24, 10, ssd_bw=1.5 * GB),  # g6.xlarge
        _gpu("gpu_a100_40g", 32.77 / 8, 156, 1555, 40, 400 / 8, ssd_bw=2.0 * GB),  # p4d.24xlarge / 8
        _gpu("gpu_a100_80g", 40.97 / 8, 156, 2039, 80, 400 / 8, ssd_bw=2.0 * GB),  # p4de.24xlarge / 8
        _gpu("gpu_h100", 98.32 / 8, 495, 3350, 80, 3200 / 8, ssd_bw=3.0 * GB),  # p5.48xlarge / 8
        _gpu("gpu_v100_x4", 12.24 / 4, 15.7, 900, 16, 10 / 4),  # p3.8xlarge / 4: less network per GPU
    )
}


@dataclass(frozen=True)
class Workload:
    name: str
    profile: ModelProfile
    cluster: Cluster
    binding_limit: bool  # max_units was lowered so that the shared limit matters


def _ctr_like_layers(rng: np.random.Generator, num_layers: int) -> list[LayerProfile]:
    """Sparse embedding layers first (some towers interleave them), then an MLP; Adam state x3 on params."""
    num_sparse = int(rng.integers(1, max(2, num_layers // 4) + 1))
    layers = []
    width = 0.0
    for i in range(num_sparse):
        rows = float(10 ** rng.uniform(5, 9))
        dim = int(rng.choice([8, 9, 16, 32, 64]))
        slots = int(rng.integers(1, 27))
        width += slots * dim
        layers.append(
            LayerProfile(
                name=f"emb_{i}",
                kind="sparse",
                flops=float(slots * dim * 4),
                param_bytes=rows * dim * 4 * 3,
                io_bytes=float(slots * dim * 4 * 2),
                out_bytes=float(width * 4 * 2),
            )
        )
    in_width = width
    for i in range(num_layers - num_sparse):
        out_width = float(rng.choice([64, 128, 256, 400, 512, 1024, 2048]))
        flops = 6.0 * in_width * out_width  # forward 2*in*out, backward twice that
        layers.append(
            LayerProfile(
                name=f"fc_{i}",
                kind="dense",
                flops=flops,
                param_bytes=(in_width * out_width + out_width) * 4 * 3,
                out_bytes=out_width * 4 * 2,
            )
        )
        in_width = out_width
    return layers


def generate_workload(
    seed: int, num_layers: int | None = None, num_types: int | None = None, binding: bool | None = None
) -> Workload:
    """A random but realistic planning problem; ``binding`` lowers one type's max_units below what the
    unlimited optimum would use, so the shared limit decides the answer."""
    rng = np.random.default_rng(seed)
    n = int(num_layers if num_layers is not None else rng.integers(4, 65))
    T = int(num_types if num_types is not None else rng.integers(2, 17))
    names = list(CATALOG)
    chosen = [CATALOG[names[i]] for i in sorted(rng.choice(len(names), size=min(T, len(names)), replace=False))]
    chosen += _other_offers(rng, T - len(chosen))
    layers = _ctr_like_layers(rng, n)
    batch_size = int(rng.choice([256, 512, 1024, 2048]))
    profile = ModelProfile(name=f"synthetic_{seed}", batch_size=batch_size, layers=tuple(layers))
    cluster = Cluster(resource_types=tuple(chosen), throughput=1.0)
    cluster = feasible_target(profile, Cluster(tuple(chosen), interesting_throughput(profile, cluster, rng=rng)))
    binding = bool(rng.random() < 0.35) if binding is None else binding
    if binding:
        cluster = _bind_limit(profile, cluster)
    return Workload(profile.name, profile, cluster, binding)


def _other_offers(rng: np.random.Generator, count: int) -> list[ResourceType]:
    """``count`` more types beyond the catalog's kinds: the same machines bought another way (spot capacity,
    another region, a reserved term), so the same speed at another price and with fewer units to be had.  What
    makes a cluster of 64 types realistic; cheap offers with few units are where shared limits bind."""
    offers = []
    for k in range(count):
        base = CATALOG[list(CATALOG)[k % len(CATALOG)]]
        offers.append(
            dataclasses.replace(
                base,
                name=f"{base.name}_offer{k // len(CATALOG) + 1}",
                price_per_hour=base.price_per_hour * float(rng.uniform(0.3, 1.3)),
                max_units=int(rng.integers(1, base.max_units + 1)),
            )
        )
    return offers


def interesting_throughput(
    profile: ModelProfile, cluster: Cluster, seed: int = 0, rng: np.random.Generator | None = None
) -> float:
    """A target that needs several units even of the fastest type running the whole model (at low targets every
    plan is one unit of the cheapest type, which tells the schedulers apart by nothing)."""
    rng = rng if rng is not None else np.random.default_rng(seed)
    model = CostModel(profile, cluster.with_throughput(1.0))
    n = model.num_layers
    times = [model.stage_time(0, n, t, 2) or np.inf for t in range(model.num_types)]
    finite = [x for x in times if np.isfinite(x)] or [1e-3]
    return float(rng.uniform(2, 24) / min(finite))


def feasible_target(profile: ModelProfile, cluster: Cluster) -> Cluster:
    """The cluster with its throughput halved until some plan meets it (a target sized for the fastest type
    may need more units than max_units allows; an infeasible workload measures no scheduler)."""
    for _ in range(30):
        if ExactScheduler().plan(CostModel(profile, cluster)).feasible:
            return cluster
        assert cluster.throughput is not None  # CostModel above raised if there were no throughput
        cluster = cluster.with_throughput(cluster.throughput / 2)
    return cluster


def _bind_limit(profile: ModelProfile, cluster: Cluster) -> Cluster:
    """Lower max_units of the type the DP (per-stage limits only) leans on most, below what it uses."""
    model = CostModel(profile, cluster)
    _, assignment = dp_assignment(model.stage_tables().cost)
    if assignment is None:
        return cluster
    stages = model.evaluate(assignment).stages
    used = np.zeros(model.num_types, dtype=int)
    for stage in stages:
        used[stage.type_index] += stage.units
    shared = [t for t in range(model.num_types) if sum(s.type_index == t for s in stages) > 1 and used[t] > 1]
    if shared:
        # A type the relaxed optimum uses in several stages: allow each stage alone, not all of them together.
        heaviest = max(shared, key=lambda t: used[t])
        largest_stage = max(s.units for s in stages if s.type_index == heaviest)
        limit = max(largest_stage, int(used[heaviest] * 0.7), 1)
        if limit >= used[heaviest]:
            limit = used[heaviest] - 1
    else:
        heaviest = int(np.argmax(used))
        if used[heaviest] < 2:
            return cluster
        limit = max(1, int(used[heaviest] * 0.7))
    original = cluster.resource_types[heaviest]
    # A limit so low that no plan is left measures nothing: raise it until one is.
    for bound in range(min(original.max_units, limit), original.max_units + 1):
        types = list(cluster.resource_types)
        types[heaviest] = dataclasses.replace(original, max_units=bound)
        candidate = Cluster(tuple(types), cluster.throughput)
        if ExactScheduler().plan(CostModel(profile, candidate)).feasible:
            return candidate
    return cluster


def random_case(
    seed: int, n: int | None = None, T: int | None = None, time_scale: float = -9.0
) -> tuple[ModelProfile, Cluster]:
    """Arbitrary measured times per layer and type (log-normal around ``exp(time_scale)`` seconds) and tight
    unit limits: many cases where several stages share a limit, unlike the catalog's machines (the tests' cases
    against brute force; with ``time_scale=-11`` large ones where exact needs its MILP)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 8)) if n is None else n
    T = int(rng.integers(2, 4)) if T is None else T
    types = [
        ResourceType(
            f"t{i}",
            "cpu",
            float(rng.uniform(0.5, 3)),
            int(rng.integers(1, 8)),
            1e12,
            1e11,
            float(rng.choice([1e9, 5e9, 1e11])),
            1e9,
            float(rng.choice([0, 1e9])),
        )
        for i in range(T)
    ]
    layers = [
        LayerProfile(
            f"l{i}",
            str(rng.choice(["sparse", "dense"])),
            1e6,
            float(rng.choice([0, 1e8, 3e9])),
            float(rng.choice([0, 1e3])),
            float(rng.uniform(0, 1e4)),
            {f"t{t}": float(rng.lognormal(time_scale, 1)) for t in range(T) if rng.random() < 0.9},
        )
        for i in range(n)
    ]
    return ModelProfile("random", 512, tuple(layers)), Cluster(tuple(types), float(rng.uniform(1e3, 3e4)))


# (layers, types) of the scale suite: the sizes exact must prove optimal quickly (issue 14), largest last.
SCALE_SIZES = ((64, 16), (64, 32), (128, 64), (200, 64))


def scale_suite(seed: int = 0) -> list[Workload]:
    """Each of ``SCALE_SIZES`` three times: a catalog workload without and one with a lowered unit limit, and a
    ``random_case`` whose tight limits bind across stages (the catalog's lowered limit often changes only which
    stages fit, so the unlimited DP's plan already respects it): the first of its seeds where the unlimited DP's
    plan breaks a shared limit, so that exact needs its Lagrangian and MILP."""
    suite = []
    for index, (n, T) in enumerate(SCALE_SIZES):
        base = seed * 1000 + 900 + 3 * index
        suite += [generate_workload(base + binding, n, T, binding=bool(binding)) for binding in (0, 1)]
        for case_seed in range(base + 2, base + 2 + 100 * 20, 100):
            profile, cluster = random_case(case_seed, n, T, time_scale=-11.0)
            model = CostModel(profile, cluster)
            _, unlimited = dp_assignment(model.stage_tables().cost)
            if unlimited is not None and not model.evaluate(unlimited).feasible:
                break
        name = f"tight_{case_seed}"
        suite.append(Workload(name, dataclasses.replace(profile, name=name), cluster, True))
    return suite


# How much the shared unit limits of a tight case take from what the plan could save without them: the unlimited
# optimum is 15% to 29% cheaper than the limited one (the limited one 1.18x to 1.40x it).
TIME_LOW, TIME_HIGH = -11.0, -9.0
TIGHT_CUT = (0.15, 2.0 / 7.0)
# Unit limits of the tight cases: each type the unlimited optimum uses keeps this share of its units (the
# first share that cuts by TIGHT_CUT is taken), the others keep random_case's few units.
_TIGHT_SHARES = (0.7, 0.6, 0.5, 0.4, 0.3, 0.2)


def unlimited_optimum(profile: ModelProfile, cluster: Cluster) -> tuple[float, list[int] | None]:
    """The cheapest plan with every max_units lifted (only the stage tables' DP: nothing shared binds)."""
    lifted = Cluster(tuple(dataclasses.replace(t, max_units=10**6) for t in cluster.resource_types), cluster.throughput)
    return dp_assignment(CostModel(profile, lifted).stage_tables().cost)


def tight_case(seed: int, num_layers: int | None = None, num_types: int | None = None) -> Workload:
    """A mid-size case (16-64 layers, 4-16 types unless given) whose shared unit limits bind hard: the types the
    unlimited optimum uses get a share of the units it gives them, so many stages compete for a few units of the
    cheap types; the limited optimum (exact) is 1.18x to 1.40x the unlimited one (``TIGHT_CUT``). Times per
    layer and type as ``random_case``'s; candidates are drawn from the seed until one cuts that much."""
    rng = np.random.default_rng(seed)
    n = int(num_layers if num_layers is not None else rng.integers(16, 65))
    T = int(num_types if num_types is not None else rng.integers(4, 17))
    for _ in range(200):
        profile, cluster = random_case(
            int(rng.integers(2**31)), n, T, time_scale=float(rng.uniform(TIME_LOW, TIME_HIGH))
        )
        unlimited, plan = unlimited_optimum(profile, cluster)
        if plan is None:
            continue
        used = np.zeros(T)
        for stage in CostModel(profile, cluster).evaluate(plan).stages:
            used[stage.type_index] += stage.units
        for share in _TIGHT_SHARES:
            types = tuple(
                dataclasses.replace(t, max_units=max(1, int(used[i] * share))) if used[i] > 0 else t
                for i, t in enumerate(cluster.resource_types)
            )
            limited = Cluster(types, cluster.throughput)
            optimum = ExactScheduler().plan(CostModel(profile, limited))
            if not optimum.feasible:
                break
            cut = 1.0 - unlimited / optimum.cost_per_hour
            if cut > TIGHT_CUT[1]:
                break
            if cut >= TIGHT_CUT[0]:
                name = f"limited_{seed}"
                return Workload(name, dataclasses.replace(profile, name=name), limited, True)
    raise RuntimeError(f"tight_case({seed}): no candidate cut the unlimited optimum by {TIGHT_CUT}")


# (layers, types) of the tight suite: mid-size, the 32x8 twice.
TIGHT_SIZES = ((16, 4), (24, 6), (32, 8), (32, 8), (40, 10), (48, 12), (64, 8), (64, 16))


def tight_suite(seed: int = 0) -> list[Workload]:
    """``tight_case`` at each of ``TIGHT_SIZES``: the cases where rl's refinement must free units of one type to
    make room on another (issue 22)."""
    return [tight_case(seed * 1000 + 2200 + index, n, T) for index, (n, T) in enumerate(TIGHT_SIZES)]


def workload_suite(count: int = 24, seed: int = 0) -> list[Workload]:
    """The benchmark suite: sizes spread over 4..64 layers and 2..16 types, the largest case included, a few
    small enough for brute force, every third with a binding shared unit limit."""
    rng = np.random.default_rng(seed)
    suite = []
    for index in range(count):
        if index in (0, 1):
            n, T = 64, 16  # the largest case, once without and once with a binding limit
        elif index in (2, 3, 4):
            n, T = 4 + index, 2 + index  # small enough for brute force to check the others
        else:
            n, T = int(rng.integers(4, 65)), int(rng.integers(2, 17))
        suite.append(generate_workload(seed * 1000 + index, n, T, binding=(index % 3 == 1)))
    return suite
