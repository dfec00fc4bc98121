"""What a host's launch across hosts knows of the job (the records the coordinator and its members share), and the
control port's plain requests: connecting, and asking which round the job is in.

The protocol is JSON lines over TCP: ``join`` / ``beat`` / ``failed`` / ``done`` from a member, ``start`` / ``beat``
/ ``standby`` / ``abort`` / ``end`` / ``restart`` from the coordinator; ``log`` opens a stream of console lines;
``round``, ``put`` / ``get`` / ``entries`` are one-shot requests (the job's round; the board, rendezvous.py).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO, Mapping, cast

from heterps_paddle import control, settings
from heterps_paddle.errors import HeterPSError

JOB_ENV = "HETERPS_HOSTS_JOB"  # the launch's HostsJob, from heterps launch to the process that runs Paddle's launcher
BEAT_S = 2.0


class JobAborted(HeterPSError, RuntimeError):
    """The launch across hosts ended (or could not start); the message says why and where."""


@dataclass(frozen=True)
class HostsJob:
    """One host's part of a round of the job across hosts."""

    endpoint: str  # the coordinator's host:port
    host: str  # this host's address
    coordinator: str  # server 0's host, where the coordinator runs
    digest: str  # of the plan and its placement (every host must have the same)
    members: Mapping[str, bool]  # every host that runs a process of the plan -> whether it runs CPU trainers
    restarts: int = 0  # --restarts N (the coordinator's rules)
    # HETERPS_CONNECT_RETRIES: starts of the job again after Paddle's connect-timeout abort (launch/paddle_aborts.py)
    connect_retries: int = 0
    key_file: str = ""  # the job's key (heterps_paddle/control.py): every connection to the coordinator proves it
    file_hosts: tuple[str, ...] = ()  # every host of the hosts file (a spare or a host back must be one)
    plan_writer: str = ""  # stage 1's trainer 0's host: the one that writes the board's plan record each round
    devices: tuple[str, ...] = ()  # the heterogeneous stages' devices, stage 2 first (Paddle's --heter_devices)
    event_log: str = ""  # this host's event log (launch/event_log.py): the job's records streamed here go to it
    # every host of the hosts file: (address, type, units), what the job pays for while it holds the host
    held: tuple[tuple[str, str, int], ...] = ()
    # every host of the round -> the stage 1 CPU trainers it runs (PADDLE_TRAINER_ID): the data plan takes a
    # trainer's requests from its host only (launch/board.py)
    trainers: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def key(self) -> bytes:
        return control.load_key(self.key_file)

    @property
    def is_coordinator(self) -> bool:
        return self.host == self.coordinator

    def to_json(self) -> str:
        return json.dumps(asdict(self) | {"members": dict(self.members), "trainers": dict(self.trainers)})

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None) -> HostsJob | None:
        text = (os.environ if env is None else env).get(JOB_ENV)
        if not text:
            return None
        fields = json.loads(text)
        return HostsJob(
            **fields
            | {
                "file_hosts": tuple(fields.get("file_hosts", ())),
                "devices": tuple(fields.get("devices", ())),
                "held": tuple((str(a), str(t), int(u)) for a, t, u in fields.get("held", ())),
                "trainers": {str(h): tuple(int(r) for r in ranks) for h, ranks in fields.get("trainers", {}).items()},
            }
        )


@dataclass(frozen=True)
class RoundRequest:
    """What the coordinator asks of re-planning (launch/rounds.py) for the job's next round."""

    lost: frozenset[str]  # every host the job has lost and not got back
    lost_before: frozenset[str]  # those when the round that ends was planned (the plan changes only if they differ)
    published: Mapping[str, Any]  # the plan record trainer 0 published this round (fleet/plan_agreement.py), or {}
    plan_now: Mapping[str, Any] | None  # the plan this round runs, as its file holds it (None: the first round's)
    number: int  # the next round's
    # the machines from outside the hosts file the job has (address -> type, units, port; planning/hosts.py:
    # joined_spec), less the lost ones; and those the round that ends was planned with
    joined: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    joined_before: frozenset[str] = frozenset()
    # the measured rates the cost model is corrected by (planning/refit.py: Refit; None: the model as published),
    # and whether the plan follows the job (an adaptive move: the running plan judged on the corrected model)
    refit: Any = None
    adapt: bool = False
    # an adaptive move the machine decided (launch/events.py: Proposal): its plan is the next round's, as decided
    decided: Any = None


@dataclass(frozen=True)
class RoundPlan:
    """The next round's plan (launch/rounds.py makes it): what every host runs next."""

    plan: Mapping[str, Any]  # the plan, as its file holds it
    job: HostsJob  # the coordinator's host's part of it (members, digest)
    report: Mapping[str, Any]  # for restarts.json: the old and new plans, how the new one was chosen
    better: bool = True  # whether the new plan beats the old one (planning/replan.py: better); a move needs it
    released: Mapping[str, float] = field(default_factory=dict)  # an adaptive move: hosts let go -> their price/h


def host_timeout() -> float:
    return float(cast(float, settings.get("HETERPS_HOST_TIMEOUT")))


def startup_timeout() -> float:
    return float(cast(float, settings.get("HETERPS_STARTUP_TIMEOUT")))


def connect_until(endpoint: str, key: bytes, deadline: float) -> tuple[socket.socket, BinaryIO]:
    """A proven connection to the coordinator at ``endpoint`` (control.connect_until), a refused proof as
    JobAborted."""
    try:
        return control.connect_until(endpoint, key, deadline)
    except control.Unproven as exc:
        raise JobAborted(f"the control port at {endpoint}: {exc}") from None


def ask_round(endpoint: str, key: bytes, deadline: float) -> dict[str, Any]:
    """The job's round as its coordinator says (a host's launch started again asks before it joins)."""
    try:
        answer = control.request(endpoint, key, {"op": "round"}, max(5.0, deadline - time.monotonic()), deadline)
    except control.Unproven as exc:
        raise JobAborted(f"the control port at {endpoint}: {exc}") from None
    if answer is None:
        raise OSError(f"the coordinator at {endpoint} closed the connection without an answer")
    return answer
