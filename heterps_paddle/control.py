"""The job's key and the proof of it on the launch's control port: only the job's own hosts steer a launch.

A launch across hosts is steered through one TCP port (the coordinator's, launch/coordinator.py), which on a real
cluster every machine of the LAN can reach.  Every connection to it proves, before anything it sends is acted on,
that it holds the job's key, and the coordinator proves the same back, without the key crossing the wire: an HMAC
challenge and response (HMAC-SHA256 over both sides' fresh nonces, ``hmac.compare_digest``), as Ray's token
authentication does for its cluster ports.  Why not TLS with a pre-shared key: Python's ``ssl`` module has no
TLS-PSK before 3.13 and certificates would need a CA per job; the control plane's messages are not secret (plans,
endpoints, progress lines), only who may send them matters.  See docs/across-hosts.md "Security".

- **The key** is 32 random bytes, hex, in a file only its owner reads (mode 0600): by default the hosts file's path
  with ``.key`` added, or the file the hosts file names (``key_file``).  ``heterps launch-args PLAN --hosts HOSTS``
  makes it once; every host needs the same file, as it needs the same hosts file and plan.  It is never printed,
  and the job's processes get its path (``HETERPS_JOB_KEY_FILE``), never the key, in their environment (Paddle's
  launcher writes every process's environment into its log).
- **The handshake**: the coordinator sends ``{"op": "hello", "nonce": Ns}``; the peer answers ``{"op": "auth",
  "nonce": Nc, "proof": HMAC(key, "peer|Ns|Nc")}``; the coordinator checks it and answers ``{"op": "welcome",
  "proof": HMAC(key, "coordinator|Nc|Ns")}``, which the peer checks.  Then the peer's request follows.
- **Bounds**: every line read on the control port is at most ``MAX_LINE`` bytes (a longer one closes the
  connection); an unproven peer has ``AUTH_S`` seconds to prove itself.

Pure standard library (``hmac``, ``secrets``): base layer, imported by rendezvous.py (the board's client) and by
the launch.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import stat
import time
from typing import Any, BinaryIO, Mapping

from heterps_paddle.errors import HeterPSError

KEY_FILE_ENV = "HETERPS_JOB_KEY_FILE"  # the job's key file, for the job's processes (the board's client)
KEY_SUFFIX = ".key"
KEY_BYTES = 32
NONCE_BYTES = 16
MAX_LINE = 1 << 20  # 1 MiB: the longest line the control port reads
AUTH_S = 5.0  # how long an unproven connection may take to prove the key
RETRY_S = 0.5  # between tries to reach a control port that does not answer yet


class JobKeyError(HeterPSError, ValueError):
    """The job's key file is missing, unreadable, too open or malformed; the message says which and how to fix it."""


class Unproven(HeterPSError, ConnectionError):
    """A peer did not prove the job's key (or sent what the control port does not read)."""


# ------------------------------------------------------------------------------------------------ the key file


def key_path(hosts_path: str, named: str | None = None) -> str:
    """The job's key file: ``named`` (the hosts file's ``key_file``, relative to the hosts file's directory), else
    the hosts file's path with ``.key`` added."""
    if named:
        return named if os.path.isabs(named) else os.path.join(os.path.dirname(os.path.abspath(hosts_path)), named)
    return os.path.abspath(hosts_path) + KEY_SUFFIX


def make_key(path: str) -> bool:
    """Make the job's key at ``path`` (mode 0600, written whole) unless it exists; whether it was made."""
    if os.path.exists(path):
        load_key(path)  # an existing key must be good: say so now, not at the launch
        return False
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise JobKeyError(f"cannot write the job's key {path} ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(KEY_BYTES) + "\n")
        os.link(tmp, path)  # never replaces a key another process made meanwhile
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    load_key(path)
    return True


def load_key(path: str) -> bytes:
    """The job's key from ``path``; JobKeyError naming what is wrong with the file."""
    how = "make it with `heterps launch-args PLAN --hosts HOSTS` and give every host the same file"
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise JobKeyError(f"the job's key {path} does not exist: {how}") from None
    except OSError as exc:
        raise JobKeyError(f"the job's key {path}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise JobKeyError(f"the job's key {path} is not a file")
    if info.st_mode & 0o077:
        raise JobKeyError(
            f"the job's key {path} can be read by others (mode {stat.S_IMODE(info.st_mode):04o}): `chmod 600 {path}`"
        )
    try:
        with open(path, encoding="ascii") as f:
            text = f.read(4 * KEY_BYTES).strip()
        key = bytes.fromhex(text)
    except (OSError, ValueError, UnicodeDecodeError):
        raise JobKeyError(f"the job's key {path} is not a key (64 hex digits): {how}") from None
    if len(key) != KEY_BYTES:
        raise JobKeyError(f"the job's key {path} is not a key (64 hex digits): {how}")
    return key


def key_from_env(env: Mapping[str, str] | None = None) -> bytes | None:
    """The job's key for a process of the job (``HETERPS_JOB_KEY_FILE``); None when it was given none."""
    path = (os.environ if env is None else env).get(KEY_FILE_ENV)
    return load_key(path) if path else None


# ------------------------------------------------------------------------------------------------ the wire


def proof(key: bytes, role: str, first: str, second: str) -> str:
    return hmac.new(key, f"{role}|{first}|{second}".encode(), hashlib.sha256).hexdigest()


def read_line(reader: BinaryIO, limit: int = MAX_LINE) -> bytes:
    """One line (b"" at the end of the stream); Unproven when it is longer than ``limit`` bytes."""
    line = reader.readline(limit + 1)
    if len(line) > limit:
        raise Unproven(f"a line longer than {limit} bytes")
    return line


def read_message(reader: BinaryIO, limit: int = MAX_LINE) -> dict[str, Any] | None:
    """One JSON object line (None at the end of the stream); Unproven for anything else."""
    line = read_line(reader, limit)
    if not line:
        return None
    try:
        message = json.loads(line)
    except ValueError:
        raise Unproven("a line that is not JSON") from None
    if not isinstance(message, dict):
        raise Unproven(f"a line that is not a JSON object ({type(message).__name__})")
    return message


def encode(message: Mapping[str, Any]) -> bytes:
    """A message as the control port's one line of JSON."""
    return json.dumps(message).encode() + b"\n"


def send(writer: Any, message: Mapping[str, Any]) -> None:
    """``message`` as one line on a file-like writer."""
    writer.write(encode(message))
    writer.flush()


def challenge(key: bytes, reader: BinaryIO, writer: Any) -> None:
    """The coordinator's side: the peer proves the key, then this side does.  Unproven when it does not (the
    caller bounds the time with the socket's timeout)."""
    mine = secrets.token_hex(NONCE_BYTES)
    send(writer, {"op": "hello", "nonce": mine})
    answer = read_message(reader, 4096)
    if answer is None or answer.get("op") != "auth":
        raise Unproven("no proof of the job's key")
    theirs, given = answer.get("nonce"), answer.get("proof")
    if not isinstance(theirs, str) or not isinstance(given, str) or not 0 < len(theirs) <= 128:
        raise Unproven("a malformed proof")
    if not hmac.compare_digest(given, proof(key, "peer", mine, theirs)):
        # said, so that a host with another key file stops at once instead of retrying until its deadline
        send(writer, {"op": "refused", "reason": "a wrong proof of the job's key"})
        raise Unproven("a wrong proof of the job's key")
    send(writer, {"op": "welcome", "proof": proof(key, "coordinator", theirs, mine)})


def respond(key: bytes, reader: BinaryIO, writer: Any) -> None:
    """A peer's side: prove the key to the coordinator, and check its proof back."""
    hello = read_message(reader, 4096)
    if hello is None:
        raise ConnectionResetError("the control port closed the connection before its challenge")
    if hello.get("op") != "hello" or not isinstance(hello.get("nonce"), str):
        raise Unproven("the control port did not greet with a challenge (not a heterps launch coordinator?)")
    theirs = str(hello["nonce"])
    mine = secrets.token_hex(NONCE_BYTES)
    send(writer, {"op": "auth", "nonce": mine, "proof": proof(key, "peer", theirs, mine)})
    welcome = read_message(reader, 4096)
    if welcome is None:  # closed before it answered: a busy port dropping unproven connections; try again
        raise ConnectionResetError("the control port closed the connection during the proof of the job's key")
    if welcome.get("op") == "refused":
        raise Unproven("the coordinator refused this host's proof of the job's key (another key file?)")
    given = welcome.get("proof")
    if welcome.get("op") != "welcome" or not isinstance(given, str):
        raise Unproven("the coordinator sent no proof back")
    if not hmac.compare_digest(given, proof(key, "coordinator", mine, theirs)):
        raise Unproven("the coordinator's proof of the job's key is wrong: it is not this job's coordinator")


def connect_until(endpoint: str, key: bytes, deadline: float, timeout: float = 5.0) -> tuple[socket.socket, BinaryIO]:
    """:func:`connect_proven`, retried every RETRY_S while the port does not answer, until ``deadline`` (then the
    last error).  A port that refuses this side's proof, or cannot prove its own, is not retried (Unproven): another
    key file is no passing trouble."""
    while True:
        try:
            return connect_proven(endpoint, key, timeout=timeout)
        except Unproven:
            raise
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(RETRY_S)


def request(
    endpoint: str, key: bytes, message: Mapping[str, Any], timeout: float = 10.0, deadline: float | None = None
) -> dict[str, Any] | None:
    """One request on the control port, the one way every client asks one: a connection that proved the key both
    ways (retried until ``deadline`` while the port does not answer), ``message`` as one line, one JSON object line
    back (None: the port closed without an answer).  OSError / Unproven when it cannot be asked."""
    if deadline is None:
        conn, reader = connect_proven(endpoint, key, timeout)
    else:
        conn, reader = connect_until(endpoint, key, deadline, timeout)
    with conn, reader:
        conn.settimeout(timeout)
        conn.sendall(encode(message))
        return read_message(reader)


def connect_proven(endpoint: str, key: bytes, timeout: float = 10.0) -> tuple[socket.socket, BinaryIO]:
    """A connection to the control port at ``endpoint`` that has proven the key both ways, and its reader."""
    host, port = endpoint.rsplit(":", 1)
    conn = socket.create_connection((host, int(port)), timeout=timeout)
    reader = conn.makefile("rb")
    try:
        respond(key, reader, conn.makefile("wb"))
    except BaseException:
        reader.close()
        conn.close()
        raise
    return conn, reader
