"""A server says at start when a config's trained ranker was fit on another draft's states: the real
``DynVocabDraftWorker.build_dynvocab_policy`` on SGLang's ``LlamaForCausalLMEagle3`` loaded from the tiny full-vocabulary
draft (``sglang_specvocab.tools.testing.tiny``), with three ranker files of the same tensors that differ only in what
they were fit on: this draft (its fc fingerprint read from its file, as ``train-ranker --draft eagle3:DIR`` records
it), the target's own states (as the shipped ``configs/hybrid.yaml`` ranker), and another EAGLE-3 draft. The policy
is built in every case (serving stays lossless); only the mismatches log a warning, naming the file, what it was fit
on and the command that fits one to this draft.

SGLang runs in a child process (it initialises torch.distributed), as in test_integration_d2t."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import free_port

from sglang_specvocab.policies.base import draft_fingerprint
from sglang_specvocab.policies.lowrank import whitened_ranker
from sglang_specvocab.tools.lab.rankers import save_trained
from sglang_specvocab.tools.testing.standins import CHILD_PREAMBLE
from sglang_specvocab.tools.train.checkpoint import checkpoint_fingerprint

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 4096

pytestmark = pytest.mark.sglang

_CHILD = CHILD_PREAMBLE + textwrap.dedent(
    """
    import json
    import logging
    import sys
    from types import SimpleNamespace

    import torch
    from safetensors.torch import load_file
    from sglang.test.layer_ut_utils import init_single_process_dist
    from transformers import AutoConfig

    init_single_process_dist(master_port=int(sys.argv[1]))
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    from sglang_specvocab.integration import worker as W
    from sglang_specvocab.policies import parse_config

    torch.set_num_threads(1)
    draft_dir, target_file, out = sys.argv[2], sys.argv[3], sys.argv[4]
    rankers = sys.argv[5:]
    hf = AutoConfig.from_pretrained(draft_dir)
    model = LlamaForCausalLMEagle3(hf)
    weights = dict(load_file(f"{draft_dir}/model.safetensors"))
    target = load_file(target_file)
    weights["lm_head.weight"] = target["lm_head.weight"]  # a full draft: SGLang binds the target's head
    weights["model.embed_tokens.weight"] = target["model.embed_tokens.weight"]
    model.load_weights(list(weights.items()))
    V = hf.vocab_size

    records = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage()) if r.levelno >= logging.WARNING else None
    W.logger.addHandler(handler)
    built = []
    for path in rankers:
        d = object.__new__(W.DynVocabDraftWorker)
        d.device = torch.device("cpu")
        d.dynvocab_config = parse_config(
            {"policy": "lowrank", "lowrank": {"rank": 8, "topk": 64, "ranker": path}}, source=f"<{path}>"
        )
        d.hot_token_id = None
        d.draft_runner = SimpleNamespace(model=model, model_config=SimpleNamespace(hf_config=hf, model_path=draft_dir))
        d.target_worker = SimpleNamespace(
            model_runner=SimpleNamespace(model_config=SimpleNamespace(vocab_size=V, hf_eos_token_id={2}))
        )
        before = len(records)
        policy = d.build_dynvocab_policy(SimpleNamespace(req_to_token=torch.zeros(5, 8, dtype=torch.int32)))
        built.append({"ranker": path, "built": type(policy).__name__, "warnings": records[before:]})
    json.dump(built, open(out, "w"))
    """
)


def test_fingerprint_is_the_drafts_fc_in_any_dtype(tmp_path):
    """The same fc read in fp32, bf16 or from the file has one fingerprint; another draft's differs; no fc, none."""
    from safetensors.torch import load_file

    from sglang_specvocab.tools.testing.tiny import make_tiny_checkpoints

    tiny = make_tiny_checkpoints(tmp_path / "tiny", vocab_size=VOCAB, draft_vocab_size=512)
    fc = load_file(str(tiny.draft_full / "model.safetensors"))["fc.weight"]
    assert fc.dtype == torch.bfloat16
    made = checkpoint_fingerprint(tiny.draft_full)
    assert len(made) == 16 and made == draft_fingerprint(fc) == draft_fingerprint(fc.float())
    assert checkpoint_fingerprint(tiny.draft_d2t) != made  # another draft
    assert draft_fingerprint(None) is None


def test_fit_mismatch_compares_the_recorded_draft():
    from sglang_specvocab.policies.base import fit_mismatch

    def trained(recording):
        return {"what": "ranker", "file": "/x/r.pt", "recording": recording}

    assert fit_mismatch(None, "abc") is None  # no trained file
    assert fit_mismatch(trained(None), "abc") is None  # a file of an earlier version records nothing
    assert fit_mismatch(trained({"draft": "eagle3:/a", "draft_fingerprint": "abc"}), "abc") is None
    assert fit_mismatch(trained({"draft": "layers:2"}), None) is None  # no EAGLE-3 on either side: the lab compares
    assert fit_mismatch(trained({"draft": "target"}), "abc") == (
        "ranker r.pt was fit on target states, this one drafts with an EAGLE-3 draft with fc fingerprint abc"
    )
    assert fit_mismatch(trained({"draft": "eagle3:/a", "draft_fingerprint": "def"}), "abc") == (
        "ranker r.pt was fit on eagle3:/a (fc fingerprint def) states, this one drafts with an EAGLE-3 draft with fc "
        "fingerprint abc"
    )
    assert "a draft that is not EAGLE-3" in fit_mismatch(
        trained({"draft": "eagle3:/a", "draft_fingerprint": "d"}), None
    )


def test_the_server_warns_when_the_ranker_was_fit_on_another_draft(tmp_path):
    from safetensors.torch import load_file

    from sglang_specvocab.tools.testing.tiny import make_tiny_checkpoints

    tiny = make_tiny_checkpoints(tmp_path / "tiny", vocab_size=VOCAB, draft_vocab_size=512)
    head = load_file(str(tiny.target / "model.safetensors"))["lm_head.weight"].float()
    w_down, w_proj, _ = whitened_ranker(
        head, torch.randn(512, head.shape[1], generator=torch.Generator().manual_seed(0)), 8
    )
    tensors = {"w_down": w_down.float(), "w_proj": w_proj.float()}
    this = checkpoint_fingerprint(tiny.draft_full)
    recordings = {
        "this": {"model": "tiny", "draft": f"eagle3:{tiny.draft_full}", "draft_fingerprint": this},
        "target": {"model": "tiny", "draft": "target"},
        "other": {"model": "tiny", "draft": f"eagle3:{tiny.draft_d2t}", "draft_fingerprint": "0123456789abcdef"},
    }
    paths = []
    for name, rec in recordings.items():
        paths.append(str(tmp_path / f"{name}.ranker.pt"))
        save_trained(paths[-1], tensors, "test", rec)
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    argv = [sys.executable, str(script), str(free_port()), str(tiny.draft_full)]
    argv += [str(tiny.target / "model.safetensors"), str(out), *paths]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = {Path(r["ranker"]).name.split(".")[0]: r for r in json.loads(out.read_text())}
    assert all(r["built"] == "LowRankPolicy" for r in res.values())  # served either way
    assert res["this"]["warnings"] == []
    for name, fit in (("target", "target states"), ("other", "(fc fingerprint 0123456789abcdef) states")):
        (warning,) = res[name]["warnings"]
        assert f"its ranker {name}.ranker.pt was fit on" in warning and fit in warning
        assert f"this one drafts with an EAGLE-3 draft with fc fingerprint {this}" in warning
        assert f"train-ranker --fit whitened --draft eagle3:{tiny.draft_full}" in warning
