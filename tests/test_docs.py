"""The texts stay in step with the code and with each other: references, links, and the formats --help names.

Cheap: no TensorFlow, no model is loaded. What it reads is derived from the
code where it can be (the strings under mpconvert/, the suffixes and marker
files detect_format tests, the formats it returns), so a new format,
a renamed heading or a moved page fails here rather than in a newcomer's
hands.
"""

from __future__ import annotations

import ast
import inspect as introspect
import io
import itertools
import re
import tokenize
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from conftest import REPO, invoke

from mpconvert.data.formats import ModelFormat, detect_format
from mpconvert.system.errors import MpconvertError

PACKAGE = REPO / "mpconvert"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# "README: Heading", "docs/NAME.md: Heading", "docs/NAME.md#anchor", or a bare
# "docs/NAME.md". A heading runs to the closing parenthesis or the end of the
# string, so a reference is written "(see docs/batch.md: The manifest)".
REFERENCE = re.compile(
    r"(?<![\w/.-])(?P<file>README(?:\.md)?|docs/[\w./-]*?\.md)"
    r"(?:#(?P<anchor>[\w-]+))?"
    r"(?::[ \t]*(?P<heading>[^)\n]+?)[ \t]*(?=\)|$))?"
)
LINK = re.compile(r"\[[^\]]*\]\(\s*(?P<target><[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")


# --- Markdown: headings and their GitHub anchors ---------------------------------


def _prose_lines(text: str):
    """The lines outside fenced code blocks."""
    fence = None
    for line in text.splitlines():
        marker = re.match(r"\s*(`{3,}|~{3,})", line)
        if marker:
            if fence is None:
                fence = marker.group(1)[0] * len(marker.group(1))
            elif marker.group(1).startswith(fence):
                fence = None
            continue
        if fence is None:
            yield line


def _plain(heading: str) -> str:
    """A heading as compared with a reference to it: no markup, one space, any case."""
    text = re.sub(r"[`*_]", "", heading)
    return re.sub(r"\s+", " ", text).strip().rstrip(".:").casefold()


@cache
def headings(page: Path) -> tuple[str, ...]:
    found = []
    for line in _prose_lines(page.read_text()):
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            found.append(match.group(1))
    return tuple(found)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """Every heading's anchor; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: Counter[str] = Counter()
    found = set()
    for heading in headings(page):
        base = slug(heading)
        found.add(f"{base}-{seen[base]}" if seen[base] else base)
        seen[base] += 1
    found |= {m.group(1) for m in re.finditer(r"<a\s+(?:name|id)=\"([^\"]+)\"", page.read_text())}
    return frozenset(found)


# --- references in the code's strings ----------------------------------------------


@dataclass(frozen=True)
class Reference:
    where: str  # file:line
    page: str  # as written: README, docs/batch.md
    anchor: str | None
    heading: str | None

    def problem(self) -> str | None:
        path = REPO / ("README.md" if self.page.startswith("README") else self.page)
        if not path.is_file():
            return f"{self.where}: {self.page} does not exist"
        if self.heading and _plain(self.heading) not in {_plain(h) for h in headings(path)}:
            return f"{self.where}: {self.page} has no heading {self.heading!r} (it has {list(headings(path))})"
        if self.anchor and self.anchor not in anchors(path):
            return f"{self.where}: {self.page} has no anchor #{self.anchor}"
        return None


def _texts(path: Path):
    """(line, text) of every string and comment in a Python file; implicit concatenation joined."""
    source = path.read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def references_in(path: Path, texts=None) -> list[Reference]:
    found = []
    pairs = texts if texts is not None else _texts(path) if path.suffix == ".py" else [(1, path.read_text())]
    for line, text in pairs:
        for match in REFERENCE.finditer(re.sub(r"\s+", " ", text)):
            where = f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{line}"
            found.append(Reference(where, match["file"], match["anchor"], match["heading"]))
    return found


def code_references() -> list[Reference]:
    files = [p for p in sorted(PACKAGE.rglob("*")) if p.is_file() and p.suffix in (".py", ".j2", ".json", ".md")]
    return [ref for path in files for ref in references_in(path)]


def test_every_reference_in_the_code_names_a_page_and_heading_that_exist():
    references = code_references()
    # The hints that send a user to the docs are among those checked.
    named = {(r.page, r.heading) for r in references}
    assert ("docs/batch.md", "The manifest") in named, sorted(named, key=str)
    problems = [p for p in (r.problem() for r in references) if p]
    assert not problems, "\n".join(problems)


def test_a_broken_reference_is_caught(tmp_path):
    """The check above fails on a heading that is not there, a page that is not there, and a wrong anchor."""
    hint = tmp_path / "hint.py"
    hint.write_text(
        'HINT = "keys are options (docs/batch.md: The manifesto)"\n'
        'MORE = ("see the "\n        "README: No Such Section)")\n'
        "# see docs/nowhere.md\n"
        'ANCHOR = "docs/report.md#no-such-anchor"\n'
        'GOOD = "(see docs/report.md: Which runtimes run the 16-bit ONNX files)"\n'
    )
    problems = {int(r.where.rpartition(":")[2]): r.problem() for r in references_in(hint)}
    assert sorted(problems) == [1, 2, 4, 5, 6], problems
    assert "no heading 'The manifesto'" in problems[1]
    assert "no heading 'No Such Section'" in problems[2]
    assert "docs/nowhere.md does not exist" in problems[4]
    assert "no anchor #no-such-anchor" in problems[5]
    assert problems[6] is None


# --- links between the pages ----------------------------------------------------------


def links(page: Path) -> list[str]:
    """The target of every link in a page's prose (its text may wrap), inline code left out."""
    prose = "\n".join(re.sub(r"`[^`]*`", "", line) for line in _prose_lines(page.read_text()))
    return [m["target"].strip("<>") for m in LINK.finditer(prose)]


def link_problem(page: Path, target: str) -> str | None:
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
        return None
    file, _, anchor = target.partition("#")
    path = (page.parent / file).resolve() if file else page
    if not path.exists():
        return f"{page.relative_to(REPO)}: {target} -> {file} does not exist"
    if anchor and path.suffix == ".md" and anchor not in anchors(path):
        return f"{page.relative_to(REPO)}: {target} -> {path.name} has no heading with anchor #{anchor}"
    return None


def test_every_relative_link_in_the_readme_and_docs_resolves():
    checked = [(page, target) for page in PAGES for target in links(page)]
    assert len(checked) > 20  # the pages link to each other throughout; a parser that finds none is broken
    problems = [p for p in (link_problem(page, target) for page, target in checked) if p]
    assert not problems, "\n".join(problems)


def test_a_broken_link_is_caught():
    page = REPO / "docs" / "report.md"
    assert link_problem(page, "batch.md#many-machines-one-root") is None
    assert link_problem(page, "conversion.md#every-rebuild-is-proven-faithful") is None
    assert link_problem(page, "#the-schema") is None
    assert "has no heading" in link_problem(page, "batch.md#many-machines")
    assert "does not exist" in link_problem(page, "batches.md")
    assert link_problem(page, "https://example.invalid/nowhere") is None


def test_anchors_are_githubs():
    assert slug("Many machines, one root") == "many-machines-one-root"
    assert slug("Data format (`--data`)") == "data-format---data"
    assert slug("Which runtimes run the 16-bit ONNX files") == "which-runtimes-run-the-16-bit-onnx-files"


# --- the model formats --help names ----------------------------------------------------


@dataclass(frozen=True)
class Formats:
    by_suffix: dict[str, ModelFormat]  # a file's suffix -> its format
    folders: dict[frozenset[str], ModelFormat]  # the marker files a folder holds -> its format
    distinguishing: frozenset[str]  # marker files whose presence changes one folder format into another
    returned: frozenset[ModelFormat]  # every format detect_format can return


def formats(tmp: Path) -> Formats:
    """What detect_format accepts, found by reading its code and then asking it."""
    tree = ast.parse(introspect.getsource(detect_format).lstrip())
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    suffixes = sorted(s for s in strings if re.fullmatch(r"\.\w+", s))
    markers = sorted(s for s in strings if re.fullmatch(r"\w+\.pb", s))
    returned = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Attribute):
            returned.add(ModelFormat[node.value.attr])
        elif isinstance(node, ast.Return) and isinstance(node.value, ast.Constant):
            returned.add(ModelFormat(node.value.value))
    assert suffixes and markers and returned, (suffixes, markers, returned)

    def detected(path: Path) -> ModelFormat | None:
        try:
            return detect_format(path)
        except MpconvertError:
            return None

    by_suffix = {}
    for suffix in suffixes:
        path = tmp / f"model{suffix}"
        path.write_bytes(b"")
        if (found := detected(path)) is not None:
            by_suffix[suffix] = found
    folders = {}
    for count in range(len(markers) + 1):
        for chosen in itertools.combinations(markers, count):
            folder = tmp / ("folder-" + "-".join(chosen))
            folder.mkdir()
            for name in chosen:
                (folder / name).write_bytes(b"")
            if (found := detected(folder)) is not None:
                folders[frozenset(chosen)] = found
    distinguishing = {
        marker
        for held, fmt in folders.items()
        for marker in markers
        if marker not in held and folders.get(held | {marker}) not in (None, fmt)
    }
    return Formats(by_suffix, folders, frozenset(distinguishing), frozenset(returned))


@pytest.fixture(scope="module")
def accepted(tmp_path_factory) -> Formats:
    return formats(tmp_path_factory.mktemp("formats"))


# How --help says which kind of SavedModel folder it means, per folder format.
# A format that is new here fails the test below until its words are added.
FOLDER_WORDS = {
    ModelFormat.SAVEDMODEL: ("SavedModel",),
    ModelFormat.GRAPH: ("SavedModel", "without", "graph level"),
}


def help_text(*command: str) -> str:
    result = invoke(*command, "--help")
    assert result.exit_code == 0, result.output
    return re.sub(r"\s+", " ", result.output.split("Options:", 1)[0])


def test_the_derived_formats_are_every_one_detect_format_returns(accepted):
    reached = set(accepted.by_suffix.values()) | set(accepted.folders.values())
    assert reached == accepted.returned, "a branch of detect_format was not reached: extend formats()"
    assert accepted.distinguishing, "no marker file tells one SavedModel folder from another any more"


def test_the_main_help_names_every_model_format_detect_format_accepts(accepted):
    text = help_text()
    missing = [s for s in accepted.by_suffix if s not in text]
    missing += [m for m in accepted.distinguishing if m not in text]
    for fmt in set(accepted.folders.values()):
        assert fmt in FOLDER_WORDS, f"detect_format accepts a new folder format {fmt!r}: name it in --help"
        missing += [f"{word} (for {fmt})" for word in FOLDER_WORDS[fmt] if word not in text]
    assert not missing, f"`mpconvert --help` does not name: {missing}"


def test_inspect_and_doctor_say_which_models_they_take(accepted, tmp_path):
    import graph_models

    from mpconvert.kinds import Capability, open_model
    from mpconvert.options.convert import LoadOptions

    for command in ("inspect", "doctor"):
        text = help_text(command)
        missing = [s for s in [*accepted.by_suffix, *accepted.distinguishing] if s not in text]
        assert not missing, f"`mpconvert {command} --help` does not name: {missing}"
    graph = open_model(LoadOptions(graph_models.two_matmuls(tmp_path / "graph")))
    refuses = Capability.INSPECT in graph.lacking()
    assert ("refused" in help_text("inspect")) == refuses, "inspect's help must say whether it refuses graph models"
