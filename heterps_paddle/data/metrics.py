"""AUC, in numpy only: exact rank AUC for generated data checks, and the AUC of the histograms that
``paddle.static.auc`` accumulates (what the trainers report)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def auc_score(labels: npt.ArrayLike, scores: npt.ArrayLike) -> float:
    """Rank AUC (ties counted half)."""
    labels = np.asarray(labels).astype(bool).reshape(-1)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    pos = int(labels.sum())
    neg = labels.size - pos
    if pos == 0 or neg == 0:
        raise ValueError("AUC needs both classes")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [scores.size]))
    ranks = np.empty(scores.size, dtype=np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)  # average rank over ties
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def auc_from_histograms(stat_pos: npt.ArrayLike, stat_neg: npt.ArrayLike) -> float:
    """AUC from paddle.static.auc's accumulated histograms (bucket i holds predictions in
    [i/T, (i+1)/T)), by the trapezoid rule over thresholds from high to low, as the auc op does."""
    pos = np.asarray(stat_pos, dtype=np.float64).reshape(-1)[::-1]
    neg = np.asarray(stat_neg, dtype=np.float64).reshape(-1)[::-1]
    cum_pos = np.cumsum(pos)
    total_pos, total_neg = cum_pos[-1], neg.sum()
    if total_pos == 0 or total_neg == 0:
        return 0.5
    prev_pos = np.concatenate(([0.0], cum_pos[:-1]))
    return float(np.sum(neg * (cum_pos + prev_pos) / 2.0) / (total_pos * total_neg))
