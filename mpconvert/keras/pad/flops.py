"""Multiply-adds per sample of a `LayerGraph`, from its shapes and layer configs.

The padding budget compares these counts with and without padding; every
number comes from the graph (units, kernel_size, depth_multiplier and the
tensor shapes), none from a live layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from mpconvert.keras.pad.layer_graph import Layer, LayerGraph, known

# Gate matrices per recurrent cell: LSTM input/forget/cell/output, GRU
# update/reset/candidate, SimpleRNN one.
GATES = {"LSTM": 4, "GRU": 3, "SimpleRNN": 1}


def _kernel_volume(layer: Layer) -> int:
    kernel = layer.config["kernel_size"]
    if isinstance(kernel, int):
        return kernel ** (len(known(layer.output_shape)) - 2)
    return math.prod(kernel)


def _recurrent_macs(layer: Layer, c_in: int, c_out: int, positions: int) -> int:
    units = layer.config["units"]
    gates = GATES[layer.class_name]
    steps = known(layer.input_shape)[1] or 1
    return (c_in + units) * gates * units * steps


def _separable_macs(layer: Layer, c_in: int, c_out: int, positions: int) -> int:
    mult = layer.config["depth_multiplier"]
    return (_kernel_volume(layer) * c_in * mult + c_in * mult * c_out) * positions


Macs = Callable[[Layer, int, int, int], int]  # (layer, input channels, output channels, positions)
# Multiply-accumulates per sample of each matmul/conv layer class.
MACS: dict[str, Macs] = {
    "Dense": lambda layer, c_in, c_out, positions: c_in * c_out * positions,
    **dict.fromkeys(GATES, _recurrent_macs),
    "DepthwiseConv2D": lambda layer, c_in, c_out, positions: _kernel_volume(layer) * c_in * positions,
    **dict.fromkeys(("SeparableConv1D", "SeparableConv2D"), _separable_macs),
    **dict.fromkeys(
        ("Conv1D", "Conv2D", "Conv3D"),
        lambda layer, c_in, c_out, positions: _kernel_volume(layer) * c_in * c_out * positions,
    ),
}


def flops(graph: LayerGraph, widths: dict[str, int], in_widths: dict[str, int]) -> int:
    """Multiply-accumulates per sample of every matmul/conv, with the given widths.

    `widths` overrides a layer's output channels, `in_widths` its input
    channels; everything else comes from the graph's own shapes. A layer
    called more than once is left out.
    """
    total = 0
    for name, layer in graph.layers.items():
        macs = MACS.get(layer.class_name)
        if macs is None or layer.calls != 1:
            continue
        c_in = in_widths.get(name, known(layer.input_shape)[-1])
        c_out = widths.get(name, known(layer.output_shape)[-1])
        positions = math.prod(d or 1 for d in known(layer.output_shape)[1:-1])
        total += macs(layer, c_in, c_out, positions)
    return total
