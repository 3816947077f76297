"""Signing an output folder: which private key (`SigningOptions`), and where its password comes from.

Its own module, as tracking's: a signature says who vouches for a result,
not how it was computed, so it is no part of a batch result's key
(ConvertOptions.cache_key walks only the conversion's and the export's
options). Only the key's path is an option; its password is read from the
environment where the key is loaded (commands/signature.py), so that it is
never on a command line, in a batch worker's spec or in a report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mpconvert.options.keywords import Keyword, check_ranges, keyword, table
from mpconvert.system.errors import MpconvertError

# The environment variable an encrypted private key's password is read from.
PASSWORD_ENV = "MPCONVERT_SIGN_KEY_PASSWORD"
SIGN_EXTRA_HINT = "pip install 'mpconvert[sign]' (the model-signing package)"


@dataclass(frozen=True)
class SigningOptions:
    """The private key an output folder is signed with; `key` None: not signed."""

    key: Path | None = keyword(
        None,
        name="sign_key",
        kind="path",
        metavar="KEY.pem",
        default_text="unsigned",
        help="Sign the finished output folder with this elliptic-curve private key (PEM; P-256, P-384 or P-521): "
        "model.sig beside report.json, in the OpenSSF model-signing format, covering every file. An encrypted "
        f"key's password is read from {PASSWORD_ENV}. pip install 'mpconvert[sign]'.",
    )

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.key is None:
            return
        key = Path(self.key)
        object.__setattr__(self, "key", key)
        if not key.is_file():  # before any work: a conversion of minutes must not end in "no such key"
            raise MpconvertError(
                f"--sign-key {key}: no such file",
                hint="give the PEM file of the elliptic-curve private key to sign with",
            )

    @property
    def enabled(self) -> bool:
        return self.key is not None


SIGNING_KEYWORDS: dict[str, Keyword] = table(SigningOptions)
