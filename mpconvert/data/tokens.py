"""Per-token figures of a sequence output: accuracy, cross-entropy, agreement and harm over its tokens.

A sequence output scores every position ((batch, time, classes), any
rank, the class axis last); its checked labels hold one token id per
position, IGNORED (-1) where the model's padding input marks no token or
the one-hot row was all zeros. Every figure here leaves those positions
out, so what padding holds (garbage, repeated ids) never counts. The
scores are probabilities (a softmax output) or logits (a head without
activation, log_softmax): `logits` says which, as the output's task does.
"""

from __future__ import annotations

import numpy as np

from mpconvert.data.tasks import IGNORED
from mpconvert.system.errors import MpconvertError

# Probabilities are clipped here before the log, as Keras's own cross-entropy
# clips them (its backend epsilon): a 16-bit softmax that rounds a token's
# probability to 0 gives a large finite loss, as in training, not infinity.
EPSILON = 1e-7
# Tokens per slice of the log-softmax: a 50k vocabulary in float64 is 400 kB a token.
CHUNK = 2048


def scored(labels: np.ndarray) -> np.ndarray:
    """True where a position is a token to score."""
    return labels != IGNORED


def check_lined_up(name: str, scores: np.ndarray, labels: np.ndarray) -> None:
    """Token labels need one id per position the output scores: refused, naming both shapes, when not."""
    if scores.shape[:-1] != labels.shape:
        raise MpconvertError(
            f"the labels of sequence output {name!r} have shape {labels.shape}, but the model gives "
            f"{scores.shape}: one token id per output position is needed",
            hint=f"store labels of shape {scores.shape[:-1]} (the output's positions, without the class axis)",
        )


def accuracy(scores: np.ndarray, labels: np.ndarray) -> float:
    """The share of scored tokens whose best-scoring class is the label."""
    mask = scored(labels)
    return float(np.mean(scores.argmax(axis=-1)[mask] == labels[mask])) if mask.any() else float("nan")


def log_likelihoods(scores: np.ndarray, labels: np.ndarray, logits: bool) -> np.ndarray:
    """log p(label) of every scored token, in float64: a log-softmax of logits, the log of probabilities."""
    mask = scored(labels)
    rows, ids = scores[mask], labels[mask]
    found = np.empty(len(ids), dtype=np.float64)
    for start in range(0, len(ids), CHUNK):
        part = rows[start : start + CHUNK].astype(np.float64)
        picked = part[np.arange(len(part)), ids[start : start + CHUNK]]
        if logits:
            top = part.max(axis=1)
            found[start : start + CHUNK] = picked - top - np.log(np.exp(part - top[:, None]).sum(axis=1))
        else:
            found[start : start + CHUNK] = np.log(np.clip(picked, EPSILON, 1.0))
    return found


def cross_entropy(scores: np.ndarray, labels: np.ndarray, logits: bool) -> float:
    """Mean negative log-likelihood over the scored tokens, in nats (perplexity is its exp)."""
    found = log_likelihoods(scores, labels, logits)
    return float(-found.mean()) if len(found) else float("nan")


def perplexity(cross_entropy: float | None) -> float | None:
    """exp(cross-entropy); None when it is not measured, or too large for a float."""
    if cross_entropy is None or not np.isfinite(cross_entropy) or cross_entropy > 700:
        return None
    return float(np.exp(cross_entropy))


def decisive(scores: np.ndarray, resolution: float, logits: bool) -> np.ndarray:
    """Positions whose best class leads the second by more than the 16-bit spacing at its scale.

    Probabilities are in [0, 1], so the spacing at 1.0 is the rounding a
    converted model can make of them; a logit is rounded relative to its
    size, so the spacing is taken at the top logit's magnitude (at least 1).
    """
    if scores.shape[-1] < 2:
        return np.ones(scores.shape[:-1], dtype=bool)
    top2 = np.partition(scores, -2, axis=-1)[..., -2:].astype(np.float64)
    limit = resolution * np.maximum(1.0, np.abs(top2[..., 1])) if logits else resolution
    return np.asarray(top2[..., 1] - top2[..., 0] > limit)


def agreement_counts(
    reference: np.ndarray,
    converted: np.ndarray,
    labels: np.ndarray | None,
    positions: np.ndarray | None,
    resolution: float,
    logits: bool,
) -> dict[str, int]:
    """Agreement (and with labels the harm counts) over tokens: OutputValidation's keywords, counted per token.

    The tokens are the scored positions (labels not IGNORED), else those
    `positions` marks (the padding input, without labels), else all; of
    those, near-ties at 16-bit resolution are left out, as for rows.
    """
    counted = np.ones(reference.shape[:-1], dtype=bool)
    if labels is not None:
        counted = scored(labels)
    elif positions is not None and positions.shape == counted.shape:
        counted = positions
    counted = counted & decisive(reference, resolution, logits)
    before, after = reference.argmax(axis=-1), converted.argmax(axis=-1)
    found = {"agreement_rows": int(counted.sum()), "agreed": int((before == after)[counted].sum())}
    if labels is not None:
        right_before, right_after = (before == labels)[counted], (after == labels)[counted]
        still = int((right_before & right_after).sum())
        found.update(
            harmed=int(right_before.sum()) - still,
            fixed=int((~right_before & right_after).sum()),
            kept_correct_rows=int(right_before.sum()),
        )
    return found
