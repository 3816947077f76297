"""Activation memory: the converted model against float32, measured on a GPU, else computed from shapes."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mpconvert.data.signature import Signature, signature_of
from mpconvert.keras.trace import graph_of, is_container, nodes
from mpconvert.report.sections.speed import ActivationMemory

COMPUTED = "computed from layer output shapes and dtypes"


def _calls(model: Any) -> list[tuple[Any, list]]:
    """Every call in `model`'s own graph, as (layer, its symbolic outputs): a shared layer once per call."""
    if graph_of(model) is None:  # no graph (a subclassed model): each layer's output, where it has one
        return [(layer, _output_of(layer)) for layer in model.layers]
    return [(node.layer, node.outputs) for node in nodes(model)]


def _output_of(layer: Any) -> list:
    import tensorflow as tf

    try:
        return tf.nest.flatten(layer.output)
    except (AttributeError, ValueError, RuntimeError):  # never called in a graph
        return []


def activation_bytes(model: Any, batch: int) -> tuple[int, list[str]]:
    """Bytes of every layer call's outputs at `batch` rows, and the layers whose size is unknown.

    Inputs are not counted (the caller holds them in any precision); a
    nested model counts its own layers. A layer whose output has a dimension
    only known at run time (a sequence length) is listed, not guessed.
    """
    import tensorflow as tf

    total, unknown = 0, list[str]()
    for layer, outputs in _calls(model):
        if type(layer).__name__ == "InputLayer":
            continue
        if is_container(layer):  # a nested model
            inner, missing = activation_bytes(layer, batch)
            total, unknown = total + inner, unknown + missing
            continue
        dims = [tuple(t.shape)[1:] for t in outputs]
        if not outputs or any(d is None for shape in dims for d in shape):
            unknown.append(layer.name)
            continue
        total += sum(batch * math.prod(shape) * tf.as_dtype(t.dtype).size for shape, t in zip(dims, outputs))
    return total, sorted(set(unknown))


def activation_memory(
    original: Any, converted: Any, batch: int, *, inputs: list | None = None, signature: Signature | None = None
) -> ActivationMemory:
    """Activation memory at `batch` rows: the converted model against the float32 original.

    Measured (peak GPU memory of one forward pass, less what was allocated
    before it) where TensorFlow has a GPU and `inputs` (tensors of `batch`
    rows) are given; else computed from every layer's output shape and dtype
    and labelled so. ratio = converted / float32: below 1 the converted model
    needs less. The converted model may be wider than the original (padding
    to multiples of 8): each is counted as it is.
    """
    import tensorflow as tf

    if inputs is not None and tf.config.list_physical_devices("GPU"):
        signature = signature or signature_of(original)
        from mpconvert.runners.keras import KerasRunner

        f32, conv = (_peak_gpu_bytes(KerasRunner(m, signature).timer(inputs)) for m in (original, converted))
        method = (
            f"measured: peak GPU memory of one forward pass at batch {batch} (tf.config.experimental.get_memory_info)"
        )
        unknown: list[str] = []
    else:
        (f32, missing_f32), (conv, missing_conv) = activation_bytes(original, batch), activation_bytes(converted, batch)
        method, unknown = COMPUTED, sorted(set(missing_f32 + missing_conv))
    return ActivationMemory.of(batch, f32, conv, method, tuple(unknown))


def _peak_gpu_bytes(run: Callable[[], None]) -> int:
    import tensorflow as tf

    run()  # traced and warmed up outside the measurement
    tf.config.experimental.reset_memory_stats("GPU:0")
    before = tf.config.experimental.get_memory_info("GPU:0")["current"]
    run()
    return tf.config.experimental.get_memory_info("GPU:0")["peak"] - before
