"""The one user-facing error type.

Anything a user can cause (bad model file, bad data, a layer that cannot be
converted, an occupied output folder) is raised as MpconvertError with a
message that names the problem and the fix. The CLI turns it into exit code 1
without a traceback; any other exception is a bug in mpconvert.
"""

from dataclasses import dataclass


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's first line, for a one-line message (its type's name when it says nothing)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:limit]


class MpconvertError(Exception):
    """A failure caused by the user's input, reported without a traceback."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  fix: {hint}")


class UntrustedFolder(MpconvertError):
    """A folder whose signature failed, and whose report cannot even be read: a failed check (exit 3), as a
    failed signature is where the report can be read."""

    exit_code = 3


class NotExportable(MpconvertError):
    """The model computes something an artifact's format cannot express: that artifact is refused, not failed.

    The gate passes its check while another serving file was written, and fails it (exit 3) when that format
    was the only one asked for.
    """


class WriteError(MpconvertError):
    """Writing the output failed for a reason of the machine's (a full disk, a read-only file system).

    The whole run fails with it (exit 1, nothing left behind), where other
    errors while exporting one artifact only fail that artifact.
    """


@dataclass(frozen=True)
class Failure:
    """What a failed run tells the user, the same from the CLI and from a batch worker."""

    message: str
    hint: str | None
    bug: bool  # not the input's fault: worth a traceback (--debug) and a report

    def one_line(self) -> str:
        return self.message + (f" (fix: {self.hint})" if self.hint else "")


def failure_of(exc: BaseException) -> Failure:
    """The user-facing account of any exception a conversion raised (KeyboardInterrupt aside)."""
    if isinstance(exc, MpconvertError):
        return Failure(exc.message, exc.hint, bug=False)
    if isinstance(exc, MemoryError):
        return Failure(
            "ran out of memory",
            "free memory, or convert with less --data (fewer validation and training rows)",
            bug=False,
        )
    return Failure(
        f"conversion failed unexpectedly: {type(exc).__name__}: {first_line(exc)}",
        "rerun with --debug for the full traceback and report it",
        bug=True,
    )
