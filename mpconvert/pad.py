"""Tensor-Core-friendly padding that provably leaves the model's function unchanged.

float16 matmuls and convolutions run on Tensor Cores only when their channel
dimensions are multiples of 8 (TPUs prefer 128). This stage widens those
dimensions with zeros:

* a producer (Dense units, Conv/SeparableConv filters, Embedding width, a
  float input's features) gets extra zero kernel columns and zero biases;
* every layer that consumes the padded channels gets zero input rows (Dense,
  Conv, LSTM kernels), or passes them through per channel (activations,
  pooling, BatchNormalization with neutral statistics, residual Adds);
* a model output, or the float32 softmax in front of one, gets the padding
  sliced off again inside the model, so callers see the original shapes.

Channels that are joined (an Add of two branches) must be padded together,
so the analysis groups tensors into *channel spaces* with a union-find and
pads or skips a whole space. A space that reaches a layer where padding would
change the result (LayerNormalization and softmax normalize across it,
Concatenate shifts it, unknown layers might do anything) is skipped with that
reason. The padded model is then compared with the unpadded one, in float32
(must agree to 1e-6: the padding logic is exact) and in the model's 16-bit
policy.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .frameworks import Framework
from .options import PadOptions
from .configs import SIXTEEN_BIT, builtin_entry, listify, model_config, policy_name, rename_entry, rename_refs, tensor_refs
from .validate import max_abs_diff, predict

# Layers that act on each channel separately and have no weights: padded
# channels pass straight through them.
PER_CHANNEL = {
    "Activation", "ReLU", "LeakyReLU", "ELU", "Dropout", "SpatialDropout1D", "SpatialDropout2D",
    "SpatialDropout3D", "GaussianNoise", "GaussianDropout", "AlphaDropout", "ActivityRegularization",
    "MaxPooling1D", "MaxPooling2D", "MaxPooling3D", "AveragePooling1D", "AveragePooling2D", "AveragePooling3D",
    "GlobalAveragePooling1D", "GlobalAveragePooling2D", "GlobalAveragePooling3D", "GlobalMaxPooling1D",
    "GlobalMaxPooling2D", "GlobalMaxPooling3D", "ZeroPadding1D", "ZeroPadding2D", "ZeroPadding3D",
    "Cropping1D", "Cropping2D", "Cropping3D", "UpSampling1D", "UpSampling2D", "UpSampling3D", "Identity",
}  # fmt: skip
# Elementwise joins: all inputs and the output share one channel space.
MERGES = {"Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum"}
PRODUCERS = {"Dense": "units", "Conv1D": "filters", "Conv2D": "filters", "Conv3D": "filters",
             "SeparableConv1D": "filters", "SeparableConv2D": "filters", "Embedding": "output_dim"}  # fmt: skip
RECURRENT = {"LSTM", "GRU", "SimpleRNN"}
SOFTMAXES = ("softmax", "log_softmax")
NORMALIZING = {"LayerNormalization", "GroupNormalization", "UnitNormalization", "RMSNormalization"}

@dataclass(frozen=True)
class PadPlan:
    multiple: int
    sizes: dict[str, int]  # padded producer layer -> new width
    input_pads: dict[str, int]  # input layer -> new width
    slices: tuple[tuple[str, str], ...]  # (tensor producer, consumer or "" for a model output)
    flatten_maps: dict[str, str]  # Dense after a Flatten -> the Flatten
    padded: tuple[dict, ...]
    skipped: tuple[dict, ...]
    flops: int
    padded_flops: int

    @property
    def flops_overhead(self) -> float:
        return (self.padded_flops / self.flops - 1.0) if self.flops else 0.0

    @property
    def empty(self) -> bool:
        return not self.sizes and not self.input_pads


# --- reading the graph ------------------------------------------------------


class _Spaces:
    """Union-find over tensors whose last axis must be padded together."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}
        self.blocked: dict[str, str] = {}

    def find(self, key: str) -> str:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra
            if rb in self.blocked:
                self.blocked.setdefault(ra, self.blocked.pop(rb))

    def block(self, key: str, reason: str) -> None:
        self.blocked.setdefault(self.find(key), reason)

    def reason(self, key: str) -> str | None:
        return self.blocked.get(self.find(key))


def _functional_config(model: Any, framework: Framework) -> tuple[Any, dict]:
    """A Sequential becomes the equivalent Functional so both share one code path."""
    if type(model).__name__ == "Sequential":
        model = framework.module.Model(model.inputs, model.outputs, name=model.name)
    return model, model_config(model)


def _shape(tensor) -> tuple:
    return tuple(tensor.shape)


@dataclass
class _Graph:
    entries: dict[str, dict]  # name -> config entry
    layers: dict[str, Any]  # name -> live layer
    inputs: dict[str, list[str]]  # name -> producer names of its inputs
    consumers: dict[str, list[str]] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)


def _graph(model: Any, config: dict) -> _Graph:
    entries = {e["config"]["name"]: e for e in config["layers"]}
    layers = {layer.name: layer for layer in model.layers}
    inputs = {name: [r[0] for r in tensor_refs(e.get("inbound_nodes", []))] for name, e in entries.items()}
    graph = _Graph(entries, layers, inputs)
    for name, sources in inputs.items():
        for source in sources:
            graph.consumers.setdefault(source, []).append(name)
    graph.outputs = [r[0] for r in tensor_refs(config.get("output_layers", []))]
    return graph


# --- deciding ---------------------------------------------------------------


def _flops(graph: _Graph, widths: dict[str, int], in_widths: dict[str, int]) -> int:
    """Multiply-accumulates per sample of every matmul/conv, with the given widths.

    `widths` overrides a layer's output channels, `in_widths` its input
    channels; everything else comes from the model's own shapes.
    """
    total = 0
    for name, layer in graph.layers.items():
        cls = type(layer).__name__
        if cls not in PRODUCERS and cls not in RECURRENT and cls != "DepthwiseConv2D":
            continue
        if cls == "Embedding" or len(layer._inbound_nodes) != 1:
            continue
        in_shape, out_shape = _shape(layer.input), _shape(layer.output)
        c_in = in_widths.get(name, in_shape[-1])
        c_out = widths.get(name, out_shape[-1])
        positions = math.prod(d or 1 for d in out_shape[1:-1])
        if cls == "Dense":
            total += c_in * c_out * positions
        elif cls in RECURRENT:
            units = layer.units
            gates = {"LSTM": 4, "GRU": 3, "SimpleRNN": 1}[cls]
            steps = in_shape[1] or 1
            total += (c_in + units) * gates * units * steps
        elif cls == "DepthwiseConv2D":
            total += math.prod(layer.kernel_size) * c_in * positions
        elif cls.startswith("SeparableConv"):
            mult = layer.depth_multiplier
            total += (math.prod(layer.kernel_size) * c_in * mult + c_in * mult * c_out) * positions
        else:
            total += math.prod(layer.kernel_size) * c_in * c_out * positions
    return total


def plan_padding(model: Any, framework: Framework, options: PadOptions) -> tuple[Any, PadPlan]:
    """Decide which channel spaces to pad; returns the (functional) model and the plan."""
    model, config = _functional_config(model, framework)
    graph = _graph(model, config)
    spaces = _Spaces()
    producers: dict[str, tuple[str, str, int]] = {}  # layer -> (space, dim name, width)
    absorbers: dict[str, str] = {}  # layer -> space of the input it absorbs
    flattens: dict[str, str] = {}  # Flatten layer -> space of its input
    slice_before: dict[str, str] = {}  # output activation -> its input layer
    output_set = set(graph.outputs)

    for name, entry in graph.entries.items():
        cls = entry["class_name"]
        cfg = entry["config"]
        layer = graph.layers.get(name)
        sources = graph.inputs[name]
        multi_call = layer is not None and len(getattr(layer, "_inbound_nodes", [])) > 1
        if cls == "InputLayer":
            shape = tuple(cfg.get("batch_shape") or cfg.get("batch_input_shape") or ())
            dtype = str(cfg.get("dtype", "float32"))
            if dtype.startswith("float") and shape and shape[-1]:
                producers[name] = (name, "features", shape[-1])
                if len(shape) > 2:
                    spaces.block(name, "image/sequence input channels: cuDNN pads these itself, and padding "
                                       "them here would reshape the whole input")  # fmt: skip
            else:
                spaces.block(name, "not a float input")
            continue
        if multi_call:
            for source in sources:
                spaces.block(source, f"feeds {cls} {name!r}, which is called more than once")
            spaces.block(name, f"produced by {cls} {name!r}, which is called more than once")
            continue
        if cls in PRODUCERS:
            width = cfg.get(PRODUCERS[cls])
            if cls.startswith("Conv") and (cfg.get("groups", 1) != 1 or cfg.get("data_format") == "channels_first"):
                for source in sources:
                    spaces.block(source, f"feeds grouped or channels_first {cls} {name!r}")
                spaces.block(name, f"{cls} {name!r} is grouped or channels_first")
                continue
            producers[name] = (name, PRODUCERS[cls], width)
            for source in sources:
                absorbers[name] = source
            continue
        if cls in RECURRENT:
            for source in sources:
                absorbers[name] = source
            spaces.block(name, f"{cls} units are not padded (its recurrent kernel and gates would need it)")
            continue
        activation = cfg.get("activation")
        is_softmax = cls == "Softmax" or (cls == "Activation" and activation in SOFTMAXES)
        if is_softmax and name in output_set and len(sources) == 1:
            # The float32 softmax at a model output: slice the padding off
            # right before it, so it normalizes over the real classes only.
            slice_before[name] = sources[0]
            continue
        if cls in PER_CHANNEL and not is_softmax:
            for source in sources:
                spaces.union(source, name)
            continue
        if cls in MERGES:
            for source in sources:
                spaces.union(source, name)
            continue
        if cls == "BatchNormalization" and _is_last_axis(cfg.get("axis"), len(_shape(layer.output))):
            spaces.union(sources[0], name)
            continue
        if cls == "DepthwiseConv2D" and cfg.get("depth_multiplier", 1) == 1 and cfg.get("data_format") != "channels_first":
            spaces.union(sources[0], name)
            continue
        if cls == "Flatten" and len(sources) == 1:
            flattens[name] = sources[0]
            continue
        reason = _block_reason(cls, name, is_softmax)
        for source in sources:
            spaces.block(source, reason)
        spaces.block(name, f"produced by {cls} {name!r}")

    # A Flatten can pass padding on only to Dense layers, whose kernel rows
    # are then re-indexed; anything else after it cannot follow the layout.
    flatten_maps: dict[str, str] = {}
    for flat, source in flattens.items():
        users = graph.consumers.get(flat, [])
        if flat in output_set or not users or any(graph.entries[u]["class_name"] != "Dense" for u in users):
            spaces.block(source, f"Flatten {flat!r} feeds a layer that cannot follow padded channels")
        else:
            flatten_maps.update({u: flat for u in users})
            for user in users:
                absorbers.pop(user, None)

    outputs_needing_slice = [name for name in graph.outputs if name not in slice_before]

    # Group producers by space and decide.
    groups: dict[str, list[str]] = {}
    for name, (space, _, _) in producers.items():
        groups.setdefault(spaces.find(space), []).append(name)
    skipped: list[dict] = []
    candidates: list[tuple[str, int, int]] = []  # (root, width, target)
    for root, names in groups.items():
        widths = {producers[n][2] for n in names}
        width = next(iter(widths))
        target = math.ceil(width / options.multiple) * options.multiple
        if target == width:
            continue
        reason = spaces.reason(root)
        if width < options.multiple:
            # A matrix this narrow is memory-bound: Tensor Cores gain nothing,
            # and padding would multiply its work by up to `multiple`.
            reason = f"narrower than the multiple ({width} < {options.multiple}); padding would not pay"
        if len(widths) != 1:
            reason = f"joined channels have different widths {sorted(widths)}"
        if reason:
            skipped.extend({"layer": n, "dim": producers[n][1], "from": producers[n][2], "reason": reason} for n in names)
        else:
            candidates.append((root, width, target))

    base = _flops(graph, {}, {})

    def widths_for(roots: list[tuple[str, int, int]]) -> tuple[dict, dict]:
        chosen = {root: target for root, _, target in roots}
        out = {n: chosen[spaces.find(producers[n][0])] for n in producers if spaces.find(producers[n][0]) in chosen}
        ins = {a: chosen[spaces.find(s)] for a, s in absorbers.items() if spaces.find(s) in chosen}
        for dense, flat in flatten_maps.items():
            root = spaces.find(flattens[flat])
            if root in chosen:
                old_shape = _shape(graph.layers[flat].input)
                ins[dense] = math.prod(old_shape[1:-1]) * chosen[root]
        return out, ins

    # Cheapest spaces first, while the whole model's FLOPs stay within budget.
    def cost(candidate):
        out, ins = widths_for([candidate])
        return _flops(graph, out, ins) - base

    accepted: list[tuple[str, int, int]] = []
    for candidate in sorted(candidates, key=cost):
        trial = accepted + [candidate]
        out, ins = widths_for(trial)
        overhead = (_flops(graph, out, ins) / base - 1.0) if base else 0.0
        if overhead <= options.max_overhead + 1e-12:
            accepted.append(candidate)
        else:
            root = candidate[0]
            skipped.extend(
                {"layer": n, "dim": producers[n][1], "from": producers[n][2],
                 "reason": f"would raise the model's FLOPs to +{overhead:.1%} (over --max-pad-overhead {options.max_overhead:g})"}
                for n in groups[root]
            )  # fmt: skip
    out, ins = widths_for(accepted)
    chosen_roots = {root for root, _, _ in accepted}
    sizes = {n: w for n, w in out.items() if graph.entries[n]["class_name"] != "InputLayer"}
    input_pads = {n: w for n, w in out.items() if graph.entries[n]["class_name"] == "InputLayer"}
    padded_space = lambda layer: spaces.find(layer) in chosen_roots  # noqa: E731
    slices = tuple((src, act) for act, src in slice_before.items() if padded_space(src))
    slices += tuple((o, "") for o in outputs_needing_slice if padded_space(o))
    padded = tuple(
        {"layer": n, "dim": producers[n][1], "from": producers[n][2], "to": w} for n, w in sorted(out.items())
    )
    plan = PadPlan(
        multiple=options.multiple,
        sizes=sizes,
        input_pads=input_pads,
        slices=slices,
        flatten_maps={d: f for d, f in flatten_maps.items() if padded_space(flattens[f])},
        padded=padded,
        skipped=tuple(sorted(skipped, key=lambda s: s["layer"])),
        flops=base,
        padded_flops=_flops(graph, out, ins),
    )
    return model, plan


def _is_last_axis(axis: Any, rank: int) -> bool:
    # tf-keras stores BatchNormalization's axis as a list ([3]), Keras 3 as an int.
    if isinstance(axis, (list, tuple)):
        if len(axis) != 1:
            return False
        axis = axis[0]
    return axis in (-1, rank - 1)


def _block_reason(cls: str, name: str, is_softmax: bool) -> str:
    if cls in NORMALIZING:
        return f"feeds {cls} {name!r}, which normalizes across this axis"
    if is_softmax:
        return f"feeds a softmax ({name!r}) across this axis"
    if cls == "Concatenate":
        return f"feeds Concatenate {name!r}, which would shift the channels after it"
    return f"feeds {cls} {name!r}, which mpconvert cannot pad consistently"


# --- building ---------------------------------------------------------------


def _block(kind: str, base: str, shape: tuple, width: int, new_width: int, source: str, last_name: str) -> list[dict]:
    """Built-in layers that zero-pad (or crop) the last axis from width to new_width.

    Keras has no layer that pads the channel axis, but ZeroPadding1D and
    Cropping1D work on axis 1, so the channels are moved there and back with
    Reshape/Permute. Every piece is a built-in layer, so the padded model
    saves and reloads in both frameworks without custom objects.
    """
    spatial = tuple(shape[1:-1])
    extra = (new_width - width) if kind == "pad" else (width - new_width)
    edit = {"class_name": "ZeroPadding1D" if kind == "pad" else "Cropping1D",
            "config": {("padding" if kind == "pad" else "cropping"): [0, extra]}}  # fmt: skip
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
        shape = _shape(layers[name].output)
        last = f"{name}_padded"
        for entry in entries:
            if entry["config"]["name"] != name:
                rename_refs(entry.get("inbound_nodes", []), name, last)
        inserted[name] = _block("pad", name, shape, shape[-1], width, name, last)

    for source, consumer in plan.slices:
        shape = _shape(layers[source].output)
        width = _padded_width(plan, shape[-1])
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
        source = layers.get(renames.get(new_layer.name, new_layer.name))
        if source is None or not source.get_weights():
            continue
        new_layer.set_weights(_padded_weights(source, new_layer, plan, layers))
    return padded


def _padded_width(plan: PadPlan, width: int) -> int:
    # Every layer of a padded space has the same width, rounded up alike.
    return math.ceil(width / plan.multiple) * plan.multiple


def _embed(old: np.ndarray, new_shape: tuple, axis_maps: dict[int, np.ndarray], fill: float = 0.0) -> np.ndarray:
    """`old` placed in a `fill`ed array of `new_shape`; axis_maps give each old index its new one."""
    out = np.full(new_shape, fill, dtype=old.dtype)
    out[np.ix_(*[axis_maps.get(axis, np.arange(n)) for axis, n in enumerate(old.shape)])] = old
    return out


def _input_map(layer_name: str, plan: PadPlan, layers: dict, old_rows: int, new_rows: int) -> np.ndarray:
    flat = plan.flatten_maps.get(layer_name)
    if flat is None:
        return np.arange(old_rows)
    shape = _shape(layers[flat].input)
    positions, channels = math.prod(shape[1:-1]), shape[-1]
    new_channels = new_rows // positions
    return (np.arange(positions)[:, None] * new_channels + np.arange(channels)[None, :]).reshape(-1)


def _padded_weights(source: Any, target: Any, plan: PadPlan, layers: dict) -> list[np.ndarray]:
    """The source layer's weights embedded in the target layer's (larger) shapes."""
    cls = type(source).__name__
    old_weights = source.get_weights()
    shapes = [tuple(w.shape) for w in target.weights]
    if [w.shape for w in old_weights] == shapes:
        return old_weights
    names = [w.name.split("/")[-1].split(":")[0] for w in source.weights]
    result = []
    for w, shape, wname in zip(old_weights, shapes, names):
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
                maps[w.ndim - 2] = _input_map(source.name, plan, layers, w.shape[-2], shape[-2])
            else:
                maps[w.ndim - 2] = np.arange(w.shape[-2])
        if w.shape[-1] != shape[-1]:
            maps[w.ndim - 1] = np.arange(w.shape[-1])
        result.append(_embed(w, shape, maps))
    return result


# --- proving ----------------------------------------------------------------


@dataclass(frozen=True)
class Padding:
    model: Any  # the model to export: padded, or the unpadded one when the proof failed
    report: dict


# 16-bit kernels may pick a different algorithm for a wider layer; the
# results then differ by rounding, never by more than a few units in the last
# place of the 16-bit format relative to the output's scale.
TOLERANCE_16BIT = {"mixed_float16": 2e-3, "mixed_bfloat16": 2e-2}
TOLERANCE_FLOAT32 = 1e-6


def _float32_twin(model: Any, framework: Framework) -> Any:
    """The same model (weights included) with every 16-bit policy set to float32."""
    config = copy.deepcopy(model_config(model))

    def strip(value: Any) -> None:
        if isinstance(value, dict):
            if policy_name(value.get("dtype")) in SIXTEEN_BIT:
                value["dtype"] = "float32"
            for item in value.values():
                strip(item)
        elif isinstance(value, list):
            for item in value:
                strip(item)

    strip(config)
    return framework.rebuild(model, config)


def pad(model: Any, framework: Framework, options: PadOptions, inputs: list[np.ndarray], policy: str) -> Padding:
    """Pad `model` where it is safe and cheap, and prove the function unchanged."""
    functional, plan = plan_padding(model, framework, options)
    report = {
        "multiple": options.multiple,
        "max_overhead": options.max_overhead,
        "padded": list(plan.padded),
        "skipped": list(plan.skipped),
        "flops_overhead": round(plan.flops_overhead, 6),
        "max_abs_diff": None,
        "float32_max_abs_diff": None,
        "tolerance": {"float32": TOLERANCE_FLOAT32, policy: TOLERANCE_16BIT[policy]},
        "passed": True,
        "exported": "unpadded",
        "reason": None,
    }
    if plan.empty:
        report["reason"] = "nothing to pad: every dimension is already a multiple, or was skipped"
        return Padding(model, report)
    padded = apply_padding(functional, framework, plan)
    twin = _float32_twin(functional, framework)
    padded_twin = apply_padding(twin, framework, plan)
    exact = max_abs_diff(predict(twin, inputs), predict(padded_twin, inputs))
    reference = predict(functional, inputs)
    sixteen = max_abs_diff(reference, predict(padded, inputs))
    scale = max(1.0, max(float(np.abs(r).max(initial=0.0)) for r in reference))
    report["float32_max_abs_diff"] = exact
    report["max_abs_diff"] = sixteen
    failures = []
    if exact is None or exact > TOLERANCE_FLOAT32 * scale:
        failures.append(f"float32 outputs differ by {exact} (> {TOLERANCE_FLOAT32 * scale:g})")
    if sixteen is None or sixteen > TOLERANCE_16BIT[policy] * scale:
        failures.append(f"{policy} outputs differ by {sixteen} (> {TOLERANCE_16BIT[policy] * scale:g})")
    if failures:
        report["passed"] = False
        report["reason"] = "padding changed the outputs: " + "; ".join(failures) + "; the unpadded model was exported"
        return Padding(model, report)
    report["exported"] = "padded"
    return Padding(padded, report)
