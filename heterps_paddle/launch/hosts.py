"""This host's part of a launch across hosts: ``heterps launch --hosts HOSTS --plan PLAN [--host ADDR] ... TRAIN.py``,
the same command on every host.

The hosts options (launch/options.py: HostsOptions) expand (launch/placement.py: ``expand``) into the
``paddle.distributed.launch`` arguments every host runs, and ``POD_IP`` is set to the host's address for Paddle's
launcher, which otherwise takes ``gethostbyname(gethostname())`` (``launch_utils.py:
ParameterServerLauncher.get_role_endpoints``).  The hosts' launches then run as one job through a coordinator on
server 0's host (launch/coordinator.py).  A host that runs nothing of the plan says so and ends 0 without starting
Paddle's launcher (in plain PS mode it would fail an assertion), or, with ``--restarts``, stands by for a round
whose plan uses it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, cast

from heterps_paddle import control, settings
from heterps_paddle.errors import HeterPSError
from heterps_paddle.launch.job import HostsJob
from heterps_paddle.launch.options import HostsOptions, LaunchOptions
from heterps_paddle.launch.placement import Expansion, expand_files
from heterps_paddle.planning.hosts import Host, joined_hosts, joined_spec, load_hosts


@dataclass(frozen=True)
class RoundFiles:
    """What a new round changes in the expansion: the plan, the hosts lost so far, and the coordinator's and
    gloo's ports, which stay where the first round put them (the coordinator keeps serving between rounds)."""

    plan_path: str
    lost: frozenset[str] = frozenset()
    http_port: int | None = None
    control_port: int | None = None
    known_types: frozenset[str] = frozenset()  # the first round's plan's (launch/placement.py: expand)
    joined: tuple[Host, ...] = ()  # machines from outside the hosts file, after its own (heterps launch --join)

    @staticmethod
    def after(
        first: Expansion, plan_path: str, lost: frozenset[str], joined: Mapping[str, Mapping[str, Any]] | None = None
    ) -> RoundFiles:
        """A later round of the job whose first round ``first`` placed (``joined``: address -> what it is)."""
        types = frozenset(stage.resource for stage in first.plan.stages)
        extra = joined_hosts(joined or {})
        return RoundFiles(plan_path, lost, first.http_port, first.control_port, types | {h.type for h in extra}, extra)


@dataclass(frozen=True)
class HostRound:
    """This host's part of a round: what to run (``options``, with the expanded launcher arguments), or to stand
    by (``spare``), or nothing at all (``nothing``)."""

    options: LaunchOptions
    address: str
    job: HostsJob
    expansion: Expansion
    files: RoundFiles
    env: Mapping[str, str] = field(default_factory=dict)  # to set for Paddle's launcher (POD_IP)
    spare: bool = False  # runs nothing of this round's plan, but stands by for a later round's
    nothing: bool = False  # runs nothing and ends (no --restarts)
    joining: Mapping[str, Any] | None = None  # a machine from outside the hosts file: what it is (--join)


def expand_round(given: HostsOptions, files: RoundFiles) -> Expansion:
    return expand_files(
        files.plan_path,
        given.hosts,
        given.cluster,
        given.server_num,
        gpu=given.devices != "cpu",
        lost=files.lost,
        http_port=files.http_port,
        control_port=files.control_port,
        known_types=files.known_types,
        joined=files.joined,
    )


def job_key_path(hosts_path: str) -> str:
    """Where the job of the hosts file ``hosts_path`` keeps its key (heterps_paddle/control.py: key_path)."""
    return control.key_path(hosts_path, load_hosts(hosts_path).key_file)


def job_of(expansion: Expansion, address: str, restarts: int = 0) -> HostsJob:
    hosts = expansion.hosts
    return HostsJob(
        endpoint=expansion.control_endpoint,
        host=address,
        coordinator=expansion.servers[0].address,
        digest=expansion.digest(),
        members={p.host.address: any(q.role == "trainer" for q in p.processes) for p in expansion.parts if p.processes},
        trainers={
            p.host.address: tuple(q.rank for q in p.processes if q.role == "trainer")
            for p in expansion.parts
            if p.processes
        },
        restarts=restarts,
        connect_retries=int(cast(int, settings.get("HETERPS_CONNECT_RETRIES"))),
        key_file=control.key_path(hosts.source, hosts.key_file),
        file_hosts=tuple(host.address for host in hosts.hosts),
        held=tuple((host.address, host.type, host.units) for host in hosts.hosts),
        plan_writer=expansion.trainers[0].address,
        devices=expansion.heter_devices,
    )


def job_for_round(given: HostsOptions, files: RoundFiles, address: str) -> HostsJob:
    """``address``'s part of a new round (the coordinator's host, which must stay server 0's)."""
    job = job_of(expand_round(given, files), address)
    if job.coordinator != address:
        raise HeterPSError(
            f"the new plan would move server 0, and the coordinator with it, off {address} (to {job.coordinator})"
        )
    return job


def host_round(options: LaunchOptions, environ: Mapping[str, str], files: RoundFiles | None = None) -> HostRound:
    """This host's part of the round ``files`` describes (default: the first, from ``--plan``); HeterPSError when
    the files or this host's address do not fit."""
    given = options.hosts
    assert given is not None
    files = files or RoundFiles(given.plan)
    expansion = expand_round(given, files)
    address = given.host or environ.get("POD_IP") or own_address()
    if address in files.lost:
        raise HeterPSError(f"this host ({address}) was dropped from the job: the launch counted it as lost")
    joining = None
    if given.join is not None:
        joining = _joining(given, files, expansion, address)
        if address not in {host.address for host in files.joined}:
            print(
                f"heterps launch: {address} ({joining.get('units', 1)} x {joining['type']}) joins the job from outside "
                "the hosts file: it stands by, and the job moves to a plan with it at its next checkpoint, if better",
                flush=True,
            )
            return HostRound(
                options,
                address,
                job_of(expansion, address, given.restarts),
                expansion,
                files,
                spare=True,
                joining=joining,
            )
    part = expansion.part(address)
    print(f"heterps launch: this host is {part.describe()}", flush=True)
    job = job_of(expansion, address, given.restarts)
    if not part.processes:
        if given.may_stand_by:
            # A spare: a later round's plan may use it; heterps launch waits for the coordinator.
            print(f"heterps launch: {address} runs nothing of this plan; it stands by for a restart", flush=True)
            return HostRound(options, address, job, expansion, files, spare=True, joining=joining)
        print(f"heterps launch: {address} runs nothing of this plan; nothing started", flush=True)
        return HostRound(options, address, job, expansion, files, nothing=True)
    expanded = options.with_paddle(_pairs(expansion.arguments()))
    return HostRound(expanded, address, job, expansion, files, env={"POD_IP": address})


def _joining(given: HostsOptions, files: RoundFiles, expansion: Expansion, address: str) -> dict[str, Any]:
    """What this machine, from outside the hosts file, tells the coordinator it is (``--join``), checked: not a
    host of the file, and a type the cluster has (expanded with it, as every later round will be)."""
    assert given.join is not None
    if address in {host.address for host in expansion.hosts.hosts} - {host.address for host in files.joined}:
        raise HeterPSError(
            f"--join: {address} is a host of the hosts file {given.hosts} already: start it without --join"
        )
    spec = joined_spec(address, given.join, "--join")
    if address not in {host.address for host in files.joined}:
        # the type checked against the cluster, when there is one (without, the re-planning's cluster decides)
        with_it = (*files.joined, *joined_hosts({address: spec}))
        expand_round(given, replace(files, joined=with_it, known_types=files.known_types | {spec["type"]}))
    return spec


def _pairs(arguments: list[str]) -> list[tuple[str, str]]:
    """``--name=value`` arguments as (name, value) pairs."""
    pairs = []
    for argument in arguments:
        name, _, value = argument.partition("=")
        pairs.append((name, value))
    return pairs


def own_address() -> str:
    """What Paddle's launcher takes for this host's IP without POD_IP."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError as exc:
        raise HeterPSError(f"cannot tell this host's address ({exc}): give --host ADDR or set POD_IP") from None
