"""What the empty-batch padding of mpconvert's ONNX files costs in ONNX Runtime, at batch 1 and 256.

Each model is exported by a bare tf2onnx.convert.from_keras (opset 17); the
padded file is that graph after `serve_empty_batch`, the pass every file
mpconvert writes gets last (tests/test_onnx_export_speed.py holds
mpconvert's own export to this). Both run in one ONNX Runtime CPU session
each, in this process, taking turns call by call (`speed.timing.timed_ms`:
load from other processes falls on both alike); the figure is the ratio of
their median times, padded / bare, measured in the same run. Each file is
also sent 0 rows, the bare one in a child process (it may abort).

Models: the sample cancer_mlp (30 features: the padding's fixed cost is
most visible on a model this small), the sample digits_cnn, a text
classifier (Embedding + Bidirectional(LSTM(32)), 80 tokens) and MobileNetV2
(weights=None, 96x96).
"""

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf2onnx  # noqa: E402

from mpconvert.onnx.empty_batch import serve_empty_batch  # noqa: E402
from mpconvert.runners.isolated import Isolated  # noqa: E402
from mpconvert.runners.onnx import ORT_CPU, OnnxRunner  # noqa: E402
from mpconvert.speed.timing import timed_ms  # noqa: E402
from mpconvert.system.errors import MpconvertError  # noqa: E402

BATCHES = {1: (3000, 15.0), 256: (300, 30.0)}  # batch -> (calls of each file at most, time budget in s)


def text_classifier():
    tokens = keras.Input((80,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(5000, 32)(tokens)
    x = keras.layers.Bidirectional(keras.layers.LSTM(32))(x)
    return keras.Model(tokens, keras.layers.Dense(1, activation="sigmoid", name="spam")(x))


def mobilenet():
    return keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3), classes=10)


MODELS = {
    "cancer_mlp": lambda: keras.models.load_model(ROOT / "sample_models" / "cancer_mlp.keras"),
    "digits_cnn": lambda: keras.models.load_model(ROOT / "sample_models" / "digits_cnn.keras"),
    "bilstm_text": text_classifier,
    "mobilenet_v2_96": mobilenet,
}


def cpu() -> tuple[str, list[str]]:
    name, flags = platform.processor() or platform.machine(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = sorted(f for f in value.split() if f.startswith(("avx512", "amx", "avx2", "fma")))
                break
    except OSError:
        pass
    return name, flags


def inputs_for(model, rows: int, rng) -> np.ndarray:
    spec = model.inputs[0]
    shape = (rows, *spec.shape[1:])
    if "int" in str(spec.dtype):
        return rng.integers(0, 5000, size=shape).astype(np.int32)
    return rng.random(shape, dtype=np.float32)


def export(model, folder: Path) -> tuple[Path, Path, str]:
    spec = model.inputs[0]
    specs = [tf.TensorSpec((None, *spec.shape[1:]), spec.dtype, name="x")]
    bare = folder / "bare.onnx"
    tf2onnx.convert.from_keras(model, input_signature=specs, opset=17, output_path=str(bare))
    proto = onnx.load(bare)
    serve_empty_batch(proto)
    padded = folder / "padded.onnx"
    onnx.save(proto, padded)
    return bare, padded, "x"


def empty(path: Path, name: str, x: np.ndarray) -> str:
    with Isolated(OnnxRunner(path, (name,), providers=(ORT_CPU,))) as runner:
        try:
            return "0 rows -> " + ", ".join(str(o.shape) for o in runner.run([x[:0]]).outputs)
        except MpconvertError as exc:
            return f"0 rows -> {exc.message}"
        except Exception as exc:  # ONNX Runtime's refusal: the finding
            return f"0 rows -> {type(exc).__name__}: {' '.join(str(exc).split())[:120]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    name, flags = cpu()
    print(f"CPU: {name}; {os.cpu_count()} cores; flags: {' '.join(flags) or 'none listed'}")
    print(f"ONNX Runtime {ort.__version__} (CPUExecutionProvider, default session options), onnx {onnx.__version__}")
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for model_name in args.models:
            folder = Path(tmp) / model_name
            folder.mkdir()
            keras.utils.set_random_seed(0)
            model = MODELS[model_name]()
            bare, padded, input_name = export(model, folder)
            x = inputs_for(model, 256, rng)
            print(f"\n{model_name}: bare {empty(bare, input_name, x)}; padded {empty(padded, input_name, x)}")
            for batch, (calls, budget) in BATCHES.items():
                rows = [x[:batch]]
                times = timed_ms(
                    {
                        "bare": OnnxRunner(bare, (input_name,), providers=(ORT_CPU,)).timer(rows),
                        "padded": OnnxRunner(padded, (input_name,), providers=(ORT_CPU,)).timer(rows),
                    },
                    repeats=calls,
                    budget_s=budget,
                    warmup=5,
                    min_rounds=20,
                )
                bare_ms, padded_ms = (statistics.median(times[k]) for k in ("bare", "padded"))
                print(
                    f"  batch {batch:>3}: bare {bare_ms:.4f} ms, padded {padded_ms:.4f} ms (medians of "
                    f"{len(times['bare'])} calls each): padded / bare = {padded_ms / bare_ms:.3f}"
                )


if __name__ == "__main__":
    main()
