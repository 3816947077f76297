"""`mpconvert verify`'s renderings of verify.json: the terminal, Markdown and JUnit (one case per check).

A batch root's verification holds each model's own; every rendering walks
`documents` so that a folder and a batch root read the same way.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, Any

from junitparser import Failure, JUnitXml, TestCase, TestSuite
from rich.markup import escape

from mpconvert.render.common import console_for, finite, format_bytes, row
from mpconvert.report.sections.speed import PERCENTILES
from mpconvert.report.verification import ArtifactRun, BatchVerification, VerifyReport


def documents(found: VerifyReport | BatchVerification) -> tuple[VerifyReport, ...]:
    """The per-folder verifications: itself, or a batch root's models' that were verified."""
    return found.verified if isinstance(found, BatchVerification) else (found,)


def _latency(artifact: ArtifactRun) -> str:
    t = artifact.latency
    if not t:
        return artifact.latency_note or "not timed"
    p50, p90, p99 = (t.percentile(q) for q in PERCENTILES)
    return (
        f"p50/p90/p99 {p50:g}/{p90:g}/{p99:g} ms at batch {t.batch}, "
        f"{t.rows_per_s:,.0f} rows/s ({len(t.calls_ms)} calls)"
    )


def _memory(artifact: ArtifactRun) -> str:
    memory = artifact.memory
    return "n/a" if not memory else f"+{format_bytes(memory.rss_growth_bytes)} RSS"


def _drift(artifact: ArtifactRun) -> str:
    parts = []
    for name, d in artifact.drift.items():
        here, then = finite(d.here), finite(d.converted)
        shown = "not finite" if here is None else f"{here:.3g}"
        parts.append(f"{name} {shown} (at conversion {'n/a' if then is None else f'{then:.3g}'})")
    return ", ".join(parts) or "n/a"


def render_verify(found: VerifyReport | BatchVerification, stream: IO[str] | None = None, path: Any = None) -> None:
    console = console_for(stream or sys.stdout)
    for one in documents(found):
        verdict = "[green]PASSED[/]" if one.passed else "[red]FAILED[/]"
        console.print(f"[bold]verify[/] {escape(one.folder)} ({escape(one.model)}, {one.policy}): {verdict}")
        for check in one.checks:
            mark = "ok  " if check.passed else "FAIL"
            console.print(f"  {mark} {escape(check.name)}: {escape(check.message)}")
        for artifact in one.artifacts:
            if artifact.runtime is None:
                continue
            console.print(
                f"  {artifact.kind}: {escape(_latency(artifact))}; memory {_memory(artifact)}; "
                f"drift from float32 {escape(_drift(artifact))}"
            )
        for note in one.notes:
            console.print(f"  note: {escape(note)}")
        if one.provider.note:
            console.print(f"  provider: {escape(one.provider.note)}")
        differ = one.versions
        if differ:
            listed = ", ".join(f"{k} {v.converted} -> {v.here}" for k, v in differ.items())
            console.print(f"  versions that differ from the conversion's: {escape(listed)}")
        else:
            console.print("  versions: the same as the conversion's")
    if isinstance(found, BatchVerification):
        if found.signature is not None and found.signature.passed:  # who signed the root, and when
            console.print(f"  ok   root {escape(found.signature.check.message)}")
        for check in found.checks:
            if not check.passed:
                console.print(f"  FAIL {escape(check.name)}: {escape(check.message)}")
        verdict = "PASSED" if found.passed else "FAILED"
        console.print(f"[bold]verify[/] {escape(found.root)}: {len(found.models)} model(s), {verdict}")


def verify_markdown(found: VerifyReport | BatchVerification) -> str:
    verdict = "✅ PASSED" if found.passed else "❌ FAILED"
    lines = [f"## mpconvert verify: {verdict}", "", row("check", "result", "message"), "| --- | --- | --- |"]
    for check in found.checks:
        lines.append(row(check.name, "pass" if check.passed else "FAIL", check.message))
    for one in documents(found):
        for artifact in one.artifacts:
            if artifact.runtime is not None:
                lines.append(row(f"{one.model} {artifact.kind}", "speed", _latency(artifact)))
    return "\n".join(lines) + "\n"


def verify_junit(found: VerifyReport | BatchVerification) -> JUnitXml:
    xml = JUnitXml("mpconvert verify")
    for one in documents(found):
        suite = TestSuite(f"mpconvert verify: {one.model}")
        classname = f"mpconvert.verify.{one.model.replace('.', '_')}"
        for check in one.checks:
            case = TestCase(check.name, classname, 0.0)
            if check.passed:
                case.system_out = check.message
            else:
                case.result = [Failure(check.message, "mpconvert.verify")]
            suite.add_testcase(case)
        xml.add_testsuite(suite)
    if isinstance(found, BatchVerification):  # models that were not verified at all (not converted, unreadable)
        unverified = [m for m in found.models if m.verification is None]
        if unverified:
            suite = TestSuite("mpconvert verify: not verified")
            for m in unverified:
                case = TestCase(f"{m.name} ({m.policy})", "mpconvert.verify.batch", 0.0)
                case.result = [Failure(m.message, "mpconvert.verify")]
                suite.add_testcase(case)
            xml.add_testsuite(suite)
    return xml


def write_verify_junit(found: VerifyReport | BatchVerification, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    verify_junit(found).write(str(path), pretty=True)
