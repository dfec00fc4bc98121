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
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]  # bench/*.py must not shadow modules
    args = dict(zip(argv[::2], argv[1::2]))
    import paddle
    import paddle.distributed.fleet as fleet

    from heterps_paddle.data import dataset as data
    from heterps_paddle.examples import build_net
    from heterps_paddle.examples.common import ModelConfig

    os.environ.setdefault("PADDLE_WITH_GLOO", "1")
    paddle.enable_static()
    fleet.init()
    paddle.seed(7)
    model = build_net("ctr_dnn", ModelConfig(sparse_feature_dim=9, fc_sizes=(64, 64), embedding="ps"))
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    fleet.distributed_optimizer(paddle.optimizer.Adam(0.003), strategy).minimize(model.loss)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return 0
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    fleet.init_worker()
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
