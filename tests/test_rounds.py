"""``sglang-specvocab bench rounds`` on CPU: the round-time arithmetic against fake servers whose rounds take a
known time, the checkpoints with real shapes (on the meta device) and tiny ones written and loaded."""

import json
import math
import shlex
import sys
from pathlib import Path

import pytest
import torch
from fake_rounds import ACCEPT, ROUND_S

from sglang_specvocab.tools.bench.rounds import NAMES, RoundsSettings, round_time, rounds_configs
from sglang_specvocab.tools.bench.server import SpecBenchError
from sglang_specvocab.tools.cli import main
from sglang_specvocab.tools.testing.shaped import make_shaped_checkpoints, meta_models
from sglang_specvocab.tools.testing.tiny import hot_ids


def test_round_time_is_the_difference_quotient():
    assert round_time({"wall_s": 1.0, "rounds": 10}, {"wall_s": 3.0, "rounds": 50}) == pytest.approx(0.05)
    assert round_time({"wall_s": 1.0, "rounds": 10}, {"wall_s": 3.0, "rounds": 10}) is None


def _rounds(out, *extra):
    launcher = shlex.join([sys.executable, str(Path(__file__).with_name("fake_rounds.py"))])
    return main(["bench", "rounds", "--out", str(out), "--shape", "tiny", "--batch-sizes", "1,4", "--lengths", "8,40",
                 "--repeats", "2", "--launcher", launcher, "--warmup", "0", "--server-timeout", "60", "--no-progress",
                 *extra])  # fmt: skip


def test_bench_rounds_measures_the_round_time_ratio(tmp_path, capsys):
    assert _rounds(tmp_path) == 0
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "rounds.json").read_text())
    assert [c["name"] for c in result["configs"]] == list(NAMES)
    assert result["batch_sizes"] == [1, 4] and result["lengths"] == [8, 40] and result["repeats"] == 2
    for row in result["rows"]:  # (T_long - T_short) / (R_long - R_short) recovers the fakes' round time
        assert row["repeats"] == 2
        assert row["round_ms"] == pytest.approx(ROUND_S[row["algorithm"]] * 1e3, rel=0.25)
        assert row["accept_length"] == pytest.approx(40 / math.ceil(40 / ACCEPT))
    assert [(r["kind"], r["bs"]) for r in result["ratios"]] == [("d2t", 1), ("d2t", 4), ("full", 1), ("full", 4)]
    for r in result["ratios"]:
        assert r["ratio"] == pytest.approx(0.75, abs=0.15)
    assert (tmp_path / "rounds.md").is_file() and (tmp_path / "rounds.png").is_file()
    assert "| d2t | 1 |" in (tmp_path / "rounds.md").read_text() and "making tiny checkpoints" in out
    shape = json.loads((tmp_path / "checkpoints" / "shape.json").read_text())
    assert shape["shape"] == "tiny" and shape["layers"] == 4
    args = result["configs"][1]["args"]
    assert args[args.index("--speculative-algorithm") + 1] == "DYNVOCAB"
    assert args[args.index("--cuda-graph-max-bs-decode") + 1] == "4" and "--disable-cuda-graph" not in args
    # the default loads the written weights: no load-format flag, every folder has its safetensors
    assert result["load_format"] == "random" and "random checkpoints" in (tmp_path / "rounds.md").read_text()
    assert not any("load-format" in a for c in result["configs"] for a in c["args"])
    for sub in ("target", "draft-d2t", "draft-full"):
        assert (tmp_path / "checkpoints" / sub / "model.safetensors").is_file()
    # resumed: everything cached, no server started, no checkpoint made again
    assert _rounds(tmp_path) == 0
    out = capsys.readouterr().out
    assert out.count("are cached: nothing to run") == 4 and "launching" not in out and "making" not in out
    # another shape in the same folder is refused; unknown names too
    assert _rounds(tmp_path, "--layers", "5") == 2
    assert "holds tiny x 4 layers, not tiny x 5" in capsys.readouterr().err
    assert _rounds(tmp_path, "--only", "eagle3-d2t,nope") == 2
    assert "unknown rounds config(s) nope" in capsys.readouterr().err
    assert _rounds(tmp_path, "--lengths", "40,8") == 2
    assert "--lengths takes two increasing token counts" in capsys.readouterr().err


def _weight_files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.safetensors"))


def test_bench_rounds_dummy_writes_no_weights(tmp_path, capsys):
    """--load-format dummy: configs and tokenizer only, the full-vocabulary draft, every server told dummy (the
    fake refuses a model without weights that is not); a later random run adds the weights."""
    ckpt = tmp_path / "checkpoints"
    assert _rounds(tmp_path, "--load-format", "dummy") == 0
    out = capsys.readouterr().out
    assert "writing tiny configs and tokenizer" in out and "making" not in out
    assert _weight_files(ckpt) == [] and not (ckpt / "draft-d2t").exists()
    assert (ckpt / "target" / "tokenizer.json").is_file() and json.loads((ckpt / "shape.json").read_text())[
        "weights"
    ] is False
    # the files SGLang reads are those of the random checkpoints
    make_shaped_checkpoints(tmp_path / "ref", "tiny", 4, device="cpu")
    for f in ("target/config.json", "draft-full/config.json", "target/tokenizer.json"):
        assert (ckpt / f).read_text() == (tmp_path / "ref" / f).read_text(), f
    result = json.loads((tmp_path / "rounds.json").read_text())
    assert [c["name"] for c in result["configs"]] == ["eagle3-full", "dynvocab-full"] and result[
        "load_format"
    ] == "dummy"
    for c in result["configs"]:
        args = c["args"]
        assert args[args.index("--load-format") + 1] == "dummy"
        assert args[args.index("--speculative-draft-load-format") + 1] == "dummy"
        assert args[args.index("--speculative-draft-model-path") + 1] == str(ckpt / "draft-full")
    assert [(r["kind"], r["bs"]) for r in result["ratios"]] == [("full", 1), ("full", 4)]
    assert "load-format dummy" in (tmp_path / "rounds.md").read_text()
    # random on the same folder: the weights are made now, and the dummy timings are not reused
    assert _rounds(tmp_path, "--only", "eagle3-full,dynvocab-full") == 0
    out = capsys.readouterr().out
    assert "making tiny checkpoints" in out and "are cached" not in out
    assert _weight_files(ckpt) == [
        "draft-d2t/model.safetensors",
        "draft-full/model.safetensors",
        "target/model.safetensors",
    ]
    # dummy again: the folder with weights serves it as it is, its timings are cached
    assert _rounds(tmp_path, "--load-format", "dummy") == 0
    out = capsys.readouterr().out
    assert out.count("are cached: nothing to run") == 2 and "writing" not in out and "making" not in out


def test_bench_rounds_dummy_refusals(tmp_path, capsys):
    """The d2t draft under dummy, and a load format slipped in through --server-args, are refused before any file
    is written."""
    assert _rounds(tmp_path, "--load-format", "dummy", "--only", "eagle3-full,dynvocab-d2t") == 2
    err = capsys.readouterr().err
    assert "--load-format dummy cannot serve the d2t draft (dynvocab-d2t)" in err and "--load-format random" in err
    for extra in ("--load-format dummy", "--speculative-draft-load-format=dummy"):
        assert _rounds(tmp_path, f"--server-args={extra}") == 2
        assert f"--server-args must not set {extra.split()[0]}" in capsys.readouterr().err
    assert not (tmp_path / "checkpoints").exists()
    with pytest.raises(SpecBenchError, match="unknown load format 'auto'"):
        rounds_configs(tmp_path, RoundsSettings(), load_format="auto")


def test_real_shapes_on_the_meta_device():
    """Llama-3-8B widths cut to 4 layers: the tensors SGLang loads, their shapes and sizes (no memory used)."""
    m = meta_models("llama3-8b", 4)
    target = m["target"].state_dict()
    assert target["lm_head.weight"].shape == target["model.embed_tokens.weight"].shape == (128256, 4096)
    assert target["model.layers.3.self_attn.k_proj.weight"].shape == (1024, 4096)
    assert target["model.layers.3.mlp.down_proj.weight"].shape == (4096, 14336)
    assert "model.layers.4.mlp.down_proj.weight" not in target and m["target"].config.dtype == "bfloat16"
    d2t, full = m["draft-d2t"].checkpoint_tensors(), m["draft-full"].checkpoint_tensors()
    assert d2t["lm_head.weight"].shape == (32768, 4096) and "lm_head.weight" not in full
    assert d2t["fc.weight"].shape == full["fc.weight"].shape == (4096, 3 * 4096)
    assert d2t["midlayer.self_attn.q_proj.weight"].shape == (4096, 2 * 4096)  # embedding and hidden, concatenated
    assert torch.equal(d2t["d2t"] + torch.arange(32768), hot_ids(128256, 32768, 0))

    def gb(tensors):
        return sum(t.numel() * (2 if t.is_floating_point() else t.element_size()) for t in tensors.values()) / 1e9

    assert (round(gb(target), 2), round(gb(d2t), 2), round(gb(full), 2)) == (3.85, 0.86, 0.59)  # bf16 on disk
    assert m["draft-full"].cfg.to_hf_config()["draft_vocab_size"] is None


def test_tiny_shaped_checkpoints_load(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    sizes = make_shaped_checkpoints(tmp_path / "c", "tiny", 4, device="cpu")
    assert set(sizes) == {"target", "draft-d2t", "draft-full"} and all(v > 0 for v in sizes.values())
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path / "c" / "target", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and model.dtype == torch.bfloat16
    assert model.model.norm.weight.eq(1).all() and 0.015 < model.lm_head.weight.float().std() < 0.025
    meta = meta_models("tiny", 4)
    for name in ("draft-d2t", "draft-full"):
        saved = load_file(tmp_path / "c" / name / "model.safetensors")
        assert {k: tuple(v.shape) for k, v in saved.items()} == {
            k: tuple(v.shape) for k, v in meta[name].checkpoint_tensors().items()
        }
        cfg = json.loads((tmp_path / "c" / name / "config.json").read_text())
        assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["dtype"] == "bfloat16"
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    saved = load_file(tmp_path / "c" / "draft-d2t" / "model.safetensors")
    hot = saved["d2t"] + torch.arange(1024)
    assert torch.equal(hot, hot_ids(4096, 1024, 0)) and saved["t2d"][hot].all() and saved["t2d"].sum() == 1024
    with pytest.raises(Exception, match="not empty"):
        make_shaped_checkpoints(tmp_path / "c", "tiny", 4, device="cpu")


@pytest.mark.sglang
def test_rounds_servers_parse_with_sglang(tmp_path, torchvision_standin):
    from sglang.srt.server_args import prepare_server_args

    from sglang_specvocab.integration.plugin import register

    register()
    make_shaped_checkpoints(tmp_path, "tiny", 4, device="cpu")
    configs = rounds_configs(tmp_path, RoundsSettings(), ["--device", "cpu"])
    assert [c.name for c in configs] == list(NAMES)
    for c in configs:
        sa = prepare_server_args(c.args)
        assert sa.speculative_algorithm == c.algorithm and not sa.disable_cuda_graph
        assert (sa.speculative_eagle_topk, sa.speculative_num_steps, sa.speculative_num_draft_tokens) == (1, 3, 4)
        assert sa.max_running_requests == 64 and sa.context_length == 128 + 160 + 64
    with pytest.raises(SpecBenchError, match="unknown rounds config"):
        rounds_configs(tmp_path, RoundsSettings(), names=["eagle3"])


@pytest.mark.sglang
def test_dummy_rounds_servers_parse_with_sglang(tmp_path, torchvision_standin):
    """SGLang takes the dummy servers' arguments on a folder without weights: dummy for the target and the draft."""
    from sglang.srt.server_args import prepare_server_args

    from sglang_specvocab.integration.plugin import register
    from sglang_specvocab.tools.bench.rounds import make_dummy_checkpoints

    register()
    make_dummy_checkpoints(tmp_path, "tiny", 4)
    configs = rounds_configs(tmp_path, RoundsSettings(), ["--device", "cpu"], load_format="dummy")
    assert [c.name for c in configs] == ["eagle3-full", "dynvocab-full"]
    for c in configs:
        sa = prepare_server_args(c.args)
        assert sa.speculative_algorithm == c.algorithm
        assert sa.load_format == "dummy" and sa.speculative_draft_load_format == "dummy"
        assert sa.speculative_draft_model_path == str(tmp_path / "draft-full")
