"""A host leaves a launch across hosts on notice (docs/across-hosts.md, "Elastic: join and leave").

A preemption notice handler, or ``kubectl delete``, sends SIGTERM to the host's ``heterps launch``; so does
``heterps launch --leave --log_dir LOG`` on that host.  The launch then asks the job's coordinator to let the host
go (a one-shot ``leave`` request on the control port, proving the job's key like every connection): the
coordinator asks the trainers for a checkpoint at the end of the running pass, re-plans without the host and starts
the other hosts again from that checkpoint (launch/machine.py), and this host's launch ends 0 when the job goes on
without it.  A coordinator that refuses (this host is the coordinator's, the job has ended, ...) or cannot be
reached leaves SIGTERM its old meaning: the host's processes are stopped at once.

Each running launch writes ``LOG/heterps-launch.json`` (its pid, this host's address, and at its end how it
ended), which is how ``--leave`` finds it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any, cast

import psutil

from heterps_paddle import control, settings
from heterps_paddle.errors import EXIT_INPUT_ERROR
from heterps_paddle.files import write_atomic
from heterps_paddle.launch.job import HostsJob

INFO_FILE = "heterps-launch.json"
ASK_TIMEOUT_S = 10.0
LEAVE_USAGE = "usage: heterps launch --leave --log_dir LOG (the --log_dir of the running heterps launch on this host)"


def grace_s() -> float:
    return float(cast(float, settings.get("HETERPS_LEAVE_GRACE_S")))


def ask_to_leave(job: HostsJob, grace: float) -> tuple[bool, str]:
    """Ask the coordinator to let this host go within ``grace`` seconds: whether it will, and what it said."""
    try:
        conn, reader = control.connect_proven(job.endpoint, job.key(), timeout=ASK_TIMEOUT_S)
        with conn, reader:
            conn.sendall(json.dumps({"op": "leave", "host": job.host, "grace_s": grace}).encode() + b"\n")
            answer = control.read_message(reader)
    except (OSError, control.Unproven) as exc:
        return False, f"the coordinator at {job.endpoint} could not be asked ({exc})"
    if not answer or answer.get("op") != "leave":
        return False, f"the coordinator at {job.endpoint} gave no answer to the leave ({answer!r:.120})"
    return bool(answer.get("accepted")), str(answer.get("reason", ""))


def write_info(log_dir: str, host: str, **fields: Any) -> None:
    """This running launch, for ``heterps launch --leave`` (module doc); ``fields``: how it ended, at its end."""
    os.makedirs(log_dir, exist_ok=True)
    info = {"pid": os.getpid(), "host": host, **fields}
    write_atomic(os.path.join(log_dir, INFO_FILE), json.dumps(info) + "\n")


def leave_command(argv: list[str]) -> int:
    """``heterps launch --leave --log_dir LOG``: SIGTERM to the launch running there, and wait for its end."""
    log_dir = None
    rest = [a for a in argv if a != "--leave"]
    if len(rest) == 1 and rest[0].startswith("--log_dir="):
        log_dir = rest[0].partition("=")[2]
    elif len(rest) == 2 and rest[0] == "--log_dir":
        log_dir = rest[1]
    if not log_dir:
        print(f"heterps launch --leave: {LEAVE_USAGE}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    path = os.path.join(log_dir, INFO_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
        pid = int(info["pid"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"heterps launch --leave: no running heterps launch in {log_dir} ({path}: {exc})", file=sys.stderr)
        return EXIT_INPUT_ERROR
    if "ended" in info or not _is_launch(pid):
        print(f"heterps launch --leave: the launch in {log_dir} (pid {pid}) is not running", file=sys.stderr)
        return EXIT_INPUT_ERROR
    print(f"heterps launch --leave: asking the launch of host {info.get('host')} (pid {pid}) to leave the job")
    os.kill(pid, signal.SIGTERM)
    while _is_launch(pid):
        time.sleep(0.5)
    try:
        with open(path, encoding="utf-8") as f:
            ended = json.load(f).get("ended")
    except (OSError, ValueError):
        ended = None
    if ended == "left":
        print(f"heterps launch --leave: host {info.get('host')} left the job; the job goes on without it")
        return 0
    print(f"heterps launch --leave: the launch of host {info.get('host')} ended: {ended or 'unknown'}", file=sys.stderr)
    return 1


def _is_launch(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and "launch" in " ".join(proc.cmdline())
    except psutil.Error:
        return False
