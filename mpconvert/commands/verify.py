"""`mpconvert verify`: an output folder checked on the machine where it will serve.

A conversion is judged where it ran (a CI runner, a CPU box); the artifacts
serve elsewhere, with other library versions, another provider, after a
copy between buckets. Verify trusts nothing it cannot check there:

1. every artifact's bytes against the sha256 report.json recorded (an
   ONNX file's external data files too, and golden.npz's): a changed,
   missing or damaged file fails, named;
2. each SavedModel, ONNX and LiteRT file loaded with the runtimes installed here
   (ONNX Runtime on the provider asked for) and run on the golden rows:
   parity against the converted model's recorded outputs (the gate's own
   tolerance for that artifact kind) and the drift from float32's;
3. each one timed at a serving batch (p50/p90/p99, rows per second) and
   its peak resident memory growth measured while it loaded and ran (an
   ONNX file in a child process, `runners.isolated`: one that aborts ONNX
   Runtime fails its own check, named, and verify goes on);
4. every library version that differs from the conversion's, and both
   machines.

The report's own verdict counts too: a folder whose conversion failed its
gate (judged again on the report's raw figures) is not fit to deploy.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mpconvert.data.signature import Signature
from mpconvert.export.artifacts import parity
from mpconvert.export.formats import FORMATS
from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.options.convert import DEFAULT_SPEED_BATCH
from mpconvert.options.verify import VerifyOptions
from mpconvert.report.compare import compare
from mpconvert.report.golden import read_golden
from mpconvert.report.parity import check_parity
from mpconvert.report.read import read_report, stored_thresholds
from mpconvert.report.report import EXIT_GATE, EXIT_OK, REPORT_NAME, Report, mpconvert_version
from mpconvert.report.schema import SCHEMA_VERSION
from mpconvert.report.sections import Source
from mpconvert.report.sections.details import Details
from mpconvert.report.sections.run import versions
from mpconvert.report.sections.speed import Latency
from mpconvert.runners.isolated import Crashed, Isolated
from mpconvert.runners.measured import Measured, MeasuredRunner
from mpconvert.runners.onnx import ORT_CPU, ORT_CUDA, ORT_TENSORRT, missing_kernel, usable_providers
from mpconvert.speed.kernel_probe import ONEDNN_ENV, onednn_on
from mpconvert.speed.measure import serving_rows
from mpconvert.speed.timing import timed_calls
from mpconvert.system.digests import Digest, digest
from mpconvert.system.errors import MpconvertError, first_line
from mpconvert.system.urls import local_path
from mpconvert.system.writing import write_text

VERIFY_NAME = "verify.json"
BATCH_NAME = "batch.json"
# Timing per artifact: up to CALLS calls after WARMUP, cut to what fits in BUDGET_S (at least MIN_CALLS).
CALLS, MIN_CALLS, WARMUP, BUDGET_S = 50, 5, 2, 5.0
PROVIDERS = {"cpu": ORT_CPU, "cuda": ORT_CUDA, "tensorrt": ORT_TENSORRT}


@dataclass(frozen=True)
class FileCheck:
    """One file of the folder against the sha256 report.json recorded for it."""

    path: str  # relative to the folder
    what: str  # the artifact kind, or "golden rows"
    recorded: str
    found: str | None  # None: the file is not there

    @property
    def passed(self) -> bool:
        return self.found == self.recorded

    @property
    def message(self) -> str:
        if self.found is None:
            return f"{self.path} is missing"
        if not self.passed:
            return f"{self.path} has changed: sha256 {self.recorded[:12]}... recorded, {self.found[:12]}... here"
        return f"{self.path} is as written (sha256 {self.found[:12]}...)"

    def to_json(self) -> dict:
        return {**self.__dict__, "passed": self.passed, "message": self.message}


@dataclass(frozen=True)
class ArtifactRun:
    """One artifact run here on the golden rows, timed and measured; or why it was not run."""

    kind: str
    path: str
    runtime: str | None = None
    parity: dict | None = None  # the gate's artifact parity check, on the golden rows
    # Per output: max |artifact - float32| here, and max |converted - float32| where it was converted.
    drift: dict[str, dict[str, float | None]] = field(default_factory=dict)
    latency: Latency | None = None
    latency_note: str | None = None  # why it was not timed
    memory: dict | None = None
    error: str | None = None  # it could not be loaded or run here
    skipped: str | None = None  # not run, and why (its bytes are not the ones written)
    # Ops the runtime here has no kernel for, run on an emulated copy (parity checked there): the file
    # as written cannot serve on this machine's provider.
    emulated_ops: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        parity_passed = bool(self.parity and self.parity["passed"])
        return self.error is None and self.skipped is None and not self.emulated_ops and parity_passed

    @property
    def message(self) -> str:
        if self.skipped:
            return f"not run: {self.skipped}"
        if self.error:
            return f"cannot run here: {self.error}"
        assert self.parity is not None
        if self.emulated_ops:
            provider = (self.runtime or "").split(" on ")[0]  # "onnxruntime:CPU... on an emulated copy"
            return (
                f"does not run as written on {provider}: it has no kernel here for some of its 16-bit ops "
                f"(parity on a copy that runs {', '.join(self.emulated_ops)} in float32: "
                f"{self.parity['message']}); serve it where its kernels exist (a GPU: --provider cuda), or "
                "verify only what this machine serves (--artifacts savedmodel)"
            )
        return f"on {self.runtime}: {self.parity['message']}"

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "path": self.path,
            "passed": self.passed,
            "message": self.message,
            "runtime": self.runtime,
            "parity": self.parity,
            "drift": self.drift,
            "latency": None if self.latency is None else self.latency.to_json(),
            "latency_note": self.latency_note,
            "memory": self.memory,
            "error": self.error,
            "skipped": self.skipped,
            "emulated_ops": list(self.emulated_ops),
        }


@dataclass(frozen=True)
class Provider:
    """The ONNX Runtime providers asked for, and what happened to the request here."""

    requested: str  # a PROVIDER_WORDS word
    providers: tuple[str, ...]  # what sessions ask for, best first
    note: str | None = None  # a fallback, said

    def to_json(self) -> dict:
        return {"requested": self.requested, "providers": list(self.providers), "note": self.note}


@dataclass(frozen=True)
class Verification:
    """One output folder checked here: its files, its artifacts run, and what differs from where it was made."""

    folder: str
    model: str  # the converted model's name, as the report's source names it
    policy: str
    files: tuple[FileCheck, ...]
    artifacts: tuple[ArtifactRun, ...]
    conversion: dict  # the report's own verdict judged again: {"passed", "failed": [check names]}
    provider: Provider
    speed_batch: int
    golden_rows: int
    chosen: tuple[str, ...]  # --artifacts
    versions: dict[str, dict[str, str | None]]  # package -> {"converted", "here"}, only those that differ
    machine: dict[str, Any]  # {"converted": ..., "here": ...}
    notes: tuple[str, ...] = ()  # what a server here must do that the figures alone do not say

    @property
    def checks(self) -> list[dict]:
        """Every verdict, as the terminal, --junit and verify.json list them."""
        found = [{"name": f"hash: {f.path}", "passed": f.passed, "message": f.message} for f in self.files]
        found += [{"name": f"runs: {a.kind}", "passed": a.passed, "message": a.message} for a in self.artifacts]
        failed = ", ".join(self.conversion["failed"])
        found.append(
            {
                "name": "conversion gate",
                "passed": self.conversion["passed"],
                "message": "the conversion passed its gate"
                if self.conversion["passed"]
                else f"the conversion failed its gate ({failed}): not fit to deploy",
            }
        )
        return found

    @property
    def passed(self) -> bool:
        return all(c["passed"] for c in self.checks)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.passed else EXIT_GATE

    def to_json(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "folder": self.folder,
            "model": self.model,
            "policy": self.policy,
            "passed": self.passed,
            "exit_code": self.exit_code,
            "checks": self.checks,
            "files": [f.to_json() for f in self.files],
            "artifacts": [a.to_json() for a in self.artifacts],
            "conversion": self.conversion,
            "provider": self.provider.to_json(),
            "speed_batch": self.speed_batch,
            "golden_rows": self.golden_rows,
            "artifacts_chosen": list(self.chosen),
            "versions": self.versions,
            "machine": self.machine,
            "notes": list(self.notes),
        }


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


def verify_path(path: str | Path, options: VerifyOptions, *, write: bool = True) -> Verification | BatchVerification:
    """An output folder, or a batch root (a folder with batch.json): every converted model in it."""
    path = local_path(path, "OUT")
    if not path.exists():
        raise MpconvertError(f"{path} not found", hint="give the output folder a conversion (or a batch) wrote")
    provider = choose_provider(options)
    if path.is_dir() and not (path / REPORT_NAME).is_file() and (path / BATCH_NAME).is_file():
        return verify_batch(path, options, provider, write=write)
    found = verify_folder(path, options, provider)
    if write:
        write_verification(found.folder, found.to_json())
    return found


def verify_folder(path: Path, options: VerifyOptions, provider: Provider) -> Verification:
    stored = read_report(path)
    folder = (path if path.is_dir() else path.parent).absolute()
    golden = stored.get("golden")
    written = [a for a in stored["artifacts"] if a.get("path") and a.get("sha256")]
    recorded = [a for a in written if _served(a["kind"], options.artifacts)]
    if golden is None or not written:
        raise MpconvertError(
            f"{folder / REPORT_NAME} records no golden rows or artifact hashes: it was written by an mpconvert "
            "from before `verify`",
            hint="convert the model again with this mpconvert, then verify its folder",
        )
    if not recorded:
        # model.keras comes with the SavedModel export, which --artifacts names.
        kinds = {ArtifactKind.SAVEDMODEL if a["kind"] == ArtifactKind.KERAS else a["kind"] for a in written}
        chosen, present = ",".join(options.artifacts), ",".join(sorted(kinds))
        raise MpconvertError(
            f"{folder} has none of the artifacts asked for ({chosen}): it holds {present}",
            hint=f"verify what the conversion wrote (--artifacts {present}), or convert with --export {chosen}",
        )
    # Each artifact's own file first, then the files it reads beside it (an ONNX file's external data).
    checked_files = [
        [
            _file_check(folder, a["path"], a["kind"], a["sha256"]),
            *(
                _file_check(folder, d["path"], f"{a['kind']} external data", d["sha256"])
                for d in a.get("external_data") or ()
            ),
        ]
        for a in recorded
    ]
    files = [check for checks in checked_files for check in checks]
    golden_file = _file_check(folder, golden["path"], "golden rows", golden["sha256"])
    source = Source.from_json(stored["source"])
    signature = Signature(source.inputs, source.outputs)
    batch = options.speed_batch or (stored.get("speed") or {}).get("batch") or DEFAULT_SPEED_BATCH
    thresholds = stored_thresholds(stored)
    runs = []
    rows = None
    if golden_file.passed:
        rows = read_golden(folder / golden["path"], [s.name for s in source.inputs], [s.name for s in source.outputs])
    for artifact, checks in zip(recorded, checked_files):
        kind = artifact["kind"]
        fmt = FORMATS.get(kind)
        if fmt is None or not fmt.serves:
            continue  # model.keras: hash-checked; serving runs the SavedModel
        checked = next((c for c in checks if not c.passed), checks[0])
        if not checked.passed:
            runs.append(
                ArtifactRun(kind, artifact["path"], skipped=f"{checked.message}; its outputs would mean nothing")
            )
        elif rows is None:
            runs.append(ArtifactRun(kind, artifact["path"], skipped=f"golden rows unusable: {golden_file.message}"))
        else:
            details = fmt.details.from_json(artifact.get("details") or {})
            runner = fmt.open(folder / artifact["path"], details, signature, provider.providers)
            if fmt.isolated:  # what times it is imported before the first run too: not in the figure
                measured: MeasuredRunner = Isolated(runner, preload=(fmt.runtime, timed_calls.__module__))
            else:
                # The runtime is imported before memory is measured, so that an artifact's figure is its own.
                importlib.import_module(fmt.runtime)
                measured = Measured(runner)
            with measured:
                runs.append(_run_artifact(artifact, details, measured, rows, signature, thresholds, batch))
    again = Report.read_back(stored).gate
    return Verification(
        folder=str(folder),
        model=source.name,
        policy=stored["policy"],
        files=(*files, golden_file),
        artifacts=tuple(runs),
        conversion={"passed": again.passed, "failed": [c.name for c in again.failed]},
        provider=provider,
        speed_batch=batch,
        golden_rows=golden["rows"],
        chosen=tuple(options.artifacts),
        versions=_differing_versions(stored.get("versions") or {}),
        machine={
            "converted": (stored.get("provenance") or {}).get("machine"),
            "here": _machine(),
        },
        notes=_notes(stored),
    )


def _notes(stored: Mapping[str, Any]) -> tuple[str, ...]:
    """The conversion found a broken 16-bit kernel under oneDNN's rewrites, and they are on in this process."""
    found = (stored.get("slow_kernel") or {}).get("found")
    if not found or not onednn_on():
        return ()
    slower = found.get("slower")
    figure = f"{slower:g}x float32's time" if isinstance(slower, (int, float)) else "far slower than float32"
    return (
        f"the conversion measured {stored['policy']} at {figure} with TensorFlow's oneDNN rewrites on "
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
    recorded: Mapping[str, Any],
    details: Details,
    runner: MeasuredRunner,
    rows: Any,
    signature: Signature,
    thresholds: Any,
    batch: int,
) -> ArtifactRun:
    """Run one intact artifact on the golden rows: parity, drift, latency and memory, or why it cannot run here."""
    kind, relative = recorded["kind"], recorded["path"]
    try:
        result = runner.run(rows.inputs)
        latency, note = _timed(runner, rows.inputs, batch)
        growth = runner.memory()
    except Crashed as exc:  # the runtime took its child down (or hung): the message names it, the signal, the rows
        return ArtifactRun(kind, relative, error=exc.message)
    except Exception as exc:  # whatever this machine's runtime raises is the finding, not a crash of verify
        return ArtifactRun(kind, relative, error=f"{type(exc).__name__}: {first_line(exc, 300)}")
    memory = None
    if growth is not None:
        where = "the child process that ran it" if isinstance(runner, Isolated) else "this process"
        memory = {
            "rss_growth_bytes": growth.bytes,
            "method": f"peak resident memory (VmHWM) of {where} while it loaded, ran and was timed, less its "
            "resident memory (VmRSS) just before the first run, with the runtime imported and the golden rows "
            "read" + ("" if growth.reset else " (the peak could not be reset: it may be from before)"),
        }
    judged = parity(
        ArtifactKind(kind),
        Path(relative),
        list(rows.converted),
        result.outputs,
        result.checked_with,
        details,
        signature,
        written=Digest(recorded["sha256"], recorded.get("bytes", 0), 1),
    )
    check = check_parity(judged, thresholds, keras_nonfinite=False)
    drift = {
        spec.name: {
            "here": compare([f], [np.asarray(g, dtype=np.float32)]).max_abs_diff,
            "converted": compare([f], [c]).max_abs_diff,
        }
        for spec, f, c, g in zip(signature.outputs, rows.float32, rows.converted, result.outputs)
        if spec.is_float
    }
    return ArtifactRun(
        kind,
        relative,
        runtime=result.checked_with,
        parity={"passed": check.passed, "message": check.message, "values": check.values},
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


def _differing_versions(converted: Mapping[str, str | None]) -> dict[str, dict[str, str | None]]:
    here = {"mpconvert": mpconvert_version(), **versions()}
    return {
        package: {"converted": converted.get(package), "here": here.get(package)}
        for package in sorted(set(converted) | set(here))
        if converted.get(package) != here.get(package)
    }


def _machine() -> dict[str, Any]:
    from mpconvert.speed.hardware import probe_hardware

    return probe_hardware().as_dict()


@dataclass(frozen=True)
class BatchVerification:
    """Every converted model of a batch root, verified; the root's verdict is theirs together."""

    root: str
    models: tuple[dict, ...]  # per model and policy: name, policy, folder, and its verification or error

    @property
    def passed(self) -> bool:
        return bool(self.models) and all(m["passed"] for m in self.models)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.passed else EXIT_GATE

    @property
    def checks(self) -> list[dict]:
        return [
            {"name": f"{m['name']} ({m['policy']})", "passed": m["passed"], "message": m["message"]}
            for m in self.models
        ]

    def to_json(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "root": self.root,
            "passed": self.passed,
            "exit_code": self.exit_code,
            "checks": self.checks,
            "models": list(self.models),
        }


def verify_batch(root: Path, options: VerifyOptions, provider: Provider, *, write: bool = True) -> BatchVerification:
    """Each model and policy of batch.json that was converted (passed or failed its gate), verified in its folder."""
    try:
        summary = json.loads((root / BATCH_NAME).read_text())
        entries = list(summary["models"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MpconvertError(
            f"{root / BATCH_NAME} cannot be read as a batch summary ({exc})",
            hint="give the batch root that `mpconvert batch` wrote",
        ) from None
    models = []
    for entry in entries:
        name, policy = entry.get("name", "?"), entry.get("policy", "?")
        folder = root / entry.get("folder", "")
        base = {"name": name, "policy": policy, "folder": entry.get("folder")}
        if entry.get("status") not in ("passed", "gate_failed"):
            models.append({**base, "passed": False, "message": f"not converted ({entry.get('status')})"})
            continue
        try:
            found = verify_folder(folder, options, provider)
        except MpconvertError as exc:
            models.append({**base, "passed": False, "message": str(exc)})
            continue
        document = found.to_json()
        if write:
            write_verification(found.folder, document)
        failed = [c["name"] for c in found.checks if not c["passed"]]
        message = "verified" if found.passed else "failed: " + ", ".join(failed)
        models.append({**base, "passed": found.passed, "message": message, "verification": document})
    result = BatchVerification(str(root.absolute()), tuple(models))
    if write:
        write_verification(result.root, result.to_json())
    return result


def write_verification(folder: str | Path, document: dict) -> Path:
    path = Path(folder) / VERIFY_NAME
    write_text(path, json.dumps(document, indent=2, allow_nan=False) + "\n", "the verification")
    return path
