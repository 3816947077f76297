"""A serving function that answers an empty request with empty outputs, without running the model.

TensorFlow 2.21's oneDNN kernels fail on a batch of 0 rows for 16-bit ops
that float32 runs fine: a float16/bfloat16 Conv2D fused with its BiasAdd
("Must provide as many biases as the last dimension of the input tensor:
[8] vs. [0,8,8,1]"), a float16 FusedBatchNorm ("scale must have the same
number of elements as the channels of x, got 32 and 1"). Servers do send
empty batches. The written SavedModels branch on the batch size, and every
artifact's check at 0 rows holds the empty branch to the model's output
shapes and dtypes. Where an output has a dimension other than the batch
that is not fixed, there is no shape to answer with, and no guard.

The LiteRT file cannot take that branch: the interpreter's If over an
empty constant fails ("Invalid tensor size"), and an unrolled recurrent
layer's UNPACK refuses a batch of 0 rows ("NumElements(input) > 0 was
not true"). Its function pads instead, without a branch: an empty request
runs on one row of zeros, and the outputs are cut back to the rows asked
for (`padded`); a request with rows runs as it is. A model that takes text
is left as it is: LiteRT has no concatenation of strings. Every ONNX file
is padded the same way, in its graph (onnx/empty_batch.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mpconvert.data.signature import TensorSpec


def guarded(serve: Callable[..., dict], names: Sequence[str], outputs: Sequence[TensorSpec]) -> Callable[..., dict]:
    """`serve(*inputs) -> {name: tensor}` with an empty batch answered by zeros of shape (0, ...)."""
    shapes = [tuple(spec.shape[1:]) for spec in outputs]
    if any(None in shape for shape in shapes):
        return serve

    def serve_any_batch(*inputs: Any) -> dict:
        import tensorflow as tf

        def empty() -> dict:
            return {name: tf.zeros((0, *shape), spec.dtype) for name, shape, spec in zip(names, shapes, outputs)}

        return tf.cond(tf.shape(inputs[0])[0] > 0, lambda: serve(*inputs), empty)

    return serve_any_batch


def padded(serve: Callable[..., dict]) -> Callable[..., dict]:
    """`serve(*inputs) -> {name: tensor}` with an empty batch run on one row of zeros, then cut to 0 rows."""

    def serve_any_batch(*inputs: Any) -> dict:
        import tensorflow as tf

        if any(x.dtype == tf.string for x in inputs):  # LiteRT has no ConcatV2 for text: served as it is
            return serve(*inputs)
        rows = tf.shape(inputs[0])[0]
        missing = tf.maximum(1 - rows, 0)  # 1 for an empty request, else 0: no branch
        filled = [tf.concat([x, tf.zeros(tf.concat([[missing], tf.shape(x)[1:]], 0), x.dtype)], 0) for x in inputs]
        return {name: tensor[:rows] for name, tensor in serve(*filled).items()}

    return serve_any_batch
