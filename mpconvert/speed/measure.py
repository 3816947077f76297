"""The speed a conversion bought: the converted model against the float32 original, per path.

Every figure is a ratio against the float32 original measured in the same
process, through the same path, on the same rows:

    ratio = float32_ms / converted_ms    (above 1: the converted model is faster)

`measure_speed` times each path's pair of runners (runners/: the Keras
call and the SavedModel serving function traced in memory, or a frozen
graph's serving function); `measure_onnx_speed` the converted .onnx
against a float32 export of the original, in ONNX Runtime (--bench-onnx).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from mpconvert.options.convert import DEFAULT_SPEED_BATCH
from mpconvert.report.sections import PaddingCost, PathSpeed, Speed
from mpconvert.report.sections.speed import ActivationMemory, Latency
from mpconvert.runners.base import Runner
from mpconvert.runners.onnx import missing_kernel
from mpconvert.speed.hardware import Hardware, probe_hardware
from mpconvert.speed.timing import BUDGET_S, REPEATS, median_ms, rounded_ms, timed_ms
from mpconvert.system.errors import first_line

# The default serving batch (--speed-batch): at 64 rows a mixed_bfloat16
# Dense(4096)x2 read 1.12x over float32 where it served 2.04x at 256.
SPEED_BATCH = DEFAULT_SPEED_BATCH


def serving_rows(inputs: Sequence[np.ndarray], batch: int) -> list[np.ndarray]:
    """`batch` rows to time: the first validation rows, or, when there are fewer, those rows repeated.

    Repeating real rows keeps every value valid for the model (token ids
    below an Embedding's vocabulary, even when the input is float-typed);
    timing depends on the shapes, not on which rows they are.
    """
    take = np.arange(batch) % len(inputs[0])
    return [x[take] for x in inputs]


# Timing per path: both models take turns, median of up to REPEATS runs
# after one warm-up call (the trace; later calls of a traced function took
# the same time here), fewer when a run is slow (at least 3), to spend about
# BUDGET_S. Dense(4096)x2 at batch 256 took 240-700 ms a run on the 2 shared
# cores here, so it gets 3-6 runs; a small MLP gets all 10 in milliseconds.


def measure_speed(
    paths: Mapping[str, tuple[Runner, Runner]],
    inputs: Sequence[np.ndarray],
    *,
    batch: int = SPEED_BATCH,
    memory: Callable[[list[np.ndarray]], ActivationMemory | None] | None = None,
    hardware: Hardware | None = None,
    repeats: int = REPEATS,
    budget_s: float = BUDGET_S,
) -> Speed:
    """Inference time of the converted model against the float32 original, per path, at `batch` rows.

    `paths` maps each path to (the original's runner, the converted model's);
    `inputs` are the validation inputs (one array per model input), of
    which `serving_rows` takes `batch`. Both runners of a path take turns
    on the same rows. `memory(rows)`, where given, adds the activation memory.
    """
    rows = len(inputs[0])
    feeds = serving_rows(inputs, batch)
    timed = {}
    for path, (original, converted) in paths.items():
        runs = {"float32": original.timer(feeds), "converted": converted.timer(feeds)}
        timed[path] = _path_speed(timed_ms(runs, repeats=repeats, budget_s=budget_s, warmup=1), batch, original.runtime)
    found = memory(feeds) if memory else None
    return Speed((hardware or probe_hardware()).device, batch, rows, timed, found)


def padding_cost(
    unpadded: Runner,
    padded: Runner,
    inputs: Sequence[np.ndarray],
    *,
    batch: int = SPEED_BATCH,
    repeats: int = REPEATS,
    budget_s: float = BUDGET_S,
) -> PaddingCost:
    """What padding's pad and slice ops cost on this machine: the padded model's serving time against the unpadded.

    Padding is for the target's Tensor Cores (multiples of 8 in float16),
    so it is kept even where it costs here; this says how much it does, and
    how to choose the other way. It can cost: on a 2-core Intel Xeon with
    AMX, the mixed_bfloat16 SavedModel of a Dense(4096)x2 model with its
    Dense(10) padded to 16 served at 0.90-0.94x of the same model built by
    hand, the unpadded one (pad_multiple=0) at 1.03-1.22x (bench/compare.py).
    """
    feeds = serving_rows(inputs, batch)
    runs = {"unpadded": unpadded.timer(feeds), "padded": padded.timer(feeds)}
    ms = median_ms(runs, repeats=repeats, budget_s=budget_s, warmup=1)
    cost = ms["padded"] / ms["unpadded"] if ms["unpadded"] else None
    summary = (
        f"the padded model serves in {cost:.2f}x the unpadded one's time on this machine "
        f"({rounded_ms(ms['padded'])} ms against {rounded_ms(ms['unpadded'])} ms, batch {batch}; "
        "padding is for the target's Tensor Cores, not this CPU; "
        "--pad-multiple 0 (pad_multiple=0) exports the unpadded model)"
        if cost
        else "not timed"
    )
    return PaddingCost(rounded_ms(ms["unpadded"]), rounded_ms(ms["padded"]), round(cost, 4) if cost else None, summary)


def measure_onnx_speed(
    baseline: Runner,
    converted: Runner,
    name: str,
    inputs: Sequence[np.ndarray],
    *,
    batch: int = SPEED_BATCH,
    repeats: int = REPEATS,
    budget_s: float = BUDGET_S,
) -> PathSpeed:
    """The converted ONNX file (`name`) against a float32 export of the original, in ONNX Runtime.

    Runs on CUDA where it really loads, else CPU. A file the provider has no
    kernels for (bfloat16 on the CPU provider) is reported as such and not
    timed: an emulated copy would time float32 arithmetic with extra casts.
    """
    feeds = serving_rows(inputs, batch)
    runtime = baseline.runtime
    runs = {"float32": baseline.timer(feeds)}
    note = None
    try:
        runs["converted"] = converted.timer(feeds)
    except Exception as exc:  # ONNX Runtime's own exception classes
        if not missing_kernel(exc):
            raise
        note = (
            f"{name} does not run as written on {runtime} ({first_line(exc, 200)}); "
            "not timed on an emulated copy, which would time float32 arithmetic"
        )
    return _path_speed(timed_ms(runs, repeats=repeats, budget_s=budget_s, warmup=1), batch, runtime, note)


def measure_artifact_speed(
    float32: Runner,
    artifact: Runner,
    name: str,
    inputs: Sequence[np.ndarray],
    *,
    batch: int = SPEED_BATCH,
    repeats: int = REPEATS,
    budget_s: float = BUDGET_S,
) -> PathSpeed:
    """A written artifact in its own runtime (the OpenVINO IR) against the float32 original as it serves now.

    The ratio is what serving the artifact instead of the float32 model buys on this machine, runtime and
    precision together: on a 2-core Xeon with AMX-BF16, OpenVINO with the bf16 hint served ResNet50 7.6x
    TensorFlow float32, and MobileNetV2 1.54x where TensorFlow's own mixed_bfloat16 served it 0.58x.
    """
    feeds = serving_rows(inputs, batch)
    runs = {"float32": float32.timer(feeds), "converted": artifact.timer(feeds)}
    runtime = f"{artifact.runtime} ({name}) against float32 on {float32.runtime}"
    return _path_speed(timed_ms(runs, repeats=repeats, budget_s=budget_s, warmup=1), batch, runtime)


def _path_speed(calls: Mapping[str, list[float]], batch: int, runtime: str, note: str | None = None) -> PathSpeed:
    """Both sides' medians (rounded once, as the ratio is taken of them) and every call's time."""
    median = {side: rounded_ms(statistics.median(ms)) for side, ms in calls.items()}
    latency = {side: Latency.of(ms, batch) for side, ms in calls.items()}
    return PathSpeed(median["float32"], median.get("converted"), runtime, note, latency)
