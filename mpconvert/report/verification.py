"""verify.json as typed values: an output folder (or a batch root) checked on the machine where it will serve.

`commands/verify.py` does the checking and builds these; the renderings
(render/verify.py) and the API read them. verify.json is `to_json()`, made
where the file is written; nothing reads one back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mpconvert.report.checks import Check
from mpconvert.report.report import EXIT_GATE, EXIT_OK
from mpconvert.report.schema import SCHEMA_VERSION
from mpconvert.report.sections import Hardware, native
from mpconvert.report.sections.speed import Latency
from mpconvert.report.signing import SignatureCheck

VERIFY_NAME = "verify.json"


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

    @property
    def check(self) -> Check:
        return Check(f"hash: {self.path}", self.passed, self.message)

    def to_json(self) -> dict:
        return {**self.__dict__, "passed": self.passed, "message": self.message}


@dataclass(frozen=True)
class Drift:
    """One output's drift from float32 on the golden rows: the artifact's here, the converted model's then."""

    here: float | None  # max |artifact - float32| on this machine; None when not finite
    converted: float | None  # max |converted - float32| where it was converted

    def to_json(self) -> dict[str, float | None]:
        return {"here": native(self.here), "converted": native(self.converted)}


@dataclass(frozen=True)
class MemoryGrowth:
    """How much an artifact grew this process's resident memory while it loaded, ran and was timed."""

    rss_growth_bytes: int
    method: str

    def to_json(self) -> dict[str, Any]:
        return {"rss_growth_bytes": self.rss_growth_bytes, "method": self.method}


@dataclass(frozen=True)
class ArtifactRun:
    """One artifact run here on the golden rows, timed and measured; or why it was not run."""

    kind: str
    path: str
    runtime: str | None = None
    parity: Check | None = None  # the gate's artifact parity check, on the golden rows
    # Per output: max |artifact - float32| here, and max |converted - float32| where it was converted.
    drift: Mapping[str, Drift] = field(default_factory=dict)
    latency: Latency | None = None
    latency_note: str | None = None  # why it was not timed
    memory: MemoryGrowth | None = None
    error: str | None = None  # it could not be loaded or run here
    skipped: str | None = None  # not run, and why (its bytes are not the ones written)
    # Ops the runtime here has no kernel for, run on an emulated copy (parity checked there): the file
    # as written cannot serve on this machine's provider.
    emulated_ops: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        parity_passed = bool(self.parity and self.parity.passed)
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
                f"{self.parity.message}); serve it where its kernels exist (a GPU: --provider cuda), or "
                "verify only what this machine serves (--artifacts savedmodel)"
            )
        return f"on {self.runtime}: {self.parity.message}"

    @property
    def check(self) -> Check:
        """Its verdict, as the terminal, --junit and verify.json list it."""
        return Check(f"runs: {self.kind}", self.passed, self.message)

    def to_json(self) -> dict:
        parity = None
        if self.parity is not None:  # the check, less its name: the artifact names it
            judged = self.parity.to_json()
            parity = {"passed": judged["passed"], "message": judged["message"], "values": judged["values"]}
        return {
            "kind": self.kind,
            "path": self.path,
            "passed": self.passed,
            "message": self.message,
            "runtime": self.runtime,
            "parity": parity,
            "drift": {name: d.to_json() for name, d in self.drift.items()},
            "latency": None if self.latency is None else self.latency.to_json(),
            "latency_note": self.latency_note,
            "memory": None if self.memory is None else self.memory.to_json(),
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
class ConversionVerdict:
    """The report's own verdict, judged again on its raw figures: a failed conversion is not fit to deploy."""

    passed: bool
    failed: tuple[str, ...]  # the names of its failing checks

    @property
    def check(self) -> Check:
        if self.passed:
            return Check("conversion gate", True, "the conversion passed its gate")
        failed = ", ".join(self.failed)
        return Check("conversion gate", False, f"the conversion failed its gate ({failed}): not fit to deploy")

    def to_json(self) -> dict:
        return {"passed": self.passed, "failed": list(self.failed)}


@dataclass(frozen=True)
class VersionChange:
    """A library whose version here is not the conversion's (None: not installed there, or here)."""

    converted: str | None
    here: str | None

    def to_json(self) -> dict[str, str | None]:
        return {"converted": self.converted, "here": self.here}


@dataclass(frozen=True)
class Machines:
    """The machine the conversion ran on (None in reports from before it was recorded) and this one."""

    converted: Hardware | None
    here: Hardware

    def to_json(self) -> dict:
        return {"converted": None if self.converted is None else self.converted.to_json(), "here": self.here.to_json()}


def _lines(checks: Sequence[Check]) -> list[dict]:
    """verify.json's checks: each verdict's name, result and message (its figures are in the sections)."""
    return [{"name": c.name, "passed": c.passed, "message": c.message} for c in checks]


@dataclass(frozen=True)
class VerifyReport:
    """One output folder checked here: its files, its artifacts run, and what differs from where it was made.

    verify.json's content is `to_json()`, made where the file is written.
    """

    folder: str
    model: str  # the converted model's name, as the report's source names it
    policy: str
    files: tuple[FileCheck, ...]
    artifacts: tuple[ArtifactRun, ...]
    conversion: ConversionVerdict
    provider: Provider
    speed_batch: int
    golden_rows: int
    chosen: tuple[str, ...]  # --artifacts
    versions: Mapping[str, VersionChange]  # by package, only those that differ
    machine: Machines
    notes: tuple[str, ...] = ()  # what a server here must do that the figures alone do not say
    signature: SignatureCheck | None = None  # None: neither --public-key nor --require-signature

    @property
    def where(self) -> str:
        return self.folder

    @property
    def checks(self) -> tuple[Check, ...]:
        """Every verdict, as the terminal, --junit and verify.json list them: the signature's first."""
        signed = () if self.signature is None else (self.signature.check,)
        return (
            *signed,
            *(f.check for f in self.files),
            *(a.check for a in self.artifacts),
            self.conversion.check,
        )

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

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
            "checks": _lines(self.checks),
            "files": [f.to_json() for f in self.files],
            "artifacts": [a.to_json() for a in self.artifacts],
            "conversion": self.conversion.to_json(),
            "provider": self.provider.to_json(),
            "speed_batch": self.speed_batch,
            "golden_rows": self.golden_rows,
            "artifacts_chosen": list(self.chosen),
            "versions": {package: change.to_json() for package, change in self.versions.items()},
            "machine": self.machine.to_json(),
            "notes": list(self.notes),
            "signature": None if self.signature is None else self.signature.to_json(),
        }


Verification = VerifyReport  # the name of earlier versions


@dataclass(frozen=True)
class ModelVerification:
    """One model and policy of a batch root: its folder verified, or why it was not."""

    name: str
    policy: str
    folder: str | None
    passed: bool
    message: str
    verification: VerifyReport | None = None  # None: not converted, or its folder could not be verified

    @property
    def check(self) -> Check:
        return Check(f"{self.name} ({self.policy})", self.passed, self.message)

    def to_json(self) -> dict:
        found = {"name": self.name, "policy": self.policy, "folder": self.folder, "passed": self.passed}
        found = {**found, "message": self.message}
        return found if self.verification is None else {**found, "verification": self.verification.to_json()}


@dataclass(frozen=True)
class BatchVerification:
    """Every converted model of a batch root, verified; the root's verdict is theirs together."""

    root: str
    models: tuple[ModelVerification, ...]
    signature: SignatureCheck | None = None  # the root's own (batch.sig over batch.json and index.html)

    @property
    def where(self) -> str:
        return self.root

    @property
    def passed(self) -> bool:
        return bool(self.models) and all(c.passed for c in self.checks)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.passed else EXIT_GATE

    @property
    def checks(self) -> tuple[Check, ...]:
        signed = () if self.signature is None else (self.signature.check,)
        return (*signed, *(m.check for m in self.models))

    @property
    def verified(self) -> tuple[VerifyReport, ...]:
        """The folders that were verified, in batch.json's order."""
        return tuple(m.verification for m in self.models if m.verification is not None)

    def to_json(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "root": self.root,
            "passed": self.passed,
            "exit_code": self.exit_code,
            "checks": _lines(self.checks),
            "models": [m.to_json() for m in self.models],
            "signature": None if self.signature is None else self.signature.to_json(),
        }
