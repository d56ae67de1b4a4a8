"""``bench specbench`` runs that may not finish: the checkout recorded without a ``.git``, reports written as
the run goes (partial, with what is missing and why), servers that fail, a time budget, and the verdicts
against the targets. Against the fake servers of ``test_specbench`` (no GPU)."""

import subprocess

from sglang_specvocab.bench.server import git_revision, versions


def test_the_checkout_is_git_describe_else_sv_git_else_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv("SV_GIT", "b3abc6d-dirty")
    assert git_revision(tmp_path) == "b3abc6d-dirty"  # no .git: the staged checkout's describe
    monkeypatch.delenv("SV_GIT")
    assert git_revision(tmp_path) == "unknown"
    run = {"cwd": tmp_path, "check": True, "capture_output": True}
    subprocess.run(["git", "init", "-q"], **run)
    (tmp_path / "f").write_text("x")
    subprocess.run(["git", "add", "f"], **run)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "f"], **run)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], text=True, **run).stdout.strip()
    monkeypatch.setenv("SV_GIT", "ignored")
    assert git_revision(tmp_path) == head  # a .git wins over SV_GIT
    (tmp_path / "f").write_text("y")
    assert git_revision(tmp_path) == head + "-dirty"
    assert versions()["git"] not in ("", None)
