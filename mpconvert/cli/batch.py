"""`mpconvert batch` and `mpconvert batch-merge`: flags in, the batch runner's result out."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .flags import conversion_flags, debug_option, gate_flags, output_flags, policy_option, quiet_option
from .outputs import Outputs, Renderings
from .process import run_action

BATCH_EXIT_HELP = """\b
Exit codes:
  0  every model passed
  1  a model errored or timed out (after all others finished), or the
     manifest or options are invalid (every problem listed)
  2  usage error
  3  some models failed their gate, and none errored
  130  interrupted (Ctrl-C; 143 for SIGTERM): workers are stopped and
     batch.json records what finished
"""


def batch_renderings() -> Renderings:
    from ..render import batch_markdown, render_batch, write_batch_junit

    return Renderings(render_batch, batch_markdown, write_batch_junit)


@click.command("batch", epilog=BATCH_EXIT_HELP)
@click.argument("source", metavar="MANIFEST.toml|DIR", type=click.Path(path_type=Path))
@click.option(
    "--out",
    "root",
    type=click.Path(path_type=Path),
    required=True,
    help="Output root: one folder per model and policy, and batch.json.",
)
@policy_option
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    help="Models converted at once [default: cores, capped by free memory at 3 GiB each].",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds one model may take; then it is stopped and reported timed_out.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Keep every result already complete for identical inputs and options (by content key); redo the rest.",
)
@click.option("--force", is_flag=True, help="Convert again into an output root that holds results.")
@click.option(
    "--shard", metavar="I/N", help="Convert only shard I of N (balanced by model size), for N machines or CI jobs."
)
@click.option(
    "--baseline",
    type=click.Path(path_type=Path),
    help="An earlier batch.json (or its root): fail a model whose metric got worse than there.",
)
@click.option(
    "--max-regression",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Largest allowed worsening against --baseline.",
)
@conversion_flags(given_only=True, exclude=("baseline", "max_regression"))
@gate_flags(stored=False, exclude=("baseline", "max_regression"))
@output_flags("batch summary")
@quiet_option
@debug_option
def batch_command(
    source,
    root,
    policy,
    jobs,
    timeout,
    resume,
    force,
    shard,
    baseline,
    max_regression,
    conversion,
    junit,
    summary,
    as_json,
    quiet,
    debug,
):
    """Convert many models: a TOML manifest, or every model found under DIR.

    Options of the main command given here apply to every model, under what
    the manifest sets itself. Each model converts in its own process.
    """
    outputs = Outputs(junit, summary, as_json, quiet)

    def action() -> int:
        from ..batch.manifest import folder_jobs, load_manifest
        from ..batch.runner import BatchOptions, parse_shard, run_batch
        from ..render import BatchProgress

        given = {**conversion, **({"policy": policy} if policy else {})}
        jobs_list = folder_jobs(source, given) if source.is_dir() else load_manifest(source, given)
        options = BatchOptions(
            root=root,
            jobs=jobs,
            timeout=timeout,
            resume=resume,
            force=force,
            shard=parse_shard(shard) if shard else None,
            baseline=baseline,
            max_regression=max_regression,
        )
        try:
            with BatchProgress(quiet or outputs.stdout_taken, total=len(jobs_list)) as progress:
                result = run_batch(jobs_list, options, progress.event)
        except KeyboardInterrupt as exc:
            click.echo(f"interrupted: workers stopped; {root / 'batch.json'} records what finished", err=True)
            return getattr(exc, "exit_code", 130)
        outputs.emit(result, root / "batch.json", batch_renderings())
        return result["exit_code"]

    sys.exit(run_action(debug, action))


@click.command("batch-merge", epilog=BATCH_EXIT_HELP)
@click.argument("roots", metavar="ROOT...", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Folder for the merged batch.json.")
@output_flags("batch summary")
@quiet_option
@debug_option
def batch_merge_command(roots, out, junit, summary, as_json, quiet, debug):
    """Combine the batch.json of shards (--shard I/N runs) into one summary and exit code."""
    outputs = Outputs(junit, summary, as_json, quiet)

    def action() -> int:
        from ..batch.results import BATCH_NAME, merge, read_batch, write_batch

        merged = merge([read_batch(root) for root in roots])
        out.mkdir(parents=True, exist_ok=True)
        write_batch(out / BATCH_NAME, merged)
        outputs.emit(merged, out / BATCH_NAME, batch_renderings())
        return merged["exit_code"]

    sys.exit(run_action(debug, action))
