"""The README's and docs/' ``sglang-specvocab`` commands work from a fresh clone: each parses with the CLI's own
parser, and every input file it names (configs, questions, traces) is in the checkout (placeholders in
capitals, like ``T.jsonl``, excepted). The README stays a page an SGLang user reads top to bottom: the launch
command first, every result file it names committed, the Map in docs/README.md."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from sglang_specvocab.tools.cli import parser

ROOT = Path(__file__).resolve().parents[1]
INPUT_FLAGS = {"--config", "--questions", "--trace"}


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def readme_commands() -> list[list[str]]:
    text = "\n".join(p.read_text(encoding="utf-8") for p in DOCS)
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("sglang-specvocab "):
                out.append(shlex.split(line)[1:])
    return out


def named_inputs(argv: list[str]) -> list[str]:
    files, flag = [], None
    for tok in argv:
        if tok.startswith("--"):
            flag = tok
            continue
        named = flag in INPUT_FLAGS or (argv[0] == "check-config" and flag is None)
        if named and tok.endswith((".yaml", ".jsonl")) and not Path(tok).stem.isupper():  # T.jsonl: a placeholder
            files.append(tok)
    return files


def test_readme_commands_parse_and_name_files_a_clone_has():
    commands = readme_commands()
    assert any(c[0] == "lab" for c in commands) and any(c[0] == "check-config" for c in commands)
    for argv in commands:
        parser().parse_args(argv)  # exits (SystemExit 2) on an unknown flag or a bad value
        for name in named_inputs(argv):
            path = (ROOT / name).resolve()
            in_clone = path.is_relative_to(ROOT) and path.is_file()  # not a file beside this checkout
            assert in_clone, f"README or docs: `sglang-specvocab {shlex.join(argv)}` names {name}, not in a clone"


def map_entries() -> tuple[list[str], list[str]]:
    """docs/README.md's Map: (entries under ``sglang_specvocab/``, the repository's top-level entries)."""
    text = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Map\n\n```\n(.*?)```", text, flags=re.DOTALL).group(1)
    package, top = [], []
    for line in block.splitlines():
        name = line.strip().split("  ")[0]
        if not name or line.startswith(" " * 4):  # a continuation line of a description
            continue
        names = [n.strip() for n in name.split(",")]
        (package if line.startswith("  ") else top).extend(names)
    return package, top


def test_the_map_matches_the_tree():
    """Every entry of the Map exists, and every module and folder of the package (each wing's) is on it."""
    package, top = map_entries()
    assert "sglang_specvocab/" in top and "table.py" in package and "tools/lab/" in package  # the parser reads it
    missing = [n for n in package if not (ROOT / "sglang_specvocab" / n).exists()]
    missing += [n for n in top if not (ROOT / n).exists()]
    assert not missing, f"the Map (docs/README.md) names what the tree lacks: {missing}"
    tree = [
        str(p.relative_to(ROOT / "sglang_specvocab")) + ("/" if p.is_dir() else "")
        for wing in (ROOT / "sglang_specvocab", ROOT / "sglang_specvocab" / "tools")
        for p in wing.iterdir()
        if (p.suffix == ".py" and not p.name.startswith("__")) or (p / "__init__.py").is_file()
    ]
    unmapped = sorted(set(tree) - set(package))
    assert not unmapped, f"the Map (docs/README.md) leaves out {unmapped}"


def test_the_main_job_runs_the_committed_draft_and_the_best_config():
    """scripts/main.sh's lab command on a CPU machine parses, drafts with the committed EAGLE-3 draft and names
    the shipped hybrid and MicroSpec configs, all in a clone."""
    text = (ROOT / "scripts" / "main.sh").read_text(encoding="utf-8")
    env = dict(re.findall(r"^(\w+)=([^\s$]+)$", text, flags=re.MULTILINE))  # plain assignments: draft=drafts/...
    line = re.search(r'lab\) exec "\$cli" (lab .*?) "\$@"', text, flags=re.DOTALL).group(1).replace("\\\n", " ")
    argv = [re.sub(r"\$(\w+)", lambda m: env[m.group(1)], a) for a in shlex.split(line.replace('"$work"', "out"))]
    args = parser().parse_args(argv)
    assert args.draft.startswith("eagle3:") and (ROOT / args.draft.removeprefix("eagle3:") / "config.json").is_file()
    assert [Path(c).name for c in args.config] == ["hybrid.yaml", "microspec.yaml"]
    assert all((ROOT / c).is_file() for c in args.config) and not args.no_oracle


def test_the_readme_is_a_page_for_the_sglang_user():
    """At most about 200 lines, the launch command before any results, exactly two set-up commands in bash blocks
    (the main job and the tests), and every committed file or link it names exists."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    assert text.index("python -m sglang.launch_server") < text.index("## Results at a glance")
    blocks = [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)]
    assert [b for b in blocks if b.startswith("./scripts/")] == ["./scripts/main.sh", "./scripts/test.sh"]
    named = set(re.findall(r"`((?:benchmarks|configs|drafts|docs|tests|scripts)/[^`\s]*)`", text))
    named |= {m.split("#")[0] for m in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in m}
    missing = sorted(n for n in named if not (ROOT / n).exists() and not re.search(r"/[A-Z]+(/|$)", n))  # MINE/
    assert not missing, f"README names what a clone lacks: {missing}"
