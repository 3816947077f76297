"""Compare two folders of conversions' report.json: the same except what a clock measured.

For a refactor that must keep behaviour: convert the same models with the
same options before and after (one sub-folder per conversion under each
root, each holding its report.json), then

    .venv/bin/python tools/compare_reports.py BEFORE_ROOT AFTER_ROOT

prints each conversion as "identical except timings" or lists every field
that differs, and exits 1 when any does. Wall-clock figures (timings, ms,
ratios, summaries built from them) are left out, and an artifact's size
may move by 1% and its sha256 may differ (SavedModel and ONNX files carry
names and ids that vary from run to run by a few bytes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TIMED = {
    "timings",
    "seconds",
    "float32_ms",
    "converted_ms",
    "ratio",
    "summary",
    "step_time",
    "step_time_ratio",
    "unpadded_ms",
    "padded_ms",
    "cost",
    "slower",
    # a latency's samples and the figures taken from them
    "calls_ms",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "rows_per_s",
}


def differences(a: object, b: object, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        found = []
        for key in sorted(set(a) | set(b)):
            if key in TIMED:
                continue
            if key not in a or key not in b:
                found.append(f"{where}.{key}: only in {'after' if key in b else 'before'}")
            else:
                found += differences(a[key], b[key], f"{where}.{key}")
        return found
    if isinstance(a, list) and isinstance(b, list):
        found = [f"{where}: lengths {len(a)} != {len(b)}"] if len(a) != len(b) else []
        for i, (x, y) in enumerate(zip(a, b)):
            found += differences(x, y, f"{where}[{i}]")
        return found
    if ".artifacts[" in where and where.endswith(".sha256"):
        return []  # the same names and ids that move `bytes` change the digest
    if where.endswith(".bytes") and isinstance(a, int) and isinstance(b, int) and abs(a - b) <= 0.01 * max(a, b):
        return []
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def without_speed_messages(report: dict) -> dict:
    # The speed check's message quotes the times.
    for check in report.get("gate", {}).get("checks", []):
        if check["name"] == "speed":
            check["message"] = None
    return report


def main(before: Path, after: Path) -> int:
    total = 0
    for path in sorted(before.glob("*/report.json")):
        other = after / path.parent.name / "report.json"
        if not other.is_file():
            print(f"{path.parent.name}: no report.json under {after}")
            total += 1
            continue
        found = differences(*(without_speed_messages(json.loads(p.read_text())) for p in (path, other)))
        total += len(found)
        print(f"{path.parent.name}: " + ("identical except timings" if not found else f"{len(found)} differences"))
        for line in found[:40]:
            print("   ", line)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
