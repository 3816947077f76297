"""The running process: framework log noise, signals, and re-running it with other settings.

Shared by the command line and batch workers, which are processes of their
own; nothing here knows about flags or commands, so a worker never imports
the command line.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

from mpconvert.system import interrupts


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
        print(f"note: {exc.finding['summary']}; running again with TF_ENABLE_ONEDNN_OPTS=0", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # silence_frameworks pointed fd 2 at /dev/null and kept the terminal on a
    # non-inheritable copy: give fd 2 back, or the new process could not speak.
    if sys.stderr.fileno() != 2:
        os.dup2(sys.stderr.fileno(), 2)
    os.execve(sys.executable, argv, exc.environment())
