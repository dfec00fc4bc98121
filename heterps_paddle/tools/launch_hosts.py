"""``heterps launch --hosts HOSTS --plan PLAN [--host ADDR] ... TRAIN.py``: the same command on every host.

Leading options, read before Paddle's arguments (anywhere among ``--timeout`` / ``--quiet``):

- ``--hosts FILE`` and ``--plan FILE``: the job's hosts and plan; ``--cluster FILE`` the cluster (default: the one the
  hosts file names), ``--server-num N`` and ``--devices plan|cpu`` as ``heterps launch-args``.
- ``--host ADDR``: which host this is; default ``POD_IP``, else ``gethostbyname(gethostname())``, as Paddle's launcher
  finds it (``launch_utils.py: ParameterServerLauncher.get_role_endpoints``).

They expand (planning/hosts.py: ``expand``) into the ``paddle.distributed.launch`` arguments every host runs, and
``POD_IP`` is set to the host's address for Paddle's launcher.  The hosts' launches then run as one job through a
coordinator on server 0's host (tools/hosts_job.py): nothing starts until every host joined with the same plan,
and any host's failure or loss ends the launch on all.  A host that runs nothing of the plan says so and ends 0
without starting Paddle's launcher (in plain PS mode it would fail an assertion).
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Mapping, cast

from heterps_paddle import settings
from heterps_paddle.errors import EXIT_INPUT_ERROR, HeterPSError
from heterps_paddle.planning.hosts import Expansion, expand_files
from heterps_paddle.tools.hosts_job import HostsJob

_VALUED = ("--hosts", "--plan", "--host", "--cluster", "--server-num", "--devices", "--restarts")
_OWN_VALUED = ("--timeout", "--checkpoint-dir", "--checkpoint-every")  # heterps launch's own (tools/launch.py)
_OWN_FLAGS = ("--quiet",)


@dataclass(frozen=True)
class Round:
    """What a restart changes (tools/hosts_job.py): the plan, the hosts lost so far, and the coordinator's and
    gloo's ports, which stay where the first round put them (the coordinator keeps serving between rounds)."""

    plan_path: str
    lost: frozenset[str] = frozenset()
    http_port: int | None = None
    control_port: int | None = None
    known_types: frozenset[str] = frozenset()  # the first round's plan's (planning/hosts.py: expand)

    @staticmethod
    def after(first: Expansion, plan_path: str, lost: frozenset[str]) -> Round:
        """A later round of the job whose first round ``first`` placed."""
        types = frozenset(stage.resource for stage in first.plan.stages)
        return Round(plan_path, lost, first.http_port, first.control_port, types)


@dataclass
class HostsLaunch:
    argv: list[str]  # heterps launch's arguments with the hosts options replaced by Paddle's
    env: dict[str, str] = field(default_factory=dict)  # to set for Paddle's launcher (POD_IP)
    exit_code: int | None = None  # end here with this status (bad input, or nothing to run on this host)
    job: HostsJob | None = None  # this host's part of the launch across hosts (tools/hosts_job.py)
    restarts: int = 0  # --restarts N: rounds the job may start again after losing a host or a process
    given: dict[str, str] = field(default_factory=dict)  # the hosts options as given
    round: Round | None = None
    expansion: Expansion | None = None
    spare: bool = False  # runs nothing of this round's plan, but stands by for a restart's


def _expand(given: Mapping[str, str], round_: Round) -> Expansion:
    devices = given.get("--devices", "plan")
    if devices not in ("auto", "plan", "cpu"):
        raise HeterPSError(f"--devices must be plan or cpu, got {devices!r}")
    server_num = None
    if "--server-num" in given:
        try:
            server_num = int(given["--server-num"])
        except ValueError:
            raise HeterPSError(f"--server-num: {given['--server-num']!r} is not a number") from None
    return expand_files(
        round_.plan_path,
        given["--hosts"],
        given.get("--cluster"),
        server_num,
        gpu=devices != "cpu",
        lost=round_.lost,
        http_port=round_.http_port,
        control_port=round_.control_port,
        known_types=round_.known_types,
    )


def job_of(expansion: Expansion, address: str, restarts: int = 0) -> HostsJob:
    return HostsJob(
        endpoint=expansion.control_endpoint,
        host=address,
        coordinator=expansion.servers[0].address,
        digest=expansion.digest(),
        members={p.host.address: any(q.role == "trainer" for q in p.processes) for p in expansion.parts if p.processes},
        restarts=restarts,
        connect_retries=int(cast(int, settings.get("HETERPS_CONNECT_RETRIES"))),
    )


def job_for_round(given: Mapping[str, str], round_: Round, address: str) -> HostsJob:
    """``address``'s part of a restart's round (the coordinator's host, which must stay server 0's)."""
    expansion = _expand(given, round_)
    job = job_of(expansion, address)
    if job.coordinator != address:
        raise HeterPSError(
            f"the new plan would move server 0, and the coordinator with it, off {address} (to {job.coordinator})"
        )
    return job


def take_hosts_options(
    argv: list[str], environ: Mapping[str, str] | None = None, round_: Round | None = None
) -> HostsLaunch:
    """``argv`` unchanged when it has no ``--hosts``; else the expanded arguments for this host (for ``round_``, a
    restart's plan and lost hosts, when given)."""
    environ = os.environ if environ is None else environ
    kept: list[str] = []
    given: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in _VALUED or name in _OWN_VALUED:
            if not eq:
                if i + 1 >= len(argv):
                    break
                value, i = argv[i + 1], i + 1
            if name in _VALUED:
                given[name] = value
            else:
                kept += [name, value]
            i += 1
        elif arg in _OWN_FLAGS:
            kept.append(arg)
            i += 1
        else:
            break
    rest = argv[i:]
    if not given:
        return HostsLaunch(argv)
    try:
        if "--hosts" not in given or "--plan" not in given:
            missing = " and ".join(o for o in ("--hosts", "--plan") if o not in given)
            raise HeterPSError(f"{', '.join(sorted(given))} across hosts needs {missing}")
        try:
            restarts = int(given.get("--restarts", "0"))
        except ValueError:
            raise HeterPSError(f"--restarts: {given['--restarts']!r} is not a number") from None
        if restarts < 0:
            raise HeterPSError(f"--restarts must be >= 0, got {restarts}")
        round_ = round_ or Round(given["--plan"])
        expansion = _expand(given, round_)
        address = given.get("--host") or environ.get("POD_IP") or _own_address()
        if address in round_.lost:
            raise HeterPSError(f"this host ({address}) was dropped from the job: the launch counted it as lost")
        part = expansion.part(address)
    except HeterPSError as exc:
        print(f"heterps launch: error: {exc}", file=sys.stderr, flush=True)
        return HostsLaunch(argv, exit_code=EXIT_INPUT_ERROR)
    print(f"heterps launch: this host is {part.describe()}", flush=True)
    if not part.processes:
        if restarts > 0:
            # A spare: a restart's plan may use it (tools/hosts_job.py); heterps launch waits for the coordinator.
            print(f"heterps launch: {address} runs nothing of this plan; it stands by for a restart", flush=True)
            return HostsLaunch(
                argv,
                job=job_of(expansion, address, restarts),
                restarts=restarts,
                given=given,
                round=round_,
                expansion=expansion,
                spare=True,
            )
        print(f"heterps launch: {address} runs nothing of this plan; nothing started", flush=True)
        return HostsLaunch(argv, exit_code=0)
    return HostsLaunch(
        kept + expansion.arguments() + rest,
        {"POD_IP": address},
        job=job_of(expansion, address, restarts),
        restarts=restarts,
        given=given,
        round=round_,
        expansion=expansion,
    )


def _own_address() -> str:
    """What Paddle's launcher takes for this host's IP without POD_IP."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError as exc:
        raise HeterPSError(f"cannot tell this host's address ({exc}): give --host ADDR or set POD_IP") from None
