"""The fleet script the elastic and adapt benchmarks launch on each host (``heterps bench elastic``, ``heterps bench
adapt``): a plain fleet script but for ``strategy.heterps``, which prints each pass's start with the wall clock for
the benchmark.  Run as a file by Paddle's launcher: ``python bench_job.py --passes N --batch B --data D --cluster C
--out O``."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Sequence


def ctr_dnn_under_fleet(heterps_configs: dict[str, Any] | None) -> tuple[Any, Any] | None:
    """The benchmarks' CTR-DNN under fleet (parameter servers, asynchronous), ``strategy.heterps`` on with
    ``heterps_configs`` (None: off).  A server serves and gets None; a trainer gets (the model, its executor) once
    its worker is up."""
    import paddle
    import paddle.distributed.fleet as fleet

    from heterps_paddle.examples import build_net
    from heterps_paddle.examples.common import ModelConfig

    os.environ.setdefault("PADDLE_WITH_GLOO", "1")
    paddle.enable_static()
    fleet.init()
    paddle.seed(7)
    model = build_net("ctr_dnn", ModelConfig(sparse_feature_dim=9, fc_sizes=(64, 64), embedding="ps"))
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    if heterps_configs is not None:
        strategy.heterps, strategy.heterps_configs = True, heterps_configs
    fleet.distributed_optimizer(paddle.optimizer.Adam(0.003), strategy).minimize(model.loss)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return None
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    fleet.init_worker()
    return model, exe


def convert_passes(data_dir: str) -> None:
    """Every ``DATA/pass-k/train`` file converted to MultiSlot into the jobs' cache (``HETERPS_CACHE``), as each
    trainer converts its share when its pass starts: a benchmark does it before its measured jobs (launched.py)."""
    from heterps_paddle.data import dataset as data

    for name in sorted(os.listdir(data_dir)):
        where = os.path.join(data_dir, name, "train")
        if os.path.isdir(where):
            data.prepare_multislot(sorted(os.path.join(where, n) for n in os.listdir(where)))


def no_shadowing() -> None:
    """This directory off ``sys.path``: its scripts run as files, and bench/*.py must not shadow modules."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]


def train(argv: Sequence[str]) -> int:
    """The fleet script each host's launch runs (``Job``): pass k reads ``DATA/pass-k/train``; a plain fleet script
    but for ``strategy.heterps``, which prints each pass's start with the wall clock for the benchmark."""
    no_shadowing()
    args = dict(zip(argv[::2], argv[1::2]))  # --passes N --batch B --data D --cluster C --out O, from Job
    import paddle
    import paddle.distributed.fleet as fleet

    from heterps_paddle.data import dataset as data

    started = ctr_dnn_under_fleet({"cluster": args["--cluster"], "output_dir": args["--out"]})
    if started is None:
        return 0
    model, exe = started
    program, index, count = paddle.static.default_main_program(), fleet.worker_index(), fleet.worker_num()
    for k in range(1, int(args["--passes"]) + 1):
        where = os.path.join(args["--data"], f"pass-{k:03d}", "train")
        files, _ = data.prepare_multislot(
            data.shard(sorted(os.path.join(where, n) for n in os.listdir(where)), index, count)
        )
        dataset = data.make_dataset(model.feeds, files, int(args["--batch"]))
        print(f"elastic-bench: pass {k} starts at {time.time():.3f}", flush=True)
        exe.train_from_dataset(
            program=program, dataset=dataset, fetch_list=[model.loss], fetch_info=["loss"], print_period=1
        )
    fleet.stop_worker()
    return 0


if __name__ == "__main__":
    sys.exit(train(sys.argv[1:]))
