"""The package's sizes: no function over 100 lines and no module over 800, so each fits one reading; in the core
(what a server process loads: everything outside ``tools/``) no function over 12 parameters.

Counted from the source (AST), the copies of SGLang methods included: a function's lines run from its
``def`` to its last statement (decorators apart), a module's are its physical lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "sglang_specvocab"
MAX_FUNCTION = 100
MAX_MODULE = 800
MAX_PARAMETERS = 12
TOOLS = PACKAGE / "tools"


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    """(name, lines) of every function or method in ``source`` longer than ``limit`` lines."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                out.append((node.name, lines))
    return out


def test_the_counter_counts():
    body = "\n".join(f"    x{i} = {i}" for i in range(4))
    assert long_functions(f"def f():\n{body}\n\ndef g():\n    pass\n", 4) == [("f", 5)]
    assert long_functions(f"class C:\n    def m(self):\n    {body}\n", 5) == []
    assert PACKAGE / "head.py" in sources()


def test_no_function_over_100_lines():
    found = [
        f"{path.relative_to(PACKAGE.parent)}: {name} ({lines} lines)"
        for path in sources()
        for name, lines in long_functions(path.read_text(encoding="utf-8"), MAX_FUNCTION)
    ]
    assert not found, f"functions over {MAX_FUNCTION} lines:\n" + "\n".join(found)


def test_no_module_over_800_lines():
    found = [
        f"{path.relative_to(PACKAGE.parent)} ({n} lines)"
        for path in sources()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE
    ]
    assert not found, f"modules over {MAX_MODULE} lines: " + ", ".join(found)


def wide_functions(source: str, limit: int) -> list[tuple[str, int]]:
    """(name, parameters) of every function in ``source`` with more than ``limit`` parameters (``self``/``cls`` not
    counted). A Triton kernel (``@triton.jit``) is left out: its parameters are its launch's arguments."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if any(ast.unparse(d).endswith("jit") for d in node.decorator_list):
            continue
        a = node.args
        names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)] + [p.arg for p in (a.vararg, a.kwarg) if p]
        n = len(names) - (names[:1] in (["self"], ["cls"]))
        if n > limit:
            out.append((node.name, n))
    return out


def test_the_parameter_counter_counts():
    assert wide_functions("def f(a, b, *c, d, **e): pass\nclass C:\n    def m(self, a, b): pass\n", 4) == [("f", 5)]
    assert wide_functions("@triton.jit\ndef k(a, b, c, d, e): pass\n", 4) == []
    assert wide_functions("class C:\n    def m(self, a, b, c, d): pass\n", 4) == []


def test_no_core_function_over_12_parameters():
    core = [p for p in sources() if not p.is_relative_to(TOOLS)]
    assert PACKAGE / "head.py" in core and not any(p.is_relative_to(TOOLS) for p in core)
    found = [
        f"{path.relative_to(PACKAGE.parent)}: {name} ({n} parameters)"
        for path in core
        for name, n in wide_functions(path.read_text(encoding="utf-8"), MAX_PARAMETERS)
    ]
    assert not found, f"core functions over {MAX_PARAMETERS} parameters:\n" + "\n".join(found)
