from importlib import resources
from pathlib import Path

from sglang_specvocab.policies import load_config

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
    assert on_disk | {"sglang_specvocab.configs"} == set(tool["packages"])
    assert "prompts.jsonl" in tool["package-data"]["sglang_specvocab"]
    assert (ROOT / "sglang_specvocab" / "prompts.jsonl").is_file()


def test_pre_commit_pins_the_lint_gate_versions():
    """pre-commit runs the same ruff and clang-format as the CI gate (scripts/lint.sh)."""
    import yaml

    lines = (ROOT / "scripts" / "requirements-lint.txt").read_text().splitlines()
    pins = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    assert {dep for hook in hooks for dep in hook["additional_dependencies"]} == pins
    assert {hook["entry"].split()[0] for hook in hooks} == {pin.split("==")[0] for pin in pins}
