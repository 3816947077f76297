"""The output folder appears whole or not at all.

Everything is written into a hidden sibling folder and renamed into place at
the end; a failure or Ctrl-C removes the staging folder, so a run never
leaves a half-written `--out` behind, and `--force` replaces an old folder
only once the new one is complete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from .errors import MpconvertError


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def check_output(out: Path, inputs: list[Path], force: bool) -> Path:
    """Refuse outputs that would lose data; returns the resolved path.

    `inputs` are the files the run reads (model, data): the output may
    neither be written into them nor, with --force, replace a folder that
    holds them.
    """
    out = out.resolve()
    for given in inputs:
        path = given.resolve()
        if _inside(out, path) and path.is_dir():
            raise MpconvertError(
                f"output folder {out} is inside the input {path}",
                hint="choose an --out outside the input; mpconvert never writes into its input",
            )
        if _inside(path, out):
            raise MpconvertError(
                f"output folder {out} contains the input {path}; replacing it would delete the input",
                hint="choose another --out",
            )
    if out.exists() and not out.is_dir():
        raise MpconvertError(f"output path {out} exists and is a file", hint="choose a folder path for --out")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise MpconvertError(
            f"output folder {out} already exists and is not empty",
            hint="pass --force to replace it, or choose another --out",
        )
    return out


@contextlib.contextmanager
def staged_output(out: Path) -> Iterator[Path]:
    """Yield a private folder; on success it becomes `out`, on failure it vanishes."""
    created = [p for p in reversed(out.parents) if not p.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        yield staging
        _replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for parent in reversed(created):
            with contextlib.suppress(OSError):
                parent.rmdir()  # only if still empty
        raise


def _replace(staging: Path, out: Path) -> None:
    if not out.exists():
        os.replace(staging, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.replace(out, old / out.name)
    os.replace(staging, out)
    shutil.rmtree(old, ignore_errors=True)
