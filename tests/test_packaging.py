"""setup.py must never pull the CPU Paddle wheel over a GPU one."""

import pytest
from conftest import REPO, run_python

CAPTURE = (
    "import runpy, setuptools, os; captured = {}; "
    f"setuptools.setup = lambda **kw: captured.update(kw); os.chdir({REPO!r}); "
    "runpy.run_path('setup.py', run_name='__main__'); print(captured['install_requires'][0])"
)


@pytest.mark.parametrize("choice, wheel", [("gpu", "paddlepaddle-gpu==2.6.2"), ("cpu", "paddlepaddle==2.6.2")])
def test_paddle_wheel_choice(choice, wheel):
    result = run_python(CAPTURE, env={"HETERPS_PADDLE": choice})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == wheel


@pytest.mark.parametrize(
    "probe, wheel", [("/bin/true", "paddlepaddle-gpu==2.6.2"), ("/bin/false", "paddlepaddle==2.6.2")]
)
def test_installed_gpu_wheel_is_detected(probe, wheel):
    # setup.py asks the target interpreter whether paddlepaddle-gpu is installed; stand in for that
    # interpreter with a program that answers yes (/bin/true) or no (/bin/false).
    result = run_python(f"import sys; sys.executable = {probe!r}; " + CAPTURE, env={"HETERPS_PADDLE": ""})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == wheel


def test_bad_choice_is_refused():
    result = run_python(CAPTURE, env={"HETERPS_PADDLE": "tpu"})
    assert result.returncode != 0 and "HETERPS_PADDLE must be 'cpu' or 'gpu'" in result.stderr
