"""A batch run's own options (`BatchOptions`), apart from each model's conversion options.

With the other options, not in batch/runner.py, so that the command line
derives `batch`'s flags from the declarations without importing the runner
and what it imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mpconvert.options.keywords import Keyword, check_ranges, keyword, table
from mpconvert.options.signing import SigningOptions
from mpconvert.options.tracking import TrackingOptions
from mpconvert.system.errors import MpconvertError

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class BatchOptions:
    root: Path | str  # a folder, or a URL of object storage (s3://bucket/prefix)
    jobs: int | None = None  # None: default_jobs()
    timeout: float | None = None  # seconds per job
    resume: bool = False
    force: bool = False
    shard: tuple[int, int] | None = None  # (I, N), I from 1
    shard_source: str | None = None  # why this shard: "--shard 1/4", or the scheduler's variables
    command: tuple[str, ...] | None = None  # the batch's command line, in each model's report provenance
    # MLflow: each worker's conversion is a child run of the batch's parent run (its id in parent_run).
    tracking: TrackingOptions | None = None
    # Each model's folder signed by its worker, and the root's batch.json and index.html by the batch.
    signing: SigningOptions = SigningOptions()
    # The gate's --baseline and --max-regression take a report.json; a batch compares whole batches.
    baseline: Path | None = keyword(
        None,
        kind="path",
        help="An earlier batch.json (or its root): fail a model whose metric got worse than there.",
    )
    max_regression: float = keyword(0.0, kind="float", minimum=0, help="Largest allowed worsening against --baseline.")
    executor: str = keyword(
        "local",
        choices=EXECUTORS,
        help="Where the jobs run: local worker processes, or Ray tasks (a cluster at --ray-address or "
        "RAY_ADDRESS, else a local Ray; needs mpconvert[ray]).",
    )
    ray_address: str | None = keyword(
        None,
        default_text="RAY_ADDRESS, else a local Ray",
        help="The Ray cluster for --executor ray: HOST:PORT of its head node, or ray://HOST:PORT (Ray Client).",
    )

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.ray_address and self.executor != "ray":
            raise MpconvertError("--ray-address goes with --executor ray", hint="add --executor ray, or drop it")


# `batch`'s flags that are declared on BatchOptions; they take the place of the gate's flags of the same names.
BATCH_KEYWORDS: dict[str, Keyword] = table(BatchOptions)
