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

The modules, in the order the stage uses them:

* `graph`: `LayerGraph`, the model as plain data (config and shapes);
* `plan`: `plan_padding`, pure planning on a `LayerGraph` (its cost: `flops`);
* `model`: `describe` and `plan_model_padding`, from a live model;
* `apply`: `apply_padding`, the padded config and embedded weights;
* `proof`: `pad`, the stage: build, compare in float32 and 16 bits, decide.
"""

from mpconvert.keras.pad.apply import apply_padding
from mpconvert.keras.pad.layer_graph import Layer, LayerGraph
from mpconvert.keras.pad.live import describe, plan_model_padding
from mpconvert.keras.pad.plan import PadPlan, plan_padding
from mpconvert.keras.pad.proof import TOLERANCE_FLOAT32, Padding, pad

__all__ = [
    "Layer",
    "LayerGraph",
    "PadPlan",
    "Padding",
    "TOLERANCE_FLOAT32",
    "apply_padding",
    "describe",
    "pad",
    "plan_model_padding",
    "plan_padding",
]
