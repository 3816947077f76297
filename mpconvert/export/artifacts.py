"""Write an artifact, then re-load and re-run it: the export stage's machinery, shared by every kind.

An artifact is only reported once it has been read back and its outputs
compared with the converted model's on real inputs: a file that was
written but does not load is a failure, not a success. Each kind of model
writes each format its own way (export/formats/); this module checks and
records what they wrote.

One artifact failing (an MpconvertError: tf2onnx cannot convert an op, the
graph is invalid) does not throw the others away: it is reported as failed
with the reason, and the gate's parity check for it fails (exit code 3).
Any other exception is mpconvert's bug and propagates.
"""

from __future__ import annotations

import gc
import logging
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from mpconvert.data.signature import Signature
from mpconvert.onnx.external import data_file_of
from mpconvert.onnx.graph_checks import TooLarge
from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.report.compare import compare, largest
from mpconvert.report.sections import Artifact, ArtifactOutput
from mpconvert.report.sections.artifacts import DataFile, ServedBatch, overall
from mpconvert.report.sections.details import Details, FailedDetails
from mpconvert.runners.base import Runner
from mpconvert.runners.isolated import Crashed
from mpconvert.runners.onnx import EXTENDED
from mpconvert.system.digests import Digest, digest
from mpconvert.system.errors import MpconvertError, NotExportable, WriteError
from mpconvert.system.writing import writing

log = logging.getLogger("mpconvert")

# Bytes of graph, metadata and report beside the weights in an output folder
# (a few hundred KB for the sample models); a floor for the estimate.
OVERHEAD = 1 << 20

# Batches a server sends that the validation rows do not: none (an empty
# request; a -1 beside a 0 in an ONNX Reshape cannot take it), one, and a
# large one, LARGE_BATCH rows or what fits in LARGE_BATCH_BYTES of inputs
# (MobileNetV2 at 224x224: 437 rows), the validation rows repeated.
LARGE_BATCH = 4096
LARGE_BATCH_BYTES = 64 << 20


# One artifact to write: (its kind, its path in the staging folder, write it there and re-check it).
Writer = tuple[ArtifactKind, Path, Callable[[Path], Artifact]]


def large_batch(rows: Sequence[np.ndarray]) -> int:
    # A string input counts 4 bytes per character of its longest string (NumPy's '<U' itemsize): more
    # than the UTF-8 a server receives, so the batch errs small, never past LARGE_BATCH_BYTES.
    per_row = sum(x[:1].nbytes for x in rows) or 1
    return max(2, min(LARGE_BATCH, LARGE_BATCH_BYTES // per_row))


def serving_batches(runner: Runner, rows: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> tuple:
    """`runner` at 0 rows, 1 row and a large batch of `rows` repeated, against `expected` on the same rows.

    Whatever the runtime raises for a batch size is the finding (one line), not a crash: a file that cannot
    take an empty request is an artifact that fails, named, at that size. A runtime that can take its process
    down comes as an `Isolated` runner: its crash is the finding too.
    """
    served = []
    for n in (0, 1, large_batch(rows)):
        take = np.arange(n) % len(rows[0])
        try:
            result = runner.run([x[take] for x in rows])
            got = result.outputs
        except Crashed as exc:
            served.append(ServedBatch(n, exc.message, None))
            continue
        except Exception as exc:  # ONNX Runtime's, TensorFlow's and Keras's own errors alike
            served.append(ServedBatch(n, f"{type(exc).__name__}: {_cause(exc)}", None))
            continue
        wrong = next((g.shape for g in got if g.shape[:1] != (n,)), None)
        if wrong is not None:
            served.append(ServedBatch(n, f"returned an output of shape {tuple(wrong)} for {n} rows", None))
            continue
        note = result.runtime if EXTENDED in result.runtime else None
        served.append(ServedBatch(n, None, compare([e[take] for e in expected], got).max_abs_diff, note))
    return tuple(served)


# Lines of TensorFlow's error text that say where, not what.
_WHERE = (
    "Graph execution error",
    "Detected at node",
    "<stack traces",
    "[[",
    "Arguments received",
    "•",
    "Exception encountered",
)


def _cause(exc: BaseException) -> str:
    """What a runtime's error says went wrong, in one line: TensorFlow's first line is often only "Graph
    execution error:", with the cause some lines below."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith(_WHERE)] or lines
    return " ".join(said[:2])[:400] or type(exc).__name__


def parity(
    kind: ArtifactKind,
    path: Path,
    expected: list,
    got: list,
    runtime: str,
    details: Details,
    signature: Signature,
    written: Digest | None = None,
    batches: tuple[ServedBatch, ...] | None = None,
    data_files: Sequence[Path] = (),
) -> Artifact:
    """An artifact's parity over all outputs; with several outputs, each one's too (by name).

    `written` is the file's digest where the caller has it already (`verify` checked it), else it is taken;
    `batches` what `serving_batches` found; `data_files` the files beside it that it reads (external data).
    """
    # Figures only: the gate judges them against the artifact kind's tolerance (report/parity.py).
    compared = compare(expected, got).outputs
    each = {spec.name: ArtifactOutput(o.max_abs_diff, o.max_abs_ref) for spec, o in zip(signature.outputs, compared)}
    # The whole artifact's figures as a re-check derives them from its outputs' (Artifact.derived).
    whole = overall(each.values())
    outputs = each if len(each) > 1 else None
    written = written or digest(path)
    data = tuple(DataFile(f.name, found.bytes, found.sha256) for f in data_files for found in [digest(f)])
    return Artifact(
        kind,
        path.name,
        written.bytes + sum(d.bytes for d in data),
        whole.max_abs_diff,
        whole.max_abs_ref,
        runtime,
        details,
        outputs=outputs,
        sha256=written.sha256,
        batches=batches,
        rows=len(expected[0]) if expected else None,
        external_data=data or None,
    )


def write_checked(writers: Sequence[Writer], expected: list, needed: int) -> list[Artifact]:
    """Every writer's artifact, written and re-checked, in the writers' order; `needed` bytes must be free for each.

    The ONNX file goes first: it is re-run in a child process, whose memory adds to this one's, and this
    one only grows as the other artifacts re-load (TensorFlow's oneDNN CPU allocator keeps what it frees).
    Checked after the SavedModel and model.keras, a 2.22 GB model's ONNX check peaked at 8.1 GiB (3.9x).
    """
    written: dict[int, Artifact] = {}
    for i in sorted(range(len(writers)), key=lambda i: writers[i][0] is not ArtifactKind.ONNX):
        kind, path, write = writers[i]
        log.info("artifact %s", kind)  # bench/large_model_memory.py follows these within the export
        written[i] = _guarded(kind, path, expected, write, needed)
        # What re-loaded it (a SavedModel's restored variables, a reloaded .keras model: each a whole copy
        # of the weights) is a cycle of TensorFlow objects: freed before the next artifact loads its own.
        gc.collect()
    return [written[i] for i in range(len(writers))]


def _guarded(
    kind: ArtifactKind, path: Path, expected: list, write: Callable[[Path], Artifact], needed: int
) -> Artifact:
    """`write(path)`, or a failed Artifact with the reason when it raises an MpconvertError.

    A half-written file is removed: nothing in the output folder may look
    like an artifact that was not checked (an ONNX file's external data
    beside it too). A full disk (WriteError) fails the whole run instead: no
    other artifact would fit either; so does a model too large for the
    format whatever the settings (TooLarge), with the one line that says
    so and what to export instead, not a failed parity check.
    """
    try:
        with writing(path, f"the {kind} artifact", needed):
            return write(path)
    except (WriteError, TooLarge):
        raise
    except MpconvertError as exc:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
            data_file_of(path).unlink(missing_ok=True)
        reason = str(exc).replace("\n  fix:", "; fix:")
        refused = isinstance(exc, NotExportable)
        return Artifact(
            kind,
            None,
            0,
            None,
            max((largest(e) for e in expected), default=0.0),
            None,
            FailedDetails(reason),
            failed=True,
            reason=reason,
            exportable=not refused,
        )
