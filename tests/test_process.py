"""Process-level settings live below the command line: batch workers and the library never import cli/."""

import ast
from pathlib import Path

import mpconvert

PACKAGE = Path(mpconvert.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, relative imports resolved against its package."""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join((*base, *(node.module.split(".") if node.module else ())))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def test_nothing_outside_the_command_line_imports_it():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "cli") or path.name == "__main__.py":
            continue
        cli = sorted(m for m in imported_modules(path) if m == "mpconvert.cli" or m.startswith("mpconvert.cli."))
        if cli:
            offenders[str(path.relative_to(PACKAGE))] = cli
    assert not offenders, f"import the command line: {offenders}"
