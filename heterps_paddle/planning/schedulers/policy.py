"""rl's policy on numpy: an embedding layer, a bidirectional LSTM over the layers, a type head and a move head,
with a hand-written forward and backward (backpropagation through time), and Adam.

The network (per model layer ``l`` of ``n``, features ``x[l]``; H hidden units, T types):

    e[l] = tanh(x[l] W_e + b_e)
    forward LSTM over e[0..n-1] -> f[l], backward LSTM over e[n-1..0] -> r[l]; h[l] = [f[l], r[l]]
    type_logits[l] = h[l] W_t + b_t          [n, T]
    move_logits[l] = h[l] W_m + b_m          [n, 2]  (stay, return; b_m starts at (1, -1))

An LSTM step (gates in Paddle's order i, f, g, o): z = e W_x + h_prev W_h + b, c = sigma(f) c_prev +
sigma(i) tanh(g), h = sigma(o) tanh(c). Initialisation as Paddle's layers do it in kind: Xavier-uniform linear
weights with zero biases, LSTM weights and biases uniform in +-1/sqrt(H).

``Policy.loss_and_gradients`` is REINFORCE's loss for one batch of samples drawn by ``rl._rollout``: the mean
over samples of ``-advantage * log P(sample) / n``, minus an entropy bonus on the type distributions, and its
gradient with respect to every parameter (``tests/test_planning_policy.py`` checks it against finite
differences). Everything is float64: the models are small (H = 32) and the sampling already runs in numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]

STAY_FEATURES = 5
RETURN_FEATURES = 2
# At first: stay within the run's free reach, leave at its end, and return after a one-layer stage.
STAY_WEIGHTS_AT_START = (2.0, -2.0, -1.0, -0.5, 0.0)
RETURN_WEIGHTS_AT_START = (1.0, 0.0)
# Start by staying most of the time and rarely returning: early samples then have a few long stages, as good
# plans do, instead of a new stage (and at least one more unit) every other layer.
MOVE_BIAS_AT_START = (1.0, -1.0)
# A move that cannot be taken (staying at layer 0, returning with no run before) gets this logit subtracted.
_MASK = 1e4
_EPSILON = 1e-12


@dataclass(frozen=True)
class RolloutRecord:
    """What the log-probability of a batch of samples needs (``rl.Rollout`` carries these fields)."""

    samples: NDArray[np.int64]  # [batch, n]
    stay_features: NDArray[np.float32]  # [batch, n, STAY_FEATURES]
    return_features: NDArray[np.float32]  # [batch, n, RETURN_FEATURES]
    can_return: NDArray[np.bool_]  # [batch, n]
    moves: NDArray[np.float32]  # [batch, n, 2]: the sampled type equals the stay / return type


def _sigmoid(x: Array) -> Array:
    out: Array = 0.5 * (1.0 + np.tanh(0.5 * x))
    return out


@dataclass
class _LSTMCache:
    inputs: Array  # [n, H] in the order the LSTM read them
    hidden: Array  # [n + 1, H]: hidden[0] is zero, hidden[k + 1] after step k
    cell: Array  # [n + 1, H]
    gates: Array  # [n, 4H]: i, f, o after the sigmoid, g after the tanh


@dataclass
class ForwardCache:
    features: Array
    embedded: Array  # [n, H]
    forward: _LSTMCache
    backward: _LSTMCache
    joined: Array  # [n, 2H]
    type_logits: Array  # [n, T]
    move_logits: Array  # [n, 2]


@dataclass
class Policy:
    """The parameters by name (``params``), the forward pass, and the loss with its gradient."""

    params: dict[str, Array] = field(default_factory=dict)

    @classmethod
    def create(cls, feature_size: int, hidden_size: int, num_types: int, rng: np.random.Generator) -> Policy:
        H = hidden_size

        def xavier(fan_in: int, fan_out: int) -> Array:
            limit = np.sqrt(6.0 / (fan_in + fan_out))
            return rng.uniform(-limit, limit, (fan_in, fan_out))

        def lstm_uniform(*shape: int) -> Array:
            bound = 1.0 / np.sqrt(H)
            return rng.uniform(-bound, bound, shape)

        params = {
            "embed_w": xavier(feature_size, H),
            "embed_b": np.zeros(H),
            "forward_wx": lstm_uniform(H, 4 * H),
            "forward_wh": lstm_uniform(H, 4 * H),
            "forward_b": lstm_uniform(4 * H),
            "backward_wx": lstm_uniform(H, 4 * H),
            "backward_wh": lstm_uniform(H, 4 * H),
            "backward_b": lstm_uniform(4 * H),
            "head_w": xavier(2 * H, num_types),
            "head_b": np.zeros(num_types),
            "moves_w": xavier(2 * H, 2),
            "moves_b": np.array(MOVE_BIAS_AT_START),
            "stay_weights": np.array(STAY_WEIGHTS_AT_START),
            "return_weights": np.array(RETURN_WEIGHTS_AT_START),
        }
        return cls(params)

    # ------------------------------------------------------------------------------------------------ forward

    def _lstm(self, prefix: str, inputs: Array) -> _LSTMCache:
        wx, wh, b = self.params[prefix + "_wx"], self.params[prefix + "_wh"], self.params[prefix + "_b"]
        n, H = inputs.shape[0], wh.shape[0]
        hidden, cell = np.zeros((n + 1, H)), np.zeros((n + 1, H))
        gates = np.empty((n, 4 * H))
        projected = inputs @ wx + b  # the input part of every step at once
        for k in range(n):
            z = projected[k] + hidden[k] @ wh
            g = gates[k]
            g[: 2 * H] = _sigmoid(z[: 2 * H])  # i, f
            g[2 * H : 3 * H] = np.tanh(z[2 * H : 3 * H])
            g[3 * H :] = _sigmoid(z[3 * H :])
            cell[k + 1] = g[H : 2 * H] * cell[k] + g[:H] * g[2 * H : 3 * H]
            hidden[k + 1] = g[3 * H :] * np.tanh(cell[k + 1])
        return _LSTMCache(inputs, hidden, cell, gates)

    def forward(self, features: Array) -> ForwardCache:
        """Per layer: type logits [n, T] and (stay, return) logits [n, 2], with what the backward pass needs."""
        p = self.params
        embedded = np.tanh(features @ p["embed_w"] + p["embed_b"])
        forward = self._lstm("forward", embedded)
        backward = self._lstm("backward", embedded[::-1])
        joined = np.concatenate([forward.hidden[1:], backward.hidden[1:][::-1]], axis=1)
        type_logits = joined @ p["head_w"] + p["head_b"]
        move_logits = joined @ p["moves_w"] + p["moves_b"]
        return ForwardCache(features, embedded, forward, backward, joined, type_logits, move_logits)

    # ----------------------------------------------------------------------------------------------- backward

    def _lstm_backward(self, prefix: str, cache: _LSTMCache, d_hidden: Array, grads: dict[str, Array]) -> Array:
        """BPTT: ``d_hidden`` [n, H] is the loss's gradient at each step's output; adds the weights' gradients
        to ``grads`` and returns the gradient at the inputs [n, H]."""
        wx, wh = self.params[prefix + "_wx"], self.params[prefix + "_wh"]
        n, H = d_hidden.shape
        d_z = np.empty((n, 4 * H))
        d_h_next, d_c_next = np.zeros(H), np.zeros(H)
        for k in range(n - 1, -1, -1):
            g = cache.gates[k]
            i, f, c_in, o = g[:H], g[H : 2 * H], g[2 * H : 3 * H], g[3 * H :]
            tanh_c = np.tanh(cache.cell[k + 1])
            d_h = d_hidden[k] + d_h_next
            d_c = d_c_next + d_h * o * (1.0 - tanh_c**2)
            dz = d_z[k]
            dz[:H] = d_c * c_in * i * (1.0 - i)
            dz[H : 2 * H] = d_c * cache.cell[k] * f * (1.0 - f)
            dz[2 * H : 3 * H] = d_c * i * (1.0 - c_in**2)
            dz[3 * H :] = d_h * tanh_c * o * (1.0 - o)
            d_h_next = wh @ dz
            d_c_next = d_c * f
        grads[prefix + "_wx"] = cache.inputs.T @ d_z
        grads[prefix + "_wh"] = cache.hidden[:-1].T @ d_z
        grads[prefix + "_b"] = d_z.sum(axis=0)
        d_inputs: Array = d_z @ wx.T
        return d_inputs

    def backward(self, cache: ForwardCache, d_type_logits: Array, d_move_logits: Array) -> dict[str, Array]:
        """Gradients of every parameter but the move-feature weights, given the loss's gradient at the logits."""
        p = self.params
        H = p["forward_wh"].shape[0]
        grads: dict[str, Array] = {
            "head_w": cache.joined.T @ d_type_logits,
            "head_b": d_type_logits.sum(axis=0),
            "moves_w": cache.joined.T @ d_move_logits,
            "moves_b": d_move_logits.sum(axis=0),
        }
        d_joined = d_type_logits @ p["head_w"].T + d_move_logits @ p["moves_w"].T
        d_embedded = self._lstm_backward("forward", cache.forward, d_joined[:, :H], grads)
        d_embedded += self._lstm_backward("backward", cache.backward, d_joined[::-1, H:], grads)[::-1]
        d_pre = d_embedded * (1.0 - cache.embedded**2)
        grads["embed_w"] = cache.features.T @ d_pre
        grads["embed_b"] = d_pre.sum(axis=0)
        return grads

    # ------------------------------------------------------------------------------------------- the loss

    def loss_and_gradients(
        self,
        cache: ForwardCache,
        prior: Array,
        rollout: RolloutRecord,
        advantages: Array,
        entropy_bonus: float,
    ) -> tuple[float, float, dict[str, Array]]:
        """REINFORCE's loss for the samples of ``rollout`` (drawn from this forward pass), its mean entropy per
        layer, and the gradient of the loss for every parameter. Per layer a sample's probability is
        p_stay [a = current] + p_return [a = previous run] + p_fresh pi(a), pi = softmax(type logits + prior);
        loss = -mean_b(advantage_b * sum_l log P_bl) / n - entropy_bonus * entropy."""
        count, n = rollout.samples.shape
        stay_w, return_w = self.params["stay_weights"], self.params["return_weights"]
        # The type distribution per layer.
        shifted = cache.type_logits + prior
        shifted = shifted - shifted.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        probs = np.exp(log_probs)
        rows = np.arange(n)[None, :]
        fresh = probs[rows, rollout.samples]  # [batch, n]
        # The move distribution (stay, return, fresh) per sample and layer.
        stay_features = rollout.stay_features.astype(np.float64)
        return_features = rollout.return_features.astype(np.float64)
        z = np.zeros((count, n, 3))
        z[..., 0] = cache.move_logits[None, :, 0] + stay_features @ stay_w
        z[:, 0, 0] -= _MASK  # layer 0 has nothing to stay with: its type is a fresh draw
        z[..., 1] = cache.move_logits[None, :, 1] + return_features @ return_w - _MASK * (~rollout.can_return)
        z -= z.max(axis=2, keepdims=True)
        move_probs = np.exp(z)
        move_probs /= move_probs.sum(axis=2, keepdims=True)
        moves = rollout.moves.astype(np.float64)
        step = move_probs[..., 0] * moves[..., 0] + move_probs[..., 1] * moves[..., 1] + move_probs[..., 2] * fresh
        log_likelihood = np.log(step + _EPSILON).sum(axis=1)  # [batch]
        entropy = float(-(probs * log_probs).sum() / n)
        loss = float(-(advantages * log_likelihood).mean() / n - entropy_bonus * entropy)

        # Backward: through log(step) to the move and type probabilities.
        d_step = -(advantages[:, None] / (count * n)) / (step + _EPSILON)  # [batch, n]
        d_move_probs = d_step[..., None] * np.stack([moves[..., 0], moves[..., 1], fresh], axis=-1)
        d_z = move_probs * (d_move_probs - (d_move_probs * move_probs).sum(axis=2, keepdims=True))
        d_move_logits = d_z[..., :2].sum(axis=0)  # [n, 2]
        grads_moves = {
            "stay_weights": np.einsum("bl,blk->k", d_z[..., 0], stay_features),
            "return_weights": np.einsum("bl,blk->k", d_z[..., 1], return_features),
        }
        d_probs = np.zeros((n, probs.shape[1]))
        np.add.at(d_probs, (np.broadcast_to(rows, rollout.samples.shape), rollout.samples), d_step * move_probs[..., 2])
        # d(-bonus * entropy)/d log_probs, with probs = exp(log_probs): bonus * probs * (log_probs + 1) / n.
        d_log_probs = d_probs * probs + entropy_bonus * probs * (log_probs + 1.0) / n
        d_type_logits = d_log_probs - probs * d_log_probs.sum(axis=1, keepdims=True)
        grads = self.backward(cache, d_type_logits, d_move_logits)
        grads.update(grads_moves)
        return loss, entropy, grads


class Adam:
    """Adam (Kingma and Ba) over a policy's parameters, updated in place."""

    def __init__(
        self,
        params: dict[str, Array],
        learning_rate: float,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
    ):
        self.params = params
        self.learning_rate, self.beta1, self.beta2, self.eps = learning_rate, beta1, beta2, eps
        self.first = {name: np.zeros_like(value) for name, value in params.items()}
        self.second = {name: np.zeros_like(value) for name, value in params.items()}
        self.steps = 0

    def step(self, grads: dict[str, Array]) -> None:
        self.steps += 1
        correction1 = 1.0 - self.beta1**self.steps
        correction2 = 1.0 - self.beta2**self.steps
        for name, grad in grads.items():
            m, v = self.first[name], self.second[name]
            m *= self.beta1
            m += (1.0 - self.beta1) * grad
            v *= self.beta2
            v += (1.0 - self.beta2) * grad * grad
            self.params[name] -= self.learning_rate * (m / correction1) / (np.sqrt(v / correction2) + self.eps)
