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
