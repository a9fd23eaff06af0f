"""The package's import graph has no cycle, not even one through an import
inside a function: lower modules never import higher ones. Read from the
source with `ast`, so nothing is imported."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flashopt"


def modules(root: Path = PACKAGE):
    """Module name -> (path, is a package) of every .py file under `root`."""
    out = {}
    for f in sorted(root.rglob("*.py")):
        parts = ["flashopt", *f.relative_to(root).with_suffix("").parts]
        pkg = parts[-1] == "__init__"
        if pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (f, pkg)
    return out


def imports(name: str, path: Path, is_pkg: bool, known):
    """(imported module, line) for every import statement of the module,
    module-level or inside a function, that names a module of the package.
    `from X import y` counts as importing X.y when that is a module, else X."""
    package = name if is_pkg else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((sub if sub in known else target, node.lineno))
    return [(t, line) for t, line in out if t in known and t != name]


def import_graph(root: Path = PACKAGE):
    """module -> {imported module: line of the import}."""
    known = modules(root)
    graph = {}
    for name, (path, is_pkg) in known.items():
        graph[name] = {}
        for target, line in imports(name, path, is_pkg, known):
            graph[name].setdefault(target, line)
    return graph


def find_cycle(graph):
    """A cycle as [m0, m1, ..., m0], or None (depth-first search)."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                return stack[stack.index(t):] + [t]
            if t not in state:
                found = visit(t)
                if found:
                    return found
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_graph_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / "flashopt"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("from . import b\nimport flashopt.c\n")
    (pkg / "b.py").write_text("def g():\n    from .sub.d import h\n")
    (pkg / "c.py").write_text("import os\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "d.py").write_text("def h():\n    from .. import a\n    from ..c import x\n")
    g = import_graph(pkg)
    assert g["flashopt"] == {"flashopt.a": 1}
    assert g["flashopt.a"] == {"flashopt.b": 1, "flashopt.c": 2}
    assert g["flashopt.b"] == {"flashopt.sub.d": 2}
    assert g["flashopt.sub.d"] == {"flashopt.a": 2, "flashopt.c": 3}
    assert find_cycle(g) == ["flashopt.a", "flashopt.b", "flashopt.sub.d", "flashopt.a"]
    del g["flashopt.sub.d"]["flashopt.a"]
    assert find_cycle(g) is None


def test_the_package_imports_without_cycles():
    graph = import_graph()
    assert "flashopt._base" in graph and "flashopt.compat.flashoptim" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(
        f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"
