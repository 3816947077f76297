"""`mpconvert sign OUT --key KEY.pem`: sign a folder converted before, or a batch root.

A signature says "these bytes are the ones I vouch for", so it must never
bless a damaged folder: every file report.json recorded a sha256 for (each
artifact, golden.npz) is hashed first, and one that differs refuses the
whole folder. A batch root gets each converted model's folder signed so,
then its own batch.sig over batch.json and index.html. A folder already
signed is refused without `force`: replacing another key's signature is a
decision, not a side effect.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mpconvert.commands.signature import Signer, sign_folder
from mpconvert.commands.verify import BATCH_NAME, recorded_files
from mpconvert.render.html import INDEX_HTML
from mpconvert.report.read import read_report
from mpconvert.report.report import REPORT_NAME, Report
from mpconvert.report.signing import BATCH_SIGNATURE_NAME, SIGNATURE_NAME, SIGNING_NAME, SigningRecord
from mpconvert.system.errors import MpconvertError
from mpconvert.system.urls import local_path

# What a batch root's own signature covers; every other entry of the root (the model folders, each
# signed on its own, and shard summaries) is left out of it.
ROOT_FILES = (BATCH_NAME, INDEX_HTML, SIGNING_NAME)


@dataclass(frozen=True)
class Signed:
    """A folder signed: where, and the record written into it."""

    folder: Path
    record: SigningRecord


def sign_output(path: str | Path, signer: Signer, *, force: bool = False) -> list[Signed]:
    """Sign a conversion's output folder, or a batch root and every model folder in it."""
    folder = local_path(path, "OUT").absolute()
    if not folder.is_dir():
        raise MpconvertError(f"{folder} is not a folder", hint="give the output folder a conversion (or a batch) wrote")
    if not (folder / REPORT_NAME).is_file() and (folder / BATCH_NAME).is_file():
        return sign_root(folder, signer, force=force)
    return [sign_converted(folder, signer, force=force)]


def sign_converted(folder: Path, signer: Signer, *, force: bool = False) -> Signed:
    """One conversion's folder, once every file its report recorded is as written."""
    refuse_damaged(folder, force)
    return Signed(folder, sign_folder(folder, signer))


def refuse_damaged(folder: Path, force: bool) -> None:
    """Refuse a folder that is signed already (without `force`), or one whose files differ from its report's."""
    report = Report.from_json(read_report(folder))
    _refuse_signed(folder / SIGNATURE_NAME, force)
    checks = recorded_files(folder, report)
    if not checks:
        raise MpconvertError(
            f"{folder / REPORT_NAME} records no file hashes: it was written by an mpconvert from before `verify`",
            hint="convert the model again with this mpconvert (with --sign-key to sign it)",
        )
    damaged = [c for c in checks if not c.passed]
    if damaged:
        more = f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""
        raise MpconvertError(
            f"not signing {folder}: {damaged[0].message}{more}; a signature must never bless a changed folder",
            hint="convert the model again (with --sign-key), or restore the folder as it was written",
        )


def sign_root(root: Path, signer: Signer, *, force: bool = False) -> list[Signed]:
    """Each converted model's folder of a batch root, then the root's own files."""
    try:  # batch.json's entries, read by the few keys needed (batch/ is a layer above this one)
        entries = list(json.loads((root / BATCH_NAME).read_text())["models"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MpconvertError(
            f"{root / BATCH_NAME} cannot be read as a batch summary ({exc})",
            hint="give the batch root that `mpconvert batch` wrote",
        ) from None
    _refuse_signed(root / BATCH_SIGNATURE_NAME, force)
    folders = [root / e["folder"] for e in entries if e.get("status") in ("passed", "gate_failed") and e.get("folder")]
    for folder in folders:  # all of them before any is signed: a refusal leaves the root as it was
        refuse_damaged(folder, force)
    signed = [Signed(folder, sign_folder(folder, signer)) for folder in folders]
    return [*signed, Signed(root, sign_batch_root(root, signer))]


def sign_batch_root(root: Path, signer: Signer) -> SigningRecord:
    """batch.sig over the root's own files (ROOT_FILES); the model folders carry their own signatures."""
    others = [p.name for p in root.iterdir() if p.name not in ROOT_FILES]
    return sign_folder(root, signer, BATCH_SIGNATURE_NAME, leave_out=others)


def _refuse_signed(path: Path, force: bool) -> None:
    if path.exists() and not force:
        raise MpconvertError(
            f"{path} already exists: the folder is signed",
            hint="pass --force to replace its signature with one by this key",
        )
