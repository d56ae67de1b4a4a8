"""``sglang_specvocab/copies/upstream.py``, the one place that names the supported SGLang.

- The recorded source hashes (``BODIES``, ``KERNEL_BODIES``) are the installed SGLang's (the real check).
- A changed upstream body is refused at the worker check where the copies run, naming each target; where the
  installed SGLang has the draft top-k hook the copies are not used and a changed body does not refuse.
- No Python or shell file of the package, the scripts or the tests spells the version but the seam module, and
  the data files that must state it agree with it.
"""

from __future__ import annotations

import importlib.util
import pkgutil
import re
import sys
import tomllib
from pathlib import Path

import pytest

from sglang_specvocab.copies import upstream
from sglang_specvocab.copies.upstream import SGLANG_VERSION

ROOT = Path(__file__).resolve().parents[1]
SEAM = ROOT / "sglang_specvocab" / "copies" / "upstream.py"


def literal() -> re.Pattern:
    """The version as written in text, not as part of a longer version or number."""
    return re.compile(r"(?<![\d.])" + re.escape(SGLANG_VERSION) + r"(?![\d])")


# --- the seam holds the version; the rest reads it ----------------------------------------------------------


def test_the_version_is_written_in_the_seam_module_only():
    files = [p for d in ("sglang_specvocab", "scripts", "tests") for p in (ROOT / d).rglob("*") if p.is_file()]
    files = [p for p in files if p.suffix in (".py", ".sh") or p.name.startswith("requirements")]
    assert SEAM in files and len(files) > 100
    found = []
    for p in files:
        rel = p.relative_to(ROOT).as_posix()
        if p == SEAM or "__pycache__" in rel:
            continue
        found += [f"{rel}:{n}" for n, line in enumerate(p.read_text().splitlines(), 1) if literal().search(line)]
    assert not found, "the SGLang version is set in sglang_specvocab/copies/upstream.py only:\n" + "\n".join(found)
    assert literal().search(SEAM.read_text())  # the pattern does find it where it is


def test_no_folder_or_file_is_named_after_the_version():
    named = [
        p.relative_to(ROOT).as_posix()
        for d in ("sglang_specvocab", "scripts", "tests", "patches", "docs")
        for p in (ROOT / d).rglob("*")
        if literal().search(p.name)
    ]
    assert not named, named


def test_the_data_files_agree_with_the_seam(monkeypatch):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["optional-dependencies"]["sglang"] == [f"sglang=={SGLANG_VERSION}"]
    # the wheel ships the copies (package data), all of them
    from sglang_specvocab.copies import COPIES_DIR

    globs = project["tool"]["setuptools"]["package-data"]["sglang_specvocab.copies"]
    shipped = {p for g in globs for p in COPIES_DIR.parent.glob(g)}
    assert shipped == set(COPIES_DIR.glob("*.py")) and len(shipped) == 4
    # and ruff leaves their line breaks as upstream's
    assert project["tool"]["ruff"]["format"]["exclude"] == ["sglang_specvocab/copies/from-sglang/*.py"]

    spec = importlib.util.spec_from_file_location("seam_stage", ROOT / "scripts" / "device" / "stage.py")
    stage = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, stage)  # its dataclasses look their module up
    spec.loader.exec_module(stage)
    assert stage.SGLANG_VERSION == SGLANG_VERSION
    assert f"sglang=={SGLANG_VERSION}" in stage.SGLANG_WHEELS

    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "sglang_specvocab/copies/upstream.py" in setup and setup.count('"sglang==$sglang_version"') == 2
    assert (ROOT / "patches" / "sglang-draft-topk-hook.diff").is_file()


def test_the_seam_is_pure_data():
    """``stage.py`` and ``setup.sh`` read it with ``ast``; importing it must not import SGLang either."""
    import ast

    tree = ast.parse(SEAM.read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    for group in (upstream.PLUGIN, upstream.WORKER, upstream.HOOK):
        assert group and all(isinstance(v, str) and v.startswith("(") for v in group.values())
    for group in (upstream.BODIES, upstream.KERNEL_BODIES):
        assert group and all(re.fullmatch(r"[0-9a-f]{16}", v) for v in group.values())


# --- the bodies -------------------------------------------------------------------------------------------------


COPIED = {  # every upstream callable whose body a copy reproduces: copy module -> targets
    "eagle_worker_v2": ["sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.__init__"],
    "dynvocab_worker": ["sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2._forward_prefill_batch"],
    "dynvocab_draft": [
        "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft_forward",
        "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill",
        "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode",
    ],
}


def test_every_copied_body_is_recorded():
    assert sorted(t for ts in COPIED.values() for t in ts) == sorted(upstream.BODIES)
    assert all(t.startswith("sglang.kernels.ops.speculative.topk1.") for t in upstream.KERNEL_BODIES)
    for module in COPIED:
        assert (ROOT / "sglang_specvocab" / "copies" / "from-sglang" / f"{module}.py").is_file()


@pytest.mark.sglang
def test_recorded_bodies_match_the_installed_sglang(torchvision_standin):
    import sglang_specvocab.copies as P

    P.check_bodies(upstream.BODIES)
    P.check_bodies(upstream.KERNEL_BODIES)


@pytest.fixture
def fresh_worker_check():
    """The once-per-process worker check run anew, and forgotten after the test (it ran on doctored records)."""
    import sglang_specvocab.copies as P

    P._worker_checked.cache_clear()
    yield P
    P._worker_checked.cache_clear()


@pytest.mark.sglang
def test_a_changed_body_is_refused_where_the_copies_run(torchvision_standin, fresh_worker_check, monkeypatch):
    P = fresh_worker_check
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    assert P.has_draft_topk_hook() is False  # the installed SGLang: the copies run
    P.check_worker_signatures()  # the recorded bodies pass

    # an upstream edit to a copied body (simulated by a method with the same signature and another body)
    def draft_forward(self, forward_batch):
        return None

    monkeypatch.setattr(EagleDraftWorker, "draft_forward", draft_forward)
    wrong = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.__init__"
    monkeypatch.setitem(upstream.BODIES, wrong, "0" * 16)  # and a hash recorded wrong
    P._worker_checked.cache_clear()
    with pytest.raises(P.SGLangCompatibilityError) as info:
        P.check_worker_signatures()
    msg = str(info.value)
    assert "EagleDraftWorker.draft_forward: recorded cb3401a611401763, installed " in msg
    assert f"{wrong}: recorded {'0' * 16}, installed {P.source_hash(pkgutil.resolve_name(wrong))}" in msg
    assert "_draft_extend_for_prefill" not in msg  # unchanged targets are not named
    assert "port each change into its copy" in msg and "python -m sglang_specvocab.tools.record_sglang" in msg

    # python -m sglang_specvocab.tools.record_sglang marks both
    import sglang_specvocab.tools.record_sglang as checker

    assert checker.main() & checker.CHANGED


@pytest.mark.sglang
def test_a_changed_body_does_not_refuse_with_the_hook(torchvision_standin, fresh_worker_check, monkeypatch):
    P = fresh_worker_check
    monkeypatch.setitem(upstream.BODIES, "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.__init__", "0" * 16)
    with pytest.raises(P.SGLangCompatibilityError):  # without the hook: refused
        P.check_worker_signatures()
    monkeypatch.setattr(P, "has_draft_topk_hook", lambda: True)  # an SGLang with the hook: SGLang's own methods
    P._worker_checked.cache_clear()
    P.check_worker_signatures()


def test_a_body_that_cannot_be_read_is_refused(monkeypatch):
    import sglang_specvocab.copies as P

    with pytest.raises(P.SGLangCompatibilityError, match=r"json\.dumps: recorded 0{16}, installed [0-9a-f]{16}"):
        P.check_bodies({"json.dumps": "0" * 16})
    with pytest.raises(P.SGLangCompatibilityError, match=r"builtins\.len: its source cannot be read"):
        P.check_bodies({"builtins.len": "0" * 16})
    with pytest.raises(P.SGLangCompatibilityError, match=r"json\.gone: not found"):
        P.check_bodies({"json.gone": "0" * 16})
    import json

    P.check_bodies({"json.dumps": P.source_hash(json.dumps)})
