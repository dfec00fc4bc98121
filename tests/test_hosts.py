"""A plan across hosts (planning/hosts.py, `heterps launch-args --hosts`, `heterps launch --hosts`): the hosts file,
where every process goes, the one set of arguments every host runs, and what is refused before anything starts."""

import json
import os
import re

import pytest
import yaml
from conftest import REPO, run_cli

from heterps_paddle.errors import HeterPSError
from heterps_paddle.launch.hosts import host_round
from heterps_paddle.launch.job import JOB_ENV, HostsJob
from heterps_paddle.launch.options import OptionsError, parse
from heterps_paddle.launch.placement import SERVER_RULE_DEFAULT, SERVER_RULE_FILE, expand, expand_files
from heterps_paddle.planning.hosts import hosts_from_dict, hosts_to_dict, load_hosts
from heterps_paddle.planning.model import PlanningInputError, load_cluster, load_model_profile, plan_from_dict
from heterps_paddle.planning.planner import make_plans

CLUSTER = os.path.join(REPO, "examples", "clusters", "dlrm_aws.yaml")
HOSTS = os.path.join(REPO, "examples", "clusters", "dlrm_aws_hosts.yaml")
KINDS = {t.name: t.kind for t in load_cluster(CLUSTER).resource_types}
WHATIF = {
    "format": 1,
    "feasible": True,
    "stages": [
        {"resource": "cpu_r6i_8xl", "kind": "cpu", "layers": ["emb", "bottom"], "units": 3},
        {"resource": "gpu_t4", "kind": "gpu", "layers": ["top"], "units": 1},
    ],
}


def hosts(*entries, **top):
    return hosts_from_dict({"format": 1, "hosts": list(entries), **top}, "hosts.yaml")


def paddle_ranks(args):
    """Paddle 2.6.2's own numbering (launch_utils.py: get_role_endpoints' node_ips, start_ps' rank counters):
    hosts ordered by first appearance in --servers, --workers, --heter_workers; ranks counted host by host."""
    lists = {a.split("=", 1)[0][2:]: a.split("=", 1)[1] for a in args}
    servers = lists["servers"].split(",")
    workers = lists["workers"].split(",")
    heter = [e for e in lists.get("heter_workers", "").replace(";", ",").split(",") if e]
    nodes = []
    for endpoint in servers + workers + heter:
        if endpoint.split(":")[0] not in nodes:
            nodes.append(endpoint.split(":")[0])
    ranks = {}
    for role, endpoints in (("server", servers), ("trainer", workers)):
        counter = 0
        for node in nodes:
            for endpoint in endpoints:
                if endpoint.split(":")[0] == node:
                    ranks[(role, endpoint)] = counter
                    counter += 1
    return nodes, ranks


def test_the_dlrm_what_if_on_its_hosts_file():
    """The shipped hosts file runs the shipped what-if's exact plan: 3 x cpu_r6i_8xl | 1 x gpu_t4 on four hosts."""
    profile = load_model_profile(os.path.join(REPO, "examples", "profiles", "dlrm_criteo_1tb.yaml"))
    _, plan = make_plans(profile, load_cluster(CLUSTER), "exact", [None])[0]
    expansion = expand(plan, load_hosts(HOSTS), KINDS)
    assert expansion.arguments() == [
        "--server_num=3",
        "--servers=10.0.1.11:36000,10.0.1.12:36000,10.0.1.13:36000",
        "--worker_num=3",
        "--workers=10.0.1.11:36001,10.0.1.12:36001,10.0.1.13:36001",
        "--heter_worker_num=1",
        "--heter_workers=10.0.1.21:36000",
        "--heter_devices=gpu",
        "--http_port=36002",
    ]
    assert expansion.server_rule == SERVER_RULE_DEFAULT
    assert [p.address for p in expansion.trainers] == ["10.0.1.11", "10.0.1.12", "10.0.1.13"]  # trainer ids
    assert [part.host.address for part in expansion.parts] == ["10.0.1.11", "10.0.1.12", "10.0.1.13", "10.0.1.21"]
    # the file names its cluster (relative to itself): the same from the files
    assert expand_files_args(HOSTS, plan) == expansion.arguments()


def expand_files_args(hosts_path, plan, tmp=None, **kwargs):
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "plan.json")
        with open(path, "w") as handle:
            handle.write(plan.to_json())
        return expand_files(path, hosts_path, **kwargs).arguments()


def test_ranks_are_list_positions_as_paddle_numbers_them():
    """Servers on the second trainer host and on a server-only host: Paddle puts those hosts first, and the lists
    follow, so PADDLE_TRAINER_ID is the index in --workers."""
    plan = plan_from_dict(WHATIF)
    h = hosts(
        {"address": "10.0.0.1", "type": "cpu_r6i_8xl"},
        {"address": "10.0.0.2", "type": "cpu_r6i_8xl", "servers": 2},
        {"address": "10.0.0.3", "type": "cpu_r6i_8xl"},
        {"address": "10.0.0.9", "type": "cpu_r6i_16xl", "units": 0, "servers": 1},
        {"address": "10.0.0.4", "type": "gpu_t4", "port": 40000},
    )
    expansion = expand(plan, h, KINDS)
    assert expansion.server_rule == SERVER_RULE_FILE
    nodes, ranks = paddle_ranks(expansion.arguments())
    assert nodes == [part.host.address for part in expansion.parts]
    for process in expansion.servers + expansion.trainers:
        assert ranks[(process.role, process.endpoint)] == process.rank
    assert [p.endpoint for p in expansion.servers] == ["10.0.0.2:36000", "10.0.0.2:36001", "10.0.0.9:36000"]
    assert [p.endpoint for p in expansion.trainers] == ["10.0.0.2:36002", "10.0.0.1:36000", "10.0.0.3:36000"]
    assert [p.endpoint for p in expansion.heter[0]] == ["10.0.0.4:40000"]
    assert expansion.http_port == 36003  # the next port free on server 0's host
    with pytest.raises(PlanningInputError, match=r"places 3 parameter servers.*but 2 were asked for"):
        expand(plan, h, KINDS, server_num=2)


def test_server_num_round_robin_and_multi_unit_hosts_across_stages():
    plan = plan_from_dict(
        {
            "format": 1,
            "feasible": True,
            "stages": [
                {"resource": "cpu_r6i_8xl", "kind": "cpu", "layers": ["a"], "units": 2},
                {"resource": "gpu_a100", "kind": "gpu", "layers": ["b"], "units": 3},
                {"resource": "cpu_r6i_8xl", "kind": "cpu", "layers": ["c"], "units": 1},
                {"resource": "gpu_a100", "kind": "gpu", "layers": ["d"], "units": 5},
            ],
        }
    )
    h = hosts(
        {"address": "10.0.0.1", "type": "cpu_r6i_8xl"},
        {"address": "10.0.0.2", "type": "cpu_r6i_8xl", "units": 2},
        {"address": "10.0.0.3", "type": "gpu_a100", "units": 8},
        http_port=35000,
        base_port=20000,
    )
    expansion = expand(plan, h, KINDS, server_num=3, gpu=False)
    assert [p.endpoint for p in expansion.servers] == ["10.0.0.1:20000", "10.0.0.1:20001", "10.0.0.2:20000"]
    assert [p.endpoint for p in expansion.trainers] == ["10.0.0.1:20002", "10.0.0.2:20001"]
    assert [[p.endpoint for p in group] for group in expansion.heter] == [
        ["10.0.0.3:20000", "10.0.0.3:20001", "10.0.0.3:20002"],
        ["10.0.0.2:20002"],
        [f"10.0.0.3:{20003 + i}" for i in range(5)],
    ]
    args = expansion.arguments()
    assert (
        "--heter_worker_num=3;1;5" in args and "--heter_devices=cpu;cpu;cpu" in args and args[-1] == "--http_port=35000"
    )
    assert expansion.part("10.0.0.3").stage_units == {2: 3, 4: 5}
    # every process is told the type of the hosts each group runs on: a plan made inside minimize prices them so
    described = expansion.launch_description()
    assert described["worker_type"] == "cpu_r6i_8xl"
    assert described["heter_types"] == ["gpu_a100", "cpu_r6i_8xl", "gpu_a100"]
    # ... the plan's cut, run as it is; and which process times each host type (trainer 0 its own, then the first
    # trainer of the first host of each other type): fleet/host_measure.py
    assert described["stage_layers"] == [["a"], ["b"], ["c"], ["d"]]
    assert described["measure"] == {"cpu_r6i_8xl": "10.0.0.1:20002", "gpu_a100": "10.0.0.3:20000"}
    # too few units of a type: named with its hosts, counting what earlier stages took
    h2 = hosts(
        {"address": "10.0.0.1", "type": "cpu_r6i_8xl", "units": 3},
        {"address": "10.0.0.3", "type": "gpu_a100", "units": 7},
    )
    with pytest.raises(
        PlanningInputError,
        match=r"hosts.yaml: the plan's stage 4 needs 5 units of type 'gpu_a100' \(and earlier stages 3\), but the "
        r"hosts of that type have 7: 10.0.0.3 \(7 units\)",
    ):
        expand(plan, h2, KINDS)


def test_refused_before_anything_starts_naming_host_and_type():
    plan = plan_from_dict(WHATIF)
    two = hosts(
        {"address": "10.0.0.1", "type": "cpu_r6i_8xl"},
        {"address": "10.0.0.2", "type": "cpu_r6i_8xl"},
        {"address": "10.0.0.4", "type": "gpu_t4"},
    )
    with pytest.raises(
        PlanningInputError,
        match=r"stage 1 needs 3 units of type 'cpu_r6i_8xl', but the hosts of that type have 2: 10.0.0.1 \(1 unit\), 10.0.0.2 \(1 unit\)",
    ):
        expand(plan, two, KINDS)
    no_gpu = hosts(*[{"address": f"10.0.0.{i}", "type": "cpu_r6i_8xl"} for i in (1, 2, 3)])
    with pytest.raises(
        PlanningInputError,
        match=r"stage 2 needs 1 unit of type 'gpu_t4', but the hosts of that type have 0 \(no host of that type\)",
    ):
        expand(plan, no_gpu, KINDS)
    wrong = hosts(
        *[{"address": f"10.0.0.{i}", "type": "cpu_r6i_8xl"} for i in (1, 2, 3)],
        {"address": "10.0.0.7", "type": "gpu_tpu"},
    )
    with pytest.raises(
        PlanningInputError, match=r"hosts\[3\] \(10.0.0.7\): type 'gpu_tpu' is not a resource type of the cluster"
    ):
        expand(plan, wrong, KINDS)
    with pytest.raises(
        PlanningInputError, match=r"hosts\[3\] \(10.0.0.7\): type 'gpu_tpu' is not a type of the plan, and no cluster"
    ):
        expand(plan, wrong)
    with pytest.raises(PlanningInputError, match=r"hosts.yaml: hosts\[1\].address: 10.0.0.1 is already hosts\[0\]"):
        hosts({"address": "10.0.0.1", "type": "a"}, {"address": "10.0.0.1", "type": "b"})
    with pytest.raises(PlanningInputError, match=r"hosts\[0\].address: 'node-1' is not an IPv4 address"):
        hosts({"address": "node-1", "type": "a"})
    with pytest.raises(PlanningInputError, match=r"hosts\[0\].gpus: unknown key"):
        hosts({"address": "10.0.0.1", "type": "a", "gpus": 8})
    with pytest.raises(PlanningInputError, match=r"hosts\[0\].port: must be a port number"):
        hosts({"address": "10.0.0.1", "type": "a", "port": 70000})
    with pytest.raises(PlanningInputError, match=r"place no parameter server"):
        expand(
            plan,
            hosts(
                *[{"address": f"10.0.0.{i}", "type": "cpu_r6i_8xl", "servers": 0} for i in (1, 2, 3)],
                {"address": "10.0.0.4", "type": "gpu_t4"},
            ),
            KINDS,
        )
    with pytest.raises(PlanningInputError, match=r"infeasible"):
        expand(plan_from_dict({"format": 1, "feasible": False}), two, KINDS)


def test_hosts_file_round_trips():
    h = load_hosts(HOSTS)
    assert h.cluster == CLUSTER and h.base_port == 36000 and len(h.hosts) == 4
    again = hosts_from_dict(hosts_to_dict(h), HOSTS)
    assert again == h


def write(tmp_path, name, document):
    path = tmp_path / name
    path.write_text(json.dumps(document) if name.endswith(".json") else yaml.safe_dump(document))
    return str(path)


ONE_STAGE = {"format": 1, "feasible": True, "stages": [{"resource": "cpu", "kind": "cpu", "layers": ["x"], "units": 1}]}
LOOPBACK = {
    "format": 1,
    "hosts": [
        {"address": "127.0.0.2", "type": "cpu", "units": 0, "servers": 1, "port": 36100},
        {"address": "127.0.0.3", "type": "cpu", "port": 36200},
        {"address": "127.0.0.4", "type": "cpu", "units": 0},
    ],
}


def test_heterps_launch_finds_its_part_from_its_address(tmp_path, capsys):
    plan, hosts_path = write(tmp_path, "plan.json", ONE_STAGE), write(tmp_path, "hosts.yaml", LOOPBACK)
    train = tmp_path / "train.py"
    train.write_text("")
    argv = ["--quiet", "--hosts", hosts_path, f"--plan={plan}", "--timeout", "60", "--log_dir", "log", str(train), "-x"]
    assert parse(["--log_dir", "log", str(train)]).hosts is None
    options = parse(argv)
    expanded = host_round(options, {"POD_IP": "127.0.0.3"})
    assert not expanded.spare and not expanded.nothing and expanded.env == {"POD_IP": "127.0.0.3"}
    assert expanded.options.quiet and expanded.options.timeout == 60
    assert expanded.options.launcher_argv() == [
        "--log_dir=log",
        "--server_num=1",
        "--servers=127.0.0.2:36100",
        "--worker_num=1",
        "--workers=127.0.0.3:36200",
        "--http_port=36101",
        str(train),
        "-x",
    ]
    assert "this host is 127.0.0.3 (cpu): CPU trainer 0" in capsys.readouterr().out
    # the coordinator takes each trainer's data plan requests from its host only (launch/board.py)
    assert expanded.job.trainers == {"127.0.0.2": (), "127.0.0.3": (0,)}
    assert HostsJob.from_env({JOB_ENV: expanded.job.to_json()}) == expanded.job
    # --host wins over POD_IP, wherever it stands before the script; the same arguments on every host
    server = host_round(parse(argv[:3] + ["--host", "127.0.0.2"] + argv[3:]), {"POD_IP": "127.0.0.3"})
    assert server.options.launcher_argv() == expanded.options.launcher_argv() and server.env == {"POD_IP": "127.0.0.2"}
    idle = host_round(options, {"POD_IP": "127.0.0.4"})
    assert idle.nothing and "127.0.0.4 runs nothing of this plan" in capsys.readouterr().out
    with pytest.raises(HeterPSError, match=r"this host's address 127\.0\.0\.9 is not in it \(hosts: 127\.0\.0\.2, "):
        host_round(options, {"POD_IP": "127.0.0.9"})
    with pytest.raises(OptionsError, match="needs --plan"):
        parse(["--hosts", hosts_path, str(train)])


def test_options_in_any_order_as_a_user_writes_them(tmp_path):
    """``--log_dir`` first (as ``launch-args`` prints it), the hosts options after: the script is still the script."""
    plan, hosts_path = write(tmp_path, "plan.json", ONE_STAGE), write(tmp_path, "hosts.yaml", LOOPBACK)
    train = tmp_path / "train.py"
    train.write_text("")
    given = ["--log_dir", "log", "--hosts", hosts_path, "--plan", plan, "--devices", "cpu", "--host", "127.0.0.3"]
    options = parse([*given, str(train), "--hosts", "mine"])
    assert options.script == str(train) and options.script_args == ("--hosts", "mine")
    assert options.hosts is not None and options.hosts.hosts == hosts_path and options.hosts.host == "127.0.0.3"
    assert options.log_dir == "log" and options.hosts.devices == "cpu"
    # every ordering of the same options reads the same
    pairs = [given[i : i + 2] for i in range(0, len(given), 2)]
    assert parse([*sum(reversed(pairs), []), str(train), "--hosts", "mine"]) == options
    for bad, named in (
        ([*given, "--log_dir", "x", str(train)], "--log_dir is given twice"),
        (["--timeout", "1", "--timeout=2", str(train)], "--timeout is given twice"),
        (["--hosts", hosts_path, "--plan", plan, hosts_path, str(train)], "is not a Python script"),
        (["--log_dir", "log", "--no-such", "1", str(train)], "--no-such is not an option"),
        (["--log_dir", "log", str(tmp_path / "missing.py")], "does not exist"),
        (["--log_dir"], "--log_dir needs a value"),
        (["--quiet"], "no training script given"),
        (["--restarts", "-1", "--hosts", hosts_path, "--plan", plan, str(train)], "--restarts must be >= 0"),
        (["--devices", "gpu", "--hosts", hosts_path, "--plan", plan, str(train)], "--devices must be plan or cpu"),
    ):
        with pytest.raises(OptionsError, match=re.escape(named)):
            parse(bad)


def test_launch_args_hosts_command(tmp_path, capsys):
    plan, hosts_path = write(tmp_path, "plan.json", ONE_STAGE), write(tmp_path, "hosts.yaml", LOOPBACK)
    code, out, err = run_cli(capsys, "launch-args", plan, "--hosts", hosts_path, "--train", "train.py -m 'a b.yaml'")
    assert code == 0, err
    lines = out.splitlines()
    commands = [line for line in lines if not line.startswith("#")]
    args = "--server_num=1 --servers=127.0.0.2:36100 --worker_num=1 --workers=127.0.0.3:36200 --http_port=36101"
    own = f"--hosts {hosts_path} --plan {plan}"
    assert commands == [
        f"heterps launch {own} --host 127.0.0.2 train.py -m 'a b.yaml'",
        f"heterps launch {own} --host 127.0.0.3 train.py -m 'a b.yaml'",
    ]
    assert any(line.startswith("# each host runs its line") and args in line for line in lines)
    assert f"# parameter servers: 127.0.0.2:36100 ({SERVER_RULE_FILE})" in lines
    assert "# 127.0.0.4 (cpu): nothing (no unit of the plan, no server)" in lines
    # the job's key: made once beside the hosts file, only its owner reads it, never printed
    key = hosts_path + ".key"
    assert f"the job's key made at {key} (mode 0600" in err
    assert os.stat(key).st_mode & 0o777 == 0o600
    secret = open(key).read().strip()
    assert len(secret) == 64 and secret not in out + err
    code, out, err = run_cli(capsys, "launch-args", plan, "--hosts", hosts_path, "--json")
    assert f"the job's key is {key}" in err and open(key).read().strip() == secret  # never replaced
    document = json.loads(out)
    assert document["key_file"] == key and secret not in out
    assert document["launch_args"] == args.split() and document["server_rule"] == SERVER_RULE_FILE
    assert [h["address"] for h in document["hosts"]] == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert document["hosts"][1]["processes"] == [
        {"role": "trainer", "rank": 0, "stage": 1, "endpoint": "127.0.0.3:36200"}
    ]
    big = write(tmp_path, "big.json", {**ONE_STAGE, "stages": [{**ONE_STAGE["stages"][0], "units": 2}]})
    code, out, err = run_cli(capsys, "launch-args", big, "--hosts", hosts_path)
    assert code == 2 and "stage 1 needs 2 units of type 'cpu', but the hosts of that type have 1" in err
    code, _, err = run_cli(capsys, "launch-args", plan, "--k8s", str(tmp_path))
    assert code == 2 and "need --hosts" in err


def test_a_machine_joined_from_outside_the_file_is_checked_like_a_host_of_it():
    from heterps_paddle.planning.hosts import Host, HostsFile, joined_hosts, joined_spec, with_joined

    assert joined_spec("127.0.0.9", {"type": "gpu_fast"}, "--join") == {"type": "gpu_fast", "units": 1}
    assert joined_spec("127.0.0.9", {"type": "g", "units": 2, "port": 40000}, "x") == {
        "type": "g",
        "units": 2,
        "port": 40000,
    }
    for bad, says in (
        ({"type": "g", "units": 0}, "units must be 1..4096"),
        ({"type": "g", "port": 70000}, "port"),
        ({"type": "g", "color": 1}, "unknown key"),
        ({"units": 1}, "type"),
        ("gpu", "must be a mapping"),
    ):
        with pytest.raises(PlanningInputError, match=says):
            joined_spec("127.0.0.9", bad, "--join")
    with pytest.raises(PlanningInputError, match="not an IPv4 address"):
        joined_spec("host-9", {"type": "g"}, "--join")
    hosts = HostsFile((Host("127.0.0.2", "cpu"),), "h.yaml")
    grown = with_joined(hosts, joined_hosts({"127.0.0.9": {"type": "g", "units": 2}}))
    assert [h.address for h in grown.hosts] == ["127.0.0.2", "127.0.0.9"] and grown.hosts[1].units == 2
    with pytest.raises(PlanningInputError, match="is a host of the file"):
        with_joined(hosts, (Host("127.0.0.2", "cpu"),))
