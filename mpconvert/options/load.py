"""Where a model comes from and how it is read (`LoadOptions`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpconvert.options.keywords import keyword, unkeyed
from mpconvert.system.urls import local_path


@dataclass(frozen=True)
class LoadOptions:
    # A model file or folder, or a live keras / tf_keras model (Python API),
    # which is read but never modified. Not keyed: a batch result's key holds
    # the model's files by content, and the same model under another folder
    # is the same result.
    source: Any = unkeyed()
    unsafe_deserialization: bool = keyword(
        False, kind="bool", help="Allow Lambda layers, whose code runs while loading. Only for files you trust."
    )
    # Imported before loading, so that their register_keras_serializable classes are found.
    imports: tuple[str, ...] = keyword(
        (),
        kind="strings",
        flag="--import",
        metavar="MODULE",
        help="Import MODULE before loading, so the custom layers it registers are found (repeatable). "
        "This runs that module's code.",
    )
    # Not keyed: Python objects the Python API alone takes; a manifest cannot
    # set them (it has `imports`), so a batch job never has any.
    custom_objects: Any = keyword(
        None,
        kind="object",
        keyed=False,
        help="Python API only: {name: class} for custom layers, like Keras's own argument.",
    )
    signature: str | None = keyword(
        None,
        metavar="NAME",
        default_text="serving_default",
        help="The serving signature of a SavedModel without Keras metadata (converted as a graph).",
    )

    def __post_init__(self) -> None:
        if isinstance(self.source, (str, Path)):
            local_path(self.source, "the model")  # pathlib would read s3://b/m.keras as a local "s3:" folder

    @property
    def path(self) -> Path | None:
        return Path(self.source) if isinstance(self.source, (str, Path)) else None
