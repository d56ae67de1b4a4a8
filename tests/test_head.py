"""The head's torch reference: the definition the kernels are tested against."""

import pytest
import torch
from literal import literal_logits

from sglang_specvocab.head import DraftHead
from sglang_specvocab.ops import compact_topk, indexed_logits
from sglang_specvocab.table import CandidateTable


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_indexed_logits_matches_naive_loop(dtype):
    g = torch.Generator().manual_seed(0)
    V, d, R, W, M = 300, 24, 5, 37, 9
    weight = torch.randn(V, d, generator=g).to(dtype)
    hidden = torch.randn(M, d, generator=g).to(dtype)
    ids = torch.randint(0, V, (R, W), generator=g, dtype=torch.int32)
    ids[1, :5] = 7  # duplicate ids are allowed
    ids[3, 2:9:3] = -1  # negative ids are dead columns
    ids[2, 6:] = -5  # (also past the count)
    cnt = torch.tensor([1, W, 5, 17, 2], dtype=torch.int32)
    row_to_slot = torch.tensor([0, 1, 1, 2, 3, 3, 3, 4, 1], dtype=torch.int32)  # rows share slots
    got = indexed_logits(hidden, weight, ids, cnt, row_to_slot)
    want = literal_logits(hidden, weight, ids, cnt, row_to_slot).float()
    assert got.dtype == torch.float32 and got.shape == (M, W)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    live = ~torch.isinf(want)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert torch.allclose(got[live], want[live], rtol=tol, atol=tol)


@pytest.mark.parametrize("args,msg", [
    (dict(hidden=torch.zeros(2, 3, 4)), "hidden must be \\[M, d\\]"),
    (dict(weight=torch.zeros(10, 5)), "hidden has d=4 but weight has d=5"),
    (dict(weight=torch.zeros(10, 4, dtype=torch.float16)), "weight dtype torch.float16 must equal hidden dtype"),
    (dict(hidden=torch.zeros(2, 4, dtype=torch.int32), weight=torch.zeros(10, 4, dtype=torch.int32)), "hidden dtype torch.int32"),
    (dict(ids=torch.zeros(3, 6, dtype=torch.int64)), "ids must be int32"),
    (dict(cnt=torch.ones(2, dtype=torch.int32)), "cnt must be int32 \\[R=3\\]"),
    (dict(row_to_slot=torch.zeros(3, dtype=torch.int32)), "row_to_slot must be int32 \\[M=2\\]"),
    (dict(cnt=torch.tensor([1, 0, 1], dtype=torch.int32)), "cnt must be in \\[1, W=6\\]"),
    (dict(cnt=torch.tensor([1, 7, 1], dtype=torch.int32)), "cnt must be in \\[1, W=6\\]"),
    (dict(ids=torch.full((3, 6), 10, dtype=torch.int32)), "ids must be below V=10"),
    (dict(row_to_slot=torch.tensor([0, 3], dtype=torch.int32)), "row_to_slot must be in \\[0, R=3\\)"),
])
def test_indexed_logits_refuses_bad_input(args, msg):
    base = dict(hidden=torch.zeros(2, 4), weight=torch.zeros(10, 4), ids=torch.zeros(3, 6, dtype=torch.int32),
                cnt=torch.ones(3, dtype=torch.int32), row_to_slot=torch.zeros(2, dtype=torch.int32))
    base.update(args)
    with pytest.raises(ValueError, match="indexed_logits: " + msg):
        indexed_logits(**base)


def test_compact_topk_returns_token_ids_and_breaks_ties_by_column():
    ids = torch.tensor([[0, 0, 0, 0], [40, 10, 30, 20]], dtype=torch.int32)
    logits = torch.tensor([[1.0, 5.0, 5.0, 2.0], [0.5, 3.0, float("-inf"), float("-inf")]])
    values, tokens = compact_topk(logits, ids, torch.tensor([1, 1], dtype=torch.int32), 3)
    assert tokens.tolist() == [[10, 30, 20], [10, 40, 30]]
    assert values[0].tolist() == [5.0, 5.0, 2.0] and values[1, 2] == float("-inf")
    with pytest.raises(ValueError, match="k = 5 must be in \\[1, W=4\\]"):
        compact_topk(logits, ids, torch.tensor([1, 1], dtype=torch.int32), 5)


def test_head_topk_is_the_best_of_each_rows_set():
    g = torch.Generator().manual_seed(1)
    V, d = 500, 16
    weight = torch.randn(V, d, generator=g)
    table = CandidateTable(4, 50)
    sets = {1: torch.randperm(V, generator=g)[:50], 2: torch.randperm(V, generator=g)[:3], 3: torch.tensor([9])}
    for r, s in sets.items():
        table.assign(torch.tensor([r]), s[None])
    hidden = torch.randn(6, d, generator=g)
    slots = torch.tensor([1, 1, 2, 3, 2, 1])
    _values, tokens = DraftHead(weight, table)(hidden, slots).topk(1)
    for m in range(6):
        s = sets[int(slots[m])]
        best = s[(weight[s] @ hidden[m]).argmax()]
        assert int(tokens[m, 0]) == int(best)


def test_dense_head_is_the_full_matmul_and_softcap_is_monotonic():
    g = torch.Generator().manual_seed(2)
    weight, hidden = torch.randn(100, 8, generator=g), torch.randn(3, 8, generator=g)
    plain = DraftHead(weight, None)(hidden, torch.zeros(3, dtype=torch.int32))
    assert torch.allclose(plain.logits, hidden @ weight.T)
    capped = DraftHead(weight, None, logit_softcap=2.0)(hidden, torch.zeros(3, dtype=torch.int32))
    assert capped.logits.abs().max() <= 2.0
    assert torch.equal(capped.topk(5)[1], plain.topk(5)[1])
