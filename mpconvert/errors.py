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
