"""The real ``install_dynvocab_head`` on a real d2t draft: SGLang's ``LlamaForCausalLMEagle3`` loaded from the
tiny ``draft-d2t`` checkpoint (``sglang_specvocab.tools.testing.tiny``), its ``hot_token_id`` from the file's
``d2t``, as ``EagleDraftWorker.init_lm_head`` leaves it. ``DynVocabDraftWorker.build_dynvocab_policy`` and
``install_dynvocab_head`` then run unchanged; prefill and verify events full of ids outside the draft
vocabulary go through the policy. Checked: every live table id has a head row (``check_table``), no
logits row of a real ``ForwardBatch`` is all ``-inf``, the draft top-k proposes only hot ids, and the
prefill top-K head and hidden-state flag are on the target.

SGLang runs in a child process (it initialises torch.distributed), as in test_integration_logits."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import free_port

from sglang_specvocab.tools.testing.standins import CHILD_PREAMBLE

ROOT = Path(__file__).resolve().parents[1]
VOCAB, DRAFT_VOCAB = 4096, 512

pytestmark = pytest.mark.sglang

_CHILD = CHILD_PREAMBLE + textwrap.dedent(
    """
    import json
    import sys
    from types import SimpleNamespace

    import torch
    from safetensors.torch import load_file
    from sglang.test.layer_ut_utils import init_single_process_dist
    from transformers import AutoConfig

    init_single_process_dist(master_port=int(sys.argv[1]))
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    from sglang_specvocab.integration import worker as W
    from sglang_specvocab.policies import parse_config

    torch.set_num_threads(1)
    draft_dir, out = sys.argv[2], sys.argv[3]
    hf = AutoConfig.from_pretrained(draft_dir)
    model = LlamaForCausalLMEagle3(hf)
    model.load_weights(load_file(f"{draft_dir}/model.safetensors").items())
    V, R, H = hf.vocab_size, 9, model.lm_head.weight.shape[0]
    g = torch.Generator().manual_seed(0)

    d = object.__new__(W.DynVocabDraftWorker)
    d.device = torch.device("cpu")
    d.dynvocab_config = parse_config(
        {"policy": "window", "capacity": 48, "window": {"prefill_topk": 3, "verify_topk": 3}}
    )
    d.hot_token_id = model.hot_token_id  # EagleDraftWorker.init_lm_head: the draft model's d2t map
    d.draft_runner = SimpleNamespace(model=model, model_config=SimpleNamespace(hf_config=hf, model_path=draft_dir))
    target_lp = SimpleNamespace(keep_last_hidden_states=False)
    target_head = torch.nn.Linear(hf.hidden_size, V, bias=False)
    d.target_worker = SimpleNamespace(
        model_runner=SimpleNamespace(
            model=SimpleNamespace(logits_processor=target_lp, lm_head=target_head),
            model_config=SimpleNamespace(vocab_size=V, hf_eos_token_id={2}),
        )
    )
    pool = SimpleNamespace(req_to_token=torch.zeros(R, 8, dtype=torch.int32))
    d.dynvocab_policy = d.build_dynvocab_policy(pool)
    d.install_dynvocab_head()
    policy, proc = d.dynvocab_policy, d.dynvocab_proc
    hot = set(model.hot_token_id.tolist())

    rows = torch.tensor([4, 1, 7])
    policy.on_reset(rows)
    policy.on_prefill(rows, torch.randint(0, V, (3, 40), generator=g), torch.randint(0, V, (3, 40, 3), generator=g))
    for _ in range(5):
        drafts = torch.randint(0, V, (3, 8), generator=g)
        policy.on_verify(rows, drafts, torch.randint(0, V, (3, 5, 3), generator=g), drafts[:, :5])
    proc.check_table()  # raises on any live id without a head row

    bs, topk = 3, 4
    hidden = torch.randn(bs * topk, hf.hidden_size, generator=g)
    fb = ForwardBatch(
        forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=torch.zeros(bs * topk, dtype=torch.long),
        req_pool_indices=rows, seq_lens=torch.full((bs,), 8), out_cache_loc=torch.zeros(bs * topk, dtype=torch.long),
        seq_lens_sum=8 * bs, return_logprob=False, capture_hidden_mode=CaptureHiddenMode.LAST,
    )
    logits = proc(None, hidden, model.lm_head, fb).next_token_logits
    _, ids = proc.draft_topk(logits, topk, rows)
    cnt = policy.table.cnt[rows].repeat_interleave(topk)
    live = torch.arange(logits.shape[1])[None, :] < cnt[:, None]
    json.dump(
        {
            "hot_rows": len(hot),
            "head_rows": H,
            "wrapped": type(policy).__name__,
            "set_sizes": policy.table.cnt[rows].tolist(),
            "all_dead_rows": int((logits == float("-inf")).all(1).sum()),
            "dead_live_columns": int(((logits == float("-inf")) & live).sum()),
            "proposals_hot": all(t in hot for t in ids.flatten().tolist()),
            "target_flag": target_lp.keep_last_hidden_states,
            "target_head_is_target": d.dynvocab_target_head is target_head.weight,
        },
        open(out, "w"),
    )
    """
)


def test_real_install_on_a_d2t_eagle3_draft(tmp_path):
    from sglang_specvocab.tools.testing.tiny import make_tiny_checkpoints

    tiny = make_tiny_checkpoints(tmp_path / "tiny", vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB)
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    proc = subprocess.run(
        [sys.executable, str(script), str(free_port()), str(tiny.draft_d2t), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(out.read_text())
    assert res["hot_rows"] == res["head_rows"] == DRAFT_VOCAB
    assert res["wrapped"] == "DraftVocabPolicy"
    assert all(n > 1 for n in res["set_sizes"])  # the events' hot ids made it in
    assert res["all_dead_rows"] == 0 and res["dead_live_columns"] == 0
    assert res["proposals_hot"] is True
    assert res["target_flag"] is True and res["target_head_is_target"] is True
