"""The proof that a rebuilt model is the same function as the original.

Every conversion rebuilds the model from its config. Weights equal is not
enough: a layer whose behaviour lives outside its weights (an adapted
Normalization's finalized mean, a lookup table, a custom layer's attribute)
can come back as another function with every weight in place. So before
any 16-bit policy is applied, the rebuild with every layer in float32 must
give the original's outputs on the validation rows, to float32 rounding;
when it does not, the layer calls of both models are compared one by one
and the first that differs is named.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import MpconvertError
from .sections import Fidelity
from .trace import trace

# float32 rounding: 2**-24 = 6e-8 per operation, accumulated over a few
# hundred operations (a Dense softmax split into Dense + Activation rounds
# at other points) stays below this, relative to the outputs' magnitude
# (at least 1).
FLOAT32_ROUNDING = 1e-6
# Rows traced layer by layer to name the culprit: every call's outputs are
# held at once, so fewer than the proof's.
LOCATE_ROWS = 32


def limit_for(reference: list[np.ndarray]) -> float:
    finite = [np.abs(r[np.isfinite(r)]).max(initial=0.0) for r in reference if np.issubdtype(r.dtype, np.number)]
    return FLOAT32_ROUNDING * max(1.0, float(max(finite, default=0.0)))


def difference(reference: list[np.ndarray], other: list[np.ndarray]) -> float:
    """Largest |reference - other| over all outputs; a NaN/inf where the reference has the same counts as 0."""
    worst = 0.0
    for a, b in zip(reference, other):
        if a.shape != b.shape:
            return float("inf")
        a, b = a.astype(np.float64), b.astype(np.float64)
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        diff = np.where(same, 0.0, np.abs(a - b))
        worst = max(worst, float(np.nan_to_num(diff, nan=np.inf).max(initial=0.0)))
    return worst


def prove_faithful(original: Any, rebuilt: Any, rows: list[np.ndarray], what: str = "the float32 rebuild") -> Fidelity:
    """`rebuilt` gives `original`'s outputs on `rows`, or an MpconvertError naming the first layer that differs."""
    from .runners.keras import forward

    reference = forward(original, rows)
    diff = difference(reference, forward(rebuilt, rows))
    limit = limit_for(reference)
    if diff <= limit:
        return Fidelity(len(rows[0]), diff, limit)
    located = first_difference(original, rebuilt, [x[:LOCATE_ROWS] for x in rows])
    message = (
        f"{what} of model {original.name!r} does not reproduce the original: outputs differ by {diff:.3g} "
        f"on {len(rows[0])} rows, where float32 rounding allows {limit:.3g}"
    )
    if located is None:
        raise MpconvertError(
            message + "; every layer's own output matches, so the difference is in how they are wired",
            hint="this is a bug in mpconvert's rebuild: rerun with --debug and report it with the model",
        )
    path, layer, by = located
    cls = type(layer).__name__
    message += f"; the first layer whose output differs is {path!r} ({cls}), by {by:.3g}"
    if type(layer).__module__.split(".")[0] in ("keras", "tf_keras"):
        hint = (
            f"{cls} is a built-in layer, so this is a bug in mpconvert's rebuild: rerun with --debug "
            "and report it with the model"
        )
    else:
        hint = (
            f"the custom layer {cls} keeps state that neither its get_config() nor its weights carry: "
            "return every constructor argument from get_config() and keep other state in weights "
            "(self.add_weight) or in save_own_variables()/load_own_variables()"
        )
    raise MpconvertError(message, hint=hint)


def first_difference(original: Any, rebuilt: Any, rows: list[np.ndarray]) -> tuple[str, Any, float] | None:
    """(path, layer, difference) of the first call of `original` whose outputs `rebuilt` does not reproduce."""
    theirs = {(c.path, c.index): c for c in trace(rebuilt, rows, record_inputs=False)}
    for call in trace(original, rows, record_inputs=False):
        other = theirs.get((call.path, call.index))
        if other is None or call.layer is None:
            continue
        reference = list(call.outputs)
        by = difference(reference, list(other.outputs))
        if by > limit_for(reference):
            return call.path, call.layer, by
    return None
