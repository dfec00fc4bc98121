import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

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


@pytest.fixture(scope="session")
def data_100k(tmp_path_factory):
    """The data set the jobs that compare held-out AUCs train on, generated once for the session: 100,000 rows
    (seed 3, a tenth held out).  At 40,000 rows the held-out AUC of one job spread by 0.015 from run to run, more
    than the bounds those tests hold."""
    from heterps_paddle.data.generator import generate  # lazy: conftest stays importable before the package is built

    path = str(tmp_path_factory.mktemp("data-100k") / "data")
    generate(path, 100000, seed=3, test_fraction=0.1)
    return path


def scrape_until(port, stop, scrapes, address="127.0.0.1"):
    """A job's metrics endpoint (heterps launch --metrics-port), scraped by an HTTP client every second until
    ``stop``: each answer's text appended to ``scrapes``."""
    import urllib.request

    while not stop.wait(1.0):
        try:
            with urllib.request.urlopen(f"http://{address}:{port}/metrics", timeout=5) as answer:
                scrapes.append(answer.read().decode())
        except OSError:
            pass  # not up yet, or gone


def run_python(code, env=None, timeout=300):
    """Run code in a fresh interpreter (module-level state such as fleet's singletons stays clean)."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def heterps_cli():
    exe = shutil.which("heterps", path=os.path.dirname(sys.executable))
    return [exe] if exe else [sys.executable, "-m", "heterps_paddle"]


def heterps_eval(model, config, overrides):
    """`heterps eval --model MODEL -m CONFIG OVERRIDES... --json` as a user runs it: the held-out AUC it prints."""
    done = subprocess.run(
        [*heterps_cli(), "eval", "--model", str(model), "-m", config, *overrides, "--json"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["test_auc"]


def run_cli(capsys, *argv):
    """`heterps ARGV...` in this process: (exit status, stdout, stderr)."""
    from heterps_paddle.tools.cli import main  # lazy: conftest stays importable before the package is built

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# A tiny CTR model profile and a cluster file, for `heterps plan` as a user runs it.
CLUSTER = os.path.join(REPO, "examples", "clusters", "cpu_t4.yaml")
PROFILE = {
    "format": 1,
    "name": "tiny_ctr",
    "batch_size": 512,
    "layers": [
        {"name": "embedding", "kind": "sparse", "flops": 0, "param_bytes": 6.0e10, "io_bytes": 832, "out_bytes": 1000},
        {"name": "fc_0", "kind": "dense", "flops": 2.0e6, "param_bytes": 4.0e6, "out_bytes": 3200},
        {"name": "fc_1", "kind": "dense", "flops": 2.0e6, "param_bytes": 4.0e6, "out_bytes": 3200},
        {"name": "fc_2", "kind": "dense", "flops": 1.0e4, "param_bytes": 1.0e4, "out_bytes": 8},
    ],
}


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    return str(path)


def plan_exact(capsys, model_file, *argv):
    """`heterps plan` of the tiny model on cpu_t4.yaml with the exact scheduler: (exit status, stdout, stderr)."""
    return run_cli(capsys, "plan", "--model", model_file, "--cluster", CLUSTER, "--scheduler", "exact", *argv)


def split_cluster(cpu_units: int, gpu_units: int, throughput: float | None = None) -> str:
    """A what-if cluster file (YAML) on which the best plan for the example ctr_dnn splits it: the embedding on the
    CPU type, the fc layers on the GPU type.  Every time is estimated from these figures (no local type, so nothing
    measured on this machine enters the plan): the fc layers are slow on the CPU type and fast on the GPU type, whose
    memory cannot hold the embedding table.  So the split is the best plan whatever the load."""
    target = "" if throughput is None else f"throughput: {throughput:g}\n"
    return (
        f"format: 1\n{target}resource_types:\n"
        f"  - {{name: cpu_small, kind: cpu, price_per_hour: 1.0, max_units: {cpu_units}, flops: 1.0e+8, mem_bw: 1.0e+10,\n"
        "     memory: 1.0e+10, net_bw: 1.0e+9}\n"
        f"  - {{name: gpu_fast, kind: gpu, price_per_hour: 2.0, max_units: {gpu_units}, flops: 1.0e+13, mem_bw: 1.0e+11,\n"
        "     memory: 1.0e+8, net_bw: 1.0e+9}\n"
    )
