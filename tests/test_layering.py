"""The layering rule of docs/ARCHITECTURE.md, checked on the source (nothing is imported or run).

Every module of the package is parsed with ``ast``; every ``import`` / ``from ... import`` counts, also the lazy
ones inside functions (a lazy import is still a dependency, it only moves the time it is paid), relative imports
are resolved, and ``from pkg import name`` counts as importing ``pkg.name`` when that is a module. The rules then
follow the imports transitively:

(a) no import cycles among diffquant modules, except the ones listed in :data:`ALLOWED_CYCLES`;
(b) nothing in ``diffquant.quant`` reaches ``diffquant.model``, except through the edges in
    :data:`ALLOWED_QUANT_TO_MODEL`;
(c) library modules never reach the CLI (``diffquant.commands``, ``diffquant.cli``, ``diffquant.cliargs``,
    ``diffquant.__main__``);
(d) library modules never call ``print`` (they log), except the calls listed in :data:`ALLOWED_PRINTS`;
(e) library modules never reach the study (``diffquant.study``), which sits above the library and below the CLI.

The allow-lists (all empty) are a ratchet: a new violation fails,
and so does an entry that no longer exists, so the list shrinks when a knot is untied. Importing a submodule
also runs its parent packages' ``__init__`` at run time; those implicit edges are left out (as import-linter
does), otherwise ``diffquant/__init__.py``, which imports the public names, would put every module in one cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "diffquant"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

# (a) Allowed cycles, each one strongly connected component (a set of modules that import each other, directly
# or not). None: the format modules of the diffquant.checkpoint package import the shared helpers in
# checkpoint.files, never the dispatcher.
ALLOWED_CYCLES: list[frozenset[str]] = []

# (b) Allowed edges out of diffquant.quant that lead to the model code. None: packed checkpoints, which build the
# float skeleton, live in diffquant.checkpoint.packed.
ALLOWED_QUANT_TO_MODEL: set[tuple[str, str]] = set()

# (d) print() calls in library modules, as (module, line). None today: the library logs.
ALLOWED_PRINTS: set[tuple[str, int]] = set()

CLI_MODULES = ("diffquant.cli", "diffquant.cliargs", "diffquant.__main__", "diffquant.commands")
STUDY = "diffquant.study"


# ------------------------------------------------------------------------------------------------ the checker


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under ``root`` (``__init__`` names its package)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join([package, *parts])] = path
    return names


def _is_package(name: str, files: dict[str, Path]) -> bool:
    return files[name].name == "__init__.py"


def _resolve_base(module: str, level: int, target: str | None, files: dict[str, Path]) -> str:
    """The absolute name ``from <level dots><target> import ...`` refers to, inside ``module``."""
    if level == 0:
        return target or ""
    package = module if _is_package(module, files) else module.rpartition(".")[0]
    parts = package.split(".")
    if level - 1 > len(parts) - 1:
        raise ValueError(f"{module}: relative import beyond the top-level package")
    base = ".".join(parts[: len(parts) - (level - 1)])
    return f"{base}.{target}" if target else base


def _nearest_module(name: str, files: dict[str, Path]) -> str | None:
    """``name`` if it is a module of the package, else its longest dotted prefix that is (None outside)."""
    while name:
        if name in files:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, tree: ast.AST, files: dict[str, Path]) -> set[str]:
    """The package modules ``module`` imports anywhere in its source (function bodies included)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_base(module, node.level, node.module, files)
            # ``from pkg import sub`` imports the module pkg.sub when there is one, else a name of pkg
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names]
        else:
            continue
        for target in targets:
            resolved = _nearest_module(target, files)
            if resolved is not None and resolved != module:
                found.add(resolved)
    return found


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> tuple[dict[str, set[str]], dict[str, ast.AST]]:
    """(module -> the package modules it imports, module -> its parsed source)."""
    files = module_names(root, package)
    trees = {name: ast.parse(path.read_text(encoding="utf-8"), filename=str(path)) for name, path in files.items()}
    return {name: imports_of(name, tree, files) for name, tree in trees.items()}, trees


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def path_between(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """A shortest import chain start -> ... -> goal (breadth first), or None."""
    previous = {start: None}
    queue = [start]
    for node in queue:
        if node == goal:
            chain = []
            while node is not None:
                chain.append(node)
                node = previous[node]
            return chain[::-1]
        for child in sorted(graph.get(node, ())):
            if child not in previous:
                previous[child] = node
                queue.append(child)
    return None


def loop_through(graph: dict[str, set[str]], node: str) -> list[str]:
    """A shortest import chain node -> ... -> node (empty when node is on no cycle)."""
    chains = [path_between(graph, child, node) for child in sorted(graph.get(node, ()))]
    chains = [c for c in chains if c]
    return [node, *min(chains, key=len)] if chains else []


def _in(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def cycle_violations(graph: dict[str, set[str]], allowed: list[frozenset[str]]) -> list[str]:
    problems = []
    found = cycles(graph)
    for component in found:
        if component not in allowed:
            members = sorted(component)
            loop = " -> ".join(loop_through(graph, members[0]))
            problems.append(f"import cycle among {', '.join(members)} (e.g. {loop})")
    return problems


def quant_model_violations(graph: dict[str, set[str]], package: str,
                           allowed: set[tuple[str, str]]) -> list[str]:
    pruned = {m: {t for t in targets if (m, t) not in allowed} for m, targets in graph.items()}
    model = f"{package}.model"
    problems = []
    for module in sorted(m for m in graph if _in(m, [f"{package}.quant"])):
        chain = path_between(pruned, module, model)
        if chain:
            problems.append(f"{module} reaches the model: {' -> '.join(chain)}")
    return problems


def cli_violations(graph: dict[str, set[str]], package: str) -> list[str]:
    cli = [m.replace(PACKAGE, package, 1) for m in CLI_MODULES]
    problems = []
    for module in sorted(m for m in graph if not _in(m, cli)):
        for target in sorted(t for t in graph if _in(t, cli)):
            chain = path_between(graph, module, target)
            if chain:
                problems.append(f"library module {module} reaches the CLI: {' -> '.join(chain)}")
                break
    return problems


def study_violations(graph: dict[str, set[str]], package: str) -> list[str]:
    """Library modules (neither the CLI nor the study) that reach the study package."""
    study = STUDY.replace(PACKAGE, package, 1)
    above = [m.replace(PACKAGE, package, 1) for m in CLI_MODULES] + [study]
    problems = []
    for module in sorted(m for m in graph if not _in(m, above)):
        for target in sorted(t for t in graph if _in(t, [study])):
            chain = path_between(graph, module, target)
            if chain:
                problems.append(f"library module {module} reaches the study: {' -> '.join(chain)}")
                break
    return problems


def print_calls(trees: dict[str, ast.AST], package: str) -> set[tuple[str, int]]:
    """(module, line) of every ``print(...)`` call in a library module (strings and comments do not count)."""
    cli = [m.replace(PACKAGE, package, 1) for m in CLI_MODULES]
    return {(module, node.lineno) for module, tree in trees.items() if not _in(module, cli)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"}


# ------------------------------------------------------------------------------------------------ the rules


@pytest.fixture(scope="module")
def parsed():
    return import_graph()


def test_graph_is_the_package(parsed):
    graph, _ = parsed
    # spot checks that imports are resolved: relative, lazy (inside functions), and `from . import module`
    assert "diffquant.model" in graph["diffquant.checkpoint.native"]
    assert "diffquant.checkpoint.hf" in graph["diffquant.checkpoint"]  # `from .hf import ...`
    assert "diffquant.checkpoint.hf" in graph["diffquant.hf_probes"]
    assert "diffquant.quant.registry" in graph["diffquant.hf_native"]  # lazy relative import
    assert "diffquant.quant.config" in graph["diffquant.quant.methods.rtn"]  # lazy absolute import
    assert "diffquant.commands" in graph["diffquant.cli"]
    assert "diffquant.study.demo" in graph["diffquant.commands.demo"]
    assert "diffquant.study.verdict" in graph["diffquant.study.demo"]  # `from .verdict import ...`
    assert "diffquant.quant.config" in graph["diffquant.quant.linear"]
    assert len(graph) >= 50


def test_no_new_import_cycles(parsed):
    graph = parsed[0]
    assert cycle_violations(graph, ALLOWED_CYCLES) == []


def test_allowed_cycles_still_exist(parsed):
    """The allow-list is a ratchet: once a cycle is broken, remove its entry so it cannot come back."""
    found = cycles(parsed[0])
    stale = [sorted(c) for c in ALLOWED_CYCLES if c not in found]
    assert stale == [], f"these allowed cycles are gone (or changed): remove them from ALLOWED_CYCLES: {stale}"


def test_quant_does_not_reach_the_model(parsed):
    graph = parsed[0]
    assert quant_model_violations(graph, PACKAGE, ALLOWED_QUANT_TO_MODEL) == []


def test_allowed_quant_edges_still_exist(parsed):
    graph = parsed[0]
    stale = sorted((a, b) for a, b in ALLOWED_QUANT_TO_MODEL if b not in graph.get(a, ()))
    assert stale == [], f"remove these edges from ALLOWED_QUANT_TO_MODEL, they are gone: {stale}"


def test_library_does_not_reach_the_cli(parsed):
    assert cli_violations(parsed[0], PACKAGE) == []


def test_library_does_not_reach_the_study(parsed):
    graph = parsed[0]
    assert any(_in(m, [STUDY]) for m in graph), "the study package is part of the graph"
    assert study_violations(graph, PACKAGE) == []


def test_library_logs_instead_of_printing(parsed):
    found = print_calls(parsed[1], PACKAGE)
    assert found - ALLOWED_PRINTS == set(), "library code logs (logging.getLogger(__name__)); print only in the CLI"
    assert ALLOWED_PRINTS - found == set(), "remove these from ALLOWED_PRINTS, they are gone"


# ------------------------------------------------------------------------------------------------ the checker fails


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_checker_catches_violations(tmp_path):
    """A small synthetic package with one of each violation, hidden as the real ones would be: a cycle closed by
    a lazy relative import inside a function, quant reaching the model through a middle module, a library
    module importing the CLI through ``from . import``, and a print call (but not the word in a docstring)."""
    pkg = "fakepkg"
    _write(tmp_path / pkg, {
        "__init__.py": "from .a import f\n",
        "a.py": "from .b import g\n\ndef f():\n    return g()\n",
        "b.py": "def g():\n    from . import c\n    return c.h()\n",
        "c.py": "import fakepkg.a\n\ndef h():\n    return 1\n",
        "model.py": "X = 1\n",
        "loader.py": "from .model import X\n",
        "quant/__init__.py": "",
        "quant/numerics.py": '"""Pure: print(x) in a docstring is fine."""\n',
        "quant/packed.py": "def load():\n    from ..loader import X\n    return X\n",
        "report.py": "from . import cli\n\ndef show(x):\n    print(x)\n",
        "cli.py": "def main():\n    print('hi')\n",
        "commands/__init__.py": "",
        "commands/run.py": "from ..report import show\n",
        "study/__init__.py": "",
        "study/gate.py": "from ..model import X\n",
        "summary.py": "def table():\n    from .study import gate\n    return gate\n",
        "loader2.py": "from .summary import table\n",
    })
    graph, trees = import_graph(tmp_path / pkg, pkg)
    assert graph["fakepkg.b"] == {"fakepkg.c"}
    assert graph["fakepkg.quant.packed"] == {"fakepkg.loader"}

    assert cycles(graph) == [frozenset({"fakepkg.a", "fakepkg.b", "fakepkg.c"})]
    problems = cycle_violations(graph, ALLOWED_CYCLES)
    assert len(problems) == 1 and "fakepkg.a -> fakepkg.b -> fakepkg.c -> fakepkg.a" in problems[0]
    assert cycle_violations(graph, [frozenset({"fakepkg.a", "fakepkg.b", "fakepkg.c"})]) == []
    assert cycle_violations(graph, [frozenset({"fakepkg.a", "fakepkg.b"})]) != []  # a grown cycle is new

    assert quant_model_violations(graph, pkg, set()) == [
        "fakepkg.quant.packed reaches the model: fakepkg.quant.packed -> fakepkg.loader -> fakepkg.model"]
    assert quant_model_violations(graph, pkg, {("fakepkg.quant.packed", "fakepkg.loader")}) == []

    cli = cli_violations(graph, pkg)
    assert cli == ["library module fakepkg.report reaches the CLI: fakepkg.report -> fakepkg.cli"]

    assert print_calls(trees, pkg) == {("fakepkg.report", 4)}

    assert study_violations(graph, pkg) == [
        "library module fakepkg.loader2 reaches the study: fakepkg.loader2 -> fakepkg.summary -> fakepkg.study.gate",
        "library module fakepkg.summary reaches the study: fakepkg.summary -> fakepkg.study.gate"]


def test_checker_accepts_a_clean_package(tmp_path):
    pkg = "cleanpkg"
    _write(tmp_path / pkg, {
        "__init__.py": "from .model import M\nfrom . import quant\n",
        "model.py": "from .probes import P\nM = P\n",
        "probes.py": "import logging\nP = 1\nlog = logging.getLogger(__name__)\n",
        "quant/__init__.py": "from .act import Q\n",
        "quant/act.py": "from ..probes import P\nfrom cleanpkg.quant import numerics\nQ = P\n",
        "quant/numerics.py": "import torch  # outside the package: ignored\n",
        "cli.py": "from .model import M\nfrom .study import verdict\nprint(M, verdict)\n",
        "study/__init__.py": "",
        "study/verdict.py": "from ..model import M\nV = M\n",
    })
    graph, trees = import_graph(tmp_path / pkg, pkg)
    assert graph["cleanpkg.quant.act"] == {"cleanpkg.probes", "cleanpkg.quant.numerics"}
    assert cycles(graph) == []
    assert quant_model_violations(graph, pkg, set()) == []
    assert cli_violations(graph, pkg) == []
    assert study_violations(graph, pkg) == []
    assert print_calls(trees, pkg) == set()
