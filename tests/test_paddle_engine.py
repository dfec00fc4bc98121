"""A Paddle without the parameter-server engine is refused at once, by name (issue 62): from the installed release's
version at ``import heterps_paddle``, from the symbols themselves at the import of Paddle's fleet."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from heterps_paddle import paddle_engine
from heterps_paddle.paddle_engine import PaddleWithoutParameterServer

REPO_ROOT = __file__.rsplit("/tests/", 1)[0]


@pytest.mark.parametrize("version", ["2.6.2", "3.0.0", "3.0.0rc1", "0.0.0", "develop"])
def test_the_releases_with_the_engine_and_unnamed_builds_pass_the_version_check(version):
    paddle_engine.check_version(version)


@pytest.mark.parametrize(
    ("version", "lacks"),
    [("3.1.0", "`distributed_lookup_table` operator is not registered"), ("3.3.1", "its core was removed")],
)
def test_a_release_without_the_engine_is_refused_naming_it_and_the_releases_that_work(version, lacks):
    with pytest.raises(PaddleWithoutParameterServer) as refused:
        paddle_engine.check_version(version)
    said = str(refused.value)
    assert f"Paddle {version} has no parameter-server engine" in said and lacks in said
    assert "2.6.2 or 3.0.0" in said
    assert isinstance(refused.value, ImportError)  # what an import of the project raises


def _core(*symbols):
    return SimpleNamespace(**{name: object() for name in symbols})


def test_a_core_without_the_engine_symbols_is_refused_naming_what_is_missing():
    with pytest.raises(PaddleWithoutParameterServer, match="its core has no CommContext, DistFleetWrapper"):
        paddle_engine.check_core("0.0.0", _core(), None)
    with pytest.raises(PaddleWithoutParameterServer, match="its core has no DistFleetWrapper"):
        paddle_engine.check_core("0.0.0", _core("CommContext"), None)


def test_a_core_without_the_lookup_op_is_refused_and_a_whole_one_passes():
    whole = _core("CommContext", "DistFleetWrapper")
    with pytest.raises(PaddleWithoutParameterServer, match="`distributed_lookup_table` operator is not registered"):
        paddle_engine.check_core("0.0.0", whole, lambda: ["lookup_table_v2", "send"])
    paddle_engine.check_core("2.6.2", whole, lambda: ["distributed_lookup_table"])
    paddle_engine.check_core("2.6.2", whole, None)  # a core that cannot list its ops: the symbols decide


def test_the_installed_paddle_passes_every_check():
    paddle_engine.check_installed()
    paddle_engine.check_imported_paddle()


def _python(tmp_path, code, *paths):
    env_path = ":".join([*map(str, paths), REPO_ROOT])
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": env_path},
        timeout=300,
    )


def test_importing_the_project_under_paddle_3_3_1_names_what_is_missing(tmp_path):
    fake = tmp_path / "dists"
    info = fake / "paddlepaddle-3.3.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: paddlepaddle\nVersion: 3.3.1\n")
    done = _python(tmp_path, "import heterps_paddle", fake)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "PaddleWithoutParameterServer" in last and "Paddle 3.3.1 has no parameter-server engine" in last, last
    assert "2.6.2 or 3.0.0" in last


def test_a_paddle_build_without_the_engine_core_is_refused_at_the_fleet_import(tmp_path):
    fake = tmp_path / "fake"
    for package in ("paddle", "paddle/base", "paddle/distributed", "paddle/distributed/fleet"):
        (fake / package).mkdir(parents=True)
        (fake / package / "__init__.py").write_text("")
    (fake / "paddle" / "__init__.py").write_text("__version__ = '0.0.0'\n")
    (fake / "paddle" / "base" / "core.py").write_text("def get_all_op_names():\n    return ['send']\n")
    code = textwrap.dedent(
        """
        import heterps_paddle
        import paddle.distributed.fleet
        """
    )
    done = _python(tmp_path, code, fake)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "Paddle 0.0.0 has no parameter-server engine (its core has no CommContext, DistFleetWrapper)" in last, last
