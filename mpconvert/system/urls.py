"""Telling a URL from a path, and refusing the URLs mpconvert cannot honour.

Only outputs (`--out` of the main command and of `batch`, the API's
`Conversion.save`) may be object storage. Every other place a file is named
(the model, --data, --baseline, a MANIFEST, a REPORT, --junit/--summary/--html)
reads or writes local files only; `pathlib.Path("s3://b/x")` is the relative
path `s3:/b/x`, so a URL there would quietly become a local folder named
`s3:`. `local_path` refuses it instead.

No message here ever repeats a URL's user:password part.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from mpconvert.system.errors import MpconvertError

# Web servers take no uploads through a plain PUT of a folder: an http(s) output would be read-only at best.
_READ_ONLY = ("http", "https")


# What pathlib leaves of a URL: Path("s3://b/x") is "s3:/b/x".
_COLLAPSED = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")


def is_url(text: str | Path) -> bool:
    """True for `scheme://...` (the `file` scheme and a Windows drive letter are paths)."""
    if isinstance(text, Path):  # a URL that went through pathlib, as click.Path hands it over
        return bool(_COLLAPSED.match(str(text))) and not str(text).lower().startswith("file:")
    scheme = urlsplit(text).scheme
    return "://" in text and len(scheme) > 1 and scheme != "file"


def without_credentials(url: str) -> str:
    """The URL as it may be printed and written: no user:password, no query, no trailing slash."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


def output_url(url: str, flag: str = "--out") -> str:
    """A URL an output may go to, checked; refuses credentials in it and read-only schemes."""
    parts = urlsplit(url)
    label = without_credentials(url)
    if "@" in parts.netloc:
        raise MpconvertError(
            f"{flag} {label}: the URL carries credentials (user:password@); they were not used",
            hint="remove them from the URL and give them where the storage library reads them "
            "(for S3: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or ~/.aws); a URL ends up in logs and reports",
        )
    if parts.scheme.lower() == "memory":
        raise MpconvertError(
            f"{flag} {label}: fsspec's memory file system ends with the process, so the output would be lost",
            hint="give a local folder or object storage (s3://bucket/prefix)",
        )
    if parts.scheme.lower() in _READ_ONLY:
        raise MpconvertError(
            f"{flag} {label}: mpconvert cannot write to an {parts.scheme} URL",
            hint="give a local folder, or object storage (s3://bucket/prefix; gs://, az:// with their fsspec package)",
        )
    if not parts.netloc or not parts.path.strip("/"):
        raise MpconvertError(
            f"{flag} {label}: the URL names no bucket and prefix",
            hint=f"give {flag} {parts.scheme}://BUCKET/PREFIX (a prefix of its own for each output)",
        )
    return label


def local_path(given: str | Path, what: str) -> Path:
    """`given` as a local path; a URL is refused (these inputs and outputs are read and written locally)."""
    if is_url(given):
        raise MpconvertError(
            f"{what} {without_credentials(str(given).replace(':/', '://', 1) if isinstance(given, Path) else given)} is a URL; it must be a local path",
            hint=f"copy it to this machine first (e.g. aws s3 cp / gsutil cp) and give its local path as {what}",
        )
    return Path(given)
