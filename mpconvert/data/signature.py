"""A model's inputs and outputs as plain values, the same for both frameworks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int | None, ...]  # including the batch dimension
    dtype: str

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith(("float", "bfloat"))

    @property
    def is_string(self) -> bool:
        return self.dtype == "string"

    def describe(self) -> str:
        dims = ", ".join("n" if i == 0 else ("?" if d is None else str(d)) for i, d in enumerate(self.shape))
        return f"({dims}) {self.dtype}"

    def to_json(self) -> dict:
        """As the report's `source` lists inputs and outputs."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, stored: dict) -> TensorSpec:
        return cls(stored["name"], tuple(stored["shape"]), stored["dtype"])


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # A model built with dict inputs (outputs) takes (returns) a dict: its
    # keys, one per spec in the specs' order, matched to the model's tensors
    # by identity, since a key need not be the Input (output) layer's name.
    # Empty for a model with a list or a single input (output).
    input_keys: tuple[str, ...] = ()
    output_keys: tuple[str, ...] = ()

    def feed(self, inputs: Sequence[Any]) -> Any:
        """What the model is called with for one array (or tensor) per input in the signature's order.

        The only place that shapes a model's arguments: Keras 3 refuses a list
        for a model built with a dict ("Expected: {'tokens': 'tokens', ...}").
        """
        if self.input_keys:
            return dict(zip(self.input_keys, inputs, strict=True))
        return list(inputs) if len(inputs) > 1 else inputs[0]

    def output_list(self, outputs: Any) -> list:
        """The model's outputs (a dict, a list or one tensor) as a list in the signature's order."""
        if isinstance(outputs, dict):
            if self.output_keys and set(self.output_keys) <= set(outputs):
                return [outputs[key] for key in self.output_keys]
            names = [spec.name for spec in self.outputs]
            if names and set(names) <= set(outputs):
                return [outputs[name] for name in names]
            return list(outputs.values())
        return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def _dtype_name(dtype: Any) -> str:
    return getattr(dtype, "name", None) or str(dtype)


def signature_of(model: Any) -> Signature:
    names = getattr(model, "input_names", None) or [t.name for t in model.inputs]
    inputs = tuple(TensorSpec(str(name), tuple(t.shape), _dtype_name(t.dtype)) for name, t in zip(names, model.inputs))
    # Keras 3 Sequential models have no output_names; their output is the last layer's.
    out_names = getattr(model, "output_names", None) or [model.layers[-1].name]
    outputs = tuple(
        TensorSpec(str(name), tuple(t.shape), _dtype_name(t.dtype)) for name, t in zip(out_names, model.outputs)
    )
    return Signature(inputs, outputs, _keys(model, "input", model.inputs), _keys(model, "output", model.outputs))


def _keys(model: Any, structure: str, tensors: Any) -> tuple[str, ...]:
    """The dict keys of `model.input` (`model.output`) in the order of `tensors`; () when not a dict.

    Matched by identity: the flat tensors follow the sorted keys, which are
    neither the order the dict was built in nor the layers' names.
    """
    try:
        nested = getattr(model, structure)
    except (AttributeError, ValueError):  # a graph-level model, or a layer called more than once
        return ()
    if not isinstance(nested, dict):
        return ()
    by_id = {id(tensor): str(key) for key, tensor in nested.items()}
    keys = tuple(by_id.get(id(tensor), "") for tensor in tensors)
    return keys if all(keys) and len(set(keys)) == len(keys) else ()


def _integer_upper_bound(model: Any) -> int:
    """Largest safe token id: the smallest Embedding vocabulary in the model."""
    sizes = [layer.input_dim for layer in _all_layers(model) if hasattr(layer, "input_dim")]
    return min(sizes) if sizes else 2


def _words(model: Any) -> list[str]:
    """Words to feed a string input: every string vocabulary in the model (StringLookup,
    TextVectorization), and two that no vocabulary holds, so the out-of-vocabulary path runs too."""
    words: list[str] = []
    for layer in _all_layers(model):
        try:
            vocabulary = layer.get_vocabulary() if hasattr(layer, "get_vocabulary") else []
        except Exception:  # a layer that was never adapted has no vocabulary yet
            vocabulary = []
        words.extend(w.decode() if isinstance(w, bytes) else w for w in vocabulary if isinstance(w, (str, bytes)))
    return sorted({w for w in words if w}) + ["mpconvert-unseen-0", "mpconvert-unseen-1"]


def _all_layers(model: Any):
    for layer in getattr(model, "layers", ()):  # a graph-level model has none
        yield layer
        if hasattr(layer, "layers"):
            yield from _all_layers(layer)


def generate_inputs(model: Any, signature: Signature, rows: int, seed: int) -> list[np.ndarray]:
    """Random inputs of the right shape and dtype, for drift checks without data.

    Float inputs are standard normal (the scale most models were trained on
    after normalization); integer inputs are valid token ids for every
    Embedding in the model; string inputs are words of the model's string
    vocabularies, with some unknown to all of them.
    """
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in signature.inputs:
        shape = (rows,) + tuple(1 if d is None else d for d in spec.shape[1:])
        if spec.is_string:
            words = np.array(_words(model))
            arrays.append(words[rng.integers(0, len(words), size=shape)])
        elif spec.is_float:
            dtype = spec.dtype if spec.dtype in ("float16", "float64") else np.float32  # what the input takes
            arrays.append(rng.standard_normal(shape).astype(dtype))
        else:
            arrays.append(rng.integers(0, _integer_upper_bound(model), size=shape).astype(spec.dtype))
    return arrays
