"""MLflow tracking of a conversion: where its run goes, and under which registered model (`TrackingOptions`).

Its own module: tracking is about where a result is recorded, not how it
is computed, so it is no part of a batch result's key (ConvertOptions.cache_key
walks only the conversion's and the export's options).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from mpconvert.options.keywords import Keyword, check_ranges, keyword, table
from mpconvert.system.errors import MpconvertError
from mpconvert.system.urls import without_credentials

ENVIRONMENT_URI = "MLFLOW_TRACKING_URI"
DEFAULT_EXPERIMENT = "mpconvert"
# MLflow refuses these in a registered model's name (its model URIs use them as separators).
_NOT_IN_MODEL_NAMES = ("/", ":")


@dataclass(frozen=True)
class TrackingOptions:
    """Where a conversion's MLflow run goes; `uri` None: not tracked.

    A bare `--mlflow` (or the API's `mlflow=True`) takes the URI from
    MLFLOW_TRACKING_URI once, here, so a batch's workers all log to the
    server the batch checked.
    """

    uri: Any = keyword(
        None,
        name="mlflow",
        flag_value="",
        metavar="[URI]",
        default_text="off",
        help="Log each conversion as an MLflow run (params, gate figures, verdict, report and artifacts) on the "
        f"tracking server at URI; a bare --mlflow takes it from {ENVIRONMENT_URI}. pip install 'mpconvert[mlflow]'.",
    )
    experiment: str = keyword(
        DEFAULT_EXPERIMENT,
        name="mlflow_experiment",
        metavar="NAME",
        help="The MLflow experiment of the runs (created when absent).",
    )
    register: str | None = keyword(
        None,
        metavar="NAME",
        default_text="none",
        help="Register the converted SavedModel as a new version of the registered model NAME, only when the "
        "gate passes (needs --mlflow).",
    )
    optional: bool = keyword(
        False,
        name="mlflow_optional",
        kind="bool",
        help="When the tracking server cannot be reached or refuses access, warn and convert untracked "
        "instead of failing.",
    )
    # A batch's parent run: each conversion's run is its child (set by the batch, not by users).
    parent_run: str | None = None

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.uri is True or self.uri == "":
            found = os.environ.get(ENVIRONMENT_URI, "").strip()
            if not found:
                raise MpconvertError(
                    f"--mlflow was given without a URI and {ENVIRONMENT_URI} is not set",
                    hint=f"pass --mlflow http://HOST:5000 (the tracking server), or export {ENVIRONMENT_URI}",
                )
            object.__setattr__(self, "uri", found)
        elif self.uri is False:
            object.__setattr__(self, "uri", None)
        elif self.uri is not None and not isinstance(self.uri, str):
            raise MpconvertError(
                f"mlflow={self.uri!r} is invalid: it must be a tracking URI, or True for {ENVIRONMENT_URI}",
                hint="pass mlflow='http://HOST:5000' or mlflow=True",
            )
        if self.register is not None and self.uri is None:
            raise MpconvertError(
                f"--register {self.register} needs a tracking server",
                hint=f"add --mlflow URI (or a bare --mlflow with {ENVIRONMENT_URI} set)",
            )
        if self.register is not None and (
            not self.register.strip() or any(c in self.register for c in _NOT_IN_MODEL_NAMES)
        ):
            raise MpconvertError(
                f"--register {self.register!r} is not a registered model name MLflow accepts",
                hint="choose a name without '/' or ':', e.g. --register digits-mlp-bf16",
            )
        if not self.experiment.strip():
            raise MpconvertError("--mlflow-experiment is empty", hint="name the experiment, e.g. mpconvert")

    @property
    def enabled(self) -> bool:
        return self.uri is not None

    @property
    def shown_uri(self) -> str:
        """The URI as messages say it: never with a user:password part."""
        return without_credentials(str(self.uri))

    def spec(self) -> dict:
        """What a batch worker needs to rebuild these options (JSON types only; the URI already resolved)."""
        return {
            "uri": self.uri,
            "experiment": self.experiment,
            "register": self.register,
            "optional": self.optional,
            "parent_run": self.parent_run,
        }


TRACKING_KEYWORDS: dict[str, Keyword] = table(TrackingOptions)
