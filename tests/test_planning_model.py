"""Records and strict file I/O of the planning formats (docs/plan-formats.md)."""

import json
import math

import pytest
import yaml

from heterps_paddle.planning.model import (
    Plan,
    PlanningInputError,
    Stage,
    load_cluster,
    load_model_profile,
    load_plan,
    model_profile_from_dict,
    model_profile_to_dict,
    save_plan,
)

PROFILE = {
    "format": 1,
    "name": "ctr",
    "batch_size": 512,
    "layers": [
        {
            "name": "embedding",
            "kind": "sparse",
            "flops": 0,
            "param_bytes": 2.1e9,
            "io_bytes": 832,
            "out_bytes": 104,
            "time": {"cpu_16": 2.0e-6},
        },
        {"name": "fc_0", "kind": "dense", "flops": 1.0e6, "param_bytes": 4.0e6, "out_bytes": 16},
    ],
}
CLUSTER = {
    "format": 1,
    "throughput": 200000,
    "resource_types": [
        {
            "name": "cpu_16",
            "kind": "cpu",
            "price_per_hour": 0.68,
            "max_units": 64,
            "flops": 5e11,
            "mem_bw": 6e10,
            "memory": 1.28e11,
            "net_bw": 3.1e9,
            "ssd_bw": 2e9,
        },
        {
            "name": "gpu",
            "kind": "gpu",
            "price_per_hour": 3.0,
            "max_units": 8,
            "flops": 5e13,
            "mem_bw": 9e11,
            "memory": 1.6e10,
            "net_bw": 1.25e9,
        },
    ],
}


def write(tmp_path, name, document, as_json=False):
    path = tmp_path / name
    path.write_text(json.dumps(document) if as_json else yaml.safe_dump(document))
    return str(path)


def test_profile_and_cluster_load_from_yaml_and_json(tmp_path):
    for as_json in (False, True):
        suffix = ".json" if as_json else ".yaml"
        profile = load_model_profile(write(tmp_path, "m" + suffix, PROFILE, as_json))
        cluster = load_cluster(write(tmp_path, "c" + suffix, CLUSTER, as_json))
        assert profile.layer_names() == ["embedding", "fc_0"]
        assert profile.layers[1].io_bytes == 0.0  # the one documented default
        assert profile.layers[0].time == {"cpu_16": 2.0e-6}
        assert cluster.resource_types[1].ssd_bw == 0.0 and not cluster.resource_types[1].has_ssd
        assert cluster.throughput == 200000
    assert model_profile_from_dict(model_profile_to_dict(profile)) == profile


def mutated(document, path, value, delete=False):
    copy = json.loads(json.dumps(document))
    target = copy
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return copy


@pytest.mark.parametrize(
    "document,loader,key,reason",
    [
        (mutated(PROFILE, ["layers", 0, "flopz"], 1), load_model_profile, "layers[0].flopz", "unknown key"),
        (
            mutated(PROFILE, ["layers", 1, "out_bytes"], None, delete=True),
            load_model_profile,
            "layers[1].out_bytes",
            "missing required key",
        ),
        (mutated(PROFILE, ["layers", 0, "param_bytes"], -1), load_model_profile, "layers[0].param_bytes", "negative"),
        (
            mutated(PROFILE, ["layers", 0, "time", "cpu_16"], float("nan")),
            load_model_profile,
            "layers[0].time.cpu_16",
            "finite",
        ),
        (mutated(PROFILE, ["layers", 1, "kind"], "conv"), load_model_profile, "layers[1].kind", "one of"),
        (mutated(PROFILE, ["layers", 1, "name"], "embedding"), load_model_profile, "layers[1].name", "duplicate"),
        (mutated(PROFILE, ["format"], 2), load_model_profile, "format", "unsupported"),
        (mutated(PROFILE, ["batch_size"], 0), load_model_profile, "batch_size", ">= 1"),
        (
            mutated(CLUSTER, ["resource_types", 0, "max_units"], 2.5),
            load_cluster,
            "resource_types[0].max_units",
            "integer",
        ),
        (mutated(CLUSTER, ["resource_types", 1, "flops"], 0), load_cluster, "resource_types[1].flops", "positive"),
        (
            mutated(CLUSTER, ["resource_types", 1, "memory"], float("inf")),
            load_cluster,
            "resource_types[1].memory",
            "finite",
        ),
        (
            mutated(CLUSTER, ["resource_types", 1, "price_per_hour"], True),
            load_cluster,
            "resource_types[1].price_per_hour",
            "number",
        ),
        (mutated(CLUSTER, ["extra"], 1), load_cluster, "extra", "unknown key"),
    ],
)
def test_invalid_inputs_name_file_key_and_reason(tmp_path, document, loader, key, reason):
    path = (
        write(tmp_path, "bad.json", document, as_json=True)
        if any(isinstance(v, float) and not math.isfinite(v) for v in _numbers(document))
        else write(tmp_path, "bad.yaml", document)
    )
    with pytest.raises(PlanningInputError) as error:
        loader(path)
    message = str(error.value)
    assert path in message and key in message and reason in message


def _numbers(document):
    if isinstance(document, dict):
        for value in document.values():
            yield from _numbers(value)
    elif isinstance(document, list):
        for value in document:
            yield from _numbers(value)
    elif isinstance(document, float):
        yield document


def test_missing_file_and_unparsable_file(tmp_path):
    with pytest.raises(PlanningInputError, match="does not exist"):
        load_cluster(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("format: [1\n")
    with pytest.raises(PlanningInputError, match="cannot parse"):
        load_cluster(str(bad))


def test_plan_json_round_trip(tmp_path):
    plan = Plan(
        scheduler="exact",
        model="ctr",
        feasible=True,
        assignment={"embedding": "cpu_16", "fc_0": "gpu"},
        stages=(
            Stage("cpu_16", "cpu", ("embedding",), 3, 1.4e-5, 214285.7),
            Stage("gpu", "gpu", ("fc_0",), 1, 1e-6, 1e6),
        ),
        throughput=214285.7,
        cost_per_hour=5.04,
        cost_per_million_samples=0.007,
        search_seconds=0.01,
        evaluations=12,
        required_throughput=200000.0,
    )
    path = str(tmp_path / "plan.json")
    save_plan(plan, path)
    assert load_plan(path) == plan
    document = json.loads(open(path).read())
    assert document["format"] == 1 and document["stages"][0]["units"] == 3 and "reason" not in document
    infeasible = Plan(scheduler="rl", model="ctr", feasible=False, assignment={}, reason="too fast")
    save_plan(infeasible, path)
    assert load_plan(path) == infeasible


def test_a_plan_given_ints_reads_back_the_same_and_digests_the_same():
    """Issue 52: a throughput target given as an int (``heterps_configs = {"throughput": 2000}``) made the plan
    trainer 0 published digest differently from the one every receiver read back from JSON (floats), and every
    process of the first round across hosts failed with PlanDisagreement."""
    from heterps_paddle.fleet.plan_agreement import plan_digest
    from heterps_paddle.planning.model import plan_from_dict

    plan = Plan(
        scheduler="exact",
        model="ctr",
        feasible=True,
        assignment={"embedding": "cpu"},
        stages=(Stage("cpu", "cpu", ("embedding",), 2, 0, 4000),),
        throughput=4000,
        cost_per_hour=2,
        cost_per_million_samples=1,
        search_seconds=0,
        required_throughput=2000,
        budget_per_hour=3,
        refined_from_cost=2,
    )
    received = plan_from_dict(json.loads(plan.to_json()))
    assert received == plan and received.to_json() == plan.to_json()
    assert plan_digest(received) == plan_digest(plan)
    assert isinstance(plan.required_throughput, float) and isinstance(plan.stages[0].throughput, float)
