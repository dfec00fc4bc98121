"""The parameter-server probe: a real 1 server + 1 trainer launch against a local-table run of the same
model, and its per-machine cache."""

import json
import os

import pytest

pytest.importorskip("paddle")

from heterps_paddle.measure import ps_service  # noqa: E402


def _cached_files(root):
    folder = os.path.join(root, "measurements")
    return (
        [os.path.join(folder, n) for n in os.listdir(folder) if n.startswith("ps_service-")]
        if os.path.isdir(folder)
        else []
    )


@pytest.mark.launched
def test_probe_measures_server_work_and_caches_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HETERPS_CACHE", str(tmp_path))
    cost = ps_service.ps_row_cost(samples=20_000)
    # the launched run does the local run's work plus pulls/pushes through a server process
    assert cost.ps_sample_seconds > cost.local_sample_seconds > 0
    assert cost.row_seconds == pytest.approx(
        (cost.ps_sample_seconds - cost.local_sample_seconds) / cost.ids_per_sample, rel=1e-9
    )
    assert 1e-8 < cost.row_seconds < 1e-4, cost  # between 0.01 us and 100 us of CPU per row
    cached = _cached_files(tmp_path)
    assert len(cached) == 1 and json.load(open(cached[0]))["value"]["row_seconds"] == cost.row_seconds

    # second call: read from the cache, nothing launched
    def no_measure(**_):
        raise AssertionError("measured again although a cached figure exists")

    monkeypatch.setattr(ps_service, "measure", no_measure)
    assert ps_service.ps_row_cost(samples=20_000) == cost

    # a cache file from another format, or a corrupted one, is measured again, not trusted
    for bad in (json.dumps({"format": 0, "value": {"row_seconds": 1.0}}), "{truncated"):
        with open(cached[0], "w") as f:
            f.write(bad)
        monkeypatch.setattr(ps_service, "measure", lambda **_: cost)
        assert ps_service.ps_row_cost(samples=20_000) == cost


def test_probe_inside_a_launch_ignores_the_launch_environment(monkeypatch):
    # a planning process is itself a launched trainer: its launcher variables must not reach the probe's
    monkeypatch.setenv("PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:1")
    monkeypatch.setenv("TRAINING_ROLE", "TRAINER")
    from heterps_paddle.planning.launch import env_outside_the_launch

    env = env_outside_the_launch()
    assert "PADDLE_PSERVERS_IP_PORT_LIST" not in env and "TRAINING_ROLE" not in env
    assert env["PATH"] == os.environ["PATH"]


def test_a_probe_that_cannot_finish_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("HETERPS_CACHE", str(tmp_path))
    with pytest.raises(ps_service.ProbeFailed, match="took more than"):
        ps_service.measure(samples=2_000, timeout=0.01)
    with pytest.raises(ps_service.ProbeFailed):
        ps_service.ps_row_cost(samples=2_000, timeout=0.01)
    assert not _cached_files(tmp_path)  # nothing cached


def _small_job():
    import paddle

    from heterps_paddle.examples import build_net
    from heterps_paddle.examples.common import ModelConfig

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        model = build_net("ctr_dnn", ModelConfig(sparse_feature_dim=4, fc_sizes=(8,), embedding="local"))
    return model.loss, startup, paddle.optimizer.Adam(0.001)


def test_profile_adds_the_servers_cost_to_local_cpu_sparse_layers_only(monkeypatch):
    from heterps_paddle.program import job_profile

    cost = ps_service.PsServiceCost(
        row_seconds=2e-6,
        local_sample_seconds=1e-5,
        ps_sample_seconds=6.2e-5,
        ids_per_sample=26,
        dim=9,
        samples=1,
        paddle_version="x",
    )
    monkeypatch.setattr(job_profile, "ps_row_cost", lambda: cost)
    loss, startup, optimizer = _small_job()
    job = job_profile.measure_job(loss, startup, optimizer, 64, 0, ["local_cpu", "local_gpu"])
    assert job.ps_row_seconds == 2e-6 and job.ps_probe_error is None
    for layer in job.profile.layers:
        extra = layer.time["local_cpu"] - layer.time["local_gpu"]
        # ctr_dnn: 26 slots, one id per sample each, in one sparse layer
        assert extra == pytest.approx(26 * 2e-6 if layer.kind == "sparse" else 0.0, abs=1e-12), layer


def test_profile_goes_on_without_the_servers_cost_when_the_probe_fails(monkeypatch):
    from heterps_paddle.program import job_profile

    def broken():
        raise ps_service.ProbeFailed("parameter-server probe: timed out")

    monkeypatch.setattr(job_profile, "ps_row_cost", broken)
    loss, startup, optimizer = _small_job()
    job = job_profile.measure_job(loss, startup, optimizer, 64, 0, ["local_cpu", "local_gpu"])
    assert job.ps_row_seconds is None and "timed out" in job.ps_probe_error
    assert all(layer.time["local_cpu"] == layer.time["local_gpu"] for layer in job.profile.layers)
