"""Imports only point down the layers, and no two modules import each other (directly or round a longer loop).

Every ``import`` in every module of the package counts, at the top of the file or inside a function: an import
deferred to keep ``--help`` instant, or to set up the JVM first, is still a dependency.

The layers, highest first (a module may import its own layer and those below; a layer's packages are peers):

    cli        every ``__main__.py``, ``_cli.py``
    analysis   bench, budget, explain, eval, train
    search     search, pyterrier (the PyTerrier transformers: an integration over search and rerankers)
    rerankers  rerankers
    sidecar    sidecar
    base       models, index, formats, types and the low-level helpers (``_jvm``, ``_io``, ``_lazy``,
               ``_model_args``, ``cache``, ``errors``, ``precision``, ``_start_hook``, ``_pyserini_start``,
               ``_openai_deferred``, ``windows``)

``pyserini_mores/__init__.py`` belongs to the base layer: its public names are re-exported lazily, by module name
through ``importlib`` (so that ``import pyserini_mores`` starts neither torch nor the JVM), which is no import here;
nor are the other lookups by name (the lazy export tables of package ``__init__`` files, the model registry's
``"module:Class"`` entries).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "pyserini_mores"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

LAYERS = ("base", "sidecar", "rerankers", "search", "analysis", "cli")  # lowest first
LAYER_OF_PACKAGE = {
    "bench": "analysis", "budget": "analysis", "explain": "analysis", "eval": "analysis", "train": "analysis",
    "search": "search", "pyterrier": "search",
    "rerankers": "rerankers",
    "sidecar": "sidecar",
    "models": "base", "index": "base", "formats": "base", "types": "base",
    "_jvm": "base", "_io": "base", "_lazy": "base", "precision": "base", "_model_args": "base", "cache": "base",
    "errors": "base", "windows": "base", "_start_hook": "base", "_pyserini_start": "base", "_openai_deferred": "base",
}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int

    def __str__(self) -> str:
        return f"{module_file(self.importer)}:{self.line} imports {self.imported}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_file(name: str) -> str:
    path = ROOT.parent.joinpath(*name.split("."))
    file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return str(file.relative_to(ROOT.parent))


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[-1] == "__main__" or module == f"{PACKAGE}._cli":
        return "cli"
    if module == PACKAGE:
        return "base"
    try:
        return LAYER_OF_PACKAGE[parts[1]]
    except KeyError:
        raise AssertionError(f"{module_file(module)} is in no layer: add '{parts[1]}' to LAYER_OF_PACKAGE") from None


def imports_of(module: str, path: Path, known: set[str]) -> list[Import]:
    """The package's own modules that ``module`` imports anywhere in its file: ``from . import x`` names the
    submodule ``x`` when there is one, else the package itself."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.append(Import(module, submodule if submodule in known else target, node.lineno))
    return sorted({item for item in found
                   if (item.imported == PACKAGE or item.imported.startswith(PACKAGE + "."))
                   and item.imported != module and item.imported in known}, key=lambda item: (item.line, item.imported))


def import_graph() -> list[Import]:
    modules = all_modules()
    known = set(modules)
    return [item for module, path in modules.items() for item in imports_of(module, path, known)]


def cycles(edges: list[Import]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module: each is at least one import cycle."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, set()).add(edge.imported)
        graph.setdefault(edge.imported, set())
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = lowlink[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                lowlink[node] = min(lowlink[node], lowlink[successor])
            elif successor in on_stack:
                lowlink[node] = min(lowlink[node], index[successor])
        if lowlink[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_every_module_is_in_a_layer():
    for module in all_modules():
        assert layer(module) in LAYERS


def test_imports_only_point_down():
    upward = [f"{edge} ({layer(edge.importer)} → {layer(edge.imported)})" for edge in import_graph()
              if LAYERS.index(layer(edge.imported)) > LAYERS.index(layer(edge.importer))]
    assert not upward, "imports from a lower layer to a higher one:\n  " + "\n  ".join(upward)


def test_no_import_cycles():
    edges = import_graph()
    problems = []
    for component in cycles(edges):
        members = set(component)
        inside = [str(edge) for edge in edges if edge.importer in members and edge.imported in members]
        problems.append(" ↔ ".join(component) + ":\n    " + "\n    ".join(inside))
    assert not problems, "import cycles:\n  " + "\n  ".join(problems)


def test_the_checker_sees_relative_function_level_and_submodule_imports(tmp_path):
    """The parser itself: a relative import inside a function, ``from . import submodule`` and a plain import."""
    package = tmp_path / PACKAGE / "sidecar"
    package.mkdir(parents=True)
    source = package / "example.py"
    source.write_text("import pyserini_mores.models\nfrom . import reader\n\n\ndef later():\n"
                      "    from ..search.searcher import RerankingSearcher\n")
    known = {f"{PACKAGE}.models", f"{PACKAGE}.sidecar", f"{PACKAGE}.sidecar.reader", f"{PACKAGE}.search.searcher"}
    global ROOT
    saved, ROOT = ROOT, tmp_path / PACKAGE
    try:
        found = {(edge.imported, edge.line) for edge in imports_of(f"{PACKAGE}.sidecar.example", source, known)}
    finally:
        ROOT = saved
    assert found == {(f"{PACKAGE}.models", 1), (f"{PACKAGE}.sidecar.reader", 2), (f"{PACKAGE}.search.searcher", 6)}
    assert cycles([Import("a", "b", 1), Import("b", "c", 1), Import("c", "a", 1), Import("c", "d", 1)]) == [
        ["a", "b", "c"]]
