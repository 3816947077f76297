"""Command-line building blocks shared by every command: flags, outputs, error mapping.

Flags are declared once here and carry the Python API's keyword names, so a
command hands them to `api.conversion_options` as they are. Nothing below
the command line sees click.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

from . import interrupts
from .errors import MpconvertError
from .options import (
    ARTIFACT_KINDS,
    AUTO_KEEP_MODES,
    DEFAULT_BATCH_SIZE,
    DEFAULT_FINETUNE_STEPS,
    DEFAULT_LEARNING_RATE,
    DEFAULT_MAX_DROP,
    DEFAULT_MAX_PAD_OVERHEAD,
    DEFAULT_OPSET,
    DEFAULT_PAD_MULTIPLE,
    DEFAULT_SEARCH_BUDGET,
    EXPORT_KINDS,
    MAX_OPSET,
    METRICS,
    MIN_OPSET,
)
from .precision import POLICIES
from .report import EXIT_FAILED, EXIT_GATE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE

EXIT_CODES_HELP = f"""\b
Exit codes:
  {EXIT_OK}  converted (or re-checked), and every gate check passed
  {EXIT_FAILED}  the input, the conversion or the report failed (message on
     stderr); nothing is written
  {EXIT_USAGE}  usage error (bad option or value)
  {EXIT_GATE}  converted (or re-checked), but a gate check failed: accuracy
     drop, agreement, artifact parity (or an artifact that failed to
     export), fine-tune health, baseline regression or speed (report.json,
     --junit and --summary are still written and name the failing checks)
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C; 143 for SIGTERM); nothing is written
"""


def parse_exports(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in value.split(",") if k.strip())
    unknown = [k for k in kinds if k not in EXPORT_KINDS]
    if unknown or not kinds:
        raise click.BadParameter(f"{value!r}: choose from {', '.join(EXPORT_KINDS)}, comma-separated")
    return kinds


def parse_tolerances(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]):
    """`X` (every artifact kind) or `KIND=X`, repeatable -> ((kind or None, X), ...)."""
    parsed = []
    for value in values:
        kind, sep, number = value.rpartition("=")
        if sep and kind not in ARTIFACT_KINDS:
            raise click.BadParameter(
                f"{value!r}: unknown artifact kind {kind!r}; choose from {', '.join(ARTIFACT_KINDS)}"
            )
        try:
            x = float(number)
        except ValueError:
            x = math.nan
        if not (math.isfinite(x) and x >= 0):
            raise click.BadParameter(f"{value!r}: expected X or KIND=X with X a number >= 0, e.g. 1e-3 or onnx=0.05")
        parsed.append((kind or None, x))
    return tuple(parsed)


def run_action(debug: bool, action: Callable[[], int]) -> int:
    """Run `action`, turning user errors into exit 1 with one message."""
    try:
        return action()
    except MpconvertError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"  fix: {exc.hint}", err=True)
        return EXIT_FAILED
    except KeyboardInterrupt as exc:
        click.echo("interrupted: nothing was written", err=True)
        return getattr(exc, "exit_code", EXIT_INTERRUPTED)
    except MemoryError:
        if debug:
            traceback.print_exc()
        click.echo("error: ran out of memory", err=True)
        click.echo("  fix: free memory, or convert with less --data (fewer validation and training rows)", err=True)
        return EXIT_FAILED
    except Exception as exc:  # a bug in mpconvert or a framework failure we did not foresee
        if debug:
            traceback.print_exc()
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        click.echo(f"error: conversion failed unexpectedly: {type(exc).__name__}: {first}", err=True)
        click.echo("  fix: rerun with --debug for the full traceback and report it", err=True)
        return EXIT_FAILED


model_argument = click.argument("model", type=click.Path(path_type=Path))
keep_option = click.option(
    "--keep-float32",
    "keep_float32",
    multiple=True,
    metavar="REGEX",
    help="Keep layers whose whole name or class name matches REGEX in float32 (repeatable).",
)
import_option = click.option(
    "--import",
    "imports",
    multiple=True,
    metavar="MODULE",
    help="Import MODULE before loading, so the custom layers it registers are found (repeatable). "
    "This runs that module's code.",
)
unsafe_option = click.option(
    "--unsafe-deserialization",
    is_flag=True,
    help="Allow Lambda layers, whose code runs while loading. Only for files you trust.",
)
pad_multiple_option = click.option(
    "--pad-multiple",
    type=click.IntRange(min=0),
    default=DEFAULT_PAD_MULTIPLE,
    show_default=True,
    help="Pad channel dimensions to multiples of N for Tensor Cores (128 for TPUs); 0 turns padding off.",
)
max_pad_overhead_option = click.option(
    "--max-pad-overhead",
    type=click.FloatRange(min=0),
    default=DEFAULT_MAX_PAD_OVERHEAD,
    show_default=True,
    help="Largest share of extra multiply-adds padding may add to the model.",
)
debug_option = click.option("--debug", is_flag=True, help="Show tracebacks and framework logs.")
quiet_option = click.option(
    "--quiet", "-q", is_flag=True, help="Print nothing but errors (and what --json or --summary - ask for)."
)


def _apply(command, options: list):
    for option in reversed(options):
        command = option(command)
    return command


policy_option = click.option(
    "--policy",
    type=click.Choice(POLICIES),
    help="mixed_float16 (NVIDIA Tensor Cores) or mixed_bfloat16 (TPU, bf16 CPUs).",
)
# The conversion's flags, named like conversion_options' keywords (and the
# export's); `conversion_flags` gathers them into one `conversion` dict.
_CONVERSION_FLAGS = [
    click.option(
        "--data",
        help="Labelled data: an .npz with x, y (and x_train, y_train), or module:function returning "
        "(train, validation) -- that form imports and runs your code.",
    ),
    click.option(
        "--max-drop",
        type=click.FloatRange(min=0),
        help=f"Largest allowed metric drop, in the metric's units (0.01 = 1 point of accuracy). [default: {DEFAULT_MAX_DROP}]",
    ),
    click.option(
        "--metric", type=click.Choice(METRICS), help="[default: accuracy for softmax/sigmoid outputs, else mse]"
    ),
    keep_option,
    click.option(
        "--export",
        "export",
        default=",".join(EXPORT_KINDS),
        show_default=True,
        callback=parse_exports,
        help="Artifacts to write, comma-separated.",
    ),
    click.option(
        "--opset",
        type=click.IntRange(MIN_OPSET, MAX_OPSET),
        default=DEFAULT_OPSET,
        show_default=True,
        help="ONNX opset of the .onnx file (tf2onnx 1.17 writes 13 to 18).",
    ),
    click.option(
        "--finetune-steps",
        type=click.IntRange(min=0),
        help=f"Fine-tuning steps, 0 to skip [default: {DEFAULT_FINETUNE_STEPS} when the data has a training split].",
    ),
    click.option(
        "--learning-rate", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_LEARNING_RATE, show_default=True
    ),
    click.option("--batch-size", type=click.IntRange(min=1), default=DEFAULT_BATCH_SIZE, show_default=True),
    click.option("--seed", type=int, default=0, show_default=True, help="Seed for fine-tuning and generated inputs."),
    click.option("--loss", help="Fine-tuning loss [default: the model's saved loss, else one for its output]."),
    pad_multiple_option,
    max_pad_overhead_option,
    import_option,
    unsafe_option,
    click.option(
        "--auto-keep",
        type=click.Choice(AUTO_KEEP_MODES),
        default="search",
        show_default=True,
        help="Keep float32 where 16 bits break: lint (what the numeric lint flags), search (also search for the "
        "layers that fix a failing accuracy or agreement check), off (the gate fails and says so).",
    ),
    click.option(
        "--search-budget",
        type=click.FloatRange(min=0, min_open=True),
        default=DEFAULT_SEARCH_BUDGET,
        show_default=True,
        metavar="SECONDS",
        help="Longest the accuracy-driven search may take.",
    ),
    click.option(
        "--speed/--no-speed",
        default=True,
        show_default=True,
        help="Time the converted model against float32 on this machine (a few seconds; report.json speed).",
    ),
    click.option(
        "--bench-onnx",
        is_flag=True,
        help="Also time the ONNX file against a float32 ONNX export in ONNX Runtime (costs one more export).",
    ),
]
_CONVERSION_NAMES = (
    "data",
    "max_drop",
    "metric",
    "keep_float32",
    "export",
    "opset",
    "finetune_steps",
    "learning_rate",
    "batch_size",
    "seed",
    "loss",
    "pad_multiple",
    "max_pad_overhead",
    "imports",
    "unsafe_deserialization",
    "min_agreement",
    "atol",
    "rtol",
    "baseline",
    "max_regression",
    "auto_keep",
    "search_budget",
    "speed",
    "bench_onnx",
    "min_speedup",
)


def conversion_flags(given_only: bool = False, exclude: tuple[str, ...] = ()):
    """The main command's conversion flags, passed to the command as one `conversion` dict.

    With given_only (batch defaults), only flags given on the command line
    are in it, so they do not override a manifest with click's defaults.
    `exclude` names flags the command keeps for itself (batch's --baseline).
    """

    def decorate(command):
        @functools.wraps(command)
        def wrapper(**kwargs):
            ctx = click.get_current_context()
            conversion = {}
            for name in _CONVERSION_NAMES:
                if name not in kwargs or name in exclude:
                    continue
                value = kwargs.pop(name)
                given = ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
                if not given_only or given:
                    conversion[name] = value
            return command(conversion=conversion, **kwargs)

        return _apply(wrapper, _CONVERSION_FLAGS)

    return decorate


def gate_flags(stored: bool, baseline: bool = True):
    """Thresholds shared by `convert`, `check` and `batch`.

    For `check` (stored=True) an absent threshold keeps the report's value.
    Without `baseline` (batch, whose --baseline is a batch.json) the two
    baseline flags are left out.
    """
    from .gate import DEFAULT_ATOL, DEFAULT_MAX_REGRESSION, DEFAULT_MIN_AGREEMENT

    def default(value: object) -> str:
        return "[default: the report's]" if stored else f"[default: {value}]"

    kinds = ", ".join(ARTIFACT_KINDS)
    options = [
        click.option(
            "--min-agreement",
            type=click.FloatRange(0, 1),
            help="Classifiers: with labels, the smallest share of the rows the float32 model got right that the "
            "converted model must still get right (fixed rows do not count against it); without labels, the "
            f"smallest share of unchanged predictions. {default(DEFAULT_MIN_AGREEMENT)}",
        ),
        click.option(
            "--atol",
            multiple=True,
            callback=parse_tolerances,
            metavar="[KIND=]X",
            help="Absolute artifact parity tolerance: X sets every artifact kind, KIND=X one of "
            f"{kinds} (repeatable). {default(DEFAULT_ATOL)}",
        ),
        click.option(
            "--rtol",
            multiple=True,
            callback=parse_tolerances,
            metavar="[KIND=]X",
            help="Relative parity tolerance, times the largest |output|: an artifact passes when "
            f"max |diff| <= atol + rtol * max |output|. [KIND=]X as for --atol. {default('by policy and kind, see README')}",
        ),
    ]
    options.append(
        click.option(
            "--min-speedup",
            "min_speedup",
            type=click.FloatRange(min=0, min_open=True),
            metavar="X",
            help="Fail unless the converted model is at least X times as fast as float32 on the machine that "
            f"measured it (report.json's speed: the savedmodel path, else keras). {default('off')}",
        )
    )
    if baseline:
        options += [
            click.option(
                "--baseline",
                type=click.Path(path_type=Path),
                help="An earlier run's report.json: fail when the converted metric is worse than its by more than "
                f"--max-regression. {default('none')}",
            ),
            click.option(
                "--max-regression",
                type=click.FloatRange(min=0),
                help=f"Largest allowed worsening against --baseline, in the metric's units. {default(DEFAULT_MAX_REGRESSION)}",
            ),
        ]

    return lambda command: _apply(command, options)


def output_flags(what: str = "report"):
    """--junit, --summary and --json: what to write once a result exists."""
    options = [
        click.option(
            "--junit",
            type=click.Path(path_type=Path, dir_okay=False),
            help="Write a JUnit XML file, one test case per " + ("check." if what == "report" else "model and policy."),
        ),
        click.option("--summary", metavar="FILE|-", help="Write a Markdown summary (for a CI job page); - for stdout."),
        click.option(
            "--json", "as_json", is_flag=True, help=f"Print the {what} as JSON on stdout, and nothing else there."
        ),
    ]
    return lambda command: _apply(command, options)


@dataclass(frozen=True)
class Renderings:
    """How one kind of result is shown: the terminal, Markdown and JUnit."""

    terminal: Callable  # (result, stream, path) -> None
    markdown: Callable  # (result) -> str
    junit: Callable  # (result, path) -> None


def report_renderings() -> Renderings:
    from .render import markdown, render_summary, write_junit

    return Renderings(render_summary, markdown, write_junit)


@dataclass(frozen=True)
class Outputs:
    """What to print and write once a result exists (a conversion's, a re-check's, a batch's)."""

    junit: Path | None
    summary: str | None  # a path, or "-" for stdout
    as_json: bool
    quiet: bool

    def __post_init__(self) -> None:
        if self.as_json and self.summary == "-":
            raise click.UsageError("--json and --summary - both write to stdout; give --summary a FILE")

    @property
    def stdout_taken(self) -> bool:
        """stdout carries only the JSON or the Markdown when one of them asks for it."""
        return self.as_json or self.summary == "-"

    def emit(self, report: dict, report_path: Path | None, renderings: Renderings | None = None) -> None:
        show = renderings or report_renderings()
        if not self.quiet:
            show.terminal(report, sys.stderr if self.stdout_taken else None, report_path)
        try:
            if self.junit:
                show.junit(report, self.junit)
            if self.summary and self.summary != "-":
                path = Path(self.summary)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(show.markdown(report))
        except OSError as exc:
            raise MpconvertError(
                f"cannot write {exc.filename}: {exc.strerror}", hint="choose a writable path for --junit / --summary"
            ) from None
        if self.summary == "-":
            click.echo(show.markdown(report), nl=False)
        if self.as_json:
            click.echo(json.dumps(report, indent=2, allow_nan=False))


def silence_frameworks() -> None:
    """Keep TensorFlow's C++ and Python log noise away from the user.

    TF_CPP_MIN_LOG_LEVEL does not cover messages printed before absl logging
    starts, so the C-level stderr goes to /dev/null for the whole run while
    Python's sys.stderr (our messages) keeps the real terminal.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    real = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    sys.stderr = os.fdopen(real, "w", buffering=1)
    warnings.filterwarnings("ignore")
    # tf2onnx also logs through the root logger ("onnxruntime only support
    # float32 type for Gemm rewriter"), so the root level is raised too.
    for name in ("", "tensorflow", "tf2onnx", "absl", "h5py"):
        logging.getLogger(name).setLevel(logging.ERROR)


def unwind_on_sigterm() -> None:
    """Ctrl-C and SIGTERM (CI timeouts, kill, a stopped batch) unwind like Ctrl-C, so staging folders are removed."""
    interrupts.install()
