"""A rebuilt model gets all of the original's state, layer by layer, nested models included."""

from __future__ import annotations

from typing import Any

import numpy as np

from mpconvert.keras.frameworks import Framework
from mpconvert.keras.trace import is_container


def rebuild(framework: Framework, model: Any, config: dict) -> Any:
    """A new model of `model`'s class from `config`, with all of `model`'s state."""
    with framework.preserved_global_policy():
        new = framework.model_from_config(model, config)
    copy_model_state(framework, model, new)
    return new


def copy_model_state(
    framework: Framework, old: Any, new: Any, renames: dict[str, str] | None = None, prefix: str = ""
) -> dict[str, float]:
    """Copy every layer's state from `old` into `new`, its rebuild; returns the layers whose weights changed.

    `renames` maps a layer path of `old` to the name its rebuild has in `new`
    (a split output head keeps its weights under NAME_linear). A layer whose
    weights read back different from what was copied stores them in its
    compute dtype (tf-keras's Normalization keeps its adapt mean in float16
    under mixed_float16): it is returned with the largest change, and the
    caller keeps it float32.
    """
    renames = renames or {}
    changed: dict[str, float] = {}
    for layer in old.layers:
        path = prefix + layer.name
        target = new.get_layer(renames.get(path, layer.name))
        if is_container(layer):
            changed.update(copy_model_state(framework, layer, target, renames, path + "/"))
            continue
        framework.copy_layer_state(layer, target)
        worst = _weights_change(layer, target, path)  # `layer` is only read: its weights now are those before
        if worst > 0:
            changed[path] = worst
    return changed


# Rows of a weight compared at once: its copies as arrays are held a slice at a time, not whole (a whole
# layer's weights read back twice, and np.array_equal's NaN-aware copies of both, took 1.48 GiB beside a
# 0.6 GB Dense stack's rebuild).
_SLICE_BYTES = 16 << 20


def _weights_change(layer: Any, target: Any, path: str) -> float:
    """The largest change of any weight of `layer` in its copy `target` (`_change`)."""
    before, after = list(layer.weights), list(target.weights)
    if not all(hasattr(w, "shape") for w in before + after):
        # tf-keras lists a lookup layer's vocabulary as a weight that is no variable: get_weights reads it.
        before, after = layer.get_weights(), target.get_weights()
    if len(before) != len(after) or any(tuple(a.shape) != tuple(b.shape) for a, b in zip(before, after)):
        raise AssertionError(f"the rebuild of layer {path!r} has weights of other shapes")
    return max((_variable_change(a, b) for a, b in zip(before, after)), default=0.0)


def _variable_change(before: Any, after: Any) -> float:
    """`_change` of two variables of one shape, read a slice of rows at a time."""
    shape = tuple(before.shape)
    if not shape or None in shape or shape[0] == 0:  # tf-keras sizes some lookup variables at run time
        return _change(np.asarray(before), np.asarray(after))
    row_bytes = max(1, int(np.prod(shape[1:], dtype=np.int64)) * 4)
    step = max(1, _SLICE_BYTES // row_bytes)
    return max(
        _change(np.asarray(before[start : start + step]), np.asarray(after[start : start + step]))
        for start in range(0, shape[0], step)
    )


def _change(before: np.ndarray, after: np.ndarray) -> float:
    if np.array_equal(before, after, equal_nan=np.issubdtype(before.dtype, np.floating)):
        return 0.0
    if not np.issubdtype(before.dtype, np.number):
        return float("inf")
    return float(np.max(np.abs(before.astype(np.float64) - after.astype(np.float64)), initial=0.0)) or float("inf")
