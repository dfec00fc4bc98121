"""The fleet script ``heterps bench data`` launches with one trainer to time a ``train_from_dataset`` call: the files
of ``--data`` trained in one call and in one call per file, three times each way, the times written to ``--out`` as JSON.
Run as a file by Paddle's launcher: ``python data_calls_job.py --data D --batch B --out O``."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Sequence


def train(argv: Sequence[str]) -> int:
    from heterps_paddle.tools.bench.bench_job import ctr_dnn_under_fleet, no_shadowing

    no_shadowing()
    args = dict(zip(argv[::2], argv[1::2]))
    import paddle
    import paddle.distributed.fleet as fleet

    from heterps_paddle.data import dataset as data

    started = ctr_dnn_under_fleet(None)  # heterps off: Paddle's own call, timed
    if started is None:
        return 0
    model, exe = started
    program = paddle.static.default_main_program()
    where = args["--data"]
    files, report = data.prepare_multislot(sorted(os.path.join(where, n) for n in os.listdir(where)))
    dataset = data.make_dataset(model.feeds, files, int(args["--batch"]))

    def call(paths: list[str]) -> float:
        dataset.set_filelist(paths)
        start = time.perf_counter()
        exe.train_from_dataset(program=program, dataset=dataset, print_period=10**9)
        return time.perf_counter() - start

    call(files[:1])  # the first call's start-up out of the figures
    one, each = [], []
    for _ in range(3):
        one.append(call(files))
        each.append(sum(call([f]) for f in files))
    with open(args["--out"], "w", encoding="utf-8") as f:
        json.dump({"files": len(files), "rows": report.rows, "one_call_s": one, "call_per_file_s": each}, f)
    fleet.stop_worker()
    return 0


if __name__ == "__main__":
    sys.exit(train(sys.argv[1:]))
