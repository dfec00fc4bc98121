"""Synthetic Criteo-like CTR data with a planted signal, in PaddleRec's slot format.

Why synthetic: the real Criteo set cannot be downloaded here, and 80 real rows train nothing.  The
generator keeps what matters for systems work (13 dense + 26 sparse slots, Zipf-skewed ids over the
per-slot cardinalities of the Criteo Kaggle set, a ~25% click rate) and plants a signal a model can
learn, so learning is testable: the true click probabilities give the best achievable AUC (written to
``meta.json``), and a constant predictor gets 0.5.

The signal: a logit made of a non-linear function of the dense features plus per-id weights of the
frequent ids of a few informative slots (rare ids carry none, as in real data where they are noise).
Same ``seed`` -> byte-identical files.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt

from heterps_paddle.data.criteo import NUM_DENSE, NUM_SPARSE
from heterps_paddle.data.metrics import auc_score
from heterps_paddle.files import write_atomic

# Per-slot cardinalities of the Criteo Kaggle display-advertising set (slots 1..26).
CRITEO_CARDINALITIES = (
    1460,
    583,
    10131227,
    2202608,
    305,
    24,
    12517,
    633,
    3,
    93145,
    5683,
    8351593,
    3194,
    27,
    14992,
    5461306,
    10,
    5652,
    2173,
    4,
    7046547,
    18,
    15,
    286181,
    105,
    142572,
)
# Ids are hashed into this space, as PaddleRec's Criteo preprocessing does (sparse_feature_number).
ID_SPACE = 1_000_001
ZIPF_EXPONENT = 1.1
INFORMATIVE_SLOTS = (0, 1, 3, 5, 8, 12, 16, 19)  # 0-based; mixes small and huge vocabularies
SIGNAL_RANKS = 3000  # only the most frequent ranks of a slot carry weight
CLICK_RATE_BIAS = -1.6
DENSE_LOGIT_STD = 1.2  # alone, the dense part gives an AUC of about 0.72
MAX_ROWS_PER_FILE = 25_000
MIN_FILES = 8  # so that up to 8 workers each get a shard of even a small data set


@dataclass(frozen=True)
class GeneratedDataset:
    out_dir: str
    train_files: list[str]
    test_files: list[str]
    train_rows: int
    test_rows: int
    seed: int
    click_rate: float
    bayes_test_auc: float  # AUC of the true probabilities on the test rows: the best any model can do


class _Signal:
    """The planted model: everything a seed fixes besides the rows themselves."""

    def __init__(self, rng: np.random.Generator):
        self.dense_mu = rng.uniform(-1.0, 1.5, NUM_DENSE)
        self.dense_scale = np.log1p(np.exp(self.dense_mu + 3.0))  # keeps values mostly in [0, 1]
        self.dense_w = rng.normal(0.0, 0.55, NUM_DENSE)
        self.pair_w = rng.normal(0.0, 1.0, 3)
        self.slot_w: list[npt.NDArray[np.float64]] = []
        for slot in range(NUM_SPARSE):
            sigma = 0.55 if slot in INFORMATIVE_SLOTS else 0.05
            n = min(SIGNAL_RANKS, CRITEO_CARDINALITIES[slot])
            weights = rng.normal(0.0, sigma, n)
            # Centre the slot's expected contribution under the Zipf law, so the click rate does not
            # drift with the draw of the hottest ids' weights.
            zipf_mass = np.arange(1, n + 1, dtype=np.float64) ** -ZIPF_EXPONENT
            weights -= (zipf_mass @ weights) / zipf_mass.sum()
            self.slot_w.append(weights)
        # Normalise the dense part on a calibration sample so every seed plants a signal of the same
        # strength and the click rate stays near Criteo's ~25%.
        calib = self.dense_values(rng, 20_000)
        raw = self._dense_raw_logit(calib)
        self.dense_offset = float(raw.mean())
        self.dense_gain = DENSE_LOGIT_STD / float(raw.std())

    def dense_values(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.float64]:
        raw = rng.normal(self.dense_mu, 1.0, size=(n, NUM_DENSE))
        dense = np.log1p(np.exp(raw)) / self.dense_scale
        values: npt.NDArray[np.float64] = np.round(np.clip(dense, 0.0, 1.0), 6)
        return values

    def dense_logit(self, dense: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return (self._dense_raw_logit(dense) - self.dense_offset) * self.dense_gain

    def _dense_raw_logit(self, dense: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        centered = dense - 0.5
        linear = centered @ self.dense_w
        # a little non-linearity, so an MLP has something to find that a linear model does not
        pairs = (
            self.pair_w[0] * centered[:, 0] * centered[:, 1]
            + self.pair_w[1] * np.abs(centered[:, 2])
            + self.pair_w[2] * np.tanh(3.0 * centered[:, 3])
        )
        logit: npt.NDArray[np.float64] = linear + pairs
        return logit

    def sparse_logit(self, ranks: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        total = np.zeros(ranks.shape[0])
        for slot, weights in enumerate(self.slot_w):
            r = ranks[:, slot]
            hot = r < weights.size
            total[hot] += weights[r[hot]]
        return total


def _rows(
    rng: np.random.Generator, signal: _Signal, n: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    dense = signal.dense_values(rng, n)
    ranks = np.empty((n, NUM_SPARSE), dtype=np.int64)
    for slot, card in enumerate(CRITEO_CARDINALITIES):
        ranks[:, slot] = (rng.zipf(ZIPF_EXPONENT, n) - 1) % card
    logit = CLICK_RATE_BIAS + signal.dense_logit(dense) + signal.sparse_logit(ranks)
    prob = 1.0 / (1.0 + np.exp(-logit))
    labels = (rng.random(n) < prob).astype(np.int64)
    slots = np.arange(1, NUM_SPARSE + 1, dtype=np.int64)
    # hash (slot, rank) into the id space: frequent ranks of different slots get different ids
    ids = (ranks * 2654435761 + slots * 40503 + 17) % ID_SPACE
    return dense, ids, labels, prob


def _format_rows(dense: npt.NDArray[np.float64], ids: npt.NDArray[np.int64], labels: npt.NDArray[np.int64]) -> str:
    lines = []
    dense_txt = [[f"dense_feature:{v:.6g}" for v in row] for row in dense.tolist()]
    for i, (label, row_ids) in enumerate(zip(labels.tolist(), ids.tolist())):
        sparse_txt = " ".join(f"{slot}:{v}" for slot, v in enumerate(row_ids, start=1))
        lines.append(f"click:{label} {' '.join(dense_txt[i])} {sparse_txt}\n")
    return "".join(lines)


def _write_split(
    out_dir: str, split: str, rng: np.random.Generator, signal: _Signal, rows: int
) -> tuple[list[str], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    split_dir = os.path.join(out_dir, split)
    os.makedirs(split_dir, exist_ok=True)
    files, labels_all, probs_all = [], [], []
    rows_per_file = max(1, min(MAX_ROWS_PER_FILE, -(-rows // MIN_FILES)))
    for part, start in enumerate(range(0, rows, rows_per_file)):
        n = min(rows_per_file, rows - start)
        dense, ids, labels, prob = _rows(rng, signal, n)
        path = os.path.join(split_dir, f"part-{part:05d}")
        write_atomic(path, _format_rows(dense, ids, labels))
        files.append(path)
        labels_all.append(labels)
        probs_all.append(prob)
    return files, np.concatenate(labels_all), np.concatenate(probs_all)


def generate(out_dir: str, rows: int, seed: int = 0, test_fraction: float = 0.1) -> GeneratedDataset:
    """Write ``rows`` training rows under out_dir/train and ``rows * test_fraction`` held-out rows under
    out_dir/test (at least 8 files while rows allow, at most 25,000 rows a file), plus out_dir/meta.json describing them."""
    if rows <= 0:
        raise ValueError(f"rows must be positive, got {rows}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    signal = _Signal(rng)
    test_rows = max(1, int(round(rows * test_fraction)))
    train_files, train_labels, _ = _write_split(out_dir, "train", rng, signal, rows)
    test_files, test_labels, test_probs = _write_split(out_dir, "test", rng, signal, test_rows)
    result = GeneratedDataset(
        out_dir=out_dir,
        train_files=train_files,
        test_files=test_files,
        train_rows=rows,
        test_rows=test_rows,
        seed=seed,
        click_rate=float(train_labels.mean()),
        bayes_test_auc=auc_score(test_labels, test_probs) if 0 < test_labels.sum() < test_rows else float("nan"),
    )
    write_atomic(os.path.join(out_dir, "meta.json"), json.dumps({"format": 1, **asdict(result)}, indent=1))
    return result


def load_meta(out_dir: str) -> GeneratedDataset | None:
    """The description of a finished generation in out_dir, or None (meta.json is written last)."""
    path = os.path.join(out_dir, "meta.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        meta = json.load(f)
    meta.pop("format", None)
    return GeneratedDataset(**meta)
