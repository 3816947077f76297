"""The short fine-tuning run after the rewrite (`FinetuneOptions`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from mpconvert.options.keywords import check_ranges, keyword

# Fine-tuning defaults: a short, gentle run. Adam at 1e-4 moves float32
# master weights a little without undoing the original training.
DEFAULT_FINETUNE_STEPS = 100
DEFAULT_LEARNING_RATE = 1e-4
DEFAULT_BATCH_SIZE = 32


@dataclass(frozen=True)
class FinetuneOptions:
    steps: int | None = keyword(
        None,
        name="finetune_steps",
        kind="int",
        minimum=0,
        default_text=f"{DEFAULT_FINETUNE_STEPS} when the data has a training split, else 0",
        help="Fine-tuning steps, 0 to skip.",
    )
    learning_rate: float = keyword(
        DEFAULT_LEARNING_RATE, kind="float", minimum=0, minimum_open=True, help="Fine-tuning learning rate (Adam)."
    )
    batch_size: int = keyword(
        DEFAULT_BATCH_SIZE, kind="int", minimum=1, help="Rows per fine-tuning step and per evaluation batch."
    )
    loss: str | None = keyword(
        None,
        default_text="the model's saved loss, else one for its output",
        help="Fine-tuning loss, a Keras loss name.",
    )

    def __post_init__(self) -> None:
        check_ranges(self)

    def resolved(self, has_train: bool) -> FinetuneOptions:
        if self.steps is not None:
            return self
        return replace(self, steps=DEFAULT_FINETUNE_STEPS if has_train else 0)
