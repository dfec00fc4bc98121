"""What the processes of one launch share: its id, and a board where they leave each other small records.

Records on the board: the plan the launch runs (fleet/plan_agreement.py), each heterogeneous trainer's side-channel
endpoint (runtime/stage_metrics.py), the servers' word that they restored a checkpoint (runtime/checkpoint.py), each
trainer's measurements (runtime/meter.py, read by the launch's gauge, launch/gauge.py).

Two boards, one interface:

- **Files** (one host): a directory of this launch under the cache, one JSON file per key, written atomically.
- **The launch's coordinator** (``heterps launch --hosts``, across hosts): the launch on server 0's host serves the
  board over TCP (launch/coordinator.py); every process is told where in ``HETERPS_RENDEZVOUS``.  No shared storage
  is needed, and a record one host writes is read on every other.

A launch's id is ``HETERPS_LAUNCH_ID`` when the coordinator gave one (a fresh one per launch: a hosts file fixes
every port, so the endpoints alone would name every launch of the same file alike), else a digest of the endpoints
Paddle's launcher hands every process (with ports drawn at random per launch).

Pure Python, no Paddle.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import time
from typing import Any, Callable, Collection, Mapping, Protocol

from heterps_paddle import control, settings
from heterps_paddle.data_plan import bounds
from heterps_paddle.data_plan.journal import PlanFiles
from heterps_paddle.errors import HeterPSError
from heterps_paddle.files import locked, write_atomic

RENDEZVOUS_ENV = "HETERPS_RENDEZVOUS"  # host:port of the launch's coordinator
PLAN_KEY = "plan"  # the plan the launch runs (fleet/plan_agreement.py)
METER_PREFIX = "meter."  # each trainer's measurements (runtime/meter.py), read by the launch's gauge
MEASURED_PREFIX = "measured."  # each host type timed on one of its hosts (fleet/host_measure.py)
LAUNCH_ID_ENV = "HETERPS_LAUNCH_ID"
# The endpoints Paddle's launcher gives every process of a launch (with ports drawn at random per launch).
LAUNCH_ENDPOINT_ENV = (
    "PADDLE_PSERVERS_IP_PORT_LIST",
    "PADDLE_TRAINER_ENDPOINTS",
    "PADDLE_ALL_HETER_TRAINER_IP_PORT_LIST",
)
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
POLL_S = 0.2
REQUEST_TIMEOUT_S = 30.0


class RendezvousError(HeterPSError, RuntimeError):
    """The launch's board could not be read or written."""


def launch_id(env: Mapping[str, str] | None = None) -> str | None:
    """What every process of one launch shares and another launch does not."""
    env = os.environ if env is None else env
    if env.get(LAUNCH_ID_ENV):
        return env[LAUNCH_ID_ENV]
    parts = [env.get(key, "") for key in LAUNCH_ENDPOINT_ENV]
    if not any(parts):
        return None
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


def launch_files_dir(cache: str, env: Mapping[str, str] | None = None) -> str | None:
    """The files board's directory of this launch under the cache ``cache``; None outside a launch."""
    key = launch_id(env)
    return None if key is None else os.path.join(cache, "launches", key)


def _check_key(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise RendezvousError(f"board key {key!r}: letters, digits, '.', '_' and '-' only")
    return key


class Board(Protocol):
    where: str  # for messages

    def put(self, key: str, value: Any) -> None: ...

    def get(self, key: str) -> Any | None: ...

    def entries(self, prefix: str) -> dict[str, Any]: ...

    def shards(self, message: Mapping[str, Any]) -> dict[str, Any]: ...


DATA_PLAN_DIR = "data-plan"  # a files board's data plan (data_plan/journal.py), read and written under its lock
_PLAN_FILES: dict[str, PlanFiles] = {}  # this process's view of each files board's data plan (data_plan/journal.py)
# The bounds of a data plan request (shards_request_refused): what no job reaches, and a request past it is refused
# the data plan's own bounds (data_plan/bounds.py), checked here before the plan's lock is taken
MAX_TRAINERS, MAX_PASS, MAX_WANT, MAX_BYTES = bounds.MAX_TRAINERS, bounds.MAX_PASS, bounds.MAX_WANT, bounds.MAX_BYTES
MAX_NAMES = bounds.MAX_SHARDS  # names in one request (an offer's files, the shards done before, a call's shards)


def _count(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def shards_request_refused(message: Mapping[str, Any], passes: Collection[int], trainers: int | None) -> str | None:
    """Why a data plan request is refused before the plan reads it (None: it is not), on either board: its pass a
    number of 1..MAX_PASS, a new one at most one past the newest the plan holds (two far-off pass numbers would end
    the plan's passes); an offer for the round's ``trainers`` (None: 1..MAX_TRAINERS) and a trainer an index of
    them; its counts and lists bounded."""
    do, number = message.get("do"), message.get("pass")
    if not isinstance(do, str) or len(do) > 32:
        return "the data plan: a request without a short name (do)"
    if not isinstance(number, int) or not _count(number, 1, MAX_PASS):
        return f"the data plan: {do}: pass {repr(number)[:20]} is not a number of 1..{MAX_PASS}"
    if do == "offer" and passes and number not in passes and number > max(passes) + 1:
        return f"the data plan: offer of pass {number}: the newest pass is {max(passes)} (a new one comes next)"
    offered = message.get("trainers", trainers)
    if do == "offer" and not _count(offered, trainers or 1, trainers or MAX_TRAINERS):
        has = f"the round has {trainers}" if trainers else f"1..{MAX_TRAINERS}"
        return f"the data plan: offer of pass {number}: {str(offered)[:20]} trainers ({has})"
    if not _count(message.get("trainer"), 0, (trainers or MAX_TRAINERS) - 1):
        return f"the data plan: {do}: trainer {repr(message.get('trainer'))[:20]} is not one of the round's"
    if "want" in message and not _count(message["want"], 1, MAX_WANT):
        return f"the data plan: take: {str(message['want'])[:20]} shards wanted (1..{MAX_WANT})"
    if "bytes" in message and not _count(message["bytes"], 0, MAX_BYTES):
        return f"the data plan: progress: {str(message['bytes'])[:20]} bytes"
    for key in ("files", "done_before", "shards"):
        value = message.get(key)
        if isinstance(value, (list, tuple)) and len(value) > MAX_NAMES:
            return f"the data plan: {do}: {len(value)} {key}, over {MAX_NAMES}"
    if "held_before" in message and not _count(message["held_before"], 0, MAX_NAMES):
        return f"the data plan: offer: held_before {str(message['held_before'])[:20]}"
    return None


class FileBoard:
    """One JSON file per key in ``directory`` (one host)."""

    def __init__(self, directory: str):
        self.directory = directory
        self.where = directory

    def put(self, key: str, value: Any) -> None:
        os.makedirs(self.directory, exist_ok=True)
        write_atomic(os.path.join(self.directory, _check_key(key) + ".json"), json.dumps(value) + "\n")

    def get(self, key: str) -> Any | None:
        try:
            with open(os.path.join(self.directory, _check_key(key) + ".json"), encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def entries(self, prefix: str) -> dict[str, Any]:
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.startswith(prefix) and n.endswith(".json"))
        except FileNotFoundError:
            return {}
        found = {}
        for name in names:
            value = self.get(name[: -len(".json")])
            if value is not None:
                found[name[: -len(".json")]] = value
        return found

    def shards(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """A data plan request (data_plan/), answered under this host's lock by the plan its files hold (a snapshot
        and a journal of requests: data_plan/journal.py), kept in memory between requests."""
        directory = os.path.join(self.directory, DATA_PLAN_DIR)
        # this launch's trainers, as Paddle's launcher told every process of it (one host: all of them)
        listed = os.environ.get("PADDLE_TRAINERS_NUM", "")
        trainers = int(listed) if listed.isdigit() else None
        with locked(self.directory, DATA_PLAN_DIR + ".lock"):
            files = _PLAN_FILES.setdefault(directory, PlanFiles(directory))
            reply = files.answer(message, lambda plan: shards_request_refused(message, list(plan.passes), trainers))
        if "error" in reply:
            raise RendezvousError(f"the data plan at {directory}: {reply['error']}")
        return reply


def exchange_line(endpoint: str, line: bytes, timeout: float) -> bytes:
    """Send one line to ``endpoint`` and read one line back (the launch's small TCP services speak this way)."""
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as conn:
        conn.sendall(line + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    return data


def request(endpoint: str, message: Mapping[str, Any], timeout: float = REQUEST_TIMEOUT_S) -> dict[str, Any]:
    """One request to the coordinator, over a connection that proved the job's key (heterps_paddle/control.py),
    one JSON line back."""
    try:
        key = control.key_from_env()
    except HeterPSError as exc:
        raise RendezvousError(str(exc)) from None
    if key is None:
        raise RendezvousError(f"no job key to prove to the launch's coordinator at {endpoint} ({control.KEY_FILE_ENV})")
    try:
        reply = control.request(endpoint, key, message, timeout)
    except (OSError, HeterPSError) as exc:
        raise RendezvousError(f"the launch's coordinator at {endpoint} did not answer ({exc})") from None
    if reply is None:
        raise RendezvousError(f"the launch's coordinator at {endpoint} sent no answer")
    if "error" in reply:
        raise RendezvousError(f"the launch's coordinator at {endpoint}: {reply['error']}")
    return reply


class RemoteBoard:
    """The board the launch's coordinator serves (across hosts)."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.where = f"the launch's coordinator at {endpoint}"

    def put(self, key: str, value: Any) -> None:
        # the host this process runs on (heterps launch sets POD_IP): the coordinator checks who writes the plan
        host = os.environ.get("POD_IP", "")
        message = {"op": "put", "key": _check_key(key), "value": value, "host": host, "launch": launch_id()}
        request(self.endpoint, message)

    def get(self, key: str) -> Any | None:
        return request(self.endpoint, {"op": "get", "key": _check_key(key)}).get("value")

    def entries(self, prefix: str) -> dict[str, Any]:
        return dict(request(self.endpoint, {"op": "entries", "prefix": prefix})["entries"])

    def shards(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """A data plan request (data_plan.py), answered by the coordinator, which takes it only from a host of the
        round (its launch id and this host's address: launch/board.py) for the trainers that host runs."""
        host = os.environ.get("POD_IP", "")
        return request(self.endpoint, {**message, "op": "shards", "launch": launch_id(), "host": host})


def board(env: Mapping[str, str] | None = None) -> Board | None:
    """This launch's board; None outside a launch."""
    env = os.environ if env is None else env
    if env.get(RENDEZVOUS_ENV):
        return RemoteBoard(env[RENDEZVOUS_ENV])
    directory = launch_files_dir(str(settings.get("HETERPS_CACHE", env)), env)
    return None if directory is None else FileBoard(directory)


def across_hosts(env: Mapping[str, str] | None = None) -> bool:
    """Whether this launch has a coordinator (``heterps launch --hosts``)."""
    env = os.environ if env is None else env
    return bool(env.get(RENDEZVOUS_ENV))


def wait_for(found: Callable[[], Any | None], timeout: float, what: str) -> Any:
    """``found()`` once it is not None; RendezvousError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = found()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise RendezvousError(f"{what} did not appear within {timeout:.0f} s")
        time.sleep(POLL_S)


class BoardStore:
    """The coordinator's side of the board: a dict behind a lock, answering put / get / entries."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        self._sizes: dict[str, int] = {}
        self._lock = threading.Lock()

    def size(self) -> int:
        """The records' size together, as JSON."""
        with self._lock:
            return sum(self._sizes.values())

    def answer(self, message: Mapping[str, Any]) -> dict[str, Any]:
        op = message.get("op")
        with self._lock:
            if op == "put":
                key = _check_key(str(message["key"]))
                self._values[key] = message.get("value")
                self._sizes[key] = len(json.dumps(self._values[key]))
                return {"ok": True}
            if op == "get":
                return {"value": self._values.get(str(message["key"]))}
            if op == "entries":
                prefix = str(message.get("prefix", ""))
                return {"entries": {k: v for k, v in sorted(self._values.items()) if k.startswith(prefix)}}
        return {"error": f"unknown request {op!r}"}
