"""Click options, derived from the options' keyword declarations (options/).

A conversion's flag is its Python API keyword with dashes, so a command
hands what click parsed to `api.conversion_options` as it is. Help text,
ranges and defaults come from the declaration, so the CLI, the API, the
manifest and docs/options.md cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from mpconvert.options.convert import CONVERSION_KEYWORDS
from mpconvert.options.export import EXPORT_KEYWORDS, check_export_kinds
from mpconvert.options.gate import GATE_KEYWORDS, check_tolerance
from mpconvert.options.keywords import Keyword
from mpconvert.options.precision import POLICIES
from mpconvert.options.signing import SIGNING_KEYWORDS
from mpconvert.options.tracking import TRACKING_KEYWORDS
from mpconvert.system.errors import MpconvertError
from mpconvert.system.urls import is_url, without_credentials


class LocalPath(click.Path):
    """A path read or written on this machine: a URL is refused, not turned into a local folder named "s3:".

    click.Path would hand `s3://b/x` over as Path("s3:/b/x"); only --out
    (of the main command and of batch) goes to object storage.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(path_type=Path, **kwargs)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and is_url(value):
            self.fail(
                f"{without_credentials(value)} is a URL; only --out may be object storage. "
                "Give a local path (copy an input to this machine first, e.g. with aws s3 cp)",
                param,
                ctx,
            )
        return super().convert(value, param, ctx)


@contextmanager
def _usage_error(value: str) -> Iterator[None]:
    """The options' own check of a flag's value fails as a usage error (exit 2) that names the flag."""
    try:
        yield
    except MpconvertError as exc:
        raise click.BadParameter(f"{value!r}: {exc.message} ({exc.hint})") from None


def parse_exports(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in value.split(",") if k.strip())
    with _usage_error(value):
        check_export_kinds(kinds)
    return kinds


def parse_tolerances(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]):
    """`X` (every artifact kind) or `KIND=X`, repeatable -> ((kind or None, X), ...)."""
    parsed = []
    for value in values:
        kind, sep, number = value.rpartition("=")
        try:
            x = float(number)
        except ValueError:
            raise click.BadParameter(
                f"{value!r}: expected X or KIND=X with X a number, e.g. 1e-3 or onnx=0.05"
            ) from None
        with _usage_error(value):
            check_tolerance(param.name, kind if sep else None, x)
        parsed.append((kind if sep else None, x))
    return tuple(parsed)


def per_output_parser(spec: Keyword):
    """`X` (every output) or `OUTPUT=X`, repeatable -> ((output or None, X), ...), X checked like the API's."""
    one = dataclasses.replace(spec, default=0)

    def parse(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]):
        parsed = []
        for value in values:
            output, _, text = value.rpartition("=")
            item: object = text
            if not spec.choices:
                try:
                    item = float(text)
                except ValueError:
                    item = math.nan
            if item != item or not one.in_range(item):  # NaN, or out of range
                example = f"{spec.choices[0]} or OUTPUT={spec.choices[-1]}" if spec.choices else "0.01 or OUTPUT=0.02"
                raise click.BadParameter(f"{value!r}: expected X or OUTPUT=X with X {one.rule()}, e.g. {example}")
            parsed.append((output or None, item))
        return tuple(parsed)

    return parse


def _number_type(spec: Keyword) -> click.ParamType:
    if spec.minimum is None and spec.maximum is None:
        return click.INT if spec.kind == "int" else click.FLOAT
    if spec.kind == "int":
        low, high = (None if bound is None else int(bound) for bound in (spec.minimum, spec.maximum))
        return click.IntRange(low, high, min_open=spec.minimum_open)
    return click.FloatRange(spec.minimum, spec.maximum, min_open=spec.minimum_open)


def default_help(spec: Keyword, stored: bool = False) -> str:
    """The `[default: ...]` a flag's help ends with: the declared default, or what None means."""
    if stored and spec.gate:
        return "[default: the report's]"
    if spec.default_text:
        return f"[default: {spec.default_text}]"
    if spec.default in (None, ()) or spec.default is False:
        return ""
    shown = ",".join(spec.default) if isinstance(spec.default, tuple) else spec.default
    if spec.kind == "bool":
        shown = f"--{spec.name.replace('_', '-')}"
    return f"[default: {shown}]"


def option_for(spec: Keyword, stored: bool = False, help_text: str | None = None):
    """The click option of one keyword, under the keyword's own name."""
    flag = spec.cli_flag
    kwargs: dict = {"help": " ".join(filter(None, (help_text or spec.help, default_help(spec, stored))))}
    if spec.metavar:
        kwargs["metavar"] = spec.metavar
    if spec.kind == "bool":
        if spec.default:
            flag = f"{flag}/--no-{flag[2:]}"
            kwargs["default"] = True
        else:
            kwargs["is_flag"] = True
    elif spec.kind in ("int", "float"):
        kwargs["type"] = _number_type(spec)
        if spec.default is not None:
            kwargs["default"] = spec.default
    elif spec.kind == "strings":
        kwargs["multiple"] = True
    elif spec.kind == "kinds":
        kwargs["default"] = ",".join(spec.default)
        kwargs["callback"] = parse_exports
    elif spec.kind == "tolerances":
        kwargs["multiple"] = True
        kwargs["callback"] = parse_tolerances
    elif spec.kind == "per_output":
        kwargs["multiple"] = True
        kwargs["callback"] = per_output_parser(spec)
    elif spec.kind == "path":
        kwargs["type"] = LocalPath()
    elif spec.flag_value is not None:
        kwargs["is_flag"] = False
        kwargs["flag_value"] = spec.flag_value
    elif spec.choices:
        kwargs["type"] = click.Choice(spec.choices)
        if spec.default is not None:
            kwargs["default"] = spec.default
    elif spec.default is not None:  # a plain str: None from click would replace the declared default
        kwargs["default"] = spec.default
    return click.option(flag, spec.name, **kwargs)


def _apply(command, options: Iterable):
    for option in reversed(list(options)):
        command = option(command)
    return command


def keyword_flags(specs: Iterable[Keyword], stored: bool = False, help_text: dict[str, str] | None = None):
    """A decorator adding one flag per keyword (API-only keywords have none)."""
    overrides = help_text or {}
    options = [option_for(s, stored, overrides.get(s.name)) for s in specs if s.on_command_line]
    return lambda command: _apply(command, options)


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE


# The conversion's and the export's flags, without the gate's (gate_flags adds those).
CONVERSION_FLAG_KEYWORDS = {
    **{k: s for k, s in CONVERSION_KEYWORDS.items() if not s.gate},
    **EXPORT_KEYWORDS,
}


def conversion_flags(given_only: bool = False, exclude: tuple[str, ...] = ()):
    """The main command's conversion and export flags, passed to the command as one `conversion` dict.

    With given_only (batch defaults), only flags given on the command line
    are in it, so they do not override a manifest with click's defaults.
    The gate's flags, added by gate_flags, join the same dict; `exclude`
    names flags the command keeps for itself (batch's --baseline).
    """
    names = [n for n in (*CONVERSION_FLAG_KEYWORDS, *GATE_KEYWORDS) if n not in exclude]

    def decorate(command):
        @functools.wraps(command)
        def wrapper(**kwargs):
            ctx = click.get_current_context()
            conversion = {}
            for name in names:
                if name not in kwargs:
                    continue
                value = kwargs.pop(name)
                if not given_only or _given(ctx, name):
                    conversion[name] = value
            return command(conversion=conversion, **kwargs)

        return keyword_flags(CONVERSION_FLAG_KEYWORDS.values())(wrapper)

    return decorate


def tracking_flags(command):
    """--mlflow, --mlflow-experiment, --register and --mlflow-optional, passed to the command as one `tracking` dict."""

    @functools.wraps(command)
    def wrapper(**kwargs):
        tracking = {name: kwargs.pop(name) for name in TRACKING_KEYWORDS if name in kwargs}
        return command(tracking=tracking, **kwargs)

    return keyword_flags(TRACKING_KEYWORDS.values())(wrapper)


def signing_flags(command):
    """--sign-key, passed to the command as one `signing` dict."""

    @functools.wraps(command)
    def wrapper(**kwargs):
        signing = {name: kwargs.pop(name) for name in SIGNING_KEYWORDS if name in kwargs}
        return command(signing=signing, **kwargs)

    return keyword_flags(SIGNING_KEYWORDS.values())(wrapper)


def gate_flags(stored: bool, exclude: tuple[str, ...] = ()):
    """The gate's thresholds, for `convert`, `check` (stored=True: absent keeps the report's) and `batch`."""
    return keyword_flags([s for k, s in GATE_KEYWORDS.items() if k not in exclude], stored)


def flags_for(*names: str, help_text: dict[str, str] | None = None):
    """Some conversion keywords' flags, for a command that takes only those (inspect)."""
    return keyword_flags([CONVERSION_KEYWORDS[n] for n in names], help_text=help_text)


model_argument = click.argument("model", type=LocalPath())
debug_option = click.option("--debug", is_flag=True, help="Show tracebacks and framework logs.")
quiet_option = click.option(
    "--quiet", "-q", is_flag=True, help="Print nothing but errors (and what --json or --summary - ask for)."
)
policy_option = click.option(
    "--policy",
    type=click.Choice(POLICIES),
    help="mixed_float16 (NVIDIA Tensor Cores) or mixed_bfloat16 (TPU, bf16 CPUs).",
)


def output_flags(what: str = "report"):
    """--junit, --summary and --json: what to write once a result exists."""
    options = [
        click.option(
            "--junit",
            type=LocalPath(dir_okay=False),
            help="Write a JUnit XML file, one test case per "
            + ("check." if what in ("report", "verification") else "model and policy."),
        ),
        click.option("--summary", metavar="FILE|-", help="Write a Markdown summary (for a CI job page); - for stdout."),
        click.option(
            "--json", "as_json", is_flag=True, help=f"Print the {what} as JSON on stdout, and nothing else there."
        ),
    ]
    return lambda command: _apply(command, options)
