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
import glob
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from mpconvert.system import interrupts
from mpconvert.system.errors import MpconvertError
from mpconvert.system.writing import writing

_LOCK_SUFFIX = ".mpconvert-lock"
_STAGING = re.compile(r"^\.(?P<name>.+)\.(?:partial|old)-(?P<pid>\d+)-")
_PARTIAL_FILE = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.partial$")  # writing.replace_atomically's


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


def _lock_path(out: Path, part: str = "") -> Path:
    return out.parent / f".{out.name}{part}{_LOCK_SUFFIX}"


def _lock(out: Path) -> int:
    """An fd holding the exclusive flock on out's lock file; refuses a folder in use."""
    return _take(
        _lock_path(out),
        out,
        shared=False,
        in_use=lambda owner: MpconvertError(
            f"output folder {out} is in use by another mpconvert run (pid {owner})",
            hint="wait for that run to finish, or choose another --out",
        ),
    )


def _take(path: Path, out: Path, shared: bool, in_use: Callable[[str], MpconvertError], wait: bool = False) -> int:
    """An fd holding a flock on `path` (shared, or exclusive with our pid written in), or `in_use(owner)`.

    With `wait`, a held lock is waited for instead of refused.
    """
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise _unwritable(out.parent, exc) from None
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
        except OSError as exc:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise _unwritable(out.parent, exc) from None
            raise in_use(owner) from None
        # The previous owner may have unlinked the file between our open and
        # our lock; a lock on a deleted file protects nothing, so start over.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        if shared:  # several holders: the pid is in each one's own exclusive lock
            return fd
        try:
            with writing(path, "the lock file"):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            _release(path, fd)
            raise
        return fd


def _release(path: Path, fd: int) -> None:
    """Drop the lock and remove its file, unless another holder shares it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)  # a shared lock someone else still holds: the file stays theirs
        return
    with contextlib.suppress(OSError):
        path.unlink()
    os.close(fd)


def _unlock(out: Path, fd: int) -> None:
    _release(_lock_path(out), fd)


def remove_dead_locks(parent: Path) -> list[Path]:
    """Lock files in `parent` left by runs killed with SIGKILL (their pid is gone and nobody holds them)."""
    removed = []
    with contextlib.suppress(OSError):
        for path in parent.glob(f".*{_LOCK_SUFFIX}"):
            try:
                owner = path.read_text().strip()
            except OSError:
                continue
            if owner.isdigit() and _pid_alive(int(owner)):
                continue
            if _remove_if_free(path):  # held: a live run (a shared root lock has no pid in it)
                removed.append(path)
    return removed


def _remove_if_free(path: Path) -> bool:
    """Remove a lock file that no live process holds; True if it went."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        same = os.fstat(fd).st_ino == os.stat(path).st_ino
        if same:
            path.unlink()
        return same
    except OSError:
        return False
    finally:
        os.close(fd)


@contextlib.contextmanager
def claimed_root(root: Path, shard: tuple[int, int] | None = None) -> Iterator[Path]:
    """Claim a batch root for this batch: all of it, or one shard's part of it.

    The root's lock file is taken exclusively by an unsharded batch and
    shared by shards, each of which also takes its own `shard-I-of-N` lock;
    so shards of one root run side by side, and a second batch of the same
    root (or shard) is refused at once, naming the running one's pid.
    """
    root = Path(root).absolute()
    created = _make_parents(root.parent)
    remove_dead_locks(root.parent)
    held: list[tuple[Path, int]] = []

    def busy(owner: str) -> MpconvertError:
        owners = sorted({owner, *_shard_owners(root)} - {"", "?"}) or ["?"]
        part = f"shard {shard[0]}/{shard[1]} of " if shard else ""
        return MpconvertError(
            f"{part}output root {root} is in use by another mpconvert batch (pid {', '.join(owners)})",
            hint="wait for that batch to finish (or stop it), or choose another --out",
        )

    try:
        root_lock = _lock_path(root)
        held.append((root_lock, _take(root_lock, root, shared=shard is not None, in_use=busy)))
        if shard is not None:
            shard_lock = _lock_path(root, f".shard-{shard[0]}-of-{shard[1]}")
            held.append((shard_lock, _take(shard_lock, root, shared=False, in_use=busy)))
        remove_stale_partials(root)
        yield root
    except BaseException:
        for path, fd in reversed(held):
            _release(path, fd)
        _remove_created(created)
        raise
    for path, fd in reversed(held):
        _release(path, fd)


@contextlib.contextmanager
def merge_lock(root: Path) -> Iterator[None]:
    """Held while a shard of `root` checks whether it finished last and writes the combined batch.json.

    Waited for, not refused: the check takes a moment, and the shard that
    waits must see the summary of the one before it.
    """
    root = Path(root).absolute()
    path = _lock_path(root, ".merge")
    fd = _take(path, root, shared=False, in_use=lambda owner: MpconvertError(f"{path} is held"), wait=True)
    try:
        yield
    finally:
        _release(path, fd)


def _shard_owners(root: Path) -> set[str]:
    owners = set()
    for path in root.parent.glob(f".{glob.escape(root.name)}.shard-*{_LOCK_SUFFIX}"):
        with contextlib.suppress(OSError):
            owners.add(path.read_text().strip())
    return owners


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


def remove_stale_partials(folder: Path) -> list[Path]:
    """The hidden `.NAME.PID.partial` files (writing.replace_atomically's) of killed processes in `folder`.

    A process killed between writing such a file and renaming it over NAME
    (a batch killed while it wrote index.html) leaves it behind; the next
    batch into the root removes it. A live writer's file is left alone.
    """
    removed = []
    with contextlib.suppress(OSError):
        for entry in folder.iterdir():
            match = _PARTIAL_FILE.match(entry.name)
            if match and entry.is_file() and not _pid_alive(int(match["pid"])):
                with contextlib.suppress(OSError):
                    entry.unlink()
                    removed.append(entry)
    return removed


def clear_dead_run(out: Path) -> None:
    """After a run into `out` was killed (a batch's timeout): its staging folder and lock file go.

    The lock file is only removed when no live process holds it.
    """
    out = Path(out).absolute()
    remove_stale_staging(out)
    _remove_if_free(_lock_path(out))


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
        remove_dead_locks(out.parent)
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
        interrupts.check()  # a Ctrl-C swallowed while writing must not put the output in place
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
