"""The CI gate: every check on a report, collected first, then one verdict.

The gate judges the report's typed sections (sections/), which a
conversion builds and `mpconvert check` reads back from report.json, so a
re-check applies exactly what the conversion applied, from report.json
alone and without TensorFlow. Each check becomes one JUnit test case, and
a failing check never hides the others: all are evaluated, then the gate
decides.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from mpconvert.data.formats import INPUT_LAYER, units_of
from mpconvert.data.rows import Overlap
from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.options.gate import Baseline, Thresholds
from mpconvert.options.tolerance import within
from mpconvert.report.checks import (
    ACCURACY,
    AGREEMENT,
    BASELINE,
    DRIFT,
    FINETUNE_HEALTH,
    OVERLAP,
    PADDING,
    POLICY_REWRITE,
    SPEED,
    SPEED_PATHS_JUDGED,
    AccuracyValues,
    AgreementNotJudged,
    AgreementValues,
    BaselineValues,
    Check,
    ConsistencyValues,
    DriftValues,
    FinetuneValues,
    KeptCorrectValues,
    MissingBaselineValues,
    OverlapValues,
    PaddingValues,
    PolicyValues,
    SpeedValues,
)
from mpconvert.report.consistency import CONSISTENCY, Consistency
from mpconvert.report.parity import check_parity
from mpconvert.report.sections import (
    Artifact,
    Finetune,
    Layer,
    OutputValidation,
    PaddingReport,
    Source,
    SpeedReport,
    Validation,
    native,
)
from mpconvert.report.sections.stages import NOT_TRIED, NOTHING_TO_PAD
from mpconvert.report.sections.validation import Measured, worse_by

# rtol by policy and artifact kind, in units of the 16-bit format's rounding
# error u (float16 2**-11 = 4.9e-4, bfloat16 2**-8 = 3.9e-3):
# - savedmodel and keras run the converted model through the same TensorFlow
#   kernels: 0.0 on every sample model on CPU. 4u leaves room for a GPU that
#   picks another matmul algorithm for another batch size.
# - onnx runs through onnxruntime, with different kernels and rounding
#   points: observed 0.0035 (float16, ~7u) and 0.023 (bfloat16, ~6u) on the
#   sample models, and 0.004 / 0.039 on MobileNetV2 with random weights in
#   the ONNX tests. 0.02 (40u) and 0.1 (26u) leave 5x and 2.6x over the worst
#   of those while still failing an export that computes something else
#   (O(1) on probabilities).
# The values live in each Precision's parity_rtol.


@dataclass(frozen=True)
class GateResult:
    checks: tuple[Check, ...]
    thresholds: Thresholds

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [check for check in self.checks if not check.passed]

    def as_dict(self) -> dict:
        """The report's `gate` section (its JSON form: Enums among a check's values as their strings)."""
        return {
            "passed": self.passed,
            "thresholds": native(self.thresholds.as_dict()),
            "checks": [check.to_json() for check in self.checks],
        }


class Judged(Protocol):
    """The sections of a report the gate reads (report.Report has them)."""

    @property
    def policy(self) -> str: ...
    @property
    def source(self) -> Source: ...
    @property
    def layers(self) -> tuple[Layer, ...]: ...
    @property
    def finetune(self) -> Finetune | None: ...
    @property
    def validation(self) -> Validation: ...
    @property
    def padding(self) -> PaddingReport | None: ...
    @property
    def artifacts(self) -> tuple[Artifact, ...]: ...
    @property
    def speed(self) -> SpeedReport | None: ...
    @property
    def consistency(self) -> Consistency | None: ...


def evaluate(report: Judged, thresholds: Thresholds) -> GateResult:
    """Every check that applies to `report`, in a fixed order."""
    validation = report.validation
    checks = [] if report.consistency is None else [check_consistency(report.consistency)]
    checks.append(_policy_rewrite(report))
    if report.finetune:
        checks.append(_finetune_health(report.finetune))
    checks += validation_checks(validation, thresholds)
    overlap = check_overlap(validation.overlap, report.finetune, thresholds.max_overlap)
    if overlap is not None:
        checks.append(overlap)
    if report.padding:
        checks.append(_padding(report.padding))
    keras_nonfinite = validation.nonfinite_outputs > 0
    # model.keras is the file training resumes from, not one a server runs.
    served = any(a.exportable for a in report.artifacts if a.kind != ArtifactKind.KERAS)
    checks += [check_parity(artifact, thresholds, keras_nonfinite, served) for artifact in report.artifacts]
    if thresholds.baseline is not None:
        checks += _baselines(validation, thresholds.baseline, thresholds.max_regression)
    if thresholds.min_speedup is not None:
        checks.append(check_speed(report.speed, thresholds.min_speedup))
    return GateResult(tuple(checks), thresholds)


def validation_checks(v: Validation, thresholds: Thresholds) -> list[Check]:
    """The metric and agreement checks, the ones the search can fix: one set per output of a multi-output model.

    With several outputs each check is named after its output ("accuracy
    gate: digit", "mse gate: ink", "agreement: digit"); an output without
    labels gets a drift check instead of a metric check ("drift: boxes").
    """
    if not v.outputs:
        checks = [check_accuracy(v, thresholds.max_drop)]
        agreement = check_agreement(v, thresholds.min_agreement)
        return checks + ([agreement] if agreement is not None else [])  # None for regression models
    checks = []
    for o in v.outputs:
        name = o.name
        if o.metric is None:
            checks.append(check_drift(o))
        else:
            checks.append(replace(check_accuracy(o, thresholds.drop_for(name)), name=f"{o.metric} gate: {name}"))
        agreement = check_agreement(o, thresholds.min_agreement)
        if agreement is not None:
            checks.append(replace(agreement, name=f"{AGREEMENT}: {name}"))
    return checks


def check_drift(o: OutputValidation) -> Check:
    """An output without labels: compared with the original, failed only by NaN/inf values."""
    drift = "not finite" if o.max_abs_diff is None else f"{o.max_abs_diff:.6f}"
    values = DriftValues(o.max_abs_diff, o.nonfinite_outputs)
    if not o.rows:
        # No row ran, so there is no difference to report (0 is what an empty comparison gives).
        return Check(f"{DRIFT}: {o.name}", True, f"not judged: no labels for output {o.name!r} and no rows", values)
    message = f"no labels for output {o.name!r}: max abs diff {drift} from the float32 model on {o.rows} rows"
    if o.nonfinite_outputs:
        message += (
            f"; {o.nonfinite_outputs} NaN/inf values: activations overflow 16 bits "
            "(try mixed_bfloat16 or --keep-float32 on the overflowing layers)"
        )
    return Check(f"{DRIFT}: {o.name}", o.nonfinite_outputs == 0, message, values)


def check_overlap(overlap: Overlap | None, tuning: Finetune | None, max_overlap: float) -> Check | None:
    """Fine-tuning on validation rows makes the accuracy gate judge memory: fail past max_overlap.

    Only judged when fine-tuning ran and some rows are shared; otherwise the
    summary warns (render), and a clean split says nothing.
    """
    if not overlap or not overlap.in_train or not tuning or not tuning.steps:
        return None
    share = overlap.share
    passed = within(share, max_overlap)
    message = (
        f"{overlap.in_train} of {overlap.validation_rows} validation rows ({share:.1%}) are also training "
        f"rows, and fine-tuning trained on them: {'<=' if passed else '>'} max {max_overlap:.1%}"
    )
    if not passed:
        message += "; split the data so that no validation row is a training row, or pass --finetune-steps 0"
    return Check(OVERLAP, passed, message, OverlapValues(overlap, max_overlap))


def check_consistency(found: Consistency) -> Check:
    """A report read back: its stored derived figures and verdict against what its raw figures give.

    The other checks judge the raw figures either way; this one says
    whether the report read as mpconvert wrote it.
    """
    listed = found.listed()
    values = ConsistencyValues(tuple(listed), tuple(c.field for c in found.contradictions))
    if found.passed:
        message = (
            "every derived figure (drops, shares, totals, ratios, the padding proof) and the stored verdict "
            "are what the report's raw figures give"
        )
        return Check(CONSISTENCY, True, message, values)
    shown = "; ".join(listed[:4]) + (f"; and {len(listed) - 4} more (see its values)" if len(listed) > 4 else "")
    message = (
        f"the report contradicts itself: {shown}. The checks judge the raw figures; use the report.json "
        "mpconvert wrote, or convert again"
    )
    return Check(CONSISTENCY, False, message, values)


@dataclass(frozen=True)
class LayerCounts:
    """A report's layers counted the one way the gate, the summaries and batch.json count them."""

    converted: int  # layers computing in the report's policy
    kept: tuple[Layer, ...]  # layers pinned to float32, input layers aside (they compute nothing)
    with_policy: int  # layers that have a policy at all, input layers aside

    @property
    def kept_share(self) -> float | None:
        return len(self.kept) / self.with_policy if self.with_policy else None


def layer_counts(policy: str, layers: Iterable[Layer]) -> LayerCounts:
    """A report's layers (`layers`) counted against its `policy`: the decisions, not the sublayers inside them."""
    computing = [layer for layer in layers if layer.pinned != INPUT_LAYER and layer.inside is None]
    return LayerCounts(
        converted=sum(1 for layer in computing if layer.policy == policy),
        kept=tuple(layer for layer in computing if layer.pinned),
        with_policy=sum(1 for layer in computing if layer.policy),
    )


def _policy_rewrite(report: Judged) -> Check:
    policy = report.policy
    counts = layer_counts(policy, report.layers)
    converted, kept = counts.converted, len(counts.kept)
    values = PolicyValues(policy, converted, kept)
    units = units_of(report.source.format)
    if converted:
        return Check(POLICY_REWRITE, True, f"{converted} {units} converted to {policy}, {kept} kept float32", values)
    return Check(
        POLICY_REWRITE,
        False,
        f"no {units[:-1]} was converted to {policy} ({kept} kept float32), so nothing runs in 16 bits; "
        "check the --keep-float32 patterns",
        values,
    )


def _finetune_health(tuning: Finetune) -> Check:
    values = FinetuneValues(tuning.steps, tuning.requested_steps, tuning.skipped_steps, tuning.healthy, tuning.kept)
    if tuning.healthy:
        message = f"{tuning.steps} steps, {tuning.skipped_steps} skipped; kept the {tuning.kept} weights"
        return Check(FINETUNE_HEALTH, True, message, values)
    message = f"stopped after {tuning.steps} of {tuning.requested_steps} steps: {tuning.problem}"
    if tuning.advice:
        message += f"; try {tuning.advice}"
    return Check(FINETUNE_HEALTH, False, message, values)


def check_accuracy(v: Measured, max_drop: float) -> Check:
    nonfinite = v.nonfinite_outputs
    values = AccuracyValues(v.metric, v.reference, v.converted, v.drop, max_drop, nonfinite)
    if v.metric is None:
        passed = nonfinite == 0
        drift = "not finite" if v.max_abs_diff is None else f"{v.max_abs_diff:.6f}"
        message = (
            f"accuracy not measured: no labelled data, only output drift (max abs diff {drift} "
            f"on {v.rows} generated inputs)"
            if v.rows
            else "accuracy not measured: no labelled data, and no rows to compare"
        )
    elif v.drop is None or v.reference is None or v.converted is None:
        # The metric itself is not finite (mse of NaN outputs): stored as null, never within a budget.
        passed = False
        message = (
            f"{v.metric} {_number(v.reference)} -> {_number(v.converted)}: "
            f"the drop is not finite, so not within max {max_drop:.4f}"
        )
    else:
        in_budget = within(v.drop, max_drop)
        passed = in_budget and nonfinite == 0
        message = (
            f"{v.metric} {v.reference:.4f} -> {v.converted:.4f}, "
            f"drop {v.drop:.4f} {'<=' if in_budget else '>'} max {max_drop:.4f}"
        )
    if nonfinite:
        # No budget can excuse NaN/inf: say so, where, and the way out (one output's
        # figures name no output: the check is named after it).
        where = (v.nonfinite_by_output if isinstance(v, Validation) else None) or {}
        named = f" ({', '.join(f'{n} in output {name!r}' for name, n in where.items())})" if where else ""
        message += (
            f"; {nonfinite} NaN/inf output values{named}: activations overflow 16 bits "
            "(try mixed_bfloat16 or --keep-float32 on the overflowing layers)"
        )
        values = replace(values, nonfinite_by_output=where or None)
    return Check(ACCURACY, passed, message, values)


def _number(value: float | None) -> str:
    return "not finite" if value is None else f"{value:.4f}"


def check_agreement(v: Measured, min_agreement: float) -> Check | None:
    """Harm with labels, agreement without: the rule the report's fields allow.

    Reports written before the harm fields (no `kept_correct_rows`, read
    back as None) are judged by agreement, as they were then. A sequence
    output's counts are tokens (padding left out), and its messages say so.
    """
    unit = _unit(v)
    if v.agreement_rows == 0 or not v.rows:
        total = v.tokens.scored if v.tokens else v.rows
        message = (
            f"not judged: all {total} {unit} are near-ties at 16-bit resolution (e.g. an untrained model)"
            if v.rows
            else "not judged: no rows"
        )
        return Check(AGREEMENT, True, message, AgreementNotJudged())
    if v.kept_correct_rows == 0:
        message = (
            f"not judged: the float32 model got none of the {v.agreement_rows} decisive {unit} right, "
            f"so none can be harmed ({v.fixed} fixed)"
        )
        return Check(AGREEMENT, True, message, AgreementNotJudged("kept_correct", fixed=v.fixed))
    if v.kept_correct is not None:
        least = _least_judged(min_agreement)
        if v.harmed and v.kept_correct_rows is not None and v.kept_correct_rows < least:
            # With fewer right than this, one harmed row alone breaks the budget: a random-weight language
            # model gets 1 of 586 tokens right, and fine-tuning that fixes 19 and loses that one says nothing
            # about harm. The accuracy check still judges the change.
            message = (
                f"not judged: the float32 model got only {v.kept_correct_rows} of the {v.agreement_rows} decisive "
                f"{unit} right, fewer than {least}, the least at which min {min_agreement:.2%} allows one harmed "
                f"({v.harmed} harmed, {v.fixed} fixed; the accuracy check judges the change)"
            )
            return Check(AGREEMENT, True, message, AgreementNotJudged("kept_correct", v.harmed, v.fixed))
        return _kept_correct(v, v.kept_correct, min_agreement)
    if v.agreement is None:
        return None
    agreement = v.agreement
    passed = within(min_agreement, agreement)
    message = f"predictions agree on {agreement:.2%} of {_decisive(v)} {unit} {'>=' if passed else '<'} min {min_agreement:.2%}"
    rows = v.rows if v.agreement_rows is None else v.agreement_rows
    return Check(AGREEMENT, passed, message, AgreementValues(agreement, min_agreement, rows))


def _least_judged(min_agreement: float) -> int:
    """The fewest rows the float32 model got right for one harmed row to be within `min_agreement` (20 at 95%);
    at a minimum of 100% no harm is allowed, so any count is judged."""
    if min_agreement >= 1:
        return 0
    return math.ceil(1 / (1 - min_agreement) - 1e-9)


def _kept_correct(v: Measured, kept: float, min_agreement: float) -> Check:
    passed = within(min_agreement, kept)
    total = v.tokens.scored if v.tokens else v.rows
    ties = 0 if v.agreement_rows is None else total - v.agreement_rows
    left_out = f"; {ties} near-ties left out" if ties else ""
    message = (
        f"kept {kept:.2%} of the {v.kept_correct_rows} {_unit(v)} the float32 model got right "
        f"({v.harmed} harmed, {v.fixed} fixed{left_out}) {'>=' if passed else '<'} min {min_agreement:.2%}"
    )
    values = KeptCorrectValues(kept, min_agreement, v.kept_correct_rows, v.harmed, v.fixed, v.agreement)
    return Check(AGREEMENT, passed, message, values)


def _decisive(v: Measured) -> str:
    counted, total = v.agreement_rows, v.tokens.scored if v.tokens else v.rows
    if counted is None or counted == total:
        return str(total)
    return f"{counted} decisive ({total - counted} near-ties left out)"


def _unit(v: Measured) -> str:
    """What a measurement counts: a sequence output's agreement and harm count tokens."""
    return "tokens" if v.tokens else "rows"


def _padding(padding: PaddingReport) -> Check:
    diff = padding.max_abs_diff
    diff_text = "n/a (not finite)" if diff is None else f"{diff:.3g}"
    values = PaddingValues(padding.multiple, padding.max_abs_diff, padding.flops_overhead, padding.exported)
    if not padding.compared:
        # No padded model was built, so there is no proof to claim: say why, as the stage did.
        reason = padding.reason or "nothing to pad"
        if not reason.startswith((NOTHING_TO_PAD, NOT_TRIED)):
            reason = f"{NOTHING_TO_PAD}: {reason}"
        return Check(PADDING, True, f"{reason}; nothing was compared, the unpadded model was exported", values)
    if padding.passed:
        message = f"padded and unpadded models agree (max abs diff {diff_text}); exported {padding.exported}"
        return Check(PADDING, True, message, values)
    reason = padding.reason or "the padded model does not match the unpadded one"
    if padding.exported == "unpadded":
        # A padding its proof rejects is mpconvert's own miss: the model the
        # user gets is the unpadded one, which every other check judged.
        message = (
            f"padding rejected by its proof and not used: {reason}; the unpadded model was exported "
            f"(max abs diff {diff_text})"
        )
        return Check(PADDING, True, message, values)
    return Check(PADDING, False, f"{reason} (max abs diff {diff_text})", values)


def _baselines(v: Validation, baseline: Baseline, max_regression: float) -> list[Check]:
    """One regression check, or one per scored output (by name) when the report has several outputs."""
    if not v.outputs:
        return [_baseline(v, baseline, max_regression)]
    before = baseline.outputs or {}
    checks = []
    for o in v.outputs:
        if o.metric is None:
            continue
        old = before.get(o.name)
        if old is None:
            check = Check(
                f"{BASELINE}: {o.name}",
                False,
                f"the baseline has no measured output {o.name!r}: not comparable",
                MissingBaselineValues(baseline.path),
            )
        else:
            one = replace(baseline, metric=old["metric"], converted=old["converted"])
            check = replace(_baseline(o, one, max_regression), name=f"{BASELINE}: {o.name}")
        checks.append(check)
    return checks


def _baseline(v: Measured, baseline: Baseline, max_regression: float) -> Check:
    values = BaselineValues(v.metric, v.converted, baseline.converted, max_regression, baseline.path)
    if v.metric is None or v.metric != baseline.metric or v.converted is None:
        message = f"this run measured {v.metric or 'no metric'}, the baseline {baseline.metric}: not comparable"
        return Check(BASELINE, False, message, values)
    regression = worse_by(v.metric, baseline.converted, v.converted)
    values = replace(values, regression=regression)
    passed = within(regression, max_regression)
    change = f"worse by {regression:.4f}" if regression > 0 else f"not worse ({-regression:+.4f})"
    message = (
        f"{v.metric} {v.converted:.4f} vs baseline {baseline.converted:.4f} ({baseline.path}), "
        f"{change} {'<=' if passed else '>'} max {max_regression:.4f}"
    )
    return Check(BASELINE, passed, message, values)


def check_speed(speed: SpeedReport | None, min_speedup: float) -> Check:
    """The converted model at least `min_speedup` times as fast as float32, on the machine that measured it.

    Judged on the SavedModel serving path when timed, else the Keras call.
    A report without a measured speed fails: the threshold cannot be met
    by not measuring.
    """
    values = SpeedValues(min_speedup, None)
    paths = speed.paths if speed else {}
    timed = [(name, paths[name]) for name in SPEED_PATHS_JUDGED if name in paths and paths[name].ratio is not None]
    if speed is None or not timed:
        message = (
            f"speed was not measured (the report has no timed {' or '.join(SPEED_PATHS_JUDGED)} path), "
            f"so min {min_speedup:.2f}x cannot be judged; convert again with an mpconvert that measures it"
        )
        return Check(SPEED, False, message, values)
    name, path = timed[0]
    ratio = path.ratio
    assert ratio is not None and path.float32_ms and path.converted_ms  # a ratio needs both times
    measured = speed.measured
    values = SpeedValues(min_speedup, ratio, name, path.float32_ms, path.converted_ms, measured.device, measured.batch)
    passed = within(min_speedup, ratio)
    message = (
        f"{name} {ratio:.2f}x as fast as float32 ({path.float32_ms:.3g} ms -> {path.converted_ms:.3g} ms, "
        f"batch {measured.batch}, {measured.device}) {'>=' if passed else '<'} min {min_speedup:.2f}x"
    )
    return Check(SPEED, passed, message, values)
