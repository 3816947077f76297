"""Every field of the options classes, walked, with a valid value other than its default for each.

Tests that must hold for every field (the keywords rebuild an options
object, the batch key notices a change) take their fields from
`option_fields`, so a field added to an options class is covered from the start,
or the test fails naming the field that has no value here.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mpconvert.options.convert import ConvertOptions
from mpconvert.options.export import ExportOptions


@dataclasses.dataclass(frozen=True)
class OptionField:
    path: tuple[str, ...]  # field names from the top options object down
    owner: type
    field: dataclasses.Field

    @property
    def name(self) -> str:
        return f"{self.owner.__name__}.{self.field.name}"

    @property
    def has_keyword(self) -> bool:
        return "keyword" in self.field.metadata


def option_fields(owner: type = ConvertOptions, path: tuple[str, ...] = ()) -> Iterator[OptionField]:
    """Every field under `owner`, nested options classes walked rather than listed."""
    hints = typing.get_type_hints(owner)
    for field in dataclasses.fields(owner):
        kind = hints[field.name]
        if dataclasses.is_dataclass(kind):
            yield from option_fields(kind, (*path, field.name))
        else:
            yield OptionField((*path, field.name), owner, field)


def every_field() -> list[OptionField]:
    return [*option_fields(ConvertOptions), *option_fields(ExportOptions)]


def replaced(options: Any, path: tuple[str, ...], value: Any) -> Any:
    """`options` with the field at `path` set to `value`, checked again by each options class on the way."""
    head, *rest = path
    inner = replaced(getattr(options, head), tuple(rest), value) if rest else value
    return dataclasses.replace(options, **{head: inner})


def changed_values(model: Path, data: Path, baseline: Path) -> dict[str, Any]:
    """By "Class.field": a valid value that differs from the default and from the files given (the base job's)."""
    return {
        "LoadOptions.source": model,
        "LoadOptions.unsafe_deserialization": True,
        "LoadOptions.imports": ("json",),
        "LoadOptions.custom_objects": {"Thing": object},
        "LoadOptions.signature": "serve",
        "RewriteOptions.policy": "mixed_bfloat16",
        "RewriteOptions.keep_float32": ("dense.*",),
        "RewriteOptions.auto_keep": (("dense", "lint"),),
        "ValidateOptions.data": str(data),
        "ValidateOptions.metric": ((None, "mse"),),
        "ValidateOptions.generated_samples": 32,
        "FinetuneOptions.steps": 5,
        "FinetuneOptions.learning_rate": 1e-3,
        "FinetuneOptions.batch_size": 16,
        "FinetuneOptions.loss": "mse",
        "PadOptions.multiple": 16,
        "PadOptions.max_overhead": 0.5,
        "PadOptions.proof_samples": 128,
        "GateOptions.max_drop": ((None, 0.05), ("out", 0.1)),
        "GateOptions.min_agreement": 0.9,
        "GateOptions.atol": ((None, 1e-3),),
        "GateOptions.rtol": (("onnx", 0.05),),
        "GateOptions.baseline": baseline,
        "GateOptions.max_regression": 0.01,
        "GateOptions.max_overlap": 0.2,
        "GateOptions.min_speedup": 1.5,
        "AutoKeepOptions.mode": "lint",
        "AutoKeepOptions.search_budget": 60.0,
        "ConvertOptions.speed": False,
        "ConvertOptions.speed_batch": 64,
        "ConvertOptions.seed": 7,
        "ExportOptions.kinds": ("savedmodel",),
        "ExportOptions.opset": 13,
        "ExportOptions.parity_samples": 128,
        "ExportOptions.onnx_io": "float16",
        "ExportOptions.onnx_external_data": 1 << 20,
        "ExportOptions.bench_onnx": True,
    }


def value_for(values: dict[str, Any], option: OptionField) -> Any:
    assert option.name in values, f"{option.name} has no test value: add one to tests/option_values.py"
    return values[option.name]
