"""A conversion's one options object (`ConvertOptions`): each stage's options, the speed stage's, the seed,
and the batch cache key computed from them.

Nothing below the CLI sees click: each stage takes the one options object it
needs. Validation of values that click cannot express (regexes, paths that
must not overlap) happens in each options class, once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

from mpconvert.options.export import ExportOptions
from mpconvert.options.finetune import FinetuneOptions
from mpconvert.options.gate import GateOptions
from mpconvert.options.keywords import Keyword, check_ranges, key_fields, keyword, table
from mpconvert.options.load import LoadOptions
from mpconvert.options.pad import PadOptions
from mpconvert.options.precision import Precision
from mpconvert.options.rewrite import AutoKeepOptions, RewriteOptions
from mpconvert.options.validate import ValidateOptions
from mpconvert.system.digests import content_sha256

# The speed stage's serving batch: large enough that a Dense(4096) layer is
# bound by arithmetic, not call overhead (speed/measure.py's SPEED_BATCH).
DEFAULT_SPEED_BATCH = 256

# `mpconvert doctor MODEL --budget`: keras.applications-sized models trace
# and run a batch of 256 in seconds on 2 cores; a minute leaves room for
# three of them, each timed a few times.
DEFAULT_DOCTOR_BUDGET_S = 60.0


@dataclass(frozen=True)
class ConvertOptions:
    """Everything an in-memory conversion needs; writing is SaveOptions'."""

    load: LoadOptions
    rewrite: RewriteOptions
    validate: ValidateOptions = ValidateOptions()
    finetune: FinetuneOptions = FinetuneOptions()
    pad: PadOptions = PadOptions()
    gate: GateOptions = GateOptions()
    auto_keep: AutoKeepOptions = AutoKeepOptions()
    speed: bool = keyword(
        True,
        kind="bool",
        help="Time the converted model against float32 on this machine (a few seconds; report.json speed).",
    )
    speed_batch: int = keyword(
        DEFAULT_SPEED_BATCH,
        kind="int",
        minimum=1,
        metavar="N",
        help="Rows per timed call of the speed stage and --bench-onnx, a serving batch; the data's rows are "
        "repeated when it has fewer.",
    )
    # One seed for the whole conversion: the stages that draw numbers (the
    # generated inputs, fine-tuning) take it as an argument.
    seed: int = keyword(0, kind="int", help="Seed for fine-tuning and generated inputs.")

    def __post_init__(self) -> None:
        check_ranges(self)

    @property
    def precision(self) -> Precision:
        return Precision.of(self.rewrite.policy)

    def cache_key(self, export: ExportOptions, versions: Mapping[str, str | None]) -> str:
        """A batch result's key: what it was computed from, by content.

        A hash of the model's files, every field of these options and of
        `export` (the files they name by content) and `versions` (mpconvert's
        and the frameworks'). The fields are walked, not listed, so an option
        added to an options class is in the key from the start; the few that
        cannot change a result are declared so (`keyed=False`). Paths are not
        part of it (files count by content), so the same model and data under
        another folder, on another machine or in another CI run has the same
        key: a shared output root works as a team-wide cache. A changed model,
        option or TensorFlow version gives another key, and converts again.
        """
        assert self.load.path is not None, "a cache key needs the model as a file or folder"
        content = {
            "model": content_sha256(self.load.path),
            "options": key_fields(self, content_sha256),
            "export": key_fields(export, content_sha256),
            "versions": dict(versions),
        }
        # No default=str: a value JSON cannot spell would be keyed by its repr, which may hide a change.
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


# Every option of a conversion, in the order --help and docs/options.md list
# them; the gate's are also a table of their own (gate.GATE_KEYWORDS: `check`
# takes them alone), and the export's are export.EXPORT_KEYWORDS.
CONVERSION_KEYWORDS: dict[str, Keyword] = table(
    ValidateOptions,
    RewriteOptions,
    AutoKeepOptions,
    FinetuneOptions,
    PadOptions,
    LoadOptions,
    ConvertOptions,
    GateOptions,
)
