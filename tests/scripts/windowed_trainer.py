"""A fleet trainer whose epochs read different data (tests/test_incremental_checkpoints.py): epoch e trains on the
training files ``e*k .. e*k+k-1`` (mod their count; each worker its share), as a job training day after day does, so
a pass pushes only part of the sparse table's rows.  ``--save-dir``: a full ``fleet.save_persistables`` (mode 0)
after the last epoch, the reference a checkpoint of that pass must equal.

    heterps launch ... tests/scripts/windowed_trainer.py --data DIR --plan P --epochs N [--files-per-epoch K]
        [--save-dir DIR]
"""

import argparse
import os
import time

import paddle
import paddle.distributed.fleet as fleet

import heterps_paddle  # noqa: F401
from heterps_paddle.data import dataset as data
from heterps_paddle.data.generator import load_meta
from heterps_paddle.examples import build_net
from heterps_paddle.examples.common import ModelConfig


def main(args):
    os.environ.setdefault("PADDLE_WITH_GLOO", "1")  # as PaddleRec's trainers (tests/scripts/paddlerec_style_trainer.py)
    fleet.init()
    paddle.seed(args.seed)
    model = build_net(
        "ctr_dnn", ModelConfig(sparse_feature_dim=9, fc_sizes=(32, 32), embedding="ps", learning_rate=0.003)
    )
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    strategy.heterps = True
    strategy.heterps_configs = {"plan": args.plan}
    fleet.distributed_optimizer(paddle.optimizer.Adam(0.003), strategy).minimize(model.loss)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    fleet.init_worker()
    files = list(load_meta(args.data).train_files)
    for epoch in range(args.epochs):
        start = time.time()
        window = [files[(epoch * args.files_per_epoch + i) % len(files)] for i in range(args.files_per_epoch)]
        mine, _ = data.prepare_multislot(data.shard(window, fleet.worker_index(), fleet.worker_num()))
        dataset = data.make_dataset(model.feeds, mine, 128, thread_num=1)
        exe.train_from_dataset(program=paddle.static.default_main_program(), dataset=dataset, print_period=10**9)
        print(f"Epoch {epoch} done, use time: {time.time() - start:.1f}", flush=True)
    if args.save_dir and fleet.is_first_worker():
        fleet.save_persistables(exe, args.save_dir)
    fleet.barrier_worker()
    fleet.stop_worker()
    print("Run Success, Exit.", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--plan", required=True)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--files-per-epoch", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--save-dir")
    paddle.enable_static()
    main(parser.parse_args())
