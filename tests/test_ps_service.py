"""The parameter-server probe: a real 1 server + 1 trainer launch against a local-table run of the same
model, and its per-machine cache."""

import json
import os

import pytest

pytest.importorskip("paddle")

from heterps_paddle import ps_service  # noqa: E402


def test_probe_measures_server_work_and_caches_it(tmp_path, monkeypatch):
    cost = ps_service.ps_row_cost(str(tmp_path), samples=20_000)
    # the launched run does the local run's work plus pulls/pushes through a server process
    assert cost.ps_sample_seconds > cost.local_sample_seconds > 0
    assert cost.row_seconds == pytest.approx(
        (cost.ps_sample_seconds - cost.local_sample_seconds) / cost.ids_per_sample, rel=1e-9)
    assert 1e-8 < cost.row_seconds < 1e-4, cost  # between 0.01 us and 100 us of CPU per row
    cached = [n for n in os.listdir(tmp_path) if n.startswith("ps_service-")]
    assert len(cached) == 1 and json.load(open(tmp_path / cached[0]))["row_seconds"] == cost.row_seconds

    # second call: read from the cache, nothing launched
    def no_measure(**_):
        raise AssertionError("measured again although a cached figure exists")

    monkeypatch.setattr(ps_service, "measure", no_measure)
    assert ps_service.ps_row_cost(str(tmp_path)) == cost

    # a cache file from another format is measured again, not trusted
    (tmp_path / cached[0]).write_text(json.dumps({"format": 0, "row_seconds": 1.0}))
    monkeypatch.setattr(ps_service, "measure", lambda **_: cost)
    assert ps_service.ps_row_cost(str(tmp_path)) == cost


def test_probe_inside_a_launch_ignores_the_launch_environment(monkeypatch):
    # a planning process is itself a launched trainer: its launcher variables must not reach the probe's
    monkeypatch.setenv("PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:1")
    monkeypatch.setenv("TRAINING_ROLE", "TRAINER")
    env = ps_service._clean_env()
    assert "PADDLE_PSERVERS_IP_PORT_LIST" not in env and "TRAINING_ROLE" not in env
    assert env["PATH"] == os.environ["PATH"]
