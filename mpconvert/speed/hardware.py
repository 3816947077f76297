"""Hardware facts: what TensorFlow and the kernel say about this machine, no benchmark.

`fast_units` says whether the device TensorFlow runs on has 16-bit units,
`warning_for` turns that into the line printed before converting. These are
facts, not measurements: the measured ratio is `measure_speed`'s.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

from mpconvert.options.precision import Precision
from mpconvert.report.sections.machine import CPU_FEATURES, TENSOR_CORES, Gpu, Hardware

__all__ = [
    "CPU_FEATURES",
    "CPU_UNITS",
    "TENSOR_CORES",
    "Gpu",
    "Hardware",
    "fast_units",
    "probe_hardware",
    "read_cpu",
    "target_note",
    "warning_for",
]

CPU_UNITS = {"float16": ("avx512_fp16", "amx_fp16"), "bfloat16": ("avx512_bf16", "amx_bf16")}


def read_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, tuple[str, ...]]:
    """The CPU's model name and which of CPU_FEATURES it has (none known off Linux)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        text = cpuinfo.read_text()
    except OSError:
        return name, ()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            name = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
            break  # every core lists the same flags, after its model name
    return name, tuple(f for f in CPU_FEATURES if f in flags)


@functools.cache
def probe_hardware() -> Hardware:
    """This machine's facts (cached: they do not change while a process runs)."""
    import tensorflow as tf

    gpus = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        gpus.append(Gpu(details.get("device_name", device.name), details.get("compute_capability")))
    cpu, features = read_cpu()
    return Hardware(cpu, features, tuple(gpus), len(tf.config.list_physical_devices("TPU")))


def fast_units(hardware: Hardware, dtype: str) -> tuple[bool | None, str]:
    """Whether the device TensorFlow runs on here has units for `dtype` ("float16"/"bfloat16"), and why.

    None when it cannot be told (a GPU whose compute capability is unknown).
    """
    if hardware.gpus:
        gpu = hardware.gpus[0]
        has = gpu.tensor_cores(dtype)
        need = "{}.{}".format(*TENSOR_CORES[dtype])
        if has is None:
            return None, f"the compute capability of {gpu.name} is unknown ({dtype} Tensor Cores need {need})"
        cc = "{}.{}".format(*(gpu.compute_capability or ()))
        if has:
            return True, f"{dtype} Tensor Cores on {gpu.name} (compute capability {cc})"
        return False, f"no {dtype} Tensor Cores on {gpu.name}: compute capability {cc}, they need {need}"
    if hardware.tpus:
        if dtype == "bfloat16":
            return True, "TPUs compute in bfloat16"
        return False, "TPUs have no float16 units (they compute in bfloat16)"
    units = [f for f in CPU_UNITS[dtype] if f in hardware.cpu_features]
    if units:
        return True, f"{dtype} units on this CPU: {', '.join(units)}"
    return False, f"no {dtype} units on this CPU: neither {' nor '.join(CPU_UNITS[dtype])}"


def warning_for(policy: str | Precision, hardware: Hardware | None = None) -> str | None:
    """A one-line warning when `policy` cannot be fast on this hardware; None when it can.

    From hardware facts alone (no benchmark): float16 on a CPU without
    avx512_fp16/amx_fp16 or a GPU below compute capability 7.0, bfloat16 on
    a CPU without avx512_bf16/amx_bf16 or a GPU below 8.0, float16 on a TPU.
    """
    precision = Precision.of(policy)
    hardware = hardware or probe_hardware()
    fast, why = fast_units(hardware, precision.compute_dtype)
    if fast is not False:
        return None
    return (
        f"{precision.name} may run slower than float32 here ({why}); the report's speed section "
        "gives the measured ratio, and `mpconvert doctor` measures this machine"
    )


def target_note(precision: Precision) -> str | None:
    """Said beside the speed figures when this machine lacks the units the policy is for."""
    fast, why = fast_units(probe_hardware(), precision.compute_dtype)
    return None if fast is not False else f"this machine's figure, not the target's ({why})"
