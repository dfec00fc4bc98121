"""Kubernetes manifests for a plan across hosts (``heterps launch-args PLAN --hosts HOSTS --k8s DIR``).

One plain ``batch/v1`` Job per process of the job and one headless Service, made from the same expansion as the
per-host commands (launch/placement.py).  Each pod runs ``python -u TRAIN.py ARGS`` itself, as Paddle's launcher
would start that process, with the environment the launcher (and ``heterps launch``) would give it
(``launch.placement.process_env``); so no launcher runs in a pod, and no pod's role is Paddle's ``HETER`` role of
PaddleFlow (Paddle 2.6.2 accepts only ``TRAINER``, ``PSERVER`` and ``HETER_TRAINER``).

Paddle's endpoints are the hosts file's IP addresses, so every pod runs on its host's own network
(``hostNetwork: true``) and is pinned to that host: ``kubernetes.io/hostname: NODE`` when the host gives ``node``,
else the label ``heterps.io/host: ADDRESS`` (``kubectl label node NODE heterps.io/host=ADDRESS``).  A
heterogeneous trainer of a stage launched on ``gpu`` asks for one ``nvidia.com/gpu``.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from heterps_paddle.errors import HeterPSError
from heterps_paddle.launch.placement import Expansion, Process, process_env

_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_ROLE_NAMES = {"server": "ps", "trainer": "trainer", "heter_trainer": "heter"}
HOST_LABEL = "heterps.io/host"
JOB_LABEL = "heterps.io/job"


class ManifestError(HeterPSError, ValueError):
    """A name or option the manifests cannot be written with."""


def _check_name(name: str, what: str) -> None:
    if not _NAME.fullmatch(name) or len(name) > 40:
        raise ManifestError(
            f"{what} {name!r}: must be lowercase letters, digits and '-', start and end with a letter or digit, "
            "at most 40 characters (Kubernetes object names, with room for the role and rank)"
        )


def job_name(name: str, process: Process) -> str:
    return f"{name}-{_ROLE_NAMES[process.role]}-{process.rank}"


def manifests(
    expansion: Expansion, command: list[str], image: str, name: str = "heterps", namespace: str | None = None
) -> list[dict[str, Any]]:
    """The headless Service, then a Job per process in the expansion's host order."""
    _check_name(name, "--name")
    if namespace is not None:
        _check_name(namespace, "--namespace")
    metadata_ns = {} if namespace is None else {"namespace": namespace}
    ports = sorted({p.port for p in expansion.processes()} | {expansion.http_port})
    documents: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, **metadata_ns, "labels": {JOB_LABEL: name}},
            "spec": {
                "clusterIP": "None",
                "selector": {JOB_LABEL: name},
                "ports": [{"name": f"p{port}", "port": port, "protocol": "TCP"} for port in ports],
            },
        }
    ]
    for part in expansion.parts:
        host = part.host
        selector = {"kubernetes.io/hostname": host.node} if host.node else {HOST_LABEL: host.address}
        for process in part.processes:
            labels = {JOB_LABEL: name, "heterps.io/role": _ROLE_NAMES[process.role]}
            env = process_env(expansion, process)
            container: dict[str, Any] = {
                "name": _ROLE_NAMES[process.role],
                "image": image,
                "command": ["python", "-u", *command],
                "env": [{"name": key, "value": value} for key, value in env.items()],
                "ports": [{"containerPort": process.port, "hostPort": process.port, "protocol": "TCP"}],
            }
            if process.role == "heter_trainer" and env.get("HETER_DEVICE_TYPE") == "gpu":
                container["resources"] = {"limits": {"nvidia.com/gpu": 1}}
            documents.append(
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": job_name(name, process), **metadata_ns, "labels": labels},
                    "spec": {
                        "backoffLimit": 0,
                        "completions": 1,
                        "parallelism": 1,
                        "template": {
                            "metadata": {"labels": labels},
                            "spec": {
                                "restartPolicy": "Never",
                                "hostNetwork": True,
                                "dnsPolicy": "ClusterFirstWithHostNet",
                                "subdomain": name,
                                "nodeSelector": selector,
                                "containers": [container],
                            },
                        },
                    },
                }
            )
    return documents


def to_yaml(documents: list[dict[str, Any]]) -> str:
    return str(yaml.safe_dump_all(documents, sort_keys=False))
