"""Command line: parses flags into the API's options, calls it, maps errors to exit codes. No logic.

`mpconvert MODEL --policy mixed_float16` is the main job; other verbs
(`inspect`, `check`, `batch`, `batch-merge`) are sub-commands. A first
argument that is not a known verb is the model, so the bare form works as
written. The flags themselves live in cli_flags.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from .api import conversion_options, gate_options
from .cli_flags import (
    EXIT_CODES_HELP,
    Outputs,
    conversion_flags,
    debug_option,
    gate_flags,
    import_option,
    keep_option,
    max_pad_overhead_option,
    model_argument,
    output_flags,
    pad_multiple_option,
    policy_option,
    quiet_option,
    run_action,
    silence_frameworks,
    unsafe_option,
    unwind_on_sigterm,
)
from .options import ExportOptions, SaveOptions, default_out_dir
from .precision import POLICIES
from .report import REPORT_NAME


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


@click.group(cls=_DefaultToConvert, epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mpconvert")
def cli() -> None:
    """Convert float32 Keras models to mixed precision and export them."""


def split_export(conversion: dict) -> tuple[dict, ExportOptions]:
    """The conversion's keywords, and the export's options given beside them."""
    keywords = dict(conversion)
    fields = (("export", "kinds"), ("opset", "opset"), ("bench_onnx", "bench_onnx"))
    export = {field: keywords.pop(key) for key, field in fields if key in keywords}
    return keywords, ExportOptions(**export)


@cli.command("convert", epilog=EXIT_CODES_HELP, hidden=True)
@model_argument
@policy_option
@click.option("--out", type=click.Path(path_type=Path), help="Output folder [default: MODEL_POLICY beside the model].")
@click.option("--force", is_flag=True, help="Replace a non-empty output folder.")
@conversion_flags()
@gate_flags(stored=False)
@output_flags()
@quiet_option
@debug_option
def convert_command(model, policy, out, force, conversion, junit, summary, as_json, quiet, debug):
    """Convert MODEL (.keras, .h5 or Keras SavedModel folder) to mixed precision."""
    outputs = Outputs(junit, summary, as_json, quiet)
    if policy is None:
        raise click.UsageError("Missing option '--policy'.")

    def action() -> int:
        from .pipeline import convert_and_save
        from .render import LiveDisplay

        keywords, export = split_export(conversion)
        options = conversion_options(model, policy, **keywords)
        save = SaveOptions(out or default_out_dir(model, policy), export, force)
        with LiveDisplay(quiet or outputs.stdout_taken) as display:
            report, written = convert_and_save(options, save, display.hooks())
        outputs.emit(report.as_dict(), written / REPORT_NAME)
        return report.exit_code

    sys.exit(run_action(debug, action))


@cli.command("inspect")
@model_argument
@click.option("--policy", type=click.Choice(POLICIES), default=POLICIES[0], show_default=True)
@keep_option
@click.option(
    "--data", help="Calibration data for the numeric lint (as for the main command) [default: generated inputs]."
)
@click.option(
    "--auto-keep",
    type=click.Choice(("off", "lint", "search")),
    default="search",
    show_default=True,
    help="off: skip the numeric lint.",
)
@pad_multiple_option
@max_pad_overhead_option
@import_option
@unsafe_option
@debug_option
def inspect_command(
    model, policy, keep_float32, data, auto_keep, pad_multiple, max_pad_overhead, imports, unsafe_deserialization, debug
):
    """Print the per-layer plan for MODEL without converting it: policies, numeric lint and padding."""

    def action() -> int:
        from .api import inspect
        from .render import render_inspection

        found = inspect(
            model,
            policy,
            keep_float32=keep_float32,
            pad_multiple=pad_multiple,
            max_pad_overhead=max_pad_overhead,
            unsafe_deserialization=unsafe_deserialization,
            imports=imports,
            data=data,
            auto_keep=auto_keep,
        )
        render_inspection(found)
        return 0

    sys.exit(run_action(debug, action))


@cli.command("check", epilog=EXIT_CODES_HELP)
@click.argument("report_file", metavar="REPORT", type=click.Path(path_type=Path))
@click.option("--max-drop", type=click.FloatRange(min=0), help="Largest allowed metric drop. [default: the report's]")
@gate_flags(stored=True)
@output_flags()
@quiet_option
@debug_option
def check_command(report_file, junit, summary, as_json, quiet, debug, **thresholds):
    """Re-apply the gate to REPORT (an earlier run's report.json) without converting.

    Thresholds not given keep the values stored in the report. REPORT is
    only read; the verdict goes to the exit code and the requested outputs.
    """
    outputs = Outputs(junit, summary, as_json, quiet)

    def action() -> int:
        # No TensorFlow on this path: a re-check takes a fraction of a second.
        from .api import recheck
        from .gate import read_report

        report = recheck(read_report(report_file), gate_options(**thresholds))
        outputs.emit(report.as_dict(), report_file)
        return report.exit_code

    sys.exit(run_action(debug, action))


from .batch.commands import batch_command, batch_merge_command  # noqa: E402  (they use the helpers above)
from .doctor import doctor_command  # noqa: E402

cli.add_command(doctor_command)
cli.add_command(batch_command)
cli.add_command(batch_merge_command)


def main() -> None:
    if "--debug" not in sys.argv[1:]:
        silence_frameworks()
    else:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    unwind_on_sigterm()
    cli(prog_name="mpconvert")


if __name__ == "__main__":
    main()
