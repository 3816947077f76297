"""The model as the padding planner sees it: plain data, no live layers.

A `LayerGraph` is the model's functional config (each layer's class, config
and inbound nodes, and the output layers) plus each layer's input and output
shape. It reads both frameworks' node formats through `configs.tensor_refs`,
so a test can write one by hand and plan without TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mpconvert.keras.configs import tensor_refs

Shape = tuple  # of int | None, None for an unknown dimension (the batch)
Shapes = tuple[Shape | None, Shape | None]  # (first input, first output)


def known(shape: Shape | None) -> Shape:
    """A shape the planner relies on: every layer it pads or counts was called, so it has one."""
    if shape is None:
        raise ValueError("a layer the padding plan relies on was never called in the model's graph")
    return shape


@dataclass(frozen=True)
class Layer:
    name: str
    class_name: str
    config: dict
    sources: tuple[str, ...]  # the layers whose outputs it is called on, in every call
    # How often this model calls it: the inbound nodes of its config entry.
    # Not the live layer's `_inbound_nodes`, which also count calls from
    # other graphs (a loaded Keras 3 Sequential's first layer keeps the node
    # of its own build), so every such model would look shared.
    calls: int
    input_shape: Shape | None  # of its first input
    output_shape: Shape | None  # of its first output


@dataclass(frozen=True)
class LayerGraph:
    layers: dict[str, Layer]  # in config order
    outputs: tuple[str, ...]  # the layers whose tensors are model outputs

    @classmethod
    def from_config(cls, config: dict, shapes: Mapping[str, Shapes]) -> LayerGraph:
        """`config`: a Functional config in either framework's format; `shapes`: layer -> (input, output) shape."""
        layers = {}
        for entry in config["layers"]:
            name = entry["config"]["name"]
            nodes = entry.get("inbound_nodes", [])
            in_shape, out_shape = shapes.get(name, (None, None))
            sources = tuple(ref[0] for ref in tensor_refs(nodes))
            layers[name] = Layer(
                name, entry["class_name"], entry["config"], sources, len(nodes), _tuple(in_shape), _tuple(out_shape)
            )
        return cls(layers, tuple(ref[0] for ref in tensor_refs(config.get("output_layers", []))))

    def consumers(self, name: str) -> list[str]:
        return [layer.name for layer in self.layers.values() for source in layer.sources if source == name]


def _tuple(shape: Shape | list | None) -> Shape | None:
    return None if shape is None else tuple(shape)


class Spaces:
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
