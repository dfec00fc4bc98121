"""Build and install heterps-paddle.

Which Paddle wheel: ``paddlepaddle`` (CPU) and ``paddlepaddle-gpu`` install the same ``paddle`` import,
so requiring the CPU wheel on a machine that has the GPU one would overwrite it.  We require
``paddlepaddle-gpu==2.6.2`` when ``HETERPS_PADDLE=gpu`` is set or when the GPU wheel is already installed
in the target environment, and ``paddlepaddle==2.6.2`` otherwise.
"""

import zlib  # noqa: F401  (before anything imports paddle: libpaddle exports zlib symbols; see docs/paddle-notes.md)

import os
import subprocess
import sys

from setuptools import setup

PADDLE_VERSION = "2.6.2"


def _target_env_has_gpu_paddle() -> bool:
    # pip builds in an isolated environment whose sys.path hides the target's site-packages; ask the
    # target interpreter itself, with the isolation variables removed.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    probe = "import importlib.metadata as m; m.version('paddlepaddle-gpu')"
    try:
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                              timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def paddle_requirement() -> str:
    choice = os.environ.get("HETERPS_PADDLE", "").strip().lower()
    if choice not in ("", "cpu", "gpu"):
        sys.exit(f"HETERPS_PADDLE must be 'cpu' or 'gpu', got {choice!r}")
    if choice == "gpu" or (choice == "" and _target_env_has_gpu_paddle()):
        return f"paddlepaddle-gpu=={PADDLE_VERSION}"
    return f"paddlepaddle=={PADDLE_VERSION}"


setup(
    name="heterps-paddle",
    version="0.1.0",
    description="HeterPS scheduling and heterogeneous parameter-server training for PaddlePaddle fleet",
    python_requires=">=3.8",
    packages=[
        "heterps_paddle",
        "heterps_paddle.data",
        "heterps_paddle.planning",
        "heterps_paddle.planning.schedulers",
        "heterps_paddle.bench",
        # The example fleet scripts are installed too, so `heterps bench` and `heterps profile --example`
        # work from any install; the source of truth stays in examples/.
        "heterps_paddle.examples",
    ],
    package_dir={"heterps_paddle.examples": "examples"},
    package_data={"heterps_paddle.examples": ["*/*.py", "*/*.yaml", "*/*.md", "clusters/*.yaml", "*.md"]},
    install_requires=[
        paddle_requirement(),
        "protobuf>=3.20.2,<5",  # protobuf 5 breaks fleet.DistributedStrategy in Paddle 2.6.2
        "numpy<2",  # Paddle 2.6.2 is built against numpy 1.x
        "pyyaml",
        "psutil",
    ],
    extras_require={"test": ["pytest"]},
    entry_points={"console_scripts": ["heterps=heterps_paddle.cli:main"]},
)
