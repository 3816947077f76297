"""The JSON Schemas of report.json and batch.json, shipped in the package, and the version rule.

Every report and batch summary carries `schema_version`. A reader refuses a
version it does not know (a newer mpconvert's report may mean something
else by a field) instead of judging it wrongly. The schemas are what CI
systems and other tools can validate against; the tests validate every
report and batch.json they produce.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from mpconvert.system.errors import MpconvertError

# Raise it when a field changes meaning or goes away (adding one is compatible
# for readers, but the schema is strict, so add it to the schema too).
SCHEMA_VERSION = 1
KNOWN_VERSIONS = (1,)
SCHEMAS = {"report": "report.schema.json", "batch": "batch.schema.json", "verify": "verify.schema.json"}


@functools.cache
def schema(kind: str) -> dict:
    return json.loads(resources.files("mpconvert.report.schemas").joinpath(SCHEMAS[kind]).read_text())


def problems(document: Any, kind: str) -> list[str]:
    """Where `document` breaks the `kind` schema ("report", "batch" or "verify"), one line each; empty when it is valid."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(schema(kind))
    found = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in found]


def check_version(document: dict, role: str, path: Any, hint: str) -> None:
    """Refuse a report or batch.json of a schema version this mpconvert does not know."""
    version = document.get("schema_version")
    if version in KNOWN_VERSIONS:
        return
    if version is None:
        raise MpconvertError(
            f"{role} {path} has no schema_version: it was written by an mpconvert from before report schemas",
            hint="convert the model again with this mpconvert to get a report it can re-check",
        )
    raise MpconvertError(
        f"{role} {path} has schema_version {version!r}, which this mpconvert does not know "
        f"(it reads {', '.join(map(str, KNOWN_VERSIONS))})",
        hint="re-check it with the mpconvert version that wrote it, or upgrade mpconvert",
    )
