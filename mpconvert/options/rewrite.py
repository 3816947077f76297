"""Which layers run in 16 bits: the policy and the layers kept float32 by hand (`RewriteOptions`), or by the
numeric lint and the search (`AutoKeepOptions`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from mpconvert.options.keywords import check_ranges, keyword
from mpconvert.options.precision import Precision
from mpconvert.system.errors import MpconvertError


class AutoKeepMode(StrEnum):
    """How much of automatic float32 runs (keras/autokeep.py)."""

    OFF = "off"  # the gate fails and says so
    LINT = "lint"  # keep what the numeric lint flags
    SEARCH = "search"  # and search for what fixes a failing accuracy or agreement check


@dataclass(frozen=True)
class RewriteOptions:
    policy: str
    keep_float32: tuple[str, ...] = keyword(
        (),
        kind="strings",
        metavar="REGEX",
        help="Keep layers whose whole name or class name matches REGEX in float32 (repeatable); for a "
        "SavedModel without Keras metadata (converted at graph level), nodes whose whole name or op type "
        "matches.",
    )
    # Layers kept float32 by the numeric lint or the search: (layer path, why).
    # Set by the pipeline, not by users (they have keep_float32).
    auto_keep: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        Precision.of(self.policy)  # refuses an unknown policy, naming the valid ones
        for pattern in self.keep_float32:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise MpconvertError(
                    f"--keep-float32 {pattern!r} is not a valid regular expression ({exc})",
                    hint="escape special characters, e.g. --keep-float32 'conv2d_1' or 'block\\d+_.*'",
                ) from None


AUTO_KEEP_MODES = tuple(mode.value for mode in AutoKeepMode)
# A few minutes: far below what node-level bisection costs (52 attempts took
# 16 minutes in onnxmltools PR 543), enough for ~2 log2(L) trials of a
# model of a few hundred layers on 2 cores.
DEFAULT_SEARCH_BUDGET = 180.0
# The search gives up rather than keep more than this share of the
# convertible layers float32: past it, mixed precision buys little.
MAX_SEARCH_SHARE = 0.5
# Calibration rows the lint runs the float32 model on.
LINT_ROWS = 256


@dataclass(frozen=True)
class AutoKeepOptions:
    mode: AutoKeepMode = keyword(
        AutoKeepMode.SEARCH.value,
        name="auto_keep",
        choices=AUTO_KEEP_MODES,
        help="Keep float32 where 16 bits break: lint (what the numeric lint flags), search (also search for the "
        "layers that fix a failing accuracy or agreement check), off (the gate fails and says so).",
    )
    search_budget: float = keyword(
        DEFAULT_SEARCH_BUDGET,
        kind="float",
        minimum=0,
        minimum_open=True,
        rule_note="(seconds)",
        metavar="SECONDS",
        help="Longest the accuracy-driven search may take.",
    )

    def __post_init__(self) -> None:
        check_ranges(self)
        # Every door gives the mode as a string; the stages compare members.
        object.__setattr__(self, "mode", AutoKeepMode(self.mode))
