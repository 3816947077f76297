"""A Keras model (Keras 3 or tf-keras) in memory.

`run` predicts in batches (`Model.predict`, one traced function per model),
or with `eager=True` calls the model eagerly in small chunks: a proof that
compares a rebuild with its source runs the same kernels for both without
tracing each (predict's trace cost 1.5 s of MobileNetV2's proof). `timer`
traces one call the way a path serves it: the Keras call (`keras`), or the
serving function the exported SavedModel holds (`savedmodel`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpconvert.data.signature import Signature, signature_of
from mpconvert.runners.base import RUNTIME_TENSORFLOW, RunResult, as_float32

PREDICT_BATCH = 256
# Rows per eager call: the activations of one chunk are held at once.
FORWARD_BATCH = 32
PATHS = ("keras", "savedmodel")


@dataclass(frozen=True)
class KerasRunner:
    model: Any
    signature: Signature | None = None  # the model's own when not given
    path: str = "keras"  # what `timer` traces: the Keras call, or the SavedModel serving function
    eager: bool = False  # `run` by eager calls instead of predict
    runtime: str = RUNTIME_TENSORFLOW

    def __post_init__(self) -> None:
        if self.path not in PATHS:
            raise ValueError(f"unknown speed path {self.path!r}; known: {', '.join(PATHS)}")

    def run(self, inputs: Sequence[np.ndarray]) -> RunResult:
        outputs = self._forward(inputs) if self.eager else self._predict(inputs)
        return RunResult(outputs, self.runtime, names=tuple(spec.name for spec in self._signature.outputs))

    @property
    def _signature(self) -> Signature:
        return self.signature or signature_of(self.model)

    def _predict(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        signature = self._signature
        if len(inputs[0]) == 0:
            # No rows: Keras 3.15's predict fails (UnboundLocalError: 'batch_outputs'), an eager call of a
            # Conv2D model too (oneDNN: "Incompatible shapes: [0,4,4,16] vs. [1,1,1,30]"), predict_on_batch
            # of a 16-bit LSTM as well ("Shape must be rank 1 but is rank 2 ... BiasAdd"); the traced
            # serving function, which the exported SavedModel runs, takes them.
            import tensorflow as tf

            serve = tf.function(serving_fn(self.model, signature), input_signature=input_specs(signature))
            found = serve(*(tf.constant(x) for x in inputs))
            return as_float32([found[spec.name].numpy() for spec in signature.outputs])
        predicted = self.model.predict(signature.feed(predictable(inputs)), batch_size=PREDICT_BATCH, verbose=0)
        return as_float32(signature.output_list(predicted))

    def _forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        signature = self._signature
        chunks: list[list[np.ndarray]] = []
        for start in range(0, len(inputs[0]), FORWARD_BATCH):
            feed = signature.feed([x[start : start + FORWARD_BATCH] for x in inputs])
            outputs = signature.output_list(self.model(feed, training=False))
            chunks.append(as_float32(outputs))
        return [np.concatenate(parts) for parts in zip(*chunks)]

    def timer(self, inputs: Sequence[Any]) -> Callable[[], None]:
        import tensorflow as tf

        feeds = [x if tf.is_tensor(x) else tf.constant(x) for x in inputs]
        if self.path == "keras":
            model, signature = self.model, self._signature
            fn = tf.function(lambda *xs: model(signature.feed(xs), training=False))
        else:
            # What the exported SavedModel's signature runs, traced in memory:
            # the same function the export hands to the export archive.
            signature = self._signature
            fn = tf.function(serving_fn(self.model, signature), input_signature=input_specs(signature))
        return lambda: fetch(fn(*feeds))


def predictable(inputs: Sequence[Any]) -> list[Any]:
    """The inputs as `Model.predict` and `fit` take them: a string array as a tf.string tensor.

    Keras 3.15's data adapters refuse NumPy text of every kind ("Invalid
    dtype: str224" for '<U7', bytes8 for 'S1', object), while a string tensor
    passes through them, and a direct model call takes either.
    """
    import tensorflow as tf

    return [tf.constant(x) if isinstance(x, np.ndarray) and x.dtype.kind in "USO" else x for x in inputs]


def predict(model: Any, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """`model`'s outputs on every row, by `Model.predict`."""
    return KerasRunner(model).run(inputs).outputs


def forward(model: Any, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """`model`'s outputs on every row from eager calls, for comparing two models with each other."""
    return KerasRunner(model, eager=True).run(inputs).outputs


def input_specs(signature: Signature) -> list:
    import tensorflow as tf

    return [tf.TensorSpec(spec.shape, spec.dtype, name=spec.name) for spec in signature.inputs]


def serving_fn(model: Any, signature: Signature) -> Callable[..., dict]:
    """model(inputs) -> {output name: tensor}, so a SavedModel signature keeps the model's names."""
    names = [spec.name for spec in signature.outputs]

    def serve(*inputs: Any) -> dict:
        outputs = signature.output_list(model(signature.feed(inputs), training=False))
        return dict(zip(names, outputs))

    return serve


def fetch(outputs: Any) -> None:
    # Copy the outputs to the host: a GPU returns before it has finished.
    import tensorflow as tf

    for tensor in tf.nest.flatten(outputs):
        tensor.numpy()
