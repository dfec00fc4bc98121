"""Ports for a job's processes: below the kernel's ephemeral range, and held until the job ends.

Paddle 2.6.2's PS launcher draws a port per process with a bind to port 0, so in the ephemeral range, and the
process binds it tens of seconds later.  On a busy machine an outgoing connection can take the port in between;
the CPU trainer's HeterServer then fails to listen and ``HeterPipelineTrainer::Run`` waits forever (one suite run
of twelve, docs/paddle-notes.md).  Ports below that range are never handed out for outgoing connections, so only
another listener can take them.  Two launches on one machine would still draw the same free port between their
draw and their bind: each port is therefore claimed by an exclusive ``flock`` on a file named after it, held by
the launch until its job ends (the kernel drops it when the launch dies, even by SIGKILL), and skipped by every
other launch while held.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from dataclasses import dataclass, field

from heterps_paddle.errors import HeterPSError

EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
DEFAULT_EPHEMERAL_LOW = 32768  # Linux's default when the range cannot be read
LOWEST_PORT = 10000  # below it: well-known and registered services' ports
DRAWS = 400


def ephemeral_low(path: str = EPHEMERAL_RANGE_FILE) -> int:
    """The first port the kernel hands out for outgoing connections."""
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def lock_dir() -> str:
    """One directory for every user's launches on this machine: a port is the machine's, not a user's."""
    path = os.path.join(tempfile.gettempdir(), "heterps-ports")
    os.makedirs(path, mode=0o1777, exist_ok=True)
    return path


@dataclass
class PortBlock:
    """``count`` consecutive ports from ``first``, claimed by this process until ``release`` (or its end)."""

    address: str
    first: int
    count: int
    claims: list[int] = field(default_factory=list, repr=False)  # the flock'd files' descriptors

    @property
    def ports(self) -> list[int]:
        return list(range(self.first, self.first + self.count))

    def release(self) -> None:
        for fd in self.claims:
            os.close(fd)  # closing the file drops its flock
        self.claims.clear()


def _claim(port: int) -> int | None:
    path = os.path.join(lock_dir(), f"{port}.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _bindable(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as the job's servers bind (brpc sets SO_REUSEADDR): a port in TIME_WAIT from an earlier job is usable
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def claim_port_block(address: str, count: int, rng: random.Random | None = None) -> PortBlock:
    """``count`` consecutive ports free on ``address``, below the ephemeral range and claimed by no other launch."""
    rng = rng or random.Random()
    high = ephemeral_low()
    if high - LOWEST_PORT <= count:
        raise HeterPSError(
            f"no room for {count} ports between {LOWEST_PORT} and the ephemeral range's start {high} "
            f"({EPHEMERAL_RANGE_FILE})"
        )
    for _ in range(DRAWS):
        first = rng.randrange(LOWEST_PORT, high - count)
        block = PortBlock(address, first, count)
        for port in block.ports:
            fd = _claim(port)
            if fd is None:
                break
            block.claims.append(fd)
            if not _bindable(address, port):
                break
        else:
            return block
        block.release()
    raise HeterPSError(
        f"no {count} consecutive free ports on {address} between {LOWEST_PORT} and {high} after {DRAWS} draws "
        f"(claims in {lock_dir()})"
    )
