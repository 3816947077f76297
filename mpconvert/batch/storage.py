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
~/.aws, an instance role); mpconvert never reads or writes them, and refuses
a URL with a user:password part (objectstore.py, shared with the main
command's `--out URL`).
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mpconvert.batch.results import BATCH_NAME, BatchSummary, parse_batch, read_batch, write_batch
from mpconvert.batch.worker import RESULT_NAME
from mpconvert.commands.sign import sign_batch_root
from mpconvert.commands.signature import Signer
from mpconvert.render.html import INDEX_HTML, batch_page, write_batch_page
from mpconvert.report.signing import BATCH_SIGNATURE_NAME
from mpconvert.system.objectstore import Store, open_store, staging_root
from mpconvert.system.outdir import merge_lock
from mpconvert.system.urls import is_url

__all__ = ["LocalRoot", "RemoteRoot", "Root", "is_url", "open_root"]


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

    def read_batch(self, relative: str) -> BatchSummary | None:
        return read_batch(self.local / relative) if (self.local / relative).is_file() else None

    def write_batch(self, relative: str, summary: BatchSummary) -> None:
        write_batch(self.local / relative, summary)
        if relative == BATCH_NAME:  # the root's own summary gets the page people open
            write_batch_page(summary, self.local)

    def merge_lock(self) -> contextlib.AbstractContextManager:
        return merge_lock(self.local)

    def sign(self, summary: BatchSummary, signer: Signer) -> None:
        """batch.sig over the root's batch.json and index.html (as written for `summary`)."""
        sign_batch_root(self.local, signer)

    def fetch_results(self, folders: builtins.list[str]) -> None:
        pass

    def publish_result(self, folder: str) -> None:
        pass

    def close(self, folders: builtins.list[str]) -> None:
        pass


@dataclass
class RemoteRoot:
    """A batch root in object storage, worked on in a local staging folder."""

    store: Store
    local: Path

    @property
    def url(self) -> str:
        return self.store.url  # without credentials

    @property
    def label(self) -> str:
        return self.url

    def path(self, relative: str) -> str:
        return self.store.address(relative)

    def _remote(self, relative: str) -> str:
        return self.store.remote(relative)

    def _calling(self, what: str, relative: str = "") -> contextlib.AbstractContextManager:
        return self.store.calling(what, relative)

    def _files(self, relative: str = "") -> builtins.list[str]:
        return self.store.files(relative)

    def list(self, relative: str) -> list[str]:
        prefix = relative.rstrip("/") + "/"
        return sorted({f[len(prefix) :].split("/")[0] for f in self._files(relative) if f.startswith(prefix)})

    def read_batch(self, relative: str) -> BatchSummary | None:
        with self._calling("read", relative):
            try:
                text = self.store.fs.cat_file(self._remote(relative)).decode()
            except FileNotFoundError:
                return None
        return parse_batch(text, self.path(relative))

    def write_batch(self, relative: str, summary: BatchSummary) -> None:
        # One PUT: readers see the old object or the new one.
        with self._calling("write", relative):
            self.store.fs.pipe_file(
                self._remote(relative), (json.dumps(summary.to_json(), indent=2, allow_nan=False) + "\n").encode()
            )
            if relative == BATCH_NAME:
                self.store.fs.pipe_file(self._remote(INDEX_HTML), batch_page(summary, self.local).encode())

    def merge_lock(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # see shards.py: the merge is the same bytes whoever writes it

    def sign(self, summary: BatchSummary, signer: Signer) -> None:
        """batch.sig over the root's batch.json and index.html: signed in a local copy of those bytes, then
        uploaded with them, the signature last."""
        with tempfile.TemporaryDirectory(prefix="mpconvert-batch-sign-") as tmp:
            local = Path(tmp) / "root"
            local.mkdir()
            write_batch(local / BATCH_NAME, summary)
            (local / INDEX_HTML).write_text(batch_page(summary, self.local))
            sign_batch_root(local, signer)
            self.store.upload(local, "", BATCH_SIGNATURE_NAME)

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
                        self.store.fs.get_file(self._remote(f"{folder}/{name}"), str(self.local / folder / name))

    def publish_result(self, folder: str) -> None:
        """Upload a finished folder, its stamp last; the local copy then goes (staging holds only work)."""
        local = self.local / folder
        old = [f for f in self._files(folder) if f.startswith(folder + "/")]
        # The old stamp first: the old result stops counting before anything of it changes.
        self.store.remove(sorted(old, key=lambda name: name != f"{folder}/{RESULT_NAME}"))
        self.store.upload(local, folder, RESULT_NAME)
        shutil.rmtree(local, ignore_errors=True)

    def close(self, folders: builtins.list[str]) -> None:
        """This run's job folders go, whatever happened; the staging folder too once no other run works in it.

        Without this a failed upload (the server gone) would leave the job's
        files behind; they are this run's, and a retry fetches what the bucket
        holds anyway. Other shards' folders on this machine are theirs to remove.
        """
        for folder in folders:
            shutil.rmtree(self.local / folder, ignore_errors=True)
        if not self.local.is_dir():
            return
        emptied = sorted((p for p in self.local.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for path in (*emptied, self.local, self.local.parent, self.local.parent.parent):
            with contextlib.suppress(OSError):
                path.rmdir()  # only if empty


Root = LocalRoot | RemoteRoot


def open_root(given: str | Path) -> Root:
    """The batch root `--out` names: a folder, or a URL of an fsspec protocol."""
    if not is_url(given):
        return LocalRoot(Path(given).absolute())
    store = open_store(str(given))
    # One staging folder per root and machine: a retried task on the same machine finds its
    # leftovers there (and removes them), and shards of one root on one machine share it as
    # they share a local root.
    digest = hashlib.sha256(store.url.encode()).hexdigest()[:16]
    return RemoteRoot(store, staging_root() / digest / "root")
