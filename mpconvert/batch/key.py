"""The key of a result: what it was computed from, by content.

A hash of the model's files, every field of the job's options objects (the
files they name by content) and the versions of mpconvert and the
frameworks. The fields are walked, not listed, so an option added to
options.py is in the key from the start; the few that cannot change a
result are named in NOT_KEYED. Paths are not part of it (files count by
content), so the same model and data under another folder, on another
machine or in another CI run has the same key: a shared output root works
as a team-wide cache. A changed model, option or TensorFlow version gives
another key, and converts again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from mpconvert.batch.manifest import PATH_KEYS, Job
from mpconvert.report.report import versions

_CHUNK = 1 << 20

# The options fields left out of the key, by "Class.field", and why: each
# cannot change a result. Every other field is in it.
NOT_KEYED = (
    # The model's path: its files are in the key by content (file_digest),
    # and the same model under another folder is the same result.
    "LoadOptions.source",
    # Python objects the Python API alone takes: a manifest cannot set them
    # (it has `imports`), so a batch job never has any.
    "LoadOptions.custom_objects",
)


def file_digest(path: Path) -> str:
    """sha256 of a file, or of a folder's files with their relative paths."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if file != path:
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        with file.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def _mpconvert_version() -> str:
    from mpconvert.report.report import mpconvert_version

    return mpconvert_version()


def _value(field: dataclasses.Field, value: Any) -> Any:
    """A field's value as the key holds it: a file it names by content, any other path as text."""
    declared = field.metadata.get("keyword")
    names_a_file = declared is not None and (declared.name or field.name) in PATH_KEYS
    # data may also be "module:function", which is not a path and stays as written.
    if names_a_file and isinstance(value, (str, Path)) and Path(value).exists():
        return {"sha256": file_digest(Path(value))}
    return str(value) if isinstance(value, Path) else value


def keyed_fields(options: Any) -> dict:
    """Every field of an options object that can change a result, nested options as nested tables."""
    found = {}
    for field in dataclasses.fields(options):
        if f"{type(options).__name__}.{field.name}" in NOT_KEYED:
            continue
        value = getattr(options, field.name)
        found[field.name] = keyed_fields(value) if dataclasses.is_dataclass(value) else _value(field, value)
    return found


def job_key(job: Job) -> str:
    content = {
        "model": file_digest(job.model),
        "options": keyed_fields(job.options),
        "export": keyed_fields(job.export),
        "versions": {**versions(), "mpconvert": _mpconvert_version()},
    }
    # No default=str: a value JSON cannot spell would be keyed by its repr, which may hide a change.
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
