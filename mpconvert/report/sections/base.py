"""What every report section shares: its JSON form, and reading one back from a report of any version."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, fields
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

E = TypeVar("E", bound=Enum)

# A value JSON can hold: what a section keeps where its keys are not its own (the keywords that rebuild a run).
JSONValue = str | int | float | bool | None | list["JSONValue"] | dict[str, "JSONValue"]


def native(value: Any) -> Any:
    """`value` in JSON-native types: sections as their JSON form, Enums as their strings, tuples as lists.

    Also the net under every stage: a float that is not finite becomes None
    (JSON null), so that a NaN can fail a check but never the report itself
    (strict JSON has no NaN). The stages store None for what is not finite
    and say so in a note (the validation names the output and the count).
    """
    if isinstance(value, Enum):  # before str: a StrEnum is a str
        return value.value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {native(k): native(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [native(v) for v in value]
    to_json = getattr(value, "to_json", None)
    return to_json() if callable(to_json) else value


def member(kind: type[E], value: Any) -> E | Any:
    """`value` as a member of the Enum `kind`; a value this version does not know (an older or a newer
    report's, a hand-written one's) is kept as it was, for the checks to judge or name."""
    try:
        return kind(value)
    except ValueError:
        return value


def known(cls: type[DataclassInstance], stored: Mapping[str, Any]) -> dict[str, Any]:
    """`cls`'s fields from a stored section, by name: reports written before a field existed lack it.

    A missing field gets its default, or None; keys this version does not
    know are left out.
    """
    found: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in stored:
            found[f.name] = stored[f.name]
        elif f.default is not MISSING:
            found[f.name] = f.default
        elif f.default_factory is not MISSING:
            found[f.name] = f.default_factory()
        else:
            found[f.name] = None
    return found


class Section:
    """A frozen dataclass whose JSON form is its fields, in order (a subclass says where it differs)."""

    def to_json(self) -> dict[str, Any]:
        return {f.name: native(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]
