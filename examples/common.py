"""Pieces the example CTR models share: feed variables, the embedding lookup, pooling and metrics.

Installed as ``heterps_paddle.examples.common``.  The models are static-graph, as PaddleRec's static
PS models are.

``embedding`` picks where the table lives:
- ``"ps"``: ``paddle.static.nn.sparse_embedding``, a table on the parameter servers (PS jobs);
- ``"local"``: ``paddle.static.nn.embedding(is_sparse=True)``, a dense table in this process (the
  single-process learning reference, and profiling).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import paddle

from heterps_paddle.data.criteo import DENSE_VAR, LABEL_VAR, NUM_DENSE, SPARSE_VARS

EMBEDDING_KINDS = ("ps", "local")
AUC_THRESHOLDS = 2**12


@dataclass
class ModelConfig:
    sparse_feature_number: int = 1_000_001  # id space of the local table (the PS table is unbounded)
    sparse_feature_dim: int = 9
    fc_sizes: tuple = (400, 400, 400)
    embedding: str = "ps"
    learning_rate: float = 1e-3

    @classmethod
    def from_dict(cls, values: dict) -> ModelConfig:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown model config key(s) {unknown}; allowed: {sorted(known)}")
        config = cls(**values)
        config.fc_sizes = tuple(config.fc_sizes)
        if config.embedding not in EMBEDDING_KINDS:
            raise ValueError(f"model config 'embedding' must be one of {EMBEDDING_KINDS}, got {config.embedding!r}")
        return config


@dataclass
class ModelGraph:
    """What a built model exposes to trainers, the profiler and the benchmarks."""

    feeds: list  # static data variables, in heterps_paddle.data.criteo.FEED_ORDER
    loss: object
    predict: object  # [batch, 2]: probability of no click, of click (what paddle.static.auc reads)
    auc: object  # accumulated AUC over all batches since its state was last reset
    batch_auc: object
    auc_states: list = field(default_factory=list)  # persistable accumulators; zero them to restart


def create_feeds():
    dense = paddle.static.data(name=DENSE_VAR, shape=[None, NUM_DENSE], dtype="float32")
    sparse = [paddle.static.data(name=name, shape=[None, 1], lod_level=1, dtype="int64") for name in SPARSE_VARS]
    label = paddle.static.data(name=LABEL_VAR, shape=[None, 1], dtype="int64")
    return dense, sparse, label


def embedding_sum(ids, config: ModelConfig, dim: int, table_name: str):
    """Look ``ids`` (one lod slot) up in the table ``table_name`` and sum-pool each sample's ids: [batch, dim]."""
    init = paddle.ParamAttr(name=table_name, initializer=paddle.nn.initializer.Uniform(-0.05, 0.05))
    size = [config.sparse_feature_number, dim]
    if config.embedding == "ps":
        emb = paddle.static.nn.sparse_embedding(input=ids, size=size, param_attr=init)
    else:
        emb = paddle.static.nn.embedding(input=ids, size=size, is_sparse=True, param_attr=init)
    # lookups of a [N, 1] lod input come back as [N, 1, dim]
    emb = paddle.reshape(emb, [-1, dim])
    return paddle.static.nn.sequence_lod.sequence_pool(input=emb, pool_type="sum")


def mlp(x, sizes, name: str):
    """fc layers with relu, initialised as PaddleRec's CTR models (normal, std 1/sqrt(fan_in))."""
    for i, size in enumerate(sizes):
        fan_in = x.shape[-1]
        x = paddle.static.nn.fc(
            x,
            size=size,
            activation="relu",
            name=f"{name}_{i}",
            weight_attr=paddle.ParamAttr(initializer=paddle.nn.initializer.Normal(std=1.0 / fan_in**0.5)),
        )
    return x


def binary_metrics(feeds, click_prob_2d, loss):
    """Wrap a [batch, 2] prediction and a loss with paddle.static.auc."""
    label = feeds[-1]
    auc, batch_auc, states = paddle.static.auc(
        input=click_prob_2d, label=label, num_thresholds=AUC_THRESHOLDS, slide_steps=20
    )
    return ModelGraph(
        feeds=feeds, loss=loss, predict=click_prob_2d, auc=auc, batch_auc=batch_auc, auc_states=list(states)
    )


def sigmoid_head(feeds, logit):
    """Binary cross-entropy on a [batch, 1] logit (Wide&Deep, DeepFM)."""
    label = paddle.cast(feeds[-1], "float32")
    loss = paddle.mean(paddle.nn.functional.binary_cross_entropy_with_logits(logit, label))
    prob = paddle.nn.functional.sigmoid(logit)
    return binary_metrics(feeds, paddle.concat([1.0 - prob, prob], axis=1), loss)
