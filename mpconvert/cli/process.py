"""The command-line process: error mapping to exit codes, framework noise, signals."""

from __future__ import annotations

import logging
import os
import sys
import traceback
import warnings
from collections.abc import Callable

import click

from .. import interrupts
from ..errors import failure_of
from ..report import EXIT_FAILED, EXIT_INTERRUPTED


def run_action(debug: bool, action: Callable[[], int]) -> int:
    """Run `action`, turning every failure into exit 1 with one message and its fix."""
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
        return EXIT_FAILED


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


_restart_allowed = False


def allow_restart() -> None:
    """Called by the real entry point only: a command run in-process (a test's CliRunner) never re-executes."""
    global _restart_allowed
    _restart_allowed = True


def restart_allowed() -> bool:
    return _restart_allowed


def restart(exc, argv: list[str], quiet: bool = False) -> None:
    """Run this command again with oneDNN's rewrites off (speed.slow_kernel.Restart): same pid, new TensorFlow."""
    if not quiet:
        click.echo(f"note: {exc.finding['summary']}; running again with TF_ENABLE_ONEDNN_OPTS=0", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # silence_frameworks pointed fd 2 at /dev/null and kept the terminal on a
    # non-inheritable copy: give fd 2 back, or the new process could not speak.
    if sys.stderr.fileno() != 2:
        os.dup2(sys.stderr.fileno(), 2)
    os.execve(sys.executable, argv, exc.environment())
