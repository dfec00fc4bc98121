"""rl's numpy policy (planning/schedulers/policy.py): the hand-written backward pass (BPTT through both LSTMs,
the heads, the move weights and the entropy bonus) agrees with finite differences of the loss, Adam moves the
loss downhill, and rl plans where Paddle cannot be imported."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from heterps_paddle.planning.catalog import generate_workload
from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.schedulers.policy import RETURN_FEATURES, STAY_FEATURES, Adam, Policy
from heterps_paddle.planning.schedulers.rl import _rollout, free_reach, layer_features, prior_logits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small_problem(seed):
    """A policy on a real model's features, one batch drawn from it, and advantages like the training's."""
    workload = generate_workload(seed, 7, 3, binding=seed % 2 == 1)
    model = CostModel(workload.profile, workload.cluster)
    features = layer_features(model).astype(np.float64)
    prior = prior_logits(model, 1.0).astype(np.float64)
    rng = np.random.default_rng(seed)
    policy = Policy.create(features.shape[1], 5, model.num_types, rng)
    # Move the parameters off their start so that no gradient is zero by symmetry.
    for value in policy.params.values():
        value += rng.normal(0, 0.3, value.shape)
    forward = policy.forward(features)
    logits = forward.type_logits + prior
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    unit_table = model.stage_tables().units
    weights = (policy.params["stay_weights"], policy.params["return_weights"])
    rollout = _rollout(rng, probs, forward.move_logits, weights, unit_table, free_reach(unit_table), 9)
    advantages = np.maximum(rng.normal(0, 1, 9), 0.0)
    return policy, features, prior, rollout, advantages


@pytest.mark.parametrize("seed", range(3))
def test_gradients_match_finite_differences(seed):
    policy, features, prior, rollout, advantages = small_problem(seed)
    bonus = 0.05

    def loss():
        return policy.loss_and_gradients(policy.forward(features), prior, rollout, advantages, bonus)[0]

    _, _, grads = policy.loss_and_gradients(policy.forward(features), prior, rollout, advantages, bonus)
    assert set(grads) == set(policy.params)
    rng = np.random.default_rng(seed)
    for name, value in policy.params.items():
        assert grads[name].shape == value.shape, name
        flat = value.reshape(-1)
        for index in rng.choice(flat.size, size=min(flat.size, 12), replace=False):
            saved = flat[index]
            h = 1e-6
            flat[index] = saved + h
            up = loss()
            flat[index] = saved - h
            down = loss()
            flat[index] = saved
            numeric = (up - down) / (2 * h)
            analytic = grads[name].reshape(-1)[index]
            assert analytic == pytest.approx(numeric, rel=1e-4, abs=1e-8), (name, index)


def test_the_move_weights_get_gradient_and_the_features_have_their_sizes():
    policy, features, prior, rollout, advantages = small_problem(0)
    assert rollout.stay_features.shape[-1] == STAY_FEATURES == policy.params["stay_weights"].size
    assert rollout.return_features.shape[-1] == RETURN_FEATURES == policy.params["return_weights"].size
    _, _, grads = policy.loss_and_gradients(policy.forward(features), prior, rollout, advantages, 0.0)
    assert np.abs(grads["stay_weights"]).sum() > 0


def test_adam_lowers_the_loss_on_a_fixed_batch():
    policy, features, prior, rollout, advantages = small_problem(1)
    optimizer = Adam(policy.params, 0.01)
    first = None
    for _ in range(30):
        loss, _, grads = policy.loss_and_gradients(policy.forward(features), prior, rollout, advantages, 0.0)
        first = loss if first is None else first
        optimizer.step(grads)
    assert loss < first


def test_rl_plans_where_paddle_cannot_be_imported(tmp_path):
    """A ``paddle`` on the path that raises when imported: `heterps plan --scheduler rl` still gives a plan."""
    fake = tmp_path / "fake" / "paddle"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("paddle is blocked in this test")\n')
    script = textwrap.dedent(
        """
        import sys
        from heterps_paddle.planning.catalog import generate_workload
        from heterps_paddle.planning.model import cluster_to_dict, model_profile_to_dict, save_yaml
        workload = generate_workload(12, 8, 4, binding=True)
        save_yaml(model_profile_to_dict(workload.profile), sys.argv[1])
        save_yaml(cluster_to_dict(workload.cluster), sys.argv[2])
        """
    )
    model_path, cluster_path = tmp_path / "model.yaml", tmp_path / "cluster.yaml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "fake"), ROOT]))
    subprocess.run([sys.executable, "-c", script, str(model_path), str(cluster_path)], check=True, env=env)
    blocked = subprocess.run([sys.executable, "-c", "import paddle"], env=env, capture_output=True, text=True)
    assert blocked.returncode != 0 and "blocked" in blocked.stderr
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "heterps_paddle",
            "plan",
            "--model",
            str(model_path),
            "--cluster",
            str(cluster_path),
            "--scheduler",
            "rl",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert '"feasible": true' in run.stdout
    assert '"scheduler": "rl"' in run.stdout
