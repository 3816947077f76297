"""What differs between Keras 3 and tf-keras, behind one small interface.

mpconvert converts a model inside the framework that loaded it: a Keras-2
SavedModel stays a tf-keras model (migrating it to Keras 3 through h5 breaks
on real layers such as DepthwiseConv2D), a `.keras` file stays Keras 3.
Everything below this module talks to `Framework`, never to `keras` or
`tf_keras` directly, so the two code paths cannot drift apart.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterator


@dataclass(frozen=True)
class Framework:
    """One Keras implementation: `keras` (Keras 3) or `tf_keras` (Keras 2)."""

    name: str

    @cached_property
    def module(self) -> Any:
        # Imported lazily: tf_keras costs seconds to import and most runs
        # only need one of the two.
        return importlib.import_module(self.name)

    @property
    def is_keras3(self) -> bool:
        return self.name == "keras"

    @property
    def version(self) -> str:
        return self.module.__version__

    def global_policy_name(self) -> str:
        return self.module.mixed_precision.global_policy().name

    @contextlib.contextmanager
    def preserved_global_policy(self) -> Iterator[None]:
        """Leave the process-wide dtype policy exactly as it was found.

        Keras code paths (deserialization, `Model.from_config`) may consult or
        set the global policy; converting several models in one process must
        not leak state from one conversion into the next.
        """
        before = self.global_policy_name()
        try:
            yield
        finally:
            if self.global_policy_name() != before:
                self.module.mixed_precision.set_global_policy(before)

    @contextlib.contextmanager
    def deserialization(self, safe: bool) -> Iterator[None]:
        """Scope the user's --unsafe-deserialization choice to this conversion.

        Loading is not the only deserialization: the rewrite rebuilds the
        model from its config and the export reloads `model.keras`, and both
        consult the framework's safe mode rather than a load_model argument.
        The scope keeps the choice from leaking into later conversions in the
        same process.
        """
        if safe:
            yield
            return
        serialization_lib = importlib.import_module(f"{self.name}.src.saving.serialization_lib")
        with serialization_lib.SafeModeScope(False):
            yield

    def model_from_config(self, model: Any, config: dict) -> Any:
        return type(model).from_config(config)

    def layer_policy(self, layer: Any) -> tuple[str, str, str]:
        """(policy name, compute dtype, variable dtype) of a built layer."""
        policy = layer.dtype_policy
        return policy.name, policy.compute_dtype, policy.variable_dtype

    def is_model(self, layer: Any) -> bool:
        return isinstance(layer, self.module.Model)

    def tensor_input(self, shape: tuple, dtype: str, name: str | None = None) -> Any:
        return self.module.Input(shape=shape, dtype=dtype, name=name)


KERAS3 = Framework("keras")
TF_KERAS = Framework("tf_keras")


def framework_of(model: Any) -> Framework:
    """The framework a live model object belongs to."""
    module = type(model).__module__
    return TF_KERAS if module.startswith("tf_keras") else KERAS3
