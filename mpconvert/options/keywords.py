"""What one option of a conversion is, declared once on its options field.

An options dataclass field says, through `keyword(...)`, everything the
three front doors need: the Python API keyword, the manifest key and the
CLI flag share its name, help, kind, range and default. `api` builds the
options from keywords with `build` (and `keywords_of` spells options back
as those keywords, for a batch worker's spec), `cli.flags` turns each
Keyword into a click option, the batch manifest derives its TOML types
from `toml_types`, and docs/options.md is generated from the same table (a
test keeps it in step). The ranges are checked here once, for every door, in the options'
__post_init__ (`check_ranges`). A field also says whether it can change a
result (`keyed`): a batch result's cache key walks every field but those
(`key_fields`), so an option added to an options class is in the key from
the start.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpconvert.system.errors import MpconvertError
from mpconvert.system.urls import local_path

# What a keyword's value is, on the command line and in TOML:
#   str, int, float, bool: one value (bool flags are --x, or --x/--no-x when on by default)
#   strings: a repeatable flag, a TOML list (or one string); a tuple in the options
#   kinds: a comma-separated flag, a TOML list; a tuple in the options
#   tolerances: a repeatable [KIND=]X flag, a TOML number or {kind = X} table
#   per_output: a repeatable [OUTPUT=]X flag (X a number, or one of `choices`), a TOML value or
#     {output = X} table; a plain X sets every output, later entries win
#   path: a file path (relative to a manifest, in a batch)
#   object: the Python API only (custom_objects)
KINDS = ("str", "int", "float", "bool", "strings", "kinds", "tolerances", "per_output", "path", "object")


@dataclass(frozen=True)
class Keyword:
    help: str
    kind: str = "str"
    name: str = ""  # the API keyword and manifest key; "" is the field's own name
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    minimum_open: bool = False
    maximum: float | None = None
    # What None (or an empty default) means, for --help and the docs.
    default_text: str = ""
    rule_note: str = ""  # said after the range in an error, e.g. "(0 turns padding off)"
    flag: str = ""  # the CLI flag when it is not --name-with-dashes
    metavar: str = ""
    # A str flag whose value may be left out (`--mlflow` or `--mlflow URI`): what the bare flag gives.
    flag_value: str | None = None
    # A gate threshold: `mpconvert check` takes it too, and there an absent one keeps the report's value.
    gate: bool = False
    # The value may name a file or folder: a batch manifest gives it relative to itself, and a batch
    # result's key holds it by content (data may also be "module:function", which stays as written).
    file: bool = False
    # Filled in by `table`: where the value goes (options class, field name), and its default.
    default: Any = None
    target: tuple[type, str] | None = None

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind

    @property
    def on_command_line(self) -> bool:
        return self.kind != "object"

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def rule(self) -> str:
        """The range in words, as an error message or the docs say it."""
        if self.choices:
            text = f"one of {', '.join(self.choices)}"
        elif self.minimum is not None and self.maximum is not None:
            text = f"between {self.minimum:g} and {self.maximum:g}"
        elif self.minimum is not None:
            noun = "an integer" if self.kind == "int" else "a number"
            text = f"{noun} {'>' if self.minimum_open else '>='} {self.minimum:g}"
        else:
            text = ""
        if self.rule_note:
            text = f"{text} {self.rule_note}"
        if self.default is None and text:
            text += " or None"
        return text

    def in_range(self, value: Any) -> bool:
        if value is None and self.default is None:
            return True
        if self.choices:
            return value in self.choices
        if self.minimum is not None and not (value > self.minimum if self.minimum_open else value >= self.minimum):
            return False
        return self.maximum is None or value <= self.maximum

    def to_field(self, value: Any) -> Any:
        """The API's (or TOML's) spelling of a value, as the options field holds it."""
        if value is None:
            return None
        if self.kind == "strings":
            return (value,) if isinstance(value, str) else tuple(value)
        if self.kind == "kinds":
            if isinstance(value, str):
                return tuple(k.strip() for k in value.split(",") if k.strip())
            return tuple(value)
        if self.kind in ("tolerances", "per_output"):
            return per_kind(value)
        if self.kind == "path":  # read locally: a URL would become a relative "s3:" path
            return local_path(value, self.name)
        return value

    def toml_types(self) -> tuple[type, ...]:
        """What a manifest value of this key may be (the options then check the range)."""
        return {
            "str": (str,),
            "int": (int,),
            "float": (int, float),
            "bool": (bool,),
            "strings": (list, str),
            "kinds": (list, str),
            "tolerances": (int, float, dict),
            "per_output": (str, dict) if self.choices else (int, float, dict),
            "path": (str,),
            "object": (),
        }[self.kind]


def keyword(default: Any = None, *, keyed: bool = True, **declared: Any) -> Any:
    """An options field that is also an API keyword, a manifest key and (mostly) a CLI flag.

    keyed=False: the field cannot change a result, so a batch result's key leaves it out.
    """
    return dataclasses.field(default=default, metadata={"keyword": Keyword(**declared), "keyed": keyed})


def unkeyed(**field: Any) -> Any:
    """A field without a keyword that cannot change a result (as `keyword`'s keyed=False)."""
    return dataclasses.field(metadata={"keyed": False}, **field)


def is_keyed(field: dataclasses.Field) -> bool:
    """Whether the field can change a result, so a batch result's key holds it: every field unless declared not."""
    return field.metadata.get("keyed", True)


def key_fields(options: Any, content: Callable[[Path], str]) -> dict[str, Any]:
    """Every keyed field of `options`, by field name, nested options as nested tables, in JSON types.

    A field that names a file (`Keyword.file`) holds the file's `content`
    digest instead of its path, when it is one, so the same file under
    another folder gives the same table; any other path is its text.
    """
    found: dict[str, Any] = {}
    for field in dataclasses.fields(options):
        if not is_keyed(field):
            continue
        value = getattr(options, field.name)
        declared = field.metadata.get("keyword")
        if dataclasses.is_dataclass(value):
            found[field.name] = key_fields(value, content)
        elif declared is not None and declared.file and isinstance(value, (str, Path)) and Path(value).exists():
            found[field.name] = {"sha256": content(Path(value))}
        else:
            found[field.name] = str(value) if isinstance(value, Path) else value
    return found


def per_kind(value: Any) -> tuple[tuple[str | None, Any], ...]:
    """A tolerance for every artifact kind, or one per kind: 1e-3 or {"onnx": 0.05}."""
    if value is None:
        return ()
    if isinstance(value, str):
        return ((None, value),)
    if isinstance(value, (int, float)):
        return ((None, float(value)),)
    if isinstance(value, Mapping):
        return tuple((kind, x if isinstance(x, str) else float(x)) for kind, x in value.items())
    # Pairs as tuples: JSON gives keywords_of's pairs back as lists.
    return tuple((kind, x) for kind, x in value)


def check_ranges(options: Any) -> None:
    """Refuse a field outside its declared range, in the words the CLI's own checks use."""
    for field in dataclasses.fields(options):
        declared = field.metadata.get("keyword")
        if declared is None:
            continue
        spec = dataclasses.replace(declared, name=declared.name or field.name, default=field.default)
        value = getattr(options, field.name)
        if spec.kind in ("int", "float", "str") and not spec.in_range(value):
            raise MpconvertError(
                f"{spec.name}={value!r} is invalid: it must be {spec.rule()}",
                hint=f"pass a {spec.name} that is {spec.rule()}",
            )
        if spec.kind == "per_output":
            one = dataclasses.replace(spec, default=0)  # each value is judged alone, never None
            for output, item in value:
                if not one.in_range(item):
                    given = f"{output}={item!r}" if output else repr(item)
                    raise MpconvertError(
                        f"{spec.name}={given} is invalid: it must be {one.rule()}",
                        hint=f"pass a {spec.name} that is {one.rule()}, for every output or as OUTPUT=VALUE",
                    )


def table(*owners: type) -> dict[str, Keyword]:
    """Every keyword the options classes declare, by name, in declaration order.

    A name is declared once: a value that two stages use (seed) is one field
    that the pipeline hands to both, so each keyword sets exactly one field.
    """
    found: dict[str, Keyword] = {}
    for owner in owners:
        for field in dataclasses.fields(owner):
            declared = field.metadata.get("keyword")
            if declared is None:
                continue
            name = declared.name or field.name
            if name in found:
                raise ValueError(f"keyword {name!r} is declared by {found[name].target} and {(owner, field.name)}")
            default = field.default if field.default is not dataclasses.MISSING else None
            found[name] = dataclasses.replace(declared, name=name, default=default, target=(owner, field.name))
    return found


def refuse_unknown(given: Mapping[str, Any], known: Mapping[str, Keyword] | tuple[str, ...], what: str) -> None:
    unknown = [name for name in given if name not in known]
    if unknown:
        near = difflib.get_close_matches(unknown[0], list(known), n=1)
        raise MpconvertError(
            f"unknown {what} {unknown[0]!r}" + (f" (did you mean {near[0]!r}?)" if near else ""),
            hint=f"the {what}s are: {', '.join(known)}",
        )


def build(owner: type, keywords: Mapping[str, Any], known: Mapping[str, Keyword], **fixed: Any) -> Any:
    """`owner` built from the keywords aimed at it (the rest keep its defaults), plus `fixed` fields."""
    values = dict(fixed)
    for name, value in keywords.items():
        declared = known[name].target
        if declared is None:
            continue
        target, field = declared
        if target is owner:
            values[field] = known[name].to_field(value)
    return owner(**values)


def keywords_of(options: Any) -> dict[str, Any]:
    """The keywords that build `options` again: `build`'s inverse, nested options included.

    Every declared field, under its keyword, in the API's spelling (paths as
    strings), so that the result survives JSON: for a ConvertOptions,
    `conversion_options(model, policy, **keywords_of(options)) == options`.
    The fields without a default (the model, the policy) are the caller's
    own arguments; a field with a default but no keyword (set by the
    pipeline, not by users) has no spelling, so it must hold its default.
    """
    found: dict[str, Any] = {}
    for field in dataclasses.fields(options):
        value = getattr(options, field.name)
        declared = field.metadata.get("keyword")
        if declared is not None:
            found[declared.name or field.name] = str(value) if isinstance(value, Path) else value
        elif dataclasses.is_dataclass(value):
            found.update(keywords_of(value))
        elif field.default is not dataclasses.MISSING and value != field.default:
            raise ValueError(
                f"{type(options).__name__}.{field.name}={value!r} has no keyword, so keywords cannot rebuild it"
            )
    return found
