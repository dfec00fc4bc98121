"""Measure before betting (fleet/host_measure.py): which process times which host type, what it publishes, and
trainer 0's profile on the measured times; a type not timed keeps the file's figures, said.  Pure: a board in a
dict, no Paddle program run (the launched test is tests/test_host_restarts.py's default-settings job)."""

import json

import pytest

from heterps_paddle import rendezvous
from heterps_paddle.fleet import host_measure as hm
from heterps_paddle.planning.model import Cluster, LayerProfile, ModelProfile, ResourceType

COMMON = dict(max_units=4, flops=1e9, mem_bw=1e10, memory=1e12, net_bw=1e9)
CLUSTER = Cluster(
    (
        ResourceType("cpu_small", "cpu", 1.0, **COMMON),
        ResourceType("gpu_fast", "gpu", 2.0, **{**COMMON, "flops": 1e13}),
    )
)
PROFILE = ModelProfile(
    "m",
    128,
    tuple(
        LayerProfile(n, "dense", flops=1e6, param_bytes=1e3, io_bytes=0, out_bytes=0, time={"local_cpu": 1e-5})
        for n in ("emb", "fc")
    ),
)
TOLD = {"worker_num": 2, "measure": {"cpu_small": "127.0.0.2:100", "gpu_fast": "127.0.0.4:300"}}


class DictBoard:
    where = "a dict"

    def __init__(self):
        self.values = {}

    def put(self, key, value):
        self.values[key] = json.loads(json.dumps(value))

    def get(self, key):
        return self.values.get(key)

    def entries(self, prefix):
        return {k: v for k, v in self.values.items() if k.startswith(prefix)}


@pytest.fixture
def board(monkeypatch):
    b = DictBoard()
    monkeypatch.setattr(rendezvous, "board", lambda env=None: b)
    return b


def env(address, port, device="cpu"):
    return {
        "HETERPS_LAUNCH": json.dumps(TOLD),
        "POD_IP": address,
        "PADDLE_PORT": str(port),
        "HETER_DEVICE_TYPE": device,
    }


def timed(rtype):
    return ModelProfile(
        PROFILE.name,
        PROFILE.batch_size,
        tuple(LayerProfile(**{**vars(layer), "time": {rtype: 4e-5}}) for layer in PROFILE.layers),
    )


def test_only_the_named_process_times_its_hosts_type_and_publishes_it(board):
    assert hm.my_type(env("127.0.0.3", 200)) is None
    assert hm.measure_this_host(CLUSTER, timed, env("127.0.0.3", 200)) is None and board.values == {}
    result = hm.measure_this_host(CLUSTER, timed, env("127.0.0.4", 300))
    assert result.times == {"emb": 4e-5, "fc": 4e-5} and result.host == "127.0.0.4"
    published = hm.TypeMeasurement.from_dict(board.values["measured.gpu_fast"])
    assert published.times == result.times and published.file_seconds_per_sample > 0
    assert "gpu_fast: measured on 127.0.0.4" in published.line() and "the cluster file predicted" in published.line()


def test_a_gpu_the_profiler_cannot_time_and_a_failed_measurement_leave_the_files_figures_said(board):
    gpu = hm.measure_this_host(CLUSTER, timed, env("127.0.0.4", 300, device="gpu"))
    assert gpu.times is None and "GPU" in gpu.why_not
    # a CPU trainer (no heterogeneous device) where Paddle has CUDA: a one-stage plan's trainers run on the GPU
    trainer = {k: v for k, v in env("127.0.0.4", 300).items() if k != "HETER_DEVICE_TYPE"}
    assert hm.measure_this_host(CLUSTER, timed, trainer, cuda=True).times is None
    assert hm.measure_this_host(CLUSTER, timed, trainer, cuda=False).times is not None  # no CUDA: the CPU runs it

    def broken(rtype):
        raise RuntimeError("the profiler's op failed")

    failed = hm.measure_this_host(CLUSTER, broken, env("127.0.0.2", 100))
    assert failed.times is None and "RuntimeError: the profiler's op failed" in failed.why_not
    assert "the cluster file's figures stand" in failed.line()


def test_trainer_0_plans_on_the_measured_times_and_does_not_wait_for_its_own_type(board, monkeypatch):
    hm.measure_this_host(CLUSTER, timed, env("127.0.0.4", 300))
    profile, measured = hm.gather(PROFILE, env("127.0.0.2", 100))  # trainer 0 times cpu_small itself
    assert [m.type for m in measured] == ["gpu_fast"]
    assert all(layer.time == {"local_cpu": 1e-5, "gpu_fast": 4e-5} for layer in profile.layers)


def test_a_type_not_timed_within_the_wait_is_planned_on_the_files_figures(board, monkeypatch):
    monkeypatch.setenv("HETERPS_MEASURE_WAIT_S", "0.2")
    profile, measured = hm.gather(PROFILE, env("127.0.0.2", 100))
    assert profile == PROFILE and measured[0].times is None and "HETERPS_MEASURE_WAIT_S" in measured[0].why_not


def test_a_record_that_is_not_a_measurement_is_planned_on_the_files_figures_and_said(board):
    board.put("measured.gpu_fast", {"type": "gpu_fast", "times": "garbage"})
    profile, measured = hm.gather(PROFILE, env("127.0.0.2", 100))
    assert profile == PROFILE and measured[0].times is None and "could not be read" in measured[0].why_not
