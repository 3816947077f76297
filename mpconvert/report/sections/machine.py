"""The machine a report was made on: the hardware facts that decide 16-bit speed (no benchmark).

A value of the core, so that the report's provenance and verify.json hold
it typed; `speed.hardware` probes this machine for it, and says what the
facts mean for a policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The /proc/cpuinfo flags that decide 16-bit speed on a CPU. avx512f alone
# only converts between formats; the *_bf16 / *_fp16 ones compute.
CPU_FEATURES = ("avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")
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

    def to_json(self) -> dict[str, Any]:
        cc = self.compute_capability
        return {
            "name": self.name,
            "compute_capability": None if cc is None else f"{cc[0]}.{cc[1]}",
            **{f"{dtype}_tensor_cores": self.tensor_cores(dtype) for dtype in TENSOR_CORES},
        }

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Gpu:
        cc = stored.get("compute_capability")
        major, _, minor = str(cc).partition(".")
        return cls(stored.get("name", ""), None if cc is None else (int(major), int(minor or 0)))

    as_dict = to_json  # the name callers of earlier versions use


@dataclass(frozen=True)
class Hardware:
    """What TensorFlow and the kernel say about a machine; no benchmark."""

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

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "cpu": self.cpu,
            "cpu_features": {name: name in self.cpu_features for name in CPU_FEATURES},
            "gpus": [gpu.to_json() for gpu in self.gpus],
            "tpus": self.tpus,
        }

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Hardware:
        """A stored machine (the device is derived from the rest)."""
        features = stored.get("cpu_features") or {}
        return cls(
            stored.get("cpu", ""),
            tuple(name for name, present in features.items() if present),
            tuple(Gpu.from_json(g) for g in stored.get("gpus") or ()),
            stored.get("tpus") or 0,
        )

    as_dict = to_json  # the name callers of earlier versions use
