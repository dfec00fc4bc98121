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
