"""The speed and memory a conversion bought, measured on this machine, and the hardware facts.

Mixed precision is only worth its accuracy risk if it is faster where the
model runs, and that is hardware-specific: on a 2-core EPYC with
avx512_bf16 a mixed_bfloat16 Dense(4096)x2 served 1.6x faster than float32
at batch 256, while on a 2-core EPYC without it (Zen 3, AVX2 only) 16-bit
matmuls took twice float32's time. So every figure is a ratio against the
float32 original measured in the same run (measure.py), never a proxy.

hardware.py: facts, no benchmark (and the warning printed before
converting); timing.py: the timer and the call it times; measure.py: the
converted model against float32 per path (Keras, SavedModel, ONNX);
Activation memory is the Keras kind's (keras/activation_memory.py). `mpconvert doctor` (commands/doctor.py) builds on the
facts and the timer. TensorFlow and ONNX Runtime are imported by the
functions that need them.
"""

from mpconvert.speed.hardware import (
    CPU_FEATURES,
    Gpu,
    Hardware,
    fast_units,
    probe_hardware,
    read_cpu,
    target_note,
    warning_for,
)
from mpconvert.speed.measure import (
    SPEED_BATCH,
    PathSpeed,
    Speed,
    measure_artifact_speed,
    measure_onnx_speed,
    measure_speed,
    padding_cost,
)
from mpconvert.speed.timing import BUDGET_S, REPEATS, SPEED_PATHS, median_ms

__all__ = [
    "BUDGET_S",
    "CPU_FEATURES",
    "REPEATS",
    "SPEED_BATCH",
    "SPEED_PATHS",
    "Gpu",
    "Hardware",
    "PathSpeed",
    "Speed",
    "fast_units",
    "measure_artifact_speed",
    "measure_onnx_speed",
    "measure_speed",
    "median_ms",
    "padding_cost",
    "probe_hardware",
    "read_cpu",
    "target_note",
    "warning_for",
]
