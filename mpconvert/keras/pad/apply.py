"""Building the padded model: a rewritten config and the old weights embedded in zeros."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mpconvert.keras.configs import builtin_entry, listify, model_config, rename_entry, rename_refs
from mpconvert.keras.frameworks import Framework
from mpconvert.keras.pad.layer_graph import Shape, Shapes, known
from mpconvert.keras.pad.live import live_shapes
from mpconvert.keras.pad.plan import PRODUCERS, RECURRENT, PadPlan, padded_width
from mpconvert.keras.state import copy_model_state
from mpconvert.keras.trace import is_container


def _block(kind: str, base: str, shape: Shape, width: int, new_width: int, source: str, last_name: str) -> list[dict]:
    """Built-in layers that zero-pad (or crop) the last axis from width to new_width.

    Keras has no layer that pads the channel axis, but ZeroPadding1D and
    Cropping1D work on axis 1, so the channels are moved there and back with
    Reshape/Permute. Every piece is a built-in layer, so the padded model
    saves and reloads in both frameworks without custom objects.
    """
    spatial = tuple(shape[1:-1])
    extra = (new_width - width) if kind == "pad" else (width - new_width)
    edit: dict[str, Any] = {
        "class_name": "ZeroPadding1D" if kind == "pad" else "Cropping1D",
        "config": {("padding" if kind == "pad" else "cropping"): [0, extra]},
    }
    steps: list[dict[str, Any]]
    if not spatial:
        steps = [
            {"class_name": "Reshape", "config": {"target_shape": [width, 1]}},
            edit,
            {"class_name": "Reshape", "config": {"target_shape": [new_width]}},
        ]
    else:
        final = [-1 if d is None else d for d in spatial] + [new_width]
        steps = [
            {"class_name": "Reshape", "config": {"target_shape": [-1, width]}},
            {"class_name": "Permute", "config": {"dims": [2, 1]}},
            edit,
            {"class_name": "Permute", "config": {"dims": [2, 1]}},
            {"class_name": "Reshape", "config": {"target_shape": final}},
        ]
    entries = []
    previous = source
    for i, step in enumerate(steps):
        name = last_name if i == len(steps) - 1 else f"{base}_{kind}{i}"
        entries.append(builtin_entry(step["class_name"], name, step["config"], previous))
        previous = name
    return entries


def apply_padding(model: Any, framework: Framework, plan: PadPlan) -> Any:
    """A new model with the plan's padding; `model` (functional) is not changed."""
    config = listify(model_config(model))
    layers = {layer.name: layer for layer in model.layers}
    shapes = live_shapes(model)
    entries = config["layers"]
    by_name = {e["config"]["name"]: e for e in entries}
    renames: dict[str, str] = {}  # new layer name -> source layer name

    for name, width in plan.sizes.items():
        by_name[name]["config"][PRODUCERS[by_name[name]["class_name"]]] = width
    for entry in entries:
        # A stored build shape would pre-build layers for the old widths;
        # without it each layer builds from the (padded) tensor it is called on.
        entry.pop("build_config", None)

    inserted: dict[str, list[dict]] = {}  # insert after this layer
    for name, width in plan.input_pads.items():
        shape = known(shapes[name][1])
        last = f"{name}_padded"
        for entry in entries:
            if entry["config"]["name"] != name:
                rename_refs(entry.get("inbound_nodes", []), name, last)
        inserted[name] = _block("pad", name, shape, shape[-1], width, name, last)

    for source, consumer in plan.slices:
        shape = known(shapes[source][1])
        width = padded_width(shape[-1], plan.multiple)  # every layer of a padded space is rounded up alike
        if consumer:
            last = f"{consumer}_unpadded"
            rename_refs(by_name[consumer].get("inbound_nodes", []), source, last)
            inserted.setdefault(source, []).extend(_block("slice", consumer, shape, width, shape[-1], source, last))
        else:
            # A model output keeps its name: the producer is renamed and the
            # slice ends in a layer with the original name.
            inner = f"{source}_padded"
            entry = by_name[source]
            rename_entry(entry, inner)
            renames[inner] = source
            for other in entries:
                if other is not entry:
                    rename_refs(other.get("inbound_nodes", []), source, inner)
            inserted.setdefault(source, []).extend(_block("slice", source, shape, width, shape[-1], inner, source))

    new_entries = []
    for entry in entries:
        new_entries.append(entry)
        key = renames.get(entry["config"]["name"], entry["config"]["name"])
        new_entries.extend(inserted.get(key, []))
    config["layers"] = new_entries

    with framework.preserved_global_policy():
        padded = framework.module.Model.from_config(config)
    for new_layer in padded.layers:
        original = layers.get(renames.get(new_layer.name, new_layer.name))
        if original is None:
            continue
        if is_container(original):
            copy_model_state(framework, original, new_layer)
        elif [tuple(w.shape) for w in original.weights] == [tuple(w.shape) for w in new_layer.weights]:
            # Unpadded layers keep all their state, not only weights (an adapted Normalization).
            framework.copy_layer_state(original, new_layer)
        else:
            new_layer.set_weights(_padded_weights(original, new_layer, plan, shapes))
    return padded


def _embed(old: np.ndarray, new_shape: tuple, axis_maps: dict[int, np.ndarray], fill: float = 0.0) -> np.ndarray:
    """`old` placed in a `fill`ed array of `new_shape`; axis_maps give each old index its new one."""
    out = np.full(new_shape, fill, dtype=old.dtype)
    out[np.ix_(*[axis_maps.get(axis, np.arange(n)) for axis, n in enumerate(old.shape)])] = old
    return out


def _input_map(layer_name: str, plan: PadPlan, shapes: dict[str, Shapes], old_rows: int, new_rows: int) -> np.ndarray:
    flat = plan.flatten_maps.get(layer_name)
    if flat is None:
        return np.arange(old_rows)
    shape = known(shapes[flat][0])
    positions, channels = math.prod(shape[1:-1]), shape[-1]
    new_channels = new_rows // positions
    return (np.arange(positions)[:, None] * new_channels + np.arange(channels)[None, :]).reshape(-1)


def _padded_weights(source: Any, target: Any, plan: PadPlan, shapes: dict[str, Shapes]) -> list[np.ndarray]:
    """The source layer's weights embedded in the target layer's (larger) shapes."""
    cls = type(source).__name__
    old_weights = source.get_weights()
    new_shapes = [tuple(w.shape) for w in target.weights]
    if [w.shape for w in old_weights] == new_shapes:
        return old_weights
    names = [w.name.split("/")[-1].split(":")[0] for w in source.weights]
    result = []
    for w, shape, wname in zip(old_weights, new_shapes, names):
        if w.shape == shape:
            result.append(w)
            continue
        maps: dict[int, np.ndarray] = {}
        if cls == "BatchNormalization":
            # Neutral statistics: padded channels are normalized as x / sqrt(1 + eps).
            fill = 1.0 if wname in ("gamma", "moving_variance") else 0.0
            result.append(_embed(w, shape, {0: np.arange(w.shape[0])}, fill))
            continue
        if cls.startswith("SeparableConv") and wname == "pointwise_kernel":
            mult = source.depth_multiplier
            channels_old = w.shape[-2] // mult
            # Row c * mult + m belongs to input channel c; padded channels
            # are appended, so channel c keeps its index.
            maps[w.ndim - 2] = (np.arange(channels_old)[:, None] * mult + np.arange(mult)[None, :]).reshape(-1)
        elif w.ndim >= 2 and w.shape[-2] != shape[-2] and cls != "Embedding":
            if cls == "Dense" or cls in RECURRENT:
                maps[w.ndim - 2] = _input_map(source.name, plan, shapes, w.shape[-2], shape[-2])
            else:
                maps[w.ndim - 2] = np.arange(w.shape[-2])
        if w.shape[-1] != shape[-1]:
            maps[w.ndim - 1] = np.arange(w.shape[-1])
        result.append(_embed(w, shape, maps))
    return result
