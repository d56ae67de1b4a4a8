"""A reduced (d2t) draft vocabulary: every policy's sets hold only ids the draft head has a row for.

Events full of ids outside the draft vocabulary (prompt ids and top-K, draft tokens, verified top-K,
committed tokens) and data files whose most frequent ids are outside it: each policy's sets equal its
literal reference fed the same events with those ids removed, no row is ever empty, and telemetry
counts only ids the head can score. Under TP, the dead-column rule never points past the table."""

import numpy as np
import pytest
import torch
from literal import LiteralARC, LiteralRetrieval, LiteralWindow, frequent_set, union_set

from sglang_specvocab.errors import ConfigError
from sglang_specvocab.integration.telemetry import Telemetry
from sglang_specvocab.policies import DraftVocabPolicy, ModelContext, build_policy, parse_config
from sglang_specvocab.vocab import VocabSpace
from sglang_specvocab.vocab_data import save_frequency_table, save_successors

V, EOS, FALLBACK = 96, 2, 5
ROWS = torch.tensor([3, 1])


@pytest.fixture(scope="module")
def hot():
    """The draft vocabulary: 32 ids, EOS not among them (its fallback is then another hot id)."""
    g = torch.Generator().manual_seed(0)
    others = [i for i in torch.randperm(V, generator=g).tolist() if i not in (EOS, FALLBACK)]
    return sorted([FALLBACK, *others[:31]])


@pytest.fixture(scope="module")
def files(tmp_path_factory, hot):
    """A frequency table whose most frequent ids are mostly NOT hot, and a successor graph over all ids."""
    d = tmp_path_factory.mktemp("d2t")
    g = np.random.default_rng(1)
    counts = g.integers(1, 50, V).astype(np.int64)
    cold = np.setdiff1d(np.arange(V), hot)
    counts[cold] += 1000  # every non-hot id outranks every hot one
    save_frequency_table(d / "freq.npz", counts, tokenizer="t", source="test")
    succ = g.integers(-1, V, (V, 4)).astype(np.int32)
    save_successors(d / "succ.npz", np.sort(succ, axis=1)[:, ::-1].copy(), tokenizer="t", source="test")
    return d


def context(hot):
    return ModelContext(space=VocabSpace.build(V, head_ids=hot, eos_token_ids=(EOS,)), eos_token_ids=(EOS,))


def hot_only(ids, hot):
    return [[t for t in row if t in hot] for row in ids]


def holes(ids, hot):
    return [t if t in hot else -1 for t in ids]


def assert_rows_hot(pol, hot):
    for r in range(pol.table.num_rows):
        row = pol.table.row(r)
        assert row and set(row) <= set(hot), (r, row)  # never empty, never an id without a head row


def window_events(g, n_rounds, k=3):
    """Random prefill and verify events over the whole vocabulary (most ids are not hot)."""
    prompt = torch.randint(0, V, (2, 9), generator=g)
    ptopk = torch.randint(0, V, (2, 9, k), generator=g)
    rounds = [
        (torch.randint(0, V, (2, 5), generator=g), torch.randint(0, V, (2, 3, k), generator=g)) for _ in range(n_rounds)
    ]
    return prompt, ptopk, rounds


def test_window_sets_are_the_literal_window_over_hot_ids(hot):
    cfg = parse_config({"policy": "window", "capacity": 10, "window": {"prefill_topk": 3, "verify_topk": 3}})
    pol = build_policy(cfg, 5, fallback_id=FALLBACK, model=context(hot))
    assert isinstance(pol, DraftVocabPolicy) and pol.prefill_topk == 3 and pol.ring.shape == (5, 11)
    g = torch.Generator().manual_seed(2)
    prompt, ptopk, rounds = window_events(g, 12)
    lit = [LiteralWindow(10, 3, 3, ["context", "extension"], fallback=FALLBACK) for _ in ROWS]
    pol.on_reset(ROWS)
    pol.on_prefill(ROWS, prompt, ptopk)
    for b, r in enumerate(ROWS.tolist()):
        lit[b].prefill(hot_only([prompt[b].tolist()], hot)[0], hot_only(ptopk[b].tolist(), hot))
        assert pol.table.row(r) == lit[b].active()
    for drafts, vtopk in rounds:
        pol.on_verify(ROWS, drafts, vtopk, drafts[:, :2])
        for b, r in enumerate(ROWS.tolist()):
            lit[b].verify(hot_only([drafts[b].tolist()], hot)[0], hot_only(vtopk[b].tolist(), hot))
            assert pol.table.row(r) == lit[b].active()
    assert_rows_hot(pol, hot)
    # a prefill of only non-hot ids leaves the fallback set, never an empty row
    cold = torch.tensor([[t for t in range(V) if t not in hot][:4]] * 2)
    pol.on_reset(ROWS)
    pol.on_prefill(ROWS, cold, cold[:, :, None].expand(2, 4, 3))
    assert all(pol.table.row(r) == [FALLBACK] for r in ROWS.tolist())


def test_static_retrieval_and_union_hold_only_hot_ids(files, hot):
    ctx = context(hot)
    freq = np.load(files / "freq.npz")["ids"].tolist()
    hot_freq = [t for t in freq if t in hot]
    static = parse_config({"policy": "static", "static": {"table": str(files / "freq.npz"), "size": 6}})
    pol = build_policy(static, 4, fallback_id=FALLBACK, model=ctx)
    # the most frequent HOT ids; EOS is not hot, so the fallback id is forced in instead
    want = frequent_set(hot_freq, 6, [FALLBACK])
    assert all(pol.table.row(r) == want for r in range(4))

    nn, ns, dyn = 3, 2, 5
    cfg = parse_config(
        {
            "policy": "retrieval",
            "retrieval": {
                "table": str(files / "freq.npz"),
                "static_size": 4,
                "dynamic_size": dyn,
                "neighbours": nn,
                "graph": str(files / "succ.npz"),
                "successors": ns,
            },
        }
    )
    ret = build_policy(cfg, 4, fallback_id=FALLBACK, model=ctx)
    core = frequent_set(hot_freq, 4, [FALLBACK])
    with np.load(files / "succ.npz") as f:
        succ = {
            int(r): [s for s in holes([int(s) for s in row[:ns] if s >= 0], hot) if s >= 0]
            for r, row in zip(f["rows"], f["table"], strict=True)
        }
    lit = [LiteralRetrieval(core, LiteralARC(dyn), nn, succ) for _ in ROWS]
    g = torch.Generator().manual_seed(3)
    ret.on_reset(ROWS)
    for _ in range(30):
        accepted = torch.randint(0, V, (2, 3), generator=g)
        vtopk = torch.randint(0, V, (2, 3, nn), generator=g)
        ret.on_verify(ROWS, accepted, vtopk, accepted)
        for b, r in enumerate(ROWS.tolist()):
            vt = [holes(p, hot) for p in vtopk[b].tolist()]
            lit[b].verify(vt, holes(accepted[b].tolist(), hot))
            assert ret.table.row(r) == lit[b].active()
    assert_rows_hot(ret, hot)

    # a union's budgets go to hot ids only: members built with the same draft vocabulary
    union = parse_config(
        {
            "policy": "union",
            "capacity": 12,
            "members": [
                {"policy": "window", "capacity": 8, "window": {"prefill_topk": 2, "verify_topk": 2}},
                {"policy": "static", "static": {"table": str(files / "freq.npz"), "size": 6}},
            ],
        }
    )
    upol = build_policy(union, 4, fallback_id=FALLBACK, model=ctx)
    prompt, ptopk, rounds = window_events(torch.Generator().manual_seed(4), 6, k=2)
    upol.on_reset(ROWS)
    upol.on_prefill(ROWS, prompt, ptopk)
    for drafts, vtopk in rounds:
        upol.on_verify(ROWS, drafts, vtopk, drafts[:, :2])
    for r in ROWS.tolist():
        assert upol.table.row(r) == union_set([upol.members[0].table.row(r), want], 12)
    assert_rows_hot(upol, hot)


def test_stepwise_select_gets_hot_input_tokens(hot):
    seen = []

    class Recorder:
        config, table, model, name, dense, stepwise = None, None, context(hot), "rec", False, True
        prefill_topk = verify_topk = 0

        def select(self, rows, step, hidden, tokens):
            seen.append(tokens.clone())

    pol = DraftVocabPolicy(Recorder())
    tokens = torch.tensor([[hot[0], EOS], [V - 1 if V - 1 not in hot else hot[1], hot[2]]])
    pol.select(ROWS, 0, torch.zeros(2, 2, 4), tokens)
    assert seen[0].tolist() == [holes(row, hot) for row in tokens.tolist()]


def test_telemetry_counts_only_hot_set_ids(hot):
    cfg = parse_config({"policy": "window", "capacity": 8, "window": {"prefill_topk": 2, "verify_topk": 2}})
    pol = build_policy(cfg, 4, fallback_id=FALLBACK, model=context(hot))
    prompt = torch.tensor([list(range(V))[:8]])  # mostly non-hot ids
    pol.on_reset(ROWS[:1])
    pol.on_prefill(ROWS[:1], prompt, None if not pol.prefill_topk else torch.full((1, 8, 2), -1))
    t = Telemetry(4)
    t.record_verify(pol.table, ROWS[:1], torch.tensor([[hot[0], EOS]]))
    size, _ = t.summary(int(ROWS[0]))
    assert size == len([i for i in range(8) if i in hot] or [FALLBACK])


def test_build_refuses_a_fallback_outside_the_draft_vocabulary(hot):
    cfg = parse_config({"policy": "window", "capacity": 8})
    with pytest.raises(ValueError, match=f"fallback_id {EOS} is not in the draft vocabulary"):
        build_policy(cfg, 4, fallback_id=EOS, model=context(hot))


# --- stepwise policies rank the draft head's rows -------------------------------------------------------


def d2t_context(head_ids, weight, **kw):
    """A d2t draft: head row j scores target id head_ids[j] (a shuffled order: rows are not in id order)."""
    space = VocabSpace.build(V, head_ids=head_ids, eos_token_ids=(EOS,))
    return ModelContext(weight=weight, space=space, eos_token_ids=(EOS,), **kw)


def test_lowrank_ranks_head_rows_and_writes_their_target_ids(hot, tmp_path):
    g = torch.Generator().manual_seed(3)
    head_ids = torch.tensor(hot)[torch.randperm(len(hot), generator=g)]
    d, r, topk = 6, 3, 5
    w_down, w_vocab = torch.randn(r, d, generator=g), torch.randn(len(hot), r, generator=g)
    torch.save({"w_down": w_down, "w_vocab": w_vocab}, tmp_path / "ranker.pt")
    cfg = parse_config(
        {"policy": "lowrank", "lowrank": {"rank": r, "topk": topk, "ranker": str(tmp_path / "ranker.pt")}}
    )
    weight = torch.randn(len(hot), d, generator=g)
    pol = build_policy(cfg, 4, fallback_id=FALLBACK, model=d2t_context(head_ids, weight))
    hidden = torch.randn(2, 3, d, generator=g)  # 2 requests, 3 beams
    pol.select(ROWS, 1, hidden, torch.full((2, 3), hot[0]))
    for b, row in enumerate(ROWS.tolist()):
        scores = [max(float(h @ w_down.T @ w_vocab[j]) for h in hidden[b]) for j in range(len(hot))]
        best = sorted(range(len(hot)), key=lambda j: -scores[j])[:topk]  # head rows, best first
        assert sorted(pol.table.row(row)) == sorted(int(head_ids[j]) for j in best)


def test_lowrank_refuses_more_ids_a_step_than_head_rows(hot):
    cfg = parse_config({"policy": "lowrank", "lowrank": {"rank": 2, "topk": len(hot) + 1}})
    weight = torch.randn(len(hot), 4)
    with pytest.raises(
        ConfigError, match=f"lowrank.topk = {len(hot) + 1} is invalid: must be at most the draft head's {len(hot)} rows"
    ):
        build_policy(cfg, 2, fallback_id=FALLBACK, model=d2t_context(torch.tensor(hot), weight))


def test_cluster_partitions_the_draft_vocabulary_in_target_ids(hot, tmp_path):
    g = torch.Generator().manual_seed(4)
    head_ids = torch.tensor(hot)[torch.randperm(len(hot), generator=g)]
    weight = torch.randn(len(hot), 8, generator=g)
    cfg = parse_config({"policy": "cluster", "capacity": 12, "cluster": {"clusters": 4, "budget": [2, 1]}})
    ctx = d2t_context(head_ids, weight, cache_dir=tmp_path)
    pol = build_policy(cfg, 4, fallback_id=FALLBACK, model=ctx)
    assert sorted(pol.perm.tolist()) == hot  # every head row once, as its target id
    pol.select(ROWS, 0, torch.randn(2, 2, 8, generator=g), torch.zeros(2, 2, dtype=torch.long))
    for row in ROWS.tolist():
        ids = pol.table.row(row)
        assert ids and set(ids) <= set(hot)


def test_a_sharded_head_is_ranked_whole_on_every_rank(tmp_path):
    """Two ranks, each holding an equal padded slice of a 10-row head (SGLang's ParallelLMHead: 10 -> 12 rows):
    ``head_weight`` is the whole head without padding on each, so the SVD ranker and its sets are TP 1's."""
    g = torch.Generator().manual_seed(5)
    whole = torch.randn(10, 6, generator=g)
    padded = torch.cat([whole, torch.zeros(2, 6)])
    shards = padded.chunk(2)
    cfg = parse_config({"policy": "lowrank", "lowrank": {"rank": 3, "topk": 4}})
    hidden = torch.randn(2, 2, 6, generator=g)
    sets = []
    for weight, gather in (
        (whole, None),
        (shards[0], lambda p: torch.cat(shards)),
        (shards[1], lambda p: torch.cat(shards)),
    ):
        ctx = ModelContext(
            weight=weight, space=VocabSpace.build(10), gather_weight=gather, cache_dir=tmp_path / str(len(sets))
        )
        assert torch.equal(ctx.head_weight(), whole)
        pol = build_policy(cfg, 4, model=ctx)
        pol.select(ROWS, 0, hidden, torch.zeros(2, 2, dtype=torch.long))
        sets.append([pol.table.row(r) for r in ROWS.tolist()])
        assert all(0 <= i < 10 for s in sets[-1] for i in s)  # never a padding row
    assert sets[0] == sets[1] == sets[2]
