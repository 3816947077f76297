"""`mpconvert verify`: an output folder checked on the machine where it will serve.

A conversion is judged where it ran (a CI runner, a CPU box); the artifacts
serve elsewhere, with other library versions, another provider, after a
copy between buckets. Verify trusts nothing it cannot check there:

0. with --public-key, the folder's signature (model.sig) first: it proves
   who made every file, report.json included, which the hashes alone cannot
   (a forger rewrites the hashes with the files); a folder whose signature
   fails has none of its artifacts loaded;
1. every artifact's bytes against the sha256 report.json recorded (an
   ONNX file's external data files too, and golden.npz's): a changed,
   missing or damaged file fails, named;
2. each SavedModel, ONNX, LiteRT file and OpenVINO IR loaded with the runtimes installed
   here (ONNX Runtime on the provider asked for, OpenVINO on --ov-device) and run on the golden rows:
   parity against the converted model's recorded outputs (the gate's own
   tolerance for that artifact kind) and the drift from float32's;
3. each one timed at a serving batch (p50/p90/p99, rows per second) and
   its peak resident memory growth measured while it loaded and ran (an
   ONNX file and an OpenVINO IR in a child process, `runners.isolated`: one
   that aborts its runtime fails its own check, named, and verify goes on);
4. every library version that differs from the conversion's, and both
   machines.

The report's own verdict counts too: a folder whose conversion failed its
gate (judged again on the report's raw figures) is not fit to deploy.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mpconvert.commands.signature import check_signature
from mpconvert.data.signature import Signature
from mpconvert.export.artifacts import parity
from mpconvert.export.formats import FORMATS
from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.options.convert import DEFAULT_SPEED_BATCH
from mpconvert.options.gate import Thresholds
from mpconvert.options.verify import VerifyOptions
from mpconvert.report.compare import compare
from mpconvert.report.golden import read_golden
from mpconvert.report.parity import check_parity
from mpconvert.report.read import read_report
from mpconvert.report.report import REPORT_NAME, Report, mpconvert_version
from mpconvert.report.sections.artifacts import Artifact
from mpconvert.report.sections.run import versions
from mpconvert.report.sections.speed import Latency
from mpconvert.report.signing import BATCH_SIGNATURE_NAME
from mpconvert.report.verification import (
    VERIFY_NAME,
    ArtifactRun,
    BatchVerification,
    ConversionVerdict,
    Drift,
    FileCheck,
    Machines,
    MemoryGrowth,
    ModelVerification,
    Provider,
    VerifyReport,
    VersionChange,
)
from mpconvert.runners.isolated import Isolated
from mpconvert.runners.measured import Measured, MeasuredRunner
from mpconvert.runners.onnx import ORT_CPU, ORT_CUDA, ORT_TENSORRT, missing_kernel, usable_providers
from mpconvert.speed.hardware import probe_hardware
from mpconvert.speed.kernel_probe import ONEDNN_ENV, onednn_on
from mpconvert.speed.measure import serving_rows
from mpconvert.speed.timing import timed_calls
from mpconvert.system.digests import Digest, digest
from mpconvert.system.errors import MpconvertError, UntrustedFolder, first_line
from mpconvert.system.urls import local_path
from mpconvert.system.writing import write_text

BATCH_NAME = "batch.json"
# Timing per artifact: up to CALLS calls after WARMUP, cut to what fits in BUDGET_S (at least MIN_CALLS).
CALLS, MIN_CALLS, WARMUP, BUDGET_S = 50, 5, 2, 5.0
PROVIDERS = {"cpu": ORT_CPU, "cuda": ORT_CUDA, "tensorrt": ORT_TENSORRT}


def choose_provider(options: VerifyOptions) -> Provider:
    """The ONNX Runtime providers to run on; an explicit one that does not load here fails, unless `fallback`."""
    usable = usable_providers()["usable"]
    if options.provider == "auto":
        return Provider("auto", tuple(usable))
    wanted = PROVIDERS[options.provider]
    if wanted in usable:
        return Provider(options.provider, (wanted, ORT_CPU) if wanted != ORT_CPU else (ORT_CPU,))
    if options.fallback:
        note = f"--provider {options.provider}: {wanted} does not load here; ran on {ORT_CPU} (--fallback)"
        return Provider(options.provider, (ORT_CPU,), note)
    raise MpconvertError(
        f"--provider {options.provider}: ONNX Runtime's {wanted} does not load on this machine "
        f"(it loads: {', '.join(usable)})",
        hint=f"run verify on the machine with {options.provider.upper()}, pass --provider cpu, "
        "or add --fallback to run on the CPU and say so",
    )


def verify_path(path: str | Path, options: VerifyOptions, *, write: bool = True) -> VerifyReport | BatchVerification:
    """An output folder, or a batch root (a folder with batch.json): every converted model in it."""
    path = local_path(path, "OUT")
    if not path.exists():
        raise MpconvertError(f"{path} not found", hint="give the output folder a conversion (or a batch) wrote")
    provider = choose_provider(options)
    if path.is_dir() and not (path / REPORT_NAME).is_file() and (path / BATCH_NAME).is_file():
        return verify_batch(path, options, provider, write=write)
    found = verify_folder(path, options, provider)
    if write:
        write_verification(found.folder, found)
    return found


def verify_folder(path: Path, options: VerifyOptions, provider: Provider) -> VerifyReport:
    folder = (path if path.is_dir() else path.parent).absolute()
    # First: until the signature holds, report.json is only what someone wrote.
    signed = check_signature(folder, options.public_key, options.require_signature)
    trusted = signed is None or signed.passed
    try:
        stored = read_report(path)
    except MpconvertError as exc:
        if trusted:
            raise
        assert signed is not None
        raise UntrustedFolder(
            f"{folder}: the signature fails ({signed.message}), and {exc.message}",
            hint="get the folder again from where it was signed; do not deploy this copy",
        ) from None
    report = Report.from_json(stored)  # judged by the thresholds it stores
    golden = report.golden
    written = [a for a in report.artifacts if a.path and a.sha256]
    recorded = [a for a in written if _served(a.kind, options.artifacts)]
    if golden is None or not written:
        raise MpconvertError(
            f"{folder / REPORT_NAME} records no golden rows or artifact hashes: it was written by an mpconvert "
            "from before `verify`",
            hint="convert the model again with this mpconvert, then verify its folder",
        )
    if not recorded:
        # model.keras comes with the SavedModel export, which --artifacts names.
        kinds = {str(ArtifactKind.SAVEDMODEL if a.kind == ArtifactKind.KERAS else a.kind) for a in written}
        chosen, present = ",".join(options.artifacts), ",".join(sorted(kinds))
        raise MpconvertError(
            f"{folder} has none of the artifacts asked for ({chosen}): it holds {present}",
            hint=f"verify what the conversion wrote (--artifacts {present}), or convert with --export {chosen}",
        )
    checked_files = artifact_files(folder, recorded)
    files = [check for checks in checked_files for check in checks]
    golden_file = _file_check(folder, golden.path, "golden rows", golden.sha256)
    source = report.source
    signature = Signature(source.inputs, source.outputs)
    batch = options.speed_batch or (report.speed.measured.batch if report.speed else None) or DEFAULT_SPEED_BATCH
    runs = []
    rows = None
    if golden_file.passed:
        rows = read_golden(folder / golden.path, [s.name for s in source.inputs], [s.name for s in source.outputs])
    for artifact, checks in zip(recorded, checked_files):
        kind, relative = str(artifact.kind), _written(artifact.path)
        fmt = FORMATS.get(kind)
        if fmt is None or not fmt.serves:
            continue  # model.keras: hash-checked; serving runs the SavedModel
        checked = next((c for c in checks if not c.passed), checks[0])
        if not trusted:  # loading a model file runs what it holds: not one nobody vouches for
            runs.append(ArtifactRun(kind, relative, skipped="the folder's signature failed: its files are not trusted"))
        elif not checked.passed:
            runs.append(ArtifactRun(kind, relative, skipped=f"{checked.message}; its outputs would mean nothing"))
        elif rows is None:
            runs.append(ArtifactRun(kind, relative, skipped=f"golden rows unusable: {golden_file.message}"))
        else:
            missing = _missing(fmt.runtime)
            if missing is not None:
                runs.append(ArtifactRun(kind, relative, error=missing))
                continue
            runner = fmt.open(folder / relative, artifact.details, signature, provider.providers, options.ov_device)
            if fmt.isolated:  # what times it is imported before the first run too: not in the figure
                measured: MeasuredRunner = Isolated(runner, preload=(fmt.runtime, timed_calls.__module__))
            else:
                # The runtime is imported before memory is measured, so that an artifact's figure is its own.
                importlib.import_module(fmt.runtime)
                measured = Measured(runner)
            with measured:
                runs.append(_run_artifact(artifact, measured, rows, signature, report.thresholds, batch))
    again = Report.read_back(stored).gate
    return VerifyReport(
        folder=str(folder),
        model=source.name,
        policy=report.policy,
        files=(*files, golden_file),
        artifacts=tuple(runs),
        conversion=ConversionVerdict(again.passed, tuple(c.name for c in again.failed)),
        provider=provider,
        speed_batch=batch,
        golden_rows=golden.rows,
        chosen=tuple(options.artifacts),
        versions=_differing_versions(report.versions.to_json()),
        machine=Machines(report.provenance.machine if report.provenance else None, probe_hardware()),
        notes=_notes(report),
        signature=signed,
    )


def artifact_files(folder: Path, artifacts: Sequence[Artifact]) -> list[list[FileCheck]]:
    """Each artifact's files against report.json's sha256: its own first, then those it reads beside it."""
    return [
        [
            _file_check(folder, _written(a.path), str(a.kind), _written(a.sha256)),
            *(_file_check(folder, d.path, f"{a.kind} external data", d.sha256) for d in a.external_data or ()),
        ]
        for a in artifacts
    ]


def recorded_files(folder: Path, report: Report) -> list[FileCheck]:
    """Every file report.json recorded a sha256 for (each artifact's, golden.npz), checked against it."""
    checks = [
        c for group in artifact_files(folder, [a for a in report.artifacts if a.path and a.sha256]) for c in group
    ]
    if report.golden is not None:
        checks.append(_file_check(folder, report.golden.path, "golden rows", report.golden.sha256))
    return checks


def _missing(runtime: str) -> str | None:
    """Why the runtime an artifact needs cannot run here (not installed: the openvino extra), or None."""
    if importlib.util.find_spec(runtime) is not None:
        return None
    extra = f" (pip install 'mpconvert[{runtime}]')" if runtime == ArtifactKind.OPENVINO else ""
    return f"the {runtime} package is not installed here{extra}"


def _written(value: str | None) -> str:
    """A path or a hash of an artifact that was written (verify takes only those that record both)."""
    assert value is not None
    return value


def _notes(report: Report) -> tuple[str, ...]:
    """The conversion found a broken 16-bit kernel under oneDNN's rewrites, and they are on in this process."""
    if report.slow_kernel is None or not onednn_on():
        return ()
    slower = report.slow_kernel.found.slower
    figure = f"{slower:g}x float32's time" if isinstance(slower, (int, float)) else "far slower than float32"
    return (
        f"the conversion measured {report.policy} at {figure} with TensorFlow's oneDNN rewrites on "
        f"(report.json slow_kernel), and they are on here ({ONEDNN_ENV} is not 0): on such a CPU, serve with "
        f"{ONEDNN_ENV}=0",
    )


def _served(kind: str, chosen: Sequence[str]) -> bool:
    """Whether an artifact is among those `--artifacts` chose: model.keras comes with the SavedModel export."""
    return kind in chosen or (kind == ArtifactKind.KERAS and ArtifactKind.SAVEDMODEL in chosen)


def _file_check(folder: Path, relative: str, what: str, recorded: str) -> FileCheck:
    path = folder / relative
    found: Digest | None = digest(path) if path.exists() else None
    return FileCheck(relative, what, recorded, None if found is None else found.sha256)


def _run_artifact(
    recorded: Artifact, runner: MeasuredRunner, rows: Any, signature: Signature, thresholds: Thresholds, batch: int
) -> ArtifactRun:
    """Run one intact artifact on the golden rows: parity, drift, latency and memory, or why it cannot run here."""
    kind, relative = str(recorded.kind), _written(recorded.path)
    try:
        result = runner.run(rows.inputs)
        latency, note = _timed(runner, rows.inputs, batch)
        growth = runner.memory()
    except MpconvertError as exc:  # its child died or hung (Crashed), or the runtime refused the device: named
        return ArtifactRun(kind, relative, error=exc.message)
    except Exception as exc:  # whatever this machine's runtime raises is the finding, not a crash of verify
        return ArtifactRun(kind, relative, error=f"{type(exc).__name__}: {first_line(exc, 300)}")
    memory = None
    if growth is not None:
        where = "the child process that ran it" if isinstance(runner, Isolated) else "this process"
        memory = MemoryGrowth(
            growth.bytes,
            f"peak resident memory (VmHWM) of {where} while it loaded, ran and was timed, less its resident "
            "memory (VmRSS) just before the first run, with the runtime imported and the golden rows read"
            + ("" if growth.reset else " (the peak could not be reset: it may be from before)"),
        )
    judged = parity(
        ArtifactKind(kind),
        Path(relative),
        list(rows.converted),
        result.outputs,
        result.checked_with,
        recorded.details,
        signature,
        written=Digest(_written(recorded.sha256), recorded.bytes, 1),
    )
    check = check_parity(judged, thresholds, keras_nonfinite=False)
    drift = {
        spec.name: Drift(compare([f], [np.asarray(g, dtype=np.float32)]).max_abs_diff, compare([f], [c]).max_abs_diff)
        for spec, f, c, g in zip(signature.outputs, rows.float32, rows.converted, result.outputs)
        if spec.is_float
    }
    return ArtifactRun(
        kind,
        relative,
        runtime=result.checked_with,
        parity=check,
        drift=drift,
        latency=latency,
        latency_note=note,
        memory=memory,
        emulated_ops=tuple(result.promoted_ops),
    )


def _timed(runner: MeasuredRunner, inputs: Sequence[np.ndarray], batch: int) -> tuple[Latency | None, str | None]:
    """The serving batch timed where the artifact runs (in its child for an ONNX file: no pipe in the figures)."""
    feeds = serving_rows([np.asarray(x) for x in inputs], batch)
    timing = functools.partial(timed_calls, repeats=CALLS, budget_s=BUDGET_S, warmup=WARMUP, min_rounds=MIN_CALLS)
    try:
        calls = runner.timed(feeds, timing, calls=WARMUP + MIN_CALLS)
    except Exception as exc:
        if not missing_kernel(exc):
            raise
        return None, (
            f"does not run as written on {runner.runtime} ({first_line(exc, 200)}); not timed on an emulated "
            "copy, which would time float32 arithmetic"
        )
    return Latency.of(calls, batch), None


def _differing_versions(converted: Mapping[str, str | None]) -> dict[str, VersionChange]:
    here = {"mpconvert": mpconvert_version(), **versions()}
    return {
        package: VersionChange(converted.get(package), here.get(package))
        for package in sorted(set(converted) | set(here))
        if converted.get(package) != here.get(package)
    }


def verify_batch(root: Path, options: VerifyOptions, provider: Provider, *, write: bool = True) -> BatchVerification:
    """Each model and policy of batch.json that was converted (passed or failed its gate), verified in its folder."""
    try:  # batch.json's entries, read here by the few keys verify needs (batch/ is a layer above this one)
        summary = json.loads((root / BATCH_NAME).read_text())
        entries = list(summary["models"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MpconvertError(
            f"{root / BATCH_NAME} cannot be read as a batch summary ({exc})",
            hint="give the batch root that `mpconvert batch` wrote",
        ) from None
    models = []
    for entry in entries:
        name, policy, relative = entry.get("name", "?"), entry.get("policy", "?"), entry.get("folder")
        if entry.get("status") not in ("passed", "gate_failed"):
            models.append(ModelVerification(name, policy, relative, False, f"not converted ({entry.get('status')})"))
            continue
        try:
            found = verify_folder(root / (relative or ""), options, provider)
        except MpconvertError as exc:
            models.append(ModelVerification(name, policy, relative, False, str(exc)))
            continue
        if write:
            write_verification(found.folder, found)
        failed = [c.name for c in found.checks if not c.passed]
        message = "verified" if found.passed else "failed: " + ", ".join(failed)
        models.append(ModelVerification(name, policy, relative, found.passed, message, found))
    signature = check_signature(root.absolute(), options.public_key, options.require_signature, BATCH_SIGNATURE_NAME)
    result = BatchVerification(str(root.absolute()), tuple(models), signature)
    if write:
        write_verification(result.root, result)
    return result


def write_verification(folder: str | Path, found: VerifyReport | BatchVerification) -> Path:
    """verify.json: the verification's JSON form, made here."""
    path = Path(folder) / VERIFY_NAME
    write_text(path, json.dumps(found.to_json(), indent=2, allow_nan=False) + "\n", "the verification")
    return path
