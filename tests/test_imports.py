"""The package's imports, read from its source (no import of it): a function-local import is there only to defer a
heavy one (torch, TRL, transformers, datasets, matplotlib, ...) and says so with a ``deferred`` comment, on its line
or on a comment line directly above the run of imports it belongs to; and the modules' top-level imports form no
cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "acpo_trl"
IMPORTS = (ast.Import, ast.ImportFrom)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_sources(root: Path = ROOT) -> dict[str, tuple[Path, str]]:
    """``{module name: (path, source)}`` of every module of the package under ``root``."""
    return {module_name(path, root): (path, path.read_text(encoding="utf-8"))
            for path in sorted((root / PACKAGE).rglob("*.py"))}


def statement_lists(node: ast.AST):
    """Every list of statements under ``node`` (bodies, else and finally branches, handlers), with the statement
    that holds it (``None`` for the module's own body)."""
    yield node, node.body
    for child in ast.walk(node):
        for name in ("body", "orelse", "finalbody"):
            stmts = getattr(child, name, None)
            if child is not node and isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                yield child, stmts


def inside_function(tree: ast.Module) -> set[int]:
    """The ``id`` of every import statement that sits inside a function (at any depth)."""
    return {id(n) for f in ast.walk(tree) if isinstance(f, FUNCTIONS) for n in ast.walk(f) if isinstance(n, IMPORTS)}


def comments_above(lines: list[str], lineno: int) -> list[str]:
    """The comment lines directly above line ``lineno`` (1-based), nearest first."""
    out, i = [], lineno - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        out.append(lines[i])
        i -= 1
    return out


def undeclared_local_imports(source: str) -> list[tuple[int, str]]:
    """``(line, statement)`` of each function-local import without a ``deferred`` comment: on one of its own lines,
    or directly above the run of import statements (blank lines allowed between them) that it belongs to; a run that
    opens a ``try`` block (an optional dependency's guard) may carry the comment above the ``try``."""
    tree = ast.parse(source)
    lines = source.splitlines()
    local = inside_function(tree)
    missing = []
    for holder, stmts in statement_lists(tree):
        run_start = None
        for i, stmt in enumerate(stmts):
            if not isinstance(stmt, IMPORTS):
                run_start = None
                continue
            run_start = stmt if run_start is None else run_start
            if id(stmt) not in local:
                continue
            own = lines[stmt.lineno - 1:stmt.end_lineno]
            above = comments_above(lines, run_start.lineno)
            if isinstance(holder, ast.Try) and stmts is holder.body and run_start is stmts[0]:
                above += comments_above(lines, holder.lineno)
            if not any("deferred" in line.partition("#")[2] for line in own + above):
                missing.append((stmt.lineno, ast.unparse(stmt)))
    return sorted(missing)


def is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def top_level_imports(tree: ast.Module):
    """The import statements that run when the module is imported: outside functions and ``if TYPE_CHECKING:``."""
    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, FUNCTIONS + (ast.Lambda,)) or is_type_checking(child):
                continue
            if isinstance(child, IMPORTS):
                yield child
            else:
                yield from visit(child)
    yield from visit(tree)


def import_graph(sources: dict[str, tuple[Path, str]]) -> dict[str, set[str]]:
    """``{module: modules of the package it imports at its top level}``. Importing ``a.b.c`` runs ``a`` and
    ``a.b`` first, so those count too, except the importer's own packages (already running when it is)."""
    graph: dict[str, set[str]] = {}
    for name, (path, source) in sources.items():
        is_package = path.name == "__init__.py"
        here = name.split(".") if is_package else name.split(".")[:-1]
        targets = set()
        for node in top_level_imports(ast.parse(source)):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = here[:len(here) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            targets.add(module)
            targets.update(f"{module}.{alias.name}" for alias in node.names)  # kept below where a submodule
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        edges = set()
        for target in targets:
            parts = target.split(".")
            edges.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        graph[name] = {t for t in edges if t in sources and t != name and t not in own}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_every_function_local_import_says_what_it_defers():
    missing = [f"{path.relative_to(ROOT)}:{line}: {statement}"
               for path, source in package_sources().values()
               for line, statement in undeclared_local_imports(source)]
    assert not missing, ("a function-local import without a `# deferred: <what heavy thing, and why here>` comment: "
                         "move it to the module's top, or say what it defers\n" + "\n".join(missing))


def test_the_top_level_imports_form_no_cycle():
    graph = import_graph(package_sources())
    assert len(graph) > 50 and graph["acpo_trl.train"] >= {"acpo_trl.run", "acpo_trl.recipe"}
    assert cycles(graph) == []


# --- the checks themselves can fail ----------------------------------------------------------------------------


@pytest.mark.parametrize("source, expected", [
    ("def f():\n    import json\n", [(2, "import json")]),
    ("def f():\n    import torch  # deferred: torch\n", []),
    ("def f():\n    # deferred: TRL, after the flags\n    from trl import X\n    import torch\n\n    import os\n"
     "    return X\n", []),
    ("def f():\n    # deferred: TRL\n    from trl import X\n    y = 1\n    import torch\n", [(5, "import torch")]),
    ("def f():\n    # not a reason\n    import torch\n", [(3, "import torch")]),
    ("def f():\n    import torch  # a comment, but not that word\n", [(2, "import torch")]),
    ("def f():\n    # deferred: vllm, optional\n    try:\n        import vllm\n    except ImportError:\n"
     "        vllm = None\n", []),
    ("import json\nclass A:\n    def m(self):\n        from .x import (a,\n            b)  # deferred: torch\n", []),
    ("class A:\n    def m(self):\n        def inner():\n            import json\n", [(4, "import json")]),
    ("import json\nfrom . import x\n", []),
])
def test_the_deferred_comment_check(source, expected):
    assert undeclared_local_imports(source) == expected


def write_package(root: Path, files: dict[str, str]) -> dict[str, tuple[Path, str]]:
    for name, text in files.items():
        path = root / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package_sources(root)


def test_the_cycle_check(tmp_path):
    sources = write_package(tmp_path, {
        "__init__.py": "",
        "a.py": "from .b import x\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import y\ndef f():\n    from .a import z\n",
        "c.py": "from . import a\n",
        "sub/__init__.py": "from .d import w\n",
        "sub/d.py": "from ..a import v\nfrom . import e\n",
        "sub/e.py": "from .. import sub\n",
    })
    graph = import_graph(sources)
    assert graph["acpo_trl.a"] == {"acpo_trl.b"}
    assert graph["acpo_trl.b"] == set()  # under TYPE_CHECKING, in a function: not at import time
    assert graph["acpo_trl.sub.d"] == {"acpo_trl.a", "acpo_trl.sub.e"}
    assert graph["acpo_trl.sub.e"] == set()  # its own package
    assert cycles(graph) == []
    sources = write_package(tmp_path, {"b.py": "import acpo_trl.c\n"})
    assert cycles(import_graph(sources)) == [["acpo_trl.a", "acpo_trl.b", "acpo_trl.c"]]
    sources = write_package(tmp_path, {"b.py": "", "c.py": "from .sub.e import q\n", "sub/e.py": "from .. import c\n"})
    assert cycles(import_graph(sources)) == [["acpo_trl.c", "acpo_trl.sub", "acpo_trl.sub.d", "acpo_trl.sub.e"]]
