"""The package's structure holds to docs/architecture.md's "Layering" paragraph: no module imports a higher
layer, and no files import each other in a circle (imports inside functions included: they are read from the
source, not from what happens to be loaded)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def documented_layers() -> list[set[str]]:
    """The layers of the paragraph, lowest first: each a set of top-level names under ``dare``."""
    text = " ".join((ROOT / "docs" / "architecture.md").read_text().split())
    rule = re.search(r"Lower layers never import higher ones: (.*?)\. Shared helpers", text)
    assert rule, "docs/architecture.md lost its Layering rule"
    return [set(re.findall(r"`([a-z_]+)`", part)) for part in rule.group(1).split("<-")]


def module_files(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, packages by their ``__init__.py``."""
    files = {}
    for path in sorted((src / "dare").rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def import_graph(src: Path) -> tuple[dict[str, Path], dict[str, set[str]]]:
    """Every module's imports of other ``dare`` modules (``from P import N`` counts as importing ``P.N`` when
    that is a module, else ``P``)."""
    files = module_files(src)
    graph = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    targets.add(name)
        graph[module] = targets
    return files, graph


def circles(files: dict[str, Path], graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of files that import each other (strongly connected components of more than one file).
    Package ``__init__`` files re-export what lies below them, so edges to and from them are left out."""
    nodes = [m for m, p in files.items() if p.name != "__init__.py"]
    edges = {m: sorted(t for t in graph[m] if files[t].name != "__init__.py") for m in nodes}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(start):  # Tarjan's algorithm, iterative
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))

    for node in nodes:
        if node not in index:
            visit(node)
    return found


def upward_imports(graph: dict[str, set[str]], layers: list[set[str]]) -> list[str]:
    rank = {name: level for level, names in enumerate(layers) for name in names}
    wrong = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = module.split(".")[1:2], target.split(".")[1:2]
            if a and b and a != b and rank[b[0]] > rank[a[0]]:
                wrong.append(f"{module} -> {target}")
    return wrong


def test_every_top_level_module_has_a_documented_layer():
    layers = documented_layers()
    assert len(layers) >= 4 and all(layers)
    placed = set().union(*layers)
    top = {p.stem if p.suffix else p.name for p in (SRC / "dare").iterdir()
           if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert top <= placed, f"add to docs/architecture.md's Layering paragraph: {sorted(top - placed)}"


def test_no_module_imports_a_higher_layer():
    _, graph = import_graph(SRC)
    assert upward_imports(graph, documented_layers()) == []


def test_no_files_import_each_other_in_a_circle():
    files, graph = import_graph(SRC)
    assert circles(files, graph) == []


def test_the_checks_find_circles_and_upward_imports(tmp_path):
    """The analysis itself, on a small package written here: a circle through an import inside a function, a
    relative import, and an import of a higher layer."""
    package = tmp_path / "dare"
    (package / "low").mkdir(parents=True)
    (package / "high").mkdir()
    for folder in (package, package / "low", package / "high"):
        (folder / "__init__.py").write_text("")
    (package / "low" / "a.py").write_text("from dare.low import b\n")
    (package / "low" / "b.py").write_text("def f():\n    from .a import f\n")
    (package / "low" / "c.py").write_text("import dare.high.d\n")
    (package / "high" / "d.py").write_text("from dare.low.c import x\n")
    files, graph = import_graph(tmp_path)
    assert graph["dare.low.b"] == {"dare.low.a"}
    assert circles(files, graph) == [["dare.high.d", "dare.low.c"], ["dare.low.a", "dare.low.b"]]
    assert upward_imports(graph, [{"low"}, {"high"}]) == ["dare.low.c -> dare.high.d"]
