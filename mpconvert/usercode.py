"""Running the user's own code, only where they asked for it by name.

`--import MODULE` (custom layers) and `--data module:function` import the
user's modules: that runs their code, so it only happens for these explicit
forms. Modules are found like `python -m` finds them: beside the user (the
current folder) and on PYTHONPATH, and the current folder is put on
sys.path for the import only.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from .errors import MpconvertError


@contextlib.contextmanager
def current_dir_importable() -> Iterator[None]:
    cwd = str(Path.cwd())
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def import_module(name: str, option: str) -> ModuleType:
    """Import `name` for `option` ("--import mylayers"), or a clear error."""
    try:
        with current_dir_importable():
            return importlib.import_module(name)
    except ImportError as exc:
        raise MpconvertError(
            f"{option}: cannot import {name!r} ({exc})",
            hint="give an importable module: run from its folder or add that folder to PYTHONPATH",
        ) from None
    except Exception as exc:
        raise MpconvertError(
            f"{option}: importing {name!r} raised {type(exc).__name__}: {exc}",
            hint=f"fix the module; `python -c 'import {name}'` shows the full error",
        ) from exc
