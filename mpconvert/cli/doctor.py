"""`mpconvert doctor [MODEL]`: what this machine offers for 16-bit compute, or for one model."""

from __future__ import annotations

import json
import sys

import click

from mpconvert.cli.failures import run_action
from mpconvert.cli.flags import LocalPath, debug_option, flags_for
from mpconvert.options.convert import DEFAULT_DOCTOR_BUDGET_S, DEFAULT_SPEED_BATCH


@click.command("doctor")
@click.argument("model", required=False, type=LocalPath())
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON on stdout, and nothing else there.")
@click.option(
    "--speed-batch",
    type=click.IntRange(min=1),
    default=DEFAULT_SPEED_BATCH,
    show_default=True,
    metavar="N",
    help="With MODEL: rows per timed call (generated from the model's input shapes).",
)
@click.option(
    "--budget",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_DOCTOR_BUDGET_S,
    show_default=True,
    metavar="SECONDS",
    help="With MODEL: the longest the timing may take; past it the figures are single calls, and it says so.",
)
@flags_for("imports", "unsafe_deserialization")
@debug_option
def doctor_command(model, as_json, speed_batch, budget, imports, unsafe_deserialization, debug):
    """What this machine offers for 16-bit compute, measured: hardware, runtimes, Keras layers, a policy.

    With MODEL, that model itself is timed through its SavedModel serving
    path under float32 and both policies, and the OpenVINO IR each policy's
    conversion writes (with the openvino extra), and the fastest policy and
    runtime are recommended for it.
    MODEL is any model the main command converts: a .keras or .h5 (.hdf5)
    file, or a SavedModel folder with or without keras_metadata.pb (without
    it, rewritten at graph level as the main command does).
    """

    def action() -> int:
        from mpconvert.render import render_doctor, render_model_timing

        if model is not None:
            from mpconvert.commands.doctor_model import time_model
            from mpconvert.options.load import LoadOptions

            load = LoadOptions(model, unsafe_deserialization, tuple(imports))
            timing = time_model(load, speed_batch, budget)
            if as_json:
                click.echo(json.dumps(timing.to_json(), indent=2, allow_nan=False))
            else:
                render_model_timing(timing)
            return 0
        from mpconvert.commands.doctor import diagnose

        found = diagnose()
        if as_json:
            click.echo(json.dumps(found.to_json(), indent=2, allow_nan=False))
        else:
            render_doctor(found)
        return 0

    sys.exit(run_action(debug, action))
