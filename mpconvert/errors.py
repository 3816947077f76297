"""The one user-facing error type.

Anything a user can cause (bad model file, bad data, a layer that cannot be
converted, an occupied output folder) is raised as MpconvertError with a
message that names the problem and the fix. The CLI turns it into exit code 1
without a traceback; any other exception is a bug in mpconvert.
"""


class MpconvertError(Exception):
    """A failure caused by the user's input, reported without a traceback."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  fix: {hint}")


class WriteError(MpconvertError):
    """Writing the output failed for a reason of the machine's (a full disk, a read-only file system).

    The whole run fails with it (exit 1, nothing left behind), where other
    errors while exporting one artifact only fail that artifact.
    """
