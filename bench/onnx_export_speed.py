"""ONNX export time of mpconvert against a bare tf2onnx.convert.from_keras, in one run.

For a Dense(4096)x2 model on 784 inputs and ResNet50 (weights=None, 224x224
input, 1000 classes), in float32 and as mpconvert converts them to
mixed_float16 and mixed_bfloat16 (`rewrite`, what `mpconvert.convert`
builds: the float32 softmax head split off), the same model object is
exported by `mpconvert.onnx.export.keras_to_onnx` and by
`tf2onnx.convert.from_keras(model, input_signature=specs, opset=17,
output_path=...)`, alternately, `--runs` times each, in this one process
after one untimed warm-up export of a small model by each path (imports,
first tracing). The ratio is of median wall-clock times; the CPU ratio, of
median process CPU times, moves less when others share the machine. Then
both files run in ONNX Runtime on the same inputs (max |diff|), and their
contents are compared up to node names: initializer values (dtype, shape,
bytes) and op-type counts.

tf2onnx 1.17 writes an invalid graph for a mixed_bfloat16 model (it maps
tf.bfloat16 to FLOAT16), so for bfloat16 only the times are compared.
"""

import argparse
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
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf2onnx  # noqa: E402

from mpconvert.data.signature import generate_inputs, signature_of  # noqa: E402
from mpconvert.keras.frameworks import KERAS3  # noqa: E402
from mpconvert.keras.rewrite import rewrite  # noqa: E402
from mpconvert.onnx.export import keras_to_onnx  # noqa: E402
from mpconvert.onnx.proto import contents  # noqa: E402
from mpconvert.options.rewrite import RewriteOptions  # noqa: E402

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")


def dense(width=4096, inputs=784):
    # Functional, with a named head: tf2onnx.from_keras cannot name the
    # outputs of a Keras 3 Sequential model (KeyError 'keras_tensor_N').
    x = keras.Input((inputs,), name="x")
    h = keras.layers.Dense(width, activation="relu")(x)
    h = keras.layers.Dense(width, activation="relu")(h)
    return keras.Model(x, keras.layers.Dense(10, activation="softmax", name="probs")(h))


def resnet50():
    return keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3))


MODELS = {"Dense4096x2": dense, "ResNet50": resnet50}


def build(name, policy):
    keras.utils.set_random_seed(0)
    model = MODELS[name]()
    if policy != "float32":
        sig = signature_of(model)
        model = rewrite(model, KERAS3, RewriteOptions(policy), generate_inputs(model, sig, 2, 0)).model
    return model


def specs_of(model):
    return [tf.TensorSpec(s.shape, s.dtype, name=s.name) for s in signature_of(model).inputs]


def export_mpconvert(model, specs, path):
    keras_to_onnx(model, specs, path)


def export_bare(model, specs, path):
    tf2onnx.convert.from_keras(model, input_signature=specs, opset=17, output_path=str(path))


def timed(fn, *args):
    """(wall, CPU) seconds of one call; CPU time is steadier on a shared machine."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu


def compare_contents(ours, theirs):
    """Initializer values and op-type counts: the files up to node names."""
    (inits_a, ops_a), (inits_b, ops_b) = (contents(onnx.load(str(p))) for p in (ours, theirs))
    if inits_a == inits_b and ops_a == ops_b:
        return f"same ({sum(inits_a.values())} initializers, {sum(ops_a.values())} nodes)"
    parts = []
    if inits_a != inits_b:
        parts.append(
            f"initializers differ: {sum((inits_a - inits_b).values())} only in mpconvert's, "
            f"{sum((inits_b - inits_a).values())} only in tf2onnx's"
        )
    if ops_a != ops_b:
        parts.append(f"op types differ: mpconvert +{dict(ops_a - ops_b)}, tf2onnx +{dict(ops_b - ops_a)}")
    return "DIFFERENT: " + "; ".join(parts)


def max_diff(ours, theirs, model):
    rng = np.random.default_rng(0)
    rows = 8 if len(model.input_shape) == 2 else 2
    x = rng.random((rows,) + tuple(model.input_shape[1:])).astype(np.float32)
    outs = []
    for path in (ours, theirs):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: x}
        outs.append([np.asarray(o, dtype=np.float32) for o in session.run(None, feed)])
    return max(float(np.max(np.abs(a - b))) for a, b in zip(*outs))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed exports per path and model (median reported)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, of {', '.join(POLICIES)}")
    args = parser.parse_args()

    print(
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}, tf2onnx {tf2onnx.__version__}, "
        f"onnx {onnx.__version__}, ONNX Runtime {ort.__version__}; {os.cpu_count()} CPUs"
    )
    print(f"median of {args.runs} alternating runs per path, in one process, after one untimed warm-up export each")
    header = (
        f"{'model':<12}{'policy':<16}{'mpconvert':>10}{'tf2onnx':>10}{'ratio':>8}{'CPU ratio':>11}"
        f"  {'max|diff|':>10}  contents"
    )
    print(header, flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        warm = dense(width=8, inputs=8)
        for fn in (export_mpconvert, export_bare):
            fn(warm, specs_of(warm), tmp / "warm.onnx")
        for name in args.models.split(","):
            for policy in args.policies.split(","):
                model = build(name, policy)
                specs = specs_of(model)
                ours, theirs = tmp / f"{name}_{policy}_mpconvert.onnx", tmp / f"{name}_{policy}_tf2onnx.onnx"
                times = {"mpconvert": [], "tf2onnx": []}
                for _ in range(args.runs):
                    times["mpconvert"].append(timed(export_mpconvert, model, specs, ours))
                    times["tf2onnx"].append(timed(export_bare, model, specs, theirs))
                (a, a_cpu), (b, b_cpu) = ([statistics.median(t) for t in zip(*times[k])] for k in times)
                if policy == "mixed_bfloat16":
                    diff, same = "-", "not compared: tf2onnx's bfloat16 graph is invalid"
                else:
                    diff, same = f"{max_diff(ours, theirs, model):.2e}", compare_contents(ours, theirs)
                rows.append(
                    f"{name:<12}{policy:<16}{a:>9.2f}s{b:>9.2f}s{b / a:>7.2f}x{b_cpu / a_cpu:>10.2f}x"
                    f"  {diff:>10}  {same}"
                )
                print(rows[-1], flush=True)
    print(
        f"\nratio: tf2onnx's median wall-clock export time / mpconvert's (target >= 3x); CPU ratio: the same "
        f"for process CPU time\n{header}"
    )
    print("\n".join(rows))


if __name__ == "__main__":
    main()
