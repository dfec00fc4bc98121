"""What the PaddleRec model scripts share (tests/scripts/paddlerec_rank_trainer.py, paddlerec_rank_eval.py), with
Paddle alone (the evaluation must not import heterps_paddle): PaddleRec's config as its ``YamlHelper`` reads it
(nested keys joined with dots), a model folder's ``StaticModel`` (as PaddleRec's ``get_model`` imports it), the
generated slot-format files in the models' feed order (label, the 26 sparse slots, the dense vector) as MultiSlot
text for a ``QueueDataset`` with ``cat``, and the rank AUC of predictions."""

import os
import sys

import numpy as np
import yaml

NUM_SPARSE, NUM_DENSE = 26, 13


def load_config(path):
    """PaddleRec's flattened config: ``hyper_parameters.optimizer.learning_rate`` etc., plus ``config_abs_dir``."""
    with open(path, encoding="utf-8") as f:
        nested = yaml.safe_load(f)
    flat = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            flat[prefix] = value

    walk("", nested)
    flat["config_abs_dir"] = os.path.dirname(os.path.abspath(path))
    return flat


def static_model(config):
    """The model folder's StaticModel, imported the way PaddleRec's program_helper.get_model does."""
    sys.path.insert(0, config["config_abs_dir"])
    from static_model import StaticModel

    return StaticModel(config)


def multislot_line(line):
    """One slot-format line (``click:L dense_feature:x (13) 1:id ... 26:id``) in the models' feed order."""
    label, dense, sparse = None, [], {}
    for item in line.split():
        key, _, value = item.partition(":")
        if key == "click":
            label = int(value)
        elif key == "dense_feature":
            dense.append(value)
        else:
            sparse[int(key)] = value
    if label is None or len(dense) != NUM_DENSE or sorted(sparse) != list(range(1, NUM_SPARSE + 1)):
        raise ValueError(f"not a slot-format line with one id a slot: {line[:200]!r}")
    parts = ["1", str(label)]
    for slot in range(1, NUM_SPARSE + 1):
        parts += ["1", sparse[slot]]
    parts += [str(NUM_DENSE), *dense]
    return " ".join(parts)


def convert(files, out_dir):
    """The files as MultiSlot text under ``out_dir`` (one per source file, same base name)."""
    os.makedirs(out_dir, exist_ok=True)
    out = []
    for path in files:
        target = os.path.join(out_dir, os.path.basename(path))
        with open(path, encoding="utf-8") as src, open(target + ".tmp", "w", encoding="utf-8") as dst:
            for line in src:
                if line.strip():
                    dst.write(multislot_line(line) + "\n")
        os.replace(target + ".tmp", target)
        out.append(target)
    return out


def feed_batches(path, batch):
    """A MultiSlot file's rows as feed dicts of ``batch`` rows: (label [N,1], 26 x ids [N,1], dense [N,13])."""
    with open(path, encoding="utf-8") as f:
        rows = [np.array(line.split(), dtype=np.float64) for line in f if line.strip()]
    for start in range(0, len(rows), batch):
        chunk = np.stack(rows[start : start + batch])
        label = chunk[:, 1:2].astype("int64")
        ids = [chunk[:, 3 + 2 * i : 4 + 2 * i].astype("int64") for i in range(NUM_SPARSE)]
        dense = chunk[:, 2 + 2 * NUM_SPARSE + 1 :].astype("float32")
        yield label, ids, dense


def rank_auc(labels, scores):
    """Rank AUC (ties counted half)."""
    labels = np.asarray(labels).reshape(-1).astype(bool)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    start = 0
    while start < len(scores):
        end = start
        while end + 1 < len(scores) and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2.0 + 1
        start = end + 1
    pos, neg = int(labels.sum()), int((~labels).sum())
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))
