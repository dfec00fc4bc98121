"""Two emulated hosts joined by a shaped link, on this machine: ``heterps bench hosts``'s network.

Each host is a network namespace (``ip netns add``) with its loopback up; a veth pair joins them, with a private
/30 that exists only inside the two namespaces, and a token bucket (``tc qdisc ... tbf``) on each end shapes what
that end sends, so each direction of the link carries at most ``rate`` (a full-duplex link, as between two
machines).  Nothing is routed out of the namespaces: they have no other interface and no default route.

Everything is removed by ``close`` (the context manager's exit): deleting a namespace deletes its veth end, and the
other end with it.  Names carry a unique prefix (``hps-<pid>-``), so concurrent runs never share one, and
``leftovers`` lists what of a prefix still exists.  Needs root and iproute2 (``ip``, ``tc``): refused loudly
otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from heterps_paddle.errors import HeterPSError

# Private addresses of the two ends; only ever configured inside the namespaces.
SUBNET = "10.213.0"
ADDRESS_A, ADDRESS_C = f"{SUBNET}.1", f"{SUBNET}.2"


class LinkSetupError(HeterPSError):
    """The emulated hosts or their link could not be made (not root, no iproute2, a command failed)."""


# iproute2 is an administrator's tool: Debian and most distributions install it in sbin, which a plain user's PATH
# (or `env -i PATH=/usr/local/bin:/usr/bin:/bin`) leaves out; root may run it from there all the same.
ADMIN_DIRS = ("/usr/sbin", "/sbin")


def tool(name: str) -> str | None:
    """The path of ``name`` (``ip``, ``tc``): on PATH, else in the administrators' directories."""
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(ADMIN_DIRS))


def command(name: str, *args: str) -> list[str]:
    """``name args...`` with ``name`` found by :func:`tool` (as given when it is nowhere: the error then names it)."""
    return [tool(name) or name, *args]


def check_can_shape() -> None:
    """Refuse clearly where namespaces and qdiscs cannot be made."""
    missing = [name for name in ("ip", "tc") if tool(name) is None]
    if missing:
        raise LinkSetupError(f"{' and '.join(missing)} not found: emulated hosts need iproute2 (ip, tc)")
    if os.geteuid() != 0:
        raise LinkSetupError("emulated hosts need root (ip netns add, tc qdisc): run as root")


def _run(*cmd: str) -> str:
    cmd = tuple(command(*cmd))
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise LinkSetupError(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout


def tbf_burst_bytes(rate_mbit: float) -> int:
    """A token bucket must hold at least one timer tick's worth of the rate (and a full-size packet, or it never
    sends one): 10 ms of the rate, and at least 16 KiB."""
    return max(16 * 1024, int(rate_mbit * 1e6 / 8 * 0.01))


@dataclass
class ShapedLink:
    """Namespaces ``<prefix>a`` and ``<prefix>c`` with addresses ``ADDRESS_A`` and ``ADDRESS_C``, joined by a veth
    pair shaped to ``rate_mbit`` Mbit/s each way."""

    rate_mbit: float
    prefix: str = ""
    made: bool = False

    def __post_init__(self) -> None:
        if not self.prefix:
            self.prefix = f"hps-{os.getpid()}-"
        if not self.rate_mbit > 0:
            raise LinkSetupError(f"a link rate must be positive, got {self.rate_mbit!r} Mbit/s")

    @property
    def namespaces(self) -> dict[str, str]:
        return {ADDRESS_A: f"{self.prefix}a", ADDRESS_C: f"{self.prefix}c"}

    @property
    def devices(self) -> dict[str, str]:
        # Interface names are at most 15 characters: the pid, not the whole prefix.
        tag = self.prefix.strip("-").replace("hps-", "")[-8:]
        return {ADDRESS_A: f"hv{tag}a", ADDRESS_C: f"hv{tag}c"}

    def prefix_command(self, address: str) -> list[str]:
        """What runs a command on the host of ``address`` (HostsRun's ``prefix``)."""
        return command("ip", "netns", "exec", self.namespaces[address])

    def open(self) -> ShapedLink:
        check_can_shape()
        self.made = True  # from here on close() removes whatever of it exists
        ns, dev = self.namespaces, self.devices
        for address in (ADDRESS_A, ADDRESS_C):
            _run("ip", "netns", "add", ns[address])
            _run("ip", "-n", ns[address], "link", "set", "lo", "up")
        # Made inside namespace a, its peer moved to c: neither end ever exists in this machine's own namespace.
        _run("ip", "-n", ns[ADDRESS_A], "link", "add", dev[ADDRESS_A], "type", "veth", "peer", "name", dev[ADDRESS_C])
        _run("ip", "-n", ns[ADDRESS_A], "link", "set", dev[ADDRESS_C], "netns", ns[ADDRESS_C])
        burst = tbf_burst_bytes(self.rate_mbit)
        for address in (ADDRESS_A, ADDRESS_C):
            n, d = ns[address], dev[address]
            _run("ip", "-n", n, "addr", "add", f"{address}/30", "dev", d)
            _run("ip", "-n", n, "link", "set", d, "up")
            # latency bounds the queue: generous, so a burst of RPCs waits rather than being dropped.
            _run(
                "tc", "-n", n, "qdisc", "add", "dev", d, "root", "tbf",
                "rate", f"{self.rate_mbit}mbit", "burst", str(burst), "latency", "400ms",
            )  # fmt: skip
        return self

    def sent_bytes(self) -> dict[str, int]:
        """Bytes each end's qdisc has sent so far (the link's traffic each way, headers included)."""
        out = {}
        for address in (ADDRESS_A, ADDRESS_C):
            text = _run("tc", "-n", self.namespaces[address], "-s", "qdisc", "show", "dev", self.devices[address])
            words = text.split()
            try:
                out[address] = int(words[words.index("Sent") + 1])
            except (ValueError, IndexError):
                raise LinkSetupError(f"no 'Sent N bytes' in tc's statistics of {address}'s end: {text!r}") from None
        return out

    def close(self) -> None:
        if not self.made:
            return
        errors = []
        for name in self.namespaces.values():
            if name in list_namespaces():
                done = subprocess.run(command("ip", "netns", "delete", name), capture_output=True, text=True)
                if done.returncode != 0:
                    errors.append(f"ip netns delete {name}: {done.stderr.strip()}")
        self.made = False
        if errors:
            raise LinkSetupError("; ".join(errors))

    def __enter__(self) -> ShapedLink:
        try:
            return self.open()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


def list_namespaces() -> list[str]:
    if tool("ip") is None:
        return []
    return [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.strip()]


def leftovers(prefix: str) -> list[str]:
    """Namespaces of ``prefix`` that still exist (veth ends live only inside them)."""
    return [name for name in list_namespaces() if name.startswith(prefix)]
