"""`mpconvert doctor`: what this machine offers for 16-bit compute, measured.

Mixed precision exists to be faster, and whether it is depends on the
hardware: float16 needs Tensor Cores (NVIDIA compute capability 7.0+) or a
CPU with avx512_fp16/amx_fp16, bfloat16 a GPU of compute capability 8.0+, a
TPU, or a CPU with avx512_bf16/amx_bf16. The doctor lists those facts, then
times matmul and conv in float32, float16 and bfloat16 in TensorFlow and ONNX
Runtime and recommends the policy that was *measured* faster here, because
the facts alone mislead: on the 2-core AMD EPYC (Zen 3, AVX2 only) this was
written on, a 256x4096x4096 bfloat16 matmul took 427 ms against 203 ms in
float32, while on a 2-core EPYC with avx512_bf16 a mixed_bfloat16 Dense model
served 1.6x faster than float32 at batch 256.

With MODEL, that model itself is timed under float32 and each policy, and
a policy recommended for it (doctor_model.py).

The stages: `speed.probe_hardware` (the facts, no benchmark; speed/hardware.py
owns them because speed.warning_for needs them before every conversion),
`bench_tensorflow`, `bench_onnxruntime`, `recommend`, gathered by
`diagnose` into a `Diagnosis`; cli/doctor.py holds the click command,
rendered by render.render_doctor. TensorFlow and ONNX Runtime are imported
only when a stage needs them, so the command line starts without them.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from mpconvert.options.precision import PRECISIONS
from mpconvert.report.doctor import Bench, Diagnosis, Pathology, PolicyVerdict, Providers, Recommendation, Timed
from mpconvert.runners.onnx import ORT_CPU, ORT_TENSORRT
from mpconvert.speed import Hardware, fast_units, median_ms, probe_hardware
from mpconvert.speed.layers import bench_layers, pathologies, with_onednn_off
from mpconvert.speed.timing import figures
from mpconvert.system.errors import first_line

DTYPES = ("float32", "float16", "bfloat16")

# Benchmark shapes: a batch-256 Dense(2048) matmul (2.1 GFLOP) and a 3x3
# conv, 64 channels, on 16 images of 32x32 (1.2 GFLOP). Smaller ones mislead
# on a CPU: at 256x1024x1024 float32, float16 and bfloat16 all took 8.4-8.9
# ms here, while at 256x4096x4096 16-bit took 2.1-2.3x float32's time.
MATMUL = (256, 2048, 2048)  # rows, inputs, outputs
CONV = (16, 32, 32, 64, 64)  # images, height, width, channels in, channels out
# Each timing is the median of up to this many runs after two warm-ups,
# fewer when a run is slow, so the whole benchmark takes a few seconds.
REPEATS = 5
BUDGET_S = 1.0  # per (op, runtime): every dtype's runs together
# A policy "pays" when it is at least this much faster than float32 on the
# geometric mean of matmul and conv: a policy within noise of float32 is not
# worth its accuracy risk. The noise is real on a shared machine: with other
# test runs on the same 2 cores, the float16 matmul ratio read 0.60x in one
# doctor run and 0.94x in the next (the dtypes take turns, so load falls on
# all of them, but not evenly).
PAYS = 1.1
# ONNX opset 22 is the first where Conv accepts bfloat16 (the ONNX operator schemas).
BENCH_OPSET = 22


def _timed(ms: dict[str, float], failed: dict[str, str]) -> dict[str, Timed]:
    """Every dtype's timing (ms, speed-up over float32), measured or not (and why)."""
    timed = figures(ms, DTYPES)
    return {dtype: Timed(timed[dtype]["ms"], timed[dtype]["speedup"], failed.get(dtype)) for dtype in DTYPES}


def _result(op: str, matmul: tuple, conv: tuple, runs: dict, failed: dict[str, str], repeats: int) -> Bench:
    """One op's benchmark entry: its shape in words, then each dtype's timing.

    Every callable in `runs` has run once already (tracing, or the session's
    first run), so one more warm-up is enough.
    """
    if op == "matmul":
        shape = f"{matmul[0]}x{matmul[1]} @ {matmul[1]}x{matmul[2]}"
    else:
        shape = f"3x3, {conv[3]}->{conv[4]} channels, {conv[0]}x{conv[1]}x{conv[2]}"
    return Bench(shape, _timed(median_ms(runs, repeats=repeats, budget_s=BUDGET_S, warmup=1), failed), "shape")


# --- ONNX Runtime ---------------------------------------------------------------


def _onnx_graph(op: str, dtype: str, matmul: tuple, conv: tuple):
    """A float32-in, float32-out graph whose one MatMul or Conv computes in `dtype`.

    The weight is an initializer in `dtype` and the input is cast at the
    edge, as in a converted model's file (a cast of the input is small
    beside the op). Returns the model and the input's shape.
    """
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}[dtype]
    rng = np.random.default_rng(0)
    if op == "matmul":
        rows, inputs, outputs = matmul
        x_shape, w_shape, y_shape = [rows, inputs], [inputs, outputs], [rows, outputs]
        node = helper.make_node("MatMul", ["xc", "w"], ["yc"])
    else:
        images, height, width, c_in, c_out = conv
        x_shape, w_shape, y_shape = [images, c_in, height, width], [c_out, c_in, 3, 3], [images, c_out, height, width]
        node = helper.make_node("Conv", ["xc", "w"], ["yc"], pads=[1, 1, 1, 1])
    w = (rng.standard_normal(w_shape) * 0.05).astype(np.float32)
    if dtype == "bfloat16":  # NumPy has no bfloat16: its bits are float32's upper half
        weight = helper.make_tensor("w", elem, w_shape, (w.view(np.uint32) >> 16).astype(np.uint16).tobytes(), raw=True)
    else:
        weight = numpy_helper.from_array(w.astype(helper.tensor_dtype_to_np_dtype(elem)), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["xc"], to=elem),
            node,
            helper.make_node("Cast", ["yc"], ["y"], to=TensorProto.FLOAT),
        ],
        op,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", BENCH_OPSET)], ir_version=10), x_shape


def onnxruntime_providers() -> Providers:
    """The providers ONNX Runtime lists, and those that really load here."""
    from mpconvert.runners.onnx import usable_providers

    found = usable_providers()
    return Providers(tuple(found["available"]), tuple(found["usable"]))


def bench_onnxruntime(
    provider: str = ORT_CPU, matmul: tuple = MATMUL, conv: tuple = CONV, repeats: int = REPEATS
) -> dict[str, Bench]:
    """Matmul and conv in each dtype on one ONNX Runtime provider.

    A dtype the provider has no kernel for (bfloat16 on CPU) is reported as
    "not supported", not timed on an emulated copy.
    """
    import numpy as np
    import onnx

    from mpconvert.runners.onnx import OnnxRunner

    result = {}
    with tempfile.TemporaryDirectory(prefix="mpconvert-doctor-") as tmp:
        for op in ("matmul", "conv"):
            runs, failed = {}, {}
            for dtype in DTYPES:
                model, shape = _onnx_graph(op, dtype, matmul, conv)
                path = Path(tmp) / f"{op}-{dtype}.onnx"
                onnx.save(model, path)
                x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
                try:
                    # The runner's timer opens the session and runs it once: a missing kernel fails here.
                    runs[dtype] = OnnxRunner(path, ("x",), providers=(provider,)).timer([x])
                except Exception as exc:  # ONNX Runtime raises its own classes: NOT_IMPLEMENTED, INVALID_GRAPH, ...
                    if dtype == "float32":
                        raise  # the baseline must run: anything else is a bug here
                    failed[dtype] = f"not supported: {first_line(exc, 200)}"
            result[op] = _result(op, matmul, conv, runs, failed, repeats)
    return result


# --- the recommendation -----------------------------------------------------------


def _geomean(values) -> float | None:
    """None when a layer did not run: a policy that cannot run an LSTM here does not pay on its Dense."""
    values = list(values)
    if not values or any(v is None or v <= 0 for v in values):
        return None
    return math.exp(sum(map(math.log, values)) / len(values))


def _ratios(layers: Mapping[str, Bench], policy: str) -> str:
    parts = []
    for case, entry in layers.items():
        speedup = entry.timings[policy].speedup
        parts.append(f"{case} {'not supported' if speedup is None else f'{speedup:.2f}x'}")
    return ", ".join(parts)


def _onnx_speedups(bench: Mapping[str, Bench], dtype: str) -> str:
    ops = {op: bench[op].timings[dtype].speedup for op in ("matmul", "conv")}
    if all(s is None for s in ops.values()):
        return f"{dtype} not supported"
    return f"{dtype} " + ", ".join(f"{op} {'not supported' if s is None else f'{s:.2f}x'}" for op, s in ops.items())


def recommend(
    hardware: Hardware,
    layers: Mapping[str, Bench],
    onnxruntime: Mapping[str, Mapping[str, Bench]] | None = None,
    found: list[Pathology] | None = None,
) -> Recommendation:
    """The policy measured fastest here on Keras layers in tf.function, if any pays, with the numbers in words.

    `found` are the pathological kernels (`layers.pathologies`), with their
    fixes measured; they are named first, since they dominate everything.
    """
    judged = {}
    for name in PRECISIONS:
        speedups = {case: entry.timings[name].speedup for case, entry in layers.items()}
        gain = _geomean(speedups.values())
        judged[name] = PolicyVerdict(speedups, None if gain is None else round(gain, 3), bool(gain and gain >= PAYS))
    paying = sorted((p for p in judged if judged[p].pays), key=lambda p: -(judged[p].speedup or 0.0))
    best = paying[0] if paying else None
    lines = []
    if best:
        lines.append(
            f"{best}: {_ratios(layers, best)} of float32's speed (geometric mean {judged[best].speedup:.2f}x) "
            f"for Keras layers in tf.function here ({hardware.device})"
        )
    else:
        lines.append(
            f"keep float32 here: neither policy is at least {PAYS:g}x as fast as float32 on Keras layers in "
            f"tf.function ({hardware.device}); convert for the hardware the model will serve on, whose gain is "
            "not measured here"
        )
    for name in PRECISIONS:
        if name == best:
            continue
        has, why = fast_units(hardware, PRECISIONS[name].compute_dtype)
        reason = f" ({why})" if has is False else ""
        verdict = "will not pay here" if not judged[name].pays else "also pays here"
        lines.append(f"{name} {verdict}: {_ratios(layers, name)} of float32's speed{reason}")
    for finding in found or []:
        lines.insert(0, finding.summary)
    for provider, bench in (onnxruntime or {}).items():
        parts = [_onnx_speedups(bench, dtype) for dtype in DTYPES[1:]]
        lines.append(f"ONNX Runtime {provider}: {'; '.join(parts)} (bare MatMul and Conv, against float32)")
    return Recommendation(best, tuple(lines), judged, tuple(found or ()))


def explain_pathologies(layers: Mapping[str, Bench], fixed: Mapping[str, Bench] | None) -> list[Pathology]:
    """Each pathological (layer, policy) with what fixes it: the other policy, and oneDNN rewrites off (measured)."""
    found = []
    for finding in pathologies(layers):
        layer, policy = finding.layer, finding.policy
        other = next(p for p in PRECISIONS if p != policy)
        other_speedup = layers[layer].timings[other].speedup
        again = (fixed or {}).get(layer)
        off = again.timings[policy].speedup if again and policy in again.timings else None
        fixes = []
        if other_speedup is not None:
            fixes.append(f"{other} runs it at {other_speedup:.2f}x of float32's speed")
        if off is not None:
            fixes.append(f"with TF_ENABLE_ONEDNN_OPTS=0 {policy} runs it at {off:.2f}x")
        elif fixed is None:
            fixes.append("TF_ENABLE_ONEDNN_OPTS=0 could not be measured (the child process failed)")
        summary = (
            f"{policy}'s {layer} kernel is {finding.slower:g}x slower than float32 here ({finding.what}): "
            "a broken kernel, not a missing speed-up" + (f"; {'; '.join(fixes)}" if fixes else "")
        )
        found.append(replace(finding, other_policy_speedup=other_speedup, onednn_off_speedup=off, summary=summary))
    return found


# --- everything, for the command --------------------------------------------------


def diagnose(
    hardware: Hardware | None = None, matmul: tuple | None = None, conv: tuple | None = None, repeats: int = REPEATS
) -> Diagnosis:
    """Facts, the benchmarks (Keras layers in TensorFlow, bare ops in ONNX Runtime; seconds) and the recommendation.

    `hardware` defaults to this machine's; the ONNX Runtime shapes to MATMUL and CONV.
    """
    from mpconvert.report.report import mpconvert_version, versions

    hardware = hardware or probe_hardware()
    matmul, conv = matmul or MATMUL, conv or CONV
    providers = onnxruntime_providers()
    start = time.perf_counter()
    timed_layers = bench_layers()
    slow = pathologies(timed_layers)
    fixed = with_onednn_off(tuple(dict.fromkeys(f.layer for f in slow))) if slow else {}
    # TensorRT builds an engine per graph (seconds each): only CUDA and CPU are timed.
    timed = [p for p in providers.usable if p != ORT_TENSORRT][:1]
    onnxruntime = {p: bench_onnxruntime(p, matmul, conv, repeats) for p in timed}
    seconds = time.perf_counter() - start
    found = {"mpconvert": mpconvert_version(), **versions()}
    advice = recommend(hardware, timed_layers, onnxruntime, explain_pathologies(timed_layers, fixed))
    return Diagnosis(hardware, providers, found, timed_layers, onnxruntime, advice, seconds)


# --- `mpconvert doctor MODEL`: the user's own model ---------------------------
# Layer benchmarks say what a machine does with typical layers; a model is
# its own mix. The model is rewritten to each policy (the same rewrite a
# conversion does, proven faithful in float32, for a Keras model or a plain
# SavedModel's graph alike), and each version is timed through its serving
# path (the SavedModel serving function, traced in memory as the export
# traces it) on generated rows at a serving batch.
#
# The timing runs in a child process (`_child`, watched by speed.watch) that
# the doctor stops when a policy runs past its share of the budget: on an
# Intel Xeon with AMX and avx512_fp16 one float16 batch of a Dense(4096)x2
# model took 77 s in-process, and the doctor ran to 158 s against its 60 s
# budget without ever timing mixed_bfloat16 (which serves that model at
# 1.87x float32 there). Cheapest first: the kernel probe
# (speed.kernel_probe, cached per machine) orders the policies, and a policy
# whose kernel it finds broken is not run with default settings at all.
