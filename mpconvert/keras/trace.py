"""Every layer call of a model, with the values that went in and came out.

The lint, the search's ranking and the fidelity proof read intermediate
values. A probe `Model(model.inputs, [every layer's output])` cannot give
them once containers nest: an inner layer's output is not connected to the
outer inputs ("Output with path 7 is not connected to inputs"), a shared
layer has no single `output`, and a model used twice has two. So the model's
own graph is run here node by node, in the order Keras itself runs it,
descending into nested Functional and Sequential models: each call is
recorded under its layer path ("encoder/dense_1", as the rewrite plan names
layers), once per call, with every output tensor and the paths of the calls
that produced its inputs.

This module is also the one place that reads Keras's node objects, which
differ between Keras 3 (`node.operation`, `node.arguments`) and tf-keras
(`node.layer`, `node.map_arguments`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpconvert.keras.configs import lists_layers, policy_of
from mpconvert.system.errors import MpconvertError


@dataclass(frozen=True)
class Node:
    """One call of a layer in a model's own graph, in either framework."""

    raw: Any

    @property
    def layer(self) -> Any:
        return getattr(self.raw, "operation", None) or self.raw.layer  # Keras 3, tf-keras

    @property
    def is_input(self) -> bool:
        return bool(self.raw.is_input)

    @property
    def inputs(self) -> list:
        """The symbolic tensors fed to the call, flat."""
        if hasattr(self.raw, "arguments"):
            return list(self.raw.arguments.keras_tensors)
        return list(self.raw.keras_inputs)

    @property
    def outputs(self) -> list:
        return flat(self.raw.outputs)

    def arguments(self, values: dict[int, Any]) -> tuple[tuple, dict]:
        """The call's (args, kwargs) with each symbolic tensor replaced by its value (by id)."""
        if hasattr(self.raw, "arguments"):
            return self.raw.arguments.fill_in(values)
        # tf-keras pops each value from a list per use; every use here sees the same value.
        return self.raw.map_arguments(_Reusable(values))


class _Same:
    def __init__(self, value: Any):
        self.value = value

    def pop(self) -> Any:
        return self.value


class _Reusable(dict):
    """tf-keras's tensor_dict: str(id) -> a list it pops one value from per use."""

    def __init__(self, by_id: dict[int, Any]):
        super().__init__()
        self.by_id = by_id

    def __getitem__(self, key: str) -> _Same:
        return _Same(self.by_id[int(key)])


def flat(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in flat(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in flat(item)]
    return [value]


def graph_of(model: Any) -> Any | None:
    """The object that holds `model`'s node graph, or None (a subclassed model, an unbuilt Sequential)."""
    graph = getattr(model, "_functional", None) or model  # a Keras 3 Sequential keeps its graph there
    if getattr(graph, "_nodes_by_depth", None) is None or getattr(graph, "_is_graph_network", True) is False:
        return None
    return graph


def nodes(model: Any) -> Iterator[Node]:
    """The calls in `model`'s own graph (not inside nested models), in execution order."""
    graph = graph_of(model)
    if graph is None:
        return
    for depth in sorted(graph._nodes_by_depth, reverse=True):  # the inputs first
        for raw in graph._nodes_by_depth[depth]:
            yield Node(raw)


def is_container(layer: Any) -> bool:
    """A nested model whose own graph can be walked."""
    return hasattr(layer, "layers") and graph_of(layer) is not None


def mask_zero_inputs(model: Any) -> dict[int, str]:
    """{index of a model input: the Embedding(mask_zero=True) layer that reads it directly}.

    Such an Embedding makes Keras mask every position whose id is 0 for the
    layers after it, so those positions are padding to the model itself.
    """
    graph = graph_of(model)
    if graph is None:
        return {}
    by_id = {id(t): i for i, t in enumerate(graph.inputs)}
    found: dict[int, str] = {}
    for node in nodes(graph):
        layer = None if node.is_input else node.layer
        if layer is None or not getattr(layer, "mask_zero", False):
            continue
        for tensor in node.inputs:
            if id(tensor) in by_id:
                found.setdefault(by_id[id(tensor)], layer.name)
    return found


@dataclass(frozen=True)
class Call:
    path: str  # "encoder/dense_1"; a model input under its name
    layer: Any
    index: int  # 0 for a layer's first call in this run, 1 for its second, ...
    args: tuple
    kwargs: dict
    outputs: tuple[np.ndarray, ...]  # every output tensor
    sources: tuple[str, ...]  # paths of the calls (or model inputs) that produced its tensor inputs

    @property
    def class_name(self) -> str:
        return "InputLayer" if self.layer is None else type(self.layer).__name__


def _accepts_training(layer: Any) -> bool:
    try:
        return "training" in inspect.signature(layer.call).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def _source_name(tensor: Any) -> str:
    history = getattr(tensor, "_keras_history", None)
    return history[0].name if history else getattr(tensor, "name", "input")


class _Tracer:
    def __init__(self, record_inputs: bool):
        self.calls: list[Call] = []
        self.counts: dict[str, int] = {}
        self.record_inputs = record_inputs

    def run(self, model: Any, feeds: list, sources: list[str], prefix: str) -> tuple[list, list[str]]:
        """Run `model` on `feeds`; returns its output values and the paths that produced them."""
        graph = graph_of(model)
        if graph is None:
            if type(model).__name__ != "Sequential":
                raise MpconvertError(
                    f"model {model.name!r} ({type(model).__name__}) has no layer graph to trace",
                    hint="mpconvert converts Functional and Sequential models",
                )
            value, source = feeds[0], sources[0]
            for layer in model.layers:  # a tf-keras Sequential built without an Input
                (value,), (source,) = self.call(layer, (value,), {}, [source], prefix)
            return [value], [source]
        values = {id(t): v for t, v in zip(graph.inputs, feeds)}
        producer = {id(t): s for t, s in zip(graph.inputs, sources)}
        for node in nodes(graph):
            if node.is_input or any(id(t) not in values for t in node.inputs):
                continue
            args, kwargs = node.arguments(values)
            from_paths = [producer[id(t)] for t in node.inputs]
            outputs, out_sources = self.call(node.layer, args, kwargs, from_paths, prefix)
            for tensor, value, source in zip(node.outputs, outputs, out_sources):
                values[id(tensor)] = value
                producer[id(tensor)] = source
        return [values[id(t)] for t in graph.outputs], [producer[id(t)] for t in graph.outputs]

    def call(self, layer: Any, args: tuple, kwargs: dict, sources: list[str], prefix: str) -> tuple[list, list[str]]:
        path = prefix + layer.name
        if is_container(layer):
            feeds = flat(args[0] if len(args) == 1 else list(args))
            return self.run(layer, feeds, sources, path + "/")
        if _accepts_training(layer):
            kwargs = {**kwargs, "training": False}
        outputs = flat(layer(*args, **kwargs))
        index = self.counts.get(path, 0)
        self.counts[path] = index + 1
        recorded_args, recorded_kwargs = (args, kwargs) if self.record_inputs else ((), {})
        arrays = tuple(np.asarray(o) for o in outputs)
        self.calls.append(Call(path, layer, index, recorded_args, recorded_kwargs, arrays, tuple(sources)))
        return outputs, [path] * len(outputs)


def trace(model: Any, inputs: list[np.ndarray], record_inputs: bool = True) -> list[Call]:
    """Every layer call of `model` on `inputs`, nested models included, in execution order.

    The model's inputs come first, as calls of their InputLayer with the fed
    value as output. `record_inputs=False` keeps only outputs (less memory).
    """
    import tensorflow as tf

    tensors = [tf.convert_to_tensor(x, dtype=t.dtype) for x, t in zip(inputs, model.inputs)]
    names = [_source_name(t) for t in model.inputs]
    tracer = _Tracer(record_inputs)
    for name, value in zip(names, tensors):
        tracer.calls.append(Call(name, None, 0, (), {}, (np.asarray(value),), ()))
    tracer.run(model, tensors, names, "")
    return tracer.calls


def layer_at(model: Any, path: str) -> Any:
    """The layer of `model` at a plan path ("encoder/dense_1")."""
    layer = model
    for name in path.split("/"):
        layer = layer.get_layer(name)
    return layer


def producer(tensor: Any) -> tuple[Any, int] | None:
    """The layer that computes a symbolic tensor, and which of its outputs it is (None when unknown)."""
    history = getattr(tensor, "_keras_history", None)
    if history is None:
        return None
    return history[0], history[2]  # (operation / layer, node index, tensor index) in both frameworks


def output_layers(model: Any) -> list[Any]:
    """The innermost layer computing each of `model`'s outputs, in the signature's order.

    A nested model's output is followed into it, so a classifier head
    inside a sub-model is found. None where Keras does not say.
    """
    found = []
    for tensor in getattr(model, "outputs", None) or []:
        made = producer(tensor)
        while made is not None and is_container(made[0]):
            inner = made[0].outputs
            made = producer(inner[made[1]]) if made[1] < len(inner) else None
        found.append(made[0] if made else None)
    return found


@dataclass(frozen=True)
class Sublayer:
    """A layer built by another layer's own code (not listed in any config), as its rows in the report show it."""

    path: str  # "bert_backbone/transformer_layer_0/self_attention_layer/softmax"
    class_name: str
    policy: str | None  # the policy it computes under
    outer_policy: str | None  # the policy of the config-listed layer that holds it


def sublayers(model: Any) -> dict[str, tuple[Sublayer, ...]]:
    """Plan path of each config-listed layer that holds layers of its own -> those layers, depth first.

    Functional and Sequential models whose config lists their layers are
    walked as the rewrite plans them ("outer/inner" paths); any other layer's
    tracked sublayers (a keras-hub backbone's transformer blocks, a
    MultiHeadAttention's projections and Softmax) are listed under it, with
    the policies they compute under. Keras names the path after each layer's
    name in the object that holds it.
    """
    found: dict[str, tuple[Sublayer, ...]] = {}

    def inside(layer: Any, prefix: str, outer: str | None, seen: set[int]) -> list[Sublayer]:
        rows = []
        for sub in layer._flatten_layers(include_self=False, recursive=False):
            if id(sub) in seen or type(sub).__name__ == "InputLayer":
                continue
            seen.add(id(sub))
            path = f"{prefix}/{sub.name}"
            rows.append(Sublayer(path, type(sub).__name__, policy_of(sub), outer))
            rows.extend(inside(sub, path, outer, seen))
        return rows

    def visit(container: Any, prefix: str) -> None:
        for layer in container.layers:
            path = prefix + layer.name
            if lists_layers(layer):
                visit(layer, path + "/")
            elif hasattr(layer, "_flatten_layers"):
                rows = inside(layer, path, policy_of(layer), {id(layer)})
                if rows:
                    found[path] = tuple(rows)

    visit(model, "")
    return found
