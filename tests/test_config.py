"""Every bad config is refused with one message naming file, key, value and what is valid."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sglang_specvocab import ConfigError
from sglang_specvocab.config import default_union_columns
from sglang_specvocab.policies import load_config
from sglang_specvocab.tools.cli import main
from sglang_specvocab.vocab import VocabSpace

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_microspec_defaults_are_the_papers():
    cfg = load_config(ROOT / "configs" / "microspec.yaml")
    assert cfg.policy == "window"
    assert cfg.capacity == 3072
    assert cfg.window.prefill_topk == 3 and cfg.window.verify_topk == 3
    assert cfg.window.sources == ["context", "extension"]


def test_every_shipped_config_loads():
    names = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    assert {"microspec.yaml", "full.yaml"} <= set(names)
    for name in names:
        load_config(ROOT / "configs" / name).check_vocab(262144)


def test_shipped_configs_with_data_files_build_for_gemma3_270m():
    """Their frequency tables and graphs exist, fit the 262k vocabulary and hold enough ids."""
    from sglang_specvocab.policies import ModelContext, build_policy

    for name in ("frspec", "vocabtrim", "evospec"):
        cfg = load_config(ROOT / "configs" / f"{name}.yaml")
        pol = build_policy(
            cfg, 2, fallback_id=1, model=ModelContext(space=VocabSpace.build(262144), eos_token_ids=(1, 106))
        )
        assert {1, 106} <= set(pol.table.row(1)), name


def test_omitted_window_section_takes_defaults(tmp_path):
    cfg = load_config(write(tmp_path, "policy: window\ncapacity: 10\n"))
    assert (cfg.window.prefill_topk, cfg.window.verify_topk, cfg.window.sources) == (3, 3, ["context", "extension"])


BAD = [
    # (yaml, the pieces the one message must contain)
    (
        "policy: window\ncapacity: 64\nwindow:\n  prefil_topk: 3\n",
        ["unknown key 'window.prefil_topk'", "value 3", "prefill_topk, verify_topk, sources"],
    ),
    (
        "policy: window\ncapacity: 64\ncolour: red\n",
        ["unknown key 'colour'", "'red'", "policy, head, prefill_chunk, capacity, window"],
    ),
    ("policy: window\ncapacity: '3k'\n", ["capacity = '3k'", "must be a valid integer"]),
    ("policy: window\ncapacity: 3.5\n", ["capacity = 3.5", "must be a valid integer"]),
    ("policy: window\ncapacity: true\n", ["capacity = True", "must be a valid integer"]),
    ("policy: window\ncapacity: 0\n", ["capacity = 0", "greater than or equal to 1"]),
    ("policy: window\ncapacity: -5\n", ["capacity = -5", "greater than or equal to 1"]),
    (
        "policy: window\ncapacity: 8\nwindow: {prefill_topk: -1}\n",
        ["window.prefill_topk = -1", "greater than or equal to 0"],
    ),
    (
        "policy: window\ncapacity: 8\nwindow: {verify_topk: -2}\n",
        ["window.verify_topk = -2", "greater than or equal to 0"],
    ),
    ("policy: window\ncapacity: 8\nwindow: {verify_topk: three}\n", ["window.verify_topk = 'three'", "valid integer"]),
    (
        "policy: window\ncapacity: 8\nwindow: {sources: [context, ctx]}\n",
        ["window.sources[1] = 'ctx'", "'context' or 'extension'"],
    ),
    ("policy: window\ncapacity: 8\nwindow: {sources: []}\n", ["window.sources = []", "at least one"]),
    ("policy: window\ncapacity: 8\nwindow: {sources: [context, context]}\n", ["window.sources", "must not repeat"]),
    (
        "policy: window\ncapacity: 8\nwindow: {sources: [extension], prefill_topk: 0}\n",
        ["'window'", "prefill_topk = 0", "sources = ['extension']", ">= 1"],
    ),
    ("policy: window\ncapacity: 8\nwindow: 3\n", ["window = 3", "must be a mapping", "prefill_topk"]),
    (
        "policy: windw\n",
        ["policy = 'windw'", "must be one of cluster, full, lowrank, retrieval, static, union, window"],
    ),
    ("policy: 7\n", ["policy = 7", "must be one of"]),
    ("capacity: 8\n", ["missing required key 'policy'", "cluster, full, lowrank, retrieval, static, union, window"]),
    ("policy: window\n", ["missing required key 'capacity'", "W_max"]),
    ("policy: full\ncapacity: 8\n", ["unknown key 'capacity'", "for policy 'full'"]),
    ("- policy\n- window\n", ["must be a YAML mapping", "got list"]),
    ("", ["is empty", "policy"]),
    ("policy: [window\n", ["not valid YAML", "line 2"]),
    # the head options: a head the policy cannot serve is refused, naming the key
    ("policy: window\ncapacity: 8\nhead: {batch: ragged}\n", ["head.batch = 'ragged'", "'per-request'", "'union'"]),
    ("policy: full\nhead: {batch: union}\n", ["head.batch = 'union' is invalid for policy 'full'", "auto or stock"]),
    ("policy: full\nhead: {batch: per-request}\n", ["head.batch = 'per-request' is invalid for policy 'full'"]),
    (
        "policy: window\ncapacity: 8\nhead: {mode: packed, batch: union}\n",
        ["head.batch = 'union' is invalid with head.mode = 'packed'"],
    ),
    (
        "policy: window\ncapacity: 64\nhead: {union_capacity: 32}\n",
        ["head.union_capacity = 32 is invalid: must be at least the capacity 64"],
    ),
    (
        "policy: window\ncapacity: 8\nhead: {union_capacity: 0}\n",
        ["head.union_capacity = 0", "greater than or equal to 1"],
    ),
    ("policy: window\ncapacity: 8\nhead: {union_view: mine}\n", ["head.union_view = 'mine'", "'own' or 'all'"]),
    # keys that would be accepted and ignored are refused, naming the key
    (
        "policy: window\ncapacity: 8\nwindow: {sources: [context], prefill_topk: 3}\n",
        ["window.prefill_topk = 3 is invalid with sources = ['context']", "add 'extension', or drop the key"],
    ),
    ("policy: window\ncapacity: 8\nwindow: {sources: [context], verify_topk: 2}\n", ["window.verify_topk = 2"]),
    (
        "policy: retrieval\nretrieval: {table: t.npz, static_size: 4, dynamic_size: 4, successors: 2}\n",
        ["retrieval.successors = 2 is invalid without retrieval.graph"],
    ),
    (
        "policy: union\nmembers:\n  - {policy: window, capacity: 8, head: {kernel: torch}}\n",
        ["members[0]: head = {'kernel': 'torch'} is invalid in a member", "move it to the top level"],
    ),
    (
        "policy: union\nmembers:\n  - {policy: window, capacity: 8}\n  - {policy: window, capacity: 4, prefill_chunk: 64}\n",
        ["members[1]: prefill_chunk = 64 is invalid in a member"],
    ),
]


@pytest.mark.parametrize("text,pieces", BAD, ids=[b[1][0][:40] for b in BAD])
def test_bad_config_message(tmp_path, text, pieces):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    msg = str(exc.value)
    assert str(path) in msg
    for piece in pieces:
        assert piece in msg, f"{piece!r} not in {msg!r}"


def test_capacity_larger_than_vocabulary(tmp_path):
    cfg = load_config(write(tmp_path, "policy: window\ncapacity: 5000\n"))
    with pytest.raises(
        ConfigError, match=r"c\.yaml: capacity = 5000 is invalid: must be at most the vocabulary size 4096 of tiny"
    ):
        cfg.check_vocab(4096, "tiny")
    cfg.check_vocab(5000, "exact")  # equal is fine
    cfg = load_config(write(tmp_path, "policy: window\ncapacity: 64\nhead: {union_capacity: 5000}\n"))
    with pytest.raises(
        ConfigError, match=r"head.union_capacity = 5000 is invalid: must be at most the vocabulary size 4096"
    ):
        cfg.check_vocab(4096, "tiny")


def test_union_columns_default_to_sixteen_sets_within_the_head():
    cfg = load_config_text("policy: window\ncapacity: 3072\n")
    assert cfg.head.batch == "auto" and cfg.head.union_view == "own" and cfg.head.union_capacity is None
    assert default_union_columns(3072, 262144) == 16 * 3072 and default_union_columns(3072, 32768) == 32768
    assert default_union_columns(3072, 3072) == 3072
    assert load_config_text("policy: window\ncapacity: 8\nhead: {union_capacity: 100}\n").head.union_capacity == 100


def load_config_text(text):
    from sglang_specvocab.policies import parse_config

    return parse_config(yaml.safe_load(text), source="<text>")


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file .*missing.yaml: No such file or directory"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="cannot read config file .*: Is a directory"):
        load_config(tmp_path)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(binary)


@pytest.mark.parametrize("text,pieces", BAD, ids=[b[1][0][:40] for b in BAD])
def test_cli_refuses_bad_config_without_traceback(tmp_path, capsys, text, pieces):
    """Every bad config: exit status 2, one ``error:`` line naming the file, no traceback."""
    path = write(tmp_path, text)
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and str(path) in err
    assert len(err.strip().splitlines()) == 1
    assert all(p in err for p in pieces)


def test_cli_subprocess_exit_code_and_single_message(tmp_path):
    path = write(tmp_path, "policy: window\ncapacity: 0\n")
    out = subprocess.run(
        [sys.executable, "-m", "sglang_specvocab", "replay", "--config", str(path), "--trace", "t", "--out", "o"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert out.stderr.strip() == f"error: {path}: capacity = 0 is invalid: must be greater than or equal to 1"


# A YAML alias inside its own anchor loads as a structure that contains itself (the only way a config can
# include itself: there is no include key); each case's message names the cycle by key paths.
CYCLES = [
    (
        "&top\npolicy: union\nmembers:\n  - *top\n",
        (
            "members[0] is invalid: it is a YAML alias of the mapping at top level, which encloses it, so the "
            "config contains itself (cycle: top level -> members[0] -> top level)"
        ),
    ),
    (
        "policy: union\nmembers:\n  - &m\n    policy: union\n    members: [{policy: window, capacity: 8}, *m]\n",
        (
            "members[0].members[1] is invalid: it is a YAML alias of the mapping at members[0], which encloses it, "
            "so the config contains itself (cycle: members[0] -> members[0].members[1] -> members[0])"
        ),
    ),
    (
        "policy: union\nmembers: &l\n  - {policy: window, capacity: 8}\n  - *l\n",
        "members[1] is invalid: it is a YAML alias of the list at members, which encloses it",
    ),
]


@pytest.mark.parametrize("text, piece", CYCLES, ids=["self", "nested", "list"])
def test_a_config_that_contains_itself_is_one_config_error(tmp_path, text, piece):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {piece}") and len(message.splitlines()) == 1


@pytest.mark.parametrize("text, piece", CYCLES[:2], ids=["self", "nested"])
def test_cli_refuses_a_config_that_contains_itself_with_one_line(tmp_path, text, piece):
    path = write(tmp_path, text)
    out = subprocess.run(
        [sys.executable, "-m", "sglang_specvocab", "check-config", str(path)], capture_output=True, text=True
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith(f"error: {path}: {piece}")


def test_an_alias_used_twice_without_a_cycle_still_loads(tmp_path):
    path = write(tmp_path, "policy: union\nmembers:\n  - &w {policy: window, capacity: 8}\n  - *w\n")
    cfg = load_config(path)
    assert [m.policy for m in cfg.member_configs] == ["window", "window"] and cfg.table_capacity == 16


@pytest.mark.parametrize(
    "text, key, rel",
    [
        (
            "policy: static\nstatic: {table: data/none.npz, size: 8}\n",
            "static.table = 'data/none.npz'",
            "data/none.npz",
        ),
        (
            "policy: retrieval\nretrieval: {table: f.npz, static_size: 4, dynamic_size: 4, graph: g.npz}\n",
            "retrieval.table = 'f.npz'",
            "f.npz",
        ),
        ("policy: lowrank\nlowrank: {rank: 4, topk: 16, ranker: r.pt}\n", "lowrank.ranker = 'r.pt'", "r.pt"),
        (
            "policy: cluster\ncapacity: 8\ncluster: {clusters: 4, budget: [2, 1], router: sub/router.pt}\n",
            "cluster.router = 'sub/router.pt'",
            "sub/router.pt",
        ),
        (
            "policy: union\nmembers:\n  - {policy: window, capacity: 8}\n  - {policy: static, static: {table: t.npz, size: 8}}\n",
            "static.table = 't.npz'",
            "t.npz",
        ),
    ],
)
def test_check_config_refuses_a_missing_file(tmp_path, capsys, text, key, rel):
    """check-config names the config, the key and the path resolved from the config's folder; exit 2."""
    path = write(tmp_path, text)
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert str(path) in err and key in err and f"{tmp_path / rel} is not a file" in err


def test_check_config_accepts_present_files_and_builtins(tmp_path, capsys):
    (tmp_path / "f.npz").write_bytes(b"")  # existence is what check-config checks (the server checks contents)
    write(tmp_path, "policy: retrieval\nretrieval: {table: f.npz, static_size: 4, dynamic_size: 4}\n")
    assert main(["check-config", str(tmp_path / "c.yaml")]) == 0
    write(tmp_path, "policy: lowrank\nlowrank: {rank: 4, topk: 16}\n")  # ranker: svd, no file
    assert main(["check-config", str(tmp_path / "c.yaml")]) == 0
    capsys.readouterr()
