"""Command line: builds the options object, maps errors to exit codes. No logic.

`mpconvert MODEL --policy mixed_float16` is the main job; other verbs
(`inspect`, `check`) are sub-commands. A first argument that is not a known
verb is the model, so the bare form works as written.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import click

from .api import conversion_options, gate_options
from .errors import MpconvertError
from .options import (
    ARTIFACT_KINDS,
    DEFAULT_BATCH_SIZE,
    DEFAULT_FINETUNE_STEPS,
    DEFAULT_LEARNING_RATE,
    DEFAULT_MAX_DROP,
    DEFAULT_MAX_PAD_OVERHEAD,
    DEFAULT_OPSET,
    DEFAULT_PAD_MULTIPLE,
    EXPORT_KINDS,
    MAX_OPSET,
    METRICS,
    MIN_OPSET,
    ExportOptions,
    SaveOptions,
    default_out_dir,
)
from .precision import POLICIES
from .report import EXIT_FAILED, EXIT_GATE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, REPORT_NAME

EXIT_CODES_HELP = f"""\b
Exit codes:
  {EXIT_OK}  converted (or re-checked), and every gate check passed
  {EXIT_FAILED}  the input, the conversion or the report failed (message on
     stderr); nothing is written
  {EXIT_USAGE}  usage error (bad option or value)
  {EXIT_GATE}  converted (or re-checked), but a gate check failed: accuracy
     drop, agreement, artifact parity, fine-tune health, padding proof or
     baseline regression (report.json, --junit and --summary are still
     written and name the failing checks)
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C; 143 for SIGTERM); nothing is written
"""


class _DefaultToConvert(click.Group):
    """A group whose first argument may be the model instead of a verb.

    `mpconvert --help` shows the main form's options (the conversion is what
    people come for), then the other commands.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = ["convert", *args]
        return super().parse_args(ctx, args)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        main_form = self.commands["convert"]
        main_form.format_help(click.Context(main_form, info_name=ctx.info_name), formatter)
        others = [(name, cmd.get_short_help_str(120)) for name, cmd in self.commands.items() if not cmd.hidden]
        with formatter.section("Other commands (mpconvert COMMAND --help for their options)"):
            formatter.write_dl(others)


def _parse_exports(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in value.split(",") if k.strip())
    unknown = [k for k in kinds if k not in EXPORT_KINDS]
    if unknown or not kinds:
        raise click.BadParameter(f"{value!r}: choose from {', '.join(EXPORT_KINDS)}, comma-separated")
    return kinds


def _parse_tolerances(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]):
    """`X` (every artifact kind) or `KIND=X`, repeatable -> ((kind or None, X), ...)."""
    parsed = []
    for value in values:
        kind, sep, number = value.rpartition("=")
        if sep and kind not in ARTIFACT_KINDS:
            raise click.BadParameter(f"{value!r}: unknown artifact kind {kind!r}; choose from {', '.join(ARTIFACT_KINDS)}")
        try:
            x = float(number)
        except ValueError:
            x = math.nan
        if not (math.isfinite(x) and x >= 0):
            raise click.BadParameter(f"{value!r}: expected X or KIND=X with X a number >= 0, e.g. 1e-3 or onnx=0.05")
        parsed.append((kind or None, x))
    return tuple(parsed)


def _run(debug: bool, action) -> int:
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


def gate_flags(stored: bool):
    """Thresholds and outputs shared by `convert` and `check`.

    For `check` (stored=True) an absent threshold keeps the report's value.
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
            callback=_parse_tolerances,
            metavar="[KIND=]X",
            help="Absolute artifact parity tolerance: X sets every artifact kind, KIND=X one of "
            f"{kinds} (repeatable). {default(DEFAULT_ATOL)}",
        ),
        click.option(
            "--rtol",
            multiple=True,
            callback=_parse_tolerances,
            metavar="[KIND=]X",
            help="Relative parity tolerance, times the largest |output|: an artifact passes when "
            f"max |diff| <= atol + rtol * max |output|. [KIND=]X as for --atol. {default('by policy and kind, see README')}",
        ),
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
        click.option(
            "--junit",
            type=click.Path(path_type=Path, dir_okay=False),
            help="Write a JUnit XML file, one test case per check.",
        ),
        click.option("--summary", metavar="FILE|-", help="Write a Markdown summary (for a CI job page); - for stdout."),
        click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout, and nothing else there."),
    ]

    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


@dataclass(frozen=True)
class _Outputs:
    """What to print and write once a report exists (a conversion's or a re-check's)."""

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

    def emit(self, report: dict, report_path: Path | None) -> None:
        from .render import markdown, render_summary, write_junit

        if not self.quiet:
            render_summary(report, stream=sys.stderr if self.stdout_taken else None, report_path=report_path)
        try:
            if self.junit:
                write_junit(report, self.junit)
            if self.summary and self.summary != "-":
                path = Path(self.summary)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(markdown(report))
        except OSError as exc:
            raise MpconvertError(
                f"cannot write {exc.filename}: {exc.strerror}", hint="choose a writable path for --junit / --summary"
            ) from None
        if self.summary == "-":
            click.echo(markdown(report), nl=False)
        if self.as_json:
            click.echo(json.dumps(report, indent=2, allow_nan=False))


@click.group(cls=_DefaultToConvert, epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mpconvert")
def cli() -> None:
    """Convert float32 Keras models to mixed precision and export them."""


@cli.command("convert", epilog=EXIT_CODES_HELP, hidden=True)
@model_argument
@click.option(
    "--policy", type=click.Choice(POLICIES), required=True, help="mixed_float16 (NVIDIA Tensor Cores) or mixed_bfloat16 (TPU, bf16 CPUs)."
)
@click.option(
    "--data",
    help="Labelled data: an .npz with x, y (and x_train, y_train), or module:function returning "
    "(train, validation) -- that form imports and runs your code.",
)
@click.option("--out", type=click.Path(path_type=Path), help="Output folder [default: MODEL_POLICY beside the model].")
@click.option("--force", is_flag=True, help="Replace a non-empty output folder.")
@click.option(
    "--max-drop",
    type=click.FloatRange(min=0),
    help=f"Largest allowed metric drop, in the metric's units (0.01 = 1 point of accuracy). [default: {DEFAULT_MAX_DROP}]",
)
@click.option("--metric", type=click.Choice(METRICS), help="[default: accuracy for softmax/sigmoid outputs, else mse]")
@keep_option
@click.option(
    "--export",
    "exports",
    default=",".join(EXPORT_KINDS),
    show_default=True,
    callback=_parse_exports,
    help="Artifacts to write, comma-separated.",
)
@click.option(
    "--opset",
    type=click.IntRange(MIN_OPSET, MAX_OPSET),
    default=DEFAULT_OPSET,
    show_default=True,
    help="ONNX opset of the .onnx file (tf2onnx 1.17 writes 13 to 18).",
)
@click.option(
    "--finetune-steps",
    type=click.IntRange(min=0),
    help=f"Fine-tuning steps, 0 to skip [default: {DEFAULT_FINETUNE_STEPS} when the data has a training split].",
)
@click.option("--learning-rate", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_LEARNING_RATE, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=DEFAULT_BATCH_SIZE, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for fine-tuning and generated inputs.")
@click.option("--loss", help="Fine-tuning loss [default: the model's saved loss, else one for its output].")
@pad_multiple_option
@max_pad_overhead_option
@gate_flags(stored=False)
@import_option
@unsafe_option
@quiet_option
@debug_option
def convert_command(
    model, policy, data, out, force, max_drop, metric, keep_float32, exports, opset,
    finetune_steps, learning_rate, batch_size, seed, loss, pad_multiple, max_pad_overhead,
    min_agreement, atol, rtol, baseline, max_regression, junit, summary, as_json,
    imports, unsafe_deserialization, quiet, debug,
):  # fmt: skip
    """Convert MODEL (.keras, .h5 or Keras SavedModel folder) to mixed precision."""
    outputs = _Outputs(junit, summary, as_json, quiet)

    def action() -> int:
        from .pipeline import convert_and_save
        from .render import LiveDisplay

        options = conversion_options(
            model, policy, data=data, keep_float32=keep_float32, metric=metric, max_drop=max_drop,
            min_agreement=min_agreement, atol=atol, rtol=rtol, baseline=baseline, max_regression=max_regression,
            finetune_steps=finetune_steps, learning_rate=learning_rate, batch_size=batch_size, loss=loss, seed=seed,
            pad_multiple=pad_multiple, max_pad_overhead=max_pad_overhead,
            unsafe_deserialization=unsafe_deserialization, imports=imports,
        )  # fmt: skip
        save = SaveOptions(out or default_out_dir(model, policy), ExportOptions(exports, opset), force)
        with LiveDisplay(quiet or outputs.stdout_taken) as display:
            report, written = convert_and_save(options, save, display.hooks())
        outputs.emit(report.as_dict(), written / REPORT_NAME)
        return report.exit_code

    sys.exit(_run(debug, action))


@cli.command("inspect")
@model_argument
@click.option("--policy", type=click.Choice(POLICIES), default=POLICIES[0], show_default=True)
@keep_option
@pad_multiple_option
@max_pad_overhead_option
@import_option
@unsafe_option
@debug_option
def inspect_command(model, policy, keep_float32, pad_multiple, max_pad_overhead, imports, unsafe_deserialization, debug):
    """Print the per-layer plan for MODEL without converting it: policies and padding."""

    def action() -> int:
        from .api import inspect
        from .render import render_inspection

        found = inspect(
            model, policy, keep_float32=keep_float32, pad_multiple=pad_multiple,
            max_pad_overhead=max_pad_overhead, unsafe_deserialization=unsafe_deserialization, imports=imports,
        )  # fmt: skip
        render_inspection(found)
        return EXIT_OK

    sys.exit(_run(debug, action))


@cli.command("check", epilog=EXIT_CODES_HELP)
@click.argument("report_file", metavar="REPORT", type=click.Path(path_type=Path))
@click.option("--max-drop", type=click.FloatRange(min=0), help="Largest allowed metric drop. [default: the report's]")
@gate_flags(stored=True)
@quiet_option
@debug_option
def check_command(
    report_file, max_drop, min_agreement, atol, rtol, baseline, max_regression, junit, summary, as_json, quiet, debug
):  # fmt: skip
    """Re-apply the gate to REPORT (an earlier run's report.json) without converting.

    Thresholds not given keep the values stored in the report. REPORT is
    only read; the verdict goes to the exit code and the requested outputs.
    """
    outputs = _Outputs(junit, summary, as_json, quiet)

    def action() -> int:
        # No TensorFlow on this path: a re-check takes a fraction of a second.
        from .api import recheck
        from .gate import read_report

        options = gate_options(
            max_drop=max_drop, min_agreement=min_agreement, atol=atol, rtol=rtol,
            baseline=baseline, max_regression=max_regression,
        )  # fmt: skip
        report = recheck(read_report(report_file), options)
        outputs.emit(report.as_dict(), report_file)
        return report.exit_code

    sys.exit(_run(debug, action))


def _silence_frameworks() -> None:
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


class _Terminated(KeyboardInterrupt):
    """SIGTERM, unwinding like Ctrl-C; the shell convention is 128 + 15."""

    exit_code = 128 + signal.SIGTERM


def _interrupt(signum, frame):
    raise _Terminated


def main() -> None:
    if "--debug" not in sys.argv[1:]:
        _silence_frameworks()
    else:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    # SIGTERM (CI timeouts, kill) must unwind like Ctrl-C so that the
    # staging folder is removed.
    signal.signal(signal.SIGTERM, _interrupt)
    cli(prog_name="mpconvert")


if __name__ == "__main__":
    main()
