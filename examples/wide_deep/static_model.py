"""Wide & Deep (Cheng et al. 2016), as PaddleRec's models/rank/wide_deep: a wide linear part over the
dense features and a 1-dim weight per sparse id, plus a deep MLP over the pooled embeddings and the
dense features; the two logits add up, trained with binary cross-entropy."""

import paddle

from heterps_paddle.examples.common import ModelConfig, create_feeds, embedding_sum, mlp, sigmoid_head


def net(config: ModelConfig):
    dense, sparse, label = create_feeds()
    wide_sparse = [embedding_sum(ids, config, 1, "WideWeights") for ids in sparse]
    wide = paddle.static.nn.fc(dense, size=1, name="wide_dense") + paddle.add_n(wide_sparse)
    deep_in = [embedding_sum(ids, config, config.sparse_feature_dim, "DeepEmbeddings") for ids in sparse]
    deep = mlp(paddle.concat(deep_in + [dense], axis=1), config.fc_sizes, "deep")
    deep = paddle.static.nn.fc(deep, size=1, name="deep_out")
    return sigmoid_head([dense] + sparse + [label], wide + deep)
