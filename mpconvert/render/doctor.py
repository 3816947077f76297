"""`mpconvert doctor`'s table."""

from __future__ import annotations

import sys
from typing import IO

from rich.markup import escape
from rich.table import Table

from mpconvert.render.common import console_for
from mpconvert.report.doctor import Diagnosis, ModelTiming, OpenVinoTiming, PolicyTiming, Timed
from mpconvert.report.sections.machine import CPU_FEATURES, Gpu

# --- the doctor -----------------------------------------------------------------


def _bench_cell(entry: Timed | PolicyTiming | OpenVinoTiming) -> str:
    if entry.ms is None:
        return "not supported"
    return f"{entry.ms:.1f} ({entry.speedup:.2f}x)" if entry.speedup is not None else f"{entry.ms:.1f}"


def render_doctor(found: Diagnosis, stream: IO[str] | None = None) -> None:
    """`mpconvert doctor`: the hardware facts, the micro-benchmark table and the recommendation."""
    console = console_for(stream or sys.stdout)
    hw = found.hardware
    console.print(f"[bold]mpconvert doctor[/]: TensorFlow runs on {escape(hw.device)}")
    features = ", ".join(f"{name} {'yes' if name in hw.cpu_features else 'no'}" for name in CPU_FEATURES)
    console.print(f"  CPU: {escape(hw.cpu)}: {features}")
    gpus = [
        f"{g.name} (compute capability {_capability(g) or '?'}: Tensor Cores float16 "
        f"{'yes' if g.tensor_cores('float16') else 'no'}, bfloat16 {'yes' if g.tensor_cores('bfloat16') else 'no'})"
        for g in hw.gpus
    ]
    console.print(f"  GPUs: {escape('; '.join(gpus)) if gpus else 'none'}")
    console.print(f"  TPUs: {hw.tpus or 'none'}")
    ort = found.providers
    listed = [f"{p} {'loads' if p in ort.usable else 'is listed but does not load'}" for p in ort.available]
    console.print(f"  ONNX Runtime providers: {'; '.join(listed)}")
    console.print("  versions: " + ", ".join(f"{k} {v}" for k, v in found.versions.items() if v))
    seconds = round(found.seconds, 2)  # as --json writes it
    console.print(f"[bold]benchmark[/]: median ms (speed-up over float32), {seconds:.1f} s in all")
    policies = ("float32", "mixed_float16", "mixed_bfloat16")
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("Keras layers in tf.function", "what", *policies):
        table.add_column(column)
    for case, entry in found.layers.items():
        table.add_row(case, entry.label, *[_bench_cell(entry.timings[p]) for p in policies])
    console.print(table)
    dtypes = ("float32", "float16", "bfloat16")
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("ONNX Runtime", "op", "shape", *dtypes):
        table.add_column(column)
    for provider, result in found.onnxruntime.items():
        for op in ("matmul", "conv"):
            table.add_row(provider, op, result[op].label, *[_bench_cell(result[op].timings[d]) for d in dtypes])
    console.print(table)
    rec = found.recommendation
    console.print(f"[bold]recommendation[/]: {rec.policy or 'float32 (no 16-bit policy pays here)'}")
    for line in rec.lines:
        console.print(f"  {escape(line)}")


def _capability(gpu: Gpu) -> str | None:
    """ "8.0", as the doctor's JSON writes it."""
    cc = gpu.compute_capability
    return None if cc is None else f"{cc[0]}.{cc[1]}"


def render_model_timing(found: ModelTiming, stream: IO[str] | None = None) -> None:
    """`mpconvert doctor MODEL`: the model's serving time under float32 and each policy, and the advice."""
    console = console_for(stream or sys.stdout)
    console.print(
        f"[bold]mpconvert doctor[/] {escape(found.model)}: serving path at batch {found.batch} "
        f"on {escape(found.device)}, {found.seconds:.1f} s"
    )
    for policy, entry in found.policies.items():
        if entry.ms is None:
            console.print(f"  {policy}: {escape(entry.note or 'not timed')}")
        else:
            console.print(f"  {policy}: {_bench_cell(entry)} ms")
    for policy, ir in found.openvino.items():
        if ir.ms is None:
            console.print(f"  {policy} on OpenVINO: {escape(ir.note or 'not timed')}")
        else:
            against = f" against float32 {ir.float32_ms:.1f} ms" if ir.float32_ms is not None else ""
            console.print(
                f"  {policy} on OpenVINO ({escape(ir.precision or '?')}): {_bench_cell(ir)} ms{against} on TensorFlow"
            )
    if found.openvino_note:
        console.print(f"  OpenVINO: {escape(found.openvino_note)}")
    if found.cut_short:
        console.print(f"  [yellow]cut short[/]: {escape(found.cut_short)}")
    console.print(f"[bold]recommendation[/]: {escape(found.recommendation)}")
