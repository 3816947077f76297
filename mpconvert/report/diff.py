"""What differs between two reports of one conversion: the figures, the artifacts, the versions, the machine.

`mpconvert replay` runs a conversion again from what its report recorded
and shows this comparison. Measured times are left out (they differ every
run); everything else the gate judges or a reader would trace is compared
exactly: on the same machine and versions a replay reproduces the figures,
and anything that moved is named with both values.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# Wall-clock figures: never the same twice.
TIMED = frozenset({"seconds", "step_time", "step_time_ratio"})
# The report's sections compared field by field (figures, per-layer policies), then the rest named below.
FIGURES = ("validation", "finetune", "fidelity", "padding", "layers")


# Artifact bytes that differ between two runs of the same conversion, and why: not a change of the model.
_TRACED = "TensorFlow names the functions it traces (and tf2onnx the nodes made from them) with a counter"
EXPECTED = {
    "artifacts.keras.sha256": "a .keras file records the time it was saved",
    **{f"artifacts.{kind}.{key}": _TRACED for kind in ("savedmodel", "onnx") for key in ("sha256", "bytes")},
}


@dataclass(frozen=True)
class Difference:
    field: str  # where in report.json, e.g. "validation.converted" or "artifacts.onnx.sha256"
    before: Any
    after: Any

    @property
    def expected(self) -> str | None:
        """Why this field differs between any two runs, where it does; None for a real change."""
        return EXPECTED.get(self.field)

    @property
    def same(self) -> bool:
        return self.before == self.after

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "before": self.before, "after": self.after, "expected": self.expected}


def _walk(before: Any, after: Any, where: str) -> Iterator[Difference]:
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        for key in sorted(set(before) | set(after), key=str):
            if key not in TIMED:
                yield from _walk(before.get(key), after.get(key), f"{where}.{key}")
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for i, (b, a) in enumerate(zip(before, after)):
            yield from _walk(b, a, f"{where}[{i}]")
    else:
        yield Difference(where, before, after)


def _by_kind(report: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(a.get("kind")): a for a in report.get("artifacts") or []}


def _machine(report: Mapping[str, Any]) -> Any:
    return (report.get("provenance") or {}).get("machine")


def compared(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[Difference, ...]:
    """Every compared field of two reports with both values (`same` says whether they match)."""
    found = [Difference("passed", before.get("passed"), after.get("passed"))]
    for section in FIGURES:
        found += _walk(before.get(section), after.get(section), section)
    old, new = _by_kind(before), _by_kind(after)
    for kind in sorted(set(old) | set(new)):
        for key in ("sha256", "bytes", "max_abs_diff"):
            found.append(Difference(f"artifacts.{kind}.{key}", old.get(kind, {}).get(key), new.get(kind, {}).get(key)))
    golden = before.get("golden") or {}, after.get("golden") or {}
    found.append(Difference("golden.sha256", golden[0].get("sha256"), golden[1].get("sha256")))
    found += _walk(before.get("versions"), after.get("versions"), "versions")
    found += _walk(_machine(before), _machine(after), "machine")
    return tuple(found)
