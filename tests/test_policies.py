"""The seed policies other than the window: each selection rule against its literal reference,
lossless decoding, no host sync, and clear errors."""

import re

import numpy as np
import pytest
import torch
from helpers import tiny_llama
from literal import LiteralRetrieval, cluster_budget, cluster_set, frequent_set, lowrank_set, union_set

from sglang_specvocab import SpecVocabError
from sglang_specvocab.errors import ConfigError
from sglang_specvocab.policies import ModelContext, build_policy, parse_config
from sglang_specvocab.policies.cluster import step_budget
from sglang_specvocab.policies.lowrank import head_times, read_ranker, svd_ranker, whitened_ranker
from sglang_specvocab.tools.lab.decoder import CausalLM, DraftShape, SpeculativeDecoder, greedy_generate
from sglang_specvocab.vocab import VocabSpace
from sglang_specvocab.vocab_data import save_frequency_table, save_successors

V = 512


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A frequency table (Zipf-like counts, EOS rare) and a successor graph for the tiny vocabulary."""
    d = tmp_path_factory.mktemp("vocab")
    g = np.random.default_rng(0)
    counts = g.zipf(1.3, V).astype(np.int64)
    counts[2] = 0  # EOS never counted: the policies must force it in
    counts[g.choice(V, 40, replace=False)] = 0
    save_frequency_table(d / "freq.npz", counts, tokenizer="tiny", source="test")
    succ = g.integers(-1, V, (V, 6)).astype(np.int32)
    save_successors(d / "succ.npz", np.sort(succ, axis=1)[:, ::-1].copy(), tokenizer="tiny", source="test")
    return d


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("policy-cache")


def model_ctx(weight, cache, embedding=None):
    return ModelContext(
        weight=weight, embedding=embedding, space=VocabSpace.build(weight.shape[0]), eos_token_ids=(2,), cache_dir=cache
    )


def freq_ids(path):
    with np.load(path) as f:
        return f["ids"].tolist()


# --- static ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 7, 100, 400])
def test_static_is_the_most_frequent_ids_with_eos_forced_in(files, size):
    cfg = parse_config({"policy": "static", "static": {"table": str(files / "freq.npz"), "size": size}})
    pol = build_policy(cfg, 4, fallback_id=2, model=ModelContext(space=VocabSpace.build(V), eos_token_ids=(2,)))
    want = frequent_set(freq_ids(files / "freq.npz"), size, [2])
    for r in range(4):  # every row, the padding row too, holds the set from the start
        assert pol.table.row(r) == want
    assert 2 in want and len(want) == size
    pol.on_verify(torch.tensor([1]), torch.tensor([[5, 6]]), None, torch.tensor([[7]]))
    pol.on_reset(torch.tensor([1]))
    assert pol.table.row(1) == want


def test_static_paths_are_relative_to_the_config_file(files, tmp_path):
    (tmp_path / "frspec.yaml").write_text("policy: static\nstatic: {table: ../" + files.name + "/freq.npz, size: 8}\n")
    from sglang_specvocab.policies import load_config

    cfg = load_config(tmp_path / "frspec.yaml")
    assert cfg.resolve(cfg.static.table) == tmp_path / ".." / files.name / "freq.npz"
    cfg = parse_config(
        {"policy": "static", "static": {"table": "missing.npz", "size": 8}}, source=str(tmp_path / "x.yaml")
    )
    with pytest.raises(ConfigError, match="missing.npz"):
        build_policy(cfg, 2, model=ModelContext(space=VocabSpace.build(V)))


def test_static_errors_name_the_problem(files):
    cfg = parse_config({"policy": "static", "static": {"table": str(files / "freq.npz"), "size": 8}})
    with pytest.raises(ConfigError, match="built for a 512-token vocabulary, the model has 1000"):
        build_policy(cfg, 2, model=ModelContext(space=VocabSpace.build(1000)))
    big = parse_config({"policy": "static", "static": {"table": str(files / "freq.npz"), "size": 511}})
    with pytest.raises(ConfigError, match="larger than the"):
        build_policy(big, 2, model=ModelContext(space=VocabSpace.build(V)))
    with pytest.raises(ConfigError, match="static.size = 0 is invalid"):
        parse_config({"policy": "static", "static": {"table": "x.npz", "size": 0}})
    with pytest.raises(ConfigError, match="missing required key 'static'"):
        parse_config({"policy": "static"})


# --- lowrank --------------------------------------------------------------------------------


def test_svd_ranker_is_the_truncated_svd():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 24, generator=g, dtype=torch.float64)
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    for r in (1, 5, 24):
        down, vocab = svd_ranker(w, r)
        assert torch.allclose(vocab @ down, (u[:, :r] * s[:r]) @ vh[:r], atol=1e-9)
        assert down.shape == (r, 24) and vocab.shape == (300, r)


def test_whitened_ranker_is_the_best_rank_r_fit_over_the_states():
    """W P W_down is U_r S_r V_r^T L^-1 from the SVD of W L (C = L L^T the states' second moment), which
    reproduces the logits of states in an r-dimensional subspace exactly, where the plain SVD does not."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 24, generator=g, dtype=torch.float64)
    basis = torch.randn(24, 5, generator=g, dtype=torch.float64)
    states = torch.randn(4000, 5, generator=g, dtype=torch.float64) @ basis.T
    states += 1e-3 * torch.randn(4000, 24, generator=g, dtype=torch.float64)
    c = states.T @ states / len(states)
    lo = torch.linalg.cholesky(c + torch.eye(24, dtype=torch.float64) * 1e-6 * float(c.diagonal().mean()))
    u, s, vh = torch.linalg.svd(w @ lo, full_matrices=False)
    for r in (1, 5, 12):
        down, proj, share = whitened_ranker(w, states, r)
        assert down.shape == (r, 24) and proj.shape == (24, r)
        literal = (u[:, :r] * s[:r]) @ vh[:r] @ torch.linalg.inv(lo)
        torch.testing.assert_close(w @ proj @ down, literal, rtol=1e-5, atol=1e-6)
        assert abs(share - float((s[:r] ** 2).sum() / (s**2).sum())) < 1e-9
    down, proj, share = whitened_ranker(w, states, 5)
    rel = lambda approx: float((approx - states @ w.T).norm() / (states @ w.T).norm())
    sd, sv = svd_ranker(w, 5)
    assert rel((states @ down.T) @ (w @ proj).T) < 1e-2 and rel((states @ sd.T) @ sv.T) > 0.3 and share > 0.999


def test_a_whitened_ranker_file_drives_the_lowrank_policy(cache, tmp_path):
    """A file with W_down and P: the policy scores with W_vocab = W P from the draft's head; a file with both or
    neither of w_vocab and w_proj, or a wrong shape, is refused naming the file."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(V, 32, generator=g, dtype=torch.float64)
    down, proj, _ = whitened_ranker(w, torch.randn(500, 32, generator=g, dtype=torch.float64), 8)
    torch.save({"w_down": down, "w_proj": proj}, tmp_path / "r.pt")
    cfg = parse_config({"policy": "lowrank", "lowrank": {"rank": 8, "topk": 9, "ranker": str(tmp_path / "r.pt")}})
    pol = build_policy(cfg, 3, model=model_ctx(w, cache))
    hidden = torch.randn(1, 2, 32, generator=g, dtype=torch.float64)
    pol.select(torch.tensor([2]), 0, hidden, torch.zeros(1, 2, dtype=torch.long))
    assert pol.table.row(2) == lowrank_set([((w @ proj) @ (down @ h)).tolist() for h in hidden[0]], 9)
    for name, data, piece in [
        ("both", {"w_down": down, "w_proj": proj, "w_vocab": w @ proj}, "must hold exactly one of w_vocab and w_proj"),
        ("neither", {"w_down": down}, "must hold exactly one of w_vocab and w_proj"),
        ("shape", {"w_down": down, "w_proj": proj[:5]}, "w_proj has shape (5, 8), the model and rank = 8 need (32, 8)"),
    ]:
        torch.save(data, tmp_path / f"{name}.pt")
        bad = parse_config(
            {"policy": "lowrank", "lowrank": {"rank": 8, "topk": 9, "ranker": str(tmp_path / f"{name}.pt")}}
        )
        with pytest.raises(ConfigError, match=re.escape(f"ranker file {tmp_path / name}.pt") + ".*" + re.escape(piece)):
            build_policy(bad, 3, model=model_ctx(w, cache))


def test_a_whitened_file_serves_any_lower_rank_as_that_ranks_own_fit(cache, tmp_path):
    """A rank-8 whitened file read at rank 5 scores as the rank-5 fit over the same states (its leading
    directions), in the policy's sets too; at rank 9 it is refused, saying a whitened file serves its rank or
    lower. A w_vocab file (another fit) serves its own rank only."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(V, 32, generator=g, dtype=torch.float64)
    states = torch.randn(500, 32, generator=g, dtype=torch.float64) * torch.linspace(0.1, 3, 32, dtype=torch.float64)
    down8, proj8, _ = whitened_ranker(w, states, 8)
    down5, proj5, _ = whitened_ranker(w, states, 5)
    torch.save({"w_down": down8, "w_proj": proj8}, tmp_path / "r8.pt")
    torch.save({"w_down": down8, "w_vocab": w @ proj8}, tmp_path / "v8.pt")
    read = read_ranker(tmp_path / "r8.pt", V, 32, 5, "cfg")
    torch.testing.assert_close(read["w_proj"] @ read["w_down"], proj5 @ down5, rtol=1e-9, atol=1e-9)
    cfg = parse_config({"policy": "lowrank", "lowrank": {"rank": 5, "topk": 9, "ranker": str(tmp_path / "r8.pt")}})
    pol = build_policy(cfg, 3, model=model_ctx(w, cache))
    hidden = torch.randn(1, 2, 32, generator=g, dtype=torch.float64)
    pol.select(torch.tensor([1]), 0, hidden, torch.zeros(1, 2, dtype=torch.long))
    assert pol.table.row(1) == lowrank_set([((w @ proj5) @ (down5 @ h)).tolist() for h in hidden[0]], 9)
    with pytest.raises(ConfigError, match=re.escape("w_down has shape (8, 32), the model and rank = 9 need (9, 32) "
                                                    "(a whitened file serves its rank or lower)")):  # fmt: skip
        read_ranker(tmp_path / "r8.pt", V, 32, 9, "cfg")
    with pytest.raises(
        ConfigError, match=re.escape("w_down has shape (8, 32), the model and rank = 5 need (5, 32)") + "$"
    ):
        read_ranker(tmp_path / "v8.pt", V, 32, 5, "cfg")


@pytest.mark.parametrize("block_rows", [1, 7, V, 4 * V])
def test_head_times_in_blocks_is_the_whole_product_in_fp64(block_rows):
    """W P for a whitened file, a block of head rows at a time (no fp64 copy of the whole head): the same fp64
    product as in one piece, for blocks that divide V, leave a remainder, or exceed it."""
    g = torch.Generator().manual_seed(block_rows)
    w = torch.randn(V, 32, generator=g).bfloat16()
    proj = torch.randn(32, 8, generator=g)
    out = head_times(w, proj, block_rows=block_rows)
    assert out.dtype == torch.float64 and out.shape == (V, 8)
    torch.testing.assert_close(out, w.double() @ proj.double(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("beams", [1, 3])
@pytest.mark.parametrize("topk", [1, 17, 64])
def test_lowrank_set_is_the_top_k_of_the_rows_maximum(cache, beams, topk):
    g = torch.Generator().manual_seed(topk * 10 + beams)
    w = torch.randn(V, 32, generator=g, dtype=torch.float64)
    cfg = parse_config({"policy": "lowrank", "lowrank": {"rank": 8, "topk": topk}})
    pol = build_policy(cfg, 5, model=model_ctx(w, cache))
    rows = torch.tensor([4, 1])
    hidden = torch.randn(2, beams, 32, generator=g, dtype=torch.float64)
    pol.select(rows, 0, hidden, torch.zeros(2, beams, dtype=torch.long))
    down, vocab = svd_ranker(w, 8)
    for b, r in enumerate(rows.tolist()):
        approx = [(vocab @ (down @ h)).tolist() for h in hidden[b]]
        assert pol.table.row(r) == lowrank_set(approx, topk)
    assert pol.table.row(0) == [0]  # rows not selected keep their sets


def test_lowrank_errors(cache):
    w = torch.randn(V, 16)
    with pytest.raises(ConfigError, match="lowrank.rank = 17 is invalid: must be at most the hidden size 16"):
        build_policy(
            parse_config({"policy": "lowrank", "lowrank": {"rank": 17, "topk": 4}}), 2, model=model_ctx(w, cache)
        )
    with pytest.raises(SpecVocabError, match="needs the draft's LM head"):
        build_policy(parse_config({"policy": "lowrank", "lowrank": {"rank": 4, "topk": 4}}), 2)
    cfg = parse_config({"policy": "lowrank", "lowrank": {"rank": 4, "topk": 4, "ranker": "nope.pt"}})
    with pytest.raises(ConfigError, match="ranker file nope.pt does not exist"):
        build_policy(cfg, 2, model=model_ctx(w, cache))


# --- cluster --------------------------------------------------------------------------------


def test_position_aware_budget():
    for k0, k1 in [(1, 1), (8, 5), (16, 8), (3, 40)]:
        assert [step_budget(k0, k1, t) for t in range(12)] == [cluster_budget(k0, k1, t) for t in range(12)]
    assert [step_budget(16, 8, t) for t in range(5)] == [16, 8, 2, 1, 1]


@pytest.fixture(scope="module")
def cluster_policy(cache):
    w = tiny_llama().lm_head.weight.detach()
    cfg = parse_config({"policy": "cluster", "capacity": 60, "cluster": {"clusters": 12, "budget": [5, 3]}})
    return build_policy(cfg, 6, model=model_ctx(w, cache)), w


def test_clusters_partition_the_vocabulary_most_central_first(cluster_policy):
    pol, w = cluster_policy
    assert sorted(pol.perm.tolist()) == list(range(V))
    assert pol.offsets[0] == 0 and pol.offsets[-1] == V and (pol.offsets.diff() >= 1).all()
    unit = torch.nn.functional.normalize(w.float(), dim=1)
    assert torch.allclose(pol.centroids.norm(dim=1), torch.ones(12))
    for c in range(12):
        members = pol.perm[pol.offsets[c] : pol.offsets[c + 1]]
        sims = unit[members] @ pol.centroids.T
        assert (sims.argmax(1) == c).float().mean() > 0.95  # each id sits with its nearest centroid
        own = sims[:, c]
        assert (own[:-1] >= own[1:] - 1e-5).all()  # most central first


def test_clusters_are_cached_per_weights(cluster_policy, cache, monkeypatch):
    from sglang_specvocab.policies import cluster as mod

    pol, w = cluster_policy
    monkeypatch.setattr(mod, "spherical_kmeans", lambda *a: pytest.fail("k-means ran again for the same weights"))
    cfg = parse_config({"policy": "cluster", "capacity": 60, "cluster": {"clusters": 12, "budget": [5, 3]}})
    again = build_policy(cfg, 2, model=model_ctx(w, cache))
    assert torch.equal(again.perm, pol.perm)


@pytest.mark.parametrize("step", [0, 1, 2, 5])
@pytest.mark.parametrize("beams", [1, 4])
def test_cluster_set_matches_the_literal_rule(cluster_policy, step, beams):
    pol, w = cluster_policy
    g = torch.Generator().manual_seed(step * 7 + beams)
    rows = torch.tensor([2, 5, 3])
    hidden = torch.randn(3, beams, w.shape[1], generator=g, dtype=torch.float64)
    pol.select(rows, step, hidden, torch.zeros(3, beams, dtype=torch.long))
    members = [pol.perm[pol.offsets[c] : pol.offsets[c + 1]].tolist() for c in range(12)]
    for b, r in enumerate(rows.tolist()):
        scores = [(pol.centroids.double() @ h).tolist() for h in hidden[b]]
        assert pol.table.row(r) == cluster_set(scores, members, cluster_budget(5, 3, step), 60)


def test_cluster_config_errors():
    with pytest.raises(ConfigError, match="cluster.budget k1 = 9 is invalid: must be in \\[1, clusters = 8\\]"):
        parse_config({"policy": "cluster", "capacity": 8, "cluster": {"clusters": 8, "budget": [2, 9]}})
    with pytest.raises(ConfigError, match="cluster.budget = \\[2\\] is invalid"):
        parse_config({"policy": "cluster", "capacity": 8, "cluster": {"clusters": 8, "budget": [2]}})


def test_cluster_refuses_more_clusters_than_tokens(cache):
    cfg = parse_config({"policy": "cluster", "capacity": 8, "cluster": {"clusters": 600, "budget": [2, 1]}})
    with pytest.raises(
        ConfigError, match="cluster.clusters = 600 is invalid: must be at most the draft head.s 512 rows"
    ):
        build_policy(cfg, 2, model=model_ctx(torch.randn(V, 16), cache))


# --- union ----------------------------------------------------------------------------------


def test_union_keeps_members_in_order_and_caps(files, cache):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(V, 16, generator=g, dtype=torch.float64)
    members = [
        {"policy": "window", "capacity": 10, "window": {"prefill_topk": 0, "verify_topk": 0, "sources": ["context"]}},
        {"policy": "static", "static": {"table": str(files / "freq.npz"), "size": 12}},
        {"policy": "lowrank", "lowrank": {"rank": 4, "topk": 9}},
    ]
    for cap in (None, 5, 14, 25):
        data = {"policy": "union", "members": members} | ({} if cap is None else {"capacity": cap})
        pol = build_policy(parse_config(data), 3, fallback_id=2, model=model_ctx(w, cache))
        assert pol.stepwise and pol.table.capacity == (cap or 31)
        rows = torch.tensor([1, 2])
        pol.on_reset(rows)
        pol.on_prefill(rows, torch.tensor([[7, 8, 7, 9], [20, 21, -1, -1]]), None)
        pol.select(
            rows, 0, torch.randn(2, 2, 16, generator=g, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.long)
        )
        for r in (1, 2):
            sets = [m.table.row(r) for m in pol.members]
            assert pol.table.row(r) == union_set(sets, cap or 31)


def test_union_member_errors_name_the_member():
    with pytest.raises(ConfigError, match=r"members\[1\]: policy = 'full' is invalid: a member must be a set policy"):
        parse_config({"policy": "union", "members": [{"policy": "window", "capacity": 4}, {"policy": "full"}]})
    with pytest.raises(ConfigError, match=r"members\[0\]: unknown key 'window.bogus'"):
        parse_config({"policy": "union", "members": [{"policy": "window", "capacity": 4, "window": {"bogus": 1}}]})


# --- retrieval ------------------------------------------------------------------------------


def retrieval_cfg(files, static_size=40, dynamic_size=6, neighbours=3, successors=2):
    return parse_config(
        {
            "policy": "retrieval",
            "retrieval": {
                "table": str(files / "freq.npz"),
                "static_size": static_size,
                "dynamic_size": dynamic_size,
                "neighbours": neighbours,
                "graph": str(files / "succ.npz"),
                "successors": successors,
            },
        }
    )


@pytest.mark.parametrize("seed", range(6))
def test_retrieval_matches_the_literal_rule(files, seed):
    from literal import LiteralARC

    g = np.random.default_rng(seed)
    nn, ns, dyn = int(g.integers(0, 4)), int(g.integers(0, 3)), int(g.integers(1, 9))
    cfg = retrieval_cfg(files, 40, dyn, nn, ns)
    pol = build_policy(cfg, 4, fallback_id=2, model=ModelContext(space=VocabSpace.build(V), eos_token_ids=(2,)))
    core = frequent_set(freq_ids(files / "freq.npz"), 40, [2])
    with np.load(files / "succ.npz") as f:
        succ = {int(r): [int(s) for s in row[:ns] if s >= 0] for r, row in zip(f["rows"], f["table"], strict=True)}
    rows = torch.tensor([3, 1])
    lit = [LiteralRetrieval(core, LiteralARC(dyn), nn, succ) for _ in rows]
    pol.on_reset(rows)
    pol.on_prefill(rows, torch.tensor([[5, 6], [7, 8]]), None)
    for _ in range(40):
        a = int(g.integers(1, 5))
        accepted = torch.tensor(g.integers(0, 120, (2, a)))  # a small range: hits, ghost hits and core ids
        accepted[1, int(g.integers(1, a + 1)) :] = -1
        vtopk = torch.tensor(g.integers(0, 150, (2, a, max(nn, 1))))
        pol.on_verify(rows, torch.zeros(2, 3, dtype=torch.long), vtopk if nn else None, accepted)
        for b, r in enumerate(rows.tolist()):
            acc = [t for t in accepted[b].tolist() if t >= 0]
            lit[b].verify(vtopk[b].tolist(), acc)
            assert pol.table.row(r) == lit[b].active()


def test_retrieval_set_is_core_plus_at_most_dynamic_size(files):
    pol = build_policy(retrieval_cfg(files, 40, 6), 3, fallback_id=2, model=ModelContext(space=VocabSpace.build(V)))
    assert pol.table.capacity == 46 and pol.verify_topk == 3
    rows = torch.tensor([1])
    for t in range(100, 140):
        pol.on_verify(rows, torch.tensor([[t]]), torch.tensor([[[t, t + 1, t + 2]]]), torch.tensor([[t]]))
        assert 40 <= int(pol.table.cnt[1]) <= 46


# --- all policies: lossless, replay, no host sync ----------------------------------------------


def all_configs(files):
    return {
        "frspec": {"policy": "static", "static": {"table": str(files / "freq.npz"), "size": 64}},
        "specvocab": {"policy": "lowrank", "lowrank": {"rank": 8, "topk": 48}},
        "dynaspec": {"policy": "cluster", "capacity": 64, "cluster": {"clusters": 16, "budget": [4, 2]}},
        "evospec": {
            "policy": "retrieval",
            "retrieval": {
                "table": str(files / "freq.npz"),
                "static_size": 32,
                "dynamic_size": 16,
                "graph": str(files / "succ.npz"),
            },
        },
        "hybrid": {
            "policy": "union",
            "capacity": 40,
            "members": [
                {"policy": "window", "capacity": 32},
                {"policy": "lowrank", "lowrank": {"rank": 8, "topk": 16}},
            ],
        },
    }


@pytest.mark.parametrize("config", ["frspec", "specvocab", "dynaspec", "evospec", "hybrid"])
@pytest.mark.parametrize(
    "shape", [DraftShape(steps=3), DraftShape(steps=3, topk=3, draft_tokens=7)], ids=["chain", "tree"]
)
def test_greedy_output_equals_target_only(files, cache, monkeypatch, config, shape):
    monkeypatch.setenv("SGLANG_SPECVOCAB_CACHE", str(cache))
    target = tiny_llama()
    t, d = CausalLM(target), CausalLM(target, num_layers=2)
    dec = SpeculativeDecoder(t, d, parse_config(all_configs(files)[config]), shape, eos_token_ids=[2])
    g = torch.Generator().manual_seed(4)
    for n in (6, 120):
        prompt = [1] + torch.randint(3, V, (n,), generator=g).tolist()
        gen = dec.generate(prompt, 24)
        assert gen.tokens == greedy_generate(t, prompt, 24, eos_token_ids=[2])
        assert all(0 <= r.in_set <= r.checked <= r.committed for r in gen.rounds)
        assert all(r.accepted <= r.in_set for r in gen.rounds)  # drafted tokens were in the set, by construction
        assert 0 < gen.coverage <= 1


def test_stepwise_coverage_checks_a_late_bonus_at_the_next_round(cache, monkeypatch):
    """An oracle draft accepts every step; its bonus tokens are checked one round later, all but the last."""
    monkeypatch.setenv("SGLANG_SPECVOCAB_CACHE", str(cache))
    m = tiny_llama()
    t = CausalLM(m)
    cfg = parse_config({"policy": "lowrank", "lowrank": {"rank": 64, "topk": 8}})  # full rank: exact ranking
    gen = SpeculativeDecoder(t, t, cfg, DraftShape(steps=3)).generate([1, 5, 6, 7], 40)
    assert all(r.accepted == 3 for r in gen.rounds[:-1])
    assert all(r.checked == r.committed == 4 == r.in_set for r in gen.rounds[:-2])
    assert gen.coverage == 1.0


def test_replay_runs_event_policies_and_refuses_rankers(files, tmp_path, capsys):
    import json

    from sglang_specvocab.tools.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text(
        json.dumps(
            {
                "prompt_ids": [1, 5, 6],
                "prompt_topk": [[5, 6, 7]] * 3,
                "rounds": [
                    {
                        "draft_tokens": [6, 300],
                        "verify_topk": [list(range(300, 308)), list(range(9, 17))],
                        "accepted": [300, 9],
                    }
                ],
            }
        )
        + "\n"
    )
    cfgs, out = all_configs(files), tmp_path / "o.jsonl"
    for name in ("frspec", "evospec"):
        (tmp_path / f"{name}.yaml").write_text(json.dumps(cfgs[name]))
        assert (
            main(["replay", "--config", str(tmp_path / f"{name}.yaml"), "--trace", str(trace), "--out", str(out)]) == 0
        )
        sets = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(sets) == 2
    new = set(sets[1]["ids"]) - set(sets[0]["ids"])  # evospec retrieved the last missed token and its neighbours
    assert {9, 10, 11}.issubset(new) and len(new) == 16
    (tmp_path / "specvocab.yaml").write_text(json.dumps(cfgs["specvocab"]))
    assert main(["replay", "--config", str(tmp_path / "specvocab.yaml"), "--trace", str(trace), "--out", str(out)]) == 2
    assert "needs the draft's LM head" in capsys.readouterr().err


def test_per_step_and_per_round_paths_never_read_tensors_on_the_host(files, cache):
    meta = dict(device="meta")
    rows = torch.tensor([1, 3], **meta)
    ids = lambda *s: torch.zeros(*s, dtype=torch.int64, **meta)
    w = torch.randn(V, 16)
    for name, data in all_configs(files).items():
        pol = build_policy(parse_config(data), 5, device="meta", fallback_id=2, model=model_ctx(w, cache))
        pol.on_reset(rows)
        pol.on_prefill(rows, ids(2, 10), ids(2, 10, 3))
        if pol.stepwise:
            for step in range(3):
                pol.select(rows, step, torch.zeros(2, 3, 16, **meta), ids(2, 3))
        pol.on_verify(rows, ids(2, 5), ids(2, 4, 8), ids(2, 4))
        assert pol.table.ids.device.type == "meta", name


@pytest.mark.parametrize("space", ["full", "d2t"])
def test_per_step_and_per_round_paths_capture_without_a_host_sync(files, cache, space):
    """The same paths on CPU tensors standing for device tensors, each under ``testing.graphs.capture`` (a ranker's
    ``select`` runs inside SGLang's captured draft graphs), which refuses data-dependent shapes and copies between
    host and device too, not all of which meta tensors show. ``d2t``: a draft head of 256 of the ids, in shuffled
    order (the rankers map their rows to target ids inside the step)."""
    from sglang_specvocab.tools.testing.graphs import capture

    g = torch.Generator().manual_seed(0)
    rows = torch.tensor([1, 3])
    ids = lambda *s: torch.randint(0, V, s, generator=g)
    w = torch.randn(V, 16, generator=g)
    model = model_ctx(w, cache)
    if space == "d2t":
        hot = torch.cat([torch.tensor([2]), torch.randperm(V - 3, generator=g)[:255] + 3])
        space = VocabSpace.build(V, head_ids=hot, eos_token_ids=(2,))
        model = ModelContext(weight=w[hot], space=space, eos_token_ids=(2,), cache_dir=cache)
    for name, data in all_configs(files).items():
        pol = build_policy(parse_config(data), 5, fallback_id=2, model=model)
        prompt, event = (ids(2, 10), ids(2, 10, 3)), (ids(2, 5), ids(2, 4, 8), ids(2, 4))
        steps = [(torch.randn(2, 3, 16, generator=g), ids(2, 3)) for _ in range(3)]
        capture(lambda pol=pol: pol.on_reset(rows))
        capture(lambda pol=pol, prompt=prompt: pol.on_prefill(rows, *prompt))
        if pol.stepwise:
            for step in range(3):
                capture(lambda pol=pol, step=step, steps=steps: pol.select(rows, step, *steps[step]))
        capture(lambda pol=pol, event=event: pol.on_verify(rows, *event))
        assert int(pol.table.cnt[1]) >= 1, name
        if space == "d2t":
            assert all(bool(space.mask[pol.table.row(r)].all()) for r in rows.tolist()), name  # only the draft's ids
