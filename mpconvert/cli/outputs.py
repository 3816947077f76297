"""What a command prints and writes once a result exists: the terminal, --json, --summary, --junit."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import click

from mpconvert.system.errors import MpconvertError
from mpconvert.system.urls import is_url


class Result(Protocol):
    """A typed result a command shows (a report, a verification, a batch summary): its JSON form for --json."""

    def to_json(self) -> Any: ...


@dataclass(frozen=True)
class Renderings:
    """How one kind of result is shown: the terminal, Markdown and JUnit."""

    terminal: Callable  # (result, stream, path) -> None
    markdown: Callable  # (result) -> str
    junit: Callable  # (result, path) -> None


def report_renderings() -> Renderings:
    from mpconvert.render import markdown, render_summary, write_junit

    return Renderings(render_summary, markdown, write_junit)


@dataclass(frozen=True)
class Outputs:
    """What to print and write once a result exists (a conversion's, a re-check's, a batch's)."""

    junit: Path | None
    summary: str | None  # a path, or "-" for stdout
    as_json: bool
    quiet: bool

    def __post_init__(self) -> None:
        if self.as_json and self.summary == "-":
            raise click.UsageError("--json and --summary - both write to stdout; give --summary a FILE")
        if self.summary and is_url(self.summary):  # Path() would make it a local folder named "s3:"
            raise click.UsageError("--summary takes a local FILE (or -), not a URL")

    @property
    def stdout_taken(self) -> bool:
        """stdout carries only the JSON or the Markdown when one of them asks for it."""
        return self.as_json or self.summary == "-"

    def emit(self, report: Result, report_path: Path | str | None, renderings: Renderings | None = None) -> None:
        show = renderings or report_renderings()
        if not self.quiet:
            show.terminal(report, sys.stderr if self.stdout_taken else None, report_path)
        try:
            if self.junit:
                show.junit(report, self.junit)
            if self.summary and self.summary != "-":
                path = Path(self.summary)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(show.markdown(report))
        except OSError as exc:
            raise MpconvertError(
                f"cannot write {exc.filename}: {exc.strerror}", hint="choose a writable path for --junit / --summary"
            ) from None
        if self.summary == "-":
            click.echo(show.markdown(report), nl=False)
        if self.as_json:
            click.echo(json.dumps(report.to_json(), indent=2, allow_nan=False))
