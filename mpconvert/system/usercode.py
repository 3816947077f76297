"""Running the user's own code, only where they asked for it by name.

`--import MODULE` (custom layers) and `--data module:function` import the
user's modules: that runs their code, so it only happens for these explicit
forms. Modules are found like `python -m` finds them: beside the user (the
current folder) and on PYTHONPATH, and the current folder is put on
sys.path for the import only. A replay finds them from the folder its
report's run started in instead (`importing_from`), wherever it runs.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from types import ModuleType

from mpconvert.system.errors import MpconvertError

_FOLDER: ContextVar[Path | None] = ContextVar("user_code_folder", default=None)


@contextlib.contextmanager
def importing_from(folder: Path | None) -> Iterator[None]:
    """Inside: the user's modules are found from `folder` instead of the current folder (None: unchanged)."""
    token = _FOLDER.set(Path(folder) if folder is not None else _FOLDER.get())
    try:
        yield
    finally:
        _FOLDER.reset(token)


def user_folder() -> Path:
    """Where the user's modules are found first: the current folder, or the one `importing_from` set."""
    return _FOLDER.get() or Path.cwd()


@contextlib.contextmanager
def user_folder_importable() -> Iterator[None]:
    folder = str(user_folder())
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        yield
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)


def module_file(name: str) -> Path | None:
    """The file the imported module `name` was loaded from; None when it is not imported or has no file."""
    file = getattr(sys.modules.get(name), "__file__", None)
    return Path(file).absolute() if file else None


def module_origin(name: str) -> Path | None:
    """The file `import name` would load here, found as `import_module` finds it; None when none would.

    A module already imported in this process is the one an import gets.
    Finding a top-level module runs none of its code; for a dotted name,
    its parent packages are imported.
    """
    try:
        with user_folder_importable():
            spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    return Path(origin).absolute() if origin and spec is not None and spec.has_location else None


def import_module(name: str, option: str) -> ModuleType:
    """Import `name` for `option` ("--import mylayers"), or a clear error."""
    try:
        with user_folder_importable():
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
