"""`mpconvert doctor MODEL`: the user's model timed under float32 and each policy, and a policy for it.

Each policy is rewritten and timed in a child process (`python -m
mpconvert.commands.doctor_model`) watched against the budget (speed/watch.py), so a
broken 16-bit kernel, thousands of times slower than float32 on an AMX
Xeon's oneDNN float16 MatMul, is cut short and reported, never counted as a
0.00x speed-up; a policy cut short is timed again with the fix
(TF_ENABLE_ONEDNN_OPTS=0). The recommendation follows the same rule as the
machine's (`doctor.PAYS`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from mpconvert.commands.doctor import PAYS
from mpconvert.options.convert import DEFAULT_DOCTOR_BUDGET_S, DEFAULT_SPEED_BATCH
from mpconvert.options.load import LoadOptions
from mpconvert.options.rewrite import RewriteOptions
from mpconvert.options.validate import PARITY_SAMPLES
from mpconvert.report.doctor import ModelTiming, OpenVinoTiming, PolicyTiming, ProbeFinding, WithFix
from mpconvert.speed import median_ms, probe_hardware
from mpconvert.speed.timing import figures
from mpconvert.system.errors import MpconvertError, first_line

# A policy cut short (by the probe, or by its share of the budget) is
# reported as cut short, with no speed, and timed again in a second child
# with TF_ENABLE_ONEDNN_OPTS=0, against float32 timed in that same child.

MODEL_POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
CHILD_LOAD_S = 300.0  # loading is not the doctor's to cut; a child that has not loaded by then is stuck
CALL_BUDGET_S = 2.0  # per policy in the child: the repeats after the first call
# The least of the budget an OpenVINO step starts with: writing a tiny Dense model's IR (its SavedModel,
# OpenVINO's conversion), compiling and timing it took 3.3-5.5 s on the 2-core AMX Xeon, loaded
# (the first includes importing openvino).
OPENVINO_MIN_S = 5.0


def _child(spec: dict) -> None:
    """Load, then per policy: rewrite, trace, time; one JSON line each (what `watch` reads).

    A user error (a Lambda layer without --unsafe-deserialization, an
    --import that fails) is one line {"error", "fix"}: the parent raises it
    again, so the doctor says what the main command says.
    """
    import json
    import sys

    try:
        _time_policies(spec)
    except MpconvertError as exc:
        print(json.dumps({"error": exc.message, "fix": exc.hint}), flush=True)
        sys.exit(1)
    sys.stdout.flush()


def _time_policies(spec: dict) -> None:
    import json
    import tempfile
    from pathlib import Path

    from mpconvert.data.signature import generate_inputs
    from mpconvert.kinds import open_model

    source = open_model(LoadOptions(spec["path"], spec["unsafe"], tuple(spec["imports"])))
    rows = generate_inputs(source.original, source.signature, spec["batch"], seed=0)
    checked = [x[:PARITY_SAMPLES] for x in rows]
    print(json.dumps({"loaded": True}), flush=True)
    built: dict = {"float32": source.original}
    with source.scope():
        for policy in spec["policies"]:
            if policy not in built:
                built[policy] = source.rewrite(RewriteOptions(policy), checked).model
            run = source.runner(built[policy], source.paths[-1]).timer(rows)
            run()  # traces
            print(json.dumps({"policy": policy, "ms": _call_ms(policy, run)}), flush=True)
        for policy in spec.get("openvino", ()):
            if policy not in built:  # a policy the probe found broken: rewritten and written, never run in TF
                built[policy] = source.rewrite(RewriteOptions(policy), checked).model
            try:
                with tempfile.TemporaryDirectory(prefix="mpconvert-doctor-openvino-") as tmp:
                    runner = _openvino_runner(source, built[policy], checked, Path(tmp) / "openvino")
                    run = runner.timer(rows)
                    run()  # the first infer request
                    found = {"ms": _call_ms(policy, run), "precision": runner.ran().precision}
            except Exception as exc:  # OpenVINO's own errors (an op its frontend has no conversion for): this line's
                found = {"note": f"not timed: {first_line(exc, 200)}"}
            print(json.dumps({"openvino": policy, **found}), flush=True)


def _call_ms(policy: str, run: Callable[[], None]) -> float:
    """One call's ms, or the median of up to five within CALL_BUDGET_S when one call leaves room for them."""
    start = time.perf_counter()
    run()
    first = (time.perf_counter() - start) * 1000
    left = CALL_BUDGET_S - first / 1000
    if left > 3 * first / 1000:
        return median_ms({policy: run}, repeats=5, budget_s=left, warmup=0)[policy]
    return first


def _openvino_runner(source, model, rows: list, folder):
    """The IR `--export openvino` writes of `model`, by the format's own writer, opened as its check opens it."""
    from mpconvert.export.formats.openvino import OPENVINO, write_openvino

    written = write_openvino(source.writes(model, rows), folder)
    return OPENVINO.open(folder, OPENVINO.recorded(written), source.signature)


@dataclass(frozen=True)
class _Child:
    """What one timing child reported before it ended or was stopped."""

    timed: dict[str, float]  # policy -> TensorFlow ms
    # policy -> (its IR's ms, the precision it ran), or (None, why it was not timed)
    openvino: dict[str, tuple[float | None, str | None]]
    stopped: str | None = None  # the TensorFlow policy cut short in its call
    openvino_stopped: str | None = None  # why OpenVINO's step was stopped (its share of the budget)
    failed: str | None = None


def _time_in_child(
    load: LoadOptions,
    batch: int,
    policies: list[str],
    env: dict,
    until: Callable[[], float],
    clock: list[float],
    openvino: tuple[str, ...] = (),
    keep_back: bool = False,
) -> _Child:
    """Each policy timed on TensorFlow, then each of `openvino`'s IRs, before `until()`.

    `clock[0]` is set when the first child has loaded: the budget counts from there.
    Every policy but float32 gets an equal share of what is left, with one share
    kept back for a re-run with the fix and one for OpenVINO where it is asked for;
    OpenVINO's steps come last and may take what is left (half of it with
    `keep_back`, for the fix's child), but one does not start with less than
    OPENVINO_MIN_S of it.
    """
    import json

    from mpconvert.speed.watch import Stopped, watch

    spec = {
        "path": str(load.path),
        "unsafe": load.unsafe_deserialization,
        "imports": list(load.imports),
        "batch": batch,
        "policies": policies,
        "openvino": list(openvino),
    }
    timed: dict[str, float] = {}
    ov: dict[str, tuple[float | None, str | None]] = {}
    loaded = [False]
    started = time.perf_counter()

    def deadline() -> float:
        now, end = time.perf_counter(), until()
        if not loaded[0]:
            return started + CHILD_LOAD_S
        if len(timed) >= len(policies) and len(ov) >= len(openvino):  # all reported: the child is only exiting
            return now + CHILD_LOAD_S
        if len(timed) >= len(policies):  # OpenVINO's steps: what is left, if enough is
            if end - now < OPENVINO_MIN_S:
                return now
            return now + (end - now) / 2 if keep_back else end
        if policies[len(timed)] == "float32":  # the baseline is always timed
            return now + CHILD_LOAD_S
        left = [p for p in policies[len(timed) :] if p != "float32"]
        shares = len(left) + 1 + (1 if openvino else 0)
        return min(end, now + max(0.0, end - now) / shares)

    for line in watch("mpconvert.commands.doctor_model", [json.dumps(spec)], env, deadline):
        if isinstance(line, Stopped):
            if not loaded[0]:
                return _Child(timed, ov, failed=f"the model did not load in {CHILD_LOAD_S:g} s")
            if len(timed) >= len(policies) and len(ov) >= len(openvino):
                return _Child(timed, ov)  # stopped while it exited, after its last line
            if len(timed) >= len(policies):
                waiting = openvino[len(ov)]
                left = until() - (time.perf_counter() - line.waited_s)
                if left < OPENVINO_MIN_S:
                    why = f"{max(left, 0.0):.1f} s of the budget were left, under the {OPENVINO_MIN_S:g} s it needs"
                else:
                    why = f"its share of the budget ran out while the IR of {waiting} was written, compiled or timed"
                return _Child(timed, ov, openvino_stopped=why)
            if time.perf_counter() >= until():  # the whole budget is spent: not timed, not a kernel's fault
                return _Child(timed, ov)
            return _Child(timed, ov, stopped=policies[len(timed)])
        if "openvino" in line:
            ov[line["openvino"]] = (line.get("ms"), line.get("precision") or line.get("note"))
            continue
        if "error" in line:  # the child's MpconvertError, as the main command would say it
            raise MpconvertError(str(line["error"]), hint=line.get("fix"))
        if line.get("loaded"):
            loaded[0] = True
            if not clock:
                clock.append(time.perf_counter())
            continue
        if "policy" in line:
            timed[line["policy"]] = float(line["ms"])
    if len(timed) < len(policies) or len(ov) < len(openvino):
        failed = "the child process failed (run `mpconvert doctor MODEL --debug` in-process to see why)"
        return _Child(timed, ov, failed=failed)
    return _Child(timed, ov)


def time_model(
    load: LoadOptions, batch: int = DEFAULT_SPEED_BATCH, budget_s: float = DEFAULT_DOCTOR_BUDGET_S
) -> ModelTiming:
    """The model's serving path timed under float32 and each policy (or why not), and the advice."""
    import os

    from mpconvert.speed import kernel_probe
    from mpconvert.speed.slow_kernel import FIX, threshold

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
    ov_policies, ov_note = _openvino_policies([*healthy, *broken])
    # OpenVINO in the first child, against the float32 the policies are measured against; with a broken
    # kernel found, it leaves half of what is left for the fix's child.
    first = _time_in_child(load, batch, order, env, until, clock, ov_policies, keep_back=bool(broken))
    timed, stopped = first.timed, first.stopped
    if first.failed:
        raise MpconvertError(f"doctor could not time {load.path}: {first.failed}", hint="run it with --debug")
    for policy in broken:
        p = probed[policy]
        figure = f"{p.slower:g}x float32's time" if p.slower not in (None, float("inf")) else p.note
        cut[policy] = f"cut short: a broken kernel (the kernel probe, {kernel_probe.WHAT}: {figure})"
    if stopped:
        cut[stopped] = f"cut short: its share of the {budget_s:g} s budget ran out in one call (a broken kernel?)"
    for policy in order:
        if policy not in timed and policy not in cut:
            notes[policy] = "not timed: the budget ran out"
    children = [first]
    fixed: dict[str, float] = {}
    fix_note = None
    again = [p for p in MODEL_POLICIES[1:] if p in cut]
    if again and kernel_probe.onednn_on():
        if clock and time.perf_counter() < until():
            pending = tuple(p for p in ov_policies if p not in first.openvino)
            fix = _time_in_child(
                load, batch, ["float32", *again], {**env, kernel_probe.ONEDNN_ENV: "0"}, until, clock, pending
            )
            children.append(fix)
            fixed = fix.timed
            if fix.failed or fix.stopped or len(fixed) < 1 + len(again):
                fix_note = f"with {FIX}: not timed within the budget"
        else:
            fix_note = f"with {FIX}: not timed, the budget ran out"
    shown = figures({p: ms for p, ms in timed.items()}, MODEL_POLICIES)
    result: dict[str, PolicyTiming] = {}
    for policy in MODEL_POLICIES:
        note = cut.get(policy) or notes.get(policy)
        with_fix = None
        if policy in cut:
            if policy in fixed and fixed.get("float32"):
                ms = fixed[policy]
                float32_ms = fixed["float32"]
                with_fix = WithFix(FIX, round(ms, 3), round(float32_ms, 3), round(float32_ms / ms, 3))
            elif fix_note:
                note = f"{note}; {fix_note}"
        result[policy] = PolicyTiming(shown[policy]["ms"], shown[policy]["speedup"], note, policy in cut, with_fix)
    ov = _openvino_timings(ov_policies, children)
    device = probe_hardware().device
    best, setting, runtime, advice = advise(result, ov, device)
    untimed = next((p for p in order if p in notes), None)
    short = [f"the {budget_s:g} s budget ran out before {untimed} was timed"] if untimed else []
    short += [f"{p} {cut[p]}" for p in MODEL_POLICIES[1:] if p in cut]
    return ModelTiming(
        model=str(load.path),
        batch=batch,
        device=device,
        policies=result,
        kernel_probe={
            p: ProbeFinding(None if v.slower == float("inf") else v.slower, v.cached, v.note) for p, v in probed.items()
        },
        recommendation=advice,
        recommended_policy=best,
        recommended_setting=setting,
        cut_short="; ".join(short) or None,
        seconds=round(time.perf_counter() - started, 2),
        openvino=ov,
        openvino_note=ov_note,
        recommended_runtime=runtime,
    )


# --- OpenVINO: the IR each policy's conversion writes, and the advice across runtimes -------------
# A policy that TensorFlow serves slower than float32 can still be the one to
# convert to: OpenVINO compiles the IR for the CPU's 16-bit units (on a 2-core
# Xeon with AMX-BF16, MobileNetV2 under mixed_bfloat16 served 0.58x float32 on
# TensorFlow and 1.54x as its IR; ResNet50's IR 7.6x), so the advice names the
# runtime as well as the policy, whichever of all the figures is fastest.

INSTALL_LINE = "pip install 'mpconvert[openvino]' adds OpenVINO's line (the IR --export openvino writes, timed)"


def _openvino_policies(policies: list[str]) -> tuple[tuple[str, ...], str | None]:
    """The policies whose IR is timed (all of them, in the order TensorFlow times them), or why none is."""
    from mpconvert.runners.openvino import openvino

    try:
        openvino()
    except MpconvertError as exc:
        return (), f"not timed: {exc.message}; {INSTALL_LINE}"
    return tuple(policies), None


def _openvino_timings(policies: tuple[str, ...], children: list[_Child]) -> dict[str, OpenVinoTiming]:
    """Each policy's IR against TensorFlow float32 timed in the same child, or why it was not timed."""
    found: dict[str, OpenVinoTiming] = {}
    for child in children:
        for policy, (ms, said) in child.openvino.items():
            if ms is None:
                found[policy] = OpenVinoTiming(None, None, None, None, said)
                continue
            shown = figures({"float32": child.timed["float32"], policy: ms}, ("float32", policy))
            float32_ms, speedup = shown["float32"]["ms"], shown[policy]["speedup"]
            found[policy] = OpenVinoTiming(shown[policy]["ms"], speedup, float32_ms, said)
    why = next((c.openvino_stopped for c in reversed(children) if c.openvino_stopped), None)
    for policy in policies:
        if policy not in found:
            found[policy] = OpenVinoTiming(None, None, None, None, f"not timed: {why or 'the budget ran out'}")
    return {p: found[p] for p in MODEL_POLICIES[1:] if p in found}


def advise(
    result: dict[str, PolicyTiming], ov: dict[str, OpenVinoTiming], device: str
) -> tuple[str | None, str | None, str | None, str]:
    """(policy, environment setting, runtime, the advice in words): the fastest way measured to serve the
    conversion here, where it is at least PAYS times float32 on TensorFlow; else keep float32."""
    ways: list[tuple[float, str, str | None, str]] = []  # (speed-up, policy, setting, runtime)
    for policy in MODEL_POLICIES[1:]:
        timing = result[policy]
        if timing.speedup is not None:
            ways.append((timing.speedup, policy, None, "tensorflow"))
        if timing.with_fix is not None:
            ways.append((timing.with_fix.speedup, policy, timing.with_fix.setting, "tensorflow"))
        if policy in ov and ov[policy].speedup is not None:
            ways.append((ov[policy].speedup or 0.0, policy, None, "openvino"))
    paying = [w for w in ways if w[0] >= PAYS]
    if not paying:
        measured = ", ".join(_said(*w) for w in ways) or "not timed"
        advice = (
            f"keep float32 here: no policy serves this model at least {PAYS:g}x as fast as float32 on TensorFlow "
            f"({measured}; {device}); convert for the hardware it will serve on"
        )
        return None, None, None, advice
    # Default settings before the fix, TensorFlow before OpenVINO, where the speed-ups are equal.
    speedup, best, setting, runtime = max(paying, key=lambda w: (w[0], w[2] is None, w[3] == "tensorflow"))
    if runtime == "openvino":
        on_tf = result[best].speedup
        tf = (
            f"on TensorFlow {best} serves it {on_tf:.2f}x{' (slower than float32)' if on_tf < 1 else ''}"
            if on_tf is not None
            else f"on TensorFlow {best} was not timed ({result[best].note})"
        )
        advice = (
            f"{best} served by OpenVINO: convert with --policy {best} --export openvino and serve the IR, "
            f"{speedup:.2f}x TensorFlow float32's speed here ({device}, {ov[best].precision}); {tf}"
        )
    elif setting:
        advice = (
            f"{best} with {setting} on TensorFlow: this model serves {speedup:.2f}x as fast as float32 with that "
            f"setting here ({device}); with default settings its kernel is broken"
        )
    else:
        advice = f"{best} on TensorFlow: this model serves {speedup:.2f}x as fast as float32 here ({device})"
    others = sorted((w for w in ways if w[1:] != (best, setting, runtime)), key=lambda w: -w[0])
    if others:
        advice += "; " + ", ".join(_said(*w) for w in others)
    return best, setting, runtime, advice


def _said(speedup: float, policy: str, setting: str | None, runtime: str) -> str:
    where = "its OpenVINO IR" if runtime == "openvino" else f"on TensorFlow{f' with {setting}' if setting else ''}"
    return f"{policy} {where} {speedup:.2f}x"


if __name__ == "__main__":
    import json
    import os
    import sys

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    _child(json.loads(sys.argv[1]))
