"""`mpconvert doctor`: what this machine offers for 16-bit compute."""

from __future__ import annotations

import json
import sys

import click

from .flags import debug_option
from .process import run_action


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON on stdout, and nothing else there.")
@debug_option
def doctor_command(as_json, debug):
    """What this machine offers for 16-bit compute, measured: hardware, runtimes, a micro-benchmark, a policy."""

    def action() -> int:
        from ..doctor import diagnose

        found = diagnose().as_dict()
        if as_json:
            click.echo(json.dumps(found, indent=2, allow_nan=False))
        else:
            from ..render import render_doctor

            render_doctor(found)
        return 0

    sys.exit(run_action(debug, action))
