"""Whether the installed Paddle has the parameter-server engine this project runs on, said once and by name.

Paddle's parameter server lives in two releases only: 2.6.2 and 3.0.0.  3.1.0 keeps the servers but no longer
registers the trainers' lookup op (``distributed_lookup_table``: Paddle PRs 71806, 71922), and 3.1.1 on removed the
engine's core (PR 73999: no ``CommContext``, no ``DistFleetWrapper``).  Under those a fleet script would fail deep
inside ``minimize`` or ``init_server`` with an ImportError or an unregistered operator; this module refuses them at
``import heterps_paddle`` (from the installed distribution's version, without importing Paddle: the planning half
never does) and, for a build whose version says nothing (a source build), at the import of Paddle's fleet, from the
symbols themselves.
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any, Callable, Iterable

from heterps_paddle.errors import HeterPSError

WORKING_RELEASES = ("2.6.2", "3.0.0")
DISTRIBUTIONS = ("paddlepaddle", "paddlepaddle-gpu")
FIRST_WITHOUT = (3, 1)  # the first minor release whose parameter-server engine is incomplete
# What a parameter-server job needs of Paddle's core: the trainers' communicator contexts, the servers' fleet
# wrapper, and the lookup op that minimize writes into the trainers' program.
CORE_SYMBOLS = ("CommContext", "DistFleetWrapper")
LOOKUP_OP = "distributed_lookup_table"


class PaddleWithoutParameterServer(HeterPSError, ImportError):
    """The installed Paddle cannot run a parameter-server job."""


def refusal(version: str, lacks: str) -> PaddleWithoutParameterServer:
    return PaddleWithoutParameterServer(
        f"heterps-paddle: Paddle {version} has no parameter-server engine ({lacks}); heterps-paddle runs on Paddle "
        f"{' or '.join(WORKING_RELEASES)} (`pip install -r requirements.txt` picks the one for this Python)"
    )


def release(version: str) -> tuple[int, int] | None:
    """A version's (major, minor), None for one that names no release (a source build's 0.0.0)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        return None
    major, minor = int(found.group(1)), int(found.group(2))
    return None if (major, minor) == (0, 0) else (major, minor)


def check_version(version: str) -> None:
    """Refuses a release known to lack the engine."""
    numbers = release(version)
    if numbers is not None and numbers >= FIRST_WITHOUT:
        lacks = f"the `{LOOKUP_OP}` operator is not registered" if numbers == FIRST_WITHOUT else "its core was removed"
        raise refusal(version, lacks)


def installed_version(distributions: Iterable[str] = DISTRIBUTIONS) -> str | None:
    """The installed Paddle distribution's version, read from its metadata (Paddle is not imported)."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_installed() -> None:
    """At ``import heterps_paddle``: a Paddle release without the engine is refused; no Paddle is fine (planning)."""
    version = installed_version()
    if version is not None:
        check_version(version)


def check_core(version: str, core: Any, op_names: Callable[[], Iterable[str]] | None) -> None:
    """Paddle's core module ``core`` (and its op registry, ``op_names``) has what a parameter-server job needs."""
    check_version(version)
    missing = [name for name in CORE_SYMBOLS if not hasattr(core, name)]
    if missing:
        raise refusal(version, f"its core has no {', '.join(missing)}")
    if op_names is not None and LOOKUP_OP not in set(op_names()):
        raise refusal(version, f"the `{LOOKUP_OP}` operator is not registered")


def check_imported_paddle() -> None:
    """At the import of Paddle's fleet: the symbols themselves (a source build's version names no release)."""
    import paddle

    try:
        from paddle.base import core
    except ImportError as exc:
        raise refusal(str(paddle.__version__), f"no paddle.base.core: {exc}") from None
    check_core(str(paddle.__version__), core, getattr(core, "get_all_op_names", None))
