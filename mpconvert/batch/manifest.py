"""What a batch converts: a TOML manifest, or every model found under a folder.

A manifest lists models with their data, policies and any option of the main
command (with underscores), under shared `[defaults]`. The whole manifest is
checked before anything runs, and every problem is reported at once. Each
(model, policy) pair becomes one `Job`, which carries the options objects
built here: the worker, the result's key and the report all see those.
"""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpconvert.api import conversion_options, export_options
from mpconvert.data.formats import detect_format
from mpconvert.data.rows import is_callable_spec
from mpconvert.options.convert import CONVERSION_KEYWORDS, ConvertOptions
from mpconvert.options.export import EXPORT_KEYWORDS, ExportOptions
from mpconvert.options.precision import POLICIES
from mpconvert.system.errors import MpconvertError

# Every keyword of a conversion and its export, as the Python API and the manifest spell them.
CONVERSION_KEYS = tuple(CONVERSION_KEYWORDS)
EXPORT_KEYS = tuple(EXPORT_KEYWORDS)
OPTION_KEYS = ("policy", *CONVERSION_KEYS, *EXPORT_KEYS)
MODEL_KEYS = ("path", "name", *OPTION_KEYS)
# Options that name files: relative to the manifest, and hashed by content (declared with file=True).
PATH_KEYS = tuple(key for key, spec in CONVERSION_KEYWORDS.items() if spec.file)
# What each key's TOML value must be (the conversion then checks the ranges).
_TYPES: dict[str, tuple[type, ...]] = {
    "path": (str,),
    "name": (str,),
    "policy": (str, list),
    **{key: spec.toml_types() for key, spec in {**CONVERSION_KEYWORDS, **EXPORT_KEYWORDS}.items()},
}
MODEL_SUFFIXES = (".keras", ".h5", ".hdf5")


@dataclass(frozen=True)
class Job:
    """One model under one policy: what a worker converts, and where it writes."""

    name: str  # the model's folder under the batch root
    options: ConvertOptions  # the model (load.source, an absolute Path) and the policy included; paths absolute
    export: ExportOptions = ExportOptions()
    given_path: str = ""  # as the manifest or folder listing names it

    @property
    def model(self) -> Path:
        return Path(self.options.load.source)

    @property
    def policy(self) -> str:
        return self.options.rewrite.policy

    @property
    def folder(self) -> str:
        return f"{self.name}/{self.policy}"

    @property
    def label(self) -> str:
        return f"{self.name} [{self.policy}]"

    def size(self) -> int:
        if self.model.is_file():
            return self.model.stat().st_size
        return sum(p.stat().st_size for p in self.model.rglob("*") if p.is_file())


def _listed(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _check_types(where: str, table: dict, allowed: tuple[str, ...], problems: list[str]) -> dict:
    good = {}
    for key, value in table.items():
        if key not in allowed:
            near = difflib.get_close_matches(key.replace("-", "_"), allowed, n=1)
            problems.append(f"{where}: unknown key {key!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
        elif not _TYPES[key]:  # custom_objects: Python objects, API only
            problems.append(f'{where}: custom_objects cannot be written in TOML; use imports = ["module"]')
        elif not isinstance(value, _TYPES[key]) or (isinstance(value, bool) and bool not in _TYPES[key]):
            kinds = " or ".join(
                {
                    str: "a string",
                    list: "a list",
                    dict: "a table",
                    int: "a number",
                    float: "a number",
                    bool: "true/false",
                }[t]
                for t in _TYPES[key]
            )
            problems.append(f"{where}: {key} = {value!r} must be {kinds}")
        else:
            good[key] = value
    return good


def _resolve_paths(where: str, options: dict, base: Path, problems: list[str]) -> dict:
    resolved = dict(options)
    for key in PATH_KEYS:
        value = options.get(key)
        if not isinstance(value, str) or (key == "data" and is_callable_spec(value)):
            continue
        path = (base / value).resolve() if not Path(value).is_absolute() else Path(value)
        if not path.exists():
            problems.append(f"{where}: {key} {value!r} not found (looked for {path})")
        resolved[key] = str(path)
    return resolved


def _jobs_for(where: str, name: str, model: Path, given: str, options: dict, problems: list[str]) -> list[Job]:
    """The model's jobs, one per policy, each checked by building its real options."""
    policies = _listed(options.pop("policy", None) or [])
    if not policies:
        problems.append(f"{where}: no policy (set policy in [defaults] or on the model, or pass --policy)")
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        problems.append(f"{where}: unknown policy {bad[0]!r}; choose from {', '.join(POLICIES)}")
        policies = []  # the other options are still checked below, under a valid policy
    export_keywords = {key: options.pop(key) for key in EXPORT_KEYS if key in options}
    for key in ("keep_float32", "imports"):
        if key in options:
            options[key] = tuple(_listed(options[key]))
    try:
        export = export_options(**export_keywords)
        # Under a valid policy when none is given, so that the other problems are listed too.
        built = [conversion_options(model, p, **options) for p in dict.fromkeys(policies or POLICIES[:1])]
    except MpconvertError as exc:
        problems.append(f"{where}: {exc.message}")
        return []
    return [Job(name, conversion, export, given) for conversion in built] if policies else []


def _model_path(where: str, given: str, base: Path, problems: list[str]) -> Path | None:
    path = (base / given) if not Path(given).is_absolute() else Path(given)
    try:
        detect_format(path)
    except MpconvertError as exc:
        problems.append(f"{where}: {exc.message}")
        return None
    return path.absolute()


def _stem(path: Path) -> str:
    return path.name if path.is_dir() else path.stem


def _refuse(source: Path, problems: list[str]) -> None:
    if problems:
        count = f"{len(problems)} problem" + ("s" if len(problems) > 1 else "")
        raise MpconvertError(
            f"{source} has {count}: " + "; ".join(problems),
            hint="fix every problem listed; keys are the main command's options with underscores "
            "(docs/batch.md: The manifest)",
        )


def _duplicates(jobs: list[Job], problems: list[str]) -> None:
    seen: dict[str, str] = {}
    for job in jobs:
        if job.folder in seen and seen[job.folder] != job.given_path:
            problems.append(
                f"two models are named {job.name!r} ({seen[job.folder]} and {job.given_path}); give one a name"
            )
        seen.setdefault(job.folder, job.given_path)


def load_manifest(path: Path, overrides: dict | None = None) -> list[Job]:
    """Every job of a manifest, or one error listing all its problems.

    `overrides` are options given on the command line: they apply under the
    manifest's own [defaults] and model entries.
    """
    path = Path(path)
    try:
        manifest = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise MpconvertError(f"manifest {path} not found", hint="pass a TOML manifest or a folder of models") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise MpconvertError(f"manifest {path} is not valid TOML ({exc})", hint="check the file's syntax") from None
    problems: list[str] = []
    unknown = sorted(set(manifest) - {"defaults", "model"})
    if unknown:
        problems.append(f"unknown top-level key(s) {', '.join(map(repr, unknown))}; use [defaults] and [[model]]")
    base = path.parent.resolve()
    defaults = _check_types("[defaults]", manifest.get("defaults", {}), OPTION_KEYS, problems)
    defaults = _resolve_paths("[defaults]", defaults, base, problems)
    entries = manifest.get("model", [])
    if not isinstance(entries, list) or not entries:
        problems.append("no [[model]] entries")
        entries = []
    jobs: list[Job] = []
    for number, entry in enumerate(entries, 1):
        where = f"model {number}"
        entry = _check_types(where, entry, MODEL_KEYS, problems)
        if "path" not in entry:
            problems.append(f"{where}: no path")
            continue
        where = f"model {number} ({entry['path']})"
        model = _model_path(where, entry["path"], base, problems)
        options = {**(overrides or {}), **defaults, **_resolve_paths(where, entry, base, problems)}
        options.pop("path")
        name = options.pop("name", None) or (_stem(model) if model else entry["path"])
        if model is not None:
            jobs += _jobs_for(where, name, model, entry["path"], options, problems)
    _duplicates(jobs, problems)
    _refuse(path, problems)
    return jobs


def find_models(folder: Path) -> list[Path]:
    """Models under a folder: .keras/.h5 files and SavedModel folders, in name order."""
    found = []
    for path in sorted(folder.rglob("*")):
        if any(part.startswith(".") for part in path.relative_to(folder).parts):
            continue  # staging folders, hidden files
        if path.is_file() and path.suffix.lower() in MODEL_SUFFIXES:
            found.append(path)
        elif path.is_dir() and (path / "saved_model.pb").is_file():
            found.append(path)  # a Keras SavedModel, or one without Keras metadata (graph level)
    return found


def folder_jobs(folder: Path, options: dict) -> list[Job]:
    """One job per model found under `folder` and policy, all with the same options.

    A model's data defaults to an .npz of the same name beside it.
    """
    folder = Path(folder)
    models = find_models(folder)
    problems: list[str] = [] if models else [f"no .keras, .h5 or Keras SavedModel found under {folder}"]
    jobs: list[Job] = []
    for model in models:
        given = str(model.relative_to(folder))
        own = {**options}
        beside = model.with_suffix(".npz") if model.is_file() else model.parent / f"{model.name}.npz"
        if "data" not in own and beside.is_file():
            own["data"] = str(beside.resolve())
        name = str(Path(given).with_suffix("")) if model.is_file() else given
        jobs += _jobs_for(given, name.replace("/", "__"), model.absolute(), given, own, problems)
    _duplicates(jobs, problems)
    _refuse(folder, problems)
    return jobs
