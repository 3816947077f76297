"""`mpconvert doctor`'s table."""

from __future__ import annotations

import sys
from typing import IO

from rich.markup import escape
from rich.table import Table

from .common import console_for

# --- the doctor -----------------------------------------------------------------


def _bench_cell(entry: dict) -> str:
    if entry["ms"] is None:
        return "not supported"
    return f"{entry['ms']:.1f} ({entry['speedup']:.2f}x)" if entry["speedup"] is not None else f"{entry['ms']:.1f}"


def render_doctor(found: dict, stream: IO[str] | None = None) -> None:
    """`mpconvert doctor`: the hardware facts, the micro-benchmark table and the recommendation."""
    console = console_for(stream or sys.stdout)
    hw = found["hardware"]
    console.print(f"[bold]mpconvert doctor[/]: TensorFlow runs on {escape(hw['device'])}")
    features = ", ".join(f"{name} {'yes' if has else 'no'}" for name, has in hw["cpu_features"].items())
    console.print(f"  CPU: {escape(hw['cpu'])}: {features}")
    gpus = [
        f"{g['name']} (compute capability {g['compute_capability'] or '?'}: Tensor Cores float16 "
        f"{'yes' if g['float16_tensor_cores'] else 'no'}, bfloat16 {'yes' if g['bfloat16_tensor_cores'] else 'no'})"
        for g in hw["gpus"]
    ]
    console.print(f"  GPUs: {escape('; '.join(gpus)) if gpus else 'none'}")
    console.print(f"  TPUs: {hw['tpus'] or 'none'}")
    ort = found["onnxruntime"]
    listed = [f"{p} {'loads' if p in ort['usable'] else 'is listed but does not load'}" for p in ort["available"]]
    console.print(f"  ONNX Runtime providers: {'; '.join(listed)}")
    console.print("  versions: " + ", ".join(f"{k} {v}" for k, v in found["versions"].items() if v))
    bench = found["benchmark"]
    console.print(f"[bold]micro-benchmark[/]: median ms (speed-up over float32), {bench['seconds']:.1f} s in all")
    rows = [("tensorflow", bench["tensorflow"])] + [(f"onnxruntime {p}", b) for p, b in bench["onnxruntime"].items()]
    dtypes = [key for key, value in bench["tensorflow"]["matmul"].items() if isinstance(value, dict)]
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("runtime", "op", "shape", *dtypes):
        table.add_column(column)
    for runtime, result in rows:
        for op in ("matmul", "conv"):
            table.add_row(runtime, op, result[op]["shape"], *[_bench_cell(result[op][d]) for d in dtypes])
    console.print(table)
    rec = found["recommendation"]
    console.print(f"[bold]recommendation[/]: {rec['policy'] or 'float32 (no 16-bit policy pays here)'}")
    for line in rec["lines"]:
        console.print(f"  {escape(line)}")
