"""docs/options.md, generated from the options' keyword declarations.

`python -m mpconvert.render.options_doc > docs/options.md` (or `make docs`)
writes it; a test fails when the committed file and the declarations differ.
"""

from __future__ import annotations

import dataclasses

from mpconvert.options.convert import CONVERSION_KEYWORDS
from mpconvert.options.export import EXPORT_KEYWORDS
from mpconvert.options.gate import GATE_KEYWORDS
from mpconvert.options.keywords import Keyword
from mpconvert.options.signing import SIGNING_KEYWORDS
from mpconvert.options.tracking import TRACKING_KEYWORDS
from mpconvert.options.verify import VERIFY_KEYWORDS

HEADER = """\
# Options

Every option of a conversion, as the command line, the Python API and a
batch manifest spell it: the flag is the keyword with dashes
(`--keep-float32` is `keep_float32=`), and a manifest key is the keyword.
`mpconvert check` takes the gate's thresholds; there an absent one keeps
the value stored in the report. `mpconvert inspect` takes the loading,
keep, lint and padding options.

This file is generated from the declarations in `mpconvert/options/`
(`make docs`); a test keeps it in step with them and with `--help`.
"""

COMMAND_FLAGS = """\
## Flags of the commands themselves

These are not conversion options (the API has its own way to say them):

| Flag | Commands | What it does |
|---|---|---|
| `--policy` | main, `inspect`, `batch` | `mixed_float16` (NVIDIA Tensor Cores) or `mixed_bfloat16` (TPUs, bf16-capable CPUs); required by the main command, the first argument of `convert()` |
| `--out` | main, `batch`, `batch-merge` | the output folder (main: default `MODEL_POLICY` beside the model; API: `Conversion.save(out)`), or the batch root |
| `--force` | main, `batch`, `sign` | replace a non-empty output folder (API: `save(out, force=True)`); `sign`: replace a signature |
| `--junit FILE` | main, `check`, `batch`, `batch-merge` | write a JUnit XML file, one test case per gate check (per model and policy for a batch) |
| `--summary FILE\\|-` | main, `check`, `batch`, `batch-merge` | write a Markdown summary for a CI job page; `-` prints it on stdout |
| `--json` | main, `check`, `batch`, `batch-merge`, `doctor` | print the report (or batch summary, or findings) as JSON on stdout and nothing else there |
| `--quiet`, `-q` | main, `check`, `batch`, `batch-merge` | print nothing but errors (and what `--json` or `--summary -` ask for) |
| `--key KEY.pem` | `sign` | the private key to sign with, as `--sign-key` (API: `mpconvert.sign(folder, sign_key=...)`) |
| `--html FILE` | `check` | also write the re-checked report as one self-contained HTML page (a conversion always writes `report.html`) |
| `--debug` | every command | show tracebacks and framework logs |
| `--version`, `--help` | `mpconvert` | the installed version; the options of a command (`mpconvert COMMAND --help`) |

`batch`'s own flags (`--jobs`, `--timeout`, `--resume`, `--shard`, `--shards`, and its
`--baseline`, a batch.json) are in [batch.md](batch.md); `doctor`'s (`--budget`, and
`--speed-batch` for `doctor MODEL`) in [speed.md](speed.md).
"""

_KIND_WORDS = {
    "str": "text",
    "int": "integer",
    "float": "number",
    "bool": "true/false",
    "strings": "text, repeatable (TOML: a list)",
    "kinds": "comma-separated (TOML: a list)",
    "tolerances": "`X` or `KIND=X`, repeatable (API: a number or {kind: X}; TOML: a number or table)",
    "per_output": "`X` or `OUTPUT=X`, repeatable (API: a value or {output: value}; TOML: a value or table)",
    "path": "file path (manifest: relative to it)",
    "object": "Python objects",
}


def _default(spec: Keyword) -> str:
    if spec.default_text:
        return spec.default_text
    if isinstance(spec.default, tuple):
        return ",".join(spec.default) or "none"
    if spec.default is None:
        return "none"
    return str(spec.default).lower() if isinstance(spec.default, bool) else f"{spec.default}"


def _row(spec: Keyword) -> str:
    flag = f"`{spec.cli_flag}`" if spec.on_command_line else "(API only)"
    if spec.kind == "bool" and spec.default:
        flag += f" / `--no-{spec.cli_flag[2:]}`"
    rule = spec.rule()
    kind = rule if rule and not spec.choices else _KIND_WORDS[spec.kind]
    if spec.choices:
        kind = " \\| ".join(f"`{c}`" for c in spec.choices)
    if spec.kind == "per_output":
        one = dataclasses.replace(spec, default=0).rule()
        kind = f"{_KIND_WORDS['per_output']}; X {one}"
    text = spec.help.replace("|", "\\|")
    return f"| {flag} | `{spec.name}` | {kind} | {_default(spec).replace('|', '/')} | {text} |"


def _section(title: str, specs: dict[str, Keyword]) -> str:
    lines = [f"## {title}", "", "| Flag | Keyword / key | Value | Default | What it does |", "|---|---|---|---|---|"]
    lines += [_row(spec) for spec in specs.values()]
    return "\n".join(lines)


def options_markdown() -> str:
    conversion = {k: s for k, s in CONVERSION_KEYWORDS.items() if not s.gate}
    sections = [
        HEADER,
        _section("Conversion", conversion),
        _section("Export (`save` and the main command)", EXPORT_KEYWORDS),
        _section("Gate thresholds (also `mpconvert check`)", GATE_KEYWORDS),
        _section(
            "MLflow tracking (the main command, `batch` and `Conversion.save`; not manifest keys: a batch is tracked "
            "as a whole)",
            TRACKING_KEYWORDS,
        ),
        _section(
            "Signing (the main command, `batch` and `Conversion.save`; `mpconvert sign` takes it as `--key`; "
            "see [signing.md](signing.md))",
            SIGNING_KEYWORDS,
        ),
        _section("`mpconvert verify` (and `mpconvert.verify()`)", VERIFY_KEYWORDS),
        COMMAND_FLAGS,
    ]
    return "\n\n".join(sections) + "\n"


if __name__ == "__main__":
    print(options_markdown(), end="")
