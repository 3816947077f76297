"""Which shard a task is, and how the shards of one root become one batch.json.

A scheduler gives each task an index in its own way: Kubernetes Indexed Jobs
`JOB_COMPLETION_INDEX` (0-based, no count), a Slurm job array
`SLURM_ARRAY_TASK_ID` counted from `SLURM_ARRAY_TASK_MIN` (in steps of
`SLURM_ARRAY_TASK_STEP`) with `SLURM_ARRAY_TASK_COUNT`, anything else
`MPCONVERT_SHARD=I/N`. `--shard auto` reads them; the split itself is
`shard_of`'s, so every task computes the same one from the same manifest.

Shards share a root: each writes its own summary, `ROOT/shards/I-of-N/batch.json`
(rewritten after every job, `finished` once all of its jobs have an outcome).
The task that finds every shard of N finished, after writing its own, writes
the combined `ROOT/batch.json`. The check runs under the root's merge lock
where the root is a local (or network) folder; in object storage there is
none, and none is needed: the merge is a pure function of the finished shard
summaries, each object is written whole, and S3 reads its own writes, so two
shards finishing at once both see all finished and write the same bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mpconvert.batch.results import BATCH_NAME, BatchSummary, merge
from mpconvert.system.errors import MpconvertError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from mpconvert.batch.storage import Root

SHARDS_FOLDER = "shards"
_SHARD_FOLDER = re.compile(r"^(?P<index>\d+)-of-(?P<count>\d+)$")
_ENV_HINT = (
    "run it as a Kubernetes Indexed Job (with --shards N) or a Slurm job array, "
    "set MPCONVERT_SHARD=I/N, or pass --shard I/N"
)


@dataclass(frozen=True)
class Shard:
    index: int  # from 1
    count: int
    source: str  # why this shard: the flag or the variables it came from


def parse_shard(text: str, flag: str = "--shard") -> tuple[int, int]:
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = 0
    if not sep or n < 1 or not 1 <= i <= n:
        raise MpconvertError(f"{flag} {text!r} is not I/N with 1 <= I <= N", hint="e.g. --shard 1/4 ... --shard 4/4")
    return i, n


def _number(environ: Mapping[str, str], name: str, found: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise MpconvertError(
            f"--shard auto: {name}={environ[name]!r} is not a number (found {found})", hint=_ENV_HINT
        ) from None


def _candidates(environ: Mapping[str, str], found: str) -> list[tuple[int, int | None, str]]:
    """(index from 1, count or None, source) from each scheduler whose variables are set."""
    seen: list[tuple[int, int | None, str]] = []
    if "JOB_COMPLETION_INDEX" in environ:
        index = _number(environ, "JOB_COMPLETION_INDEX", found) + 1
        seen.append((index, None, f"JOB_COMPLETION_INDEX={environ['JOB_COMPLETION_INDEX']}"))
    if "SLURM_ARRAY_TASK_ID" in environ:
        names = ["SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN"]
        if "SLURM_ARRAY_TASK_MIN" not in environ:
            raise MpconvertError(
                f"--shard auto: SLURM_ARRAY_TASK_ID is set but not SLURM_ARRAY_TASK_MIN (found {found})",
                hint="Slurm sets both for an array task (sbatch --array); set both to simulate one",
            )
        offset = _number(environ, "SLURM_ARRAY_TASK_ID", found) - _number(environ, "SLURM_ARRAY_TASK_MIN", found)
        step = _number(environ, "SLURM_ARRAY_TASK_STEP", found) if "SLURM_ARRAY_TASK_STEP" in environ else 1
        if step < 1 or offset < 0 or offset % step:
            raise MpconvertError(f"--shard auto: {found} is not a task of its array", hint=_ENV_HINT)
        names += ["SLURM_ARRAY_TASK_STEP"] if step != 1 else []
        count = None
        if "SLURM_ARRAY_TASK_COUNT" in environ:
            count = _number(environ, "SLURM_ARRAY_TASK_COUNT", found)
            names.append("SLURM_ARRAY_TASK_COUNT")
        seen.append((offset // step + 1, count, ", ".join(f"{n}={environ[n]}" for n in names)))
    if "MPCONVERT_SHARD" in environ:
        index, count = parse_shard(environ["MPCONVERT_SHARD"], "MPCONVERT_SHARD")
        seen.append((index, count, f"MPCONVERT_SHARD={environ['MPCONVERT_SHARD']}"))
    return seen


def shard_from_environment(environ: Mapping[str, str], shards: int | None) -> Shard:
    """`--shard auto`: this task's shard from the scheduler's variables, the count from them or `--shards`."""
    names = ("JOB_COMPLETION_INDEX", "MPCONVERT_SHARD")
    found = ", ".join(
        f"{name}={environ[name]}" for name in sorted(environ) if name in names or name.startswith("SLURM_ARRAY_TASK_")
    )
    seen = _candidates(environ, found or "none of them")
    if not seen:
        raise MpconvertError(
            "--shard auto found no shard index: none of JOB_COMPLETION_INDEX, SLURM_ARRAY_TASK_ID "
            "(with SLURM_ARRAY_TASK_MIN) or MPCONVERT_SHARD is set",
            hint=_ENV_HINT,
        )
    indexes = {index for index, _, _ in seen}
    counts = {count for _, count, _ in seen if count is not None} | ({shards} if shards else set())
    sources = [source for _, _, source in seen] + ([f"--shards {shards}"] if shards else [])
    if len(indexes) > 1 or len(counts) > 1:
        raise MpconvertError(
            f"--shard auto: contradictory shard values ({'; '.join(sources)})",
            hint="leave one scheduler's variables set, or make them and --shards agree",
        )
    if not counts:
        raise MpconvertError(
            f"--shard auto: {found} gives this task's index but not the number of shards",
            hint="pass --shards N (a Kubernetes Indexed Job's completions)",
        )
    (index,), (count,) = indexes, counts
    if not 1 <= index <= count:
        raise MpconvertError(
            f"--shard auto: shard {index} of {count} does not exist (from {'; '.join(sources)})", hint=_ENV_HINT
        )
    return Shard(index, count, "; ".join(sources))


def shard_summary_name(index: int, count: int) -> str:
    return f"{SHARDS_FOLDER}/{index}-of-{count}/{BATCH_NAME}"


def shard_summaries(root: Root) -> list[BatchSummary]:
    """The shard summaries a root holds, in shard order (none for an unsharded root)."""
    found = []
    for name in root.list(SHARDS_FOLDER):
        match = _SHARD_FOLDER.match(name)
        if match:
            found.append((int(match["count"]), int(match["index"]), f"{SHARDS_FOLDER}/{name}/{BATCH_NAME}"))
    return [summary for *_, relative in sorted(found) if (summary := root.read_batch(relative)) is not None]


def missing_shards(summaries: list[BatchSummary]) -> list[str]:
    """What keeps shard summaries from being one whole batch: shards not there or not finished."""
    counts = {s.shard[1] for s in summaries if s.shard}
    if len(counts) > 1:
        raise MpconvertError(
            f"the shards come from different splits ({' and '.join(f'{n} shards' for n in sorted(counts))})",
            hint=f"remove the {SHARDS_FOLDER}/ folders of the old split, or merge the shards of one run",
        )
    if not counts:
        return []
    (count,) = counts
    done = {s.shard[0] for s in summaries if s.shard and s.finished}
    return [f"{i}/{count}" for i in range(1, count + 1) if i not in done]


def combine_if_last(root: Root, count: int) -> tuple[BatchSummary | None, list[str]]:
    """After this shard's summary is written: the combined batch.json if every shard has finished.

    Returns (the combined summary or None, the shards still missing).
    """
    with root.merge_lock():
        summaries = [s for s in shard_summaries(root) if (s.shard or (0, 0))[1] == count]
        missing = missing_shards(summaries)
        if missing:
            return None, missing
        combined = merge(summaries)
        root.write_batch(BATCH_NAME, combined)
        return combined, []


def summaries_in(root: Root) -> list[BatchSummary]:
    """What a root holds to merge: its shards' summaries, else its batch.json."""
    summaries = shard_summaries(root)
    if summaries:
        return summaries
    summary = root.read_batch(BATCH_NAME)
    if summary is None:
        raise MpconvertError(
            f"{root.path(BATCH_NAME)} not found, nor any shard's summary",
            hint="give a batch output root (or shard root) that a batch run wrote",
        )
    return [summary]
