"""mpconvert's OpenVINO IR against TensorFlow float32, mpconvert's bf16 SavedModel and a hand-built OpenVINO compile.

Three models (weights=None: speed does not depend on trained weights):
ResNet50 and MobileNetV2 at 160x160, batch 32, and Dense(4096)x2 on 784
inputs, batch 256. Each is converted to mixed_bfloat16 by mpconvert (no
data, no fine-tune, no speed stage) with --export savedmodel,openvino;
then, in this one process, taking turns on the same rows:

- tf float32: the float32 model's SavedModel serving signature in TensorFlow;
- tf bf16: mpconvert's mixed_bfloat16 SavedModel, in TensorFlow;
- ov anchor: the float32 SavedModel converted by OpenVINO by hand and compiled
  with INFERENCE_PRECISION_HINT=bf16 (what the IR should match);
- ov mpconvert: mpconvert's IR (openvino/), opened as `verify` opens it.

Targets on a CPU with bf16 units: the IR >= 0.95x the anchor for all three;
>= 5x tf float32 for ResNet50, >= 3x for the Dense stack, >= 1.3x for
MobileNetV2. Ratios are what to read: the machine may be shared. Model
names as arguments run only those.
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
import openvino as ov  # noqa: E402
import tensorflow as tf  # noqa: E402

import mpconvert  # noqa: E402
from mpconvert.data.signature import Signature  # noqa: E402
from mpconvert.export.formats import FORMATS  # noqa: E402
from mpconvert.report.report import Report  # noqa: E402
from mpconvert.speed import read_cpu  # noqa: E402

ROUNDS = 12
TARGETS = {"resnet50": 5.0, "mobilenetv2": 1.3, "dense4096x2": 3.0}


def models():
    yield "resnet50", 32, lambda: keras.applications.ResNet50(weights=None, input_shape=(160, 160, 3))
    yield "mobilenetv2", 32, lambda: keras.applications.MobileNetV2(weights=None, input_shape=(160, 160, 3))

    def dense():
        return keras.Sequential(
            [
                keras.Input((784,), name="x"),
                keras.layers.Dense(4096, activation="relu"),
                keras.layers.Dense(4096, activation="relu"),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )

    yield "dense4096x2", 256, dense


def serving(path: Path):
    fn = tf.saved_model.load(str(path)).signatures["serving_default"]
    name = next(iter(fn.structured_input_signature[1]))
    return lambda x: [t.numpy() for t in fn(**{name: tf.constant(x)}).values()]


def turns(calls: dict, x: np.ndarray) -> dict[str, float]:
    """Median ms of each call, taking turns (a b c d a b c d ...) after two warm-ups each."""
    for call in calls.values():
        call(x)
        call(x)
    times = {name: [] for name in calls}
    for _ in range(ROUNDS):
        for name, call in calls.items():
            start = time.perf_counter()
            call(x)
            times[name].append((time.perf_counter() - start) * 1000)
    return {name: statistics.median(t) for name, t in times.items()}


def one(name: str, batch: int, build, tmp: Path) -> dict[str, float]:
    keras.utils.set_random_seed(0)
    model = build()
    shape = (batch, *model.input_shape[1:])
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    model.export(str(tmp / f"{name}_float32"), verbose=False)
    start = time.perf_counter()
    conversion = mpconvert.convert(model, "mixed_bfloat16", finetune_steps=0, speed=False)
    report = conversion.save(tmp / f"{name}_bf16", export=("savedmodel", "openvino"))
    took = time.perf_counter() - start
    stored = Report.from_json(report)
    artifact = next(a for a in stored.artifacts if a.kind == "openvino")
    assert not artifact.failed, artifact.reason
    signature = Signature(stored.source.inputs, stored.source.outputs)
    runner = FORMATS["openvino"].open(tmp / f"{name}_bf16" / "openvino", artifact.details, signature, device="CPU")
    request = runner.compiled.create_infer_request()
    core = ov.Core()
    anchor = core.compile_model(
        ov.convert_model(str(tmp / f"{name}_float32")), "CPU", {"INFERENCE_PRECISION_HINT": "bf16"}
    ).create_infer_request()
    ms = turns(
        {
            "tf float32": serving(tmp / f"{name}_float32"),
            "tf bf16": serving(tmp / f"{name}_bf16" / "savedmodel"),
            "ov anchor": lambda rows: anchor.infer([rows]),
            "ov mpconvert": lambda rows: request.infer([rows]),
        },
        x,
    )
    ran = runner.ran()
    print(
        f"  {name} (batch {batch}): converted with the IR in {took:.0f} s; the IR ran {ran.precision} on "
        f"{', '.join(ran.devices)}, parity {artifact.max_abs_diff:.3g}"
    )
    return ms


def main() -> None:
    cpu, flags = read_cpu()
    units = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    print(f"OpenVINO IR speed; CPU: {cpu} ({', '.join(flags) or 'no 16-bit flags'}); OpenVINO {ov.__version__}")
    print(f"  OpenVINO CPU capabilities: {', '.join(units)}; {os.cpu_count()} cores")
    rows = []
    with tempfile.TemporaryDirectory(prefix="mpconvert-bench-openvino-") as tmp:
        for name, batch, build in models():
            if sys.argv[1:] and name not in sys.argv[1:]:  # `python bench/openvino_speed.py dense4096x2`: one model
                continue
            rows.append((name, batch, one(name, batch, build, Path(tmp))))
    print(
        f"\n| model (batch) | tf float32 | tf bf16 (mpconvert SavedModel) | ov anchor (float32 + bf16 hint) "
        f"| ov mpconvert IR | IR / tf float32 | IR / tf bf16 | IR / anchor |\n|{'---|' * 8}"
    )
    met = True
    for name, batch, ms in rows:
        ir = ms["ov mpconvert"]
        over_tf, over_bf16, over_anchor = ms["tf float32"] / ir, ms["tf bf16"] / ir, ms["ov anchor"] / ir
        ok = over_anchor >= 0.95 and over_tf >= TARGETS[name]
        met = met and ok
        print(
            f"| {name} ({batch}) | {ms['tf float32']:.1f} ms | {ms['tf bf16']:.1f} ms | {ms['ov anchor']:.1f} ms "
            f"| {ir:.1f} ms | {over_tf:.2f}x (target {TARGETS[name]:g}x) | {over_bf16:.2f}x | {over_anchor:.2f}x "
            f"(target 0.95x) {'met' if ok else 'NOT met'} |"
        )
    print(f"\ntargets {'met' if met else 'not all met'} on this machine (ratios in one run; a shared machine varies)")


if __name__ == "__main__":
    main()
