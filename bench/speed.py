"""Train-step and inference speed of converted models against float32, on this machine.

Every figure is a ratio against a float32 baseline measured in the same run
with the same code path (mpconvert's fine-tuning trainer for training,
ONNX Runtime for inference), median of repeated runs. On a CPU with
avx512_bf16 mixed_bfloat16 should be faster and mixed_float16 slower; Tensor
Core gains from float16 and from padding need an NVIDIA GPU and are not
measured here.
"""

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import tensorflow as tf  # noqa: E402

from mpconvert.keras.finetune import Trainer  # noqa: E402
from mpconvert.keras.frameworks import KERAS3  # noqa: E402
from mpconvert.keras.rewrite import rewrite  # noqa: E402
from mpconvert.onnx.export import keras_to_onnx  # noqa: E402
from mpconvert.options.rewrite import RewriteOptions  # noqa: E402

REPEATS = 15


def dense_model(width: int):
    return keras.Sequential(
        [
            keras.Input((784,), name="x"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


def median_ms(fn) -> float:
    fn()  # warm-up: tracing, allocation
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def train_step_ms(model, policy, x, y) -> float:
    if policy != "float32":
        model = rewrite(model, KERAS3, RewriteOptions(policy), [x[:2]]).model
    loss = keras.losses.get("sparse_categorical_crossentropy")
    trainer = Trainer(KERAS3, model, loss, 1e-4, loss_scaling=policy == "mixed_float16")
    return median_ms(lambda: trainer.step([x], y))


def main() -> None:
    rng = np.random.default_rng(0)
    print("train step (Keras 3, mpconvert's fine-tuning loop), median ms and ratio to float32")
    for width, batch in ((4096, 256), (1024, 512)):
        x = rng.standard_normal((batch, 784)).astype("float32")
        y = rng.integers(0, 10, batch)
        model = dense_model(width)
        f32 = train_step_ms(model, "float32", x, y)
        row = [f"Dense({width})x2 batch {batch}: float32 {f32:.1f}"]
        for policy in ("mixed_bfloat16", "mixed_float16"):
            ms = train_step_ms(model, policy, x, y)
            row.append(f"{policy} {ms:.1f} (x{ms / f32:.2f})")
        print("  " + ", ".join(row))

    print("ONNX Runtime inference, Dense(4096)x2 batch 256, median ms and ratio to float32")
    x = rng.standard_normal((256, 784)).astype("float32")
    model = dense_model(4096)
    spec = [tf.TensorSpec((None, 784), tf.float32, name="x")]
    with tempfile.TemporaryDirectory() as tmp:
        times = {}
        for policy in ("float32", "mixed_float16"):
            source = model if policy == "float32" else rewrite(model, KERAS3, RewriteOptions(policy), [x[:2]]).model
            path = Path(tmp) / f"{policy}.onnx"
            keras_to_onnx(source, spec, path)
            # One session per file, as a deployment would hold it.
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            times[policy] = median_ms(lambda session=session: session.run(None, {"x": x}))
        f32 = times["float32"]
        print(f"  float32 {f32:.1f}, mixed_float16 {times['mixed_float16']:.1f} (x{times['mixed_float16'] / f32:.2f})")


if __name__ == "__main__":
    main()
