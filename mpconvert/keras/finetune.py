"""A brief fine-tune of the converted model, with loss scaling and health checks.

16-bit compute shifts a model's numbers slightly; a few hundred steps in the
new precision let the float32 master weights adapt. It is also where mixed
precision fails quietly in practice, so every step is watched: the loss must
stay finite, the loss scale must not collapse to 1, and most steps must not
be skipped. On any of those the run stops and the weights from before the
fine-tune are restored. Afterwards the better of the two weight sets, by the
validation metric, is kept (no harm).

The loop is explicit rather than `fit` so that skipped steps and the loss
scale can be observed per step, through both frameworks' LossScaleOptimizer.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from mpconvert.data.context import Context
from mpconvert.data.tasks import IGNORED, Task, TaskKind
from mpconvert.keras.configs import model_config
from mpconvert.keras.frameworks import Framework
from mpconvert.keras.load import Loaded
from mpconvert.keras.state import rebuild
from mpconvert.options.finetune import FinetuneOptions
from mpconvert.options.precision import Precision
from mpconvert.report.measure import metric_value
from mpconvert.report.sections import Finetune, FinetuneKept
from mpconvert.report.sections.stages import History, LossRange, LossScale, OutputTuning, StepTime
from mpconvert.report.sections.validation import worse_by
from mpconvert.runners.keras import predict
from mpconvert.system.errors import MpconvertError
from mpconvert.system.hooks import StepCallback

# A fresh dynamic loss scale starts at 2**15 and halves on each overflow, so
# a handful of skipped steps at the start is normal; more than half of all
# steps, once there have been this many, is not.
MIN_STEPS_FOR_SKIP_CHECK = 20
MAX_SKIPPED_SHARE = 0.5
# Steps timed on the float32 original for the step-time ratio (after one
# warm-up step that traces the function).
TIMED_STEPS = 5


# Enough points for a chart, few enough that a 10,000-step fine-tune keeps report.json small.
HISTORY_POINTS = 200


def history_of(losses: list[float], scales: list[float]) -> History:
    """Every step's loss (and scale), thinned evenly to HISTORY_POINTS with the last step always in."""
    count = len(losses)
    stride = max(1, -(-count // HISTORY_POINTS))
    picked = sorted({*range(0, count, stride), count - 1}) if count else []
    return History(
        tuple(i + 1 for i in picked),
        tuple(float(losses[i]) if np.isfinite(losses[i]) else None for i in picked),
        tuple(float(scales[i]) for i in picked) if len(scales) == count else None,
    )


def default_loss(task: Task) -> tuple[Any, str]:
    """(Keras loss identifier, its name) for an output by its task: a logits output's cross-entropy
    is taken from logits, as keras-hub's causal LMs compile theirs."""
    if task.kind is TaskKind.SOFTMAX and task.logits:
        config = {"class_name": "SparseCategoricalCrossentropy", "config": {"from_logits": True}}
        return config, "sparse_categorical_crossentropy (from logits)"
    name = {
        TaskKind.SOFTMAX: "sparse_categorical_crossentropy",
        TaskKind.SIGMOID: "binary_crossentropy",
    }.get(task.kind, "mean_squared_error")
    return name, name


def resolve_loss(framework: Framework, requested: str | None, saved: Any, task: Task) -> tuple[Any, str]:
    """(loss function, its name): --loss, else the model's saved loss, else by output kind."""
    for identifier, origin in ((requested, "--loss"), (saved, "saved with the model")):
        if identifier is None:
            continue
        try:
            function = framework.loss_function(identifier)
        except (ValueError, TypeError) as exc:
            if origin == "--loss":
                raise MpconvertError(
                    f"unknown loss {identifier!r} for {framework.name}: {exc}",
                    hint="use a Keras loss name such as sparse_categorical_crossentropy, "
                    "binary_crossentropy or mean_squared_error",
                ) from None
            continue  # a custom saved loss we cannot rebuild: fall back to the default
        name = identifier if isinstance(identifier, str) else getattr(function, "name", str(identifier))
        return function, f"{name} ({origin})"
    identifier, name = default_loss(task)
    what = ("sequence " if task.sequence else "") + ("logits" if task.logits else str(task.kind))
    return framework.loss_function(identifier), f"{name} (default for a {what} output)"


def loss_task(task: Task, labels: np.ndarray) -> Task:
    """The task an output's loss is chosen for: a sequence head without activation labelled with token ids
    is a logits classifier (Task.scored_by); every other output keeps its own (a sigmoid's stays sigmoid)."""
    return task.scored_by(labels) if task.sequence else task


def saved_loss_for(saved: Any, index: int, name: str) -> Any:
    """One output's loss from what the model was compiled with: one loss, a list by output, or a dict by name."""
    if isinstance(saved, (list, tuple)):
        return saved[index] if index < len(saved) else None
    if isinstance(saved, dict) and "class_name" not in saved:
        return saved.get(name)
    return saved


def takes_class_ids(name: str, loss: Any = None) -> bool:
    """Whether the loss `name` (the function `loss`) compares class ids (n,) with the output, as sparse losses do.

    Every other Keras loss (categorical or binary cross-entropy, KL
    divergence, mse, hinge) compares rows shaped like the output. The name
    is looked for wherever the two frameworks keep it: the identifier
    ("sparse_categorical_crossentropy", "SparseCategoricalCrossentropy"), a
    Loss object's `name` and wrapped `fn`, a function's `__name__`.
    """
    wrapped = getattr(loss, "fn", None)
    names = [name, getattr(loss, "name", ""), getattr(loss, "__name__", ""), type(loss).__name__]
    names += [getattr(wrapped, "__name__", ""), type(wrapped).__name__]
    return any("sparse" in str(n).lower() for n in names)


def _one_hot_rows(labels: np.ndarray) -> bool:
    return (
        labels.ndim == 2 and labels.shape[1] > 1 and bool(np.isin(labels, (0, 1)).all() and (labels.sum(1) == 1).all())
    )


def training_labels(task: Task, labels: np.ndarray, loss_name: str, loss: Any = None) -> np.ndarray:
    """An output's training labels in the form its loss compares with the output.

    The checked labels are class ids (n,) for a softmax output and for a
    Dense(k > 1, "sigmoid") output labelled with ids (scored by argmax),
    whether the file held ids or one-hot rows; every other output's are
    shaped like the output. A sparse loss takes ids, any other loss rows
    shaped like the output: categorical cross-entropy saved with a softmax
    classifier gets the ids one-hot, and so does binary cross-entropy for
    sigmoid units ((n,) ids against (n, k) outputs would broadcast into a
    meaningless loss); a sparse loss on an output scored by its values (a
    logits head saved with SparseCategoricalCrossentropy(from_logits=True))
    gets one-hot rows back as ids. Labels a sparse loss cannot take
    (multi-label rows, regression targets) are refused, naming the output,
    the loss and the labels' shape.
    """
    sparse = takes_class_ids(loss_name, loss)
    if task.scored_by(labels).tokens:
        # Token ids (IGNORED at padding, which the step's weights leave out): any valid id stands in there.
        known = np.where(labels == IGNORED, 0, labels)
        if sparse:
            return known
        return np.eye(task.output.shape[-1] or 0, dtype=np.float32)[known] * (labels != IGNORED)[..., None]
    ids = labels.ndim == 1 and task.scored_by(labels).kind is TaskKind.SOFTMAX
    if ids and not sparse:
        return np.eye(task.output.shape[-1] or 0, dtype=np.float32)[labels]
    if ids or not sparse:
        return labels
    if _one_hot_rows(labels):
        return labels.argmax(axis=1)
    shape = "(n, " + ", ".join(str(d) for d in labels.shape[1:]) + ")" if labels.ndim > 1 else "(n,)"
    raise MpconvertError(
        f"output {task.output.name!r}: the loss {loss_name} takes class ids (n,), but the training labels "
        f"are {shape} {'rows that are not one-hot' if labels.ndim == 2 and labels.shape[1] > 1 else 'targets'}",
        hint="give class ids (or one-hot rows) for this output, or pass --loss with a loss that compares "
        "labels shaped like the output (e.g. binary_crossentropy, mean_squared_error)",
    )


def token_weights(task: Task, labels: np.ndarray) -> np.ndarray | None:
    """1 per token and 0 per padding position of a sequence output's labels; None where every position counts."""
    if not task.scored_by(labels).tokens or not (labels == IGNORED).any():
        return None
    return (labels != IGNORED).astype(np.float32)


class _Batches:
    """Deterministic mini-batches (inputs, the trained outputs' labels and token weights): a fresh seeded
    permutation per epoch."""

    def __init__(
        self,
        inputs: tuple[np.ndarray, ...],
        labels: list[np.ndarray],
        batch_size: int,
        seed: int,
        weights: list[np.ndarray | None] | None = None,
    ):
        self.inputs, self.labels = inputs, labels
        self.weights = weights or [None] * len(labels)
        rows = len(inputs[0])
        self.rows = rows
        self.batch_size = min(batch_size, rows)
        self.rng = np.random.default_rng(seed)
        self.order: np.ndarray = np.empty(0, dtype=np.int64)

    def next(self) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray | None]]:
        if len(self.order) < self.batch_size:
            self.order = np.concatenate([self.order, self.rng.permutation(self.rows)])
        take, self.order = self.order[: self.batch_size], self.order[self.batch_size :]
        weights = [None if w is None else w[take] for w in self.weights]
        return [x[take] for x in self.inputs], [y[take] for y in self.labels], weights


class Trainer:
    """One model, one optimizer, and a traced gradient step.

    `loss_fn` is one loss, or one per trained output with `heads` the
    outputs' indices (in the signature's order): the step minimizes their
    sum, as Keras does for a model compiled with per-output losses.
    """

    def __init__(
        self,
        framework: Framework,
        model: Any,
        loss_fn: Any,
        learning_rate: float,
        loss_scaling: bool,
        heads: tuple[int, ...] = (0,),
    ):
        import tensorflow as tf

        from mpconvert.data.signature import signature_of

        losses = list(loss_fn) if isinstance(loss_fn, (list, tuple)) else [loss_fn]
        self.framework = framework
        self.model = model
        self.scaled = loss_scaling
        self.optimizer = framework.optimizer(learning_rate, loss_scaling)
        variables = model.trainable_variables
        signature = signature_of(model)
        if framework.is_keras3:
            self.optimizer.build(variables)

        def head_loss(fn, y, output, weights):
            if weights is None:
                return tf.reduce_mean(tf.cast(fn(y, output), tf.float32))
            # A sequence output with padding: the loss of its tokens alone, a mean over them (a batch of
            # nothing but padding adds 0, not the NaN of an empty mean).
            keep = weights > 0
            return tf.cond(
                tf.reduce_any(keep),
                lambda: tf.reduce_mean(
                    tf.cast(fn(tf.boolean_mask(y, keep), tf.boolean_mask(output, keep)), tf.float32)
                ),
                lambda: tf.constant(0.0),
            )

        @tf.function(reduce_retracing=True)
        def gradients(inputs, labels, weights):
            with tf.GradientTape() as tape:
                outputs = signature.output_list(model(signature.feed(inputs), training=True))
                loss = tf.add_n(
                    [
                        head_loss(fn, y, outputs[head], w)
                        for fn, y, head, w in zip(losses, labels, heads, weights or [None] * len(labels))
                    ]
                )
                if model.losses:
                    loss += tf.add_n([tf.cast(x, tf.float32) for x in model.losses])
                target = framework.scale_loss(self.optimizer, loss) if loss_scaling else loss
            grads = tape.gradient(target, variables)
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads if g is not None])
            return loss, grads, finite

        @tf.function(reduce_retracing=True)
        def apply(grads):
            framework.apply_gradients(self.optimizer, list(grads), variables, loss_scaling)

        self._gradients = gradients
        self._apply = apply

    def step(
        self,
        inputs: list[np.ndarray],
        labels: np.ndarray | list[np.ndarray],
        weights: list[np.ndarray | None] | None = None,
    ) -> tuple[float, bool]:
        """Run one step (labels: one array per trained output; weights: a sequence output's tokens, None where
        every position counts); returns (loss, whether the update was applied)."""
        labels = labels if isinstance(labels, list) else [labels]
        loss, grads, finite = self._gradients(inputs, labels, weights or [None] * len(labels))
        finite = bool(finite)
        # A LossScaleOptimizer must see non-finite gradients: skipping them
        # and halving the scale is its job. Without loss scaling a NaN update
        # would ruin the weights, so it is dropped here.
        if finite or self.scaled:
            self._apply(grads)
        return float(loss), finite

    def loss_scale(self) -> float | None:
        return self.framework.loss_scale(self.optimizer) if self.scaled else None


def _timed_float32_step(
    framework: Framework, original: Any, losses: list, heads: tuple[int, ...], options: FinetuneOptions, batches: list
) -> float:
    """Median train-step time of a float32 copy of the original, in ms.

    A copy, because the original's weights must never change.
    """
    copy = rebuild(framework, original, model_config(original))
    trainer = Trainer(framework, copy, losses, options.learning_rate, loss_scaling=False, heads=heads)
    trainer.step(*batches[0])  # traces
    times = []
    for batch in batches[1 : TIMED_STEPS + 1]:
        start = time.perf_counter()
        trainer.step(*batch)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def _health(step: int, loss: float, skipped: int, scale: float | None, precision: Precision) -> tuple[str, str] | None:
    """(problem, advice) when training went wrong, else None."""
    if not np.isfinite(loss):
        return (
            f"the loss became {loss} at step {step}: activations overflow 16 bits",
            "keep the overflowing layers in float32 with --keep-float32 NAME, "
            + ("or use mixed_bfloat16 (float32's range), " if precision.overflows else "")
            + "or lower --learning-rate",
        )
    if scale is not None and scale <= 1.0:
        return (
            f"the loss scale collapsed to {scale:g} by step {step} ({skipped} steps skipped): "
            "gradients overflow float16 even unscaled, so the model cannot learn",
            "keep the layers with huge gradients in float32 (--keep-float32 NAME), use mixed_bfloat16, "
            "or lower --learning-rate",
        )
    if step >= MIN_STEPS_FOR_SKIP_CHECK and skipped > MAX_SKIPPED_SHARE * step:
        return (
            f"{skipped} of {step} steps were skipped because their gradients were not finite",
            "lower --learning-rate, use mixed_bfloat16, or keep unstable layers in float32 with --keep-float32",
        )
    return None


def finetune(
    context: Context,
    loaded: Loaded,
    model: Any,
    options: FinetuneOptions,
    seed: int,
    on_step: StepCallback | None = None,
) -> Finetune:
    """Fine-tune `model` (the converted one) in place; the original (`loaded.model`) is only read."""
    framework, data = loaded.framework, context.data
    train = data.train
    if train is None or not train.labelled:
        raise MpconvertError(
            "fine-tuning needs training data, but the data has no x_train/y_train",
            hint="add x_train and y_train to the .npz, or pass --finetune-steps 0",
        )
    started = time.perf_counter()
    framework.set_seed(seed)
    names = [spec.name for spec in context.signature.outputs]
    trained = {i: y for i, y in enumerate(train.labels) if y is not None}
    heads = tuple(trained)
    losses, loss_names, labels, weights = [], [], [], []
    for i in heads:
        saved = saved_loss_for(loaded.saved_loss, i, names[i])
        fn, name = resolve_loss(framework, options.loss, saved, loss_task(context.tasks[i], trained[i]))
        losses.append(fn)
        loss_names.append(name if len(names) == 1 else f"{names[i]}: {name}")
        labels.append(training_labels(context.tasks[i], trained[i], name, fn))
        weights.append(token_weights(context.tasks[i], trained[i]))
    validation = data.validation
    scored_labels = {i: y for i, y in enumerate(validation.labels) if y is not None}
    scored = list(scored_labels)
    before_weights = model.get_weights()

    def metrics_now() -> dict[int, float]:
        outputs = predict(model, validation.inputs)
        return {i: metric_value(context.metrics[i], context.tasks[i], outputs[i], y) for i, y in scored_labels.items()}

    before = metrics_now()

    batches = _Batches(train.inputs, labels, options.batch_size, seed, weights)
    timing_batches = [batches.next() for _ in range(TIMED_STEPS + 1)]
    float32_ms = _timed_float32_step(framework, loaded.model, losses, heads, options, timing_batches)
    batches = _Batches(train.inputs, labels, options.batch_size, seed, weights)  # the same batches again

    trainer = Trainer(
        framework, model, losses, options.learning_rate, loss_scaling=context.precision.loss_scaling, heads=heads
    )
    initial_scale = trainer.loss_scale()
    scales: list[float] = []
    losses_seen: list[float] = []
    times: list[float] = []
    skipped = 0
    problem = None
    requested = options.steps or 0  # resolved by the caller: FinetuneOptions.resolved
    for step in range(1, requested + 1):
        inputs, batch_labels, batch_weights = batches.next()
        start = time.perf_counter()
        loss, applied = trainer.step(inputs, batch_labels, batch_weights)
        times.append(time.perf_counter() - start)
        skipped += not applied
        losses_seen.append(loss)
        scale = trainer.loss_scale()
        if scale is not None:
            scales.append(scale)
        if on_step:
            on_step(step, requested, loss, scale)
        problem = _health(step, loss, skipped, scale, context.precision)
        if problem:
            break

    after: dict[int, float] = {}
    if problem:
        model.set_weights(before_weights)
        kept = FinetuneKept.REWRITTEN
    else:
        after = metrics_now()
        # No harm: the fine-tuned weights only if no scored output got worse.
        if all(worse_by(context.metrics[i], before[i], after[i]) <= 0 for i in scored):
            kept = FinetuneKept.FINETUNED
        else:
            model.set_weights(before_weights)
            kept = FinetuneKept.REWRITTEN
    first = scored[0] if scored else heads[0]
    losses = losses_seen
    converted_ms = statistics.median(times[1:] or times) * 1000
    finite_losses = [x for x in losses if np.isfinite(x)]
    return Finetune(
        steps=len(losses),
        requested_steps=requested,
        skipped_steps=skipped,
        loss_scale=LossScale(initial_scale, scales[-1], min(scales)) if initial_scale is not None and scales else None,
        loss=LossRange(finite_losses[0] if finite_losses else None, losses[-1] if np.isfinite(losses[-1]) else None),
        metric=context.metrics[first],
        metric_before=before.get(first),
        metric_after=after.get(first),
        kept=kept,
        seconds=time.perf_counter() - started,
        step_time=StepTime(round(float32_ms, 3), round(converted_ms, 3)),
        step_time_ratio=round(converted_ms / float32_ms, 3) if float32_ms > 0 else None,
        healthy=problem is None,
        problem=problem[0] if problem else None,
        advice=problem[1] if problem else None,
        loss_function="; ".join(loss_names),
        learning_rate=options.learning_rate,
        batch_size=options.batch_size,
        seed=seed,
        outputs=(
            {names[i]: OutputTuning(context.metrics[i], before[i], after.get(i)) for i in scored}
            if len(names) > 1
            else None
        ),
        history=history_of(losses, scales),
    )
