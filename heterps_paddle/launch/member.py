"""A host's side of a launch across hosts, in the process that runs Paddle's launcher (launch/child.py): it joins
the coordinator (launch/coordinator.py), beats, and hears the job's word (start, abort, end, restart); and the
console lines a host sends to the coordinator's."""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from typing import Any, BinaryIO, Mapping

from heterps_paddle import control
from heterps_paddle.launch import event_log
from heterps_paddle.launch.event_log import EventLog
from heterps_paddle.launch.job import BEAT_S, HostsJob, JobAborted, connect_until, host_timeout, startup_timeout

LOG_QUEUE_LINES = 10000
LOG_LINE_BYTES = 64 << 10


class Member:
    """A host's side of the launch, in the process that runs Paddle's launcher (launch/child.py)."""

    def __init__(self, job: HostsJob, key: bytes | None = None, log: EventLog | None = None):
        self.job = job
        self.key = job.key() if key is None else key  # the job's key (heterps_paddle/control.py)
        # this host's event log: the job's records the coordinator streams are written there
        self.log = log if log is not None or not job.event_log else EventLog(os.path.dirname(job.event_log))
        self.conn: socket.socket | None = None
        self.lock = threading.Lock()
        self.ended = threading.Event()
        self.aborted = threading.Event()
        self.abort_reason = ""
        self.launch_id = ""
        self.restart: dict[str, Any] | None = None  # the coordinator's restart message, when the job starts again
        self._closed = threading.Event()

    def join(self) -> str:
        """Join and wait until every host has: the launch's id.  JobAborted when the launch cannot start."""
        timeout = startup_timeout()
        # The coordinator gives up at its own deadline and says why; this one only covers a coordinator that never
        # came up.
        deadline = time.monotonic() + timeout + 10.0
        self.conn, reader = self._connect(deadline)
        self._send({"op": "join", "host": self.job.host, "digest": self.job.digest, "records": self._seen()})
        # beats from the join on: the coordinator reads a joined host's silence as its loss, also before the start
        threading.Thread(target=self._beat, name="heterps-member-beat", daemon=True).start()
        self.conn.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            while True:
                message = control.read_message(reader)
                if message is None:
                    raise JobAborted(f"the launch's coordinator on {self.job.coordinator} closed the connection")
                if message.get("op") == "record":
                    self._record(message)
                elif message.get("op") == "abort":
                    raise JobAborted(str(message.get("reason")))
                elif message.get("op") == "start":
                    self.launch_id = str(message["launch_id"])
                    break
        except TimeoutError:
            raise JobAborted(
                f"the launch did not start within {timeout:.0f} s (HETERPS_STARTUP_TIMEOUT): not every host joined"
            ) from None
        except control.Unproven as exc:
            raise JobAborted(f"the launch's coordinator on {self.job.coordinator} sent {exc}") from None
        self.conn.settimeout(host_timeout())
        threading.Thread(target=self._read, args=(reader,), name="heterps-member-read", daemon=True).start()
        return self.launch_id

    def _connect(self, deadline: float) -> tuple[socket.socket, BinaryIO]:
        """A proven connection to the coordinator, retried until ``deadline`` (it may not be up yet)."""
        try:
            return connect_until(self.job.endpoint, self.key, deadline)
        except OSError as exc:
            raise JobAborted(
                f"the launch's coordinator at {self.job.endpoint} (host {self.job.coordinator}) did not come up within "
                f"{startup_timeout():.0f} s (HETERPS_STARTUP_TIMEOUT; last error: {exc}): start `heterps launch "
                f"--hosts ...` on {self.job.coordinator} too"
            ) from None

    def standby(self, files_digest: str, joining: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A spare host (it runs nothing of this round's plan, and the launch may restart): wait for the
        coordinator's word, a restart (whose plan may use this host), the end or the failure, and return it.
        ``files_digest``: the first round's digest, from the files this host was given (the coordinator checks it).
        ``joining``: a machine from outside the hosts file says what it is (heterps launch --join)."""
        self.conn, reader = self._connect(time.monotonic() + startup_timeout() + 10.0)
        join: dict[str, Any] = {
            "op": "join",
            "host": self.job.host,
            "digest": files_digest,
            "spare": True,
            "records": self._seen(),
        }
        if joining is not None:
            join["joining"] = dict(joining)
        self._send(join)
        self.conn.settimeout(None)
        threading.Thread(target=self._beat, name="heterps-member-beat", daemon=True).start()
        try:
            while True:
                message = control.read_message(reader)
                if message is None:
                    break
                if message.get("op") == "record":
                    self._record(message)
                elif message.get("op") in ("restart", "end", "abort"):
                    return dict(message)
        except (OSError, control.Unproven):
            pass
        finally:
            self.close()
        return {"op": "abort", "reason": f"lost the launch's coordinator on host {self.job.coordinator}"}

    def _seen(self) -> dict[str, Any]:
        """The newest job record this host's log holds: the coordinator sends what follows it."""
        job, seq = event_log.last_of_job(os.path.dirname(self.log.path)) if self.log is not None else (None, 0)
        return {"job": job, "seq": seq}

    def _record(self, message: Mapping[str, Any]) -> None:
        """A job record from the coordinator, into this host's log; one that is not is the coordinator's bad line."""
        record = message.get("record")
        if self.log is None:
            return
        if not isinstance(record, Mapping):
            raise control.Unproven("a 'record' line without a record")
        try:
            self.log.append(record)
        except ValueError as exc:
            raise control.Unproven(str(exc)) from None

    def _send(self, message: Mapping[str, Any]) -> None:
        with self.lock:
            if self.conn is None or self._closed.is_set():
                return
            try:
                self.conn.sendall(control.encode(message))
            except OSError:
                pass  # the reader sees the connection go

    def _read(self, reader: BinaryIO) -> None:
        try:
            while True:
                message = control.read_message(reader)
                if message is None:
                    break
                op = message.get("op")
                if op == "record":
                    self._record(message)
                elif op == "abort":
                    self._abort(str(message.get("reason")))
                elif op == "end":
                    self.ended.set()
                elif op == "restart":
                    self.restart = message
                    self._abort(f"the job starts again (round {message.get('round')}): {message.get('why')}")
                    return
        except TimeoutError:
            self._abort(
                f"the launch's coordinator on {self.job.coordinator} stopped answering ({host_timeout():.0f} s; "
                "HETERPS_HOST_TIMEOUT)"
            )
            return
        except (OSError, control.Unproven):
            pass
        if not self.ended.is_set() and not self._closed.is_set():
            self._abort(
                f"lost the launch's coordinator on host {self.job.coordinator} (its heterps launch went away, or the "
                "machine or its network is gone)"
            )

    def _abort(self, reason: str) -> None:
        if not self.aborted.is_set():
            self.abort_reason = reason
            self.aborted.set()

    def _beat(self) -> None:
        while not self._closed.wait(BEAT_S):
            self._send({"op": "beat"})

    def report_failure(self, reason: str, connect_timeout: bool = False) -> None:
        """``connect_timeout``: the failure began with Paddle's connect-timeout abort (launch/paddle_aborts.py); what
        follows from it is the coordinator's to decide."""
        self._send({"op": "failed", "reason": reason, "connect_timeout": connect_timeout})

    def report_done(self) -> None:
        self._send({"op": "done"})

    def settled(self) -> bool:
        return self.ended.is_set() or self.aborted.is_set()

    def close(self) -> None:
        """End this host's membership: the coordinator sees the connection close at once (a shutdown, since the
        reader thread's file object keeps the socket itself open past a plain close)."""
        self._closed.set()
        with self.lock:
            conn = self.conn
            if conn is None:
                return
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()


class LogForwarder:
    """A host's console lines, also sent to the coordinator's host (best effort: a line that cannot be sent is
    still on this host's console and in its logs)."""

    def __init__(self, job: HostsJob):
        self.job = job
        self.lines: queue.Queue[str | None] = queue.Queue(LOG_QUEUE_LINES)
        self.thread = threading.Thread(target=self._run, name="heterps-log-forward", daemon=True)
        self.thread.start()

    def send(self, line: str) -> None:
        try:
            self.lines.put_nowait(line)
        except queue.Full:
            pass

    def close(self, wait_s: float = 5.0) -> None:
        try:
            self.lines.put_nowait(None)
        except queue.Full:
            pass
        self.thread.join(timeout=wait_s)

    def _run(self) -> None:
        try:
            conn, reader = connect_until(self.job.endpoint, self.job.key(), time.monotonic() + startup_timeout() + 10.0)
        except (OSError, JobAborted):
            return
        with conn, reader:
            try:
                conn.sendall(control.encode({"op": "log", "host": self.job.host}))
                while True:
                    line = self.lines.get()
                    if line is None:
                        return
                    # bounded below the control port's longest line, which would close the stream
                    conn.sendall(line.rstrip("\n").encode()[:LOG_LINE_BYTES] + b"\n")
            except OSError:
                return
