"""CTR-DNN, as PaddleRec's models/rank/dnn: every sparse slot looked up in one shared table and
sum-pooled, concatenated with the 13 dense features, three fc layers of 400 with relu, and a 2-way
softmax trained with cross-entropy."""

import paddle

from heterps_paddle.examples.common import ModelConfig, binary_metrics, create_feeds, embedding_sum, mlp


def net(config: ModelConfig):
    dense, sparse, label = create_feeds()
    pooled = [embedding_sum(ids, config, config.sparse_feature_dim, "SparseFeatFactors") for ids in sparse]
    x = paddle.concat(pooled + [dense], axis=1)
    x = mlp(x, config.fc_sizes, "dnn")
    predict = paddle.static.nn.fc(
        x,
        size=2,
        activation="softmax",
        name="dnn_out",
        weight_attr=paddle.ParamAttr(initializer=paddle.nn.initializer.Normal(std=1.0 / x.shape[-1] ** 0.5)),
    )
    loss = paddle.mean(paddle.nn.functional.cross_entropy(predict, label, use_softmax=False))
    return binary_metrics([dense] + sparse + [label], predict, loss)
