"""A plain fleet parameter-server trainer for the example CTR models, in PaddleRec's static PS style
(config YAML, dataset, ``train_from_dataset``).  heterps-paddle is switched on by the import below and
``strategy.heterps = True`` (``--heterps``); nothing else in the script changes.

Run (1 server, 2 workers):

    python -m paddle.distributed.launch --server_num=1 --worker_num=2 \\
        examples/static_ps_trainer.py -m examples/ctr_dnn/config.yaml [--heterps]

Run without ``paddle.distributed.launch`` and it trains in this one process with a local table (the
learning reference).  Worker 0 prints the held-out AUC and the job's samples/s at the end, and, with
``--result-dir``, every worker writes its figures to ``worker-<i>.json`` there.
"""

import argparse
import json
import os
import sys
import time

import paddle
import paddle.distributed.fleet as fleet
import yaml

import heterps_paddle  # noqa: F401  (adds strategy.heterps / heterps_configs to fleet)
from heterps_paddle.data import dataset as data
from heterps_paddle.data.criteo import ReadReport
from heterps_paddle.examples import build_net
from heterps_paddle.examples.common import ModelConfig
from heterps_paddle.fleet.evaluation import accumulated_auc, forward_only_program, reset_auc

# run config key -> (type, must be positive); anything else in the file is an error.
RUN_KEYS = {
    "model": (str, False),
    "train_dir": (str, False),
    "test_dir": (str, False),
    "generate_rows": (int, True),
    "generate_seed": (int, False),
    "skip_malformed": (bool, False),
    "batch_size": (int, True),
    "epochs": (int, False),  # 0 only with init_model_path: evaluate the model the servers start from
    "thread_num": (int, True),
    # as PaddleRec's runner.split_file_list: each worker trains its share of the files (true, the default here), or
    # every worker all of them (false: PaddleRec's own default; a pass then trains each file once a worker)
    "split_file_list": (bool, False),
    "print_period": (int, True),
    "model_config": (dict, False),
    "seed": (int, False),
    "accumulate_steps": (int, True),
    "heterps": (dict, False),
    # as PaddleRec's runner.model_save_path / runner.init_model_path: the inference model is saved after every
    # epoch to <model_save_path>/<epoch>, a checkpoint of every table to <model_save_path>/checkpoint at the end;
    # the servers start from init_model_path (a checkpoint or a saved model)
    "model_save_path": (str, False),
    "init_model_path": (str, False),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--config", required=True, help="run config YAML (examples/<model>/config.yaml)")
    parser.add_argument(
        "-o",
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a run config key (value parsed as YAML), e.g. -o epochs=1",
    )
    parser.add_argument("--heterps", action="store_true", help="set strategy.heterps = True")
    parser.add_argument(
        "--heterps-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an entry of strategy.heterps_configs (value parsed as YAML)",
    )
    parser.add_argument("--result-dir", help="write this worker's figures as JSON here")
    parser.add_argument(
        "--eval-model",
        metavar="DIR",
        help="train nothing: load the inference model saved in DIR with Paddle's loaders (servers: "
        "fleet.init_server(DIR); worker: fleet.load_inference_model(DIR)) and print its held-out AUC",
    )
    return parser.parse_args(argv)


def _key_values(items, what):
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            sys.exit(f"{what}: expected KEY=VALUE, got {item!r}")
        out[key] = yaml.safe_load(value)
    return out


def load_run_config(path, overrides):
    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        sys.exit(f"cannot read run config {path}: {exc}")
    if not isinstance(config, dict):
        sys.exit(f"run config {path}: expected a mapping at the top level")
    config.update(_key_values(overrides, "-o"))
    for key, value in config.items():
        if key not in RUN_KEYS:
            sys.exit(f"run config {path}: unknown key {key!r}; allowed: {', '.join(sorted(RUN_KEYS))}")
        kind, positive = RUN_KEYS[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            sys.exit(f"run config {path}: {key} must be {kind.__name__}, got {value!r}")
        if positive and value <= 0:
            sys.exit(f"run config {path}: {key} must be positive, got {value!r}")
    if ("train_dir" in config) != ("test_dir" in config):
        sys.exit(f"run config {path}: give both train_dir and test_dir, or neither (generated data)")
    epochs = config.get("epochs", 1)
    if epochs < 0 or (epochs == 0 and "init_model_path" not in config):
        sys.exit(f"run config {path}: epochs must be positive (0 only with init_model_path), got {epochs!r}")
    return config


def data_files(config):
    """(train files, test files) in slot format: the configured directories or the generated set."""
    if "train_dir" not in config:
        generated = data.ensure_generated(int(config["generate_rows"]), int(config.get("generate_seed", 0)))
        return generated.train_files, generated.test_files

    def listing(directory):
        return sorted(os.path.join(directory, n) for n in os.listdir(directory) if not n.startswith("."))

    return listing(config["train_dir"]), listing(config["test_dir"])


def build_strategy(args, config):
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    strategy.a_sync_configs = {"launch_barrier": True}
    if "accumulate_steps" in config:
        # micro-batches in flight per stage when a plan splits the job (Paddle's heterogeneous pipeline)
        strategy.pipeline_configs = {"accumulate_steps": int(config["accumulate_steps"])}
    if args.heterps:
        # heterps-paddle: the one line a plain fleet script adds (plus the import), and its options
        strategy.heterps = True
        strategy.heterps_configs = {**config.get("heterps", {}), **_key_values(args.heterps_config, "--heterps-config")}
    else:
        load_in_saved_layout(strategy, args.eval_model or config.get("init_model_path"))
    return strategy


def load_in_saved_layout(strategy, start_dir):
    """A plain Paddle job (no strategy.heterps) starting from a model a heterps job saved: its servers must build
    each sparse table with the shard count it was saved in, which heterps_tables.json beside the save names (Paddle
    loads nothing from a directory of another count, with only a warning in the server's log).  A heterps job
    loads any count by itself."""
    layout_file = os.path.join(start_dir, "heterps_tables.json") if start_dir else ""
    if not os.path.isfile(layout_file):
        return
    with open(layout_file, encoding="utf-8") as f:
        tables = json.load(f)["tables"]
    for table in tables.values():
        entry = strategy.sparse_table_configs.add()
        entry.table_name = table["name"]
        entry.shard_num = int(table["shard_num"])


def report_malformed(report: ReadReport, what):
    if report.skipped:
        print(
            f"heterps: skipped {report.skipped} malformed line(s) of {what} ({dict(report.reasons)}); "
            f"first: {report.first_errors[:3]}",
            flush=True,
        )


def main(argv=None):
    args = parse_args(argv)
    config = load_run_config(args.config, args.override)
    paddle.enable_static()
    paddle.seed(int(config.get("seed", 0)))
    distributed = "TRAINING_ROLE" in os.environ  # set by paddle.distributed.launch
    model_config = ModelConfig.from_dict(
        {**config.get("model_config", {}), "embedding": "ps" if distributed else "local"}
    )
    model = build_net(config["model"], model_config)
    # One process holds the table locally: lazy Adam updates only the rows a batch touched, as the parameter
    # servers' sparse tables do (a dense Adam would move every row of the table at every step).
    optimizer = paddle.optimizer.Adam(learning_rate=model_config.learning_rate, lazy_mode=not distributed)

    if distributed:
        # fleet.barrier_worker() is a no-op without gloo.  The launcher provides gloo's rendezvous
        # settings but passes PADDLE_WITH_GLOO=0 unless told otherwise; 1 = barriers among trainers.
        if os.environ.get("PADDLE_WITH_GLOO", "0") == "0":
            os.environ["PADDLE_WITH_GLOO"] = "1"
        fleet.init()
        optimizer = fleet.distributed_optimizer(optimizer, build_strategy(args, config))
    optimizer.minimize(model.loss)

    if distributed and fleet.is_server():
        fleet.init_server(args.eval_model or config.get("init_model_path"))
        fleet.run_server()
        return
    if not distributed and (args.eval_model or "init_model_path" in config or "model_save_path" in config):
        sys.exit("--eval-model, init_model_path and model_save_path need a launched job (heterps launch ...)")

    worker_index = fleet.worker_index() if distributed else 0
    worker_num = fleet.worker_num() if distributed else 1
    main_program = paddle.static.default_main_program()
    test_program = forward_only_program(main_program)  # held-out evaluation: changes no parameter
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    if distributed:
        fleet.init_worker()
    if args.eval_model:
        fleet.load_inference_model(args.eval_model, mode=0)  # dense values into this process and the servers
    train_src, test_src = data_files(config)
    skip = bool(config.get("skip_malformed", False))
    mine = data.shard(train_src, worker_index, worker_num) if config.get("split_file_list", True) else list(train_src)
    train_files, train_report = data.prepare_multislot(mine, skip)
    report_malformed(train_report, "training data")
    batch_size = int(config["batch_size"])
    thread_num = int(config.get("thread_num", 1))
    train_set = data.make_dataset(model.feeds, train_files, batch_size, thread_num)

    scope = paddle.static.global_scope()
    epochs = 0 if args.eval_model else int(config.get("epochs", 1))
    save_path = config.get("model_save_path")
    train_seconds = 0.0
    epoch_ends = []  # wall time at each epoch's end: a steady-state rate excludes the first epoch's start-up
    train_start = time.time()
    for epoch in range(epochs):
        start = time.time()
        exe.train_from_dataset(
            program=main_program,
            dataset=train_set,
            fetch_list=[model.loss, model.auc],
            fetch_info=["loss", "auc"],
            print_period=int(config.get("print_period", 50)),
            debug=False,
        )
        seconds = time.time() - start
        train_seconds += seconds
        epoch_ends.append(time.time())
        print(
            f"worker {worker_index} epoch {epoch}: train auc {accumulated_auc(scope, model.auc_states):.4f} "
            f"{train_report.rows / seconds:.0f} samples/s",
            flush=True,
        )
        if save_path:
            # every worker calls (fleet's saves barrier among them); the first worker writes
            fleet.save_inference_model(
                exe, os.path.join(save_path, str(epoch)), [v.name for v in model.feeds[:-1]], [model.predict]
            )
            if worker_index == 0:
                print(f"worker 0 epoch {epoch}: inference model saved to {os.path.join(save_path, str(epoch))}")
    if save_path:
        fleet.save_persistables(exe, os.path.join(save_path, "checkpoint"))
        if worker_index == 0:
            print(f"worker 0: checkpoint of every table saved to {os.path.join(save_path, 'checkpoint')}")
    result = {
        "worker": worker_index,
        "workers": worker_num,
        "model": config["model"],
        "heterps": args.heterps,
        "meta_optimizers": fleet._get_applied_meta_list() if distributed else [],
        "rows": train_report.rows,
        "epochs": epochs,
        "train_seconds": train_seconds,
        "train_start": train_start,
        "train_end": time.time(),
        "epoch_ends": epoch_ends,
        "samples_per_second": train_report.rows * epochs / train_seconds if epochs else 0.0,
    }

    if distributed:
        fleet.barrier_worker()  # every worker has finished training before worker 0 evaluates
    if worker_index == 0:
        test_files, test_report = data.prepare_multislot(test_src, skip)
        report_malformed(test_report, "held-out data")
        reset_auc(scope, model.auc_states)
        test_set = data.make_dataset(model.feeds, test_files, batch_size, thread_num)
        exe.train_from_dataset(
            program=test_program,
            dataset=test_set,
            fetch_list=[model.auc],
            fetch_info=["auc"],
            print_period=10**9,
            debug=False,
        )
        result["test_auc"] = accumulated_auc(scope, model.auc_states)
        result["test_rows"] = test_report.rows
    if args.result_dir:
        os.makedirs(args.result_dir, exist_ok=True)
        with open(os.path.join(args.result_dir, f"worker-{worker_index}.json"), "w", encoding="utf-8") as f:
            json.dump(result, f)
    if distributed:
        fleet.barrier_worker()  # all result files written
    if worker_index == 0:
        total = result["samples_per_second"]
        if args.result_dir and worker_num > 1:
            total = sum(
                json.load(open(os.path.join(args.result_dir, f"worker-{i}.json")))["samples_per_second"]
                for i in range(worker_num)
            )
        print(
            f"RESULT model={config['model']} heterps={'on' if args.heterps else 'off'} workers={worker_num} "
            f"held-out AUC={result['test_auc']:.4f} (on {result['test_rows']} rows) "
            f"samples/s={total:.0f}"
            + ("" if args.result_dir or worker_num == 1 else " (worker 0 only; pass --result-dir for the total)"),
            flush=True,
        )
    if distributed:
        fleet.stop_worker()


if __name__ == "__main__":
    main()
