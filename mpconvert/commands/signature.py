"""Signing an output folder, and checking its signature, in the OpenSSF model-signing format.

The `model-signing` package (mpconvert[sign]) does both: a manifest of
every file's sha256, signed with an elliptic-curve private key as a
Sigstore bundle (DSSE envelope), so that its own CLI (`model_signing verify
key OUT --signature OUT/model.sig --public_key KEY.pub`) verifies what
mpconvert signed, with no mpconvert installed. The signature file itself
and verify.json (what `verify` writes on the serving machine) are the only
files left out; both names are recorded in the signed manifest, which is
where its verifier reads them from too.

No secret leaves the key file: the key is named by its path; an encrypted
key's password comes from PASSWORD_ENV, is held by the `Signer` in memory
and handed to the library, and nothing writes it anywhere. A key that its
group or others may read is signed with, with a warning.

When a check fails, the one line names the cause: no signature, one this
library cannot read, another key's (by the sha256 of its public key), an
altered signature, or the files that differ from the signed manifest. The
library's own message for the last is a list of repr'd digests, so the
files are found again here: once the library has verified the signature,
the manifest in the bundle is trusted, and the folder is hashed against it.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import json
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpconvert.options.signing import PASSWORD_ENV, SIGN_EXTRA_HINT, SigningOptions
from mpconvert.report.report import mpconvert_version
from mpconvert.report.signing import SIGNATURE_NAME, SIGNING_NAME, SignatureCheck, SigningRecord
from mpconvert.report.verification import VERIFY_NAME
from mpconvert.system.digests import file_sha256
from mpconvert.system.errors import MpconvertError, first_line
from mpconvert.system.writing import write_text, writing

# The curves model-signing accepts (those of Sigstore's specs).
_CURVES = ("secp256r1", "secp384r1", "secp521r1")


def _library() -> Any:
    try:
        import model_signing.hashing
        import model_signing.signing
        import model_signing.verifying
    except ImportError as exc:
        raise MpconvertError(
            f"signing needs the model-signing package: {first_line(exc)}", hint=SIGN_EXTRA_HINT
        ) from None
    return model_signing


def public_key_sha256(public_key: Any) -> str:
    """The sha256 of a public key's PEM (SubjectPublicKeyInfo): how a model-signing bundle names its key."""
    from cryptography.hazmat.primitives import serialization

    pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


@dataclass(frozen=True)
class Signer:
    """A private key, loaded and checked once: its path, its public key's sha256, and what to warn about."""

    path: Path
    fingerprint: str  # public_key_sha256 of its public half
    warnings: tuple[str, ...] = ()
    password: bytes | None = field(default=None, repr=False)  # from PASSWORD_ENV, never written anywhere


def load_signer(options: SigningOptions) -> Signer | None:
    """The key --sign-key names, loaded to check it before any work; None when nothing is to be signed."""
    if options.key is None:
        return None
    return load_key(Path(options.key))


def load_key(path: Path) -> Signer:
    """An elliptic-curve private key (PEM), decrypted with PASSWORD_ENV's password where it is encrypted."""
    _library()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = Path(path).absolute()
    try:
        data, mode = path.read_bytes(), path.stat().st_mode
    except OSError as exc:
        raise MpconvertError(
            f"cannot read the signing key {path}: {exc.strerror or exc}",
            hint="give a private key file this user may read",
        ) from None
    given = os.environ.get(PASSWORD_ENV)
    password = given.encode() if given else None
    try:
        try:
            key = serialization.load_pem_private_key(data, password)
        except TypeError:  # a password for a key that has none: the key is what counts
            if password is None:
                raise MpconvertError(
                    f"the signing key {path} is encrypted and {PASSWORD_ENV} is not set",
                    hint=f"export {PASSWORD_ENV} with its password (never put a password on the command line)",
                ) from None
            password = None
            key = serialization.load_pem_private_key(data, None)
    except ValueError as exc:
        wrong = f" (with the password in {PASSWORD_ENV})" if password else ""
        raise MpconvertError(
            f"cannot read {path} as a PEM private key{wrong}: {first_line(exc)}",
            hint=f"give an elliptic-curve private key in PEM, and its password in {PASSWORD_ENV} if it is encrypted",
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name not in _CURVES:
        kind = key.curve.name if isinstance(key, ec.EllipticCurvePrivateKey) else type(key).__name__
        raise MpconvertError(
            f"the signing key {path} is a {kind} key; model signing takes elliptic-curve keys on {', '.join(_CURVES)}",
            hint="make one with: openssl ecparam -name prime256v1 -genkey -noout -out key.pem",
        )
    warnings: tuple[str, ...] = ()
    if mode & 0o077:
        warnings = (
            f"the signing key {path} may be read by its group or others (mode {stat.S_IMODE(mode):04o}): "
            f"chmod 600 {path}",
        )
    return Signer(path, public_key_sha256(key.public_key()), warnings, password)


def _utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@contextlib.contextmanager
def _signature_written(target: Path) -> Iterator[Path]:
    """A hidden path beside the folder to sign into, renamed to `target` on success, gone on failure.

    Beside, not inside: the folder is hashed before the signature exists, and a
    leftover in it would be hashed too.
    """
    partial = target.parent.parent / f".{target.parent.name}.{target.name}.{os.getpid()}.partial"
    try:
        with writing(target, "the signature"):
            yield partial
            os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def sign_folder(
    folder: Path, signer: Signer, signature: str = SIGNATURE_NAME, leave_out: Sequence[str] = ()
) -> SigningRecord:
    """Sign every file of `folder` but the signature, verify.json and `leave_out`; returns signing.json's record.

    signing.json is written first, so the signature covers it; on failure
    neither file is left.
    """
    library = _library()
    record = SigningRecord(
        _utc_now(), str(signer.path), signer.fingerprint, signature, f"mpconvert {mpconvert_version()}"
    )
    record_path = folder / SIGNING_NAME
    write_text(record_path, json.dumps(record.to_json(), indent=2) + "\n", "the signing record")
    ignored = [signature, VERIFY_NAME, *leave_out]
    # Every file is covered: not even .git* files are left out, as the library would by default.
    hashing = library.hashing.Config().set_ignored_paths(paths=ignored, ignore_git_paths=False)
    config = library.signing.Config().set_hashing_config(hashing)
    try:
        config.use_elliptic_key_signer(private_key=signer.path, password=signer.password)
        with _signature_written(folder / signature) as partial:
            config.sign(folder, partial)
    except MpconvertError:
        record_path.unlink(missing_ok=True)
        raise
    except (ValueError, TypeError) as exc:  # a symlink in the folder, a key changed since it was loaded
        record_path.unlink(missing_ok=True)
        raise MpconvertError(
            f"cannot sign {folder}: {first_line(exc)}", hint="sign a folder of plain files with the key given"
        ) from None
    return record


def check_signature(
    folder: Path, public_key: Path | None, required: bool, signature: str = SIGNATURE_NAME
) -> SignatureCheck | None:
    """The folder's signature checked with `public_key`; None when neither a key nor a signature was asked for."""
    if public_key is None and not required:
        return None
    shown = None if public_key is None else str(public_key)
    path = folder / signature
    if not path.is_file():
        return SignatureCheck(
            signature,
            shown,
            False,
            f"{signature} is missing: the folder is not signed (convert with --sign-key, or run mpconvert sign)",
        )
    try:
        bundle = json.loads(path.read_text())
        signer = bundle["verificationMaterial"]["publicKey"].get("hint") or None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        message = f"{signature} cannot be read as a model-signing signature ({type(exc).__name__}: {first_line(exc)})"
        return SignatureCheck(signature, shown, False, message)
    if public_key is None:
        return SignatureCheck(
            signature, shown, False, f"{signature} is there but not checked: --require-signature needs --public-key"
        )
    return _checked(folder, public_key, signature, bundle, signer)


def _checked(folder: Path, public_key: Path, signature: str, bundle: dict, signer: str | None) -> SignatureCheck:
    library = _library()
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization

    shown = str(public_key)
    try:
        expected = public_key_sha256(serialization.load_pem_public_key(public_key.read_bytes()))
    except (OSError, ValueError, TypeError) as exc:
        raise MpconvertError(
            f"cannot read --public-key {public_key} as a PEM public key: {first_line(exc)}",
            hint="give the public half of the signing key (openssl ec -in key.pem -pubout -out key.pub)",
        ) from None
    if signer and signer != expected:
        message = (
            f"{signature} was signed by another key (public key sha256 {signer[:16]}...), "
            f"not by {public_key.name}'s ({expected[:16]}...)"
        )
        return SignatureCheck(signature, shown, False, message, signer)
    config = library.verifying.Config().use_elliptic_key_verifier(public_key=public_key)
    try:
        config.verify(folder, folder / signature)
    except InvalidSignature:
        message = (
            f"{signature} does not verify with {public_key.name}: the signature or the manifest it signs was altered"
        )
        return SignatureCheck(signature, shown, False, message, signer)
    except (ValueError, KeyError, TypeError) as exc:  # the manifest holds (the signature did) but the files differ
        changed = _changed_files(folder, bundle)
        if changed:
            listed = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
            message = f"the folder is not what was signed: {listed}"
            return SignatureCheck(signature, shown, False, message, signer, changed=tuple(changed))
        return SignatureCheck(signature, shown, False, f"{signature}: {first_line(exc)}", signer)
    record = _record(folder)
    when = f"at {record.signed_at} with {record.key}" if record else f"(no {SIGNING_NAME}: when is not recorded)"
    message = f"signed by {public_key.name}'s key (sha256 {expected[:16]}...) {when}; every file is as signed"
    return SignatureCheck(signature, shown, True, message, expected, record)


def _record(folder: Path) -> SigningRecord | None:
    """signing.json, trusted because the signature that covers it held; None for a folder signed without one."""
    try:
        return SigningRecord.from_json(json.loads((folder / SIGNING_NAME).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _changed_files(folder: Path, bundle: dict) -> list[str]:
    """The files that differ from the signed manifest: "NAME changed", "NAME added", "NAME missing"."""
    try:
        statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        predicate = statement["predicate"]
        signed = {r["name"]: r["digest"] for r in predicate["resources"] if r["algorithm"] == "sha256"}
        ignored = [str(p).rstrip("/") for p in predicate["serialization"].get("ignore_paths", ())]
    except (ValueError, KeyError, TypeError):
        return []

    def left_out(name: str) -> bool:
        return any(name == p or name.startswith(p + "/") for p in ignored)

    here = {p.relative_to(folder).as_posix(): p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()}
    here = {name: p for name, p in here.items() if not left_out(name)}
    found = [f"{name} changed" for name in sorted(set(signed) & set(here)) if file_sha256(here[name]) != signed[name]]
    found += [f"{name} added" for name in sorted(set(here) - set(signed))]
    found += [f"{name} missing" for name in sorted(set(signed) - set(here))]
    return found
