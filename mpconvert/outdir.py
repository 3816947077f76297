"""The output folder: claimed at the start, written whole or not at all.

* `claimed_output` reserves `--out` before any work: a lock file beside it
  (`.NAME.mpconvert-lock`, holding the owner's pid) taken with `flock`, so a
  second run into the same folder fails at once, even with --force, and a
  run killed with SIGKILL releases it (the kernel drops the lock with the
  process). Taking it also proves the parent can be created and written.
* Everything is written into a hidden sibling staging folder and renamed into
  place at the end (`staged_output`); a failure or Ctrl-C removes it, so a run
  never leaves a half-written `--out`, and `--force` replaces an old folder
  only once the new one is complete. Staging folders carry their owner's pid;
  one left by a killed run is removed by the next run that claims the folder.
* Created folders follow the umask like any tool's output (mkdtemp's 0700
  would lock a serving process running as another user out).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from .errors import MpconvertError

_LOCK_SUFFIX = ".mpconvert-lock"
_STAGING = re.compile(r"^\.(?P<name>.+)\.(?:partial|old)-(?P<pid>\d+)-")


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def check_output(out: Path, inputs: list[Path], force: bool) -> Path:
    """Refuse outputs that would lose data; returns the resolved path.

    `inputs` are the files the run reads (model, data): the output may
    neither be written into them nor, with --force, replace a folder that
    holds them.
    """
    out = Path(out).resolve()
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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def _unwritable(parent: Path, exc: OSError) -> MpconvertError:
    reason = exc.strerror or str(exc)
    return MpconvertError(
        f"cannot write the output folder's parent {parent}: {reason}",
        hint="choose an --out on a writable file system, in a folder you may write to",
    )


def _make_parents(parent: Path) -> list[Path]:
    """Create `parent` and its missing ancestors; returns those created (outermost first)."""
    created = [p for p in reversed([parent, *parent.parents]) if not p.exists()]
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(parent, exc) from None
    return created


def _remove_created(created: list[Path]) -> None:
    for path in reversed(created):
        with contextlib.suppress(OSError):
            path.rmdir()  # only if still empty


def _lock(out: Path) -> int:
    """An fd holding the exclusive flock on out's lock file; refuses a folder in use."""
    path = out.parent / f".{out.name}{_LOCK_SUFFIX}"
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise _unwritable(out.parent, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise _unwritable(out.parent, exc) from None
            raise MpconvertError(
                f"output folder {out} is in use by another mpconvert run (pid {owner})",
                hint="wait for that run to finish, or choose another --out",
            ) from None
        # The previous owner may have unlinked the file between our open and
        # our lock; a lock on a deleted file protects nothing, so start over.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)


def _unlock(out: Path, fd: int) -> None:
    with contextlib.suppress(OSError):
        (out.parent / f".{out.name}{_LOCK_SUFFIX}").unlink()
    os.close(fd)


def remove_stale_staging(out: Path) -> list[Path]:
    """Clean up after runs into `out` that were killed; returns what was removed.

    A `.partial-` folder is a half-written output: deleted. An `.old-` folder
    holds the previous output while --force swaps it out; if the run died
    between the two renames, `out` is missing and the old output goes back.
    """
    removed = []
    with contextlib.suppress(OSError):
        for entry in out.parent.iterdir():
            match = _STAGING.match(entry.name)
            if not match or match["name"] != out.name or not entry.is_dir():
                continue
            if _pid_alive(int(match["pid"])):
                continue
            previous = entry / out.name
            if ".old-" in entry.name and previous.is_dir() and not out.exists():
                os.replace(previous, out)
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def clear_dead_run(out: Path) -> None:
    """After a run into `out` was killed (a batch's timeout): its staging folder and lock file go.

    The lock file is only removed when no live process holds it.
    """
    out = Path(out).absolute()
    remove_stale_staging(out)
    path = out.parent / f".{out.name}{_LOCK_SUFFIX}"
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return
    _unlock(out, fd)


@contextlib.contextmanager
def claimed_output(out: Path, inputs: list[Path], force: bool) -> Iterator[Path]:
    """Reserve `out` for this run (see the module doc); yields its resolved path."""
    out = check_output(out, inputs, force)
    created = _make_parents(out.parent)
    try:
        fd = _lock(out)
    except BaseException:
        _remove_created(created)
        raise
    try:
        remove_stale_staging(out)
        # Checked again under the lock: another run may have filled it meanwhile.
        check_output(out, inputs, force)
        yield out
    except BaseException:
        _unlock(out, fd)
        _remove_created(created)
        raise
    else:
        _unlock(out, fd)


@contextlib.contextmanager
def staged_output(out: Path) -> Iterator[Path]:
    """Yield a private folder; on success it becomes `out`, on failure it vanishes.

    The caller holds the claim on `out` (claimed_output).
    """
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-{os.getpid()}-", dir=out.parent))
    os.chmod(staging, 0o777 & ~_umask())
    try:
        yield staging
        _replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _replace(staging: Path, out: Path) -> None:
    if not out.exists():
        os.replace(staging, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{os.getpid()}-", dir=out.parent))
    os.replace(out, old / out.name)
    os.replace(staging, out)
    shutil.rmtree(old, ignore_errors=True)
