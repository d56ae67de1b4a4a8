"""Tiny checkpoints (sglang_specvocab.tools.testing.tiny, sglang-specvocab tiny-checkpoints): the files, the
target through transformers offline, the drafts' d2t and capture layers, determinism, and SGLang's
ModelConfig / server-argument resolution on CPU (in a child process)."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sglang_specvocab.errors import SpecVocabError
from sglang_specvocab.tools.cli import main
from sglang_specvocab.tools.testing import tiny as F
from sglang_specvocab.tools.testing.standins import CHILD_PREAMBLE

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 128256
pytestmark = pytest.mark.usefixtures("one_thread")
SMALL = ["--vocab", "1024", "--draft-vocab", "512"]  # fast builds for the CLI and determinism tests


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return F.make_tiny_checkpoints(tmp_path_factory.mktemp("tiny"), vocab_size=VOCAB, seed=0)


def _tiny_checkpoints(args: list[str]) -> int:
    return main(["tiny-checkpoints", *args])


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def test_layout_and_configs(tiny):
    for sub in F.SUBDIRS:
        assert (tiny.root / sub / "config.json").is_file() and (tiny.root / sub / "model.safetensors").is_file()
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in tiny.target.iterdir()}
    t = json.loads((tiny.target / "config.json").read_text())
    assert t["architectures"] == ["LlamaForCausalLM"] and t["vocab_size"] == VOCAB
    assert t["tie_word_embeddings"] is False and t["num_hidden_layers"] == 4
    for sub, dv in (("draft-d2t", 32768), ("draft-full", None)):
        c = json.loads((tiny.root / sub / "config.json").read_text())
        assert c["architectures"] == ["LlamaForCausalLMEagle3"] and c["num_hidden_layers"] == 1
        assert c["draft_vocab_size"] == dv and c["vocab_size"] == VOCAB and c["tie_word_embeddings"] is False
        assert c["hidden_size"] == c["target_hidden_size"] == t["hidden_size"]  # SGLang shares the target's embedding
        ids = c["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        layers = [i + 1 for i in ids]  # what SGLang captures (spec_aux_hidden_state.py adds 1)
        assert ids == [0, 1, 2] and len(set(layers)) == 3 and all(0 <= x < t["num_hidden_layers"] for x in layers)
        names = set(load_file(tiny.root / sub / "model.safetensors"))
        head = {"lm_head.weight", "d2t", "t2d"}
        assert (head <= names) if dv else not (head & names)  # the full draft borrows the target's head
    summary = tiny.summary()
    assert all(f"{sub}/" in summary for sub in F.SUBDIRS) and "MiB" in summary


def test_d2t_maps_into_the_vocabulary(tiny):
    t = load_file(tiny.draft_d2t / "model.safetensors")
    d2t, t2d = t["d2t"], t["t2d"]
    assert d2t.dtype == torch.int64 and d2t.shape == (32768,) and t["lm_head.weight"].shape == (32768, 64)
    hot = torch.arange(32768) + d2t  # SGLang's hot_token_id (llama_eagle3.py)
    assert hot.min() >= 0 and hot.max() < VOCAB
    assert torch.equal(hot, hot.sort().values) and len(hot.unique()) == len(hot)
    assert torch.equal(hot[: F.NUM_FIXED], torch.arange(F.NUM_FIXED))  # specials and bytes are always in
    assert d2t.any()  # a real remap, not the identity
    assert torch.equal(hot, F.hot_ids(VOCAB, 32768, 0))
    assert t2d.dtype == torch.bool and torch.equal(t2d.nonzero().flatten(), hot)


def test_target_loads_offline_with_transformers_and_generates(tiny, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = AutoTokenizer.from_pretrained(tiny.target, local_files_only=True)
    assert len(tok) == VOCAB and (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 0)
    text = "Hello, wörld! 123"
    ids = tok(text).input_ids
    assert ids[0] == tok.bos_token_id and tok.decode(ids, skip_special_tokens=True) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|begin_of_text|><|user|>\nhi<|eot|>\n<|assistant|>\n"
    model = AutoModelForCausalLM.from_pretrained(tiny.target, local_files_only=True, dtype=torch.float32)
    assert model.config.eos_token_id == [2, 3]
    enc = tok(text, return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    new = out[0, enc.input_ids.shape[1] :]
    assert 1 <= len(new) <= 6 and int(new.max()) < VOCAB
    assert isinstance(tok.decode(new), str)


def test_deterministic_for_a_seed(tmp_path, capsys):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        assert _tiny_checkpoints(["--out", str(tmp_path / name), "--seed", str(seed), *SMALL]) == 0
    out = capsys.readouterr().out
    assert "target/" in out and "model.safetensors" in out and "KiB" in out
    a, b, c = (_digests(tmp_path / n) for n in "abc")
    assert a == b
    for f in ("target/model.safetensors", "draft-d2t/model.safetensors", "draft-full/model.safetensors"):
        assert a[f] != c[f]
    assert a["target/tokenizer.json"] == c["target/tokenizer.json"]  # the tokenizer depends on the size only


def test_refuses_a_non_empty_dir_without_force(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    assert _tiny_checkpoints(["--out", str(out), *SMALL]) == 2
    assert "not empty" in capsys.readouterr().err and not (out / "target").exists()
    assert _tiny_checkpoints(["--out", str(out), "--force", *SMALL]) == 0
    assert (out / "keep.txt").exists() and (out / "draft-full" / "config.json").exists()
    with pytest.raises(SpecVocabError, match="draft vocabulary size"):
        F.make_tiny_checkpoints(tmp_path / "p", vocab_size=1024, draft_vocab_size=1024)


# SGLang in a child process, after the stand-ins for what a CPU machine lacks (torchvision, vllm).
_SGLANG_CHECK = CHILD_PREAMBLE + textwrap.dedent(
    """
    import json, sys

    from sglang.srt.arg_groups.model_override_base import resolving_view
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

    root, out = sys.argv[1], sys.argv[2]
    report = {}
    mc = ModelConfig(f"{root}/target")
    report["target"] = [mc.hf_config.architectures[0], mc.vocab_size, mc.num_hidden_layers]
    tok = get_tokenizer(f"{root}/target")
    report["tokenizer"] = [len(tok), tok.eos_token_id]
    for d in ("draft-d2t", "draft-full"):
        argv = ["--model-path", f"{root}/target", "--speculative-algorithm", "EAGLE3"]
        argv += ["--speculative-draft-model-path", f"{root}/{d}", "--device", "cpu"]
        argv += ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
        sa = prepare_server_args(argv)
        sa.resolve_once()  # the resolution pipeline: speculative defaults and checks, model config
        v = resolving_view(sa)
        dmc = ModelConfig.from_server_args(sa, model_path=v.speculative_draft_model_path, is_draft_model=True)
        report[d] = {
            "algo": v.speculative_algorithm,
            "steps": [v.speculative_num_steps, v.speculative_eagle_topk, v.speculative_num_draft_tokens],
            "device": v.device,
            "arch": dmc.hf_config.architectures[0],
            "draft_vocab_size": dmc.hf_config.draft_vocab_size,
            "vocab_size": dmc.vocab_size,
            "aux": dmc.hf_config.eagle_config["eagle_aux_hidden_state_layer_ids"],
            "layers": dmc.num_hidden_layers,
        }
    with open(out, "w") as f:
        json.dump(report, f)
    """
)


@pytest.mark.sglang
def test_sglang_model_config_and_server_args_on_cpu(tiny, tmp_path):
    script = tmp_path / "check.py"
    script.write_text(_SGLANG_CHECK)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    run = subprocess.run(
        [sys.executable, str(script), str(tiny.root), str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["target"] == ["LlamaForCausalLM", VOCAB, 4]
    assert r["tokenizer"] == [VOCAB, 2]
    for d, dv in (("draft-d2t", 32768), ("draft-full", None)):
        assert r[d]["algo"] == "EAGLE3" and r[d]["steps"] == [3, 1, 4] and r[d]["device"] == "cpu"
        assert r[d]["arch"] == "LlamaForCausalLMEagle3" and r[d]["draft_vocab_size"] == dv
        assert r[d]["vocab_size"] == VOCAB and r[d]["aux"] == [0, 1, 2] and r[d]["layers"] == 1
