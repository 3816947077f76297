"""Which keys of a data file (or a Python dict) hold each input's rows and each output's labels.

One input is `x` or its own name; several are named after their inputs (a
model called with a dict: its keys, and its Input layers' names where no
other key could mean them). Labels are `y`, or `y_<output name>` (or
`y_<dict key>`) for several outputs; `_train` marks the training split.
A key close to one the model reads is refused with a did-you-mean; any
other key is returned as unread, for the report to name.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable

from mpconvert.data.signature import Signature
from mpconvert.system.errors import MpconvertError

TRAIN = "_train"  # the suffix of every key of the training split


def label_keys(signature: Signature, suffix: str = "") -> list[str]:
    """The .npz keys of the labels: `y` for one output, `y_<output name>` for several."""
    if len(signature.outputs) == 1:
        return ["y" + suffix]
    return [f"y_{spec.name}{suffix}" for spec in signature.outputs]


def label_key_choices(signature: Signature, suffix: str = "") -> list[tuple[str, ...]]:
    """The keys each output's labels may be read from: `y_<output name>`, or `y_<dict key>` for a
    model built with a dict of outputs whose key names no other output."""
    firsts = label_keys(signature, suffix)
    names = [spec.name for spec in signature.outputs]
    if len(firsts) == 1 or not signature.output_keys:
        return [(first,) for first in firsts]
    return [
        (first,) + ((f"y_{key}{suffix}",) if key not in names else ())
        for first, key in zip(firsts, signature.output_keys)
    ]


def pick_label_keys(where: str, keys: Collection[str], signature: Signature, suffix: str) -> list[str]:
    """The key each output's labels are read from: the one of its choices that is present, else its first."""
    picked = []
    for choices in label_key_choices(signature, suffix):
        present = [key for key in choices if key in keys]
        if len(present) > 1:
            raise MpconvertError(
                f"{where} labels output {choices[0].removeprefix('y_')!r} twice, as {present[0]!r} and {present[1]!r}",
                hint=f"keep one of them: {' and '.join(map(repr, present))} label the same output",
            )
        picked.append(present[0] if present else choices[0])
    return picked


def input_keys(signature: Signature, suffix: str = "") -> list[str]:
    """Each input's first-choice key: `x` for one input, the input's name for several."""
    return [choices[0] for choices in input_key_choices(signature, suffix)]


def input_key_choices(signature: Signature, suffix: str) -> list[tuple[str, ...]]:
    """The keys each input may be read from.

    A single input is `x` or its own name (a graph-level model's data is keyed
    by the signature's input names, and a user who knows the name writes it);
    the name is left out where it would read as another key (an input named
    `y`, or `x_train`).
    """
    reserved = {"x", "x" + TRAIN} | {k for sfx in ("", TRAIN) for c in label_key_choices(signature, sfx) for k in c}
    names = [spec.name for spec in signature.inputs]
    # A model called with a dict reads its data by the dict's keys, and by
    # its Input layers' names where no other key could mean them.
    keys = signature.input_keys or tuple(names)

    def clear(name: str, others: Iterable[str] = ()) -> bool:
        taken = reserved | set(others)
        return name not in taken and name + TRAIN not in taken

    if len(names) > 1:
        return [
            (key + suffix,) + ((name + suffix,) if name != key and clear(name, keys) else ())
            for key, name in zip(keys, names)
        ]
    extra = [name for name in dict.fromkeys((keys[0], names[0])) if clear(name)]
    return [("x" + suffix,) + tuple(name + suffix for name in extra)]


def readable_keys(signature: Signature) -> list[str]:
    """Every key a data file may hold for this model: inputs and labels, then their training split."""
    return [
        key
        for suffix in ("", TRAIN)
        for key in [k for choices in input_key_choices(signature, suffix) for k in choices]
        + [k for choices in label_key_choices(signature, suffix) for k in choices]
    ]


def did_you_mean(key: str, known: Iterable[str]) -> str:
    near = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def near_key(key: str, known: list[str]) -> str | None:
    """The key the model reads that `key` is close to (difflib), else None.

    A training-split key is compared by its stem: `y_ink_train` and
    `y_odd_train` share `_train`, which alone makes difflib call them close.
    """
    if key.endswith(TRAIN) and key != TRAIN:
        stems = [k.removesuffix(TRAIN) for k in known if k.endswith(TRAIN)]
        near = difflib.get_close_matches(key.removesuffix(TRAIN), stems, n=1)
        return near[0] + TRAIN if near else None
    near = difflib.get_close_matches(key, known, n=1)
    return near[0] if near else None


def unread_keys_of(where: str, keys: Iterable[str], signature: Signature) -> tuple[str, ...]:
    """The data file's keys that are neither inputs nor labels of this model; a misspelt one is refused.

    Labels may be left out, so a misspelt label key (`y_class` for output
    `cls`) would pass unseen: its output silently gets only a drift check.
    A key close to one the model reads, and plain `y` for a model with
    several outputs, is therefore refused, naming the key it was probably
    meant to be. Any other key (`y_ink` in a file shared with a model that
    has an `ink` output, notes kept beside the data) is not read, and is
    returned for the report and the summary to name.
    """
    known = readable_keys(signature)
    unread = [key for key in keys if key not in known]
    several = len(signature.outputs) > 1
    plain = [key for key in unread if key in ("y", "y" + TRAIN)]
    if several and plain:
        raise MpconvertError(
            f"{where} has key {plain[0]!r}, but the model has {len(signature.outputs)} outputs, so its labels "
            "are named after them",
            hint=f"rename {plain[0]!r} to the key of the output it labels: "
            f"{', '.join(label_keys(signature, plain[0].removeprefix('y')))} (any may be left out)",
        )
    misspelt = {key: near for key in unread if (near := near_key(key, known))}
    if misspelt:
        named = ", ".join(f"{key!r} (did you mean {near!r}?)" for key, near in misspelt.items())
        inputs = " or ".join(input_key_choices(signature, "")[0]) if len(signature.inputs) == 1 else None
        reads = ", ".join([inputs] if inputs else input_keys(signature)) + ", " + ", ".join(label_keys(signature))
        one = len(misspelt) == 1
        raise MpconvertError(
            f"{where} has {'key' if one else 'keys'} {named}, which this model does not read: "
            "neither an input nor a label",
            hint=f"rename {'it' if one else 'them'}; this model reads {reads}"
            + (" (labels may be left out)" if several else "")
            + f", and the same keys with {TRAIN} for a training split",
        )
    return tuple(unread)


def pick_input_keys(where: str, keys: Collection[str], signature: Signature, suffix: str) -> list[str]:
    """The key each input is read from: the one of its choices that is present, else its first choice."""
    picked = []
    for choices in input_key_choices(signature, suffix):
        present = [key for key in choices if key in keys]
        if len(present) > 1:
            which = "the model's one input" if len(signature.inputs) == 1 else f"input {choices[0]!r}"
            raise MpconvertError(
                f"{where} gives {which} twice, as {present[0]!r} and as {present[1]!r}",
                hint=f"keep one of them: {' and '.join(map(repr, present))} name the same input",
            )
        picked.append(present[0] if present else choices[0])
    return picked
