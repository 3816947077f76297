"""The report's speed section (the converted model against float32, per path) and the slow-kernel finding.

Every figure is a ratio against the float32 original measured in the same
process, through the same path, on the same rows:

    ratio = float32_ms / converted_ms    (above 1: the converted model is faster)

The ratios and the summary are derived from the times, never stored apart
from them, so a report read back says what the one that wrote it said.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from mpconvert.report.sections.base import Section, known

# The latency percentiles every timed path reports beside its median.
PERCENTILES = (50, 90, 99)


def memory_ratio(float32_bytes: int | None, converted_bytes: int | None) -> float | None:
    """Activation memory, converted / float32 (below 1 the converted model needs less)."""
    if not float32_bytes or converted_bytes is None:
        return None
    return converted_bytes / float32_bytes


def slower_of(float32_ms: float | None, converted_ms: float | None) -> float | None:
    """How many times float32's time the 16-bit call took, to 3 significant digits."""
    # Two decimals would read a 0.2056x probe as 0.21x, 2% off the figures beside it.
    if not float32_ms or float32_ms <= 0 or converted_ms is None:
        return None
    return float(f"{converted_ms / float32_ms:.3g}")


@dataclass(frozen=True)
class Latency(Section):
    """Every timed call of one model at one batch; the percentiles and the throughput are derived from them.

    With the few calls a conversion's speed stage makes (3 to 10), p99 is
    in effect the slowest call; `calls` says how many there were.
    """

    batch: int  # rows per call
    calls_ms: tuple[float, ...]

    def percentile(self, q: float) -> float | None:
        if not self.calls_ms:
            return None
        return round(float(np.percentile(self.calls_ms, q)), 3)

    @property
    def rows_per_s(self) -> float | None:
        """Rows served per second over all timed calls."""
        total_s = sum(self.calls_ms) / 1000
        return round(self.batch * len(self.calls_ms) / total_s, 1) if total_s > 0 else None

    @property
    def words(self) -> str:
        p50, p90, p99 = (self.percentile(q) for q in PERCENTILES)
        return f"p50 {p50} ms, p90 {p90} ms, p99 {p99} ms, {self.rows_per_s} rows/s ({len(self.calls_ms)} calls)"

    def to_json(self) -> dict:
        figures = {f"p{q}_ms": self.percentile(q) for q in PERCENTILES}
        return {
            "batch": self.batch,
            "calls": len(self.calls_ms),
            "calls_ms": [round(t, 3) for t in self.calls_ms],
            **figures,
            "rows_per_s": self.rows_per_s,
        }

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Latency:
        return cls(stored["batch"], tuple(stored.get("calls_ms") or ()))

    @classmethod
    def of(cls, calls_ms: list[float], batch: int) -> Latency:
        return cls(batch, tuple(round(t, 3) for t in calls_ms))


@dataclass(frozen=True)
class ActivationMemory(Section):
    """Activation memory at the speed batch: the converted model against float32, measured on a GPU, else
    computed from every layer's output shape and dtype (`method` says which)."""

    batch: int
    float32_bytes: int | None
    converted_bytes: int | None
    ratio: float | None  # converted / float32 (`memory_ratio`): below 1 the converted model needs less
    method: str
    unknown_layers: tuple[str, ...] = ()  # layers whose output size is only known at run time: not counted

    @classmethod
    def of(
        cls, batch: int, float32_bytes: int, converted_bytes: int, method: str, unknown: tuple[str, ...] = ()
    ) -> ActivationMemory:
        return cls(batch, float32_bytes, converted_bytes, memory_ratio(float32_bytes, converted_bytes), method, unknown)

    def derived(self) -> ActivationMemory:
        return replace(self, ratio=memory_ratio(self.float32_bytes, self.converted_bytes))

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> ActivationMemory:
        found = known(cls, stored)
        return cls(**{**found, "method": found["method"] or "", "unknown_layers": tuple(found["unknown_layers"] or ())})


@dataclass(frozen=True)
class PathSpeed:
    """Both models through one path; a side that could not run has None and a note."""

    float32_ms: float | None
    converted_ms: float | None
    runtime: str  # what ran both: "tensorflow", "onnxruntime:CPUExecutionProvider", ...
    note: str | None = None
    # Every timed call of each side (the medians above are theirs): percentiles and rows per second.
    latency: dict[str, Latency] | None = None

    @property
    def ratio(self) -> float | None:
        """float32 time / converted time: above 1 the converted model is faster."""
        if not self.float32_ms or not self.converted_ms:
            return None
        return self.float32_ms / self.converted_ms

    def to_json(self) -> dict:
        return {
            "float32_ms": self.float32_ms,
            "converted_ms": self.converted_ms,
            "ratio": self.ratio,
            "runtime": self.runtime,
            "note": self.note,
            "latency": None if self.latency is None else {side: t.to_json() for side, t in self.latency.items()},
        }

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> PathSpeed:
        latency = stored.get("latency")
        return cls(
            stored.get("float32_ms"),
            stored.get("converted_ms"),
            stored.get("runtime", ""),
            stored.get("note"),
            None if latency is None else {side: Latency.from_json(t) for side, t in latency.items()},
        )


@dataclass(frozen=True)
class Speed:
    device: str  # "CPU: <model name>" or "GPU: <name>"
    batch: int  # rows per call (--speed-batch); the data's rows repeated when it has fewer
    rows: int  # validation rows available
    paths: dict[str, PathSpeed] = field(default_factory=dict)
    memory: ActivationMemory | None = None

    def with_path(self, name: str, timing: PathSpeed) -> Speed:
        """This result with one more path (the ONNX file, timed after the export)."""
        return replace(self, paths={**self.paths, name: timing})

    def derived(self) -> Speed:
        """The memory ratio computed again from the byte counts (the path ratios always are: `PathSpeed.ratio`)."""
        return replace(self, memory=self.memory.derived() if self.memory else None)

    @property
    def summary(self) -> str:
        """ "savedmodel 1.62x, keras 1.58x as fast as float32 (batch 256 of 450 validation rows, CPU: ...)"."""
        timed = ", ".join(f"{name} {p.ratio:.2f}x" for name, p in self.paths.items() if p.ratio is not None)
        untimed = [f"{name} not timed: {p.note}" for name, p in self.paths.items() if p.ratio is None]
        text = f"{timed or 'nothing timed'} as fast as float32 (above 1 is faster; {self.batch_words}, {self.device})"
        served = [
            f"{name} {p.latency['converted'].words}"
            for name, p in self.paths.items()
            if p.latency and "converted" in p.latency
        ]
        if served:
            text += f"; the converted model at batch {self.batch}: " + "; ".join(served)
        if self.memory and self.memory.ratio is not None:
            text += f"; activation memory {self.memory.ratio:.2f}x float32's ({self.memory.method})"
        return "; ".join([text, *untimed])

    @property
    def batch_words(self) -> str:
        if self.batch > self.rows:
            return f"batch {self.batch}, the data's {self.rows} rows repeated"
        rows = f"all {self.rows} validation rows" if self.batch == self.rows else f"{self.rows} validation rows"
        return f"batch {self.batch} of {rows}"

    def to_json(self) -> dict:
        return {
            "device": self.device,
            "batch": self.batch,
            "rows": self.rows,
            "paths": {name: p.to_json() for name, p in self.paths.items()},
            "memory": None if self.memory is None else self.memory.to_json(),
            "summary": self.summary,
        }

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Speed:
        paths = {name: PathSpeed.from_json(p) for name, p in (stored.get("paths") or {}).items()}
        batch: Any = stored.get("batch")
        memory = stored.get("memory")
        found = None if memory is None else ActivationMemory.from_json(memory)
        return cls(stored.get("device", ""), batch, stored.get("rows", batch), paths, found)

    # The names callers of earlier versions use.
    as_dict = to_json
    from_dict = from_json


@dataclass(frozen=True)
class PaddingCost(Section):
    """What padding's pad and slice ops cost on this machine: the padded model's serving time against the unpadded."""

    unpadded_ms: float
    padded_ms: float
    cost: float | None  # padded / unpadded time
    summary: str

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> PaddingCost:
        return cls(**known(cls, stored))


@dataclass(frozen=True)
class SpeedNotes(Section):
    """What the speed stage says beside its figures."""

    warning: str | None  # the hardware's warning before converting, e.g. no fast 16-bit units here
    target_note: str | None  # what the policy needs on the machine that will serve it
    padding: PaddingCost | None  # None when the model was not padded

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> SpeedNotes:
        padding = stored.get("padding")
        cost = None if padding is None else PaddingCost.from_json(padding)
        return cls(stored.get("warning"), stored.get("target_note"), cost)


_NOTES = ("warning", "target_note", "padding")


@dataclass(frozen=True)
class SpeedReport:
    """The report's speed: the figures, and the speed stage's notes.

    `notes` is None when only --bench-onnx timed (the speed stage did not
    run), and such a section has none of their keys.
    """

    measured: Speed
    notes: SpeedNotes | None = None

    @property
    def paths(self) -> dict[str, PathSpeed]:
        return self.measured.paths

    def with_path(self, name: str, timing: PathSpeed) -> SpeedReport:
        return replace(self, measured=self.measured.with_path(name, timing))

    def derived(self) -> SpeedReport:
        return replace(self, measured=self.measured.derived())

    def to_json(self) -> dict:
        return {**self.measured.to_json(), **(self.notes.to_json() if self.notes else {})}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> SpeedReport:
        notes = SpeedNotes.from_json(stored) if any(key in stored for key in _NOTES) else None
        return cls(Speed.from_json(stored), notes)


@dataclass(frozen=True)
class KernelProbe(Section):
    """One batch through each model's traced call: ms each, and how much slower the 16-bit one is."""

    rows: int
    float32_ms: float
    converted_ms: float
    slower: float | None  # converted / float32, to 3 significant digits (`slower_of`)
    # What was timed: the model at the serving batch, or the one-Dense probe run before loading it
    what: str | None = None

    def derived(self) -> KernelProbe:
        return replace(self, slower=slower_of(self.float32_ms, self.converted_ms))

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> KernelProbe:
        return cls(**known(cls, stored))


@dataclass(frozen=True)
class SlowKernel(Section):
    """A broken 16-bit kernel found right after the rewrite, and what was done about it."""

    found: KernelProbe  # with TensorFlow's default settings
    done: str
    fixed: KernelProbe | None  # after the restart with the fix; None when there was none
    summary: str
    cached: bool | None = None  # `found` came from the per-machine probe's cache (None: measured on the model)

    def derived(self) -> SlowKernel:
        return replace(self, found=self.found.derived(), fixed=self.fixed.derived() if self.fixed else None)

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> SlowKernel:
        found = known(cls, stored)
        fixed = found["fixed"]
        return cls(
            **{
                **found,
                "found": KernelProbe.from_json(found["found"] or {}),
                "fixed": None if fixed is None else KernelProbe.from_json(fixed),
            }
        )
