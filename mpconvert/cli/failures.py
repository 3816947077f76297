"""The command line's error mapping: every failure becomes an exit code and one message with its fix.

The process-level settings a command shares with batch workers (framework
noise, signals, restarting) are in mpconvert/process.py.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

import click

from mpconvert.report.report import EXIT_FAILED, EXIT_INTERRUPTED
from mpconvert.system import interrupts
from mpconvert.system.errors import MpconvertError, failure_of


def run_action(debug: bool, action: Callable[[], int]) -> int:
    """Run `action`, turning every failure into exit 1 (an MpconvertError's own code) with one message and its fix."""
    try:
        return action()
    except KeyboardInterrupt as exc:
        click.echo("interrupted: nothing was written", err=True)
        return getattr(exc, "exit_code", EXIT_INTERRUPTED)
    except Exception as exc:  # MemoryError included; SystemExit and the like pass through
        signum = interrupts.received()
        if signum is not None:  # a KeyboardInterrupt that a library (an import) turned into another error
            click.echo("interrupted: nothing was written", err=True)
            return 128 + signum
        failure = failure_of(exc)
        if debug:
            traceback.print_exc()
        click.echo(f"error: {failure.message}", err=True)
        if failure.hint:
            click.echo(f"  fix: {failure.hint}", err=True)
        return exc.exit_code if isinstance(exc, MpconvertError) else EXIT_FAILED


# Where the command group keeps the arguments it was given (click.Context.meta, shared by every command).
COMMAND_LINE = "mpconvert.command_line"


def command_line() -> tuple[str, ...]:
    """The command as the user typed it, for the report: `mpconvert` however it was started, then the arguments."""
    found = click.get_current_context().meta.get(COMMAND_LINE)
    return tuple(found) if found else ("mpconvert", *sys.argv[1:])
