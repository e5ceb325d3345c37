"""The layer order of DESIGN.md: nothing imports a layer above it.

Checked on the source (every relative and absolute `workbench` import, including
those inside functions), so an upward import cannot hide behind a lazy import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import workbench

ROOT = Path(workbench.__file__).parent

#: package -> the packages it may import (besides itself)
ALLOWED = {
    "errors": set(),
    "dtypes": set(),
    "reasons": set(),
    "tables": set(),  # the generic trace tables' columns: written below trace, read above
    "addresses": set(),
    "ir": {"errors", "dtypes", "reasons"},
    "backend": {"errors", "dtypes", "reasons", "addresses"},
    "ops": {"errors", "dtypes", "reasons", "addresses"},
    "rewrite": {"errors", "dtypes", "reasons", "addresses", "ir", "ops", "backend"},
    "executor": {"errors", "dtypes", "reasons", "tables", "addresses", "ir", "ops", "backend", "rewrite"},
    "trace": {"errors", "dtypes", "reasons", "tables"},
    "session": {"errors", "dtypes", "reasons", "tables", "ir", "backend", "rewrite", "executor", "trace"},
    "decode": {"errors", "dtypes", "reasons", "tables", "session"},
    "models": {"errors", "dtypes", "reasons"},
    "reports": {"errors", "dtypes", "reasons", "tables", "trace"},
    "widgets": {"errors", "dtypes", "reasons", "tables", "trace", "reports", "decode"},
}


def _imports(source: str, package: tuple[str, ...]) -> set[str]:
    """The top-level workbench packages a module in `package` imports."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(package[: len(package) - (node.level - 1)])
            target = base + (node.module.split(".") if node.module else [])
            if target:
                found.add(target[0])
            else:  # `from .. import x`: x is a package of workbench
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("workbench."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("workbench."))
    return found


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        layer = parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")
        if layer not in ALLOWED:
            continue  # the package root and the command line may use everything
        imported = _imports(path.read_text(encoding="utf-8"), parts[:-1])
        for target in sorted(imported - {layer} - ALLOWED[layer]):
            upward.append(f"{path.relative_to(ROOT)} imports {target}")
    assert upward == []


def test_the_checker_sees_an_upward_import_even_inside_a_function():
    lazy = "def f():\n    from ..session.options import SessionOptions\n"
    assert _imports(lazy, ("executor",)) == {"session"}
    assert _imports("from .. import reports\n", ("trace",)) == {"reports"}
    assert _imports("import workbench.widgets.base\n", ("ops",)) == {"widgets"}
