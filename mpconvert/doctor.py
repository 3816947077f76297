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

With MODEL (`time_model`), that model itself is timed under float32 and
each policy, and a policy recommended for it.

The stages: `speed.probe_hardware` (the facts, no benchmark; speed/hardware.py
owns them because speed.warning_for needs them before every conversion),
`bench_tensorflow`, `bench_onnxruntime`, `recommend`, gathered by
`diagnose` into a `Diagnosis`; cli/doctor.py holds the click command,
rendered by render.render_doctor. TensorFlow and ONNX Runtime are imported
only when a stage needs them, so the command line starts without them.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .errors import MpconvertError, first_line
from .options import DEFAULT_DOCTOR_BUDGET_S, DEFAULT_SPEED_BATCH, PARITY_SAMPLES, LoadOptions, RewriteOptions
from .precision import PRECISIONS
from .runners.onnx import ORT_CPU, ORT_TENSORRT
from .speed import Hardware, fast_units, median_ms, probe_hardware
from .speed.layers import bench_layers, pathologies, with_onednn_off
from .speed.timing import figures

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


def _timed(ms: dict[str, float], failed: dict[str, str]) -> dict[str, dict]:
    """{dtype: {"ms", "speedup" (float32 ms / ms), "note"}} for every dtype, measured or not."""
    timed = figures(ms, DTYPES)
    return {dtype: {**timed[dtype], "note": failed.get(dtype)} for dtype in DTYPES}


def _result(op: str, matmul: tuple, conv: tuple, runs: dict, failed: dict[str, str], repeats: int) -> dict:
    """One op's benchmark entry: its shape in words, then each dtype's timing.

    Every callable in `runs` has run once already (tracing, or the session's
    first run), so one more warm-up is enough.
    """
    if op == "matmul":
        shape = f"{matmul[0]}x{matmul[1]} @ {matmul[1]}x{matmul[2]}"
    else:
        shape = f"3x3, {conv[3]}->{conv[4]} channels, {conv[0]}x{conv[1]}x{conv[2]}"
    return {"shape": shape, **_timed(median_ms(runs, repeats=repeats, budget_s=BUDGET_S, warmup=1), failed)}


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


def onnxruntime_providers() -> dict[str, list[str]]:
    """The providers ONNX Runtime lists, and those that really load here."""
    from .runners.onnx import usable_providers

    return usable_providers()


def bench_onnxruntime(
    provider: str = ORT_CPU, matmul: tuple = MATMUL, conv: tuple = CONV, repeats: int = REPEATS
) -> dict:
    """Matmul and conv in each dtype on one ONNX Runtime provider.

    A dtype the provider has no kernel for (bfloat16 on CPU) is reported as
    "not supported", not timed on an emulated copy.
    """
    import numpy as np

    from .runners.onnx import open_session

    result = {}
    for op in ("matmul", "conv"):
        runs, failed = {}, {}
        for dtype in DTYPES:
            model, shape = _onnx_graph(op, dtype, matmul, conv)
            feed = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
            try:
                session = open_session(model.SerializeToString(), [provider])
                session.run(None, feed)
            except Exception as exc:  # ONNX Runtime raises its own classes: NOT_IMPLEMENTED, INVALID_GRAPH, ...
                if dtype == "float32":
                    raise  # the baseline must run: anything else is a bug here
                failed[dtype] = f"not supported: {first_line(exc, 200)}"
                continue
            runs[dtype] = functools.partial(session.run, None, feed)
        result[op] = _result(op, matmul, conv, runs, failed, repeats)
    return result


# --- the recommendation -----------------------------------------------------------


def _geomean(values) -> float | None:
    """None when a layer did not run: a policy that cannot run an LSTM here does not pay on its Dense."""
    values = list(values)
    if not values or any(v is None or v <= 0 for v in values):
        return None
    return math.exp(sum(map(math.log, values)) / len(values))


def _ratios(layers: dict, policy: str) -> str:
    parts = []
    for case, entry in layers.items():
        speedup = entry[policy]["speedup"]
        parts.append(f"{case} {'not supported' if speedup is None else f'{speedup:.2f}x'}")
    return ", ".join(parts)


def _onnx_speedups(bench: dict, dtype: str) -> str:
    ops = {op: bench[op][dtype]["speedup"] for op in ("matmul", "conv")}
    if all(s is None for s in ops.values()):
        return f"{dtype} not supported"
    return f"{dtype} " + ", ".join(f"{op} {'not supported' if s is None else f'{s:.2f}x'}" for op, s in ops.items())


@dataclass(frozen=True)
class Recommendation:
    policy: str | None  # None: neither policy pays here; keep float32
    lines: tuple[str, ...]
    # policy -> {layer: speed-up, ..., "speedup" (their geometric mean), "pays"}
    policies: dict[str, dict]
    # Layers far slower under a policy than in float32, with what fixes them (measured)
    pathologies: tuple[dict, ...] = ()

    def as_dict(self) -> dict:
        return asdict(self)


def recommend(
    hardware: Hardware, layers: dict, onnxruntime: dict | None = None, found: list[dict] | None = None
) -> Recommendation:
    """The policy measured fastest here on Keras layers in tf.function, if any pays, with the numbers in words.

    `found` are the pathological kernels (`layers.pathologies`), with their
    fixes measured; they are named first, since they dominate everything.
    """
    judged = {}
    for name in PRECISIONS:
        speedups = {case: entry[name]["speedup"] for case, entry in layers.items()}
        gain = _geomean(speedups.values())
        judged[name] = {
            **speedups,
            "speedup": None if gain is None else round(gain, 3),
            "pays": bool(gain and gain >= PAYS),
        }
    paying = sorted((p for p in judged if judged[p]["pays"]), key=lambda p: -judged[p]["speedup"])
    best = paying[0] if paying else None
    lines = []
    if best:
        lines.append(
            f"{best}: {_ratios(layers, best)} of float32's speed (geometric mean {judged[best]['speedup']:.2f}x) "
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
        verdict = "will not pay here" if not judged[name]["pays"] else "also pays here"
        lines.append(f"{name} {verdict}: {_ratios(layers, name)} of float32's speed{reason}")
    for finding in found or []:
        lines.insert(0, finding["summary"])
    for provider, bench in (onnxruntime or {}).items():
        parts = [_onnx_speedups(bench, dtype) for dtype in DTYPES[1:]]
        lines.append(f"ONNX Runtime {provider}: {'; '.join(parts)} (bare MatMul and Conv, against float32)")
    return Recommendation(best, tuple(lines), judged, tuple(found or ()))


def explain_pathologies(layers: dict, fixed: dict | None) -> list[dict]:
    """Each pathological (layer, policy) with what fixes it: the other policy, and oneDNN rewrites off (measured)."""
    found = []
    for finding in pathologies(layers):
        layer, policy = finding["layer"], finding["policy"]
        other = next(p for p in PRECISIONS if p != policy)
        other_speedup = layers[layer][other]["speedup"]
        off = ((fixed or {}).get(layer) or {}).get(policy, {}).get("speedup")
        fixes = []
        if other_speedup is not None:
            fixes.append(f"{other} runs it at {other_speedup:.2f}x of float32's speed")
        if off is not None:
            fixes.append(f"with TF_ENABLE_ONEDNN_OPTS=0 {policy} runs it at {off:.2f}x")
        elif fixed is None:
            fixes.append("TF_ENABLE_ONEDNN_OPTS=0 could not be measured (the child process failed)")
        summary = (
            f"{policy}'s {layer} kernel is {finding['slower']:g}x slower than float32 here ({finding['what']}): "
            "a broken kernel, not a missing speed-up" + (f"; {'; '.join(fixes)}" if fixes else "")
        )
        found.append({**finding, "other_policy_speedup": other_speedup, "onednn_off_speedup": off, "summary": summary})
    return found


# --- everything, for the command --------------------------------------------------


@dataclass(frozen=True)
class Diagnosis:
    hardware: Hardware
    providers: dict[str, list[str]]
    versions: dict[str, str | None]
    layers: dict  # speed.layers.bench_layers's result
    onnxruntime: dict[str, dict]  # provider -> bench_onnxruntime's result
    recommendation: Recommendation
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {
            "hardware": self.hardware.as_dict(),
            "onnxruntime": self.providers,
            "versions": self.versions,
            "benchmark": {
                "layers": {"device": self.hardware.device, **self.layers},
                "onnxruntime": self.onnxruntime,
                "seconds": round(self.seconds, 2),
            },
            "recommendation": self.recommendation.as_dict(),
        }


def diagnose(
    hardware: Hardware | None = None, matmul: tuple | None = None, conv: tuple | None = None, repeats: int = REPEATS
) -> Diagnosis:
    """Facts, the benchmarks (Keras layers in TensorFlow, bare ops in ONNX Runtime; seconds) and the recommendation.

    `hardware` defaults to this machine's; the ONNX Runtime shapes to MATMUL and CONV.
    """
    from .report import mpconvert_version, versions

    hardware = hardware or probe_hardware()
    matmul, conv = matmul or MATMUL, conv or CONV
    providers = onnxruntime_providers()
    start = time.perf_counter()
    timed_layers = bench_layers()
    slow = pathologies(timed_layers)
    fixed = with_onednn_off(tuple(dict.fromkeys(f["layer"] for f in slow))) if slow else {}
    # TensorRT builds an engine per graph (seconds each): only CUDA and CPU are timed.
    timed = [p for p in providers["usable"] if p != ORT_TENSORRT][:1]
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
# A policy cut short (by the probe, or by its share of the budget) is
# reported as cut short, with no speed, and timed again in a second child
# with TF_ENABLE_ONEDNN_OPTS=0, against float32 timed in that same child.

MODEL_POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
CHILD_LOAD_S = 300.0  # loading is not the doctor's to cut; a child that has not loaded by then is stuck
CALL_BUDGET_S = 2.0  # per policy in the child: the repeats after the first call


def _child(spec: dict) -> None:
    """Load, then per policy: rewrite, trace, time; one JSON line each (what `watch` reads)."""
    import json
    import os
    import sys

    from .kinds import open_model
    from .signature import generate_inputs
    from .speed.kernel_probe import STAND_IN_ENV, onednn_on

    source = open_model(LoadOptions(spec["path"], spec["unsafe"], tuple(spec["imports"])))
    rows = generate_inputs(source.original, source.signature, spec["batch"], seed=0)
    print(json.dumps({"loaded": True}), flush=True)
    with source.scope():
        for policy in spec["policies"]:
            built = source.original
            if policy != "float32":
                built = source.rewrite(RewriteOptions(policy), [x[:PARITY_SAMPLES] for x in rows]).model
            run = source.runner(built, source.paths[-1]).timer(rows)
            if policy == os.environ.get(STAND_IN_ENV) and onednn_on():
                time.sleep(3600)  # the test stand-in for a broken kernel the probe did not flag
            run()  # traces
            start = time.perf_counter()
            run()
            first = (time.perf_counter() - start) * 1000
            left = CALL_BUDGET_S - first / 1000
            ms = first
            if left > 3 * first / 1000:
                ms = median_ms({policy: run}, repeats=5, budget_s=left, warmup=0)[policy]
            print(json.dumps({"policy": policy, "ms": ms}), flush=True)
    sys.stdout.flush()


def _time_in_child(
    load: LoadOptions, batch: int, policies: list[str], env: dict, until: Callable[[], float], clock: list[float]
) -> tuple[dict[str, float], str | None, str | None]:
    """({policy: ms}, the policy cut short or None, why the child failed or None), before `until()`.

    `clock[0]` is set when the first child has loaded: the budget counts from there.
    Every policy but float32 gets an equal share of what is left, with one share
    kept back for a re-run with the fix.
    """
    import json

    from .speed.watch import Stopped, watch

    spec = {
        "path": str(load.path),
        "unsafe": load.unsafe_deserialization,
        "imports": list(load.imports),
        "batch": batch,
        "policies": policies,
    }
    timed: dict[str, float] = {}
    loaded = [False]
    started = time.perf_counter()

    def deadline() -> float:
        now, end = time.perf_counter(), until()
        if not loaded[0]:
            return started + CHILD_LOAD_S
        waiting = policies[len(timed)] if len(timed) < len(policies) else None
        if waiting == "float32":  # the baseline is always timed
            return now + CHILD_LOAD_S
        left = [p for p in policies[len(timed) :] if p != "float32"]
        return min(end, now + max(0.0, end - now) / (len(left) + 1)) if left else end

    for line in watch("mpconvert.doctor", [json.dumps(spec)], env, deadline):
        if isinstance(line, Stopped):
            if not loaded[0]:
                return timed, None, f"the model did not load in {CHILD_LOAD_S:g} s"
            if time.perf_counter() >= until():  # the whole budget is spent: not timed, not a kernel's fault
                return timed, None, None
            return timed, policies[len(timed)], None
        if line.get("loaded"):
            loaded[0] = True
            if not clock:
                clock.append(time.perf_counter())
            continue
        if "policy" in line:
            timed[line["policy"]] = float(line["ms"])
    if len(timed) < len(policies):
        return timed, None, "the child process failed (run `mpconvert doctor MODEL --debug` in-process to see why)"
    return timed, None, None


def time_model(load: LoadOptions, batch: int = DEFAULT_SPEED_BATCH, budget_s: float = DEFAULT_DOCTOR_BUDGET_S) -> dict:
    """{model, batch, device, policies: {policy: {ms, speedup, note, cut_short, with_fix}}, kernel_probe,
    recommendation, recommended_policy, cut_short, seconds}."""
    import os

    from .speed import kernel_probe
    from .speed.slow_kernel import FIX, threshold

    started = time.perf_counter()
    if load.path is None:
        raise MpconvertError("doctor MODEL needs a model file or folder", hint="pass its path")
    probed = kernel_probe.start(MODEL_POLICIES[1:]).result() if kernel_probe.onednn_on() else {}
    broken = [p for p in MODEL_POLICIES[1:] if p in probed and probed[p].is_slow(threshold())]

    def expected(policy: str) -> float:  # the probe's slowdown: the cheapest policy is timed first
        slower = probed[policy].slower if policy in probed else None
        return 1.0 if slower is None else slower

    healthy = sorted((p for p in MODEL_POLICIES[1:] if p not in broken), key=expected)
    clock: list[float] = []  # when the first child had loaded: the budget counts from there

    def until() -> float:
        return clock[0] + budget_s if clock else float("inf")

    env = dict(os.environ)
    notes: dict[str, str] = {}
    cut: dict[str, str] = {}
    order = ["float32", *healthy]
    timed, stopped, failed = _time_in_child(load, batch, order, env, until, clock)
    if failed:
        raise MpconvertError(f"doctor could not time {load.path}: {failed}", hint="run it with --debug")
    for policy in broken:
        p = probed[policy]
        figure = f"{p.slower:g}x float32's time" if p.slower not in (None, float("inf")) else p.note
        cut[policy] = f"cut short: a broken kernel (the kernel probe, {kernel_probe.WHAT}: {figure})"
    if stopped:
        cut[stopped] = f"cut short: its share of the {budget_s:g} s budget ran out in one call (a broken kernel?)"
    for policy in order:
        if policy not in timed and policy not in cut:
            notes[policy] = "not timed: the budget ran out"
    fixed: dict[str, float] = {}
    fix_note = None
    again = [p for p in MODEL_POLICIES[1:] if p in cut]
    if again and kernel_probe.onednn_on():
        if clock and time.perf_counter() < until():
            fixed, fix_stopped, fix_failed = _time_in_child(
                load, batch, ["float32", *again], {**env, kernel_probe.ONEDNN_ENV: "0"}, until, clock
            )
            if fix_failed or fix_stopped or len(fixed) < 1 + len(again):
                fix_note = f"with {FIX}: not timed within the budget"
        else:
            fix_note = f"with {FIX}: not timed, the budget ran out"
    shown = figures({p: ms for p, ms in timed.items()}, MODEL_POLICIES)
    result: dict[str, dict[str, Any]] = {}
    for policy in MODEL_POLICIES:
        entry: dict[str, Any] = {**shown[policy], "note": cut.get(policy) or notes.get(policy)}
        entry["cut_short"] = policy in cut
        entry["with_fix"] = None
        if policy in cut:
            if policy in fixed and fixed.get("float32"):
                ms = fixed[policy]
                entry["with_fix"] = {
                    "setting": FIX,
                    "ms": round(ms, 3),
                    "float32_ms": round(fixed["float32"], 3),
                    "speedup": round(fixed["float32"] / ms, 3),
                }
            elif fix_note:
                entry["note"] = f"{entry['note']}; {fix_note}"
        result[policy] = entry
    candidates = {p: result[p]["speedup"] for p in MODEL_POLICIES[1:] if result[p]["speedup"] is not None}
    fixed_candidates = {
        p: result[p]["with_fix"]["speedup"] for p in MODEL_POLICIES[1:] if result[p]["with_fix"] is not None
    }
    device = probe_hardware().device
    paying = {p: s for p, s in candidates.items() if s >= PAYS}
    paying_fixed = {p: s for p, s in fixed_candidates.items() if s >= PAYS}
    best = max(paying, key=lambda p: paying[p]) if paying else None
    if best:
        advice = f"{best}: this model serves {paying[best]:.2f}x as fast as float32 here ({device})"
        better = {p: s for p, s in paying_fixed.items() if s > paying[best]}
        if better:
            other = max(better, key=lambda p: better[p])
            advice += f"; {other} serves it at {better[other]:.2f}x with {FIX}"
    setting = None
    if not best and paying_fixed:
        best, setting = max(paying_fixed, key=lambda p: paying_fixed[p]), FIX
        advice = (
            f"{best} with {FIX}: this model serves {paying_fixed[best]:.2f}x as fast as float32 with that setting "
            f"here ({device}); with default settings its kernel is broken"
        )
    elif not best:
        measured = ", ".join(f"{p} {s:.2f}x" for p, s in candidates.items())
        measured += "".join(f", {p} {s:.2f}x with {FIX}" for p, s in fixed_candidates.items())
        advice = (
            f"keep float32 here: neither policy serves this model at least {PAYS:g}x as fast as float32 "
            f"({measured.strip(', ') or 'not timed'}; {device}); convert for the hardware it will serve on"
        )
    untimed = next((p for p in order if p in notes), None)
    short = [f"the {budget_s:g} s budget ran out before {untimed} was timed"] if untimed else []
    short += [f"{p} {cut[p]}" for p in MODEL_POLICIES[1:] if p in cut]
    return {
        "model": str(load.path),
        "batch": batch,
        "device": device,
        "policies": result,
        "kernel_probe": {
            p: {"slower": None if v.slower == float("inf") else v.slower, "cached": v.cached, "note": v.note}
            for p, v in probed.items()
        },
        "recommendation": advice,
        "recommended_policy": best,
        "recommended_setting": setting,  # an environment setting the recommended policy needs here, or None
        "cut_short": "; ".join(short) or None,
        "seconds": round(time.perf_counter() - started, 2),
    }


if __name__ == "__main__":
    import json
    import os
    import sys

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    _child(json.loads(sys.argv[1]))
