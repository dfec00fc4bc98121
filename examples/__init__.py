"""The example CTR models (installed as ``heterps_paddle.examples``; sources in the repo's examples/).

``build_program(name)`` gives a model's static programs for profilers, benchmarks and tests;
``examples/static_ps_trainer.py`` is the fleet script that trains them.
"""

from __future__ import annotations

import importlib
import os

MODELS = ("ctr_dnn", "wide_deep", "deepfm")
EXAMPLES_DIR = os.path.dirname(os.path.abspath(__file__))
TRAINER_SCRIPT = os.path.join(EXAMPLES_DIR, "static_ps_trainer.py")


def model_config_path(name: str) -> str:
    _check_name(name)
    return os.path.join(EXAMPLES_DIR, name, "config.yaml")


def _check_name(name: str) -> None:
    if name not in MODELS:
        raise ValueError(f"unknown example model {name!r}; known: {', '.join(MODELS)}")


def build_net(name: str, config):
    """Build model ``name`` into the current default programs; returns its ModelGraph."""
    _check_name(name)
    module = importlib.import_module(f"heterps_paddle.examples.{name}.static_model")
    return module.net(config)


def build_program(name: str, embedding: str = "local", **config_overrides):
    """(main_program, startup_program, ModelGraph) of an example model, no optimizer applied."""
    import paddle

    from .common import ModelConfig

    paddle.enable_static()
    config = ModelConfig.from_dict({"embedding": embedding, **config_overrides})
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        model = build_net(name, config)
    return main, startup, model


def random_feed(model, batch_size: int, seed: int = 0, place=None):
    """A feed dict of plausible inputs for ``model`` (one id per slot, Zipf-like), for timing and tests."""
    import numpy as np
    import paddle

    from heterps_paddle.data.criteo import NUM_DENSE

    rng = np.random.default_rng(seed)
    place = place or paddle.CPUPlace()
    dense, *sparse, label = model.feeds
    feed = {
        dense.name: rng.random((batch_size, NUM_DENSE), dtype=np.float32),
        label.name: rng.integers(0, 2, (batch_size, 1)).astype(np.int64),
    }
    for var in sparse:
        ids = ((rng.zipf(1.1, batch_size) - 1) % 100_000).astype(np.int64).reshape(-1, 1)
        feed[var.name] = paddle.base.create_lod_tensor(ids, [[1] * batch_size], place)
    return feed
