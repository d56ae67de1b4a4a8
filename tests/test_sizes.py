"""The package's sizes: no function over 100 lines and no module over 800, so each fits one reading.

Counted from the source (AST), the copies of SGLang methods included: a function's lines run from its
``def`` to its last statement (decorators apart), a module's are its physical lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "sglang_specvocab"
MAX_FUNCTION = 100
MAX_MODULE = 800


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
