"""The converted model against the float32 original, as a result object.

Every output is scored under its own name (`compare_output`, once per output):
its metric and drop where it has labels, its agreement (and with labels the
harm counts) where it is a classifier, and always its largest difference
from the float32 model and its NaN/inf count. `compare` puts
them together: the top-level fields are the primary output's (the first
with labels, else the first), NaN/inf counts and the largest difference
cover every output, and a model with several outputs also gets the list of
each one's measurements (`outputs`). A drop is always "how much worse":
reference minus converted for accuracy, converted minus reference for mean
squared error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from mpconvert.data import tokens
from mpconvert.data.rows import DataSource, Overlap, Split
from mpconvert.data.tasks import Task, TaskKind, sequence_shapes
from mpconvert.options.gate import Thresholds
from mpconvert.options.validate import Metric
from mpconvert.report.compare import compare as compare_outputs
from mpconvert.report.read import load_baseline
from mpconvert.report.sections import OutputValidation, TokenScores, Validation
from mpconvert.report.sections.validation import primary_index
from mpconvert.system.errors import MpconvertError

if TYPE_CHECKING:
    from mpconvert.data.context import Context


def choose_metric(requested: str | None, task: Task, labels: np.ndarray | None = None) -> Metric:
    """--metric, else what the output and its checked labels call for.

    A sigmoid output whose targets are in [0, 1] but not all 0/1 (an
    autoencoder's pixels, probabilities) is scored by mse: there is no class
    to be right about. A sequence output labelled with token ids is scored
    per token: `accuracy` is token accuracy there.
    """
    scored = task.scored_by(labels)
    if requested is None:
        if scored.tokens:
            return Metric.TOKEN_ACCURACY
        return Metric.MSE if scored.kind is TaskKind.REGRESSION else Metric.ACCURACY
    requested = Metric(requested)
    name = task.output.name
    if scored.tokens:
        if requested is Metric.MSE:
            raise MpconvertError(
                f"--metric mse does not score sequence output {name!r}, whose labels are token ids",
                hint="use --metric token_accuracy (the default) or --metric cross_entropy",
            )
        return Metric.TOKEN_ACCURACY if requested is Metric.ACCURACY else requested
    if requested in (Metric.TOKEN_ACCURACY, Metric.CROSS_ENTROPY):
        raise MpconvertError(
            f"--metric {requested} needs a sequence output (batch, time, classes) labelled with token ids, "
            f"but output {name!r} is {task.output.describe()}" + (" without token-id labels" if task.sequence else ""),
            hint="use --metric accuracy or mse for this output"
            + (f", or give token ids {sequence_shapes(task)}" if task.sequence else ""),
        )
    if requested is Metric.ACCURACY and task.kind is TaskKind.REGRESSION:
        raise MpconvertError(
            f"--metric accuracy needs a softmax or sigmoid output, but output {name!r} is neither",
            hint="use --metric mse for this model",
        )
    if requested is Metric.ACCURACY and scored.kind is TaskKind.REGRESSION:
        raise MpconvertError(
            f"--metric accuracy needs 0/1 labels or class ids, but the labels of sigmoid output "
            f"{name!r} are targets in [0, 1] that are not all 0 or 1",
            hint="use --metric mse (the default for such targets)",
        )
    return requested


def choose_metrics(
    requested: tuple[tuple[str | None, str], ...], tasks: tuple[Task, ...], labels: tuple
) -> tuple[Metric, ...]:
    """Each output's metric: the last --metric naming it (or every output), else what its task calls for."""
    chosen = []
    for task, y in zip(tasks, labels):
        wanted = None
        for output, metric in requested:
            if output is None or output == task.output.name:
                wanted = metric
        chosen.append(choose_metric(wanted, task, y))
    return tuple(chosen)


def class_predictions(task: Task, output: np.ndarray) -> np.ndarray:
    if task.kind is TaskKind.SOFTMAX:
        return output.reshape(len(output), -1).argmax(axis=1)
    return (output > 0.5).reshape(len(output), -1)


def hits(task: Task, output: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Which predictions match the labels: one per row (softmax: argmax is
    the class id), or one per unit (sigmoid: the 0.5 threshold is the 0/1 label)."""
    predicted = class_predictions(task, output)
    if task.kind is TaskKind.SOFTMAX:
        return predicted == labels
    return predicted == (labels.reshape(predicted.shape) > 0.5)


def right_rows(task: Task, output: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Rows predicted right: for a sigmoid output, every unit right."""
    matched = np.asarray(hits(task, output, labels))
    return np.asarray(matched.reshape(len(matched), -1).all(axis=1))


def check_lined_up(task: Task, output: np.ndarray, labels: np.ndarray) -> None:
    """Labels the output's values do not line up with are refused naming both shapes: an unknown axis
    (a sequence's length) takes labels of any length when they are read, before the model has run."""
    if task.tokens:
        tokens.check_lined_up(task.output.name, output, labels)
    elif task.kind is not TaskKind.SOFTMAX and labels.size != output.size:
        raise MpconvertError(
            f"the labels of output {task.output.name!r} have shape {labels.shape}, but the model gives {output.shape}",
            hint="store labels shaped like the model's output",
        )


def metric_value(metric: str, task: Task, output: np.ndarray, labels: np.ndarray) -> float:
    task = task.scored_by(labels)
    check_lined_up(task, output, labels)
    if task.tokens:
        if metric == Metric.CROSS_ENTROPY:
            return tokens.cross_entropy(output, labels, task.logits)
        return tokens.accuracy(output, labels)
    if metric == Metric.MSE:
        if task.kind is TaskKind.SOFTMAX:  # class ids against one score per class: one-hot targets
            labels = np.eye(output.shape[-1])[labels]
        return float(np.mean((output.reshape(labels.shape).astype(np.float64) - labels) ** 2))
    return float(np.mean(hits(task, output, labels)))


def decisive_rows(task: Task, output: np.ndarray, resolution: float) -> np.ndarray:
    """Rows whose predicted class is clear by more than `resolution`."""
    rows = output.reshape(len(output), -1).astype(np.float64)
    if task.kind is TaskKind.SOFTMAX:
        if rows.shape[1] < 2:
            return np.ones(len(rows), dtype=bool)
        top2 = np.sort(rows, axis=1)[:, -2:]
        return np.asarray((top2[:, 1] - top2[:, 0]) > resolution)
    return np.asarray((np.abs(rows - 0.5) * 2 > resolution).all(axis=1))


def compare_output(
    reference: np.ndarray,
    converted: np.ndarray,
    labels: np.ndarray | None,
    task: Task,
    metric: str,
    resolution: float = 0.0,
    positions: np.ndarray | None = None,
) -> OutputValidation:
    """One output's measurements: its metric with labels, its agreement and harm for a classifier, its drift.

    `resolution` is the 16-bit format's spacing at 1.0: a prediction whose
    two best scores are closer than that is a tie at that precision, and
    which one wins is rounding, not a change the conversion made, so such
    rows are left out of the agreement (untrained or uncertain models have
    many of them). With labels, the same rows also give the harm counts:
    which of the rows the float32 model got right the converted model
    still gets right (`kept_correct`), and how many it `harmed` and `fixed`.
    A sequence output labelled with token ids is measured per token (tokens.py),
    padding left out: IGNORED labels, or without labels where `positions`
    (the model's padding input) is False.
    """
    name, metric = task.output.name, Metric(metric)
    nonfinite = int(np.count_nonzero(~np.isfinite(converted)))
    found: dict[str, Any] = {}
    scored = task.scored_by(labels)
    if task.kind is TaskKind.SIGMOID and scored.kind is TaskKind.REGRESSION:
        found["note"] = (
            f"the targets of sigmoid output {name!r} are in [0, 1] but not all 0/1 (reconstructions "
            f"or probabilities): scored by {metric}, with no agreement check (there is no class to agree on)"
        )
    task = scored  # class ids on a sigmoid output: argmax, like a softmax
    if labels is not None:
        check_lined_up(task, reference, labels)
    if task.tokens:
        found.update(tokens.agreement_counts(reference, converted, labels, positions, resolution, task.logits))
        found["tokens"] = token_scores(task, reference, converted, labels, positions)
    elif task.kind is not TaskKind.REGRESSION:
        same = class_predictions(task, reference) == class_predictions(task, converted)
        same = same.reshape(len(same), -1).all(axis=1)
        decisive = decisive_rows(task, reference, resolution)
        found["agreement_rows"] = int(decisive.sum())
        found["agreed"] = int(same[decisive].sum())
        if labels is not None:
            found.update(
                harm_counts(
                    right_rows(task, reference, labels)[decisive], right_rows(task, converted, labels)[decisive]
                )
            )
    ref_value = conv_value = None
    if labels is not None:
        # A NaN/inf output makes mse NaN: stored as None (strict JSON has no NaN), and the gate fails it.
        ref_value = _finite(metric_value(metric, task, reference, labels))
        conv_value = _finite(metric_value(metric, task, converted, labels))
    # The raw figures only: the drop and the shares are derived from them as a re-check derives them.
    return OutputValidation(
        name=name,
        metric=metric if labels is not None else None,
        reference=ref_value,
        converted=conv_value,
        drop=None,
        max_abs_diff=compare_outputs([reference], [converted]).max_abs_diff,
        rows=len(reference),
        nonfinite_outputs=nonfinite,
        **found,
    ).derived()


def token_scores(
    task: Task, reference: np.ndarray, converted: np.ndarray, labels: np.ndarray | None, positions: np.ndarray | None
) -> TokenScores:
    """A sequence output's token counts, and with labels both models' cross-entropy."""
    if labels is not None:
        scored = int(tokens.scored(labels).sum())
    elif positions is not None and positions.shape == reference.shape[:-1]:
        scored = int(positions.sum())
    else:
        scored = int(np.prod(reference.shape[:-1]))
    ce: tuple[float | None, float | None] = (None, None)
    if labels is not None:
        ce = (
            _finite(tokens.cross_entropy(reference, labels, task.logits)),
            _finite(tokens.cross_entropy(converted, labels, task.logits)),
        )
    return TokenScores(
        scored=scored,
        padding=int(np.prod(reference.shape[:-1])) - scored,
        padding_from=task.padding.source if task.padding else None,
        reference_cross_entropy=ce[0],
        converted_cross_entropy=ce[1],
    ).derived()


def compare(
    reference: list[np.ndarray],
    converted: list[np.ndarray],
    split: Split,
    tasks: tuple[Task, ...] | Task,
    metrics: tuple[str, ...] | str,
    source: str,
    resolution: float = 0.0,
    overlap: Overlap | None = None,
    unread_keys: tuple[str, ...] = (),
) -> Validation:
    """Compare every output on one split (`compare_output`); the top-level fields are the primary output's."""
    tasks = (tasks,) if isinstance(tasks, Task) else tasks
    metrics = (metrics,) * len(tasks) if isinstance(metrics, str) else metrics
    outputs = [
        compare_output(ref, conv, labels, task, metric, resolution, _positions(task, split))
        for ref, conv, labels, task, metric in zip(reference, converted, split.labels, tasks, metrics)
    ]
    primary = outputs[primary_index([o.metric for o in outputs])]
    nonfinite = sum(o.nonfinite_outputs for o in outputs)
    by_output = {o.name: o.nonfinite_outputs for o in outputs if o.nonfinite_outputs}
    note = primary.note
    if not split.labelled:
        note = "no labelled data: the metric was not measured, only the output drift on generated inputs"
    if nonfinite:
        where = ", ".join(f"{n} in output {name!r}" for name, n in by_output.items())
        note = (
            f"the converted model produced {nonfinite} NaN/inf output value(s) ({where}): activations overflow "
            "16 bits; try mixed_bfloat16 or --keep-float32 on the overflowing layers"
        )
    return Validation.of(
        outputs, data=DataSource(source), rows=split.rows, note=note, overlap=overlap, unread_keys=unread_keys or None
    )


def _positions(task: Task, split: Split) -> np.ndarray | None:
    """Where the model's padding input marks tokens (for agreement without labels); None without one."""
    return task.padding.positions(split.inputs) if task.padding and task.sequence else None


def harm_counts(reference_right: np.ndarray, converted_right: np.ndarray) -> dict[str, Any]:
    """The harm counts (OutputValidation's keywords) from which rows each model got right; `kept_correct` is
    derived from them (OutputValidation.derived)."""
    kept_correct_rows = int(reference_right.sum())
    still_right = int((reference_right & converted_right).sum())
    return {
        "harmed": kept_correct_rows - still_right,
        "fixed": int((~reference_right & converted_right).sum()),
        "kept_correct_rows": kept_correct_rows,
    }


def _finite(value: float) -> float | None:
    return value if np.isfinite(value) else None


def judge(context: Context, reference: list[np.ndarray], converted: list[np.ndarray]) -> Validation:
    """`compare` on the validation split, with the conversion's tasks, metrics and outputs."""
    return compare(
        reference,
        converted,
        context.data.validation,
        context.tasks,
        context.metrics,
        context.data.source,
        context.precision.resolution,
        context.data.overlap,
        context.data.unread_keys,
    )


def judging(options: Any, tasks: tuple[Task, ...], data: Any) -> tuple[tuple[Metric, ...], Thresholds]:
    """(each output's metric, the thresholds the gate judges by), for a ConvertOptions and the run's data.

    Resolved before any conversion work, so that a bad --baseline or an
    unknown output in --metric/--max-drop fails fast.
    """
    names = [t.output.name for t in tasks]
    for flag, given in (("--metric", options.validate.metric), ("--max-drop", options.gate.max_drop)):
        unknown = [output for output, _ in given if output is not None and output not in names]
        if unknown:
            raise MpconvertError(
                f"{flag} {unknown[0]}=... names an output the model does not have",
                hint=f"the model's outputs are: {', '.join(names)}",
            )
    # The labels decide it too: a sigmoid output with [0, 1] targets is a reconstruction (mse).
    metrics = choose_metrics(options.validate.metric, tasks, data.validation.labels)
    measured = {t.output.name: m for t, m, y in zip(tasks, metrics, data.validation.labels) if y is not None}
    baseline = load_baseline(options.gate.baseline, measured) if options.gate.baseline else None
    return metrics, Thresholds.defaults(options.precision).overridden(options.gate, baseline)
