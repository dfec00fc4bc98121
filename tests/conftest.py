import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 80 real rows in PaddleRec's slot format, shipped with the tests (origin and licence in its README)
CRITEO_SAMPLE = os.path.join(REPO, "tests", "data", "criteo_sample", "sample_train.txt")


@pytest.fixture(scope="session")
def criteo_sample():
    return CRITEO_SAMPLE


@pytest.fixture(scope="session")
def heterps_cache(tmp_path_factory):
    """One data cache for the whole session, so launched jobs share generated and converted data."""
    path = os.environ.get("HETERPS_TEST_CACHE") or str(tmp_path_factory.mktemp("heterps-cache"))
    old = os.environ.get("HETERPS_CACHE")
    os.environ["HETERPS_CACHE"] = path
    yield path
    if old is None:
        os.environ.pop("HETERPS_CACHE", None)
    else:
        os.environ["HETERPS_CACHE"] = old


def run_python(code, env=None, timeout=300):
    """Run code in a fresh interpreter (module-level state such as fleet's singletons stays clean)."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def heterps_cli():
    exe = shutil.which("heterps", path=os.path.dirname(sys.executable))
    return [exe] if exe else [sys.executable, "-m", "heterps_paddle"]
