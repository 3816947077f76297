"""A signed output folder's typed values: the record of who signed it and when, and a check of its signature.

The signature itself (model.sig, a Sigstore bundle over a manifest of every
file's sha256, the OpenSSF model-signing format) holds no time and names its
key only by the sha256 of the public key. `signing.json`, written into the
folder just before it is signed and so covered by the signature, says when
and with which private key (its path, never its content); `verify` reads it
only once the signature holds. commands/signature.py makes and checks both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mpconvert.report.checks import Check
from mpconvert.report.schema import SCHEMA_VERSION

SIGNATURE_NAME = "model.sig"  # a conversion's folder
BATCH_SIGNATURE_NAME = "batch.sig"  # a batch root's own files (batch.json, index.html)
SIGNING_NAME = "signing.json"


@dataclass(frozen=True)
class SigningRecord:
    """signing.json: when a folder was signed, with which key, by which mpconvert."""

    signed_at: str  # ISO 8601, UTC
    key: str  # the private key's path where it was signed
    public_key_sha256: str  # sha256 of the public key's PEM (SubjectPublicKeyInfo): the signature's own key hint
    signature: str  # the signature file's name in the folder
    signer: str  # "mpconvert VERSION"

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **self.__dict__}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> SigningRecord:
        return cls(
            str(stored["signed_at"]),
            str(stored["key"]),
            str(stored["public_key_sha256"]),
            str(stored.get("signature", SIGNATURE_NAME)),
            str(stored.get("signer", "")),
        )


@dataclass(frozen=True)
class SignatureCheck:
    """A folder's signature checked here (verify.json's `signature`): first of every check."""

    file: str  # the signature file's name in the folder
    public_key: str | None  # --public-key, as given
    passed: bool
    message: str  # what is wrong, or who signed and when
    signer: str | None = None  # sha256 of the public key the signature names (None: unsigned, unreadable)
    record: SigningRecord | None = None  # signing.json, read once the signature held
    changed: tuple[str, ...] = ()  # the files that differ from what was signed: "model.onnx changed", ...

    @property
    def check(self) -> Check:
        return Check("signature", self.passed, self.message)

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "public_key": self.public_key,
            "passed": self.passed,
            "message": self.message,
            "signer": self.signer,
            "signed_at": None if self.record is None else self.record.signed_at,
            "key": None if self.record is None else self.record.key,
            "changed": list(self.changed),
        }
