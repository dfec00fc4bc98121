"""DeepFM (Guo et al. 2017), as PaddleRec's models/rank/deepfm: a first-order term (a weight per
sparse id and per dense feature), a factorisation machine over the field embeddings (sparse slots'
pooled embeddings and the dense features' embeddings scaled by their values), and a deep MLP over the
same embeddings; the three logits add up, trained with binary cross-entropy."""

import paddle

from heterps_paddle.data.criteo import NUM_DENSE
from heterps_paddle.examples.common import ModelConfig, create_feeds, embedding_sum, mlp, sigmoid_head


def net(config: ModelConfig):
    dense, sparse, label = create_feeds()
    dim = config.sparse_feature_dim
    init = paddle.nn.initializer.Uniform(-0.05, 0.05)

    first_sparse = paddle.add_n([embedding_sum(ids, config, 1, "FirstOrderWeights") for ids in sparse])
    first_dense = paddle.static.nn.fc(dense, size=1, name="first_order_dense")
    first = first_sparse + first_dense

    sparse_fields = paddle.stack(
        [embedding_sum(ids, config, dim, "FieldEmbeddings") for ids in sparse], axis=1
    )  # [B, 26, dim]
    dense_table = paddle.static.create_parameter(
        [NUM_DENSE, dim], "float32", name="DenseFieldEmbeddings", default_initializer=init
    )
    dense_fields = paddle.unsqueeze(dense, 2) * paddle.unsqueeze(dense_table, 0)  # [B, 13, dim]
    fields = paddle.concat([sparse_fields, dense_fields], axis=1)  # [B, 39, dim]

    # FM identity: sum_{i<j} <v_i, v_j> = 0.5 * sum_d ((sum_i v_id)^2 - sum_i v_id^2)
    square_of_sum = paddle.square(paddle.sum(fields, axis=1))
    sum_of_square = paddle.sum(paddle.square(fields), axis=1)
    second = 0.5 * paddle.sum(square_of_sum - sum_of_square, axis=1, keepdim=True)

    deep = mlp(paddle.reshape(fields, [-1, fields.shape[1] * dim]), config.fc_sizes, "deep")
    deep = paddle.static.nn.fc(deep, size=1, name="deep_out")
    return sigmoid_head([dense] + sparse + [label], first + second + deep)
