"""The launch's control port, as a server: who may connect, the proof of the job's key, bounded reading, and the
console lines other hosts stream to it.  What a proven peer asks is the coordinator's (launch/coordinator.py).

- **Admission.**  At most MAX_CONNECTIONS open connections and MAX_UNPROVEN that have not proven the key yet; past
  either cap the oldest unproven one is dropped to make room (a flood of strangers cannot lock the hosts out), and a
  new one is refused only when every open connection is proven.
- **Proof.**  Every connection proves the job's key within control.AUTH_S (heterps_paddle/control.py); one that
  does not is refused and counted, named on the console for the first REFUSALS_SAID.
- **Bounds.**  Every line is read with control.MAX_LINE; a peer's bad line is that peer's end, and nothing else's.
- **The log stream.**  A ``log`` request turns the connection into a stream of console lines, printed with the
  host's address, escaped.
"""

from __future__ import annotations

import enum
import socket
import socketserver
import threading
import time
from typing import Any, BinaryIO, Callable, Mapping, cast

from heterps_paddle import control

MAX_UNPROVEN = 512  # connections still to prove the key: a newer one drops the oldest (a flood cannot lock hosts out)
MAX_CONNECTIONS = 1024  # in all; past it the oldest unproven one is dropped, or the new one when none is unproven
REFUSALS_SAID = 20  # unproven connections named on the console, then only counted (a flood must not flood it)


def printable(text: str) -> str:
    """``text`` safe for a terminal: control characters and escape sequences shown escaped, never interpreted."""
    return "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in text)


class Role(enum.Enum):
    """What a proven connection is to the job."""

    MEMBER = "member"  # a host of the round: it hears what the round's hosts hear
    SPARE = "spare"  # a host standing by: it hears a new round, the end or the abort
    REQUEST = "request"  # one request, one answer


class Peer:
    """One proven connection of a host: its writer (one line at a time), and when it was last heard."""

    def __init__(self, host: str, role: Role, conn: socket.socket, rfile: BinaryIO, wfile: Any):
        self.host = host
        self.role = role
        self.conn = conn
        self.rfile = rfile
        self.wfile = wfile
        self.round = -1  # the round a member joined
        self.lock = threading.Lock()
        self.last_seen = time.monotonic()
        self.gone = False

    def send(self, message: Mapping[str, Any]) -> None:
        with self.lock:
            if self.gone:
                return
            try:
                control.send(self.wfile, message)
            except OSError:
                self.gone = True

    def read(self) -> dict[str, Any] | None:
        """The next message (None: the connection closed); Unproven / OSError / TimeoutError as control reads."""
        message = control.read_message(self.rfile)
        if message is not None:
            self.last_seen = time.monotonic()
        return message


class ControlServer:
    """Serves ``endpoint`` (module doc): each proven connection's first request goes to ``handle(first, peer,
    address)``, in the connection's own thread; ``say`` prints a line on this host's console."""

    def __init__(
        self,
        endpoint: str,
        key: bytes,
        handle: Callable[[Mapping[str, Any], socket.socket, BinaryIO, Any], None],
        say: Callable[[str], None],
    ):
        self.endpoint = endpoint
        self.key = key
        self.handle = handle
        self.say = say
        self.server: socketserver.ThreadingTCPServer | None = None
        # every open connection -> when it came and whether it proved the key (the cap drops unproven ones first)
        self.connections: dict[socket.socket, tuple[float, bool]] = {}
        self.lock = threading.Lock()
        self.refused = 0  # connections that did not prove the key

    def start(self) -> None:
        """Serve, in threads of its own; OSError when the port cannot be served."""
        serving = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                serving._serve(self.request, cast(BinaryIO, self.rfile), self.wfile, self.client_address)

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True
            request_queue_size = 1024  # a flood of connections must not crowd a host's out of the accept queue

            def verify_request(self, request: Any, client_address: Any) -> bool:
                return serving._admit(request)

            def shutdown_request(self, request: Any) -> None:
                serving._forget(request)
                super().shutdown_request(request)

        host, port = self.endpoint.rsplit(":", 1)
        self.server = Server((host, int(port)), Handler)
        threading.Thread(target=self.server.serve_forever, name="heterps-control-port", daemon=True).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    # ---- admission

    def _admit(self, conn: socket.socket) -> bool:
        """A new connection, within the caps: the oldest unproven one makes room, never a proven one."""
        with self.lock:
            unproven = sorted((at, c) for c, (at, proven) in self.connections.items() if not proven)
            if len(unproven) >= MAX_UNPROVEN or len(self.connections) >= MAX_CONNECTIONS:
                if not unproven:
                    return False
                drop(unproven[0][1])
                self.connections.pop(unproven[0][1], None)
            self.connections[conn] = (time.monotonic(), False)
        return True

    def _forget(self, conn: socket.socket) -> None:
        with self.lock:
            self.connections.pop(conn, None)

    # ---- one connection

    def _serve(self, conn: socket.socket, rfile: BinaryIO, wfile: Any, address: Any) -> None:
        """The proof of the key within AUTH_S seconds, then the first request.  Whatever goes wrong in one peer's
        handling closes that peer's connection and nothing else."""
        proven = False
        try:
            conn.settimeout(control.AUTH_S)
            control.challenge(self.key, rfile, wfile)
            proven = True
            with self.lock:
                if conn in self.connections:
                    self.connections[conn] = (self.connections[conn][0], True)
            first = control.read_message(rfile)
            if first is None:
                return
            if first.get("op") == "log":
                self._log_stream(first, conn, rfile)
            else:
                self.handle(first, conn, rfile, wfile)
        except (control.Unproven, OSError, ValueError) as exc:
            if not proven:
                self._refused(address, exc)
            elif isinstance(exc, control.Unproven):
                self.say(f"heterps launch: closed a connection from {address[0]}: {printable(str(exc))}")
        except Exception as exc:  # a bug must close this peer, never end the server's thread silently
            what = printable(f"{type(exc).__name__}: {exc}")
            self.say(f"heterps launch: the coordinator closed a connection from {address[0]}: {what}")

    def _log_stream(self, first: Mapping[str, Any], conn: socket.socket, rfile: BinaryIO) -> None:
        conn.settimeout(None)  # a console stream may be quiet for as long as the job
        host = printable(str(first.get("host", "?")))
        while True:
            raw = control.read_line(rfile)
            if not raw:
                return
            self.say(f"[{host}] {printable(raw.decode('utf-8', 'replace').rstrip())}")

    def _refused(self, address: Any, exc: BaseException) -> None:
        with self.lock:
            self.refused += 1
            count = self.refused
        if count <= REFUSALS_SAID:
            what = printable(str(exc) or type(exc).__name__)
            self.say(f"heterps launch: refused a connection from {address[0]} to the control port: {what}")
            if count == REFUSALS_SAID:
                self.say("heterps launch: (further refused connections are counted, not shown)")


def drop(conn: socket.socket) -> None:
    """End a connection another thread reads: its read returns, and its handler ends."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
