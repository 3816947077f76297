"""The doctor's findings as typed values: `mpconvert doctor` (the machine) and `mpconvert doctor MODEL`.

commands/doctor.py and doctor_model.py measure and build these, the
renderings (render/doctor.py) take them, and `--json` prints `to_json()`.
The layer benchmark also crosses a process boundary (the same layers
timed with oneDNN's rewrites off, in a child): `from_json` reads that back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mpconvert.report.sections import Hardware


@dataclass(frozen=True)
class Timed:
    """One thing timed under one policy (or dtype): its median and its speed-up over float32, or why not."""

    ms: float | None
    speedup: float | None  # float32 ms / ms
    note: str | None = None  # why it was not timed ("not supported: ...")

    def to_json(self) -> dict[str, Any]:
        return {"ms": self.ms, "speedup": self.speedup, "note": self.note}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Timed:
        return cls(stored.get("ms"), stored.get("speedup"), stored.get("note"))


@dataclass(frozen=True)
class Bench:
    """One case of a benchmark (a Keras layer, or a bare ONNX op) timed under each policy or dtype, in order."""

    label: str  # what it is: a layer case's words, or an op's shape
    timings: Mapping[str, Timed]  # policy (or dtype) -> its timing
    label_key: str = "what"  # the key report.json-style output gives the label ("what", or "shape" for an op)

    def to_json(self) -> dict[str, Any]:
        return {self.label_key: self.label, **{name: t.to_json() for name, t in self.timings.items()}}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any], label_key: str = "what") -> Bench:
        timings = {name: Timed.from_json(t) for name, t in stored.items() if name != label_key}
        return cls(stored.get(label_key, ""), timings, label_key)


@dataclass(frozen=True)
class Pathology:
    """A (layer, policy) far slower than float32: a broken kernel, with what fixes it (measured)."""

    layer: str
    policy: str
    slower: float  # times float32's time
    what: str  # the layer case in words
    other_policy_speedup: float | None = None  # the other policy on the same layer
    onednn_off_speedup: float | None = None  # this policy with TF_ENABLE_ONEDNN_OPTS=0; None: not measured
    summary: str = ""  # all of it in one line

    def to_json(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "policy": self.policy,
            "slower": self.slower,
            "what": self.what,
            "other_policy_speedup": self.other_policy_speedup,
            "onednn_off_speedup": self.onednn_off_speedup,
            "summary": self.summary,
        }


@dataclass(frozen=True)
class PolicyVerdict:
    """One policy on the layer benchmark: each layer's speed-up, their geometric mean, and whether it pays."""

    speedups: Mapping[str, float | None]  # layer case -> speed-up over float32 (None: no kernel)
    speedup: float | None  # the geometric mean; None when a layer did not run
    pays: bool

    def to_json(self) -> dict[str, Any]:
        return {**self.speedups, "speedup": self.speedup, "pays": self.pays}


@dataclass(frozen=True)
class Recommendation:
    policy: str | None  # None: neither policy pays here; keep float32
    lines: tuple[str, ...]
    policies: Mapping[str, PolicyVerdict]
    # Layers far slower under a policy than in float32, with what fixes them (measured)
    pathologies: tuple[Pathology, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "lines": list(self.lines),
            "policies": {name: p.to_json() for name, p in self.policies.items()},
            "pathologies": [p.to_json() for p in self.pathologies],
        }

    as_dict = to_json  # the name callers of earlier versions use


@dataclass(frozen=True)
class Providers:
    """The ONNX Runtime providers this build lists, and those that really load here."""

    available: tuple[str, ...]
    usable: tuple[str, ...]

    def to_json(self) -> dict[str, list[str]]:
        return {"available": list(self.available), "usable": list(self.usable)}


@dataclass(frozen=True)
class Diagnosis:
    """`mpconvert doctor`: the facts, the benchmarks and the recommendation."""

    hardware: Hardware
    providers: Providers
    versions: Mapping[str, str | None]
    layers: Mapping[str, Bench]  # Keras layer case -> its timings per policy
    onnxruntime: Mapping[str, Mapping[str, Bench]]  # provider -> op -> its timings per dtype
    recommendation: Recommendation
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "hardware": self.hardware.to_json(),
            "onnxruntime": self.providers.to_json(),
            "versions": dict(self.versions),
            "benchmark": {
                "layers": {"device": self.hardware.device, **{k: b.to_json() for k, b in self.layers.items()}},
                "onnxruntime": {
                    provider: {op: b.to_json() for op, b in ops.items()} for provider, ops in self.onnxruntime.items()
                },
                "seconds": round(self.seconds, 2),
            },
            "recommendation": self.recommendation.to_json(),
        }

    as_dict = to_json  # the name callers of earlier versions use


# --- `mpconvert doctor MODEL` -----------------------------------------------------


@dataclass(frozen=True)
class WithFix:
    """A policy cut short for a broken kernel, timed again with the setting that fixes it."""

    setting: str  # the environment setting (TF_ENABLE_ONEDNN_OPTS=0)
    ms: float
    float32_ms: float
    speedup: float

    def to_json(self) -> dict[str, Any]:
        return {"setting": self.setting, "ms": self.ms, "float32_ms": self.float32_ms, "speedup": self.speedup}


@dataclass(frozen=True)
class PolicyTiming:
    """The model's serving time under one policy, or why it was not (fully) timed."""

    ms: float | None
    speedup: float | None
    note: str | None
    cut_short: bool
    with_fix: WithFix | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "ms": self.ms,
            "speedup": self.speedup,
            "note": self.note,
            "cut_short": self.cut_short,
            "with_fix": None if self.with_fix is None else self.with_fix.to_json(),
        }


@dataclass(frozen=True)
class ProbeFinding:
    """The kernel probe's finding for a policy (speed/kernel_probe.py)."""

    slower: float | None  # times float32's time; None: it did not finish
    cached: bool
    note: str | None

    def to_json(self) -> dict[str, Any]:
        return {"slower": self.slower, "cached": self.cached, "note": self.note}


@dataclass(frozen=True)
class OpenVinoTiming:
    """The OpenVINO IR a conversion under one policy writes (--export openvino), timed as the format's check
    compiles it, against float32 on TensorFlow timed in the same child process; or why it was not."""

    ms: float | None
    speedup: float | None  # TensorFlow float32 ms / ms
    float32_ms: float | None  # the TensorFlow float32 figure it is measured against
    precision: str | None  # the INFERENCE_PRECISION_HINT the compiled model reports it runs ("bf16", "f16", "f32")
    note: str | None = None  # why it was not (fully) timed

    def to_json(self) -> dict[str, Any]:
        return {
            "ms": self.ms,
            "speedup": self.speedup,
            "float32_ms": self.float32_ms,
            "precision": self.precision,
            "note": self.note,
        }


@dataclass(frozen=True)
class ModelTiming:
    """`mpconvert doctor MODEL`: the model's serving path timed under float32 and each policy, and the advice."""

    model: str
    batch: int
    device: str
    policies: Mapping[str, PolicyTiming]
    kernel_probe: Mapping[str, ProbeFinding]
    recommendation: str
    recommended_policy: str | None
    recommended_setting: str | None  # an environment setting the recommended policy needs here, or None
    cut_short: str | None
    seconds: float
    # policy -> its OpenVINO IR's timing; empty where none was timed (`openvino_note` says why)
    openvino: Mapping[str, OpenVinoTiming] = field(default_factory=dict)
    openvino_note: str | None = None  # why OpenVINO was not timed at all: the package missing, the budget spent
    recommended_runtime: str | None = None  # "tensorflow" or "openvino": what serves the recommendation fastest

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "batch": self.batch,
            "device": self.device,
            "policies": {name: p.to_json() for name, p in self.policies.items()},
            "kernel_probe": {name: p.to_json() for name, p in self.kernel_probe.items()},
            "recommendation": self.recommendation,
            "recommended_policy": self.recommended_policy,
            "recommended_setting": self.recommended_setting,
            "cut_short": self.cut_short,
            "seconds": self.seconds,
            "openvino": {name: t.to_json() for name, t in self.openvino.items()},
            "openvino_note": self.openvino_note,
            "recommended_runtime": self.recommended_runtime,
        }
