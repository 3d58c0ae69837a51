"""No import circle among the product's modules: trainmeter_core, trainmeter_sources, trainmeter_agent,
trainmeter_web and every package under plugins/*/ (not their tests), read with ``ast``, nothing imported.

Every import is an edge, wherever it stands: at module level, inside a function or method, under
``if TYPE_CHECKING:``; each is coupling, and most circles close only through the lazy ones. ``import a.b`` and
``from a import b`` point at the module ``a.b`` when it is one of ours; ``from a import name`` otherwise points at
``a`` (its ``__init__``). Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``: that counts as an
edge only when such an ``__init__`` imports one of our modules at module level (only then does it run more of our
code), and never towards the importer's own parent packages (Python has run those before the importer). Imports
spelled as strings (``importlib.import_module``, entry points) are not edges.

The finder lives here because it is a test tool; its own tests plant one circle of each kind in a throwaway tree.
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from tm_runs import REPO

PACKAGES = ("trainmeter_core", "trainmeter_sources", "trainmeter_agent", "trainmeter_web")


@dataclass(frozen=True)
class Edge:
    """One import statement of ours: ``source`` imports ``target`` at ``path:line``; ``how`` says where it stands."""

    source: str
    target: str
    path: str
    line: int
    how: str  # "module level", "in a function", "under TYPE_CHECKING" or "parent package"


def product_roots(repo: Path) -> list[Path]:
    """The folders of the product's top-level packages: tm's four and each plugin's (its tests left out)."""
    roots = [repo / name for name in PACKAGES]
    for plugin in sorted((repo / "plugins").glob("*/")):
        roots += [p.parent for p in sorted(plugin.glob("*/__init__.py")) if p.parent.name != "tests"]
    return roots


def module_files(roots: list[Path]) -> dict[str, Path]:
    """Dotted module name -> its file, for every module under the given package folders (``__init__`` names its
    package)."""
    modules: dict[str, Path] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root.parent).with_suffix("").parts
            if "tests" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Imports(ast.NodeVisitor):
    """The import statements of one module, each with the dotted names it reaches and where it stands."""

    def __init__(self, module: str, is_package: bool) -> None:
        self.package = module if is_package else module.rpartition(".")[0]
        self.found: list[tuple[int, str, list[str]]] = []  # (line, how, names it may reach)
        self._functions = 0
        self._type_checking = 0

    def _how(self) -> str:
        if self._type_checking:
            return "under TYPE_CHECKING"
        return "in a function" if self._functions else "module level"

    def _in_function(self, node: ast.AST) -> None:
        self._functions += 1
        self.generic_visit(node)
        self._functions -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _in_function

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self._type_checking += 1
        for child in node.body:
            self.visit(child)
        self._type_checking -= 1
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        self.found += [(node.lineno, self._how(), [alias.name]) for alias in node.names]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            anchor = self.package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        # Each name may be a submodule (``from a import b``); what is not one points back at ``base``.
        self.found.append(
            (node.lineno, self._how(), [f"{base}.{alias.name}" for alias in node.names] + [base])
        )


def _ours(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is one of our modules, or None (an import from outside)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _imports_ours_at_module_level(tree: ast.Module, package: str, modules: dict[str, Path]) -> bool:
    finder = _Imports(package, is_package=True)
    finder.visit(tree)
    return any(
        how == "module level" and any(_ours(n, modules) for n in names) for _, how, names in finder.found
    )


def import_edges(repo: Path, roots: list[Path]) -> list[Edge]:
    """Every edge between our modules, in file and line order."""
    modules = module_files(roots)
    trees = {name: ast.parse(path.read_text(encoding="utf-8"), str(path)) for name, path in modules.items()}
    running_init = {
        name
        for name, path in modules.items()
        if path.name == "__init__.py" and _imports_ours_at_module_level(trees[name], name, modules)
    }
    edges: list[Edge] = []
    for source, path in modules.items():
        finder = _Imports(source, is_package=path.name == "__init__.py")
        finder.visit(trees[source])
        where = path.relative_to(repo).as_posix()
        own_parents = {source.rsplit(".", n)[0] for n in range(1, source.count(".") + 1)}
        for line, how, names in finder.found:
            submodules = [n for n in names[:-1] if n in modules] if len(names) > 1 else []
            reached = submodules or [_ours(names[-1], modules)]
            for target in dict.fromkeys(t for t in reached if t is not None and t != source):
                edges.append(Edge(source, target, where, line, how))
                parts = target.split(".")
                for end in range(1, len(parts)):
                    parent = ".".join(parts[:end])
                    if parent in running_init and parent not in own_parents and parent != source:
                        edges.append(Edge(source, parent, where, line, "parent package"))
    return edges


def find_circles(edges: list[Edge]) -> list[list[Edge]]:
    """Import circles, each as the edges that close it: within each tangle of modules that reach one another, the
    shortest circle through each module (so every module of a tangle shows up once, without listing every path)."""
    graph: dict[str, dict[str, list[Edge]]] = {}
    for edge in edges:
        graph.setdefault(edge.source, {}).setdefault(edge.target, []).append(edge)
    circles: dict[tuple[str, ...], list[Edge]] = {}
    for start in sorted(graph):
        # Breadth first from ``start``: the first way back to it is the shortest circle through it.
        came_from: dict[str, str] = {}
        queue = deque([start])
        while queue:
            node = queue.popleft()
            if start in graph.get(node, {}):
                path = [start]
                while node != start:
                    path.append(node)
                    node = came_from[node]
                path = [start, *reversed(path[1:])]
                turn = path.index(min(path))
                key = tuple(path[turn:] + path[:turn])
                circles.setdefault(key, [graph[a][b][0] for a, b in zip(key, key[1:] + key[:1], strict=True)])
                break
            for nxt in sorted(graph.get(node, {})):
                if nxt not in came_from and nxt != start:
                    came_from[nxt] = node
                    queue.append(nxt)
    return [circles[key] for key in sorted(circles)]


def describe(circle: list[Edge], edges: list[Edge]) -> str:
    """``a -> b -> a`` and, under it, each edge's file and lines (every statement that makes it)."""
    lines = [" -> ".join([e.source for e in circle] + [circle[0].source])]
    for step in circle:
        same = [e for e in edges if (e.source, e.target) == (step.source, step.target)]
        where = ", ".join(f"{e.line} ({e.how})" for e in same)
        lines.append(f"    {step.source} -> {step.target}: {step.path}:{where}")
    return "\n".join(lines)


def test_no_import_circle_in_the_product():
    edges = import_edges(REPO, product_roots(REPO))
    circles = find_circles(edges)
    assert not circles, (
        f"{len(circles)} import circles; break each by the leaf module it lacks:\n"
        + "\n".join(describe(c, edges) for c in circles)
    )


# --------------------------------------------------------------------------------------------------------------------
# The finder's own proof: a throwaway tree with one circle of each kind, and one with none.


def _plant(root: Path, files: dict[str, str]) -> list[Path]:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return sorted({root / name.split("/")[0] for name in files})


def _circles_in(root: Path, files: dict[str, str]) -> list[str]:
    edges = import_edges(root, _plant(root, files))
    return [
        " -> ".join([e.source for e in c] + [c[0].source]) + " " + ",".join(e.how for e in c)
        for c in find_circles(edges)
    ]


def test_a_circle_at_module_level_is_found(tmp_path):
    found = _circles_in(
        tmp_path,
        {"pkg/__init__.py": "", "pkg/a.py": "from pkg import b\n", "pkg/b.py": "import pkg.a\n"},
    )
    assert found == ["pkg.a -> pkg.b -> pkg.a module level,module level"]


def test_a_circle_through_an_import_inside_a_function_is_found(tmp_path):
    found = _circles_in(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from .b import thing\n",
            "pkg/b.py": "class Thing:\n    def go(self):\n        from pkg.a import other\n",
        },
    )
    assert found == ["pkg.a -> pkg.b -> pkg.a module level,in a function"]


def test_a_circle_through_a_type_checking_import_is_found(tmp_path):
    found = _circles_in(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "import pkg.b\n",
            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n",
        },
    )
    assert found == ["pkg.a -> pkg.b -> pkg.a module level,under TYPE_CHECKING"]


def test_a_circle_through_a_parent_package_that_imports_is_found(tmp_path):
    # pkg.sub's __init__ imports pkg.sub.c at module level, so importing pkg.sub.d runs it: a -> sub -> c -> a.
    found = _circles_in(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "import pkg.sub.d\n",
            "pkg/sub/__init__.py": "from pkg.sub.c import thing\n",
            "pkg/sub/c.py": "def f():\n    import pkg.a\n",
            "pkg/sub/d.py": "",
        },
    )
    assert found == ["pkg.a -> pkg.sub -> pkg.sub.c -> pkg.a parent package,module level,in a function"]


def test_a_tree_without_a_circle_reports_none(tmp_path):
    found = _circles_in(
        tmp_path,
        {
            "pkg/__init__.py": "import os\n",  # imports nothing of ours: importing pkg.x runs nothing more of ours
            "pkg/leaf.py": "import json\n",
            "pkg/a.py": "from pkg import leaf\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.b\n",
            "pkg/b.py": "def f():\n    from pkg.leaf import x\n",
            "pkg/sub/__init__.py": "from pkg.sub.c import thing\n",
            "pkg/sub/c.py": "from pkg import a\n",  # the parent package pkg.sub already ran: no edge back to it
            "pkg/tests/test_a.py": "import pkg.b\nimport pkg.a\n",  # tests are not the product
        },
    )
    assert found == []


def test_the_failure_names_each_edge_with_its_file_and_line(tmp_path):
    roots = _plant(
        tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "\nimport pkg.b\n", "pkg/b.py": "import pkg.a\n"}
    )
    edges = import_edges(tmp_path, roots)
    assert [describe(c, edges) for c in find_circles(edges)] == [
        "pkg.a -> pkg.b -> pkg.a\n"
        "    pkg.a -> pkg.b: pkg/a.py:2 (module level)\n"
        "    pkg.b -> pkg.a: pkg/b.py:1 (module level)"
    ]
