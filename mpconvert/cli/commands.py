"""Command line: parses flags into the API's options, calls it, maps errors to exit codes. No logic.

`mpconvert MODEL --policy mixed_float16` is the main job; other verbs
(`inspect`, `check`, `batch`, `batch-merge`) are sub-commands. A first
argument that is not a known verb is the model, so the bare form works as
written. The flags themselves are derived in flags.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import click

from mpconvert.api import conversion_options, export_options, gate_options, signing_options, tracking_options
from mpconvert.cli.batch import batch_command, batch_merge_command
from mpconvert.cli.doctor import doctor_command
from mpconvert.cli.failures import COMMAND_LINE, command_line, run_action
from mpconvert.cli.flags import (
    LocalPath,
    conversion_flags,
    debug_option,
    flags_for,
    gate_flags,
    keyword_flags,
    model_argument,
    output_flags,
    policy_option,
    quiet_option,
    signing_flags,
    tracking_flags,
)
from mpconvert.cli.outputs import Outputs, Renderings
from mpconvert.options.export import EXPORT_KEYWORDS, SaveOptions, default_out_dir
from mpconvert.options.precision import POLICIES
from mpconvert.options.signing import PASSWORD_ENV
from mpconvert.options.verify import VERIFY_KEYWORDS
from mpconvert.report.report import EXIT_FAILED, EXIT_GATE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, REPORT_NAME
from mpconvert.system.process import allow_restart, restart, restart_allowed, silence_frameworks, unwind_on_sigterm

EXIT_CODES_HELP = f"""\b
Exit codes:
  {EXIT_OK}  converted (or re-checked), and every gate check passed
  {EXIT_FAILED}  the input, the conversion or the report failed (message on
     stderr); nothing is written
  {EXIT_USAGE}  usage error (bad option or value)
  {EXIT_GATE}  converted (or re-checked), but a gate check failed: accuracy
     drop or NaN/inf outputs, agreement, validation rows that fine-tuning
     trained on (--max-overlap), artifact parity (or an artifact that failed
     to export), fine-tune health, baseline regression or speed (report.json,
     --junit and --summary are still written and name the failing checks)
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C; 143 for SIGTERM); nothing is written
"""


VERIFY_EXIT_CODES_HELP = f"""\b
Exit codes:
  {EXIT_OK}  every file is as written, every artifact ran here within its
     parity tolerance, and the conversion had passed its gate
  {EXIT_FAILED}  OUT or its report cannot be read, or the --provider asked for
     does not load here (without --fallback)
  {EXIT_GATE}  a check failed: a missing, broken or other key's signature
     (--public-key), a changed or missing file, an artifact that cannot
     run here or is outside parity, a failed conversion
"""

SIGN_EXIT_CODES_HELP = f"""\b
Exit codes:
  {EXIT_OK}  signed: model.sig (batch.sig for a batch root) and signing.json written
  {EXIT_FAILED}  nothing signed: a file differs from report.json's sha256, the
     folder is signed already (without --force), or the key cannot sign
"""


class _DefaultToConvert(click.Group):
    """A group whose first argument may be the model instead of a verb.

    `mpconvert --help` shows the main form's options (the conversion is what
    people come for), then the other commands.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[COMMAND_LINE] = ("mpconvert", *args)  # as typed, for the report's provenance
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
    """Convert float32 Keras models and SavedModels to mixed precision and export them."""


def split_export(conversion: dict) -> tuple[dict, dict]:
    """The conversion's keywords, and the export's keywords given beside them."""
    keywords = {k: v for k, v in conversion.items() if k not in EXPORT_KEYWORDS}
    return keywords, {k: v for k, v in conversion.items() if k in EXPORT_KEYWORDS}


@cli.command("convert", epilog=EXIT_CODES_HELP, hidden=True)
@model_argument
@policy_option
@click.option(
    "--out",
    help="Output folder, or object storage (s3://bucket/prefix; gs://, az:// with their fsspec package) "
    "[default: MODEL_POLICY beside the model].",
)
@click.option("--force", is_flag=True, help="Replace a non-empty output folder.")
@conversion_flags()
@gate_flags(stored=False)
@tracking_flags
@signing_flags
@output_flags()
@quiet_option
@debug_option
def convert_command(model, policy, out, force, conversion, tracking, signing, junit, summary, as_json, quiet, debug):
    """Convert MODEL to mixed precision: a .keras or .h5 (.hdf5) file, or a SavedModel folder.

    A SavedModel with keras_metadata.pb (tf.keras 2.x) is converted layer by
    layer, as the files are. One without it (Keras 3 model.export(),
    tf.saved_model.save of a tf.Module, TF Hub and TF Serving models) has no
    Keras layers and is converted at graph level: its serving signature
    (--signature) is frozen and its nodes rewritten, without fine-tuning or
    padding.
    """
    outputs = Outputs(junit, summary, as_json, quiet)
    if policy is None:
        raise click.UsageError("Missing option '--policy'.")

    def action() -> int:
        from mpconvert.pipeline import convert_and_save
        from mpconvert.render import LiveDisplay

        keywords, export = split_export(conversion)
        options = conversion_options(model, policy, **keywords)
        save = SaveOptions(
            out or default_out_dir(model, policy),
            export_options(**export),
            force,
            command=command_line(),
            tracking=tracking_options(**tracking),
            signing=signing_options(**signing),
        )
        with LiveDisplay(quiet or outputs.stdout_taken) as display:
            hooks = dataclasses.replace(display.hooks(), may_restart=restart_allowed())
            report, written = convert_and_save(options, save, hooks)
        outputs.emit(report, f"{written}/{REPORT_NAME}" if isinstance(written, str) else written / REPORT_NAME)
        return report.exit_code

    sys.exit(run_action(debug, action))


@cli.command("inspect")
@model_argument
@click.option("--policy", type=click.Choice(POLICIES), default=POLICIES[0], show_default=True)
@flags_for(
    "keep_float32",
    "data",
    "auto_keep",
    "pad_multiple",
    "max_pad_overhead",
    "imports",
    "unsafe_deserialization",
    help_text={
        "keep_float32": "Keep layers whose whole name or class name matches REGEX in float32 (repeatable).",
        "data": "Calibration data for the numeric lint (as for the main command).",
        "auto_keep": "off skips the numeric lint; lint and search run it.",
    },
)
@debug_option
def inspect_command(model, policy, debug, **keywords):
    """Print the per-layer plan for MODEL without converting it: policies, numeric lint and padding.

    MODEL needs Keras layers: a .keras or .h5 (.hdf5) file, or a SavedModel
    folder with keras_metadata.pb. A SavedModel without it (Keras 3
    model.export(), tf.saved_model.save) is refused; the main command
    converts it at graph level.
    """

    def action() -> int:
        from mpconvert.api import inspect
        from mpconvert.render import render_inspection

        render_inspection(inspect(model, policy, **keywords))
        return 0

    sys.exit(run_action(debug, action))


@cli.command("check", epilog=EXIT_CODES_HELP)
@click.argument("report_file", metavar="REPORT", type=LocalPath())
@gate_flags(stored=True)
@output_flags()
@click.option(
    "--html",
    "html",
    type=LocalPath(dir_okay=False),
    help="Also write the re-checked report as one self-contained HTML page (what report.html shows).",
)
@quiet_option
@debug_option
def check_command(report_file, junit, summary, as_json, html, quiet, debug, **thresholds):
    """Re-apply the gate to REPORT (an earlier run's report.json) without converting.

    Thresholds not given keep the values stored in the report. REPORT is
    only read; the verdict goes to the exit code and the requested outputs.
    """
    outputs = Outputs(junit, summary, as_json, quiet)

    def action() -> int:
        # No TensorFlow on this path: a re-check takes a fraction of a second.
        from mpconvert.api import recheck
        from mpconvert.report.read import read_report

        report = recheck(read_report(report_file), gate_options(**thresholds))
        if html:
            from mpconvert.render.html import write_report_page

            write_report_page(report, html)
        outputs.emit(report, report_file)
        return report.exit_code

    sys.exit(run_action(debug, action))


@cli.command("replay")
@click.argument("report_file", metavar="REPORT", type=LocalPath())
@click.option(
    "--out",
    default=None,
    help="Folder (or s3:// URL) for the replayed conversion [default: REPORT's folder name + _replay, beside it].",
)
@click.option("--force", is_flag=True, help="Replace an existing non-empty --out folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON on stdout.")
@quiet_option
@debug_option
def replay_command(report_file, out, force, as_json, quiet, debug):
    """Convert again from what REPORT (a report.json or its folder) recorded, and print what differs.

    The model and the data file must be the ones REPORT names (the same
    sha256); the options, the seed and the export are REPORT's. Figures,
    artifact hashes, versions and the machine are compared; the exit code
    is the replayed conversion's.
    """

    def action() -> int:
        from mpconvert.api import replay
        from mpconvert.render import LiveDisplay
        from mpconvert.render.replay import render_replay

        with LiveDisplay(quiet or as_json) as display:
            result = replay(
                report_file,
                out,
                force=force,
                on_stage=display.hooks().stage,
                command=command_line(),
                may_restart=restart_allowed(),
            )
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "replayed": str(result.replayed),
                        "out": str(result.out),
                        "passed": result.exit_code == EXIT_OK,
                        "differences": [d.to_json() for d in result.differences],
                        "compared": len(result.compared),
                    },
                    indent=2,
                )
            )
        elif not quiet:
            render_replay(result.replayed, result.out, result.compared)
        return result.exit_code

    sys.exit(run_action(debug, action))


@cli.command("verify", epilog=VERIFY_EXIT_CODES_HELP)
@click.argument("folder", metavar="OUT", type=LocalPath())
@keyword_flags(VERIFY_KEYWORDS.values())
@output_flags("verification")
@quiet_option
@debug_option
def verify_command(folder, junit, summary, as_json, quiet, debug, **keywords):
    """Check OUT (a conversion's output folder, or a batch root) on the machine where it will serve.

    With --public-key, the folder's signature (model.sig) first, which
    proves who made every file, report.json included; then every
    artifact's sha256 against report.json; each SavedModel and ONNX file
    loaded with the runtimes installed here and run on golden.npz (parity
    with the converted model's recorded outputs, drift from float32's);
    each timed at a serving batch (p50/p90/p99, rows/s) with its peak
    memory; the library versions that differ from the conversion's.
    Writes verify.json beside report.json.
    """

    def action() -> int:
        from mpconvert.api import verified
        from mpconvert.render.verify import render_verify, verify_markdown, write_verify_junit

        found = verified(folder, **keywords)
        Outputs(junit, summary, as_json, quiet).emit(
            found, found.where, Renderings(render_verify, verify_markdown, write_verify_junit)
        )
        return found.exit_code

    sys.exit(run_action(debug, action))


@cli.command("sign", epilog=SIGN_EXIT_CODES_HELP)
@click.argument("folder", metavar="OUT", type=LocalPath(file_okay=False))
@click.option(
    "--key",
    "sign_key",
    required=True,
    type=LocalPath(dir_okay=False),
    metavar="KEY.pem",
    help=f"The elliptic-curve private key (PEM) to sign with; an encrypted key's password is read from "
    f"{PASSWORD_ENV}, never from the command line.",
)
@click.option("--force", is_flag=True, help="Replace the signature of a folder that is signed already.")
@quiet_option
@debug_option
def sign_command(folder, sign_key, force, quiet, debug):
    """Sign OUT (a folder converted before, or a batch root) in the OpenSSF model-signing format.

    Every file report.json recorded a sha256 for is checked first: one that
    differs refuses the folder, and nothing is signed. Then model.sig and
    signing.json (when, with which key: its path, never its content) are
    written beside report.json, covering every file of the folder but
    verify.json. A batch root gets each converted model's folder signed,
    and batch.sig over its batch.json and index.html.
    """

    def action() -> int:
        from mpconvert.commands.sign import sign_output
        from mpconvert.commands.signature import load_signer

        signer = load_signer(signing_options(sign_key=sign_key))
        assert signer is not None
        for warning in signer.warnings:
            click.echo(f"warning: {warning}", err=True)
        signed = sign_output(folder, signer, force=force)
        if not quiet:
            for one in signed:
                click.echo(
                    f"signed {one.folder} ({one.record.signature}, public key sha256 "
                    f"{one.record.public_key_sha256[:16]}..., {one.record.signed_at})"
                )
        return EXIT_OK

    sys.exit(run_action(debug, action))


cli.add_command(doctor_command)
cli.add_command(batch_command)
cli.add_command(batch_merge_command)


def main() -> None:
    if "--debug" not in sys.argv[1:]:
        silence_frameworks()
    else:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    unwind_on_sigterm()
    allow_restart()
    from mpconvert.speed.slow_kernel import Restart

    try:
        cli(prog_name="mpconvert")
    except Restart as exc:  # everything unwound: no staging folder, no lock left
        restart(
            exc, [sys.executable, "-m", "mpconvert", *sys.argv[1:]], quiet="-q" in sys.argv or "--quiet" in sys.argv
        )


if __name__ == "__main__":
    main()
