"""Automatic float32 where 16 bits break: the lint's keeps, then the search's.

`--auto-keep lint` keeps float32 what the numeric lint flags before the
rewrite; `search` also runs the accuracy-driven search when the gate's
accuracy or agreement check still fails; `off` is the behaviour before
either existed (the gate fails and says so). Every layer kept here reaches
the report's `layers` with `pinned` saying why, with its number.
"""

from __future__ import annotations

import dataclasses

from mpconvert.data.context import Context
from mpconvert.keras.configs import model_class, model_config
from mpconvert.keras.lint import Lint, lint
from mpconvert.keras.load import Loaded
from mpconvert.keras.rewrite import Plan, Rewritten, plan_conversion
from mpconvert.keras.search import search
from mpconvert.numerics.search import Goal, Search, search_reason
from mpconvert.options.rewrite import LINT_ROWS, RewriteOptions

__all__ = ["keep_by_lint", "keep_by_search"]


def _original_names(plan: Plan) -> dict[str, str]:
    """Plan name -> the original model's layer name (a split head's 16-bit part is NAME_linear)."""
    split = {s.path.rpartition("/")[0] + ("/" if "/" in s.path else "") + s.linear_name: s.path for s in plan.splits}
    return {name: split.get(name, name) for name in plan.mixed}


def keep_by_lint(context: Context, loaded: Loaded, options: RewriteOptions) -> tuple[Lint, RewriteOptions]:
    """Lint the float32 model; the rewrite options with what it flags kept float32."""
    original = loaded.model
    plan = plan_conversion(model_config(original), model_class(original), options)
    candidates = set(_original_names(plan).values())
    rows = [x[:LINT_ROWS] for x in context.data.validation.inputs]
    found = lint(original, loaded.framework, context.precision, rows, candidates)
    return found, dataclasses.replace(options, auto_keep=options.auto_keep + tuple(found.keep.items()))


def keep_by_search(
    context: Context,
    loaded: Loaded,
    rewritten: Rewritten,
    options: RewriteOptions,
    goal: Goal,
) -> tuple[Search, RewriteOptions]:
    """Search for the layers to keep; the rewrite options with them kept (unchanged if none passes)."""
    names = _original_names(rewritten.plan)
    smoke = [x[:2] for x in context.data.validation.inputs]
    found = search(context, loaded, rewritten.plan, goal, smoke, rewritten.model, names)
    if found.validation is None:
        return found, options
    reason = search_reason(goal.before, found.validation)
    extra = tuple((names.get(name, name), reason) for name in found.kept)
    return found, dataclasses.replace(options, auto_keep=options.auto_keep + extra)
