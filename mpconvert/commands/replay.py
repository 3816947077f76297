"""What a replay converts: exactly the files its report hashed, wherever the replay runs.

A report records its inputs twice: the options as typed (a relative
`--data data/clf.npz`, a relative `--baseline`, module names for `--import`
and `--data module:function`) and each file by its absolute path and sha256.
A replay that went by the options would, from another folder, read that
folder's `data/clf.npz` after checking the hash of the report's. So a replay
converts the hashed files by their recorded absolute paths, finds the
user's modules from the folder the recorded run started in, checks that
each resolves to the file the report hashed, and refuses anything else.

A report written before the folder was recorded still replays where its
paths resolve without it: the model and the data file are recorded
absolute; the folder is inferred from a relative `--data` and the absolute
file it named, and without it a relative `--baseline` or a user module is
refused, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpconvert.data.rows import DataSource, EvalData
from mpconvert.options.convert import ConvertOptions
from mpconvert.options.keywords import keywords_of
from mpconvert.report.read import report_file
from mpconvert.report.sections import DataRecord, InputFile, Provenance
from mpconvert.report.sections.provenance import recorded_options
from mpconvert.speed import probe_hardware
from mpconvert.system.digests import digest
from mpconvert.system.errors import MpconvertError
from mpconvert.system.usercode import importing_from, module_file, module_origin, user_folder

_CONVERT_AGAIN = "convert the model again with this mpconvert: its report records the folder"


# --- what a conversion records (pipeline.convert), so that a replay can read it again ---


def read_files(options: ConvertOptions, data: EvalData | None = None) -> tuple[Path, ...]:
    """The files a run reads (model, data file): outputs must leave them alone."""
    files = [options.load.path] if options.load.path else []
    if data is not None and data.source is DataSource.NPZ and data.path:
        files.append(Path(data.path))
    elif isinstance(options.validate.data, (str, Path)) and Path(options.validate.data).exists():
        files.append(Path(options.validate.data))
    return tuple(files)


def user_modules(options: ConvertOptions, data: EvalData) -> tuple[str, ...]:
    """The user's modules a run imports by name: --import's, and --data module:function's."""
    names = list(options.load.imports)
    if data.source is DataSource.CALLABLE and isinstance(options.validate.data, str):
        names.append(options.validate.data.split(":")[0])
    return tuple(dict.fromkeys(names))


def provenance(options: ConvertOptions, data: EvalData) -> Provenance:
    """What this conversion read, by content, the options that rebuild it, and the machine it ran on."""
    path = options.load.path
    data_file = InputFile.of(Path(data.path)) if data.source is DataSource.NPZ and data.path else None
    train = data.train.rows if data.train is not None else None
    given = {"model": str(path.absolute()) if path else options.load.source, "policy": options.rewrite.policy}
    baseline = options.gate.baseline
    files = {name: module_file(name) for name in user_modules(options, data)}
    return Provenance(
        model=InputFile.of(path) if path else None,
        data=DataRecord(str(data.source), data_file, data.validation.rows, train),
        options=recorded_options(given, keywords_of(options)),
        command=None,
        machine=probe_hardware(),
        folder=str(user_folder()),
        baseline=InputFile.of(report_file(baseline)) if baseline else None,
        modules={name: InputFile.of(file) for name, file in files.items() if file is not None},
    )


# --- what a replay reads back ---


@dataclass(frozen=True)
class ReplayInputs:
    """The recorded run's keywords with every file the replay reads as the checked absolute path."""

    keywords: dict[str, Any]  # model and policy first, then the recorded options (the export's included)
    folder: Path | None  # where the user's modules are found: the recorded run's folder (None: it is not known)


def unchanged(recorded: InputFile, what: str, report: Path) -> Path:
    """The recorded file, refused when it is gone or its bytes are not the ones the report was made from."""
    path = Path(recorded.path)
    if not path.exists():
        raise MpconvertError(
            f"the {what} {path} that {report} was made from is not there",
            hint=f"put the same {what} back at that path (or replay on the machine that has it)",
        )
    found = digest(path).sha256
    if found != recorded.sha256:
        raise MpconvertError(
            f"the {what} {path} has changed since {report} was made: sha256 {recorded.sha256[:12]}... "
            f"recorded, {found[:12]}... now",
            hint=f"replay with the {what} the report was made from; to convert this one, run mpconvert on it",
        )
    return path


def _inferred_folder(provenance: Provenance) -> Path | None:
    """An older report's folder, from its relative --data and the absolute file that named; None without one."""
    given, file = provenance.options.get("data"), provenance.data.file
    if not isinstance(given, str) or file is None or Path(given).is_absolute():
        return None
    parts, whole = Path(given).parts, Path(file.path).parts
    return Path(*whole[: -len(parts)]) if len(whole) > len(parts) and whole[-len(parts) :] == parts else None


def _baseline(provenance: Provenance, given: str, folder: Path | None, report: Path) -> str:
    if provenance.baseline is not None:
        return str(unchanged(provenance.baseline, "baseline report", report))
    if Path(given).is_absolute():  # an older report: no hash to check, but only one file it can mean
        return given
    if folder is None:
        raise MpconvertError(
            f"{report} names --baseline {given} relative to the folder its run started in, which it does not "
            "record (it was written before reports did)",
            hint=_CONVERT_AGAIN,
        )
    return str(folder / given)


def _check_module(name: str, option: str, provenance: Provenance, folder: Path | None, report: Path) -> None:
    """`import name` must find, from the recorded folder, the file the report's run imported, unchanged."""
    if folder is None:
        raise MpconvertError(
            f"{report} imports {option}, found from the folder its run started in, which it does not record "
            "(it was written before reports did)",
            hint=_CONVERT_AGAIN,
        )
    recorded = provenance.modules.get(name)
    if recorded is None:  # an older report, or a namespace package: found from the recorded folder, unhashed
        return
    expected = unchanged(recorded, f"{option} module", report)
    with importing_from(folder):
        found = module_origin(name)
    if found is None or found.resolve() != expected.resolve():
        where = "finds no module" if found is None else f"would import {found}"
        raise MpconvertError(
            f"{option}: `import {name}` {where} here, not {expected}, which {report} was made with",
            hint=f"replay where `import {name}` from {folder} finds {expected} (check PYTHONPATH, "
            "and a module of that name already imported in this process)",
        )


def replay_inputs(stored: Mapping[str, Any], report: Path) -> ReplayInputs:
    """The keywords a report recorded, each file the replay will read checked against its recorded sha256."""
    if not stored.get("provenance"):
        raise MpconvertError(
            f"{report} does not record what went in (it was written by an mpconvert before provenance)",
            hint="convert the model again with this mpconvert; its report can be replayed",
        )
    provenance = Provenance.from_json(stored["provenance"])
    if provenance.model is None:
        raise MpconvertError(
            f"{report} is of a live model handed to the Python API: there is no file to replay",
            hint="save the model (model.save('model.keras')) and convert the file",
        )
    keywords = dict(provenance.options)
    keywords["model"] = str(unchanged(provenance.model, "model", report))
    data = provenance.data
    if data.source == "arrays":
        raise MpconvertError(
            f"{report} was judged on arrays handed to the Python API: there are no rows to replay",
            hint="save them with np.savez(path, x=..., y=...) and convert with data=path",
        )
    if data.source == "npz":
        if data.file is None:
            raise MpconvertError(f"{report} read a data file it does not record", hint=_CONVERT_AGAIN)
        keywords["data"] = str(unchanged(data.file, "data file", report))
    unrecorded = sorted(k for k, v in keywords.items() if "not recorded>" in repr(v))
    if unrecorded:
        raise MpconvertError(
            f"{report} could not record {', '.join(unrecorded)} (Python objects), so the run cannot be rebuilt",
            hint="use what the command line can name (--import MODULE for custom layers) and convert again",
        )
    folder = Path(provenance.folder) if provenance.folder else _inferred_folder(provenance)
    if keywords.get("baseline"):
        keywords["baseline"] = _baseline(provenance, str(keywords["baseline"]), folder, report)
    imports, given = keywords.get("imports"), keywords.get("data")
    modules = [(str(name), f"--import {name}") for name in (imports if isinstance(imports, list) else ())]
    if data.source == "callable" and isinstance(given, str):
        modules.append((given.split(":")[0], f"--data {given}"))
    for name, option in modules:
        _check_module(name, option, provenance, folder, report)
    return ReplayInputs(keywords, folder)
