"""The package's import graph: no cycle, read from the source (AST), so nothing is imported here.

An edge ``a -> b`` is an import of package module ``b`` by module ``a``, relative imports resolved;
``from p import x`` where ``p.x`` is a module counts as an import of ``p.x``. Two graphs are checked:
module-level imports (what runs at import time) and all imports, function-local ones included
(a cycle hidden behind a function-local import is still a cycle in the design).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sglang_specvocab"
NAME = PACKAGE.name


def modules() -> dict[str, Path]:
    """Dotted name -> file of every importable module (the version folders under copies/ are loaded by path)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if not all(p.isidentifier() for p in parts):
            continue
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _absolute(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name: str, path: Path, known: set[str], module_level: bool) -> set[str]:
    """The package modules ``name`` imports (only its module-level statements when ``module_level``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if module_level:
        nodes = []
        todo = list(tree.body)
        while todo:  # module-level code, including inside if/try blocks, but not inside def/class bodies
            node = todo.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            nodes.append(node)
            todo.extend(ast.iter_child_nodes(node))
    else:
        nodes = list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, name, path.name == "__init__.py")
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            if target in known and target != name:
                out.add(target)
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def graph(module_level: bool) -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods), module_level) for name, path in mods.items()}


def test_the_walker_sees_the_package():
    g = graph(module_level=True)
    assert {f"{NAME}.policies", f"{NAME}.integration.worker", f"{NAME}.tools.lab.decoder"} <= set(g)
    assert f"{NAME}.table" in g[f"{NAME}.head"] and f"{NAME}.ops" in g[f"{NAME}.head"]


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("module_level", [True, False], ids=["module-level", "all-imports"])
def test_no_import_cycle(module_level):
    cycle = find_cycle(graph(module_level))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# The plug-in and its copies of SGLang methods; and the CPU harness, which builds SGLang's objects (over the
# stand-ins or SGLang itself) around the plug-in's real worker methods for the host benchmark and the loop tests.
SGLANG_ROOMS = (f"{NAME}.integration", f"{NAME}.copies")
SGLANG_DRIVERS = (f"{NAME}.tools.bench.harness",)


TOOLS = f"{NAME}.tools"  # the tools' wing; every other module is the core, what a server process may load


def is_tool(module: str) -> bool:
    return module == TOOLS or module.startswith(TOOLS + ".")


def room(module: str) -> str:
    """The room a module lives in: a subpackage (``ops``, ``policies``, ``tools.lab``, ``tools.cli`` ...) is one
    room, each module at a wing's top (``head``, ``table``, ``tools.models`` ...) its own."""
    return ".".join(module.split(".")[: 3 if is_tool(module) and module != TOOLS else 2])


def rooms() -> dict[str, set[str]]:
    """The import graph (function-local imports included) with every room collapsed to one node."""
    out: dict[str, set[str]] = {}
    for name, targets in graph(module_level=False).items():
        out.setdefault(room(name), set()).update(room(t) for t in targets if room(t) != room(name))
    return out


def test_rooms_import_one_way():
    """No folder-level cycle: ``lab`` may use ``train`` (its drafts) but not the other way round, and so on for
    every pair of rooms; the command line sits on top, only ``python -m sglang_specvocab`` imports it."""
    g = rooms()
    lab, train = f"{TOOLS}.lab", f"{TOOLS}.train"
    assert train in g[lab] and f"{TOOLS}.models" in g[train]  # the walker sees rooms
    cycle = find_cycle(g)
    assert cycle is None, "rooms import each other: " + " -> ".join(cycle)
    users = [r for r, targets in g.items() if f"{TOOLS}.cli" in targets]
    assert users == [f"{NAME}.__main__"], f"{users} import the command line"


# The one door from the core's side into the tools: ``python -m sglang_specvocab`` runs the command line. No module
# imports it, so no server process loads it.
DOORS = (f"{NAME}.__main__",)


def test_the_core_imports_no_tool():
    """The two wings: no core module imports a tool module, at module level or inside a function."""
    g = graph(module_level=False)
    assert f"{TOOLS}.lab.decoder" in g and f"{NAME}.head" in g[f"{TOOLS}.lab.decoder"]  # the walker sees both wings
    leaks = sorted(f"{a} -> {b}" for a, targets in g.items() if not is_tool(a) and a not in DOORS for b in targets
                   if is_tool(b))  # fmt: skip
    assert not leaks, "core modules import tools:\n" + "\n".join(leaks)
    assert not [a for a, targets in g.items() if set(DOORS) & targets], "a module imports the command-line door"


_SERVER_PROCESS = """
import sys
from sglang_specvocab.tools.testing.standins import install

install(("torchvision",))  # SGLang imports torchvision, which has no CPU build here
before = {m for m in sys.modules if m.startswith("sglang_specvocab.tools")}  # the stand-ins' own modules

from sglang_specvocab.integration import plugin

plugin.register()  # as SGLang's load_plugins() does in every server process
from sglang_specvocab.integration import algorithm, logits, worker  # the scheduler's worker, with the copies
from importlib import resources

from sglang_specvocab.policies import load_config

for path in sorted(resources.files("sglang_specvocab.configs").iterdir()):
    if path.name.endswith(".yaml"):
        load_config(str(path))  # every shipped config's policy classes
loaded = sorted(m for m in sys.modules if m.startswith("sglang_specvocab.") and m not in before)
print(" ".join(loaded))
"""


@pytest.mark.sglang
def test_a_server_process_loads_no_tool(tmp_path):
    """What an SGLang server process imports of the package (the plug-in's registration, the worker and its copies of
    SGLang methods, every shipped config) is core only: the tools' wing stays on disk."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _SERVER_PROCESS], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)})  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = run.stdout.split()
    assert f"{NAME}.integration.worker" in loaded and f"{NAME}.head" in loaded  # the child saw the server's modules
    assert [m for m in loaded if is_tool(m)] == []


def test_only_integration_imports_sglang():
    mods = modules()
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found = [node.module or ""]
            else:
                continue
            if any(m == "sglang" or m.startswith("sglang.") for m in found):
                assert name.startswith(SGLANG_ROOMS) or name in SGLANG_DRIVERS, (
                    f"{name} imports SGLang ({found}); only {', '.join(SGLANG_ROOMS + SGLANG_DRIVERS)} may"
                )


def test_function_local_imports_say_why():
    """A function-local import is there to avoid a heavy or optional dependency, and says which in a comment
    (on its line or the line above; the imports right below a commented one share its comment)."""
    unexplained = []
    for path in modules().values():
        lines = path.read_text(encoding="utf-8").splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            explained: set[int] = set()
            local = sorted(
                (n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))), key=lambda n: n.lineno
            )
            for node in local:
                above = node.lineno - 2
                while above >= 0 and not lines[above].strip():
                    above -= 1
                if (
                    any("#" in lines[i] for i in range(node.lineno - 1, node.end_lineno))
                    or (above >= 0 and lines[above].strip().startswith("#"))
                    or above + 1 in explained
                ):
                    explained.update(range(node.lineno, node.end_lineno + 1))
                else:
                    unexplained.append(
                        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {lines[node.lineno - 1].strip()}"
                    )
    assert not unexplained, "function-local imports without a reason:\n" + "\n".join(unexplained)
