"""Peers of a split job, watched.

Paddle 2.6.2 gives a process of a heterogeneous pipeline no way to notice that a peer died: a CPU trainer whose
heterogeneous trainer is gone blocks forever in a ``send_and_recv``, a heterogeneous trainer whose server is
gone waits in its pull.  The watchdog runs in every trainer of a split job, probes the TCP endpoints of the
processes this one cannot work without (the servers, the later stages), and when one never comes up or stops
answering, it prints a line naming this process and the dead one and ends this process (exit code
``WATCHDOG_EXIT_CODE``).  `heterps launch` then ends the whole job non-zero (launch/supervisor.py); under Paddle's own
launcher the job at least ends instead of hanging.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from typing import Callable, Mapping

import psutil

from heterps_paddle.log import logger
from heterps_paddle.runtime import seam

FATAL_TAG = "HETERPS-FATAL"
WATCHDOG_EXIT_CODE = 17


def split_endpoints(value: str | None) -> list[str]:
    return [e for e in (value or "").split(",") if e]


def peer_endpoints(env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(description, endpoint) of the processes this process cannot work without."""
    env = os.environ if env is None else env
    peers = [
        (f"parameter server {i} ({ep})", ep)
        for i, ep in enumerate(split_endpoints(env.get("PADDLE_PSERVERS_IP_PORT_LIST")))
    ]
    heter = split_endpoints(env.get("PADDLE_ALL_HETER_TRAINER_IP_PORT_LIST"))
    counts = [int(x) for x in re.findall(r"\d+", env.get("PADDLE_STAGE_TRAINERS_NUM", ""))][1:]
    my_stage = int(env.get("STAGE_ID", "1"))
    position = 0
    for offset, count in enumerate(counts):
        stage = offset + 2
        for i in range(count):
            if position < len(heter) and stage > my_stage:
                # A stage depends on every later stage: its micro-batches' gradients come back through them.
                peers.append((f"stage {stage} heterogeneous trainer {i} ({heter[position]})", heter[position]))
            position += 1
    return peers


def reachable(endpoint: str, timeout: float = 1.0) -> bool:
    host, port = endpoint.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def listens_here(endpoint: str, pid: int) -> bool:
    """Whether process ``pid`` has a listening socket on ``endpoint``'s port."""
    port = _port(endpoint)
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)


def who_listens(endpoint: str) -> str:
    """Who listens on ``endpoint``'s port on this machine, in words (for an error message)."""
    port = _port(endpoint)
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.Error as exc:
        return f"the listeners of port {port} could not be read ({exc})"
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
            if c.pid is None:
                return f"port {port} is held by another user's process"
            try:
                name = " ".join(psutil.Process(c.pid).cmdline()[:3])
            except psutil.Error:
                name = "?"
            return f"port {port} is held by pid {c.pid} ({name})"
    return f"nothing listens on port {port}"


class Watchdog:
    """Probe peers every ``interval`` s; fatal when one never comes up within ``startup_timeout`` s or stops
    answering for ``misses`` probes in a row after it was up.  ``armed`` is cleared while the job ends normally
    (peers then go away on purpose)."""

    def __init__(
        self,
        peers: list[tuple[str, str]],
        me: str,
        startup_timeout: float,
        interval: float = 1.0,
        misses: int = 3,
        on_fatal: Callable[[str], None] | None = None,
    ):
        self.peers = list(peers)
        self.me = me
        self.startup_timeout = startup_timeout
        self.interval = interval
        self.misses = misses
        self.on_fatal = on_fatal or _exit_fatal
        self.armed = True
        # This process's own HeterServer endpoint (runtime/first_send.py), expected to listen from ``_own_since``:
        # a port another process took before this one bound it leaves Paddle waiting forever, before any op runs.
        self.own_endpoint: str | None = None
        self._own_since: float | None = None
        self._seen: set[str] = set()
        self._missed: dict[str, int] = {}
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="heterps-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def expect_own_listen(self) -> None:
        """This process's server starts now (a pass begins): it must listen within ``startup_timeout``."""
        self._own_since = time.monotonic()

    def own_listen_done(self) -> None:
        """It listened, or its pass ended (a CPU trainer's server stops between passes)."""
        self._own_since = None

    def check_own(self) -> str | None:
        if self.own_endpoint is None or self._own_since is None:
            return None
        if listens_here(self.own_endpoint, os.getpid()):
            self.own_listen_done()
            return None
        if time.monotonic() - self._own_since <= self.startup_timeout:
            return None
        return (
            f"{FATAL_TAG}: {self.me}: its own endpoint {self.own_endpoint} is not listening "
            f"{self.startup_timeout:.0f} s after its pass started (HETERPS_STARTUP_TIMEOUT): "
            f"{who_listens(self.own_endpoint)}; Paddle would wait forever; stopping this job"
        )

    def check_once(self) -> str | None:
        """One round of probes; returns a fatal message or None."""
        if not self.armed:
            return None
        own = self.check_own()
        if own:
            return own
        dead, missing = [], []
        for description, endpoint in self.peers:
            if reachable(endpoint):
                self._seen.add(endpoint)
                self._missed[endpoint] = 0
            elif endpoint in self._seen:
                self._missed[endpoint] = self._missed.get(endpoint, 0) + 1
                if self._missed[endpoint] >= self.misses:
                    dead.append(description)
            else:
                missing.append(description)
        if dead:
            return (
                f"{FATAL_TAG}: {self.me}: {'; '.join(dead)} stopped answering (process died or was killed); "
                "stopping this job instead of waiting forever"
            )
        if missing and time.monotonic() - self._t0 > self.startup_timeout:
            return (
                f"{FATAL_TAG}: {self.me}: {'; '.join(missing)} never started within "
                f"{self.startup_timeout:.0f} s (HETERPS_STARTUP_TIMEOUT); stopping this job"
            )
        return None

    def _loop(self) -> None:
        while True:
            time.sleep(self.interval)
            message = self.check_once()
            if message:
                self.on_fatal(message)
                return


def _exit_fatal(message: str) -> None:
    logger.error("%s", message)
    # The main thread is blocked in C++ (no Python exception can reach it): end the process.
    seam.end_process(WATCHDOG_EXIT_CODE, message)
