"""Install the HeterPS fleet hook when (and only when) Paddle's fleet package is imported.

``import heterps_paddle`` must make ``strategy.heterps`` available in a fleet script, but the planning
half of the package must never import Paddle.  So instead of importing Paddle here, we patch fleet the
moment ``paddle.distributed.fleet`` finishes importing (or at once, if it already has).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Any, Sequence

FLEET_MODULE = "paddle.distributed.fleet"

_lock = threading.Lock()
_applied = False


def _apply() -> None:
    global _applied
    with _lock:
        if _applied:
            return
        _applied = True
    # Imported here, not at the top: this runs inside ``import paddle.distributed.fleet``, once fleet's module body
    # has run, whereas this module is imported by ``import heterps_paddle``, which must not import Paddle (the meta
    # optimizer module does) nor load the fleet surface before fleet exists.
    from heterps_paddle.paddle_engine import check_imported_paddle

    check_imported_paddle()  # before anything of ours touches Paddle's PS surface: a build without it, by name
    from heterps_paddle.fleet.meta_optimizer import HeterPSOptimizer
    from heterps_paddle.fleet.strategy import validate_heterps_configs, validate_heterps_flag
    from heterps_paddle.runtime.patches import install_fleet_surface

    install_fleet_surface(HeterPSOptimizer, validate_heterps_flag, validate_heterps_configs)


class _AfterExecLoader(importlib.abc.Loader):
    """Wraps fleet's real loader and runs the hook right after the module body has executed."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _apply()

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...: the real loader's
        return getattr(self._inner, name)


class _FleetImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != FLEET_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _AfterExecLoader(spec.loader)
        return spec


def install_fleet_hook() -> None:
    """Patch fleet now if it is loaded, else as soon as it is."""
    if FLEET_MODULE in sys.modules:
        _apply()
        return
    if not any(isinstance(f, _FleetImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _FleetImportFinder())
