"""The hosts file: which machines a job across hosts has (docs/plan-formats.md, "Hosts").

A plan says how many units of each resource type every stage needs; a hosts file says which machines there are
(an address, a resource type, how many units of it each machine has, where their ports start).  This module reads
and writes the file, and keeps the list of machines a job has (the file's, those that joined from outside it,
less those lost) that re-planning plans on (planning/replan.py).  Where each process of a plan runs on those
machines, and the arguments Paddle's launcher gets there, is the launch's (launch/placement.py).

Pure Python, no Paddle.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, replace
from typing import Any, Mapping

from heterps_paddle.planning.model import FORMAT_VERSION
from heterps_paddle.planning.strict_reader import PlanningInputError, Reader, load_document

DEFAULT_BASE_PORT = 36000
MAX_PORT = 65535


# ---------------------------------------------------------------------------------------------- the file


@dataclass(frozen=True)
class Host:
    address: str  # an IPv4 address: what Paddle's launcher compares with POD_IP
    type: str  # a resource type of the cluster
    units: int = 1  # units of that type this machine has (e.g. 8 for an 8-GPU VM priced per GPU)
    servers: int | None = None  # parameter servers on this machine (None: the default rule places them)
    port: int | None = None  # the first port of this machine's processes (None: the file's base_port)
    node: str | None = None  # the Kubernetes node that is this host (manifests only)


@dataclass(frozen=True)
class HostsFile:
    hosts: tuple[Host, ...]
    source: str = "<hosts>"
    base_port: int = DEFAULT_BASE_PORT
    http_port: int | None = None  # gloo's HTTP store on server 0's host (None: the next port free there)
    # heterps launch's coordinator on server 0's host (None: the next port free there after gloo's)
    control_port: int | None = None
    cluster: str | None = None  # the cluster file the hosts' types belong to, as a path (relative to the file)
    # the job's key (heterps_paddle/control.py), as a path relative to the file (None: the file's path + ".key")
    key_file: str | None = None

    def by_address(self) -> dict[str, Host]:
        return {host.address: host for host in self.hosts}


_FILE_KEYS = {"format", "hosts", "base_port", "http_port", "control_port", "cluster", "key_file"}
_HOST_KEYS = {"address", "type", "units", "servers", "port", "node"}


def hosts_from_dict(document: Any, source: str = "<hosts>") -> HostsFile:
    r = Reader(source)
    doc = r.mapping(document, "", _FILE_KEYS, {"format", "hosts"})
    r.format_version(doc)
    hosts = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(r.sequence(doc["hosts"], "hosts")):
        key = f"hosts[{index}]"
        item = r.mapping(raw, key, _HOST_KEYS, {"address", "type"})
        address = r.string(item["address"], f"{key}.address")
        try:
            ipaddress.IPv4Address(address)
        except ValueError:
            raise r.fail(
                f"{key}.address",
                f"{address!r} is not an IPv4 address (Paddle's launcher matches a host by its IP string; a name "
                "or an IPv6 address, whose colons it would split as a port, is never matched)",
            ) from None
        if address in seen:
            raise r.fail(f"{key}.address", f"{address} is already hosts[{seen[address]}]")
        seen[address] = index
        hosts.append(
            Host(
                address=address,
                type=r.string(item["type"], f"{key}.type"),
                units=r.integer(item.get("units", 1), f"{key}.units", 0),
                servers=None if item.get("servers") is None else r.integer(item["servers"], f"{key}.servers", 0),
                port=None if item.get("port") is None else _port(r, item["port"], f"{key}.port"),
                node=None if item.get("node") is None else r.string(item["node"], f"{key}.node"),
            )
        )
    cluster = None
    if doc.get("cluster") is not None:
        cluster = r.string(doc["cluster"], "cluster")
        if not os.path.isabs(cluster) and source and not source.startswith("<"):
            cluster = os.path.join(os.path.dirname(os.path.abspath(source)), cluster)
    return HostsFile(
        hosts=tuple(hosts),
        source=source,
        base_port=_port(r, doc.get("base_port", DEFAULT_BASE_PORT), "base_port"),
        http_port=None if doc.get("http_port") is None else _port(r, doc["http_port"], "http_port"),
        control_port=None if doc.get("control_port") is None else _port(r, doc["control_port"], "control_port"),
        key_file=None if doc.get("key_file") is None else r.string(doc["key_file"], "key_file"),
        cluster=cluster,
    )


def _port(r: Reader, value: Any, key: str) -> int:
    port = r.integer(value, key, 1)
    if port > MAX_PORT:
        raise r.fail(key, f"must be a port number (1..{MAX_PORT}), got {value!r}")
    return port


def load_hosts(path: str) -> HostsFile:
    return hosts_from_dict(load_document(path), path)


def hosts_to_dict(hosts: HostsFile) -> dict[str, Any]:
    out: dict[str, Any] = {"format": FORMAT_VERSION}
    if hosts.cluster is not None:
        out["cluster"] = hosts.cluster
    out["base_port"] = hosts.base_port
    if hosts.http_port is not None:
        out["http_port"] = hosts.http_port
    if hosts.control_port is not None:
        out["control_port"] = hosts.control_port
    if hosts.key_file is not None:
        out["key_file"] = hosts.key_file
    out["hosts"] = [
        {k: v for k, v in vars(host).items() if v is not None and not (k == "units" and v == 1)} for host in hosts.hosts
    ]
    return out


JOINED_KEYS = ("type", "units", "port")  # what a machine from outside the hosts file says of itself


def joined_spec(address: str, value: Any, source: str) -> dict[str, Any]:
    """What a machine joining from outside the hosts file says it is (``heterps launch --join``), checked as a
    host of the file would be: its type, units and first port.  PlanningInputError naming what is wrong."""
    if not isinstance(value, Mapping):
        raise PlanningInputError(f"{source}: a joining machine's description must be a mapping, got {value!r:.80}")
    spec = {key: value[key] for key in JOINED_KEYS if value.get(key) is not None}
    unknown = sorted(set(value) - set(JOINED_KEYS))
    if unknown:
        raise PlanningInputError(
            f"{source}: unknown key(s) {', '.join(map(str, unknown))[:80]} (known: type, units, port)"
        )
    (host,) = hosts_from_dict({"format": FORMAT_VERSION, "hosts": [{"address": address, **spec}]}, source).hosts
    if not 1 <= host.units <= 4096:
        raise PlanningInputError(f"{source}: units must be 1..4096, got {host.units}")
    if len(host.type) > 64 or not host.type.isprintable():
        raise PlanningInputError(f"{source}: type {host.type[:64]!r} is not a resource type's name")
    return {key: getattr(host, key) for key in JOINED_KEYS if getattr(host, key) is not None}


def joined_hosts(joined: Mapping[str, Mapping[str, Any]]) -> tuple[Host, ...]:
    """The machines that joined from outside the hosts file (address -> :func:`joined_spec`), as hosts."""
    return tuple(Host(address=address, **dict(spec)) for address, spec in joined.items())


def with_joined(hosts: HostsFile, joined: tuple[Host, ...]) -> HostsFile:
    """The hosts file and the machines that joined the job from outside it (``heterps launch --join``), after its
    own hosts: every host of the job expands the same list, in the same order.  The file on disk is not edited."""
    if not joined:
        return hosts
    known = hosts.by_address()
    for host in joined:
        if host.address in known:
            raise PlanningInputError(f"{hosts.source}: {host.address} joined the job, but it is a host of the file")
    return replace(hosts, hosts=hosts.hosts + joined)


def without_hosts(hosts: HostsFile, lost: frozenset[str] | set[str]) -> HostsFile:
    """The hosts file less the machines a job lost."""
    if not lost:
        return hosts
    return replace(hosts, hosts=tuple(h for h in hosts.hosts if h.address not in lost))
