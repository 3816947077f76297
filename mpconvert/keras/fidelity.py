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

from math import inf
from typing import Any

import numpy as np

from mpconvert.keras.trace import trace
from mpconvert.options.tolerance import Tolerance
from mpconvert.report.compare import compare
from mpconvert.report.sections import Fidelity
from mpconvert.system.errors import MpconvertError

# Rows traced layer by layer to name the culprit: every call's outputs are
# held at once, so fewer than the proof's.
LOCATE_ROWS = 32


def prove_faithful(original: Any, rebuilt: Any, rows: list[np.ndarray], what: str = "the float32 rebuild") -> Fidelity:
    """`rebuilt` gives `original`'s outputs on `rows`, or an MpconvertError naming the first layer that differs."""
    from mpconvert.runners.keras import forward

    found = compare(forward(original, rows), forward(rebuilt, rows), Tolerance.float32_rounding())
    if found.passed and found.max_abs_diff is not None:
        return Fidelity(len(rows[0]), found.max_abs_diff, found.limit)
    located = first_difference(original, rebuilt, [x[:LOCATE_ROWS] for x in rows])
    message = (
        f"{what} of model {original.name!r} does not reproduce the original: outputs differ by {found.shown} "
        f"on {len(rows[0])} rows, where float32 rounding allows {found.limit:.3g}"
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
        found = compare(list(call.outputs), list(other.outputs), Tolerance.float32_rounding())
        if not found.passed:
            return call.path, call.layer, inf if found.max_abs_diff is None else found.max_abs_diff
    return None
