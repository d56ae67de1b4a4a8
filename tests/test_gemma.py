"""Gemma-3 270M (real, 262,144-token vocabulary, from PyPI): lossless decoding and the lab's main job."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_specvocab.policies import load_config
from sglang_specvocab.tools.lab.decoder import CausalLM, DraftShape, SpeculativeDecoder, greedy_generate

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "Question: What is the capital of France?\nAnswer:",
    "Translate German to English: Der Hund spielt im Garten mit einem roten Ball.\nEnglish:",
]


@pytest.fixture(scope="module")
def gemma_pair(gemma):
    return CausalLM(gemma.model), CausalLM(gemma.model, num_layers=12)


def test_bos_is_prepended(gemma):
    ids = gemma.encode("Hello")
    assert ids[0] == 2 and gemma.tokenizer.bos_token_id == 2
    assert gemma.vocab_size == 262144


@pytest.mark.parametrize(
    "shape", [DraftShape(steps=3), DraftShape(steps=3, topk=3, draft_tokens=6)], ids=["chain", "tree"]
)
@pytest.mark.parametrize("config", ["microspec", "microspec-context", "microspec-extension", "full"])
def test_gemma_greedy_output_equals_target_only(gemma, gemma_pair, config, shape):
    target, draft = gemma_pair
    dec = SpeculativeDecoder(
        target, draft, load_config(ROOT / "configs" / f"{config}.yaml"), shape, eos_token_ids=gemma.eos_token_ids
    )
    for text in PROMPTS:
        ids = gemma.encode(text)
        want = greedy_generate(target, ids, 20, gemma.eos_token_ids)
        gen = dec.generate(ids, 20)
        assert gen.tokens == want, (gemma.decode(gen.tokens), gemma.decode(want))
        if config != "full":
            assert max(r.set_size for r in gen.rounds) <= 3072


def test_main_job_prints_the_lab_table(gemma, tmp_path):
    out = tmp_path / "lab"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_specvocab",
            "lab",
            "--config",
            "configs/microspec.yaml",
            "--per-category",
            "1",
            "--max-new-tokens",
            "8",
            "--out",
            str(out),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "| microspec | window | overall |" in run.stdout and "| full | full | overall |" in run.stdout
    result = json.loads((out / "lab.json").read_text())
    assert result["lossless"] and result["vocab_size"] == 262144 and result["model"] == "gemma3-270m"
    overall = {r["config"]: r for r in result["rows"] if r["category"] == "overall"}
    assert overall["microspec"]["max_set_size"] <= 3072
    # a sanity bound: on real text most target tokens are in MicroSpec's window (0.95 measured)
    assert overall["microspec"]["coverage"] >= 0.6
    # both columns: the lab's draft and the oracle (the target drafting for itself), and why they differ
    assert "| oracle: accept length | of full | coverage |" in run.stdout
    assert "a restricted head can beat the full one" in run.stdout
    oracle = {r["config"]: r for r in result["oracle"]["rows"] if r["category"] == "overall"}
    assert result["oracle"]["lossless"] and oracle["microspec"]["accept_length"] <= oracle["full"]["accept_length"]
