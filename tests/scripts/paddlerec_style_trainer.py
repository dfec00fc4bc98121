"""A fleet trainer written the way PaddleRec's ``tools/static_ps_trainer.py`` is, for the tests: ``run()`` branches
only on ``fleet.is_server()`` / ``fleet.is_worker()``, the worker sets
``default_main_program()._fleet_opt['stat_var_names']`` and calls ``train_from_dataset`` once per epoch, prints the
fetched loss and AUC as it goes, and writes a result file.  Nothing in it knows about sections or heterogeneous
trainers: heterps-paddle is the import and ``strategy.heterps = True`` (with a saved plan or a cluster).

    heterps launch ... tests/scripts/paddlerec_style_trainer.py --data DIR --out DIR [--plan P | --cluster C]
        [--save-dir DIR] [--init-model DIR] [--threads N] [--in-memory]
"""

import argparse
import json
import os
import time

import numpy as np
import paddle
import paddle.distributed.fleet as fleet

import heterps_paddle  # noqa: F401
from heterps_paddle.data import dataset as data
from heterps_paddle.data.generator import load_meta
from heterps_paddle.examples import build_net
from heterps_paddle.examples.common import ModelConfig
from heterps_paddle.fleet.evaluation import accumulated_auc, forward_only_program, reset_auc


class Main:
    def __init__(self, args):
        self.args = args
        self.model = None
        self.rows = 0
        self.test_auc = None

    def run(self):
        # PaddleRec's trainers start fleet with gloo, for barriers among the workers
        os.environ.setdefault("PADDLE_WITH_GLOO", "1")
        fleet.init()
        self.network()
        if fleet.is_server():
            self.run_server()
        elif fleet.is_worker():
            self.run_worker()
            fleet.stop_worker()
            self.record_result()
        print("Run Success, Exit.", flush=True)

    def network(self):
        paddle.seed(self.args.seed)
        config = ModelConfig(
            sparse_feature_dim=9, fc_sizes=tuple(self.args.fc), embedding="ps", learning_rate=self.args.lr
        )
        self.model = build_net("ctr_dnn", config)
        strategy = fleet.DistributedStrategy()
        strategy.a_sync = True
        if self.args.plan or self.args.cluster:
            strategy.heterps = True
            if self.args.plan:
                strategy.heterps_configs = {"plan": self.args.plan}
            else:
                # as a user's script opts in: the cluster, and output_dir only when asked (default: heterps_plan/)
                configs = {"cluster": self.args.cluster, "replan": self.args.replan}
                if self.args.output_dir:
                    configs["output_dir"] = self.args.output_dir
                if self.args.throughput is not None:
                    configs["throughput"] = self.args.throughput  # an int, as a user writes it
                if self.args.budget is not None:
                    configs["budget"] = self.args.budget
                strategy.heterps_configs = configs
        optimizer = fleet.distributed_optimizer(paddle.optimizer.Adam(self.args.lr), strategy)
        optimizer.minimize(self.model.loss)

    def run_server(self):
        # PaddleRec: fleet.init_server(config.get("runner.warmup_model_path")): the sparse tables of a saved model
        fleet.init_server(self.args.init_model)
        fleet.run_server()

    def run_worker(self):
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(paddle.static.default_startup_program())
        fleet.init_worker()
        meta = load_meta(self.args.data)
        mine = data.shard(list(meta.train_files), fleet.worker_index(), fleet.worker_num())
        files, report = data.prepare_multislot(mine)
        self.rows = report.rows
        dataset = data.make_dataset(
            self.model.feeds, files, self.args.batch, thread_num=self.args.threads, in_memory=self.args.in_memory
        )
        for epoch in range(self.args.epochs):
            start = time.time()
            stat_pos, stat_neg = self.model.auc_states[-2:]
            paddle.static.default_main_program()._fleet_opt["stat_var_names"] = [stat_pos.name, stat_neg.name]
            exe.train_from_dataset(
                program=paddle.static.default_main_program(),
                dataset=dataset,
                fetch_list=[self.model.loss, self.model.auc],
                fetch_info=[f"Epoch {epoch} Var loss", f"Epoch {epoch} Var auc"],
                print_period=self.args.print_period,
                debug=False,
            )
            print(f"Epoch {epoch} done, use time: {time.time() - start:.1f}", flush=True)
            # PaddleRec's metric_helper: the epoch's AUC from the AUC states in the scope, summed over the workers
            # (fleet.util.all_reduce), then the states set to zero for the next epoch
            auc = global_auc(paddle.static.global_scope(), stat_pos.name, stat_neg.name)
            print(f"Epoch {epoch} global auc: {auc:.6f}", flush=True)
            for state in self.model.auc_states:
                set_zero(paddle.static.global_scope(), state.name)
            if self.args.save_dir and fleet.is_first_worker():
                # as PaddleRec's trainer saves after every epoch (runner.model_save_path)
                fleet.save_inference_model(
                    exe, f"{self.args.save_dir}/{epoch}", [v.name for v in self.model.feeds[:-1]], [self.model.predict]
                )
        if self.args.save_dir and fleet.is_first_worker():
            fleet.save_persistables(exe, f"{self.args.save_dir}/checkpoint")
            self.reference_predictions(exe, meta)
        fleet.barrier_worker()
        if fleet.worker_index() == 0:
            self.test_auc = self.evaluate(exe, meta)

    def reference_predictions(self, exe, meta, rows=256):
        """The servers' model's predictions on the first held-out rows, right after the last save: what the saved
        model must predict when a serving job loads it (tests/scripts/serve_saved_model.py)."""
        from heterps_paddle.data.criteo import read_all

        samples, _ = read_all(list(meta.test_files))
        samples = samples[:rows]
        feed = {self.model.feeds[0].name: np.array([s.dense for s in samples], dtype="float32")}
        for slot, var in enumerate(self.model.feeds[1:-1]):
            ids = [s.sparse[slot] for s in samples]
            flat = np.array([i for row in ids for i in row], dtype="int64").reshape(-1, 1)
            feed[var.name] = paddle.base.create_lod_tensor(flat, [[len(row) for row in ids]], paddle.CPUPlace())
        feed[self.model.feeds[-1].name] = np.array([[s.label] for s in samples], dtype="int64")
        program = forward_only_program(paddle.static.default_main_program())
        (predict,) = exe.run(program, feed=feed, fetch_list=[self.model.predict.name])
        arrays = {"predict": np.array(predict), "label": feed[self.model.feeds[-1].name]}
        arrays["dense"] = feed[self.model.feeds[0].name]
        for slot, var in enumerate(self.model.feeds[1:-1]):
            arrays[f"ids_{var.name}"] = np.array([i for s in samples for i in s.sparse[slot]], dtype="int64")
            arrays[f"len_{var.name}"] = np.array([len(s.sparse[slot]) for s in samples], dtype="int64")
        np.savez(os.path.join(self.args.save_dir, "reference.npz"), **arrays)

    def evaluate(self, exe, meta):
        """Held-out AUC of the servers' model (the measure the tests compare)."""
        program = forward_only_program(paddle.static.default_main_program())
        files, _ = data.prepare_multislot(list(meta.test_files))
        scope = paddle.static.global_scope()
        reset_auc(scope, self.model.auc_states)
        exe.train_from_dataset(
            program=program,
            # the training pass's thread count: Paddle 2.6.2 sizes one process-wide trainer thread pool by the
            # first dataset a process trains on, and a later one with another thread_num aborts the trainer
            dataset=data.make_dataset(self.model.feeds, files, self.args.batch, thread_num=self.args.threads),
            fetch_list=[self.model.auc],
            fetch_info=["test auc"],
            print_period=10**9,
        )
        auc = accumulated_auc(scope, self.model.auc_states)
        print(f"held-out AUC {auc:.4f}", flush=True)
        return auc

    def record_result(self):
        os.makedirs(self.args.out, exist_ok=True)
        with open(os.path.join(self.args.out, f"worker-{fleet.worker_index()}.json"), "w") as f:
            json.dump(
                {
                    "worker": fleet.worker_index(),
                    "rows": self.rows,
                    "epochs": self.args.epochs,
                    "test_auc": self.test_auc,
                },
                f,
            )


def global_auc(scope, stat_pos_name, stat_neg_name):
    """PaddleRec's get_global_auc: AUC of the positive / negative histograms, summed over the workers."""
    pos = np.array(scope.find_var(stat_pos_name).get_tensor()).reshape(-1).astype("int64")
    neg = np.array(scope.find_var(stat_neg_name).get_tensor()).reshape(-1).astype("int64")
    pos = np.array(fleet.util.all_reduce(pos, "sum")).reshape(-1)
    neg = np.array(fleet.util.all_reduce(neg, "sum")).reshape(-1)
    area, total_pos, total_neg = 0.0, 0.0, 0.0
    for i in reversed(range(len(pos))):
        new_pos, new_neg = total_pos + pos[i], total_neg + neg[i]
        area += (new_neg - total_neg) * (total_pos + new_pos) / 2
        total_pos, total_neg = new_pos, new_neg
    return 0.5 if total_pos * total_neg == 0 else area / total_pos / total_neg


def set_zero(scope, name):
    tensor = scope.find_var(name).get_tensor()
    tensor.set(np.zeros(np.array(tensor).shape, dtype=np.array(tensor).dtype), paddle.CPUPlace())


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--plan")
    parser.add_argument("--output-dir", help="heterps_configs['output_dir'] (default: not set, so heterps_plan/)")
    parser.add_argument("--cluster")
    parser.add_argument("--replan", action="store_true", help="heterps_configs replan: measure and plan again")
    parser.add_argument("--throughput", type=int, help="heterps_configs throughput: a target in samples/s")
    parser.add_argument("--budget", type=float, help="heterps_configs budget: a price per hour to stay within")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--fc", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--print_period", type=int, default=20)
    parser.add_argument("--save-dir", help="save the inference model after every epoch, a checkpoint at the end")
    parser.add_argument("--init-model", help="a saved model or checkpoint the servers start from")
    parser.add_argument(
        "--threads", type=int, default=1, help="the dataset's thread_num (PaddleRec: runner.thread_num)"
    )
    parser.add_argument("--in-memory", action="store_true", help="an InMemoryDataset instead of a QueueDataset")
    return parser.parse_args()


if __name__ == "__main__":
    paddle.enable_static()
    Main(parse_args()).run()
