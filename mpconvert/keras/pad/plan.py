"""Which channel dimensions to pad: pure planning on a `LayerGraph`.

No TensorFlow and no live layer here. `plan_padding` takes three steps:

1. classify: every layer constrains the channels it touches according to
   its class (`KINDS`): a producer sets a width, an absorber takes one in,
   per-channel layers and merges join channel spaces, a blocker forbids
   padding the spaces around it, with a reason;
2. group: the producers of one channel space are padded together or
   skipped together, each skip with its reason;
3. budget: the remaining spaces are accepted cheapest first while the
   model's multiply-adds stay within `max_overhead`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from mpconvert.keras.configs import CHANNEL_NORMALIZATION_LAYERS, SOFTMAX_ACTIVATIONS
from mpconvert.keras.pad.flops import GATES, flops
from mpconvert.keras.pad.layer_graph import Layer, LayerGraph, Spaces, known
from mpconvert.options.pad import PadOptions
from mpconvert.report.sections.stages import PaddedDim, SkippedDim

# Layers that act on each channel separately and have no weights: padded
# channels pass straight through them.
PER_CHANNEL = {
    "Activation",
    "ReLU",
    "LeakyReLU",
    "ELU",
    "Dropout",
    "SpatialDropout1D",
    "SpatialDropout2D",
    "SpatialDropout3D",
    "GaussianNoise",
    "GaussianDropout",
    "AlphaDropout",
    "ActivityRegularization",
    "MaxPooling1D",
    "MaxPooling2D",
    "MaxPooling3D",
    "AveragePooling1D",
    "AveragePooling2D",
    "AveragePooling3D",
    "GlobalAveragePooling1D",
    "GlobalAveragePooling2D",
    "GlobalAveragePooling3D",
    "GlobalMaxPooling1D",
    "GlobalMaxPooling2D",
    "GlobalMaxPooling3D",
    "ZeroPadding1D",
    "ZeroPadding2D",
    "ZeroPadding3D",
    "Cropping1D",
    "Cropping2D",
    "Cropping3D",
    "UpSampling1D",
    "UpSampling2D",
    "UpSampling3D",
    "Identity",
}
# Elementwise joins: all inputs and the output share one channel space.
MERGES = {"Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum"}
PRODUCERS = {
    "Dense": "units",
    "Conv1D": "filters",
    "Conv2D": "filters",
    "Conv3D": "filters",
    "SeparableConv1D": "filters",
    "SeparableConv2D": "filters",
    "Embedding": "output_dim",
}
RECURRENT = frozenset(GATES)  # the recurrent layers whose cost mpconvert knows


@dataclass(frozen=True)
class PadPlan:
    multiple: int
    sizes: dict[str, int]  # padded producer layer -> new width
    input_pads: dict[str, int]  # input layer -> new width
    slices: tuple[tuple[str, str], ...]  # (tensor producer, consumer or "" for a model output)
    flatten_maps: dict[str, str]  # Dense after a Flatten -> the Flatten
    padded: tuple[PaddedDim, ...]
    skipped: tuple[SkippedDim, ...]
    flops: int
    padded_flops: int

    @property
    def flops_overhead(self) -> float:
        return (self.padded_flops / self.flops - 1.0) if self.flops else 0.0

    @property
    def empty(self) -> bool:
        return not self.sizes and not self.input_pads


def padded_width(width: int, multiple: int) -> int:
    return math.ceil(width / multiple) * multiple


# --- 1. classifying: what each layer does to the channels -------------------


@dataclass
class Channels:
    """What classifying the layers found out about their channels."""

    outputs: frozenset[str]
    spaces: Spaces = field(default_factory=Spaces)
    producers: dict[str, tuple[str, int]] = field(default_factory=dict)  # layer -> (dim name, width)
    absorbers: dict[str, str] = field(default_factory=dict)  # layer -> the layer whose channels it absorbs
    flattens: dict[str, str] = field(default_factory=dict)  # Flatten layer -> its input layer
    slice_before: dict[str, str] = field(default_factory=dict)  # output activation -> its input layer
    flatten_maps: dict[str, str] = field(default_factory=dict)  # Dense after a Flatten -> the Flatten


def _block_around(layer: Layer, ch: Channels, inbound: str, outbound: str) -> None:
    for source in layer.sources:
        ch.spaces.block(source, inbound)
    ch.spaces.block(layer.name, outbound)


def _absorb(layer: Layer, ch: Channels) -> None:
    if layer.sources:
        ch.absorbers[layer.name] = layer.sources[-1]


def _input(layer: Layer, ch: Channels) -> None:
    cfg = layer.config
    shape = tuple(cfg.get("batch_shape") or cfg.get("batch_input_shape") or ())
    dtype = str(cfg.get("dtype", "float32"))
    if dtype.startswith("float") and shape and shape[-1]:
        ch.producers[layer.name] = ("features", shape[-1])
        if len(shape) > 2:
            ch.spaces.block(
                layer.name,
                "image/sequence input channels: cuDNN pads these itself, and padding "
                "them here would reshape the whole input",
            )
    else:
        ch.spaces.block(layer.name, "not a float input")


def _called_more_than_once(layer: Layer, ch: Channels) -> None:
    cls, name = layer.class_name, layer.name
    _block_around(
        layer,
        ch,
        f"feeds {cls} {name!r}, which is called more than once",
        f"produced by {cls} {name!r}, which is called more than once",
    )


def _producer(layer: Layer, ch: Channels) -> None:
    cls, name, cfg = layer.class_name, layer.name, layer.config
    if cls.startswith("Conv") and (cfg.get("groups", 1) != 1 or cfg.get("data_format") == "channels_first"):
        _block_around(
            layer, ch, f"feeds grouped or channels_first {cls} {name!r}", f"{cls} {name!r} is grouped or channels_first"
        )
        return
    ch.producers[name] = (PRODUCERS[cls], int(cfg[PRODUCERS[cls]]))
    if cls == "Embedding":
        # Its input's last axis is token positions, not channels. A tf.keras
        # 2.x text model's `Input((maxlen,))` is float, so it looked like
        # padable features: 25 -> 32 appended 7 tokens of id 0, the LSTM ran
        # 7 more steps, and the outputs moved by 0.017 (proof rejected).
        for source in layer.sources:
            ch.spaces.block(source, f"feeds Embedding {name!r}: its last axis is token positions, not channels")
        return
    _absorb(layer, ch)


def _recurrent(layer: Layer, ch: Channels) -> None:
    _absorb(layer, ch)
    reason = f"{layer.class_name} units are not padded (its recurrent kernel and gates would need it)"
    ch.spaces.block(layer.name, reason)


def _join(layer: Layer, ch: Channels) -> None:
    """Per-channel layers and elementwise merges: output and inputs share one space."""
    for source in layer.sources:
        ch.spaces.union(source, layer.name)


def _is_softmax(layer: Layer) -> bool:
    cls = layer.class_name
    return cls == "Softmax" or (cls == "Activation" and layer.config.get("activation") in SOFTMAX_ACTIVATIONS)


def _softmax(layer: Layer, ch: Channels) -> None:
    if layer.name in ch.outputs and len(layer.sources) == 1:
        # The float32 softmax at a model output: slice the padding off
        # right before it, so it normalizes over the real classes only.
        ch.slice_before[layer.name] = layer.sources[0]
    else:
        _blocker(layer, ch)


def _activation(layer: Layer, ch: Channels) -> None:
    (_softmax if _is_softmax(layer) else _join)(layer, ch)


def _batchnorm(layer: Layer, ch: Channels) -> None:
    if _is_last_axis(layer.config.get("axis"), len(layer.output_shape or ())):
        ch.spaces.union(layer.sources[0], layer.name)
    else:
        _blocker(layer, ch)


def _is_last_axis(axis, rank: int) -> bool:
    # tf-keras stores BatchNormalization's axis as a list ([3]), Keras 3 as an int.
    if isinstance(axis, (list, tuple)):
        if len(axis) != 1:
            return False
        axis = axis[0]
    return axis in (-1, rank - 1)


def _depthwise(layer: Layer, ch: Channels) -> None:
    if layer.config.get("depth_multiplier", 1) == 1 and layer.config.get("data_format") != "channels_first":
        ch.spaces.union(layer.sources[0], layer.name)
    else:
        _blocker(layer, ch)


def _flatten(layer: Layer, ch: Channels) -> None:
    if len(layer.sources) == 1:
        ch.flattens[layer.name] = layer.sources[0]
    else:
        _blocker(layer, ch)


def _blocker(layer: Layer, ch: Channels) -> None:
    cls, name = layer.class_name, layer.name
    if cls in CHANNEL_NORMALIZATION_LAYERS:
        reason = f"feeds {cls} {name!r}, which normalizes across this axis"
    elif _is_softmax(layer):
        reason = f"feeds a softmax ({name!r}) across this axis"
    elif cls == "Concatenate":
        reason = f"feeds Concatenate {name!r}, which would shift the channels after it"
    else:
        reason = f"feeds {cls} {name!r}, which mpconvert cannot pad consistently"
    _block_around(layer, ch, reason, f"produced by {cls} {name!r}")


Kind = Callable[[Layer, Channels], None]
# Each layer class's channel constraints; a class not listed blocks padding.
KINDS: dict[str, Kind] = {
    "InputLayer": _input,
    **dict.fromkeys(PRODUCERS, _producer),
    **dict.fromkeys(RECURRENT, _recurrent),
    **dict.fromkeys(PER_CHANNEL | MERGES, _join),
    "Activation": _activation,  # per channel, unless it is a softmax
    "Softmax": _softmax,
    "BatchNormalization": _batchnorm,
    "DepthwiseConv2D": _depthwise,
    "Flatten": _flatten,
}


def _follow_flattens(graph: LayerGraph, ch: Channels) -> None:
    # A Flatten can pass padding on only to Dense layers, whose kernel rows
    # are then re-indexed; anything else after it cannot follow the layout.
    for flat, source in ch.flattens.items():
        users = graph.consumers(flat)
        if flat in ch.outputs or not users or any(graph.layers[u].class_name != "Dense" for u in users):
            ch.spaces.block(source, f"Flatten {flat!r} feeds a layer that cannot follow padded channels")
        else:
            ch.flatten_maps.update({u: flat for u in users})
            for user in users:
                ch.absorbers.pop(user, None)


def classify(graph: LayerGraph) -> Channels:
    ch = Channels(frozenset(graph.outputs))
    for layer in graph.layers.values():
        kind = _called_more_than_once if layer.calls > 1 else KINDS.get(layer.class_name, _blocker)
        kind(layer, ch)
    _follow_flattens(graph, ch)
    return ch


# --- 2. grouping: one decision per channel space ----------------------------


def _padded(ch: Channels, layer: str, to: int) -> PaddedDim:
    dim, width = ch.producers[layer]
    return PaddedDim(layer, dim, width, to)


def _skip(ch: Channels, layer: str, reason: str) -> SkippedDim:
    dim, width = ch.producers[layer]
    return SkippedDim(layer, dim, width, reason)


def _groups(ch: Channels) -> dict[str, list[str]]:
    """Channel space (its root) -> the producers in it."""
    groups: dict[str, list[str]] = {}
    for name in ch.producers:
        groups.setdefault(ch.spaces.find(name), []).append(name)
    return groups


def _candidates(ch: Channels, groups: dict[str, list[str]], multiple: int) -> tuple[dict[str, int], list[SkippedDim]]:
    """Spaces worth padding (root -> target width), and the skipped producers."""
    candidates: dict[str, int] = {}
    skipped: list[SkippedDim] = []
    for root, names in groups.items():
        widths = {ch.producers[n][1] for n in names}
        width = next(iter(widths))
        target = padded_width(width, multiple)
        if target == width:
            continue
        reason = ch.spaces.reason(root)
        if width < multiple:
            # A matrix this narrow is memory-bound: Tensor Cores gain nothing,
            # and padding would multiply its work by up to `multiple`.
            reason = f"narrower than the multiple ({width} < {multiple}); padding would not pay"
        if len(widths) != 1:
            reason = f"joined channels have different widths {sorted(widths)}"
        if reason:
            skipped.extend(_skip(ch, n, reason) for n in names)
        else:
            candidates[root] = target
    return candidates, skipped


# --- 3. the FLOPs budget ----------------------------------------------------


def _widths(graph: LayerGraph, ch: Channels, chosen: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """Output widths of padded producers and input widths of their absorbers, for the chosen spaces."""
    out = {n: chosen[ch.spaces.find(n)] for n in ch.producers if ch.spaces.find(n) in chosen}
    ins = {a: chosen[ch.spaces.find(s)] for a, s in ch.absorbers.items() if ch.spaces.find(s) in chosen}
    for dense, flat in ch.flatten_maps.items():
        root = ch.spaces.find(ch.flattens[flat])
        if root in chosen:
            ins[dense] = math.prod(known(graph.layers[flat].input_shape)[1:-1]) * chosen[root]
    return out, ins


def _fit_budget(
    graph: LayerGraph, ch: Channels, groups: dict[str, list[str]], candidates: dict[str, int], max_overhead: float
) -> tuple[dict[str, int], list[SkippedDim]]:
    """Cheapest spaces first, while the whole model's FLOPs stay within budget."""
    base = flops(graph, {}, {})

    def cost(root: str) -> int:
        return flops(graph, *_widths(graph, ch, {root: candidates[root]})) - base

    accepted: dict[str, int] = {}
    skipped: list[SkippedDim] = []
    for root in sorted(candidates, key=cost):
        trial = {**accepted, root: candidates[root]}
        overhead = (flops(graph, *_widths(graph, ch, trial)) / base - 1.0) if base else 0.0
        if overhead <= max_overhead + 1e-12:
            accepted = trial
        else:
            reason = f"would raise the model's FLOPs to +{overhead:.1%} (over --max-pad-overhead {max_overhead:g})"
            skipped.extend(_skip(ch, n, reason) for n in groups[root])
    return accepted, skipped


# --- the plan ---------------------------------------------------------------


def plan_padding(graph: LayerGraph, options: PadOptions) -> PadPlan:
    """Decide which channel spaces of `graph` to pad."""
    ch = classify(graph)
    groups = _groups(ch)
    candidates, skipped = _candidates(ch, groups, options.multiple)
    accepted, over_budget = _fit_budget(graph, ch, groups, candidates, options.max_overhead)
    out, ins = _widths(graph, ch, accepted)

    def padded_space(layer: str) -> bool:
        return ch.spaces.find(layer) in accepted

    slices = tuple((src, act) for act, src in ch.slice_before.items() if padded_space(src))
    slices += tuple((o, "") for o in graph.outputs if o not in ch.slice_before and padded_space(o))
    is_input = {n: graph.layers[n].class_name == "InputLayer" for n in out}
    return PadPlan(
        multiple=options.multiple,
        sizes={n: w for n, w in out.items() if not is_input[n]},
        input_pads={n: w for n, w in out.items() if is_input[n]},
        slices=slices,
        flatten_maps={d: f for d, f in ch.flatten_maps.items() if padded_space(ch.flattens[f])},
        padded=tuple(_padded(ch, n, w) for n, w in sorted(out.items())),
        skipped=tuple(sorted(skipped + over_budget, key=lambda s: s.layer)),
        flops=flops(graph, {}, {}),
        padded_flops=flops(graph, out, ins),
    )
