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
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any


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
    def display_name(self) -> str:
        return "Keras" if self.is_keras3 else "tf-keras"

    @property
    def version(self) -> str:
        """The installed version ("3.15.1"); imports the framework."""
        return str(self.module.__version__)

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
    def deserialization(self, safe: bool, custom_objects: dict | None = None) -> Iterator[None]:
        """Scope the user's --unsafe-deserialization choice and custom objects to this conversion.

        Loading is not the only deserialization: the rewrite rebuilds the
        model from its config and the export reloads `model.keras`, and both
        consult the framework's safe mode and custom-object scope rather than
        load_model arguments. The scope keeps both from leaking into later
        conversions in the same process.
        """
        with contextlib.ExitStack() as stack:
            if custom_objects:
                stack.enter_context(self.module.utils.custom_object_scope(custom_objects))
            if not safe:
                serialization_lib = importlib.import_module(f"{self.name}.src.saving.serialization_lib")
                stack.enter_context(serialization_lib.SafeModeScope(False))
            yield

    def model_from_config(self, model: Any, config: dict) -> Any:
        return type(model).from_config(config)

    def copy_layer_state(self, old: Any, new: Any) -> None:
        """Give `new`, a rebuild of layer `old` from its config, all of `old`'s state.

        Weights are not all of it: an adapted Normalization derives the mean
        and variance it uses from its adapt weights in `finalize_state()`,
        and an adapted lookup layer keeps its vocabulary in a table that
        neither its config nor its weights hold. State is restored the way
        each framework's own loader restores it: Keras 3 per (sub)layer
        through `save_own_variables`/`load_own_variables` (which finalize)
        and `save_assets`/`load_assets` (vocabularies); tf-keras through
        `set_weights`, then `finalize_state()` as its h5 loader does, and the
        vocabulary of lookup layers, which its h5 files do not keep.
        """
        if not self.is_keras3:
            new.set_weights(old.get_weights())
        # `_flatten_layers` is both frameworks' own walk over a layer and its
        # sublayers, the one their savers take; a rebuild has the same tree.
        pairs = list(zip(old._flatten_layers(include_self=True), new._flatten_layers(include_self=True)))
        for source, target in pairs:
            if self.is_keras3:
                store: dict = {}
                source.save_own_variables(store)
                target.load_own_variables(store)
                if hasattr(source, "save_assets") and hasattr(target, "load_assets"):
                    with tempfile.TemporaryDirectory(prefix="mpconvert-assets-") as folder:
                        source.save_assets(folder)
                        target.load_assets(folder)
                continue
            if hasattr(source, "get_vocabulary") and getattr(target, "input_vocabulary", None) is None:
                _copy_vocabulary(source, target)
            if hasattr(target, "finalize_state") and target.weights:
                target.finalize_state()

    # --- training: the two loss-scaling APIs ---------------------------------

    def set_seed(self, seed: int) -> None:
        self.module.utils.set_random_seed(seed)

    def optimizer(self, learning_rate: float, loss_scaling: bool) -> Any:
        """Adam, wrapped in a dynamic LossScaleOptimizer when asked."""
        inner = self.module.optimizers.Adam(learning_rate=learning_rate)
        if not loss_scaling:
            return inner
        if self.is_keras3:
            return self.module.optimizers.LossScaleOptimizer(inner)
        return self.module.mixed_precision.LossScaleOptimizer(inner)

    def scale_loss(self, optimizer: Any, loss: Any) -> Any:
        if self.is_keras3:
            return optimizer.scale_loss(loss)
        return optimizer.get_scaled_loss(loss)

    def apply_gradients(self, optimizer: Any, grads: list, variables: list, scaled: bool) -> None:
        """Apply (possibly loss-scaled) gradients.

        Both LossScaleOptimizers skip the update and halve the scale when a
        gradient is not finite; Keras 3's unscales inside `apply`, tf-keras
        needs `get_unscaled_gradients` first.
        """
        if self.is_keras3:
            optimizer.apply(grads, variables)
            return
        if scaled:
            grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, variables))

    def loss_scale(self, optimizer: Any) -> float:
        if self.is_keras3:
            scale = optimizer.dynamic_scale if optimizer.built else optimizer.initial_scale
            return float(scale)
        return float(optimizer.loss_scale)

    def loss_function(self, identifier: Any) -> Any:
        return self.module.losses.get(identifier)


def _copy_vocabulary(source: Any, target: Any) -> None:
    """An adapted tf-keras lookup layer's vocabulary (and tf-idf weights) into its rebuild."""
    vocabulary = source.get_vocabulary(include_special_tokens=True)
    if not vocabulary or vocabulary == target.get_vocabulary(include_special_tokens=True):
        return
    idf = getattr(source, "idf_weights", None) if getattr(source, "output_mode", None) == "tf_idf" else None
    target.set_vocabulary(vocabulary, idf_weights=None if idf is None else idf.numpy())


KERAS3 = Framework("keras")
TF_KERAS = Framework("tf_keras")


def framework_of(model: Any) -> Framework | None:
    """The framework a live model object belongs to, without importing the other one."""
    for cls in type(model).__mro__:
        if cls.__name__ == "Model":
            root = cls.__module__.split(".")[0]
            if root == "keras":
                return KERAS3
            if root == "tf_keras":
                return TF_KERAS
    return None
