"""Writing outputs: a full disk or another OS error is the user's machine, not mpconvert's bug.

Python raises OSError with an errno; TensorFlow's savers raise their own
errors (a SavedModel's variables on a full disk: ResourceExhaustedError,
"...; No space left on device [Op:SaveV2]"). Both become one WriteError
naming the path, what was being written and, for a full disk, about how
much room the output needs against what is free.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from mpconvert.system.errors import MpconvertError, WriteError

# What TensorFlow's C++ file system writes into its error messages.
_TF_MESSAGES = {
    "No space left on device": errno.ENOSPC,
    "Disk quota exceeded": errno.EDQUOT,
    "Read-only file system": errno.EROFS,
    "Permission denied": errno.EACCES,
}
_FULL = (errno.ENOSPC, errno.EDQUOT)


def os_error(exc: BaseException) -> tuple[int, str] | None:
    """(errno, reason) when `exc`, or what caused it, is an OS error while writing."""
    seen = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None:
            return current.errno, current.strerror or os.strerror(current.errno)
        if type(current).__module__.startswith("tensorflow"):
            for text, code in _TF_MESSAGES.items():
                if text in str(current):
                    return code, text
        current = current.__cause__ or current.__context__
    return None


def human(size: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def _free(path: Path) -> int | None:
    for folder in (path, *path.parents):
        if folder.exists():
            with contextlib.suppress(OSError):
                return shutil.disk_usage(folder).free
            return None
    return None


def write_error(path: Path, what: str, code: int, reason: str, needed: int | None = None) -> WriteError:
    message = f"cannot write {what} to {path}: {reason}"
    if code in _FULL:
        free = _free(Path(path))
        room = [f"it needs about {human(needed)}"] if needed else []
        if free is not None:
            room.append(f"{human(free)} free there")
        if room:
            message += f" ({'; '.join(room)})"
        hint = "free space on that file system, or choose an --out on one with more room; nothing partial was left"
    elif code in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = "choose an --out on a writable file system, in a folder you may write to"
    else:
        hint = "check the file system that holds the output (mounted, healthy, not full)"
    return WriteError(message, hint=hint)


@contextlib.contextmanager
def writing(path: Path, what: str, needed: int | None = None) -> Iterator[None]:
    """Turn an OS error raised inside into a WriteError about `what` at `path`."""
    try:
        yield
    except MpconvertError:
        raise
    except Exception as exc:
        found = os_error(exc)
        if found is None:
            raise
        raise write_error(path, what, *found, needed=needed) from exc


def write_text(path: Path, text: str, what: str) -> None:
    with writing(path, what, len(text.encode())):
        Path(path).write_text(text)


def replace_atomically(path: Path, data: bytes | str, what: str) -> None:
    """Write `path` whole or not at all: into a hidden sibling, then renamed over it.

    A reader (another process polling a worker's result, a batch run
    reading batch.json) sees the old file or the new one, never half of one;
    a failed write leaves no sibling behind and raises a WriteError.
    """
    path = Path(path)
    content = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with writing(path, what, len(content)):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(content)
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def reported_at(staging: Path, out: Path) -> Iterator[None]:
    """WriteErrors from inside a staging folder name the path the user asked for, not the hidden folder."""
    try:
        yield
    except WriteError as exc:
        raise WriteError(exc.message.replace(str(staging), str(out)), hint=exc.hint) from exc
