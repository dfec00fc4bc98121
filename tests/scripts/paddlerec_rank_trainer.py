"""PaddleRec's static PS trainer (``tools/static_ps_trainer.py`` at 656326ad) for its rank models, as a team runs
it, with heterps-paddle switched on: the import and ``strategy.heterps = True`` (with a saved plan or a cluster).
Written here after PaddleRec's flow, not copied (its ``tools/utils`` need ``six``, which this project does not
install): ``run()`` branches only on ``fleet.is_server()`` / ``fleet.is_worker()``; the model is the folder's
unchanged ``StaticModel`` (``create_feeds``, ``net``, ``create_optimizer(strategy)``); the worker sets
``_fleet_opt['stat_var_names']``, runs one ``train_from_dataset`` of a ``QueueDataset`` per epoch fetching the
model's own metrics, reads the global AUC from the scope with ``use_auc`` (PaddleRec's ``get_global_auc``: summed
over the workers) and zeroes the AUC states, and saves the inference model after every epoch
(``fleet.save_inference_model`` to ``<save-dir>/<epoch>``, the model's ``inference_target_var``).

    heterps launch ... tests/scripts/paddlerec_rank_trainer.py -m tests/data/paddlerec_models/dlrm/config_cpups.yaml
        --data GENERATED_DIR --out DIR [--plan P | --cluster C] [--save-dir DIR] [--epochs N]
    ... --print-layers: print the program's layers (what a plan names) as JSON and exit (no launch)
"""

import argparse
import json
import os
import time

import numpy as np
import paddle
import paddle.distributed.fleet as fleet
from paddlerec_models_common import convert, load_config, static_model

import heterps_paddle  # noqa: F401  (adds strategy.heterps / heterps_configs to fleet)


class Main:
    def __init__(self, args):
        self.args = args
        self.config = load_config(args.config)
        self.model = None
        self.epoch_aucs = []

    def run(self):
        os.environ.setdefault("PADDLE_WITH_GLOO", "1")  # PaddleRec's trainers start fleet with gloo
        fleet.init()
        self.network()
        if fleet.is_server():
            fleet.init_server()
            fleet.run_server()
        elif fleet.is_worker():
            self.run_worker()
            fleet.stop_worker()
            self.record_result()
        print("Run Success, Exit.", flush=True)

    def network(self):
        paddle.seed(self.args.seed)
        self.model = static_model(self.config)
        self.input_data = self.model.create_feeds()
        self.inference_feed_var = self.model.create_feeds(is_infer=False)
        self.metrics = self.model.net(self.input_data)
        self.inference_target_var = self.model.inference_target_var
        self.model.create_optimizer(self.strategy())

    def strategy(self):
        strategy = fleet.DistributedStrategy()
        strategy.a_sync = True  # runner.sync_mode: async
        # PaddleRec's get_strategy: the config's table_parameters.<table>.* keys, by table
        tables = {}
        for key, value in self.config.items():
            if key.startswith("table_parameters."):
                tables.setdefault(key.split(".")[1], {})[key] = value
        if tables:
            strategy.sparse_table_configs = tables
        if self.args.plan or self.args.cluster:
            strategy.heterps = True  # heterps-paddle: the one line the script adds
            strategy.heterps_configs = {"plan": self.args.plan} if self.args.plan else {"cluster": self.args.cluster}
        return strategy

    def run_worker(self):
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(paddle.static.default_startup_program())
        fleet.init_worker()
        use_auc = bool(self.config.get("runner.use_auc", False))
        opt_info = paddle.static.default_main_program()._fleet_opt
        opt_info["stat_var_names"] = [self.model.stat_pos.name, self.model.stat_neg.name] if use_auc else []
        with open(os.path.join(self.args.data, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
        files = sorted(meta["train_files"])
        if self.config.get("runner.split_file_list"):
            files = files[fleet.worker_index() :: fleet.worker_num()]  # fleet.util.get_file_shard's share
        converted = convert(files, os.path.join(self.args.out, f"multislot-{fleet.worker_index()}"))
        dataset = paddle.distributed.QueueDataset()
        dataset.init(
            use_var=self.input_data,
            pipe_command="cat",
            batch_size=int(self.config["runner.train_batch_size"]),
            thread_num=int(self.config.get("runner.thread_num", 1)),
        )
        dataset.set_filelist(converted)
        scope = paddle.static.global_scope()
        epochs = self.args.epochs or int(self.config["runner.epochs"])
        for epoch in range(epochs):
            start = time.time()
            exe.train_from_dataset(
                program=paddle.static.default_main_program(),
                dataset=dataset,
                fetch_list=list(self.metrics.values()),
                fetch_info=[f"Epoch {epoch} Var {name}" for name in self.metrics],
                print_period=int(self.config.get("runner.print_interval", 50)),
                debug=False,
            )
            print(f"Epoch {epoch} done, use time: {time.time() - start:.1f}", flush=True)
            if use_auc:
                auc = global_auc(scope, self.model.stat_pos.name, self.model.stat_neg.name)
                self.epoch_aucs.append(auc)
                print(f"Epoch {epoch} global auc: {auc:.6f}", flush=True)
                for state in (
                    self.model.stat_pos,
                    self.model.stat_neg,
                    self.model.batch_stat_pos,
                    self.model.batch_stat_neg,
                ):
                    set_zero(scope, state.name)
            if self.args.save_dir:
                fleet.save_inference_model(
                    exe,
                    os.path.join(self.args.save_dir, str(epoch)),
                    [feed.name for feed in self.inference_feed_var],
                    self.inference_target_var,
                )
        self.epochs = epochs

    def record_result(self):
        os.makedirs(self.args.out, exist_ok=True)
        with open(os.path.join(self.args.out, f"worker-{fleet.worker_index()}.json"), "w", encoding="utf-8") as f:
            json.dump({"worker": fleet.worker_index(), "epochs": self.epochs, "epoch_aucs": self.epoch_aucs}, f)


def global_auc(scope, stat_pos_name, stat_neg_name):
    """PaddleRec's get_global_auc: the AUC of the histograms summed over the workers."""
    fleet.barrier_worker()
    pos = np.array(fleet.util.all_reduce(np.array(scope.find_var(stat_pos_name).get_tensor()).reshape(-1)))
    neg = np.array(fleet.util.all_reduce(np.array(scope.find_var(stat_neg_name).get_tensor()).reshape(-1)))
    area, total_pos, total_neg = 0.0, 0.0, 0.0
    for i in reversed(range(len(pos))):
        new_pos, new_neg = total_pos + pos[i], total_neg + neg[i]
        area += (new_neg - total_neg) * (total_pos + new_pos) / 2
        total_pos, total_neg = new_pos, new_neg
    return 0.5 if total_pos * total_neg == 0 else area / total_pos / total_neg


def set_zero(scope, name):
    """PaddleRec's metric_helper.set_zero: the state's tensor, zeroed in its own shape."""
    tensor = scope.find_var(name).get_tensor()
    value = np.array(tensor)
    tensor.set(np.zeros(value.shape, dtype=value.dtype), paddle.CPUPlace())


def print_layers(args):
    """The program's layers as the planner groups them (what a plan's stages name), with no launch."""
    from heterps_paddle.program.profiler import group_layers

    config = load_config(args.config)
    model = static_model(config)
    model.net(model.create_feeds())
    layers, _ = group_layers(paddle.static.default_main_program())
    print(json.dumps([{"name": layer.name, "kind": layer.kind} for layer in layers]), flush=True)


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("-m", "--config", required=True, help="the model folder's PaddleRec config (config_cpups.yaml)")
    parser.add_argument("--data", help="a generated data set's directory (heterps gen-data)")
    parser.add_argument("--out", help="result files and the converted data go here")
    parser.add_argument("--plan", help="heterps_configs plan: a saved plan")
    parser.add_argument("--cluster", help="heterps_configs cluster: plan within the job")
    parser.add_argument("--save-dir", help="save the inference model after every epoch (runner.model_save_path)")
    parser.add_argument("--epochs", type=int, help="instead of runner.epochs")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--print-layers", action="store_true")
    return parser.parse_args()


if __name__ == "__main__":
    paddle.enable_static()
    arguments = parse_args()
    if arguments.print_layers:
        print_layers(arguments)
    else:
        Main(arguments).run()
