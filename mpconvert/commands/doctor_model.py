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

from mpconvert.commands.doctor import PAYS
from mpconvert.options.convert import DEFAULT_DOCTOR_BUDGET_S, DEFAULT_SPEED_BATCH
from mpconvert.options.load import LoadOptions
from mpconvert.options.rewrite import RewriteOptions
from mpconvert.options.validate import PARITY_SAMPLES
from mpconvert.report.doctor import ModelTiming, PolicyTiming, ProbeFinding, WithFix
from mpconvert.speed import median_ms, probe_hardware
from mpconvert.speed.timing import figures
from mpconvert.system.errors import MpconvertError

# A policy cut short (by the probe, or by its share of the budget) is
# reported as cut short, with no speed, and timed again in a second child
# with TF_ENABLE_ONEDNN_OPTS=0, against float32 timed in that same child.

MODEL_POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
CHILD_LOAD_S = 300.0  # loading is not the doctor's to cut; a child that has not loaded by then is stuck
CALL_BUDGET_S = 2.0  # per policy in the child: the repeats after the first call


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

    from mpconvert.data.signature import generate_inputs
    from mpconvert.kinds import open_model

    source = open_model(LoadOptions(spec["path"], spec["unsafe"], tuple(spec["imports"])))
    rows = generate_inputs(source.original, source.signature, spec["batch"], seed=0)
    print(json.dumps({"loaded": True}), flush=True)
    with source.scope():
        for policy in spec["policies"]:
            built = source.original
            if policy != "float32":
                built = source.rewrite(RewriteOptions(policy), [x[:PARITY_SAMPLES] for x in rows]).model
            run = source.runner(built, source.paths[-1]).timer(rows)
            run()  # traces
            start = time.perf_counter()
            run()
            first = (time.perf_counter() - start) * 1000
            left = CALL_BUDGET_S - first / 1000
            ms = first
            if left > 3 * first / 1000:
                ms = median_ms({policy: run}, repeats=5, budget_s=left, warmup=0)[policy]
            print(json.dumps({"policy": policy, "ms": ms}), flush=True)


def _time_in_child(
    load: LoadOptions, batch: int, policies: list[str], env: dict, until: Callable[[], float], clock: list[float]
) -> tuple[dict[str, float], str | None, str | None]:
    """({policy: ms}, the policy cut short or None, why the child failed or None), before `until()`.

    `clock[0]` is set when the first child has loaded: the budget counts from there.
    Every policy but float32 gets an equal share of what is left, with one share
    kept back for a re-run with the fix.
    """
    import json

    from mpconvert.speed.watch import Stopped, watch

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

    for line in watch("mpconvert.commands.doctor_model", [json.dumps(spec)], env, deadline):
        if isinstance(line, Stopped):
            if not loaded[0]:
                return timed, None, f"the model did not load in {CHILD_LOAD_S:g} s"
            if time.perf_counter() >= until():  # the whole budget is spent: not timed, not a kernel's fault
                return timed, None, None
            return timed, policies[len(timed)], None
        if "error" in line:  # the child's MpconvertError, as the main command would say it
            raise MpconvertError(str(line["error"]), hint=line.get("fix"))
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
    candidates = {p: s for p in MODEL_POLICIES[1:] if (s := result[p].speedup) is not None}
    fixed_candidates = {p: f.speedup for p in MODEL_POLICIES[1:] if (f := result[p].with_fix) is not None}
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
    )


if __name__ == "__main__":
    import json
    import os
    import sys

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    _child(json.loads(sys.argv[1]))
