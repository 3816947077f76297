"""A whole conversion against a bare tf2onnx export, and the doctor against a Keras Dense, measured in this run.

The model is the seed notebook's: Dense(4096) x2 with ReLU on 784 inputs,
Dense(10) softmax (20.0M parameters), saved as .keras. Printed, as ratios
against a baseline timed in the same run:

- the whole run (`mpconvert MODEL --policy P --finetune-steps 0`, no data,
  load to report, in a fresh process) against a bare
  `tf2onnx.convert.from_keras` export of the float32 model (also in a fresh
  process, TensorFlow import included in both), for both policies; target
  <= 1.2x; where the time went (report.json timings);
- a Keras Dense(1024, relu) in tf.function under each policy against
  float32, and whether `mpconvert doctor`'s recommendation agrees with it;
- padding's pad/slice cost on this machine: the padded converted model's
  serving time against the unpadded one's (report.json speed.padding).

With the CPU's name and its 16-bit flags. A few minutes on 2 cores.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mpconvert.speed import read_cpu  # noqa: E402

POLICIES = ("mixed_bfloat16", "mixed_float16")
BUILD = """
import keras, sys
keras.utils.set_random_seed(0)
x = keras.Input((784,), name="x")
h = keras.layers.Dense(4096, activation="relu", name="dense_1")(x)
h = keras.layers.Dense(4096, activation="relu", name="dense_2")(h)
keras.Model(x, keras.layers.Dense(10, activation="softmax", name="predictions")(h)).save(sys.argv[1])
"""
BARE = """
import sys, time, keras, tensorflow as tf, tf2onnx
model = keras.models.load_model(sys.argv[1])
spec = [tf.TensorSpec((None, 784), tf.float32, name="x")]
tf2onnx.convert.from_keras(model, input_signature=spec, opset=17, output_path=sys.argv[2])
"""


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if done.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(args[:3])} failed:\n{done.stderr[-2000:]}")
    return time.perf_counter() - start


def main() -> None:
    name, flags = read_cpu()
    print(f"CPU: {name}, {os.cpu_count()} cores; 16-bit flags: {', '.join(flags) or 'none'}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = tmp / "seed_mlp.keras"
        subprocess.run([sys.executable, "-c", BUILD, str(model)], check=True, stderr=subprocess.DEVNULL)
        bare = timed([sys.executable, "-c", BARE, str(model), str(tmp / "bare.onnx")])
        print(f"bare tf2onnx.convert.from_keras export of the float32 model (fresh process): {bare:.1f} s")
        mpconvert = str(Path(sys.executable).parent / "mpconvert")
        # A fresh kernel-probe cache: each run pays the probe, as a first run on a machine does.
        os.environ["MPCONVERT_CACHE_DIR"] = str(tmp / "cache")
        whole = {}
        for policy in POLICIES:
            out = tmp / policy
            seconds = timed(
                [mpconvert, str(model), "--policy", policy, "--finetune-steps", "0", "--out", str(out), "-q"]
            )
            whole[policy] = seconds
            report = json.loads((out / "report.json").read_text())
            slowest = sorted(report["timings"].items(), key=lambda kv: -kv[1])[:4]
            where = ", ".join(f"{stage} {s:.1f} s" for stage, s in slowest)
            verdict = "meets" if seconds <= 1.2 * bare else "misses"
            print(f"  {policy}: whole run {seconds:.1f} s = {seconds / bare:.2f}x the bare export ({verdict} <= 1.2x)")
            print(f"    where the time went: {where}")
            padding = (report.get("speed") or {}).get("padding")
            if padding:
                print(f"    padding's pad/slice ops: {padding['summary']}")
            if report.get("slow_kernel"):
                print(f"    slow kernel: {report['slow_kernel']['summary']}")
        ratio = whole["mixed_float16"] / whole["mixed_bfloat16"]
        verdict = "meets" if ratio <= 2 else "misses"
        print(f"  mixed_float16 run / mixed_bfloat16 run: {ratio:.2f}x ({verdict} <= 2x)")
    from mpconvert.commands.doctor import recommend
    from mpconvert.speed import probe_hardware
    from mpconvert.speed.layers import bench_layers

    layers = bench_layers(("dense",))
    dense = layers["dense"].timings
    print("Keras Dense(1024, relu) in tf.function, batch 256: ratio = float32 ms / ms")
    for policy in ("float32", *POLICIES):
        print(f"  {policy}: {dense[policy].ms:.2f} ms ({dense[policy].speedup:.2f}x)")
    advice = recommend(probe_hardware(), layers)
    fastest = max(POLICIES, key=lambda p: dense[p].speedup or 0)
    expected = fastest if (dense[fastest].speedup or 0) >= 1.1 else None
    agrees = "agrees" if advice.policy == expected else "DISAGREES"
    print(f"  the doctor recommends {advice.policy or 'float32'}: {agrees} with the Dense timing")


if __name__ == "__main__":
    main()
