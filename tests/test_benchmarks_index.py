"""benchmarks/README.md indexes every committed result: each top-level file and folder of benchmarks/ is named in
the first column of its table (``x.{json,md,png}`` names the files ``x.json``, ``x.md`` and ``x.png``; ``x/`` a
folder), and every name there exists. Reads the files of a clone only (no git): paths that .gitignore ignores under
benchmarks/ (the trained files) are skipped."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def table_names(text: str) -> list[str]:
    """The backticked names in the first column of the README's table, braces expanded, in order."""
    names = []
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) < 3 or not line.startswith("|") or set(cells[1].strip()) <= set("-: "):
            continue
        for name in re.findall(r"`([^`]+)`", cells[1]):
            group = re.fullmatch(r"(.*)\.\{([^}]*)\}", name)
            names += [f"{group[1]}.{ext.strip()}" for ext in group[2].split(",")] if group else [name]
    return names


def ignored(name: str) -> bool:
    """Whether .gitignore ignores benchmarks/NAME (its patterns for benchmarks/ and its bare names, as git reads them
    for this one level)."""
    for raw in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines():
        pattern = raw.strip().rstrip("/")
        if not pattern or pattern.startswith(("#", "!")):
            continue
        if pattern.startswith("benchmarks/"):
            pattern = pattern.removeprefix("benchmarks/")
        elif "/" in pattern:
            continue  # anchored elsewhere
        if fnmatch.fnmatch(name, pattern):
            return True
    return False


def results_on_disk() -> list[str]:
    """benchmarks/'s top-level results: files by name, folders as ``name/``; the README itself excepted."""
    return sorted(
        p.name + "/" if p.is_dir() else p.name
        for p in BENCH.iterdir()
        if p.name != "README.md" and not p.name.startswith(".") and not ignored(p.name)
    )


def readme_names() -> list[str]:
    return table_names((BENCH / "README.md").read_text(encoding="utf-8"))


def test_the_table_parser_reads_groups_folders_and_rows_of_several_names():
    text = (
        "| file | what | made by |\n|---|---|---|\n"
        "| `a.{json,md,png}` | x | y |\n| `b/`, `c.md` | x | `not-a-name` |\n"
        "prose with `d.md` in it\n"
    )
    assert table_names(text) == ["a.json", "a.md", "a.png", "b/", "c.md"]


def test_every_result_has_a_row():
    named = set(readme_names())
    assert {"host-cpu.json", "gpu-T-h200-b3abc6d/"} <= named  # the parser reads the table
    missing = [name for name in results_on_disk() if name not in named]
    assert not missing, f"benchmarks/README.md's table has no row for {missing}: add one (what, device, command)"


def test_every_row_names_what_exists():
    absent = [name for name in readme_names() if not (BENCH / name.rstrip("/")).exists()]
    absent += [n for n in readme_names() if n.endswith("/") and not (BENCH / n).is_dir()]
    assert not absent, f"benchmarks/README.md's table names what benchmarks/ lacks: {absent}"


def test_the_trained_files_are_skipped_as_git_ignores_them():
    assert ignored("trained") and not ignored("host-cpu.json")
