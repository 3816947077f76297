"""Does a report read back say what its own raw figures say?

A report.json holds raw figures (each metric before and after, row
counts, differences, times) and figures derived from them (a drop, a
share, a total, a ratio, a proof's verdict, the gate's checks and
`passed`). A re-check judges the raw ones: `Report.derived` computes every
derived figure again, with the functions the conversion computed it with,
and `consistency` compares what the file says with what that gives. Any
figure that differs beyond float rounding is named, and fails the gate's
report consistency check.

What this cannot see: a report is not signed, so raw figures edited
together with everything derived from them (or a report rewritten whole)
read as a real run, and are judged on the figures they hold. The stored
gate keeps copies of the raw figures it judged (a check's values), so an
edit that leaves the gate behind is caught (docs/gate.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from mpconvert.report.sections.validation import PRIMARY_FIELDS, primary_index

CONSISTENCY = "report consistency"

# Binary rounding of one subtraction or division is about 1e-16 relative;
# this also forgives a figure computed in another order (440/450 - 445/450
# against -5/450), and no edit anyone would make.
ROUNDING = 1e-9

# The sections that hold derived figures (the others are raw: source, layers,
# versions, timings; the gate is compared by check name, below).
SECTIONS = ("validation", "padding", "speed", "slow_kernel", "artifacts")
# Derived mappings named whole: {"ink": 128} against {"ink": 130}, not key by key.
WHOLE = frozenset({"nonfinite_by_output"})


@dataclass(frozen=True)
class Contradiction:
    field: str  # where, as report.json spells it: "validation.drop", 'gate.checks["agreement"].passed'
    message: str  # the field, what it says, and what the raw figures give

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Consistency:
    """What a report read back contradicts, if anything."""

    contradictions: tuple[Contradiction, ...] = ()
    # The message of a failing report consistency check an earlier re-check stored: a report once found
    # inconsistent stays so, even when written back with its figures derived again.
    earlier: str | None = None

    @property
    def passed(self) -> bool:
        return not self.contradictions and self.earlier is None

    def listed(self) -> list[str]:
        found = [str(c) for c in self.contradictions]
        return found + ([f"an earlier re-check found: {self.earlier}"] if self.earlier else [])


def consistency(stored: Mapping[str, Any], rederived: Mapping[str, Any]) -> Consistency:
    """What `stored` (report.json's content) says that `rederived` (the same report with every derived figure
    computed again from the raw ones, and judged again by the stored thresholds) does not."""
    found: list[Contradiction] = []
    for key in SECTIONS:
        if key in stored and key in rederived:
            found += _differences(stored[key], rederived[key], (key,), lambda path: _inputs(path, stored))
    found += _impossible_counts(stored.get("validation"))
    found += _fidelity(stored.get("fidelity"))
    gate, earlier = _gate(stored, rederived)
    return Consistency(tuple(found + gate), earlier)


# --- derived figures against the raw ones --------------------------------------


def _differences(was: Any, now: Any, path: tuple, inputs: Callable[[tuple], str]) -> Iterator[Contradiction]:
    """Every leaf of `was` that `now` (its derived-again form) gives otherwise; `inputs(path)` says from what.

    Text is not compared (wording may change between versions, and no
    check reads it), nor a key only one of them has (a version's difference).
    """
    if isinstance(was, Mapping) and isinstance(now, Mapping) and path[-1] not in WHOLE:
        for key in was:
            if key in now:
                yield from _differences(was[key], now[key], (*path, key), inputs)
    elif isinstance(was, list) and isinstance(now, list) and len(was) == len(now):
        for i, (a, b) in enumerate(zip(was, now)):
            yield from _differences(a, b, (*path, i), inputs)
    elif not isinstance(was, str) and not isinstance(now, str) and not same(was, now):
        field = spelled(path)
        yield Contradiction(field, f"{field} is {shown(was)} but {inputs(path)} give {shown(now)}")


def same(a: Any, b: Any) -> bool:
    """Equal, up to float rounding for numbers (a bool is not a number here: true is not 1)."""
    numbers = (int, float)
    if isinstance(a, bool) or isinstance(b, bool) or not (isinstance(a, numbers) and isinstance(b, numbers)):
        return type(a) is type(b) and bool(a == b)
    return math.isclose(a, b, rel_tol=ROUNDING, abs_tol=ROUNDING * 1e-3)


def _inputs(path: tuple, stored: Mapping[str, Any]) -> str:
    """What a derived figure is derived from, with the stored values: "reference 0.84 and converted 0.64"."""
    node: Any = stored
    for key in path[:-1]:
        node = node[key]
    name = path[-1]
    if path[0] == "validation":
        v = stored["validation"]
        outputs = v.get("outputs")
        if len(path) == 2 and outputs:
            if name in PRIMARY_FIELDS:
                i = primary_index([o.get("metric") for o in outputs])
                return f"the primary output's figures (validation.outputs[{i}], {outputs[i].get('name')!r})"
            return "the per-output figures (validation.outputs)"
        if name == "nonfinite_by_output":
            return f"nonfinite_outputs {shown(node.get('nonfinite_outputs'))}"
        if name == "share":
            return f"in_train {node.get('in_train')} of validation_rows {node.get('validation_rows')}"
        known = {
            "drop": ("reference", "converted"),
            "agreement": ("agreed", "agreement_rows"),
            "kept_correct": ("harmed", "kept_correct_rows"),
        }.get(name)
        if known:
            return " and ".join(f"{key} {_figure(node.get(key))}" for key in known)
    if path[0] == "artifacts" and len(path) == 3:
        return f"its per-output figures (artifacts[{path[1]}].outputs)"
    if path[0] in ("speed", "slow_kernel") and name in ("ratio", "slower"):
        keys = ("float32_bytes", "converted_bytes") if "memory" in path else ("float32_ms", "converted_ms")
        return " and ".join(f"{key} {_figure(node.get(key))}" for key in keys)
    if path[0] == "padding":
        if not node.get("padded"):
            return "an empty padded list (nothing was padded)"
        return (
            f"its differences (float32 {_figure(node.get('float32_max_abs_diff'))}, "
            f"{stored.get('policy')} {_figure(node.get('max_abs_diff'))}) against its tolerances "
            f"{json.dumps(node.get('tolerance'))} at scale max_abs_ref {_figure(node.get('max_abs_ref'))}"
        )
    return "the report's raw figures"


# --- counts that cannot be ------------------------------------------------------


def _impossible_counts(v: Any) -> list[Contradiction]:
    """Harm and agreement counts that no set of rows gives: each part at most its whole."""
    if not isinstance(v, Mapping):
        return []
    found = _counts(v, "validation")
    for i, o in enumerate(v.get("outputs") or ()):
        if isinstance(o, Mapping):
            found += _counts(o, f"validation.outputs[{i}]")
    return found


def _counts(v: Mapping[str, Any], where: str) -> list[Contradiction]:
    def count(key: str) -> int | None:
        value = v.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    rows, decisive, agreed = count("rows"), count("agreement_rows"), count("agreed")
    harmed, fixed, right = count("harmed"), count("fixed"), count("kept_correct_rows")
    found = []
    tokens = v.get("tokens")
    whole = "the number of rows (rows)"
    if isinstance(tokens, Mapping):  # a sequence output's counts are tokens
        scored = tokens.get("scored")
        rows = scored if isinstance(scored, int) and not isinstance(scored, bool) else None
        whole = "the number of scored tokens (tokens.scored)"

    def at_most(key: str, value: int | None, limit: int | None, what: str) -> None:
        if value is not None and limit is not None and value > limit:
            found.append(Contradiction(f"{where}.{key}", f"{where}.{key} is {value} but {what} is {limit}"))

    for key in ("rows", "agreement_rows", "agreed", "harmed", "fixed", "kept_correct_rows", "nonfinite_outputs"):
        value = count(key)
        if value is not None and value < 0:
            found.append(Contradiction(f"{where}.{key}", f"{where}.{key} is {value}, a count below 0"))
    at_most("agreement_rows", decisive, rows, whole)
    at_most("agreed", agreed, decisive, "the number of decisive rows (agreement_rows)")
    at_most("kept_correct_rows", right, decisive, "the number of decisive rows (agreement_rows)")
    at_most("harmed", harmed, right, "the number the float32 model got right (kept_correct_rows)")
    wrong = None if decisive is None or right is None else decisive - right
    at_most("fixed", fixed, wrong, "the number the float32 model got wrong (agreement_rows - kept_correct_rows)")
    if harmed is not None and fixed is not None and agreed is not None and decisive is not None:
        # A harmed or fixed row changed its prediction: they are among the rows that do not agree.
        changed = decisive - agreed
        if harmed + fixed > changed:
            message = (
                f"{where}.harmed + fixed is {harmed + fixed} but only {changed} rows changed their prediction "
                f"(agreement_rows {decisive} - agreed {agreed})"
            )
            found.append(Contradiction(f"{where}.fixed", message))
    return found


def _fidelity(f: Any) -> list[Contradiction]:
    """A float32 rebuild that differs from the original stops the conversion: no report holds one."""
    if not isinstance(f, Mapping):
        return []
    diff, limit = f.get("max_abs_diff"), f.get("limit")
    if not isinstance(limit, (int, float)):
        return []
    if diff is None or (isinstance(diff, (int, float)) and not isinstance(diff, bool) and diff > limit):
        return [
            Contradiction(
                "fidelity.max_abs_diff",
                f"fidelity.max_abs_diff is {shown(diff)} but its limit is {shown(limit)}: a conversion whose "
                "float32 rebuild differs from the original stops there, and writes no report",
            )
        ]
    return []


# --- the stored verdict against the gate's -------------------------------------


def _gate(stored: Mapping[str, Any], rederived: Mapping[str, Any]) -> tuple[list[Contradiction], str | None]:
    gate = stored.get("gate")
    if not isinstance(gate, Mapping) or not isinstance(gate.get("checks"), list) or "passed" not in stored:
        # Every report of a schema version mpconvert reads has both; without them nothing below is compared.
        message = "the report has no stored verdict (passed, gate.checks), which every report.json mpconvert writes has"
        return [Contradiction("gate", message)], None
    checks = {c.get("name"): c for c in gate["checks"] if isinstance(c, Mapping)}
    earlier = checks.pop(CONSISTENCY, None)
    earlier_message = None if earlier is None or earlier.get("passed") is True else str(earlier.get("message"))
    fresh = {c["name"]: c for c in rederived["gate"]["checks"]}
    found: list[Contradiction] = []
    values: list[Contradiction] = []
    for name, was in checks.items():
        now = fresh.get(name)
        where = f"gate.checks[{json.dumps(name)}]"
        if now is None:
            found.append(Contradiction(where, f"{where} is listed, but the report's figures call for no such check"))
            continue
        if was.get("passed") is not now["passed"]:
            judged = "pass" if now["passed"] else "fail"
            message = (
                f"{where}.passed is {shown(was.get('passed'))} but the report's figures {judged} it: {now['message']}"
            )
            found.append(Contradiction(f"{where}.passed", message))
        values += _differences(was.get("values"), now.get("values"), (where, "values"), _the_figures)
    for name, now in fresh.items():
        if name not in checks:
            where = f"gate.checks[{json.dumps(name)}]"
            judged = "pass" if now["passed"] else "fail"
            message = f"gate.checks has no {name!r} check, which the report's figures call for (they {judged} it)"
            found.append(Contradiction(where, message))
    verdict = rederived["passed"] and earlier_message is None
    for where, said in (("passed", stored["passed"]), ("gate.passed", gate.get("passed"))):
        if said is not verdict:
            message = (
                f"{where} is {shown(said)} but its gate checks, judged on the report's figures, give {shown(verdict)}"
            )
            found.append(Contradiction(where, message))
    return found + values, earlier_message


def _the_figures(path: tuple) -> str:
    return "the report's figures"


# --- spelling -------------------------------------------------------------------


def spelled(path: tuple) -> str:
    """("validation", "outputs", 1, "drop") as "validation.outputs[1].drop"."""
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else str(key))
    return text


def shown(value: Any) -> str:
    """A stored value as it reads in a message: 0.2000, 12, true, null."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:.4f}" if value == 0 or 1e-3 <= abs(value) < 1e6 else f"{value:.4g}"
    if isinstance(value, (Mapping, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _figure(value: Any) -> str:
    """A raw figure as it reads beside a derived one: all the digits that matter (0.84, 0.972028)."""
    return f"{value:.6g}" if isinstance(value, float) else shown(value)
