"""Where each process of a plan runs on a job's hosts, and what Paddle's launcher is given there.

``expand`` places the plan's processes on the machines of the hosts file (planning/hosts.py) and gives the
``paddle.distributed.launch`` arguments every host runs unchanged: Paddle 2.6.2's PS launcher starts on each host
the endpoints whose IP equals the host's own (``POD_IP`` when set, else ``gethostbyname(gethostname())``;
``fleet/launch_utils.py: ParameterServerLauncher.get_role_endpoints``).  ``process_env`` is the environment that
launcher gives each process (the Kubernetes manifests set exactly it).  Only the launch (and ``heterps launch-args``,
which prints each host's command) uses it: planning says what a plan is and costs, the launch where it runs.

What Paddle's launcher does that the expansion follows (read in the installed 2.6.2 wheel):

- Hosts are ranked as ``node_ips``: the distinct IPs of ``--servers`` in order, then of ``--workers``, then of
  ``--heter_workers``.  Each role's ranks (``PADDLE_TRAINER_ID`` of a CPU trainer) are numbered host by host in
  that order, not in the order of the lists.  The lists written here are grouped by host in that order, so a
  process's rank is its index in its list (and in ``PADDLE_TRAINER_ENDPOINTS``).
- Ports: a heterogeneous endpoint without a port, and gloo's HTTP port without ``--http_port``, are drawn at
  random on each host, so hosts would disagree: every port is written out here.
- In heterogeneous mode a host whose IP matches nothing starts nothing and exits 0; in plain PS mode it fails an
  assertion.  ``heterps launch --hosts`` does not start Paddle's launcher on a host that runs nothing.

Pure Python, no Paddle.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from heterps_paddle.planning.hosts import MAX_PORT, Host, HostsFile, load_hosts, with_joined, without_hosts
from heterps_paddle.planning.launch import LAUNCH_ENV, check_runnable, heter_device_for
from heterps_paddle.planning.model import Plan, PlanningInputError, load_cluster, load_plan

SERVER_RULE_FILE = "as the hosts file says (its hosts' `servers:`)"
SERVER_RULE_DEFAULT = (
    "one per stage 1 host unless --server-num says how many; placed round-robin over the hosts that run stage 1, "
    "in the hosts file's order"
)


# ------------------------------------------------------------------------------------------- expansion


@dataclass(frozen=True)
class Process:
    """One process of the job on one host."""

    role: str  # server | trainer | heter_trainer
    address: str
    port: int
    rank: int  # servers: index in --servers; trainers: PADDLE_TRAINER_ID; heter: index in --heter_workers
    stage: int | None = None  # 1 for trainers, 2.. for heterogeneous trainers, None for servers

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"

    def describe(self) -> str:
        if self.role == "server":
            return f"parameter server {self.rank} (port {self.port})"
        if self.role == "trainer":
            return f"CPU trainer {self.rank} (stage 1, port {self.port})"
        return f"heterogeneous trainer {self.rank} (stage {self.stage}, port {self.port})"


@dataclass(frozen=True)
class HostPart:
    host: Host
    processes: tuple[Process, ...]
    stage_units: Mapping[int, int] = field(default_factory=dict)  # stage -> units of it on this host

    def describe(self) -> str:
        what = ", ".join(p.describe() for p in self.processes) or "nothing (no unit of the plan, no server)"
        return f"{self.host.address} ({self.host.type}): {what}"


@dataclass(frozen=True)
class Expansion:
    """A plan placed on the hosts: the one set of launch arguments every host runs, and each host's part."""

    plan: Plan
    hosts: HostsFile
    parts: tuple[HostPart, ...]  # in Paddle's node order (hosts that run nothing last, in file order)
    servers: tuple[Process, ...]
    trainers: tuple[Process, ...]
    heter: tuple[tuple[Process, ...], ...]  # per stage 2..N
    heter_devices: tuple[str, ...]
    http_port: int
    server_rule: str
    control_port: int  # heterps launch's coordinator, on server 0's host (launch/coordinator.py)

    def arguments(self) -> list[str]:
        """The ``paddle.distributed.launch`` arguments, the same on every host (before the training script)."""
        args = [
            f"--server_num={len(self.servers)}",
            "--servers=" + ",".join(p.endpoint for p in self.servers),
            f"--worker_num={len(self.trainers)}",
            "--workers=" + ",".join(p.endpoint for p in self.trainers),
        ]
        if self.heter:
            args += [
                "--heter_worker_num=" + ";".join(str(len(stage)) for stage in self.heter),
                "--heter_workers=" + ";".join(",".join(p.endpoint for p in stage) for stage in self.heter),
                "--heter_devices=" + ";".join(self.heter_devices),
            ]
        args.append(f"--http_port={self.http_port}")
        return args

    @property
    def control_endpoint(self) -> str:
        return f"{self.servers[0].address}:{self.control_port}"

    def digest(self) -> str:
        """What every host's ``heterps launch --hosts`` must agree on: the plan, and where each process runs."""
        body = json.dumps({"plan": self.plan.to_dict(), "expansion": self.to_dict()}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def part(self, address: str) -> HostPart:
        for part in self.parts:
            if part.host.address == address:
                return part
        listed = ", ".join(p.host.address for p in self.parts)
        raise PlanningInputError(f"{self.hosts.source}: this host's address {address} is not in it (hosts: {listed})")

    def processes(self) -> list[Process]:
        return [p for part in self.parts for p in part.processes]

    def launch_description(self) -> dict[str, Any]:
        """What ``heterps launch`` tells every process in ``HETERPS_LAUNCH`` (launch/paddle_round.py:
        launch_description, the same keys first), and the type the hosts file names for each group's hosts: a plan
        made inside ``minimize`` prices and times each group as the machines it runs on (planning/launch_fit.py)."""
        return {
            "worker_num": len(self.trainers),
            "server_num": len(self.servers),
            "heter_worker_num": [len(stage) for stage in self.heter],
            "heter_devices": list(self.heter_devices),
            "worker_type": self._one_type(self.trainers),
            "heter_types": [self._one_type(stage) for stage in self.heter],
            # the plan's cut: trainer 0 runs it as it is (planning/launch_fit.py), not a cut of its own choosing
            "stage_layers": [list(stage.layers) for stage in self.plan.stages],
            "measure": self.measurers(),
        }

    def measurers(self) -> dict[str, str]:
        """type -> the endpoint of the one process that times it on its host (fleet/host_measure.py): stage 1's
        trainer 0 for its own host's type, then the first trainer (CPU or heterogeneous) of the first host of each
        other type the round runs a trainer on."""
        out: dict[str, str] = {}
        first = self.trainers[0] if self.trainers else None
        for part in sorted(
            self.parts, key=lambda p: (first is None or p.host.address != first.address, p.host.address)
        ):
            trainers = [p for p in part.processes if p.role != "server"]
            if part.host.type in out or not trainers:
                continue
            pick = first if first is not None and first in trainers else trainers[0]
            out[part.host.type] = pick.endpoint
        return out

    def _one_type(self, processes: Sequence[Process]) -> str | None:
        """The one type of the hosts ``processes`` run on (None when they are of several)."""
        types = {part.host.type for part in self.parts if any(p.address == part.host.address for p in processes)}
        return types.pop() if len(types) == 1 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "launch_args": self.arguments(),
            "server_rule": self.server_rule,
            "http_endpoint": f"{self.servers[0].address}:{self.http_port}",
            "control_endpoint": self.control_endpoint,
            "hosts": [
                {
                    "address": part.host.address,
                    "type": part.host.type,
                    "env": {"POD_IP": part.host.address},
                    "processes": [
                        {"role": p.role, "rank": p.rank, "stage": p.stage, "endpoint": p.endpoint}
                        for p in part.processes
                    ],
                }
                for part in self.parts
            ],
        }

    def placement(self) -> list[str]:
        """Where the servers went and why, and gloo's store."""
        return [
            f"parameter servers: {', '.join(p.endpoint for p in self.servers)} ({self.server_rule})",
            f"gloo HTTP store: {self.servers[0].address}:{self.http_port} (server 0's host)",
            f"heterps launch's coordinator: {self.control_endpoint} (server 0's host)",
        ]

    def report(self) -> list[str]:
        return self.placement() + [part.describe() for part in self.parts]


def expand(
    plan: Plan,
    hosts: HostsFile,
    cluster_kinds: Mapping[str, str] | None = None,
    server_num: int | None = None,
    gpu: bool = True,
    known_types: frozenset[str] = frozenset(),
) -> Expansion:
    """Place ``plan`` on ``hosts``.  ``cluster_kinds``: the cluster's resource types (name -> kind) the hosts'
    types are checked against (None: the plan's types are all that is known).  ``gpu``: GPU stages run their
    heterogeneous trainers on ``gpu`` (False: on ``cpu``, e.g. hosts emulated on one CPU machine).
    ``known_types``: without a cluster, types known besides the plan's (a restart's plan may leave out a type of
    the first round's: its hosts stand by).

    Refused before anything starts, naming the host and the type: a host whose type the cluster lacks; a stage
    whose units exceed the units of its type the hosts have; servers asked of a file that places them itself."""
    check_runnable(plan)
    source = hosts.source
    for index, host in enumerate(hosts.hosts):
        if cluster_kinds is not None:
            if host.type not in cluster_kinds:
                raise PlanningInputError(
                    f"{source}: hosts[{index}] ({host.address}): type {host.type!r} is not a resource type of the "
                    f"cluster (its types: {', '.join(cluster_kinds)})"
                )
        elif host.type not in {s.resource for s in plan.stages} | known_types:
            raise PlanningInputError(
                f"{source}: hosts[{index}] ({host.address}): type {host.type!r} is not a type of the plan, and no "
                "cluster file says it exists (add `cluster: FILE` to the hosts file, or give --cluster)"
            )
    for number, stage in enumerate(plan.stages, 1):
        kind = (cluster_kinds or {}).get(stage.resource, stage.kind)
        if kind != stage.kind:
            raise PlanningInputError(
                f"stage {number}: {stage.resource!r} is {stage.kind} in the plan, {kind} in the cluster"
            )

    # Units: each stage takes units of its type from the hosts of that type, in the file's order.
    free = {host.address: host.units for host in hosts.hosts}
    stage_hosts: list[list[tuple[Host, int]]] = []
    for number, stage in enumerate(plan.stages, 1):
        of_type = [host for host in hosts.hosts if host.type == stage.resource]
        need, taken = stage.units, []
        for host in of_type:
            take = min(need, free[host.address])
            if take:
                taken.append((host, take))
                free[host.address] -= take
                need -= take
        if need:
            have = sum(host.units for host in of_type)
            listed = ", ".join(f"{h.address} ({h.units} unit{'s' * (h.units != 1)})" for h in of_type)
            used_before = sum(s.units for s in plan.stages[: number - 1] if s.resource == stage.resource)
            raise PlanningInputError(
                f"{source}: the plan's stage {number} needs {stage.units} unit{'s' * (stage.units != 1)} of type "
                f"{stage.resource!r}"
                + (f" (and earlier stages {used_before})" if used_before else "")
                + f", but the hosts of that type have {have}"
                + (f": {listed}" if listed else " (no host of that type)")
            )
        stage_hosts.append(taken)

    # Servers: the file's `servers:` when any host gives it, else the default rule.
    explicit = [host for host in hosts.hosts if host.servers is not None]
    if explicit:
        placed = [host for host in hosts.hosts for _ in range(host.servers or 0)]
        if not placed:
            raise PlanningInputError(
                f"{source}: its hosts' `servers:` place no parameter server (at least one is needed)"
            )
        if server_num is not None and server_num != len(placed):
            raise PlanningInputError(
                f"{source} places {len(placed)} parameter server{'s' * (len(placed) != 1)} (`servers:`), but "
                f"{server_num} were asked for (--server-num): give one or the other"
            )
        rule = SERVER_RULE_FILE
    else:
        first = [host for host, _ in stage_hosts[0]]
        count = len(first) if server_num is None else server_num
        if count < 1:
            raise PlanningInputError(f"the server count must be >= 1, got {count}")
        placed = [first[i % len(first)] for i in range(count)]
        rule = SERVER_RULE_DEFAULT
    server_count = {host.address: 0 for host in hosts.hosts}
    for host in placed:
        server_count[host.address] += 1

    # Paddle's node order: the distinct hosts of --servers, then of --workers, then of --heter_workers.
    order: list[str] = []
    for host in placed + [h for h, _ in stage_hosts[0]] + [h for taken in stage_hosts[1:] for h, _ in taken]:
        if host.address not in order:
            order.append(host.address)
    rank = {address: i for i, address in enumerate(order)}
    by_address = hosts.by_address()

    next_port = {host.address: host.port or hosts.base_port for host in hosts.hosts}

    # Ports the file fixes on server 0's host (gloo's, the coordinator's) are skipped by the processes' ports: a
    # restart keeps them where the first round put them, whatever the new plan runs there.
    reserved = {(order[0], p) for p in (hosts.http_port, hosts.control_port) if p is not None}

    def take_port(address: str) -> int:
        while (address, next_port[address]) in reserved:
            next_port[address] += 1
        port = next_port[address]
        if port > MAX_PORT:
            raise PlanningInputError(f"{source}: {address} runs out of ports above {port - 1}: lower its port")
        next_port[address] = port + 1
        return port

    servers: list[Process] = []
    for address in order:
        for _ in range(server_count[address]):
            servers.append(Process("server", address, take_port(address), len(servers)))
    trainers: list[Process] = []
    units_of = [dict((h.address, k) for h, k in taken) for taken in stage_hosts]
    for address in sorted(units_of[0], key=rank.__getitem__):
        for _ in range(units_of[0][address]):
            trainers.append(Process("trainer", address, take_port(address), len(trainers), 1))
    heter: list[tuple[Process, ...]] = []
    index = 0
    for number, units in enumerate(units_of[1:], 2):
        group = []
        for address in sorted(units, key=rank.__getitem__):
            for _ in range(units[address]):
                group.append(Process("heter_trainer", address, take_port(address), index, number))
                index += 1
        heter.append(tuple(group))
    server0 = servers[0].address
    http_port = hosts.http_port if hosts.http_port is not None else take_port(server0)
    control_port = hosts.control_port if hosts.control_port is not None else take_port(server0)
    ports_in_use = {(p.address, p.port) for p in servers + trainers + [p for g in heter for p in g]}
    if (server0, http_port) in ports_in_use:
        raise PlanningInputError(f"{source}: http_port {http_port} is also a process's port on {server0}")
    if (server0, control_port) in ports_in_use or control_port == http_port:
        raise PlanningInputError(
            f"{source}: control_port {control_port} is also a process's port or gloo's on {server0}"
        )

    everyone = servers + trainers + [p for group in heter for p in group]
    parts = []
    for address in order + [h.address for h in hosts.hosts if h.address not in rank]:
        stage_units = {n: units[address] for n, units in enumerate(units_of, 1) if address in units}
        parts.append(HostPart(by_address[address], tuple(p for p in everyone if p.address == address), stage_units))
    return Expansion(
        plan=plan,
        hosts=hosts,
        parts=tuple(parts),
        servers=tuple(servers),
        trainers=tuple(trainers),
        heter=tuple(heter),
        heter_devices=tuple(heter_device_for(s, gpu) for s in plan.heter_stages()),
        http_port=http_port,
        server_rule=rule,
        control_port=control_port,
    )


# --------------------------------------------------------------------------- each process's environment


def process_env(expansion: Expansion, process: Process) -> dict[str, str]:
    """The variables Paddle 2.6.2's PS launcher (``launch_utils.py: start_pod_server / start_pod_worker /
    start_pod_heter_worker``) and ``heterps launch`` (``HETERPS_LAUNCH``) give ``process`` when every host runs
    ``expansion.arguments()``, less those that differ from machine to machine: ``PADDLE_GLOO_FS_PATH`` (a temporary
    directory the launcher makes; unused, the rendezvous is gloo's HTTP store) and the device choice
    (``CUDA_VISIBLE_DEVICES`` / ``XPU_VISIBLE_DEVICES``: the pod's GPU is its own).  The Kubernetes manifests set
    exactly these; tests/test_hosts_k8s.py checks them against the launcher itself."""
    heter_mode = bool(expansion.heter)
    servers = ",".join(p.endpoint for p in expansion.servers)
    workers = ",".join(p.endpoint for p in expansion.trainers)
    heter_all = ",".join(p.endpoint for group in expansion.heter for p in group)
    stage_map = {1: workers, **{n: ",".join(p.endpoint for p in g) for n, g in enumerate(expansion.heter, 2)}}
    stage_trainers = str([len(expansion.trainers)] + [len(g) for g in expansion.heter])
    stage_num = str(1 + len(expansion.heter))
    common = {
        "PADDLE_WITH_GLOO": "0",
        "PADDLE_GLOO_RENDEZVOUS": "3",
        "PADDLE_GLOO_HTTP_ENDPOINT": f"{expansion.servers[0].address}:{expansion.http_port}",
    }
    env: dict[str, str]
    if process.role == "server":
        env = {
            "PADDLE_PSERVERS_IP_PORT_LIST": servers,
            "PADDLE_TRAINER_ENDPOINTS": workers,
            "PADDLE_COORDINATOR_ENDPOINTS": "",
            **({"PADDLE_ALL_HETER_TRAINER_IP_PORT_LIST": heter_all} if heter_mode else {}),
            "PADDLE_PORT": str(process.port),
            "TRAINING_ROLE": "PSERVER",
            "PADDLE_TRAINERS_NUM": str(len(expansion.trainers)),
            "POD_IP": process.address,
        }
    elif process.role == "trainer":
        env = {
            "PADDLE_PSERVERS_IP_PORT_LIST": servers,
            "PADDLE_TRAINER_ENDPOINTS": workers,
            "PADDLE_TRAINERS_NUM": str(len(expansion.trainers)),
            "PADDLE_COORDINATOR_ENDPOINTS": "",
            "TRAINING_ROLE": "TRAINER",
            "POD_IP": process.address,
            "PADDLE_PORT": str(process.port),
            "PADDLE_TRAINER_ID": str(process.rank),
            "FLAGS_selected_gpus": "0",
            "FLAGS_selected_xpus": "0",
        }
        if heter_mode:
            env.update(
                {
                    "PADDLE_STAGE_TRAINERS_NUM": stage_trainers,
                    "STAGE_ID": "1",
                    "STAGE_NUM": stage_num,
                    "PADDLE_PREVIOUS_HETER_TRAINER_IP_PORT_LIST": "",
                    "PADDLE_NEXT_HETER_TRAINER_IP_PORT_LIST": stage_map[2],
                    "PADDLE_ALL_HETER_TRAINER_IP_PORT_LIST": heter_all,
                    "HETER_DEVICE_TYPE": "cpu",
                }
            )
    else:
        stage = int(process.stage or 2)
        env = {
            "PADDLE_PSERVERS_IP_PORT_LIST": servers,
            "PADDLE_TRAINER_ENDPOINTS": workers,
            "PADDLE_NEXT_HETER_TRAINER_IP_PORT_LIST": stage_map.get(stage + 1, ""),
            "PADDLE_PREVIOUS_HETER_TRAINER_IP_PORT_LIST": stage_map[stage - 1],
            "PADDLE_ALL_HETER_TRAINER_IP_PORT_LIST": heter_all,
            "HETER_DEVICE_TYPE": expansion.heter_devices[stage - 2],
            "STAGE_ID": str(stage),
            "STAGE_NUM": stage_num,
            "PADDLE_PORT": str(process.port),
            "TRAINING_ROLE": "HETER_TRAINER",
            "PADDLE_TRAINERS_NUM": str(len(expansion.trainers)),
            "PADDLE_STAGE_TRAINERS_NUM": stage_trainers,
            "POD_IP": process.address,
            "FLAGS_selected_gpus": "0",
            "FLAGS_selected_xpus": "0",
        }
    env.update(common)
    env[LAUNCH_ENV] = json.dumps(expansion.launch_description())
    return env


def expand_files(
    plan_path: str,
    hosts_path: str,
    cluster_path: str | None = None,
    server_num: int | None = None,
    gpu: bool = True,
    lost: frozenset[str] = frozenset(),
    http_port: int | None = None,
    control_port: int | None = None,
    known_types: frozenset[str] = frozenset(),
    joined: tuple[Host, ...] = (),
) -> Expansion:
    """``expand`` from the files (``heterps launch-args --hosts`` and ``heterps launch --hosts`` both read them
    here): the cluster is ``cluster_path``, else the one the hosts file names, else none.  After a restart
    (launch/coordinator.py): with the hosts that ``joined`` from outside the file, without the ``lost`` hosts,
    gloo's and the coordinator's ports where they were."""
    hosts = without_hosts(with_joined(load_hosts(hosts_path), joined), lost)
    if http_port is not None or control_port is not None:
        hosts = replace(
            hosts,
            http_port=http_port if http_port is not None else hosts.http_port,
            control_port=control_port if control_port is not None else hosts.control_port,
        )
    cluster_file = cluster_path or hosts.cluster
    cluster = load_cluster(cluster_file) if cluster_file else None
    plan = load_plan(plan_path, cluster)
    kinds = None if cluster is None else {t.name: t.kind for t in cluster.resource_types}
    return expand(plan, hosts, kinds, server_num, gpu, known_types)
