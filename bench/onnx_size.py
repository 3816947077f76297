"""ONNX file size of mixed-precision exports against the float32 export.

Issue 2 promises float16 weights in the ONNX file, about half the float32
size. Both files are written in this run by mpconvert's own export code, so
the ratio compares like with like.
"""

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from mpconvert.data.signature import generate_inputs, signature_of  # noqa: E402
from mpconvert.keras.frameworks import KERAS3  # noqa: E402
from mpconvert.keras.rewrite import rewrite  # noqa: E402
from mpconvert.onnx.export import keras_to_onnx  # noqa: E402
from mpconvert.options.rewrite import RewriteOptions  # noqa: E402

MODELS = {
    "digits_cnn": lambda: keras.models.load_model(Path(__file__).parent.parent / "sample_models" / "digits_cnn.keras"),
    "MobileNetV2": lambda: keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3), classes=100),
    "Dense4096x2": lambda: keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(4096, activation="relu"),
            keras.layers.Dense(4096, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    ),
}


def main() -> None:
    print(f"{'model':<14}{'float32':>12}{'mixed_float16':>16}{'ratio':>8}{'mixed_bfloat16':>17}{'ratio':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in MODELS.items():
            model = build()
            sig = signature_of(model)
            specs = [tf.TensorSpec(s.shape, s.dtype, name=s.name) for s in sig.inputs]
            sizes = {"float32": keras_to_onnx(model, specs, Path(tmp) / f"{name}_f32.onnx").bytes}
            for policy in ("mixed_float16", "mixed_bfloat16"):
                smoke = generate_inputs(model, sig, 2, 0)
                converted = rewrite(model, KERAS3, RewriteOptions(policy), smoke).model
                sizes[policy] = keras_to_onnx(converted, specs, Path(tmp) / f"{name}_{policy}.onnx").bytes
            f32 = sizes["float32"]
            print(
                f"{name:<14}{f32 / 1e6:>10.2f}MB{sizes['mixed_float16'] / 1e6:>14.2f}MB"
                f"{sizes['mixed_float16'] / f32:>8.3f}{sizes['mixed_bfloat16'] / 1e6:>15.2f}MB"
                f"{sizes['mixed_bfloat16'] / f32:>8.3f}"
            )


if __name__ == "__main__":
    main()
