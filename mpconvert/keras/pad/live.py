"""A live Keras model turned into the planner's `LayerGraph`."""

from __future__ import annotations

from typing import Any

from mpconvert.keras.configs import model_config
from mpconvert.keras.frameworks import Framework
from mpconvert.keras.pad.layer_graph import LayerGraph, Shape, Shapes
from mpconvert.keras.pad.plan import PadPlan, plan_padding
from mpconvert.keras.trace import nodes
from mpconvert.options.pad import PadOptions


def as_functional(model: Any, framework: Framework) -> Any:
    """A Sequential becomes the equivalent Functional so both share one code path."""
    if type(model).__name__ == "Sequential":
        return framework.module.Model(model.inputs, model.outputs, name=model.name)
    return model


def live_shapes(model: Any) -> dict[str, Shapes]:
    """Each layer's first input and first output shape, read from this model's own nodes.

    Not from `layer.input`/`layer.output`: a layer with another node outside
    this graph (a loaded Keras 3 Sequential's first layer keeps the one from
    its build) has no single input there, and tf-keras refuses to guess.
    """
    shapes: dict[str, Shapes] = {}
    for node in nodes(model):  # the inputs first
        ins, outs = node.inputs, node.outputs
        shapes.setdefault(node.layer.name, (_shape(ins[0]) if ins else None, _shape(outs[0]) if outs else None))
    return shapes


def _shape(tensor: Any) -> Shape:
    return tuple(tensor.shape)


def describe(model: Any, framework: Framework) -> LayerGraph:
    """The graph of `model` (Functional or Sequential) as plain data for the planner."""
    model = as_functional(model, framework)
    return LayerGraph.from_config(model_config(model), live_shapes(model))


def plan_model_padding(model: Any, framework: Framework, options: PadOptions) -> PadPlan:
    return plan_padding(describe(model, framework), options)
