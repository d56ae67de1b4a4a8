"""Every backend of an op refuses the same bad inputs, naming the argument (the op's ``check_<op>`` for the torch
reference and Triton, the extension's TORCH_CHECKs for the C++ kernels), before it computes anything; the
candidate table's values only under the debug setting (otherwise they are read as -inf and counted:
test_bad_entries.py); valid arguments give the literal result on every backend."""

import re

import pytest
import torch
from literal import literal_pack_update, literal_table_reads

from sglang_specvocab.ops import _ext
from sglang_specvocab.ops.compact_topk import check_compact_topk, reference_compact_topk
from sglang_specvocab.ops.indexed_logits import (
    check_indexed_logits,
    check_packed_logits,
    reference_indexed_logits,
    reference_packed_logits,
    triton_indexed_logits,
    triton_packed_logits,
)
from sglang_specvocab.ops.pack_update import check_pack_update, reference_pack_update
from sglang_specvocab.ops.window_update import check_window_update, reference_window_update

# each op's argument check, torch reference and Triton wrapper, by op name
CHECK = {
    "indexed_logits": check_indexed_logits,
    "packed_logits": check_packed_logits,
    "window_update": check_window_update,
    "pack_update": check_pack_update,
    "compact_topk": check_compact_topk,
}
REFERENCE = {
    "indexed_logits": reference_indexed_logits,
    "packed_logits": reference_packed_logits,
    "window_update": reference_window_update,
    "pack_update": reference_pack_update,
    "compact_topk": reference_compact_topk,
}
TRITON = {"indexed_logits": triton_indexed_logits, "packed_logits": triton_packed_logits}

R, W, D, V, M = 3, 5, 8, 20, 4


def logits_args():
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(V, generator=g)[:W].sort().values for _ in range(R)]).to(torch.int32)
    return {
        "hidden": torch.randn(M, D, generator=g),
        "weight": torch.randn(V, D, generator=g),
        "ids": ids,
        "cnt": torch.tensor([1, W, 3], dtype=torch.int32),
        "row_to_slot": torch.tensor([0, 1, 1, 2], dtype=torch.int32),
    }


def packed_args():
    a = logits_args()
    return {
        "hidden": a["hidden"],
        "packed": a["weight"][a["ids"].long()],
        "cnt": a["cnt"],
        "row_to_slot": a["row_to_slot"],
    }


def window_args():
    return {
        "ring": torch.full((R, W + 1), -1, dtype=torch.int32),
        "length": torch.zeros(R, dtype=torch.int64),
        "ids": torch.zeros(R, W, dtype=torch.int32),
        "cnt": torch.ones(R, dtype=torch.int32),
        "rows": torch.tensor([2, 0]),
        "block": torch.tensor([[3, 4, -1], [5, 5, 6]], dtype=torch.int32),
        "fallback_id": 0,
        "vocab_size": V,
    }


def pack_args():
    a = logits_args()
    return {
        "packed": torch.zeros(R, W, D),
        "packed_ids": torch.full((R, W), -1, dtype=torch.int32),
        "weight": a["weight"],
        "ids": a["ids"],
        "cnt": a["cnt"],
        "rows": torch.tensor([0, 2]),
    }


def topk_args():
    g = torch.Generator().manual_seed(0)
    return {
        "logits": torch.randn(M, W, generator=g),
        "col_ids": torch.randint(0, V, (R, W), generator=g, dtype=torch.int32),
        "rows": torch.tensor([2, 0]),
        "k": 3,
        "fallback_id": 0,
        "mode": 2,
    }


BAD = {  # op -> (valid arguments, [(change, a phrase every backend's message has)])
    "indexed_logits": (logits_args, [
        ({"ids": lambda a: a["ids"].long()}, "ids must be int32"),
        ({"cnt": lambda a: a["cnt"].long()}, "cnt must be int32 [R=3]"),
        ({"cnt": lambda a: a["cnt"][:2]}, "cnt must be int32 [R=3]"),
        ({"row_to_slot": lambda a: a["row_to_slot"].float()}, "row_to_slot must be int32 or int64 [B] with B dividing M=4"),
        ({"row_to_slot": lambda a: a["row_to_slot"][:3]}, "row_to_slot must be int32 or int64 [B] with B dividing M=4"),
        ({"row_to_slot": lambda a: a["row_to_slot"][:0]}, "row_to_slot must be int32 or int64 [B] with B dividing M=4"),
        ({"hidden": lambda a: a["hidden"][None]}, "hidden must be [M, d]"),
        ({"weight": lambda a: a["weight"].half()}, "must equal hidden dtype"),
        ({"weight": lambda a: a["weight"][:, :7]}, "hidden has d=8 but weight has d=7"),
        ({"weight": lambda a: a["weight"][0]}, "weight must be [V, d]"),
        ({"hidden": lambda a: a["hidden"].long(), "weight": lambda a: a["weight"].long()}, "hidden dtype"),
    ]),
    "packed_logits": (packed_args, [
        ({"packed": lambda a: a["packed"][0]}, "packed must be [R, W, d]"),
        ({"packed": lambda a: a["packed"][:, :, :7]}, "hidden has d=8 but packed has d=7"),
        ({"packed": lambda a: a["packed"].half()}, "must equal hidden dtype"),
        ({"cnt": lambda a: a["cnt"].long()}, "cnt must be int32 [R=3]"),
        ({"row_to_slot": lambda a: a["row_to_slot"][:3]}, "row_to_slot must be int32 or int64 [B] with B dividing M=4"),
    ]),
    "window_update": (window_args, [
        ({"ids": lambda a: a["ids"].long()}, "int32 [R, capacity]"),
        ({"cnt": lambda a: a["cnt"][:2]}, "int32 [R=3]"),
        ({"ring": lambda a: a["ring"][:, : W - 1]}, "ring must be int32 [R=3, >= capacity=5]"),
        ({"length": lambda a: a["length"].int()}, "int64 [R=3]"),
        ({"rows": lambda a: a["rows"].int()}, "rows must be int64 [B]"),
        ({"block": lambda a: a["block"].long()}, "block must be int32 [B=2, n]"),
        ({"block": lambda a: a["block"][:1]}, "block must be int32 [B=2, n]"),
        ({"vocab_size": lambda a: 0}, "vocab_size = 0 must be in [1, 2^31]"),
        ({"fallback_id": lambda a: V}, "fallback_id = 20 must be a token id in [0, vocab_size=20)"),
        ({"rows": lambda a: torch.tensor([0, 3])}, "rows must be in [0, R=3), got rows[1] = 3"),
        ({"rows": lambda a: torch.tensor([1, 1])}, "rows must be distinct, got 1 twice (rows[0] and rows[1])"),
    ]),
    "pack_update": (pack_args, [
        ({"packed": lambda a: a["packed"][0]}, "packed must be [R, W, d]"),
        ({"weight": lambda a: a["weight"][:, :7]}, "packed has d=8 but weight has d=7"),
        ({"weight": lambda a: a["weight"].half()}, "must equal packed dtype"),
        ({"packed_ids": lambda a: a["packed_ids"].long()}, "packed_ids must be int32 [R=3, W=5]"),
        ({"ids": lambda a: a["ids"][:, :4]}, "ids must be int32 [R=3, W=5]"),
        ({"cnt": lambda a: a["cnt"][:2]}, "cnt must be int32 [R=3]"),
        ({"rows": lambda a: a["rows"].int()}, "rows must be int64 [B]"),
        ({"rows": lambda a: torch.tensor([0, 3])}, "rows must be in [0, R=3), got rows[1] = 3"),
        ({"rows": lambda a: torch.tensor([2, 2])}, "rows must be distinct, got 2 twice (rows[0] and rows[1])"),
        ({"cnt": lambda a: a["cnt"] * 0}, "cnt[rows] must be in [1, W=5]"),
        ({"ids": lambda a: a["ids"] + V}, "ids[rows, :cnt] must be in [0, V=20)"),
        ({"ids": lambda a: a["ids"].flip(1)}, "ids[rows, :cnt] must be strictly ascending"),
        ({"packed_ids": lambda a: a["packed_ids"] - 1}, "packed_ids[rows] must be live ids >= 0 followed by -1"),
    ]),
    "compact_topk": (topk_args, [
        ({"logits": lambda a: a["logits"].double()}, "logits must be float32 [N, W]"),
        ({"logits": lambda a: a["logits"][0]}, "logits must be float32 [N, W]"),
        ({"k": lambda a: 0}, "k = 0 must be in [1, min(16, W=5)]"),
        ({"k": lambda a: W + 1}, "k = 6 must be in [1, min(16, W=5)]"),
        ({"mode": lambda a: 3}, "mode = 3 must be 0 (values), 1 (log-probabilities) or 2 (probabilities)"),
        ({"col_ids": lambda a: a["col_ids"].float()}, "col_ids must be int32 or int64"),
        ({"col_ids": lambda a: a["col_ids"][:, :4]}, "col_ids must be [W=5] or [R, W=5]"),
        ({"rows": lambda a: None}, "a 2-D col_ids [R, W] needs rows"),
        ({"rows": lambda a: a["rows"].float()}, "rows must be int32 or int64 [bs]"),
        ({"rows": lambda a: torch.tensor([0, 1, 2])}, "4 logits rows do not split evenly over 3 requests"),
        # a row outside [0, R) is a request's bad slot, read as no token: test_bad_entries.py
    ]),
}  # fmt: skip
CASES = [(op, i) for op, (_, bad) in BAD.items() for i in range(len(bad))]
# The table's values: refused only under the debug setting, by every backend alike (a ValueError naming the op, the
# hidden row and the value); without it read as -inf and counted (test_bad_entries.py).
TABLE_BAD = {
    "indexed_logits": (logits_args, [
        ({"cnt": lambda a: a["cnt"] * 0}, "cnt must be in [1, W=5], got cnt[0] = 0 (the slot of hidden row 0)"),
        ({"cnt": lambda a: a["cnt"] + W}, "cnt must be in [1, W=5], got cnt[0] = 6 (the slot of hidden row 0)"),
        ({"row_to_slot": lambda a: a["row_to_slot"] + 1}, "row_to_slot must be in [0, R=3), got row_to_slot[3] = 3"),
        ({"ids": lambda a: a["ids"] + V}, "ids must be below V=20 (a negative id is a dead column), got ids[0, 0] = "),
    ]),
    "packed_logits": (packed_args, [
        ({"cnt": lambda a: a["cnt"] * 0}, "cnt must be in [1, W=5], got cnt[0] = 0 (the slot of hidden row 0)"),
        ({"row_to_slot": lambda a: a["row_to_slot"] - 1}, "row_to_slot must be in [0, R=3), got row_to_slot[0] = -1"),
    ]),
}  # fmt: skip
TABLE_CASES = [(op, i) for op, (_, bad) in TABLE_BAD.items() for i in range(len(bad))]


def backends(op: str):
    """(name, function, the exception it raises) of every backend of ``op`` that can run here."""
    out = [("torch", REFERENCE[op], ValueError)]
    if op in TRITON:
        out.append(("triton", TRITON[op], ValueError))  # refuses before any launch
    if _ext.available():
        out.append(("cuda", getattr(torch.ops.specvocab, op), RuntimeError))  # its C++ kernels on CPU tensors
    return out


@pytest.mark.parametrize("op, i", CASES, ids=[f"{op}-{BAD[op][1][i][1]}" for op, i in CASES])
def test_every_backend_refuses_the_same_bad_input(op, i):
    make, bad = BAD[op]
    change, phrase = bad[i]
    for name, fn, error in backends(op):
        args = make()
        args.update({k: f(args) for k, f in change.items()})
        with pytest.raises(error, match=re.escape(phrase)) as caught:
            fn(**args) if name != "cuda" else fn(*args.values())
        assert op in str(caught.value), (name, str(caught.value))


@pytest.mark.parametrize("op, i", CASES + [(op, -1 - i) for op, i in TABLE_CASES])
def test_what_the_server_calls_refuses_in_python_before_the_extension(op, i, request):
    """``ops.implementation`` (what the head, the policies and the public entries call) runs the op's Python check
    before the compiled op: every refusal is that ValueError and the extension is never entered, so no C++
    exception has to cross out of it (one crashed the process on the GPU machines: csrc/binding.cpp)."""
    from sglang_specvocab import ops
    from sglang_specvocab.tools.bench.host import LaunchCounter

    if not _ext.available():
        pytest.skip(_ext.reason())
    if i < 0:  # a table value: refused under the debug setting only
        make, bad = TABLE_BAD[op]
        change, phrase = bad[-1 - i]
        request.getfixturevalue("debug")
    else:
        make, bad = BAD[op]
        change, phrase = bad[i]
    args = make()
    args.update({k: f(args) for k, f in change.items()})
    fn = ops.implementation("cuda", "cpu", op)
    with LaunchCounter() as seen, pytest.raises(ValueError, match=re.escape(f"{op}: ") + ".*" + re.escape(phrase)):
        fn(*args.values())
    assert op not in seen.order


@pytest.mark.parametrize("op, i", TABLE_CASES, ids=[f"{op}-{TABLE_BAD[op][1][i][1]}" for op, i in TABLE_CASES])
def test_table_values_are_refused_alike_under_the_debug_setting(op, i, debug):
    make, bad = TABLE_BAD[op]
    change, phrase = bad[i]
    for _, fn, _ in backends(op):  # Triton refuses before any launch
        args = make()
        args.update({k: f(args) for k, f in change.items()})
        with pytest.raises(ValueError, match=re.escape(f"{op}: {phrase}")):
            fn(*args.values())


@pytest.mark.parametrize("op, i", TABLE_CASES, ids=[f"{op}-{TABLE_BAD[op][1][i][1]}" for op, i in TABLE_CASES])
def test_table_values_are_read_as_the_reference_without_it(op, i):
    make, bad = TABLE_BAD[op]
    args = make()
    args.update({k: f(args) for k, f in bad[i][0].items()})
    count = torch.zeros((), dtype=torch.int64)
    want = REFERENCE[op](*args.values(), bad=count)
    assert int(count) > 0  # read as table.head_reads says: -inf where a bad entry would give columns, and counted
    for name, fn, _ in backends(op):
        if name != "triton":  # interpreted in test_bad_entries.py
            got_count = torch.zeros((), dtype=torch.int64)
            got = fn(*args.values(), bad=got_count)
            assert torch.equal(torch.isneginf(got), torch.isneginf(want)) and int(got_count) == int(count), name
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # summation order differs


def expected(op: str, a: dict):
    """The literal result of ``op`` on ``a`` (the valid arguments): what every backend must return or leave."""
    if op == "indexed_logits":
        ids, weight = a["ids"], a["weight"]
        out, bad = literal_table_reads(a["hidden"], lambda s, j: weight[int(ids[s, j])], a["cnt"], a["row_to_slot"], W)
        assert bad == 0
        return out.float()
    if op == "packed_logits":
        packed = a["packed"]
        out, bad = literal_table_reads(a["hidden"], lambda s, j: packed[s, j], a["cnt"], a["row_to_slot"], W)
        assert bad == 0
        return out.float()
    if op == "window_update":  # rows [2, 0] append [3, 4] and [5, 5, 6] to empty rings
        ids, cnt = a["ids"].clone(), a["cnt"].clone()
        ids[2], ids[0] = torch.tensor([3, 4, 0, 0, 0]), torch.tensor([5, 6, 0, 0, 0])
        cnt[2], cnt[0] = 2, 2
        ring = a["ring"].clone()
        ring[2, :2], ring[0, :3] = torch.tensor([3, 4]), torch.tensor([5, 5, 6])
        return ring, torch.tensor([3, 0, 2]), ids, cnt
    if op == "pack_update":
        packed, packed_ids = a["packed"].clone(), a["packed_ids"].clone()
        literal_pack_update(packed, packed_ids, a["weight"], a["ids"], a["cnt"], a["rows"])
        return packed, packed_ids
    # compact_topk, mode 2: each request's rows (request-major) through its map row, probabilities
    logits, k = a["logits"], a["k"]
    lse = torch.logsumexp(logits, dim=1)
    values, cols = logits.topk(k, dim=1)
    maps = a["col_ids"].long()[a["rows"].repeat_interleave(logits.shape[0] // a["rows"].numel())]
    return torch.exp(values - lse[:, None]), maps.gather(1, cols), lse


def result(op: str, fn, a: dict):
    """What the backend's call returns, or for an in-place op the tensors it updates."""
    out = fn(*a.values())
    if op == "window_update":
        return a["ring"], a["length"], a["ids"], a["cnt"]
    if op == "pack_update":
        return a["packed"], a["packed_ids"]
    return out


@pytest.mark.parametrize("op", sorted(BAD))
def test_the_valid_arguments_pass_every_check_and_give_the_literal_result(op):
    make = BAD[op][0]
    CHECK[op](*make().values())
    want = expected(op, make())
    for name, fn, _ in backends(op):
        if name == "triton":  # Triton runs on GPU tensors (or under TRITON_INTERPRET=1, in test_triton_ops)
            continue
        got = result(op, fn, make())
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert g.dtype == w.dtype or op in ("indexed_logits", "packed_logits", "compact_topk"), (name, op)
            torch.testing.assert_close(g, w.to(g.dtype), rtol=1e-5, atol=1e-5, msg=f"{name} {op}")


def test_fp64_is_the_reference_oracle_alone():
    a = {k: (v.double() if v.is_floating_point() else v) for k, v in logits_args().items()}
    assert reference_indexed_logits(**a).dtype == torch.float32
    with pytest.raises(ValueError, match="hidden dtype torch.float64 must be one of bf16, fp16, fp32"):
        triton_indexed_logits(**a)
    if _ext.available():
        with pytest.raises(RuntimeError, match="bf16, fp16 or fp32"):
            torch.ops.specvocab.indexed_logits(*a.values())
