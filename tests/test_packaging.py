from importlib import resources
from pathlib import Path

from sglang_specvocab.policies import load_config
from sglang_specvocab.vocab import VocabSpace

ROOT = Path(__file__).resolve().parents[1]


def test_configs_ship_inside_the_package():
    shipped = resources.files("sglang_specvocab.configs")
    names = sorted(p.name for p in shipped.iterdir() if p.name.endswith(".yaml"))
    assert names == sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    with resources.as_file(shipped / "microspec.yaml") as path:
        assert load_config(path).capacity == 3072
    data = sorted(p.name for p in shipped.joinpath("data").iterdir() if p.name.endswith(".npz"))
    assert data == sorted(p.name for p in (ROOT / "configs" / "data").glob("*.npz"))


def test_every_sub_package_and_data_file_is_declared_for_the_wheel():
    """A package missing from pyproject's list installs from a checkout (editable) but not from a wheel."""
    import tomllib

    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "sglang_specvocab").rglob("__init__.py")
        if all(part.isidentifier() for part in p.parent.relative_to(ROOT).parts)
    }
    declared = {"sglang_specvocab.configs", "sglang_specvocab.configs.data", "sglang_specvocab.csrc"}
    assert on_disk | declared == set(tool["packages"])
    assert "prompts.jsonl" in tool["package-data"]["sglang_specvocab.tools"]
    assert (ROOT / "sglang_specvocab" / "tools" / "prompts.jsonl").is_file()


def test_pre_commit_pins_the_lint_gate_versions():
    """pre-commit runs the same ruff and clang-format as the CI gate (scripts/lint.sh)."""
    import yaml

    lines = (ROOT / "scripts" / "requirements-lint.txt").read_text().splitlines()
    pins = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    assert {dep for hook in hooks for dep in hook["additional_dependencies"]} == pins
    assert {hook["entry"].split()[0] for hook in hooks} == {pin.split("==")[0] for pin in pins}


def test_cluster_policy_without_faiss_names_the_extra(tmp_path, monkeypatch):
    """faiss is optional (the [cluster] extra): a cluster policy that must build its clusters says how to get it."""
    import sys

    import pytest
    import torch

    from sglang_specvocab.errors import SpecVocabError
    from sglang_specvocab.policies import ModelContext, build_policy, parse_config

    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss -> ImportError
    weight = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    cfg = parse_config({"policy": "cluster", "capacity": 16, "cluster": {"clusters": 4, "budget": [2, 1]}})
    model = ModelContext(
        weight=weight, embedding=None, space=VocabSpace.build(64), eos_token_ids=(2,), cache_dir=tmp_path
    )
    with pytest.raises(SpecVocabError, match=r"faiss.*pip install 'sglang-specvocab\[cluster\]'"):
        build_policy(cfg, 4, model=model)


def test_kernel_sources_ship_for_the_first_use_build():
    """The wheel carries csrc/ (sglang_specvocab.csrc) with every file the recipe compiles, and one version source."""
    import tomllib

    from sglang_specvocab.csrc import recipe

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"]["sglang_specvocab.csrc"] == "csrc"
    shipped = set(setuptools["package-data"]["sglang_specvocab.csrc"]) | {"recipe.py"}
    assert shipped == set(recipe.SHIPPED)
    for with_cuda in (False, True):
        for name in recipe.sources(with_cuda):
            assert (ROOT / "csrc" / name).is_file() and any(Path(name).match(p) for p in shipped)
    assert setuptools["dynamic"]["version"] == {"attr": "sglang_specvocab.__version__"}


def test_first_use_build_without_a_compiler_says_so(monkeypatch):
    """No extension in the install and no C++ compiler: the ops are unavailable with a reason naming the compiler."""
    import importlib.util

    import pytest

    from sglang_specvocab.ops import _ext

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "sglang_specvocab._C" else find_spec(name, *a)
    )
    monkeypatch.setattr(_ext, "_state", {})
    monkeypatch.setenv("CXX", "no-such-c++-compiler")
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler: 'no-such-c\\+\\+-compiler' is not on PATH"):
        _ext.jit_build()
    assert not _ext.available()
    assert "first-use build failed: no C++ compiler" in _ext.reason()


def test_build_prints_no_setuptools_warnings(tmp_path):
    """Collecting the package's files (what pip's build does first) prints no setuptools warning (setup once
    printed ~45 lines: a data folder that looked like an undeclared package); the wheel holds the data files."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    noise = [line for line in (out.stdout + out.stderr).splitlines() if "Warning" in line or "!!" in line]
    assert noise == []
    assert sorted(p.name for p in (tmp_path / "sglang_specvocab" / "configs" / "data").glob("*.npz")) == sorted(
        p.name for p in (ROOT / "configs" / "data").glob("*.npz")
    )
