"""Build and install heterps-paddle.

Which Paddle wheel: ``paddlepaddle`` (CPU) and ``paddlepaddle-gpu`` install the same ``paddle`` import,
so requiring the CPU wheel on a machine that has the GPU one would overwrite it.  We require
``paddlepaddle-gpu==2.6.2`` when ``HETERPS_PADDLE=gpu`` is set or when the GPU wheel is already installed
in the target environment, and ``paddlepaddle==2.6.2`` otherwise.
"""

import os
import shutil
import subprocess
import sys
import zlib  # noqa: F401  (before anything imports paddle: libpaddle exports zlib symbols; see docs/paddle-notes.md)

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

PADDLE_VERSION = "2.6.2"


def _target_env_has_gpu_paddle() -> bool:
    # pip builds in an isolated environment whose sys.path hides the target's site-packages; ask the
    # target interpreter itself, with the isolation variables removed.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    probe = "import importlib.metadata as m; m.version('paddlepaddle-gpu')"
    try:
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def paddle_requirement() -> str:
    choice = os.environ.get("HETERPS_PADDLE", "").strip().lower()
    if choice not in ("", "cpu", "gpu"):
        sys.exit(f"HETERPS_PADDLE must be 'cpu' or 'gpu', got {choice!r}")
    if choice == "gpu" or (choice == "" and _target_env_has_gpu_paddle()):
        return f"paddlepaddle-gpu=={PADDLE_VERSION}"
    return f"paddlepaddle=={PADDLE_VERSION}"


# ---- native part: the sparse table (custom_ops/, CMakeLists.txt) ------------------------------------------
#
# One CMake build makes libheterps_table.so (the framework-free core with its C API) and heterps_ops.so
# (the Paddle ops over it), both installed into heterps_paddle/_ops.  The ops need Paddle's headers, which
# exist only where paddle is installed: with pip's build isolation the build environment has no paddle,
# so we ask the *target* interpreter (isolation variables removed, as above) where its paddle lives.
# Paddle must therefore be installed before this package; see docs/sparse-table.md.
#   HETERPS_BUILD_OPS=0      build only the core (no Paddle ops)
#   HETERPS_CUDA=ON|OFF|AUTO  CUDA table (default: AUTO when the installed paddle is a CUDA build, else OFF)
#   HETERPS_BUILD_JOBS=N      parallel compile jobs (default 2)

_PADDLE_PROBE = (
    "import json, os, sysconfig, paddle; "
    "print(json.dumps({'include': paddle.sysconfig.get_include(), "
    "'libdir': os.path.join(os.path.dirname(paddle.__file__), 'base'), "
    "'cuda': bool(paddle.is_compiled_with_cuda()), "
    "'python_include': sysconfig.get_path('include', scheme='posix_prefix')}))"
)


def _probe_target_paddle():
    import json

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    for candidate_env in (os.environ.copy(), env):  # the build env first (--no-build-isolation), then the target
        try:
            out = subprocess.run(
                [sys.executable, "-c", _PADDLE_PROBE], env=candidate_env, capture_output=True, text=True, timeout=300
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0 and out.stdout.strip():
            return json.loads(out.stdout.strip().splitlines()[-1])
    return None


class CMakeBuild(build_ext):
    """Builds the CMake project once and places its shared libraries where the extension would go."""

    def build_extension(self, ext):
        out_dir = os.path.abspath(os.path.dirname(self.get_ext_fullpath(ext.name)))
        os.makedirs(out_dir, exist_ok=True)
        build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        args = [f"-DHETERPS_OUTPUT_DIR={out_dir}", "-DBUILD_TESTING=OFF", "-DCMAKE_BUILD_TYPE=Release"]
        targets = ["heterps_table"]
        cuda = os.environ.get("HETERPS_CUDA", "").upper()
        paddle_info = None
        if os.environ.get("HETERPS_BUILD_OPS", "1") != "0":
            paddle_info = _probe_target_paddle()
            if paddle_info is None:
                sys.exit(
                    "heterps-paddle: building the sparse-table Paddle ops needs paddle installed first "
                    f"(pip install {paddle_requirement()}), then `pip install --no-build-isolation .`; "
                    "or set HETERPS_BUILD_OPS=0 to build without them."
                )
            args += [
                f"-DHETERPS_PADDLE_INCLUDE={paddle_info['include']}",
                f"-DHETERPS_PADDLE_LIBDIR={paddle_info['libdir']}",
                f"-DHETERPS_PYTHON_INCLUDE={paddle_info['python_include']}",
                f"-DHETERPS_PADDLE_WITH_CUDA={'ON' if paddle_info['cuda'] else 'OFF'}",
            ]
            targets.append("heterps_ops")
        if not cuda:
            # The CUDA table is only reachable from a CUDA Paddle; on a CPU wheel, skip nvcc at install time.
            cuda = "AUTO" if paddle_info and paddle_info["cuda"] else "OFF"
        args.append(f"-DHETERPS_CUDA={cuda}")
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        root = os.path.dirname(os.path.abspath(__file__))
        subprocess.check_call(["cmake", "-S", root, "-B", build_dir, *generator, *args])
        jobs = os.environ.get("HETERPS_BUILD_JOBS", "2")
        subprocess.check_call(["cmake", "--build", build_dir, "-j", jobs, "--target", *targets])
        self._heterps_outputs = [
            os.path.join(out_dir, name)
            for name in ("libheterps_table.so", "heterps_ops.so")
            if os.path.exists(os.path.join(out_dir, name))
        ]

    def copy_extensions_to_source(self):
        # `build_ext --inplace`: setuptools would look for the placeholder's file; copy the real libraries.
        dest = os.path.join(self.get_finalized_command("build_py").get_package_dir("heterps_paddle"), "_ops")
        os.makedirs(dest, exist_ok=True)
        for path in getattr(self, "_heterps_outputs", []):
            shutil.copy2(path, os.path.join(dest, os.path.basename(path)))

    def get_outputs(self):
        return list(getattr(self, "_heterps_outputs", [])) or super().get_outputs()


# A placeholder extension: its only job is to make setuptools run CMakeBuild and mark the wheel as
# platform-specific; the real outputs land next to it in heterps_paddle/_ops/.
NATIVE_EXTENSIONS = [Extension("heterps_paddle._ops.libheterps_table", sources=[])]


setup(
    name="heterps-paddle",
    version="0.1.0",
    description="HeterPS scheduling and heterogeneous parameter-server training for PaddlePaddle fleet",
    python_requires=">=3.8",
    packages=find_packages(include=["heterps_paddle", "heterps_paddle.*"])
    + [
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
        "scipy",  # HiGHS MILP: the exact scheduler's proof when the shared unit limit binds
        "prometheus_client",  # the text format of heterps launch --metrics-port (launch/metrics_server.py)
    ],
    # test: the suite, and the gates .ci/run applies (pinned: a formatter's next release reformats code)
    extras_require={
        "test": [
            "pytest",
            "matplotlib",
            "ruff==0.17.6",
            "mypy==2.4.1",
            "clang-format==23.1.5",
            "import-linter==2.16",
            "kubernetes-validate==1.37.0",
            "hypothesis>=6.100,<7",  # the control port's protocol fuzz test (tests/test_control_fuzz.py)
        ],
        "plot": ["matplotlib"],
    },
    ext_modules=NATIVE_EXTENSIONS,
    cmdclass={"build_ext": CMakeBuild},
    entry_points={"console_scripts": ["heterps=heterps_paddle.tools.cli:main"]},
)
