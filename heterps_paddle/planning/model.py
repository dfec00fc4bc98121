"""Typed records of the planning half and their file formats (docs/plan-formats.md, ``format: 1``).

Loading is strict on purpose: a profile or cluster file is hand-edited, and a silently ignored typo
(``max_unit: 8``) would give a plan that looks right and is not. Every error names the file, the key
(as a path such as ``resource_types[2].memory``) and the reason.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

import yaml

from heterps_paddle.files import write_atomic

# re-exported: the planning records' readers and writers import them from here
from heterps_paddle.planning.strict_reader import FORMAT_VERSION as FORMAT_VERSION
from heterps_paddle.planning.strict_reader import PlanningInputError as PlanningInputError
from heterps_paddle.planning.strict_reader import Reader, load_document

LAYER_KINDS = ("sparse", "dense")
RESOURCE_KINDS = ("cpu", "gpu")
# A gpu type's tier_slowdown when its cluster file gives none (docs/plan-formats.md, "The cost model"): how many
# times longer a sparse layer's lookup takes when its row is served through the GPU table's host tier instead of
# device memory.  From the tiers' H100 run (docs/sparse-table.md, "The tiers on an H100": 2^24 rows, dim 64, SGD,
# a step = pull then push of 2^20 Zipf(1.05) ids, the hottest quarter resident): 768 steps/s with every row
# resident, 115 with a quarter, 6.66 times slower = r + (1 - r) * 8.55 at r = 0.25.  (Zipf 0.8, less skewed, gives
# 27.4; before the host tier's batch calls and the eviction on the device it was 65.5.)
DEFAULT_TIER_SLOWDOWN = 8.55


@dataclass(frozen=True)
class LayerProfile:
    name: str
    kind: str  # sparse | dense
    flops: float  # forward+backward FLOPs per sample
    param_bytes: float  # parameters plus optimizer state
    io_bytes: float = 0.0  # parameter-row bytes read+written per sample (sparse lookups)
    out_bytes: float = 0.0  # activation bytes per sample crossing a boundary right after this layer
    time: Mapping[str, float] = field(default_factory=dict)  # measured s/sample by resource type name


@dataclass(frozen=True)
class ModelProfile:
    name: str
    batch_size: int
    layers: tuple[LayerProfile, ...]

    def layer_names(self) -> list[str]:
        return [layer.name for layer in self.layers]


def lookups_end(profile: ModelProfile) -> int:
    """The layer index after the model's last sparse layer (0: none).  The runtime's rule for a split: its lookups
    run on its first stage, the CPU trainers' section (a heterogeneous trainer holds no lookup; a split refuses a
    sparse layer on a GPU stage), so a split's first cut comes at or after it.  A model whose dense layers come
    before a lookup in program order (Wide&Deep's wide part, DLRM's bottom MLP: docs/models.md) cannot be cut
    there."""
    return max((i + 1 for i, layer in enumerate(profile.layers) if layer.kind == "sparse"), default=0)


@dataclass(frozen=True)
class ResourceType:
    name: str
    kind: str  # cpu | gpu
    price_per_hour: float
    max_units: int
    flops: float
    mem_bw: float
    memory: float
    net_bw: float
    ssd_bw: float = 0.0  # 0: no SSD tier
    tier_slowdown: float | None = None  # gpu types: host tier vs device lookups (None: DEFAULT_TIER_SLOWDOWN)

    @property
    def has_ssd(self) -> bool:
        return self.ssd_bw > 0

    @property
    def host_tier_slowdown(self) -> float:
        """What a lookup served off the device costs against a resident one: 1 for a cpu type (its table has no
        device tier), the file's ``tier_slowdown`` or ``DEFAULT_TIER_SLOWDOWN`` for a gpu type."""
        if self.kind != "gpu":
            return 1.0
        return DEFAULT_TIER_SLOWDOWN if self.tier_slowdown is None else self.tier_slowdown


@dataclass(frozen=True)
class Links:
    """The network between hosts, where it is slower than a unit's own ``net_bw`` (a shaped link, another zone):
    bytes/s between a host of a type and any other host (``types``), or between any two hosts (``default``).  The
    cost model sends a stage boundary's activations at ``min(net_bw, link)`` of each side's type."""

    default: float | None = None
    types: Mapping[str, float] = field(default_factory=dict)

    def bandwidth(self, type_name: str) -> float:
        """Bytes/s of the link of a host of ``type_name`` to the others (inf: not limited beyond its net_bw)."""
        value = self.types.get(type_name, self.default)
        return math.inf if value is None else value


@dataclass(frozen=True)
class Cluster:
    resource_types: tuple[ResourceType, ...]
    throughput: float | None = None  # required samples/s; may come from the command line instead
    links: Links | None = None  # None: boundaries cross at each type's net_bw

    def type_names(self) -> list[str]:
        return [t.name for t in self.resource_types]

    def with_throughput(self, throughput: float | None) -> Cluster:
        return dataclasses.replace(self, throughput=throughput)

    def boundary_bw(self, resource: ResourceType) -> float:
        """Bytes/s at which a unit of ``resource`` sends and receives a stage boundary's activations."""
        return resource.net_bw if self.links is None else min(resource.net_bw, self.links.bandwidth(resource.name))


def _floats(record: Any, names: tuple[str, ...]) -> None:
    """A plan's numbers as floats whatever the caller passed: a plan travels as JSON and is read back as floats
    (``plan_from_dict``), and its digest, its file and every comparison must be the same on both sides (a target
    of 2000 given as an int once made the receivers' digest differ from the publisher's)."""
    for name in names:
        value = getattr(record, name)
        if isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(record, name, float(value))


@dataclass(frozen=True)
class Stage:
    """One stage of a plan: a contiguous run of layers on ``units`` units of one resource type."""

    resource: str
    kind: str  # cpu | gpu: the resource type's kind (how the stage is launched and where its embeddings live)
    layers: tuple[str, ...]
    units: int
    time_per_sample: float = 0.0  # one unit's seconds per sample (0: not predicted, e.g. a hand-written plan)
    throughput: float = 0.0  # units / time_per_sample

    def __post_init__(self) -> None:
        _floats(self, ("time_per_sample", "throughput"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "kind": self.kind,
            "layers": list(self.layers),
            "units": self.units,
            "time_per_sample": self.time_per_sample,
            "throughput": self.throughput,
        }


@dataclass(frozen=True)
class Plan:
    """A plan: which resource type runs each layer, cut into stages with unit counts (the one plan schema:
    ``heterps plan`` writes it, the automatic path writes it, the runtime reads it)."""

    scheduler: str
    model: str
    feasible: bool
    assignment: Mapping[str, str]  # layer name -> resource type name (program order)
    stages: tuple[Stage, ...] = ()
    throughput: float = 0.0  # achieved samples/s (min over stages)
    cost_per_hour: float = 0.0
    cost_per_million_samples: float = 0.0
    search_seconds: float = 0.0
    evaluations: int = 0
    reason: str | None = None  # why it is infeasible
    refined_from_cost: float | None = None  # rl: cost of the policy's best sample before local refinement
    required_throughput: float | None = None
    budget_per_hour: float | None = None  # budget mode: the price per hour the plan had to stay within
    # What the plan was made from (fleet.auto_plan): same digest, same plan; and the launch it was fitted to.
    inputs_digest: str | None = None
    launch: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        _floats(
            self,
            (
                "throughput",
                "cost_per_hour",
                "cost_per_million_samples",
                "search_seconds",
                "refined_from_cost",
                "required_throughput",
                "budget_per_hour",
            ),
        )

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def heter_stages(self) -> tuple[Stage, ...]:
        """Stages 2..N: run by Paddle's heterogeneous trainers when the plan is split."""
        return self.stages[1:]

    def layer_to_stage(self) -> dict[str, int]:
        """Layer name -> 1-based stage index (Paddle's STAGE_ID)."""
        return {layer: index for index, stage in enumerate(self.stages, 1) for layer in stage.layers}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "scheduler": self.scheduler,
            "model": self.model,
            "feasible": self.feasible,
            "assignment": dict(self.assignment),
            "stages": [s.to_dict() for s in self.stages],
            "throughput": self.throughput,
            "cost_per_hour": self.cost_per_hour,
            "cost_per_million_samples": self.cost_per_million_samples,
            "search_seconds": self.search_seconds,
            "evaluations": self.evaluations,
        }
        optional = {
            "required_throughput": self.required_throughput,
            "budget_per_hour": self.budget_per_hour,
            "reason": self.reason,
            "refined_from_cost": self.refined_from_cost,
            "inputs_digest": self.inputs_digest,
            "launch": None if self.launch is None else dict(self.launch),
        }
        out.update({key: value for key, value in optional.items() if value is not None})
        return out

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)


# ------------------------------------------------------------------------------------- strict parsing


_LAYER_KEYS = {"name", "kind", "flops", "param_bytes", "io_bytes", "out_bytes", "time"}
_LAYER_REQUIRED = {"name", "kind", "flops", "param_bytes", "out_bytes"}


def model_profile_from_dict(document: Any, source: str = "<model>") -> ModelProfile:
    r = Reader(source)
    doc = r.mapping(
        document, "", {"format", "name", "batch_size", "layers"}, {"format", "name", "batch_size", "layers"}
    )
    r.format_version(doc)
    layers = []
    for index, raw in enumerate(r.sequence(doc["layers"], "layers")):
        key = f"layers[{index}]"
        item = r.mapping(raw, key, _LAYER_KEYS, _LAYER_REQUIRED)
        times: dict[str, float] = {}
        if "time" in item and item["time"] is not None:
            time_map = r.mapping(item["time"], f"{key}.time", set(map(str, item["time"] or {})), set())
            for type_name, seconds in time_map.items():
                times[str(type_name)] = r.number(seconds, f"{key}.time.{type_name}")
        layers.append(
            LayerProfile(
                name=r.string(item["name"], f"{key}.name"),
                kind=r.string(item["kind"], f"{key}.kind", LAYER_KINDS),
                flops=r.number(item["flops"], f"{key}.flops"),
                param_bytes=r.number(item["param_bytes"], f"{key}.param_bytes"),
                io_bytes=r.number(item.get("io_bytes", 0), f"{key}.io_bytes"),
                out_bytes=r.number(item["out_bytes"], f"{key}.out_bytes"),
                time=times,
            )
        )
    r.unique([layer.name for layer in layers], "layers")
    return ModelProfile(
        name=r.string(doc["name"], "name"),
        batch_size=r.integer(doc["batch_size"], "batch_size", 1),
        layers=tuple(layers),
    )


def model_profile_to_dict(profile: ModelProfile) -> dict[str, Any]:
    layers = []
    for layer in profile.layers:
        item: dict[str, Any] = {
            "name": layer.name,
            "kind": layer.kind,
            "flops": layer.flops,
            "param_bytes": layer.param_bytes,
            "io_bytes": layer.io_bytes,
            "out_bytes": layer.out_bytes,
        }
        if layer.time:
            item["time"] = dict(layer.time)
        layers.append(item)
    return {"format": FORMAT_VERSION, "name": profile.name, "batch_size": profile.batch_size, "layers": layers}


def load_model_profile(path: str) -> ModelProfile:
    return model_profile_from_dict(load_document(path), path)


# -------------------------------------------------------------------------------------------- cluster

_TYPE_KEYS = {
    "name",
    "kind",
    "price_per_hour",
    "max_units",
    "flops",
    "mem_bw",
    "memory",
    "net_bw",
    "ssd_bw",
    "tier_slowdown",
}
_TYPE_REQUIRED = _TYPE_KEYS - {"ssd_bw", "tier_slowdown"}


def cluster_from_dict(document: Any, source: str = "<cluster>") -> Cluster:
    r = Reader(source)
    doc = r.mapping(document, "", {"format", "throughput", "resource_types", "links"}, {"format", "resource_types"})
    r.format_version(doc)
    types = []
    for index, raw in enumerate(r.sequence(doc["resource_types"], "resource_types")):
        key = f"resource_types[{index}]"
        item = r.mapping(raw, key, _TYPE_KEYS, _TYPE_REQUIRED)
        name = r.string(item["name"], f"{key}.name")
        kind = r.string(item["kind"], f"{key}.kind", RESOURCE_KINDS)
        tier_slowdown = None
        if item.get("tier_slowdown") is not None:
            tier_slowdown = r.number(item["tier_slowdown"], f"{key}.tier_slowdown")
            if tier_slowdown < 1:
                raise r.fail(f"{key}.tier_slowdown", f"must be >= 1 (1: no slowdown), got {tier_slowdown!r}")
            if kind != "gpu":
                raise r.fail(f"{key}.tier_slowdown", "only a gpu type has a device tier above its host tier")
        types.append(
            ResourceType(
                name=name,
                kind=kind,
                price_per_hour=r.number(item["price_per_hour"], f"{key}.price_per_hour"),
                max_units=r.integer(item["max_units"], f"{key}.max_units", 1),
                # Rates divide per-sample work: zero would mean "infinitely slow", which is no resource at all.
                flops=r.number(item["flops"], f"{key}.flops", positive=True),
                mem_bw=r.number(item["mem_bw"], f"{key}.mem_bw", positive=True),
                memory=r.number(item["memory"], f"{key}.memory"),
                net_bw=r.number(item["net_bw"], f"{key}.net_bw", positive=True),
                ssd_bw=r.number(item.get("ssd_bw", 0) or 0, f"{key}.ssd_bw"),
                tier_slowdown=tier_slowdown,
            )
        )
    r.unique([t.name for t in types], "resource_types")
    throughput = None
    if doc.get("throughput") is not None:
        throughput = r.number(doc["throughput"], "throughput", positive=True)
    links = None
    if doc.get("links") is not None:
        links = _links(r, doc["links"], {t.name for t in types})
    return Cluster(resource_types=tuple(types), throughput=throughput, links=links)


def _links(r: Reader, value: Any, type_names: set[str]) -> Links:
    item = r.mapping(value, "links", {"default", "types"}, set())
    default = None if item.get("default") is None else r.number(item["default"], "links.default", positive=True)
    by_type: dict[str, float] = {}
    if item.get("types") is not None:
        raw = r.mapping(item["types"], "links.types", set(map(str, item["types"])), set())
        for name, bandwidth in raw.items():
            if str(name) not in type_names:
                raise r.fail(
                    f"links.types.{name}", f"not a resource type of this cluster ({', '.join(sorted(type_names))})"
                )
            by_type[str(name)] = r.number(bandwidth, f"links.types.{name}", positive=True)
    return Links(default=default, types=by_type)


def cluster_to_dict(cluster: Cluster) -> dict[str, Any]:
    out: dict[str, Any] = {"format": FORMAT_VERSION}
    if cluster.throughput is not None:
        out["throughput"] = cluster.throughput
    out["resource_types"] = [
        {
            "name": t.name,
            "kind": t.kind,
            "price_per_hour": t.price_per_hour,
            "max_units": t.max_units,
            "flops": t.flops,
            "mem_bw": t.mem_bw,
            "memory": t.memory,
            "net_bw": t.net_bw,
            "ssd_bw": t.ssd_bw,
            # only when given: a file without it writes (and digests) as before
            **({} if t.tier_slowdown is None else {"tier_slowdown": t.tier_slowdown}),
        }
        for t in cluster.resource_types
    ]
    if cluster.links is not None:
        links: dict[str, Any] = {}
        if cluster.links.default is not None:
            links["default"] = cluster.links.default
        if cluster.links.types:
            links["types"] = dict(cluster.links.types)
        out["links"] = links
    return out


def load_cluster(path: str) -> Cluster:
    return cluster_from_dict(load_document(path), path)


def unknown_time_keys(profile: ModelProfile, cluster: Cluster) -> list[str]:
    """Resource type names in measured ``time`` maps that the cluster does not have. The cost model uses
    estimates for those types (a profile measured on the local CPU is still usable on any cluster); the CLI
    warns, so a misspelt type name is not silently ignored."""
    known = set(cluster.type_names())
    return sorted({name for layer in profile.layers for name in layer.time if name not in known})


# ----------------------------------------------------------------------------------------------- plan

_PLAN_KEYS = {
    "format",
    "scheduler",
    "model",
    "feasible",
    "assignment",
    "stages",
    "throughput",
    "cost_per_hour",
    "cost_per_million_samples",
    "search_seconds",
    "evaluations",
    "reason",
    "refined_from_cost",
    "required_throughput",
    "budget_per_hour",
    "inputs_digest",
    "launch",
}
_PLAN_REQUIRED = {"format", "feasible"}
_STAGE_KEYS = {"resource", "kind", "layers", "units", "time_per_sample", "throughput"}
_STAGE_REQUIRED = {"resource", "layers", "units"}


def plan_from_dict(document: Any, source: str = "<plan>", kinds: Mapping[str, str] | None = None) -> Plan:
    """A plan from its JSON document.  ``kinds`` (resource type name -> cpu|gpu, e.g. from the cluster the plan
    was made for) gives the kind of stages that do not carry one; a stage whose kind is known from neither is an
    error.  A hand-written plan needs only ``format``, ``feasible`` and its stages' resource, layers and units."""
    r = Reader(source)
    doc = r.mapping(document, "", _PLAN_KEYS, _PLAN_REQUIRED)
    r.format_version(doc)
    feasible = r.boolean(doc["feasible"], "feasible")
    kinds = kinds or {}
    stages = []
    placed: set[str] = set()
    for index, raw in enumerate(r.sequence(doc.get("stages", []), "stages", non_empty=feasible)):
        key = f"stages[{index}]"
        item = r.mapping(raw, key, _STAGE_KEYS, _STAGE_REQUIRED)
        resource = r.string(item["resource"], f"{key}.resource")
        if "kind" in item:
            kind = r.string(item["kind"], f"{key}.kind", RESOURCE_KINDS)
            if resource in kinds and kinds[resource] != kind:
                raise r.fail(f"{key}.kind", f"{kind!r}, but the cluster says {resource!r} is {kinds[resource]!r}")
        elif resource in kinds:
            kind = kinds[resource]
        else:
            raise r.fail(
                f"{key}.kind",
                f"missing, and no cluster file says whether {resource!r} is a cpu or a gpu "
                "type: add \"kind\": \"cpu\" or \"gpu\" to the stage, or give the cluster",
            )
        layers = tuple(r.string(n, f"{key}.layers") for n in r.sequence(item["layers"], f"{key}.layers"))
        twice = placed.intersection(layers)
        if twice:
            raise r.fail(f"{key}.layers", f"{sorted(twice)} already placed by an earlier stage")
        placed.update(layers)
        stages.append(
            Stage(
                resource=resource,
                kind=kind,
                layers=layers,
                units=r.integer(item["units"], f"{key}.units", 1),
                time_per_sample=r.number(item.get("time_per_sample", 0.0), f"{key}.time_per_sample"),
                throughput=r.number(item.get("throughput", 0.0), f"{key}.throughput"),
            )
        )

    def optional_number(name: str) -> float | None:
        return None if doc.get(name) is None else r.number(doc[name], name)

    if "assignment" in doc:
        raw_assignment = r.mapping(doc["assignment"], "assignment", set(map(str, doc["assignment"] or {})), set())
        assignment = {str(k): r.string(v, f"assignment.{k}") for k, v in raw_assignment.items()}
    else:
        assignment = {layer: stage.resource for stage in stages for layer in stage.layers}
    launch = None
    if doc.get("launch") is not None:
        launch = dict(r.mapping(doc["launch"], "launch", set(map(str, doc["launch"])), set()))
    return Plan(
        scheduler=r.string(doc.get("scheduler", "manual"), "scheduler"),
        model=str(doc.get("model", "")),
        feasible=feasible,
        assignment=assignment,
        stages=tuple(stages),
        throughput=optional_number("throughput") or 0.0,
        cost_per_hour=optional_number("cost_per_hour") or 0.0,
        cost_per_million_samples=optional_number("cost_per_million_samples") or 0.0,
        search_seconds=optional_number("search_seconds") or 0.0,
        evaluations=r.integer(doc.get("evaluations", 0), "evaluations", 0),
        reason=None if doc.get("reason") is None else r.string(doc["reason"], "reason"),
        refined_from_cost=optional_number("refined_from_cost"),
        required_throughput=optional_number("required_throughput"),
        budget_per_hour=optional_number("budget_per_hour"),
        inputs_digest=None if doc.get("inputs_digest") is None else r.string(doc["inputs_digest"], "inputs_digest"),
        launch=launch,
    )


def load_plan(path: str, cluster: Cluster | str | None = None, kinds: Mapping[str, str] | None = None) -> Plan:
    """A plan file; ``cluster`` (a Cluster or a cluster file) or ``kinds`` names the kinds of stages that carry
    none."""
    if isinstance(cluster, str):
        cluster = load_cluster(cluster)
    if cluster is not None:
        kinds = {t.name: t.kind for t in cluster.resource_types}
    return plan_from_dict(load_document(path), path, kinds)


def save_plan(plan: Plan, path: str) -> None:
    """The one writer of plan files (``heterps plan --out``, the automatic path's ``plan.json``): one format (JSON,
    indent 2), written whole or not at all (``files.write_atomic``), so a reader never sees half a plan."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    write_atomic(path, plan.to_json(indent=2) + "\n")


def save_yaml(document: Mapping[str, Any], path: str) -> None:
    """A profile or cluster document as YAML, keys in the document's order, written whole or not at all."""
    write_atomic(path, yaml.safe_dump(dict(document), sort_keys=False))
