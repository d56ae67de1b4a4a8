"""Every shipped config on a full-vocabulary and a d2t EAGLE-3 draft, at TP 1 and 2, through SGLang's own code.

The drafts are SGLang's ``LlamaForCausalLMEagle3`` loaded from the tiny checkpoints (``testing.tiny``) at the
shipped configs' vocabulary (262,144 ids, Gemma-3's: their data files are built for it) with a 32,768-row d2t head,
their ``ParallelLMHead`` sharded and padded by SGLang's own weight loader. Two gloo processes build SGLang's
distributed state as its launcher does (as in test_integration_tp_sglang, whose docstring explains the CPU
engine's gather setting); rank 0 then runs TP 1. In each, ``DynVocabDraftWorker.build_dynvocab_policy`` and
``install_dynvocab_head`` run unchanged, then a round of events: reset, prefill (prompt ids and the target's top-K),
three draft steps through the installed processor on DECODE batches (2 beams a request; a stepwise policy picks its
set inside each), the worker's top-k, and a verify.

A config is either refused by the server's argument resolution (``check_config_for_models``, what
``validate_server_args`` runs before any weights load) or runs everywhere. Checked: the refusals are exactly the
expected ones; nothing raises after the weights load; every process holds the same sets after every step (the
stepwise policies rank the whole head on every rank) and proposes only ids of the draft vocabulary, from the
request's set unless the batch runs the stock head; both TP 2 ranks propose the same tokens bit for bit, and TP 2
proposes TP 1's tokens where both ran the same plan. The hybrid's ranker file is refit for the test draft's hidden
size (the shipped one is Gemma-3 270M's, 640); everything else is as shipped.
"""

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from helpers import free_port, recorded

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
V, HOT, RANK = 262144, 32768, 64
SPACES = ("full", "d2t")
PROCS = ("tp2_rank0", "tp2_rank1", "tp1")
RPI = torch.tensor([4, 1, 7])  # three requests' slots
BEAMS, STEPS, K = 2, 3, 4
# What the argument resolution refuses, before any weights load: EvoSpec's core (32,768) plus its dynamic budget
# (1,024) is wider than a 32k d2t draft's vocabulary; FR-Spec's 32,768 most frequent ids are not all in one (a d2t
# vocabulary of exactly the table's top 32,768 would be the static trim itself).
UNCOVERED = r"size = {} is larger than the \d+ ids of the draft's vocabulary with a nonzero count"
REFUSED = {
    ("evospec.yaml", "d2t"): r"static_size \+ retrieval.dynamic_size = 33792 is invalid: must be at most .*32768",
    ("frspec.yaml", "d2t"): UNCOVERED.format(32768),
}


def _config_path(name, tmp):
    return tmp / name if name == "hybrid.yaml" else ROOT / "configs" / name


def _prepare(tmp):
    """The tiny checkpoints, the hybrid with a ranker fit for them, the events and hidden states of the round."""
    from safetensors.torch import load_file, save_file

    from sglang_specvocab.policies.lowrank import whitened_ranker
    from sglang_specvocab.tools.lab.rankers import save_trained
    from sglang_specvocab.tools.testing.tiny import NUM_FIXED, make_tiny_checkpoints

    tiny = make_tiny_checkpoints(tmp / "tiny", vocab_size=V, draft_vocab_size=HOT, dtype=torch.float32)
    head = load_file(str(tiny.target / "model.safetensors"))["lm_head.weight"]
    # A published d2t draft's vocabulary is its training data's most frequent target ids; the tiny one's is a random
    # sample (kept as draft-d2t-random, whose vocabulary the shipped frequency tables do not cover).
    shutil.copytree(tiny.draft_d2t, tmp / "tiny" / "draft-d2t-random")
    data = dict(load_file(str(tiny.draft_d2t / "model.safetensors")))
    order = [np.load(ROOT / "configs" / "data" / f"gemma3-270m-{s}.freq.npz")["ids"] for s in ("generated", "sharegpt")]
    hot = torch.tensor(list(dict.fromkeys([*range(NUM_FIXED), *np.concatenate(order).tolist()]))[:HOT]).sort().values
    data["d2t"], data["lm_head.weight"] = hot - torch.arange(HOT), head[hot].clone()
    save_file(data, str(tiny.draft_d2t / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    states = torch.randn(4096, head.shape[1], generator=g)
    w_down, w_proj, _ = whitened_ranker(head, states, RANK)
    save_trained(tmp / "tiny.ranker.pt", {"w_down": w_down.float(), "w_proj": w_proj.float()}, "test", {})
    text = (ROOT / "configs" / "hybrid.yaml").read_text()
    text, n = re.subn(r"ranker: \S+\}", f"ranker: {tmp / 'tiny.ranker.pt'}}}", text)
    text, m = re.subn(r"rank: \d+", f"rank: {RANK}", text)  # at most the tiny drafts' hidden size
    assert n == m == 1
    (tmp / "hybrid.yaml").write_text(text)
    bs, d = RPI.numel(), head.shape[1]
    return {
        "tiny": str(tiny.root),
        "prompt": torch.randint(0, V, (bs, 40), generator=g),
        "prompt_topk": torch.randint(0, V, (bs, 40, 3), generator=g),
        "hidden": torch.randn(STEPS, bs * BEAMS, d, generator=g),
        "drafts": torch.randint(0, V, (bs, 8), generator=g),
        "verify_topk": torch.randint(0, V, (bs, 5, 3), generator=g),
    }


def _draft(space, tiny):
    """SGLang's EAGLE-3 draft with the target's embedding (as SGLang shares it) and, for the full draft, the
    target's LM head (``load_lm_head_from_target``); SGLang's loaders shard both."""
    from safetensors.torch import load_file
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
    from transformers import AutoConfig

    path = Path(tiny) / f"draft-{space}"
    hf = AutoConfig.from_pretrained(path)
    model = LlamaForCausalLMEagle3(hf)
    target = load_file(str(Path(tiny) / "target" / "model.safetensors"))
    weights = dict(load_file(str(path / "model.safetensors")))
    weights["model.embed_tokens.weight"] = target["model.embed_tokens.weight"]
    if space == "full":
        weights["lm_head.weight"] = target["lm_head.weight"]
    model.load_weights(list(weights.items()))
    return model, hf, path


def _forward_batch(n_rows):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode

    bs = RPI.shape[0]
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE, batch_size=bs, input_ids=torch.zeros(n_rows, dtype=torch.long),
        req_pool_indices=RPI, seq_lens=torch.full((bs,), 8), out_cache_loc=torch.zeros(n_rows, dtype=torch.long),
        seq_lens_sum=8 * bs, return_logprob=False, capture_hidden_mode=CaptureHiddenMode.LAST,
    )  # fmt: skip


def _round(name, space, inp, tmp):
    """One config on one draft in this process's distributed state: what the worker built and the round's record."""
    from types import SimpleNamespace

    from sglang_specvocab.integration import worker as W
    from sglang_specvocab.policies import load_config

    model, hf, path = _draft(space, inp["tiny"])
    d = object.__new__(W.DynVocabDraftWorker)
    d.device = torch.device("cpu")
    d.dynvocab_config = load_config(_config_path(name, tmp))
    d.hot_token_id = getattr(model, "hot_token_id", None)
    d.draft_runner = SimpleNamespace(model=model, model_config=SimpleNamespace(hf_config=hf, model_path=str(path)))
    target_lp = SimpleNamespace(keep_last_hidden_states=False)
    d.target_worker = SimpleNamespace(
        model_runner=SimpleNamespace(
            model=SimpleNamespace(logits_processor=target_lp, lm_head=torch.nn.Linear(hf.hidden_size, V, bias=False)),
            model_config=SimpleNamespace(vocab_size=V, hf_eos_token_id={2}),
        )
    )
    pool = SimpleNamespace(req_to_token=torch.zeros(9, 8, dtype=torch.int32))
    d.dynvocab_policy = d.build_dynvocab_policy(pool)
    d.install_dynvocab_head()
    policy, proc = d.dynvocab_policy, d.dynvocab_proc
    out = {"stepwise": policy.stepwise, "dense": proc is None, "tp": int(model.lm_head.tp_size), "steps": []}
    if proc is None:
        return out
    policy.on_reset(RPI)
    k_pre, k_ver = policy.prefill_topk, policy.verify_topk
    policy.on_prefill(RPI, inp["prompt"], inp["prompt_topk"][:, :, :k_pre] if k_pre else None)
    table = policy.table
    for step in range(STEPS):
        proc.dv_step = step
        h = inp["hidden"][step]
        fb = _forward_batch(h.shape[0])
        logits = proc(fb.input_ids, h, model.lm_head, fb).next_token_logits
        probs, ids = proc.draft_topk(logits, K, RPI)
        proc.check_table()  # every live id has a draft head row
        out["steps"].append(
            {
                "plan": proc.dv_head.plan(RPI.numel(), BEAMS),
                "ids": table.ids[RPI].clone(),
                "cnt": table.cnt[RPI].clone(),
                "tokens": ids,
                "probs": probs,
            }
        )
    drafts = inp["drafts"]
    policy.on_verify(RPI, drafts, inp["verify_topk"][:, :, :k_ver] if k_ver else None, drafts[:, :5])
    out["after_verify"] = (table.ids[RPI].clone(), table.cnt[RPI].clone())
    out["hot"] = None if d.hot_token_id is None else d.hot_token_id.clone()
    out["fallback"] = table.fallback_id
    return out


def _run(rank, worlds, inp_path, tmp, cases):
    os.environ.pop("SGLANG_USE_CPU_ENGINE", None)  # its import chain needs the CPU sgl_kernel
    os.environ["SGLANG_SPECVOCAB_CACHE"] = str(Path(tmp) / "cache")  # rankers and clusters: built once, shared
    from sglang_specvocab.tools.testing.standins import install as standins

    standins()
    torch.set_num_threads(1)
    inp = torch.load(inp_path)
    for world, port, out_path in worlds:
        _world(rank, world, port, inp, Path(tmp), cases, out_path)


def _world(rank, world, port, inp, tmp, cases, out_path):
    import traceback

    from sglang.srt.distributed import parallel_state as ps
    from sglang.test.test_utils import publish_build_topology

    ps.init_distributed_environment(
        world_size=world, rank=rank, local_rank=rank, backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{port}", timeout=300,
    )  # fmt: skip
    out = {}
    try:
        publish_build_topology(world_rank=rank, tp_size=world)
        ps.initialize_model_parallel(backend="gloo")
        ps._is_cpu = True  # the CPU engine's collectives (test_integration_tp_sglang's docstring)
        for name, space in cases:
            try:
                out[name, space] = _round(name, space, inp, tmp)
            except Exception:  # noqa: BLE001 - recorded for the test to show; the other cases still run
                out[name, space] = traceback.format_exc()
        torch.save(out, out_path)
    finally:
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()


def _resolve(name, space, inp, tmp):
    """The server's argument resolution for this config and draft (``validate_server_args``'s checks)."""
    from transformers import AutoConfig

    from sglang_specvocab.errors import ConfigError
    from sglang_specvocab.integration.algorithm import check_config_for_models, draft_info
    from sglang_specvocab.policies import load_config

    path = Path(inp["tiny"]) / f"draft-{space}"
    try:
        check_config_for_models(
            load_config(_config_path(name, tmp)), draft_info(AutoConfig.from_pretrained(path), str(path), V)
        )
    except ConfigError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shipped")
    inp = _prepare(tmp)
    torch.save(inp, tmp / "in.pt")
    refused = {(n, s): _resolve(n, s, inp, tmp) for n in CONFIGS for s in (*SPACES, "d2t-random")}
    cases = [(n, s) for (n, s), why in refused.items() if why is None and s in SPACES]
    port2, port1 = free_port(), free_port()
    worlds = {0: [(2, port2, tmp / "tp2_rank0.pt"), (1, port1, tmp / "tp1.pt")], 1: [(2, port2, tmp / "tp2_rank1.pt")]}
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_run, args=(r, w, str(tmp / "in.pt"), str(tmp), cases)) for r, w in worlds.items()]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=900)
    for p in procs:
        if p.is_alive():  # stuck in a collective the other rank never joined: do not outlive the test
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    got = {n: torch.load(tmp / f"{n}.pt", weights_only=False) for n in PROCS}
    return refused, got, inp


@pytest.mark.parametrize("name", ["frspec.yaml", "vocabtrim.yaml", "evospec.yaml"])
def test_a_draft_vocabulary_the_frequency_table_does_not_cover_is_refused_before_the_weights_load(runs, name):
    refused = runs[0]
    why = refused[name, "d2t-random"]
    if name == "evospec.yaml":  # its capacity is checked first
        assert re.search(REFUSED["evospec.yaml", "d2t"], why)
        return
    want = UNCOVERED.format(32768 if name == "frspec.yaml" else 2048)
    assert why is not None and re.search(want, why), why


def test_a_ranker_fit_for_another_model_is_refused_before_the_weights_load(runs, tmp_path):
    """The shipped hybrid's ranker is Gemma-3 270M's (hidden size 640); the test drafts have 64."""
    from transformers import AutoConfig

    from sglang_specvocab.errors import ConfigError
    from sglang_specvocab.integration.algorithm import check_config_for_models, draft_info
    from sglang_specvocab.policies import load_config

    path = Path(runs[2]["tiny"]) / "draft-full"
    info = draft_info(AutoConfig.from_pretrained(path), str(path), V)
    assert info.hidden_size == 64
    with pytest.raises(ConfigError, match=r"w_down has shape \(128, 640\), the model and rank = 128 need \(128, 64\)"):
        check_config_for_models(load_config(ROOT / "configs" / "hybrid.yaml"), info)


def _result(got, proc, name, space):
    return recorded(got[proc][name, space], f"{proc}, after the weights loaded,")


def test_only_the_expected_configs_are_refused_and_before_any_weights_load(runs):
    refused = runs[0]
    assert len(CONFIGS) == 10 and "hybrid.yaml" in CONFIGS
    for (name, space), why in refused.items():
        if space not in SPACES:
            continue
        want = REFUSED.get((name, space))
        if want is None:
            assert why is None, (name, space, why)
        else:
            assert why is not None and re.search(want, why), (name, space, why)


CASES = [pytest.param(n, s, id=f"{n[:-5]}-{s}") for n in CONFIGS for s in SPACES if (n, s) not in REFUSED]


@pytest.mark.parametrize("name, space", CASES)
def test_every_process_runs_the_config_with_the_same_sets(runs, name, space):
    got = runs[1]
    res = {p: _result(got, p, name, space) for p in PROCS}
    assert [res[p]["tp"] for p in PROCS] == [2, 2, 1]
    if res["tp1"]["dense"]:
        assert name == "full.yaml" and all(r["dense"] for r in res.values())
        return
    assert res["tp1"]["stepwise"] == (name in ("dynaspec.yaml", "specvocab.yaml", "hybrid.yaml"))
    one = res["tp1"]
    for p in PROCS[:2]:
        for a, b in zip(res[p]["steps"], one["steps"], strict=True):
            assert torch.equal(a["ids"], b["ids"]) and torch.equal(a["cnt"], b["cnt"]), p  # same sets
        assert all(torch.equal(x, y) for x, y in zip(res[p]["after_verify"], one["after_verify"], strict=True))


@pytest.mark.parametrize("name, space", CASES)
def test_proposals_are_draft_ids_of_the_set_and_agree_across_ranks(runs, name, space):
    got = runs[1]
    res = {p: _result(got, p, name, space) for p in PROCS}
    if res["tp1"]["dense"]:
        return
    for p in PROCS:
        r = res[p]
        allowed = torch.arange(V) if r["hot"] is None else r["hot"]
        for s in r["steps"]:
            tokens = s["tokens"]
            assert tokens.shape == (RPI.numel() * BEAMS, K)
            assert bool(torch.isin(tokens, allowed).all()), (p, s["plan"])
            assert bool((s["cnt"] > 0).all())  # every set holds ids (the fallback at least)
            if s["plan"] == "stock":  # the whole draft vocabulary
                assert bool((s["probs"] > 0).all())
                continue
            for b in range(RPI.numel()):  # the set's ids; past a set shorter than K the fallback id, probability 0
                cnt = int(s["cnt"][b])
                t, pr = tokens[b * BEAMS : (b + 1) * BEAMS], s["probs"][b * BEAMS : (b + 1) * BEAMS]
                assert bool(torch.isin(t[:, : min(cnt, K)], s["ids"][b, :cnt]).all()), (p, b)
                assert bool((pr[:, : min(cnt, K)] > 0).all()) and bool((pr[:, cnt:] == 0).all()), (p, b)
                assert bool((t[:, cnt:] == r["fallback"]).all()), (p, b)
    for a, b in zip(res["tp2_rank0"]["steps"], res["tp2_rank1"]["steps"], strict=True):
        assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["probs"], b["probs"])
    for a, b in zip(res["tp2_rank0"]["steps"], res["tp1"]["steps"], strict=True):
        if a["plan"] == b["plan"] != "stock":
            assert torch.equal(a["tokens"], b["tokens"]), (a["plan"], b["plan"])
