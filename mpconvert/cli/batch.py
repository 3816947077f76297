"""`mpconvert batch` and `mpconvert batch-merge`: flags in, the batch runner's result out."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from mpconvert.batch.runner import BatchRun
    from mpconvert.batch.shards import Shard
    from mpconvert.export.tracking import ParentRun
    from mpconvert.options.tracking import TrackingOptions

from mpconvert.cli.failures import command_line, run_action
from mpconvert.cli.flags import (
    LocalPath,
    conversion_flags,
    debug_option,
    gate_flags,
    keyword_flags,
    output_flags,
    policy_option,
    quiet_option,
    signing_flags,
    tracking_flags,
)
from mpconvert.cli.outputs import Outputs, Renderings
from mpconvert.options.batch import BATCH_KEYWORDS, BatchOptions

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
    from mpconvert.render import batch_markdown, render_batch, write_batch_junit

    return Renderings(render_batch, batch_markdown, write_batch_junit)


@click.command("batch", epilog=BATCH_EXIT_HELP)
@click.argument("source", metavar="MANIFEST.toml|DIR", type=LocalPath())
@click.option(
    "--out",
    "root",
    metavar="ROOT|URL",
    required=True,
    help="Output root: one folder per model and policy, and batch.json; a folder, or s3://bucket/prefix "
    "(pip install mpconvert[s3]).",
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
    "--shard",
    metavar="I/N|auto",
    help="Convert only shard I of N (balanced by model size), for N machines or CI jobs; auto: I and N from "
    "the scheduler (JOB_COMPLETION_INDEX, SLURM_ARRAY_TASK_ID, MPCONVERT_SHARD).",
)
@click.option(
    "--shards",
    type=click.IntRange(min=1),
    help="The number of shards, for --shard auto where the scheduler gives only the index (Kubernetes).",
)
@keyword_flags(BATCH_KEYWORDS.values())
@conversion_flags(given_only=True, exclude=tuple(BATCH_KEYWORDS))
@gate_flags(stored=False, exclude=tuple(BATCH_KEYWORDS))
@tracking_flags
@signing_flags
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
    shards,
    conversion,
    tracking,
    signing,
    junit,
    summary,
    as_json,
    quiet,
    debug,
    **declared,  # BATCH_KEYWORDS' flags
):
    """Convert many models: a TOML manifest, or every model found under DIR.

    Options of the main command given here apply to every model, under what
    the manifest sets itself. Each model converts in its own process. With
    --mlflow the batch is a parent run and each conversion a child run. With
    --sign-key each model's folder is signed, and the root's batch.json and
    index.html by batch.sig.
    """
    outputs = Outputs(junit, summary, as_json, quiet)

    def action() -> int:
        from mpconvert.api import signing_options, tracking_options
        from mpconvert.batch.manifest import folder_jobs, load_manifest
        from mpconvert.batch.runner import run_batch
        from mpconvert.render import BatchProgress

        chosen = _shard(shard, shards)
        given = {**conversion, **({"policy": policy} if policy else {})}
        jobs_list = folder_jobs(source, given) if source.is_dir() else load_manifest(source, given)
        parent = _parent_run(tracking_options(**tracking), source, chosen, quiet)
        options = BatchOptions(
            root=root,
            jobs=jobs,
            timeout=timeout,
            resume=resume,
            force=force,
            shard=(chosen.index, chosen.count) if chosen else None,
            shard_source=chosen.source if chosen else None,
            command=command_line(),
            tracking=parent.options if parent else None,
            signing=signing_options(**signing),
            **declared,
        )
        if options.signing.enabled and not quiet:
            from mpconvert.commands.signature import load_signer

            for warning in getattr(load_signer(options.signing), "warnings", ()):
                click.echo(f"warning: {warning}", err=True)
        if chosen and not quiet:
            click.echo(f"shard {chosen.index}/{chosen.count} from {chosen.source}", err=True)
        try:
            with BatchProgress(quiet or outputs.stdout_taken, total=len(jobs_list)) as progress:
                run = run_batch(jobs_list, options, progress.event)
        except KeyboardInterrupt as exc:
            if parent:
                parent.fail()
            click.echo("interrupted: workers stopped; the batch summary records what finished", err=True)
            return getattr(exc, "exit_code", 130)
        except BaseException:
            if parent:
                parent.fail()
            raise
        if parent:
            _finish_parent(parent, run, root)
        if chosen is not None and run.combined and not quiet:
            click.echo(f"shard {chosen.index}/{chosen.count} finished last: {run.path} combines all shards", err=True)
        outputs.emit(run.result, run.path, batch_renderings())
        if chosen is not None and run.waiting and not quiet:
            click.echo(
                f"shard {chosen.index}/{chosen.count} finished; waiting for shard(s) {', '.join(run.waiting)}: "
                "the last to finish writes the combined batch.json (or run mpconvert batch-merge ROOT)",
                err=True,
            )
        return run.result.exit_code

    sys.exit(run_action(debug, action))


def _parent_run(tracking: TrackingOptions, source: Path, chosen: Shard | None, quiet: bool) -> ParentRun | None:
    """The batch's MLflow parent run, made after the server's check and before any worker starts; None untracked."""
    if not tracking.enabled:
        return None
    from mpconvert.export.tracking import parent_run
    from mpconvert.system.hooks import Hooks

    def say(prefix: str):
        return (lambda text: None) if quiet else (lambda text: click.echo(prefix + text, err=True))

    name = f"batch {source.name}" + (f" (shard {chosen.index}/{chosen.count})" if chosen else "")
    return parent_run(tracking, name, Hooks(warning=say("warning: "), note=say("")))


def _finish_parent(parent: ParentRun, run: BatchRun, root: str) -> None:
    """batch.json and index.html on the parent run: the root's own files, or for object storage a local rendering."""
    import tempfile

    from mpconvert.batch.results import BATCH_NAME, write_batch
    from mpconvert.batch.storage import is_url
    from mpconvert.render.html import INDEX_HTML, write_batch_page

    if not is_url(root):
        summary = Path(run.path)  # a shard that did not finish last has only its own summary, and no page
        page = (summary.parent / INDEX_HTML,) if summary.name == BATCH_NAME else ()
        parent.finish(run.result, (summary, *page))
        return
    with tempfile.TemporaryDirectory(prefix="mpconvert-batch-page-") as tmp:
        write_batch(Path(tmp) / BATCH_NAME, run.result)
        write_batch_page(run.result, Path(tmp))
        parent.finish(run.result, (Path(tmp) / BATCH_NAME, Path(tmp) / INDEX_HTML))


def _shard(shard: str | None, shards: int | None) -> Shard | None:
    """This run's shard: --shard I/N, or --shard auto from the scheduler's variables; None unsharded."""
    import os

    from mpconvert.batch.shards import Shard, parse_shard, shard_from_environment
    from mpconvert.system.errors import MpconvertError

    if shard == "auto":
        return shard_from_environment(os.environ, shards)
    if shard is None:
        if shards:
            raise click.UsageError("--shards N goes with --shard auto")
        return None
    index, count = parse_shard(shard)
    if shards and shards != count:
        raise MpconvertError(f"--shard {shard} and --shards {shards} disagree", hint="give one of them")
    return Shard(index, count, f"--shard {shard}")


@click.command("batch-merge", epilog=BATCH_EXIT_HELP)
@click.argument("roots", metavar="ROOT...", nargs=-1, required=True)
@click.option(
    "--out",
    metavar="DIR|URL",
    help="Where to write the merged batch.json [default: the root, when one shared root is given].",
)
@output_flags("batch summary")
@quiet_option
@debug_option
def batch_merge_command(roots, out, junit, summary, as_json, quiet, debug):
    """Combine the shards of a batch into one summary and exit code: one root they shared, or a root per shard."""
    outputs = Outputs(junit, summary, as_json, quiet)
    if out is None and len(roots) > 1:
        raise click.UsageError("several roots: give --out for the merged batch.json")

    def action() -> int:
        from mpconvert.batch.results import BATCH_NAME, BatchSummary, merge, read_batch
        from mpconvert.batch.shards import missing_shards, summaries_in
        from mpconvert.batch.storage import is_url, open_root
        from mpconvert.system.errors import MpconvertError

        def given(root: str) -> list[BatchSummary]:  # a root (folder or URL), or a batch.json file itself
            return (
                [read_batch(Path(root))] if not is_url(root) and Path(root).is_file() else summaries_in(open_root(root))
            )

        summaries = [s for root in roots for s in given(root)]
        missing = missing_shards(summaries)
        if missing:
            raise MpconvertError(
                f"shard(s) {', '.join(missing)} have not finished (or are not in {', '.join(roots)})",
                hint="run them (with --resume they redo nothing finished), then merge again",
            )
        merged = merge(summaries)
        first = roots[0]
        home = Path(first).parent if not is_url(first) and Path(first).is_file() else first
        target = open_root(out or home)
        target.write_batch(BATCH_NAME, merged)
        outputs.emit(merged, target.path(BATCH_NAME), batch_renderings())
        return merged.exit_code

    sys.exit(run_action(debug, action))
