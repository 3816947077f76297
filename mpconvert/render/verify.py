"""`mpconvert verify`'s renderings of verify.json: the terminal, Markdown and JUnit (one case per check).

A batch root's document holds each model's own; every rendering walks
`documents` so that a folder and a batch root read the same way.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, Any

from junitparser import Failure, JUnitXml, TestCase, TestSuite
from rich.markup import escape

from mpconvert.render.common import console_for, format_bytes, row


def documents(document: dict) -> list[dict]:
    """The per-folder verifications in a verify.json: itself, or a batch root's models'."""
    if "models" not in document:
        return [document]
    return [m["verification"] for m in document["models"] if "verification" in m]


def _latency(artifact: dict) -> str:
    t = artifact.get("latency")
    if not t:
        return artifact.get("latency_note") or "not timed"
    return (
        f"p50/p90/p99 {t['p50_ms']:g}/{t['p90_ms']:g}/{t['p99_ms']:g} ms at batch {t['batch']}, "
        f"{t['rows_per_s']:,.0f} rows/s ({t['calls']} calls)"
    )


def _memory(artifact: dict) -> str:
    memory = artifact.get("memory")
    return "n/a" if not memory else f"+{format_bytes(memory['rss_growth_bytes'])} RSS"


def _drift(artifact: dict) -> str:
    parts = []
    for name, d in (artifact.get("drift") or {}).items():
        here, then = d.get("here"), d.get("converted")
        shown = "not finite" if here is None else f"{here:.3g}"
        parts.append(f"{name} {shown} (at conversion {'n/a' if then is None else f'{then:.3g}'})")
    return ", ".join(parts) or "n/a"


def render_verify(document: dict, stream: IO[str] | None = None, path: Any = None) -> None:
    console = console_for(stream or sys.stdout)
    for one in documents(document):
        verdict = "[green]PASSED[/]" if one["passed"] else "[red]FAILED[/]"
        console.print(f"[bold]verify[/] {escape(one['folder'])} ({escape(one['model'])}, {one['policy']}): {verdict}")
        for check in one["checks"]:
            mark = "ok  " if check["passed"] else "FAIL"
            console.print(f"  {mark} {escape(check['name'])}: {escape(check['message'])}")
        for artifact in one["artifacts"]:
            if artifact["runtime"] is None:
                continue
            console.print(
                f"  {artifact['kind']}: {escape(_latency(artifact))}; memory {_memory(artifact)}; "
                f"drift from float32 {escape(_drift(artifact))}"
            )
        for note in one.get("notes") or []:
            console.print(f"  note: {escape(note)}")
        provider = one["provider"]
        if provider.get("note"):
            console.print(f"  provider: {escape(provider['note'])}")
        differ = one["versions"]
        if differ:
            listed = ", ".join(f"{k} {v['converted']} -> {v['here']}" for k, v in differ.items())
            console.print(f"  versions that differ from the conversion's: {escape(listed)}")
        else:
            console.print("  versions: the same as the conversion's")
    if "models" in document:
        failed = [c for c in document["checks"] if not c["passed"]]
        for check in failed:
            console.print(f"  FAIL {escape(check['name'])}: {escape(check['message'])}")
        verdict = "PASSED" if document["passed"] else "FAILED"
        console.print(f"[bold]verify[/] {escape(document['root'])}: {len(document['models'])} model(s), {verdict}")


def verify_markdown(document: dict) -> str:
    verdict = "✅ PASSED" if document["passed"] else "❌ FAILED"
    lines = [f"## mpconvert verify: {verdict}", "", row("check", "result", "message"), "| --- | --- | --- |"]
    for check in document["checks"]:
        lines.append(row(check["name"], "pass" if check["passed"] else "FAIL", check["message"]))
    for one in documents(document):
        for artifact in one["artifacts"]:
            if artifact["runtime"] is not None:
                lines.append(row(f"{one['model']} {artifact['kind']}", "speed", _latency(artifact)))
    return "\n".join(lines) + "\n"


def verify_junit(document: dict) -> JUnitXml:
    xml = JUnitXml("mpconvert verify")
    for one in documents(document) or [document]:
        suite = TestSuite(f"mpconvert verify: {one.get('model', document.get('root'))}")
        classname = f"mpconvert.verify.{str(one.get('model', 'batch')).replace('.', '_')}"
        for check in one["checks"]:
            case = TestCase(check["name"], classname, 0.0)
            if check["passed"]:
                case.system_out = check["message"]
            else:
                case.result = [Failure(check["message"], "mpconvert.verify")]
            suite.add_testcase(case)
        xml.add_testsuite(suite)
    if "models" in document:  # models that were not verified at all (not converted, unreadable)
        unverified = [m for m in document["models"] if "verification" not in m]
        if unverified:
            suite = TestSuite("mpconvert verify: not verified")
            for m in unverified:
                case = TestCase(f"{m['name']} ({m['policy']})", "mpconvert.verify.batch", 0.0)
                case.result = [Failure(m["message"], "mpconvert.verify")]
                suite.add_testcase(case)
            xml.add_testsuite(suite)
    return xml


def write_verify_junit(document: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    verify_junit(document).write(str(path), pretty=True)
