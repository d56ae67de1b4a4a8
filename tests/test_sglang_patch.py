"""``patches/sglang-draft-topk-hook.diff``: the SGLang change that makes the plug-in's copies unnecessary.

- It applies cleanly (no fuzz, no offset) to the installed (pinned) SGLang's sources.
- Applied to a copy of the package in a temporary folder (first on ``sys.path`` of a child process),
  SGLang's modules import and the diff's own test (SGLang's unittest style) passes.
- There the plug-in detects the hook and takes it, with the same results as the copies on every piece
  the integration tests drive on CPU (``tests/sglang_hook_cases.py``, run in that child).
- Without the hook (the installed SGLang), the plug-in keeps the copies.

The copy links every file of the installed package except those the diff changes, which are copied
(``sglang_tree``): building it takes a second, and the child reuses the installed bytecode.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_specvocab.copies.upstream import SGLANG_VERSION

pytestmark = pytest.mark.sglang

ROOT = Path(__file__).resolve().parents[1]
DIFF = ROOT / "patches" / "sglang-draft-topk-hook.diff"
# The modules a server process imports (cpu-build notes), plus the one the diff changes.
SGLANG_MODULES = [
    "sglang.srt.server_args",
    "sglang.srt.speculative.spec_info",
    "sglang.srt.speculative.spec_registry",
    "sglang.srt.speculative.eagle_worker_v2",
    "sglang.srt.speculative.standalone_worker_v2",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.managers.scheduler",
]


def changed_files(diff: Path) -> list[str]:
    """The package files (``sglang/...``) the diff changes; its paths are the SGLang repository's (``python/sglang/...``)."""
    found = re.findall(r"^--- a/python/(sglang/\S+)", diff.read_text(), flags=re.MULTILINE)
    assert found, f"{diff}: changes no file under python/sglang/"
    return sorted(set(found))


def sglang_tree(dest: Path, diff: Path) -> Path:
    """``dest/python/sglang``: the installed package, linked file by file except the files ``diff`` changes
    (and the folders on their way), which are copied, so applying the diff never touches the installed one."""
    src = Path(importlib.util.find_spec("sglang").submodule_search_locations[0]).parent
    changed = set(changed_files(diff))
    on_the_way = {str(Path(*Path(f).parts[:i])) for f in changed for i in range(1, len(Path(f).parts))}

    def build(rel: Path) -> None:
        (dest / "python" / rel).mkdir(parents=True)
        for entry in (src / rel).iterdir():
            if entry.name == "__pycache__":
                continue
            sub = rel / entry.name
            if str(sub) in on_the_way:
                build(sub)
            elif str(sub) in changed:
                shutil.copy2(entry, dest / "python" / sub)
            else:
                (dest / "python" / sub).symlink_to(entry)

    build(Path("sglang"))
    return dest / "python"


def run_patch(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    if shutil.which("patch") is None:
        pytest.fail("GNU patch is not installed (apt-get install patch): it applies the SGLang diff")
    return subprocess.run(
        ["patch", "-p1", "--batch", "--fuzz=0", "-i", str(DIFF), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="module")
def patched(tmp_path_factory) -> Path:
    """A patched copy of the installed SGLang: ``<tmp>/python`` (for ``sys.path``) and ``<tmp>/test`` (the diff's test)."""
    tmp = tmp_path_factory.mktemp("sglang-hook")
    sglang_tree(tmp, DIFF)
    done = run_patch(tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    return tmp


def child_env(patched: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(patched / "python"), str(ROOT / "tests")])
    return env


def test_diff_applies_cleanly_to_the_installed_sglang(tmp_path):
    from importlib.metadata import version

    assert version("sglang") == SGLANG_VERSION
    python = sglang_tree(tmp_path, DIFF)
    for f in changed_files(DIFF):
        assert (python / f).is_file() and not (python / f).is_symlink(), f
    dry = run_patch(tmp_path, "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    # clean: every hunk where the diff says, so no "Hunk #n succeeded at ... (offset ...)" or fuzz
    assert "Hunk" not in dry.stdout and "fuzz" not in dry.stdout, dry.stdout
    checked = re.findall(r"^checking file (\S+)", dry.stdout, flags=re.MULTILINE)
    assert checked == [
        "python/sglang/srt/speculative/eagle_worker_v2.py",
        "test/registered/unit/speculative/test_eagle_draft_topk_hook.py",
    ]


def test_patched_sglang_imports_and_passes_its_own_test(patched):
    test = patched / "test" / "registered" / "unit" / "speculative" / "test_eagle_draft_topk_hook.py"
    code = f"""
import importlib, runpy, sys
from sglang_specvocab.tools.testing.standins import install
install(("torchvision",))  # SGLang imports torchvision, which has no CPU build here
for name in {SGLANG_MODULES!r}:
    mod = importlib.import_module(name)
    assert mod.__file__.startswith({str(patched)!r}), mod.__file__
sys.argv = [{str(test)!r}, "-v"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
    child = subprocess.run(
        [sys.executable, "-c", code], env=child_env(patched), capture_output=True, text=True, timeout=600, check=False
    )
    out = child.stdout + child.stderr
    assert child.returncode == 0, out[-6000:]
    assert re.search(r"Ran (\d+) tests", out) and int(re.search(r"Ran (\d+) tests", out).group(1)) >= 8, out[-3000:]
    assert "OK" in out.splitlines()[-1], out[-3000:]


def test_plugin_takes_the_hook_with_the_same_results_as_the_copies(patched):
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "sglang_hook_cases.py")],
        cwd=ROOT,
        env=child_env(patched),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    out = child.stdout + child.stderr
    assert child.returncode == 0, out[-6000:]
    summary = out.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 30 and "skipped" not in summary, out[-3000:]


def test_plugin_keeps_the_copies_without_the_hook(torchvision_standin):
    from sglang_specvocab.copies import has_draft_topk_hook
    from sglang_specvocab.integration import worker as W

    assert has_draft_topk_hook() is False and W.SGLANG_HOOK is False
    for name in ("draft_forward", "_draft_extend_for_prefill", "_draft_extend_for_decode"):
        assert name in vars(W.DynVocabDraftWorker), name
    assert "_forward_prefill_batch" in vars(W.DynVocabWorkerV2)
