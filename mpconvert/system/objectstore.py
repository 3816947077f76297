"""Object storage through fsspec: opening a bucket prefix, listing it, uploading a folder into it.

Shared by `batch` (its root) and the single conversion (`--out s3://...`,
`Conversion.save(URL)`). Both stage locally and upload a finished folder with
its result stamp last, so a reader never takes a half-uploaded folder for a
result; `staged_upload` is that for one output.

Every call into the backend goes through `Store.calling`: whatever the
backend raises (no credentials, no bucket, access denied, the server gone)
becomes one MpconvertError naming the operation and the object. s3fs runs
aiohttp on a loop of its own in a background thread; when a connection dies
there, aiohttp leaves tasks whose exception nobody retrieves, and asyncio's
default handler prints "Task exception was never retrieved" with a traceback
long after our message. `_quiet_loop` gives that loop a handler that drops
those reports (the failure itself has already reached us through the call).

Credentials come from where fsspec's backend looks (for S3: the environment,
~/.aws, an instance role); mpconvert never reads or writes them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpconvert.system.errors import MpconvertError, first_line
from mpconvert.system.urls import output_url

EXTRA_HINT = "pip install mpconvert[s3] (fsspec and s3fs; for gs:// and others also their fsspec package, e.g. gcsfs)"
_STAGING = "mpconvert-staging"
_SETUP_HINT = (
    "check the bucket exists, and the credentials and endpoint the storage library reads "
    "(for S3: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or ~/.aws, AWS_ENDPOINT_URL for a non-AWS server)"
)


def reason(exc: BaseException, limit: int = 300) -> str:
    """The backend's message on one line: botocore's ParamValidationError puts its reason after a line break."""
    text = " ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip())
    return f"{type(exc).__name__}: {text[:limit]}" if text else type(exc).__name__


def _ignore_stray_task_errors(loop: Any, context: dict) -> None:
    return None


def _quiet_loop() -> None:
    import fsspec.asyn

    with contextlib.suppress(Exception):  # an fsspec without its own loop has nothing to quiet
        fsspec.asyn.get_loop().set_exception_handler(_ignore_stray_task_errors)


@dataclass(frozen=True)
class Store:
    """A prefix in object storage: `url` is printable (no credentials), `base` its path on `fs`."""

    url: str
    fs: Any  # an fsspec file system
    base: str

    def remote(self, relative: str) -> str:
        return f"{self.base}/{relative}" if relative else self.base

    def address(self, relative: str) -> str:
        return f"{self.url}/{relative}" if relative else self.url

    @contextlib.contextmanager
    def calling(self, what: str, relative: str = "", hint: str = _SETUP_HINT) -> Iterator[None]:
        """One line for whatever the backend raises: `cannot WHAT OBJECT: Type: reason`."""
        try:
            yield
        except MpconvertError:
            raise
        except Exception as exc:
            raise MpconvertError(f"cannot {what} {self.address(relative)}: {reason(exc)}", hint=hint) from None

    def files(self, relative: str = "") -> list[str]:
        """Every object under the prefix (or a folder of it), relative to the prefix; never from a stale cache."""
        with self.calling("list", relative):
            self.fs.invalidate_cache()
            try:
                found = self.fs.find(self.remote(relative))
            except FileNotFoundError:
                return []
        return [name[len(self.base) + 1 :] for name in found if name.startswith(self.base + "/")]

    def remove(self, relatives: list[str], hint: str = _SETUP_HINT) -> None:
        for relative in relatives:
            with self.calling("remove", relative, hint):
                self.fs.rm_file(self.remote(relative))

    def upload(self, local: Path, relative: str, last: str, hint: str = _SETUP_HINT) -> None:
        """`local`'s files under `relative`, the file named `last` (the result stamp) after all others."""
        files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != last)
        for path in [*files, local / last]:
            name = path.relative_to(local).as_posix()
            target = f"{relative}/{name}" if relative else name
            with self.calling("upload", target, hint):
                self.fs.put_file(str(path), self.remote(target))


def open_store(url: str, flag: str = "--out") -> Store:
    """The prefix `url` names, through fsspec; refuses credentials in the URL and http(s) first."""
    label = output_url(url, flag)
    try:
        import fsspec
    except ImportError:
        raise MpconvertError(f"{flag} {label} needs the object storage extra (fsspec)", hint=EXTRA_HINT) from None
    try:
        # A fresh file system each time: fsspec's instance cache would keep the endpoint and credentials
        # the environment had when a long-lived process (a notebook, a test session) first opened one.
        fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True)
    except ImportError as exc:  # fsspec is there, the protocol's package (s3fs, gcsfs, adlfs) is not
        raise MpconvertError(f"{flag} {label} needs its fsspec package: {first_line(exc)}", hint=EXTRA_HINT) from None
    except ValueError as exc:  # a protocol fsspec does not know
        raise MpconvertError(f"{flag} {label}: {reason(exc)}", hint=EXTRA_HINT) from None
    except Exception as exc:  # some backends (ftp, sftp) connect as they are made
        raise MpconvertError(f"cannot open {label}: {reason(exc)}", hint=_SETUP_HINT) from None
    _quiet_loop()
    return Store(label, fs, path.rstrip("/"))


def staging_root() -> Path:
    """Where mpconvert stages uploads: one folder for all runs, each run's work in a folder of its own."""
    return Path(tempfile.gettempdir()) / _STAGING


def remove_staging(folder: Path) -> None:
    """Remove one of our staging folders, and the shared parent once nothing else is in it."""
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        staging_root().rmdir()  # only if empty: other runs may be staging beside us


@contextlib.contextmanager
def staged_upload(url: str, force: bool, last: str, flag: str = "--out") -> Iterator[Path]:
    """A local folder path to write one output into; on success its files go to `url`, `last` last.

    The prefix is checked before any work: objects there need `force`, as a
    non-empty local folder does. With it, the old stamp goes first, so the old
    output stops counting before anything of it changes. The local staging
    folder is removed whatever happens.
    """
    store = open_store(url, flag)
    old = store.files()
    if old and not force:
        raise MpconvertError(
            f"output {store.url} already holds {len(old)} object(s)",
            hint="pass --force to replace them, or choose another prefix",
        )
    staging_root().mkdir(parents=True, exist_ok=True)
    local = Path(tempfile.mkdtemp(prefix=f"out-{os.getpid()}-", dir=staging_root()))
    retry = (
        f"check the endpoint and the network, then run again with --force (the prefix holds no {last}, so no result)"
    )
    try:
        yield local / "out"
        old = store.files()  # again: the conversion took minutes
        store.remove(sorted(old, key=lambda name: name != last), retry)
        store.upload(local / "out", "", last, retry)
    finally:
        remove_staging(local)
