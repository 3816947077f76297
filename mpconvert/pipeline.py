"""The one place where the stage order lives.

load -> rewrite -> finetune -> validate -> pad -> export -> report. Each stage is a function
with explicit inputs that returns a result object; this module only wires
them together, times them and stages the output folder.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Callable, Iterator

from .data import EvalData, Split, Task, is_callable_spec, load_callable, load_npz
from .finetune import StepCallback, finetune
from .export import export_all
from .gate import Thresholds
from .load import Loaded, load_model, saved_loss
from .options import ConvertOptions, LoadOptions, PadOptions, RewriteOptions, ValidateOptions
from .outdir import check_output, staged_output
from .pad import PadPlan, pad, plan_padding
from .report import Report
from .configs import model_class, model_config
from .rewrite import Plan, output_activation, plan_conversion, rewrite
from .signature import Signature, generate_inputs, signature_of
from .validate import choose_metric, validate

@dataclass(frozen=True)
class Hooks:
    """How a caller watches a run: stage starts and fine-tune steps."""

    stage: Callable[[str], None] = lambda name: None
    finetune_step: StepCallback | None = None


@dataclass
class _Clock:
    hooks: Hooks
    timings: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self.hooks.stage(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = time.perf_counter() - start


def task_of(loaded: Loaded, signature: Signature) -> Task:
    activation = output_activation(model_config(loaded.model), model_class(loaded.model))
    if activation in ("softmax", "log_softmax"):
        kind = "softmax"
    elif activation == "sigmoid":
        kind = "sigmoid"
    else:
        kind = "regression"
    return Task(kind, signature.outputs[0])


def eval_data(loaded: Loaded, signature: Signature, task: Task, options: ValidateOptions) -> EvalData:
    if isinstance(options.data, str) and is_callable_spec(options.data):
        return load_callable(options.data, signature, task)
    if options.data is not None:
        return load_npz(Path(options.data), signature, task)
    inputs = generate_inputs(loaded.model, signature, options.generated_samples, options.seed)
    return EvalData(Split(tuple(inputs), None), None, "generated")


def inspect(options: LoadOptions, rewrite_options: RewriteOptions, pad_options: PadOptions) -> tuple[Loaded, Plan, PadPlan | None]:
    """The per-layer policy and padding plans, without converting anything."""
    loaded = load_model(options)
    with loaded.framework.preserved_global_policy(), loaded.framework.deserialization(loaded.safe):
        plan = plan_conversion(model_config(loaded.model), model_class(loaded.model), rewrite_options)
        padding = plan_padding(loaded.model, loaded.framework, pad_options)[1] if pad_options.multiple else None
    return loaded, plan, padding


def convert(options: ConvertOptions, hooks: Hooks = Hooks()) -> Report:
    data_file = options.validate.data
    inputs = [options.load.path] + ([Path(data_file)] if data_file and not is_callable_spec(str(data_file)) else [])
    out = check_output(options.out, inputs, options.force)
    clock = _Clock(hooks)
    with clock.stage("load"):
        loaded = load_model(options.load)
        signature = signature_of(loaded.model)
        task = task_of(loaded, signature)
        metric = choose_metric(options.validate.metric, task)
        data = eval_data(loaded, signature, task, options.validate)
        # Resolved before any conversion work, so that a bad --baseline fails fast.
        measured = metric if data.validation.labels is not None else None
        defaults = Thresholds.defaults(options.rewrite.policy, options.validate.max_drop)
        thresholds = defaults.overridden(options.gate, measured)
    with loaded.framework.deserialization(loaded.safe):
        with clock.stage("rewrite"):
            smoke = [x[:2] for x in data.validation.inputs]
            rewritten = rewrite(loaded.model, loaded.framework, options.rewrite, smoke)
        tuning = None
        finetune_options = options.finetune.resolved(has_train=data.train is not None)
        if finetune_options.steps:
            with clock.stage("finetune"):
                tuning = finetune(
                    loaded.framework,
                    loaded.model,
                    rewritten.model,
                    data,
                    task,
                    metric,
                    options.rewrite.policy,
                    finetune_options,
                    saved_loss=saved_loss(loaded),
                    on_step=hooks.finetune_step,
                )
        with clock.stage("validate"):
            validation, _ = validate(
                loaded.model, rewritten.model, data, task, metric, options.validate.max_drop, options.rewrite.policy
            )
        exported, padding = rewritten.model, None
        if options.pad.multiple:
            with clock.stage("pad"):
                rows = [x[: options.export.parity_samples] for x in data.validation.inputs]
                padding = pad(rewritten.model, loaded.framework, options.pad, rows, options.rewrite.policy)
                exported = padding.model
        report = Report(
            policy=options.rewrite.policy,
            source={
                "path": str(options.load.path),
                "format": loaded.format,
                "loader": loaded.framework.name,
                "inputs": [vars(s) for s in signature.inputs],
                "outputs": [vars(s) for s in signature.outputs],
            },
            layers=rewritten.plan.as_dicts(),
            validation=validation.as_dict(),
            finetune=tuning.as_dict() if tuning else None,
            padding=padding.report if padding else None,
            timings=clock.timings,
            out=str(out),
            thresholds=thresholds,
        )
        with staged_output(out) as staging:
            with clock.stage("export"):
                artifacts = export_all(
                    exported, loaded.framework, signature, list(data.validation.inputs), staging, options.export
                )
            report.artifacts = [a.as_dict() for a in artifacts]
            report.write(staging)
    return report
