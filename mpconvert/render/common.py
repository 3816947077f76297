"""What every rendering shares: the console, number formats, Markdown table cells, the live progress base."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from typing import IO, Any

from rich.console import Console

from mpconvert.report.sections import Artifact, Layer, TokenScores


def console_for(stream: IO[str]) -> Console:
    # Piped output (CI logs, `| grep`) gets whole rows rather than 80 columns.
    return Console(file=stream, highlight=False, soft_wrap=True, width=None if stream.isatty() else 200)


def finite(value: float | None) -> float | None:
    """A figure as report.json holds it: None for what is not finite (`sections.native` writes NaN/inf as null)."""
    return value if value is None or math.isfinite(value) else None


def inner_lines(layers: Iterable[Layer]) -> list[str]:
    """One line per layer with sublayers of its own (report.json's `inside` rows): how many, under which
    policies, and the Softmax layers among them, which take that layer's policy (docs/conversion.md)."""
    by_outer: dict[str, list[Layer]] = {}
    for layer in layers:
        if layer.inside:
            by_outer.setdefault(layer.inside, []).append(layer)
    lines = []
    for outer, rows in by_outer.items():
        policies: dict[str, int] = {}
        for row in rows:
            policies[row.policy or "none"] = policies.get(row.policy or "none", 0) + 1
        counted = ", ".join(f"{n} {policy}" for policy, n in policies.items())
        softmax = [row for row in rows if row.class_name == "Softmax"]
        line = f"{outer}: {len(rows)} layers inside it ({counted})"
        if softmax:
            line += f", its {len(softmax)} Softmax in {', '.join(sorted({row.policy or 'none' for row in softmax}))}"
        lines.append(line)
    return lines


def format_number(value: float | None, digits: int = 4) -> str:
    value = finite(value)
    return "n/a" if value is None else f"{value:.{digits}f}"


def artifact_path(art: Artifact) -> str:
    """An artifact's path, with the files it reads beside it: "model.onnx + model.onnx.data (external data)"."""
    data = [d.path for d in art.external_data or ()]
    return f"{art.path} + {', '.join(data)} (external data)" if data else str(art.path)


def token_line(tokens: TokenScores) -> str:
    """A sequence output's tokens: "1200 tokens (720 padding left out: input 'padding_mask' ...); cross-entropy
    6.98 -> 6.95 (perplexity 1071 -> 1046)"."""
    left_out = f"{tokens.padding} padding left out" + (f": {tokens.padding_from}" if tokens.padding_from else "")
    text = f"{tokens.scored} tokens ({left_out})"
    reference, converted = finite(tokens.reference_cross_entropy), finite(tokens.converted_cross_entropy)
    if reference is not None or converted is not None:
        text += (
            f"; cross-entropy {format_number(reference)} -> {format_number(converted)} (perplexity "
            f"{format_number(tokens.reference_perplexity)} -> {format_number(tokens.converted_perplexity)})"
        )
    return text


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def cell(value: object) -> str:
    # A "|" would end the table cell.
    return str(value).replace("|", "\\|").replace("\n", " ")


def row(*cells: object) -> str:
    return "| " + " | ".join(cell(c) for c in cells) + " |"


class Live:
    """A rich progress display that exists only on an interactive terminal; quiet elsewhere."""

    stderr = False  # which stream it draws on

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.live = not quiet and (sys.stderr if self.stderr else sys.stdout).isatty()
        self.progress: Any = None  # a rich Progress while drawing
        self.task: Any = None

    def columns(self) -> list:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

        return [
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
        ]

    def __enter__(self):
        if self.live:
            from rich.progress import Progress

            console = Console(stderr=self.stderr)
            self.progress = Progress(*self.columns(), console=console, transient=True)
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress:
            self.progress.stop()
