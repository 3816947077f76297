"""The key of a result: what it was computed from, by content.

A hash of the model's files, the data file, the resolved options and the
versions of mpconvert and the frameworks. Paths are not part of it (files
count by content), so the same model and data under another folder, on
another machine or in another CI run has the same key: a shared output root
works as a team-wide cache. A changed model, option or TensorFlow version
gives another key, and converts again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..keywords import keywords_of
from ..report import versions
from .manifest import PATH_KEYS, Job

_CHUNK = 1 << 20


def file_digest(path: Path) -> str:
    """sha256 of a file, or of a folder's files with their relative paths."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if file != path:
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        with file.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def _mpconvert_version() -> str:
    from .. import __version__

    return __version__


def job_key(job: Job) -> str:
    options = keywords_of(job.options)
    for key in PATH_KEYS:
        value = options.get(key)
        if isinstance(value, str) and Path(value).exists():
            options[key] = {"sha256": file_digest(Path(value))}
    content = {
        "model": file_digest(job.model),
        "policy": job.policy,
        "options": options,
        "export": keywords_of(job.export),
        "versions": {**versions(), "mpconvert": _mpconvert_version()},
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()
