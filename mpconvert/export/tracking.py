"""A conversion as an MLflow run, and its SavedModel as a registered model version.

`start` checks the tracking server before any conversion work (a server that
is down or refuses access fails the run at once, or with --mlflow-optional
is reported and skipped); `Tracker.log` records the written output folder as
one run: the resolved options as params, every figure the gate judged as
metrics, the verdict and the policy as tags, the folder's files as
artifacts; then, only when the gate passed, `--register` adds a model
version whose source is the run's savedmodel/. A batch makes a parent run
(`parent_run`) whose id reaches each worker in its tracking options, so
every conversion's run is its child.

MLflow is imported here and only when tracking is asked for: the base
install works without it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mpconvert.options.tracking import TrackingOptions
from mpconvert.report.batch import BatchSummary
from mpconvert.report.report import Report
from mpconvert.system.errors import MpconvertError
from mpconvert.system.hooks import NO_HOOKS, Hooks

INSTALL_HINT = "pip install 'mpconvert[mlflow]'"
# Not "mlflow": a stage name in the report's `skipped` list.
SKIPPED_STAGE = "mlflow"
# MLflow's own limits (mlflow.utils.validation): a param value's length, entries per log_batch call.
_MAX_PARAM_VALUE = 6000
_PARAMS_PER_CALL = 100
_METRICS_PER_CALL = 1000
# The pre-flight must fail in seconds, not after MLflow's default 7 retries with backoff (minutes).
_PREFLIGHT_ENVIRONMENT = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
# A metric name may hold word characters, . - / space and colon; "/" separates our levels.
_NOT_IN_METRIC_NAMES = re.compile(r"[^\w.\-]+")


def _mlflow() -> Any:
    try:
        import mlflow
    except ImportError:
        raise MpconvertError(
            "--mlflow needs MLflow, which is not installed here", hint=f"install it with {INSTALL_HINT}"
        ) from None
    # MLflow prints "View run ... at" on stdout when a run ends: stdout is --json's.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    # Its INFO lines (waiting for a model version) would interleave with the summary on stderr.
    logging.getLogger("mlflow").setLevel(max(logging.getLogger("mlflow").getEffectiveLevel(), logging.WARNING))
    return mlflow


@contextlib.contextmanager
def _quick_requests() -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in _PREFLIGHT_ENVIRONMENT}
    os.environ.update(_PREFLIGHT_ENVIRONMENT)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _reason(exc: BaseException) -> str:
    """What went wrong, in a few words: the OS's reason where a connection failed, else MLflow's first line."""
    text = str(exc)
    errno = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if errno:
        return errno.group(1).strip()
    if "timed out" in text.lower():
        return "the request timed out"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:200]


def _answered(exc: BaseException) -> int | None:
    """The HTTP status the server answered with; None when no answer came (MLflow then says 500 all the same)."""
    try:
        from mlflow.exceptions import RestException
    except ImportError:
        return None
    if isinstance(exc, RestException):  # an error answer in MLflow's JSON form
        return int(exc.get_http_status_code())
    found = re.search(r"failed with error code (\d{3})", str(exc))  # any other answer that was not 200
    return int(found.group(1)) if found else None


def server_problem(options: TrackingOptions, exc: BaseException) -> MpconvertError:
    """A tracking-server fault as the one message the user sees: unreachable, access refused, or an error answer."""
    status = _answered(exc)
    code = getattr(exc, "error_code", None)
    where = f"MLflow tracking server {options.shown_uri}"
    if status in (401, 403) or code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        status = status if status in (401, 403) else (401 if code == "UNAUTHENTICATED" else 403)
        word = "401 Unauthorized" if status == 401 else "403 Forbidden"
        return MpconvertError(
            f"{where} refused access ({word})",
            hint="set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) for it, "
            "or pass --mlflow-optional to convert untracked",
        )
    if status is not None:  # it answered, with an error of its own
        # MLflow's text ends with the whole response body (an HTML page, for a URI that is no tracking server).
        message = str(getattr(exc, "message", None) or _reason(exc)).split(". Response body", 1)[0]
        return MpconvertError(
            f"{where} failed a request (HTTP {status}): {message.strip().splitlines()[0][:200]}",
            hint="check the server's log and that the URI names an MLflow tracking server (--mlflow or "
            "MLFLOW_TRACKING_URI), or pass --mlflow-optional to convert untracked",
        )
    return MpconvertError(
        f"{where} cannot be reached: {_reason(exc)}",
        hint="start the server or correct the URI (--mlflow or MLFLOW_TRACKING_URI), "
        "or pass --mlflow-optional to convert untracked",
    )


class RunNotRecorded(MpconvertError):
    """The output folder is written and complete, but the server failed while its run was logged."""


@dataclass(frozen=True)
class Logged:
    """What a run recorded: its id and, when --register made one, the model version."""

    run_id: str
    experiment_id: str
    artifact_uri: str
    version: str | None = None


@dataclass
class Tracker:
    """The checked tracking server for one conversion (or a batch's parent run); `client` None: untracked."""

    options: TrackingOptions
    client: Any = None
    skipped: str | None = None  # why tracking was skipped (--mlflow-optional), for the report and the terminal
    hooks: Hooks = NO_HOOKS

    @property
    def active(self) -> bool:
        return self.client is not None

    def experiment_id(self) -> str:
        found = self.client.get_experiment_by_name(self.options.experiment)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(self.options.experiment)
        except Exception:  # another worker of the batch created it meanwhile
            found = self.client.get_experiment_by_name(self.options.experiment)
            if found is None:
                raise
            return found.experiment_id

    def log(self, report: Report, folder: Path) -> Logged | None:
        """The written output `folder` and its report as one run; None when untracked."""
        if not self.active:
            return None
        try:
            logged = self._log(report, Path(folder))
        except MpconvertError:
            raise
        except Exception as exc:
            problem = server_problem(self.options, exc)
            if not self.options.optional:
                raise RunNotRecorded(
                    f"{problem.message}, after the output was written to {folder}: its MLflow run is incomplete",
                    hint=f"the output is complete; check the server, then convert again with --force ({problem.hint})",
                ) from None
            self.hooks.warning(f"MLflow run not recorded: {problem.message}")
            return None
        self.hooks.note(
            f"MLflow run {logged.run_id} in experiment {self.options.experiment!r} at {self.options.shown_uri}"
        )
        if self.options.register is not None:
            if logged.version is None:
                self.hooks.note(f"not registered: the gate failed (no version of {self.options.register!r})")
            else:
                self.hooks.note(f"registered {self.options.register!r} version {logged.version}")
        return logged

    def _log(self, report: Report, folder: Path) -> Logged:
        client = self.client
        # The params and metrics are report.json's keys and figures, flattened: made from its JSON form.
        stored = report.to_json()
        passed = report.passed
        tags = run_tags(report)
        if self.options.parent_run:
            tags["mlflow.parentRunId"] = self.options.parent_run
        name = f"{report.source.name or folder.name} [{report.policy}]"
        run = client.create_run(self.experiment_id(), run_name=name, tags=tags)
        run_id = run.info.run_id
        try:
            from mlflow.entities import Metric, Param

            params = [Param(k, v) for k, v in run_params(stored).items()]
            for i in range(0, len(params), _PARAMS_PER_CALL):
                client.log_batch(run_id, params=params[i : i + _PARAMS_PER_CALL])
            stamp = _now_ms()
            metrics = [Metric(k, v, stamp, 0) for k, v in gate_metrics(stored).items()]
            for i in range(0, len(metrics), _METRICS_PER_CALL):
                client.log_batch(run_id, metrics=metrics[i : i + _METRICS_PER_CALL])
            client.log_artifacts(run_id, str(folder))
            version = self._register(report, stored, run_id, run.info.artifact_uri) if passed else None
        except BaseException:
            with contextlib.suppress(Exception):
                client.set_terminated(run_id, "FAILED")
            raise
        client.set_terminated(run_id, "FINISHED")
        return Logged(run_id, run.info.experiment_id, run.info.artifact_uri, version)

    def _register(self, report: Report, stored: Mapping[str, Any], run_id: str, artifact_uri: str) -> str | None:
        name = self.options.register
        if name is None:
            return None
        from mlflow.exceptions import MlflowException

        try:
            self.client.create_registered_model(name, description="Converted to mixed precision by mpconvert")
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":  # a version of it was registered before
                raise
        onnx = f"{artifact_uri}/model.onnx" if any(a.kind == "onnx" for a in report.artifacts) else None
        tags = {"mpconvert.verdict": "passed", "mpconvert.policy": report.policy, **drop_tags(stored)}
        if onnx:
            tags["mpconvert.onnx"] = onnx
        version = self.client.create_model_version(
            name,
            source=f"{artifact_uri}/savedmodel",
            run_id=run_id,
            tags=tags,
            description=f"The ONNX file of this version: {onnx}" if onnx else None,
        )
        return str(version.version)


def _now_ms() -> int:
    return int(time.time() * 1000)


def start(options: TrackingOptions, export_kinds: tuple[str, ...] = (), hooks: Hooks = NO_HOOKS) -> Tracker:
    """The tracking server checked before any conversion work: a Tracker to log with, or an untracked one.

    Unreachable or refusing access: MpconvertError naming the URI, or with
    --mlflow-optional one warning and a Tracker that says why it skipped.
    """
    if not options.enabled:
        return Tracker(options, hooks=hooks)
    if options.register is not None and export_kinds and "savedmodel" not in export_kinds:
        raise MpconvertError(
            f"--register {options.register} registers the converted SavedModel, and --export leaves it out",
            hint="add savedmodel to --export (e.g. --export savedmodel,onnx)",
        )
    try:
        mlflow = _mlflow()
        client = mlflow.MlflowClient(tracking_uri=options.uri, registry_uri=options.uri)
        with _quick_requests():
            client.search_experiments(max_results=1)
    except MpconvertError as exc:
        return _skip_or_raise(options, exc, hooks)
    except Exception as exc:
        return _skip_or_raise(options, server_problem(options, exc), hooks)
    return Tracker(options, client, hooks=hooks)


def _skip_or_raise(options: TrackingOptions, problem: MpconvertError, hooks: Hooks) -> Tracker:
    if not options.optional:
        raise problem
    hooks.warning(f"{problem.message}; converting untracked (--mlflow-optional)")
    return Tracker(options, skipped=problem.message, hooks=hooks)


# --- what a run records: report.json's keys and figures, as MLflow's params, metrics and tags ----------


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text[:_MAX_PARAM_VALUE]


def run_params(stored: Mapping[str, Any]) -> dict[str, str]:
    """The resolved options the report recorded (the keywords that rebuild the run), as MLflow's string params."""
    provenance = stored.get("provenance") or {}
    return {key: _param_value(value) for key, value in (provenance.get("options") or {}).items()}


def run_tags(report: Report) -> dict[str, str]:
    """The verdict, the policy, the model and the mpconvert that converted it."""
    gate = report.gate
    failed = [c.name for c in gate.failed]
    tags = {
        "mpconvert.verdict": "passed" if gate.passed else "gate_failed",
        "mpconvert.policy": report.policy,
        "mpconvert.model": str(report.source.path or report.source.name or ""),
        "mpconvert.version": str(report.versions.to_json().get("mpconvert") or ""),
    }
    if failed:
        tags["mpconvert.failed_checks"] = ", ".join(failed)
    return tags


def metric_name(*parts: str) -> str:
    """`accuracy gate: digit`, `drop` -> `accuracy_gate/digit/drop` (MLflow's characters, "/" between levels)."""
    levels = [level for part in parts for level in str(part).split(": ")]
    return "/".join(_NOT_IN_METRIC_NAMES.sub("_", level.strip()).strip("_") for level in levels)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def gate_metrics(stored: Mapping[str, Any]) -> dict[str, float]:
    """Every figure the gate judged, by check (per output and per artifact, as the checks are named).

    A check's numeric values (`accuracy_gate/drop`, `artifact_parity/onnx/max_abs_diff`), the
    batches an artifact was re-run at (`.../rows_4096/max_abs_diff`), each speed path's ratio,
    and `passed` as 1 or 0.
    """
    found: dict[str, float] = {"passed": 1.0 if stored["passed"] else 0.0}
    for check in stored["gate"]["checks"]:
        for key, value in (check.get("values") or {}).items():
            number = _number(value)
            if number is not None:
                found[metric_name(check["name"], key)] = number
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, Mapping) and "rows" in item:
                        for inner, x in item.items():
                            number = _number(x)
                            if number is not None and inner != "rows":
                                found[metric_name(check["name"], f"rows_{item['rows']}", inner)] = number
    speed = stored.get("speed") or {}
    for path, timing in (speed.get("paths") or {}).items():
        for key in ("ratio", "float32_ms", "converted_ms"):
            number = _number(timing.get(key))
            if number is not None:
                found[metric_name("speed", path, key)] = number
    return found


def drop_tags(stored: Mapping[str, Any]) -> dict[str, str]:
    """The accuracy (or mse) drop, per output where there are several, as a model version's tags."""
    validation = stored["validation"]
    outputs = validation.get("outputs")
    if outputs:
        return {f"mpconvert.drop.{o['name']}": str(o["drop"]) for o in outputs if o.get("drop") is not None}
    return {"mpconvert.drop": str(validation["drop"])} if validation.get("drop") is not None else {}


# --- a batch: one parent run ------------------------------------------------------------------


@dataclass
class ParentRun:
    """A batch's parent run; `options` carry its id to each worker (the untracked ones when skipped)."""

    tracker: Tracker
    run_id: str | None = None

    @property
    def options(self) -> TrackingOptions | None:
        if self.run_id is None:
            return None
        return replace(self.tracker.options, parent_run=self.run_id)

    def finish(self, summary: BatchSummary, files: tuple[Path, ...]) -> None:
        """batch.json and index.html logged on the parent run, which then ends FINISHED."""
        if self.run_id is None:
            return
        client = self.tracker.client
        try:
            for name, value in _totals(summary):
                client.log_metric(self.run_id, name, value)
            client.set_tag(self.run_id, "mpconvert.exit_code", str(summary.exit_code))
            for path in files:
                if path.is_file():
                    client.log_artifact(self.run_id, str(path))
            client.set_terminated(self.run_id, "FINISHED")
        except Exception as exc:
            problem = server_problem(self.tracker.options, exc)
            if not self.tracker.options.optional:
                raise MpconvertError(
                    f"{problem.message}, after the batch finished: its parent run is incomplete",
                    hint=problem.hint,
                ) from None
            self.tracker.hooks.warning(f"MLflow parent run not completed: {problem.message}")

    def fail(self) -> None:
        """The batch broke (interrupted, or an error of its own): the parent run ends FAILED, if the server lets it.

        Never raises: the batch's own error is the one to report.
        """
        if self.run_id is not None:
            with contextlib.suppress(Exception):
                self.tracker.client.set_terminated(self.run_id, "FAILED")


def _totals(summary: BatchSummary) -> list[tuple[str, float]]:
    totals = summary.totals.to_json()
    return [(f"totals/{k}", float(v)) for k, v in totals.items() if _number(v) is not None]


def parent_run(options: TrackingOptions, name: str, hooks: Hooks = NO_HOOKS) -> ParentRun:
    """The batch's parent run, created (after the pre-flight) before any worker starts."""
    tracker = start(options, hooks=hooks)
    if not tracker.active:
        return ParentRun(tracker)
    try:
        run = tracker.client.create_run(tracker.experiment_id(), run_name=name, tags={"mpconvert.batch": "true"})
    except Exception as exc:
        return ParentRun(_skip_or_raise(options, server_problem(options, exc), hooks))
    hooks.note(f"MLflow parent run {run.info.run_id} in experiment {options.experiment!r} at {options.shown_uri}")
    return ParentRun(tracker, run.info.run_id)
