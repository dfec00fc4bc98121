"""``heterps bench data``'s figures from a job's records (pure), and its refusal of bad sizes before any work."""

import pytest

from heterps_paddle.tools.bench import data
from heterps_paddle.tools.cli import build_parser


def rates(*points):
    return [{"type": "rates", "round": 0, "t": t, "samples": n, "samples_per_s": s} for t, n, s in points]


def test_the_rate_runs_from_the_slowing_or_the_first_window_to_the_last_sample_trained():
    records = rates((0, 0, 0.0), (10, 1000, 100.0), (20, 3000, 200.0), (30, 5000, 200.0), (40, 5000, 0.0))
    assert data.rate_since(records, None) == pytest.approx(4000 / 20)  # from t=10 to t=30, not to the job's end
    assert data.rate_since(records, 15.0) == pytest.approx(2000 / 10)  # from the first record at the slowing
    assert data.rate_since(records[:1], None) is None
    assert data.rate_since([{"type": "rates", "round": 1, "t": 1, "samples": 9}], None) is None


def test_bad_sizes_are_refused_before_any_work():
    args = build_parser().parse_args(["bench", "data", "--passes", "0"])
    with pytest.raises(data.HeterPSError, match="--passes must be >= 1"):
        data.run(args)


def test_a_calls_cost_comes_from_the_measurement_with_the_most_calls():
    calls = [
        {"files": "generated", "calls": 8, "one_call_s": 20.0, "cost_of_a_call_s": -0.3},  # under the noise
        {"files": "tenth", "calls": 80, "one_call_s": 16.0, "cost_of_a_call_s": 0.12},
    ]
    summary = data.call_summary(calls)
    assert summary["cost_s"] == 0.12 and summary["measured_with"] == "tenth"
    assert summary["share_of_a_file"] == {"generated": pytest.approx(0.048), "tenth": pytest.approx(0.6)}
