"""The report's provenance: exactly what went in (model and data bytes, options, command) and where it ran.

A report that says how a model was converted must let anyone find out,
later and elsewhere, whether the model, the data and the options they hold
are the ones it was made from: each input is recorded by its sha256, the
options as the keywords the Python API takes (so `conversion_options`
rebuilds them), and the machine by the CPU flags and GPUs that decide
16-bit speed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpconvert.report.sections.base import JSONValue, Section, known
from mpconvert.report.sections.machine import Hardware
from mpconvert.system.digests import digest


@dataclass(frozen=True)
class InputFile(Section):
    """A file or folder the run read, by content."""

    path: str
    sha256: str
    bytes: int
    files: int  # 1 for a file; a folder's digest is over its files (digests.py)

    @classmethod
    def of(cls, path: Path) -> InputFile:
        found = digest(path)
        return cls(str(Path(path).absolute()), found.sha256, found.bytes, found.files)

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> InputFile:
        return cls(**known(cls, stored))


@dataclass(frozen=True)
class DataRecord(Section):
    """The rows the run judged (and fine-tuned) on, and the file they came from, if any."""

    source: str  # npz, callable, arrays, generated (data.DataSource)
    file: InputFile | None  # the .npz read; None for rows that came from no file
    validation_rows: int
    train_rows: int | None  # None without a training split

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> DataRecord:
        found = known(cls, stored)
        file = found["file"]
        return cls(**{**found, "file": None if file is None else InputFile.from_json(file)})


@dataclass(frozen=True)
class Provenance(Section):
    model: InputFile | None  # None for a live model handed to the Python API
    data: DataRecord
    # The keywords that rebuild the run's options (`api.conversion_options(model, policy, **options)`),
    # the export's included; a value that has no JSON form (custom_objects, arrays) is named, not kept.
    # Any keyword an options declaration names, so a mapping of JSON values rather than fields of its own.
    options: Mapping[str, JSONValue]
    command: tuple[str, ...] | None  # the command line; None for the Python API
    machine: Hardware  # the CPU, its 16-bit flags, GPUs
    # The folder the run started in (absolute): relative paths in `options` and `command`, and the
    # modules `--import` and `--data module:function` name, were found from there. None in reports
    # written before it was recorded.
    folder: str | None = None
    baseline: InputFile | None = None  # the --baseline report.json read, by content
    # The user's modules the run imported (--import, --data module:function), by name: the file each
    # was imported from. A namespace package (no file) is not listed.
    modules: dict[str, InputFile] = field(default_factory=dict)

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Provenance:
        found = known(cls, stored)
        model, command, baseline = found["model"], found["command"], found["baseline"]
        return cls(
            **{
                **found,
                "model": None if model is None else InputFile.from_json(model),
                "data": DataRecord.from_json(found["data"] or {}),
                "options": dict(found["options"] or {}),
                "command": None if command is None else tuple(command),
                "machine": Hardware.from_json(found["machine"] or {}),
                "baseline": None if baseline is None else InputFile.from_json(baseline),
                "modules": {name: InputFile.from_json(f) for name, f in (found["modules"] or {}).items()},
            }
        )


@dataclass(frozen=True)
class Golden(Section):
    """golden.npz: input rows with the float32 and the converted model's outputs, for `verify` elsewhere."""

    path: str  # relative to the output folder
    rows: int
    sha256: str
    bytes: int

    @classmethod
    def of(cls, folder: Path, name: str, rows: int) -> Golden:
        found = digest(folder / name)
        return cls(name, rows, found.sha256, found.bytes)

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Golden:
        return cls(**known(cls, stored))


def recorded(value: Any) -> JSONValue:
    """An option's value as the report keeps it: JSON values as they are, anything else by its type's name."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [recorded(v) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: recorded(v) for k, v in value.items()}
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:  # an array: what it was, not its values
        return f"<{type(value).__name__} {dtype} {tuple(shape)}: not recorded>"
    return f"<{type(value).__name__}: not recorded>"


def recorded_options(*keywords: Mapping[str, Any]) -> dict[str, JSONValue]:
    return {name: recorded(value) for found in keywords for name, value in found.items()}


def recorded_command(argv: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if argv is None else tuple(str(a) for a in argv)
