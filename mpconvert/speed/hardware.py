"""Hardware facts: what TensorFlow and the kernel say about this machine, no benchmark.

`fast_units` says whether the device TensorFlow runs on has 16-bit units,
`warning_for` turns that into the line printed before converting. These are
facts, not measurements: the measured ratio is `measure_speed`'s.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass
from pathlib import Path

from mpconvert.options.precision import Precision

# The /proc/cpuinfo flags that decide 16-bit speed on a CPU. avx512f alone
# only converts between formats; the *_bf16 / *_fp16 ones compute.
CPU_FEATURES = ("avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")
CPU_UNITS = {"float16": ("avx512_fp16", "amx_fp16"), "bfloat16": ("avx512_bf16", "amx_bf16")}
# NVIDIA Tensor Cores: float16 from Volta (7.0), bfloat16 from Ampere (8.0).
TENSOR_CORES = {"float16": (7, 0), "bfloat16": (8, 0)}


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: tuple[int, int] | None  # None: TensorFlow did not say

    def tensor_cores(self, dtype: str) -> bool | None:
        if self.compute_capability is None:
            return None
        return tuple(self.compute_capability) >= TENSOR_CORES[dtype]

    def as_dict(self) -> dict:
        cc = self.compute_capability
        return {
            "name": self.name,
            "compute_capability": None if cc is None else f"{cc[0]}.{cc[1]}",
            **{f"{dtype}_tensor_cores": self.tensor_cores(dtype) for dtype in TENSOR_CORES},
        }


@dataclass(frozen=True)
class Hardware:
    """What TensorFlow and the kernel say about this machine; no benchmark."""

    cpu: str  # the CPU's model name
    cpu_features: tuple[str, ...]  # those of CPU_FEATURES it has
    gpus: tuple[Gpu, ...] = ()
    tpus: int = 0

    @property
    def device(self) -> str:
        """Where TensorFlow runs a model by default: "GPU: <name>", "TPU" or "CPU: <model name>"."""
        if self.gpus:
            return f"GPU: {self.gpus[0].name}"
        if self.tpus:
            return "TPU"
        return f"CPU: {self.cpu}"

    def as_dict(self) -> dict:
        return {
            "device": self.device,
            "cpu": self.cpu,
            "cpu_features": {name: name in self.cpu_features for name in CPU_FEATURES},
            "gpus": [gpu.as_dict() for gpu in self.gpus],
            "tpus": self.tpus,
        }


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
