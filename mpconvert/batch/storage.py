"""Where a batch root lives: a local (or network) folder, or object storage through fsspec.

The runner always works in a local folder (`Root.local`). For a folder root
that is the root itself and the other methods are plain file operations. For
`s3://bucket/prefix` (or any other protocol fsspec has installed) it is a
local staging folder: the results of this run's jobs already complete in the
bucket (their `batch_result.json` and `report.json`) are fetched into it
first, so resume and the refusal of an occupied root read the same files as
on a local root; each finished job's folder is uploaded with its
`batch_result.json` last (and an older one's marker removed first), so a
reader, `--resume` included, never takes a half-uploaded folder for a result.

Credentials come from where fsspec's backend looks (for S3: the environment,
~/.aws, an instance role); mpconvert never reads or writes them, and a URL's
user:password part is left out of everything it writes.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import MpconvertError, first_line
from ..outdir import merge_lock
from ..render.html import INDEX_HTML, batch_page, write_batch_page
from .results import BATCH_NAME, parse_batch, read_batch, write_batch
from .worker import RESULT_NAME

_EXTRA_HINT = "pip install mpconvert[s3] (fsspec and s3fs; for gs:// and others also their fsspec package, e.g. gcsfs)"


def is_url(text: str | Path) -> bool:
    scheme = urlsplit(str(text)).scheme
    return "://" in str(text) and len(scheme) > 1 and scheme != "file"  # "C:/..." is a path


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


@dataclass
class LocalRoot:
    """A batch root in a folder: what the runner writes is already in place."""

    local: Path

    @property
    def label(self) -> str:
        return str(self.local)

    def path(self, relative: str) -> str:
        return str(self.local / relative)

    def list(self, relative: str) -> list[str]:
        folder = self.local / relative
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def read_batch(self, relative: str) -> dict | None:
        return read_batch(self.local / relative) if (self.local / relative).is_file() else None

    def write_batch(self, relative: str, summary: dict) -> None:
        write_batch(self.local / relative, summary)
        if relative == BATCH_NAME:  # the root's own summary gets the page people open
            write_batch_page(summary, self.local)

    def merge_lock(self) -> contextlib.AbstractContextManager:
        return merge_lock(self.local)

    def fetch_results(self, folders: builtins.list[str]) -> None:
        pass

    def publish_result(self, folder: str) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class RemoteRoot:
    """A batch root in object storage, worked on in a local staging folder."""

    url: str  # without credentials
    fs: Any  # an fsspec file system
    base: str  # the root's path on it, without the protocol
    local: Path

    @property
    def label(self) -> str:
        return self.url

    def path(self, relative: str) -> str:
        return f"{self.url}/{relative}"

    def _remote(self, relative: str) -> str:
        return f"{self.base}/{relative}"

    @contextlib.contextmanager
    def _calling(self, what: str) -> Iterator[None]:
        # The storage boundary: what the backend raises (no credentials, no bucket,
        # access denied, the network) is the user's setup, said in one line.
        try:
            yield
        except MpconvertError:
            raise
        except Exception as exc:
            raise MpconvertError(
                f"cannot {what} {self.url}: {type(exc).__name__}: {first_line(exc)}",
                hint="check the bucket exists, and the credentials and endpoint the storage library reads "
                "(for S3: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or ~/.aws, AWS_ENDPOINT_URL for a non-AWS server)",
            ) from None

    def _files(self, relative: str = "") -> builtins.list[str]:
        """Every object under the root (or a folder of it), relative to the root; never from a stale cache."""
        with self._calling("list"):
            self.fs.invalidate_cache()
            where = self._remote(relative) if relative else self.base
            try:
                found = self.fs.find(where)
            except FileNotFoundError:
                return []
        return [name[len(self.base) + 1 :] for name in found if name.startswith(self.base + "/")]

    def list(self, relative: str) -> list[str]:
        prefix = relative.rstrip("/") + "/"
        return sorted({f[len(prefix) :].split("/")[0] for f in self._files(relative) if f.startswith(prefix)})

    def read_batch(self, relative: str) -> dict | None:
        with self._calling("read"):
            try:
                text = self.fs.cat_file(self._remote(relative)).decode()
            except FileNotFoundError:
                return None
        return parse_batch(text, self.path(relative))

    def write_batch(self, relative: str, summary: dict) -> None:
        # One PUT: readers see the old object or the new one.
        with self._calling("write"):
            self.fs.pipe_file(self._remote(relative), (json.dumps(summary, indent=2, allow_nan=False) + "\n").encode())
            if relative == BATCH_NAME:
                self.fs.pipe_file(self._remote(INDEX_HTML), batch_page(summary, self.local).encode())

    def merge_lock(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # see shards.py: the merge is the same bytes whoever writes it

    def fetch_results(self, folders: builtins.list[str]) -> None:
        """Each folder's stamp and report, where its stamp (written last) says the upload is whole."""
        stored = set(self._files())
        for folder in folders:
            shutil.rmtree(self.local / folder, ignore_errors=True)  # a killed run's leftovers
            if f"{folder}/{RESULT_NAME}" not in stored:
                continue
            (self.local / folder).mkdir(parents=True, exist_ok=True)
            with self._calling("read"):
                for name in (RESULT_NAME, "report.json"):
                    if f"{folder}/{name}" in stored:
                        self.fs.get_file(self._remote(f"{folder}/{name}"), str(self.local / folder / name))

    def publish_result(self, folder: str) -> None:
        """Upload a finished folder, its stamp last; the local copy then goes (staging holds only work)."""
        local = self.local / folder
        files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != RESULT_NAME)
        with self._calling("upload to"):
            old = [f for f in self._files(folder) if f.startswith(folder + "/")]
            if f"{folder}/{RESULT_NAME}" in old:
                self.fs.rm_file(self._remote(f"{folder}/{RESULT_NAME}"))  # first: the old result stops counting
            for name in old:
                if name != f"{folder}/{RESULT_NAME}":
                    self.fs.rm_file(self._remote(name))
            for path in files:
                self.fs.put_file(str(path), self._remote(f"{folder}/{path.relative_to(local).as_posix()}"))
            self.fs.put_file(str(local / RESULT_NAME), self._remote(f"{folder}/{RESULT_NAME}"))
        shutil.rmtree(local, ignore_errors=True)

    def close(self) -> None:
        """The staging folder goes once no other run on this machine works in it."""
        if not self.local.is_dir():
            return
        folders = sorted((p for p in self.local.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for path in (*folders, self.local, self.local.parent):
            with contextlib.suppress(OSError):
                path.rmdir()  # only if empty


Root = LocalRoot | RemoteRoot


def _filesystem(url: str, label: str) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError:
        raise MpconvertError(f"--out {label} needs the object storage extra (fsspec)", hint=_EXTRA_HINT) from None
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except ImportError as exc:  # fsspec is there, the protocol's package (s3fs, gcsfs) is not
        raise MpconvertError(f"--out {label} needs {first_line(exc)}", hint=_EXTRA_HINT) from None
    except ValueError as exc:
        raise MpconvertError(f"--out {label}: {first_line(exc)}", hint=_EXTRA_HINT) from None
    return fs, path.rstrip("/")


def open_root(given: str | Path) -> Root:
    """The batch root `--out` names: a folder, or a URL of an fsspec protocol."""
    if not is_url(given):
        return LocalRoot(Path(given).absolute())
    url = str(given)
    label = _without_credentials(url)
    fs, base = _filesystem(url, label)
    # One staging folder per root and machine: a retried task on the same machine finds its
    # leftovers there (and removes them), and shards of one root on one machine share it as
    # they share a local root.
    digest = hashlib.sha256(label.encode()).hexdigest()[:16]
    local = Path(tempfile.gettempdir()) / "mpconvert-staging" / digest / "root"
    return RemoteRoot(label, fs, base, local)
