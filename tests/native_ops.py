"""Imported first by the tests that need the native libraries: builds heterps_paddle/_ops in a source
checkout when missing or stale (custom_ops/ensure_built.py); ``package_env()`` gives subprocesses the same
package the tests import."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "heterps_ensure_built", Path(__file__).resolve().parents[1] / "custom_ops" / "ensure_built.py"
)
_ensure_built = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ensure_built)
_ensure_built.ensure_built()

package_env = _ensure_built.package_env
