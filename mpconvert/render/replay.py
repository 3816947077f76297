"""`mpconvert replay`'s lines: each compared field that moved with both values, then how many held."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, Any

from rich.markup import escape

from mpconvert.render.common import console_for


def _value(value: Any) -> str:
    if isinstance(value, str) and len(value) == 64:  # a sha256: its head is enough to tell two apart
        return value[:12] + "..."
    return "absent" if value is None else str(value)


def render_replay(replayed: Path, out: Path | str, compared: tuple, stream: IO[str] | None = None) -> None:
    """What moved between the report and its replay (`compared`: comparison.Difference for every field)."""
    console = console_for(stream or sys.stdout)
    moved = [d for d in compared if not d.same]
    console.print(f"[bold]replay[/] of {escape(str(replayed))} into {escape(str(out))}")
    for d in moved:
        why = f" (expected: {d.expected})" if d.expected else ""
        console.print(f"  differs: {escape(d.field)}: {escape(_value(d.before))} -> {escape(_value(d.after))}{why}")
    held = len(compared) - len(moved)
    verdict = "every compared figure, hash, version and machine fact is the same" if not moved else "the rest"
    console.print(f"  same: {held} of {len(compared)} compared fields ({verdict})")
