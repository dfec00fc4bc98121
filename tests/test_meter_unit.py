"""A stage 1 CPU trainer's sample count (runtime/meter.py) over a pulled pass's calls, on a split plan's even
shares: each trainer's count, and so the job's, only grows, and ends at the lines each trained."""

from __future__ import annotations

from types import SimpleNamespace

from heterps_paddle.runtime import meter as meter_mod
from heterps_paddle.runtime.meter import Meter


def data_file(path, lines):
    path.write_text("".join(f"1 {i}:1\n" for i in range(lines)))
    return str(path)


class LastStage:
    """The last stage's accumulating AUC count, which every trainer feeds; each trainer reads an even share."""

    def __init__(self):
        self.total = 0

    def share_of(self, index, trainers=2):
        return lambda: (self.total + index) // trainers


def call_on(files):
    return SimpleNamespace(dataset=SimpleNamespace(filelist=list(files)))


def test_uneven_pulled_shares_never_run_the_job_count_back(tmp_path):
    files = [data_file(tmp_path / f"part-{n}", 1000) for n in range(4)]
    stage = LastStage()
    fast, slow = (Meter(1, "trainer", i, board=None, every_s=60.0) for i in range(2))
    for index, m in enumerate((fast, slow)):
        m.count, m.in_pass = stage.share_of(index), True

    seen = []

    def job_count():
        seen.append(sum(m.record()["samples"] for m in (fast, slow)))

    # the slow trainer trains one file while the fast one trains three, one call each, side by side
    slow_call = slow.call_hook(call_on(files[3:]))
    slow_call.__enter__()
    slow_trained = 0
    for path in files[:3]:
        with fast.call_hook(call_on([path])):
            for _ in range(10):
                stage.total += 100  # the fast trainer's 100 samples
                if slow_trained < 1000 and len(seen) % 3 == 0:
                    stage.total += 25  # the slow one's
                    slow_trained += 25
                job_count()
        job_count()
    while slow_trained < 1000:
        stage.total += 25
        slow_trained += 25
        job_count()
    slow_call.__exit__(None, None, None)
    job_count()

    assert seen == sorted(seen), seen
    assert seen[-1] == 4000 == stage.total
    assert fast.done_in_pass == 3000 and slow.done_in_pass == 1000
    # the even share ran ahead of the slow trainer's work, up to its call's lines and no further
    assert max(seen) == 4000


def test_a_call_without_a_count_shows_at_its_end_and_an_evaluation_is_not_counted(tmp_path):
    path = data_file(tmp_path / "part-0", 300)
    m = Meter(1, "trainer", 0, board=None, every_s=60.0)
    with m.call_hook(call_on([path])):  # no training pass runs: an evaluation's call
        pass
    assert m.record()["samples"] == 0
    m.in_pass = True
    with m.call_hook(call_on([path])):
        assert m.record()["samples"] == 0
    assert m.record()["samples"] == 300
    assert meter_mod.dataset_samples(call_on([path]).dataset) == 300
