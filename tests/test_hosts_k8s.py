"""Kubernetes manifests of a plan across hosts (tools/k8s.py): every pod's environment is what Paddle 2.6.2's own PS
launcher, run with the per-host command on that pod's host, gives the same process (its processes are recorded,
not started), and every object validates against the Kubernetes API schema (kubernetes-validate, offline)."""

import json
import os

import kubernetes_validate
import pytest
import yaml
from conftest import REPO, run_cli

from heterps_paddle.launch.placement import expand, process_env
from heterps_paddle.planning.hosts import load_hosts
from heterps_paddle.planning.launch import LAUNCH_ENV
from heterps_paddle.planning.model import load_cluster, plan_from_dict
from heterps_paddle.tools.k8s import HOST_LABEL, ManifestError, manifests

CLUSTER = os.path.join(REPO, "examples", "clusters", "dlrm_aws.yaml")
HOSTS = os.path.join(REPO, "examples", "clusters", "dlrm_aws_hosts.yaml")
KINDS = {t.name: t.kind for t in load_cluster(CLUSTER).resource_types}
KUBERNETES = "1.30.0"
# What differs from machine to machine and is not the job's: a temporary directory of the launcher (the rendezvous
# is gloo's HTTP store), and which local device a process gets.
MACHINE_KEYS = {"PADDLE_GLOO_FS_PATH", "CUDA_VISIBLE_DEVICES", "XPU_VISIBLE_DEVICES"}
ROLE_KEYS = {"TRAINING_ROLE", "POD_IP", "STAGE_ID", "STAGE_NUM", "HETER_DEVICE_TYPE"}


def job_keys(env):
    return {
        k: v
        for k, v in env.items()
        if (k.startswith(("PADDLE_", "HETERPS_", "FLAGS_selected_")) or k in ROLE_KEYS) and k not in MACHINE_KEYS
    }


PLANS = {
    "whatif": {
        "format": 1,
        "feasible": True,
        "stages": [
            {"resource": "cpu_r6i_8xl", "kind": "cpu", "layers": ["a"], "units": 3},
            {"resource": "gpu_t4", "kind": "gpu", "layers": ["b"], "units": 1},
        ],
    },
    "three_stages": {
        "format": 1,
        "feasible": True,
        "stages": [
            {"resource": "cpu_r6i_8xl", "kind": "cpu", "layers": ["a"], "units": 2},
            {"resource": "gpu_t4", "kind": "gpu", "layers": ["b"], "units": 1},
            {"resource": "cpu_r6i_8xl", "kind": "cpu", "layers": ["c"], "units": 1},
        ],
    },
    "one_stage": {
        "format": 1,
        "feasible": True,
        "stages": [{"resource": "cpu_r6i_8xl", "kind": "cpu", "layers": ["a"], "units": 3}],
    },
}


class _Recorded:
    """A process Paddle's launcher believes it started."""

    def __init__(self, env):
        self.env = env
        self.pid = 0

    def wait(self):
        return 0

    def poll(self):
        return 0

    def terminate(self):
        pass


def paddle_envs(expansion, address, tmp_path, monkeypatch):
    """The environment of every process Paddle 2.6.2's launcher starts on the host ``address`` when it runs the
    ``expansion``'s arguments (as `heterps launch --hosts` runs it: HETERPS_LAUNCH set from the expansion)."""
    arguments = expansion.arguments()
    from paddle.distributed.fleet import launch_utils
    from paddle.distributed.fleet.launch_utils import DistributeMode, ParameterServerLauncher

    from heterps_paddle.runtime.seam import paddle_launch_arguments as paddle_arguments

    args = paddle_arguments([*arguments, "--log_dir", str(tmp_path / address), "train.py", "-m", "c.yaml"])
    for key in list(os.environ):
        if key.startswith(("PADDLE_", "HETERPS_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("POD_IP", address)
    monkeypatch.setenv(LAUNCH_ENV, json.dumps(expansion.launch_description()))
    started = []

    def popen(cmd, env=None, stdout=None, stderr=None):
        assert cmd[-3:] == ["train.py", "-m", "c.yaml"]
        started.append(dict(env))
        return _Recorded(env)

    monkeypatch.setattr(launch_utils.subprocess, "Popen", popen)
    mode = DistributeMode.PS_HETER if args.heter_worker_num else DistributeMode.PS
    ParameterServerLauncher(args, mode).start_ps()
    return started


@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_pod_gets_what_the_per_host_command_gives_it(name, tmp_path, monkeypatch):
    expansion = expand(plan_from_dict(PLANS[name]), load_hosts(HOSTS), KINDS)
    documents = manifests(expansion, ["train.py", "-m", "c.yaml"], "registry.example/heterps:1", "dlrm", "ml")
    pods = {}
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES, strict=True)  # raises on any schema error
        if document["kind"] == "Job":
            spec = document["spec"]["template"]["spec"]
            container = spec["containers"][0]
            env = {item["name"]: item["value"] for item in container["env"]}
            assert spec["nodeSelector"] == {HOST_LABEL: env["POD_IP"]} and spec["hostNetwork"] is True
            assert container["command"] == ["python", "-u", "train.py", "-m", "c.yaml"]
            pods[(env["POD_IP"], env["PADDLE_PORT"])] = env
    assert documents[0]["kind"] == "Service" and documents[0]["spec"]["clusterIP"] == "None"
    assert len(pods) == len(expansion.processes())
    launched = {}
    for part in expansion.parts:
        if not part.processes:
            continue  # heterps launch starts no launcher there (in plain PS mode Paddle's would fail an assertion)
        for env in paddle_envs(expansion, part.host.address, tmp_path, monkeypatch):
            launched[(env["POD_IP"], env["PADDLE_PORT"])] = job_keys(env)
        # exactly this host's processes: Paddle's launcher starts those and no other
        assert {k for k in launched if k[0] == part.host.address} == {(p.address, str(p.port)) for p in part.processes}
    assert set(launched) == set(pods)
    for key, env in pods.items():
        assert job_keys(env) == launched[key], key
        assert set(env) == set(job_keys(env))  # the pods carry nothing else
    if name == "whatif":
        trainers = sorted(
            (int(e["PADDLE_TRAINER_ID"]), e["POD_IP"]) for e in launched.values() if "PADDLE_TRAINER_ID" in e
        )
        assert trainers == [(0, "10.0.1.11"), (1, "10.0.1.12"), (2, "10.0.1.13")]
        heter = [d for d in documents if d["metadata"]["name"] == "dlrm-heter-0"][0]
        assert heter["spec"]["template"]["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}


def test_process_env_is_the_pods_env():
    expansion = expand(plan_from_dict(PLANS["whatif"]), load_hosts(HOSTS), KINDS)
    heter = expansion.heter[0][0]
    env = process_env(expansion, heter)
    assert env["TRAINING_ROLE"] == "HETER_TRAINER" and env["HETER_DEVICE_TYPE"] == "gpu"
    assert env["PADDLE_PREVIOUS_HETER_TRAINER_IP_PORT_LIST"] == "10.0.1.11:36001,10.0.1.12:36001,10.0.1.13:36001"
    assert env["PADDLE_GLOO_HTTP_ENDPOINT"] == "10.0.1.11:36002"


def test_launch_args_writes_the_manifests(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLANS["whatif"]))
    out_dir = tmp_path / "k8s"
    hosts = tmp_path / "hosts.yaml"  # a copy: launch-args makes the job's key beside the hosts file
    hosts.write_text(open(HOSTS).read().replace("cluster: dlrm_aws.yaml", f"cluster: {CLUSTER}"))
    code, _, err = run_cli(
        capsys,
        "launch-args",
        str(plan),
        "--hosts",
        str(hosts),
        "--k8s",
        str(out_dir),
        "--image",
        "img:1",
        "--train",
        "train.py -m c.yaml",
    )
    assert code == 0, err
    documents = list(yaml.safe_load_all((out_dir / "heterps.yaml").read_text()))
    assert [d["kind"] for d in documents] == ["Service"] + ["Job"] * 7
    assert "wrote 8 objects" in err
    code, _, err = run_cli(
        capsys, "launch-args", str(plan), "--hosts", str(hosts), "--k8s", str(out_dir), "--train", "t.py"
    )
    assert code == 2 and "--k8s needs --image" in err
    with pytest.raises(ManifestError, match="--name 'Bad_Name'"):
        manifests(expand(plan_from_dict(PLANS["whatif"]), load_hosts(HOSTS), KINDS), ["t.py"], "img", "Bad_Name")
