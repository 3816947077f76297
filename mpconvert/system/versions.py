"""Comparing library versions: whether a file was written by a newer release than the one installed."""

from __future__ import annotations

import re


def major_minor(version: str) -> tuple[int, int] | None:
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def newer_version(saved: str, installed: str) -> bool:
    """Whether `saved` ("9.0.0") is a newer major or minor version than `installed`; False when either is unreadable.

    Patch releases do not change what a file may hold, so they do not count.
    """
    written, running = major_minor(saved), major_minor(installed)
    return written is not None and running is not None and written > running
