"""Content digests of what a run reads and writes, so a report can be traced to exact bytes.

A file's digest is its sha256. A folder (a SavedModel) has no single byte
stream, so its digest is the sha256 of one line per file, in sorted order:
the file's path relative to the folder, a tab, and the file's own sha256.
That is stable across machines and copies (no timestamps, no walk order)
and changes when any file is changed, added, removed or renamed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Digest:
    sha256: str
    bytes: int
    files: int  # 1 for a file


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def digest(path: Path) -> Digest:
    """The digest of a file, or of a folder's files (see the module's docstring)."""
    path = Path(path)
    if path.is_file():
        return Digest(file_sha256(path), path.stat().st_size, 1)
    files = sorted((p for p in path.rglob("*") if p.is_file()), key=lambda p: p.relative_to(path).as_posix())
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.relative_to(path).as_posix()}\t{file_sha256(p)}\n".encode())
    return Digest(h.hexdigest(), sum(p.stat().st_size for p in files), len(files))


def content_sha256(path: Path) -> str:
    """One sha256 over a file's bytes, or over a folder's files in order, each its relative path, a NUL, its bytes.

    A batch result's key holds its files so. Not `digest`'s folder form: a
    batch root keeps the keys it was made with, and `--resume` reuses a
    result only when the key computed again is the same, so this stream
    stays as it is.
    """
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if file != path:
            h.update(str(file.relative_to(path)).encode() + b"\0")
        with file.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                h.update(chunk)
    return h.hexdigest()
