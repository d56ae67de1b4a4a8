"""``VocabSpace``: the draft vocabulary built once and handed whole to the head, the policies and the lab."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from sglang_specvocab.head import DraftHead, head_options
from sglang_specvocab.policies import ModelContext, build_policy, parse_config
from sglang_specvocab.table import CandidateTable
from sglang_specvocab.vocab import VocabSpace

PACKAGE = Path(__file__).resolve().parents[1] / "sglang_specvocab"


def test_a_d2t_space_maps_ids_to_rows_and_back():
    hot = torch.tensor([7, 2, 9, 4])  # rows not in id order, as a trained d2t map may be
    space = VocabSpace.build(12, head_ids=hot, eos_token_ids=(9, 11))
    assert space.d2t and space.head_rows == 4 and space.size == 12
    assert space.mask.tolist() == [i in {7, 2, 9, 4} for i in range(12)]
    assert space.row_map.tolist() == [-1, -1, 1, -1, 3, -1, -1, 0, -1, 2, -1, -1]
    assert space.row_ids(torch.tensor([[0, 3]])).tolist() == [[7, 4]]
    ids = torch.arange(-2, 14)
    want = [0 <= i < 12 and i in {7, 2, 9, 4} for i in ids.tolist()]
    assert space.contains(ids).tolist() == want
    assert space.fallback_id == 9  # the smallest EOS id the draft can score (11 has no head row)


def test_the_fallback_is_the_smallest_scorable_eos_else_the_first_id():
    assert VocabSpace.build(10, eos_token_ids=(8, 3)).fallback_id == 3
    assert VocabSpace.build(10).fallback_id == 0
    assert VocabSpace.build(10, head_ids=torch.tensor([5, 6]), eos_token_ids=(1,)).fallback_id == 5
    assert VocabSpace.build(10, eos_token_ids=(12,)).fallback_id == 0  # an EOS id past V is no token


def test_a_full_space_on_one_rank_is_the_identity():
    space = VocabSpace.build(6)
    assert not space.d2t and space.mask is None and space.row_map is None and space.head_rows == 6
    assert space.contains(torch.tensor([-1, 0, 5, 6])).tolist() == [False, True, True, False]


def test_a_shard_maps_only_this_ranks_rows():
    space = VocabSpace.build(8, shard=(4, 8), tp_size=2)
    assert space.row_map.tolist() == [-1, -1, -1, -1, 0, 1, 2, 3]
    hot = torch.tensor([6, 1, 3])  # d2t rows 0..2; this rank holds rows [1, 3)
    d2t = VocabSpace.build(8, head_ids=hot, shard=(1, 3), tp_size=2)
    assert d2t.row_map.tolist() == [-1, 0, -1, 1, -1, -1, -1, -1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"head_ids": torch.tensor([1, 10])}, "target ids in"),
        ({"head_ids": torch.tensor([1, 1])}, "distinct"),
        ({"head_ids": torch.tensor([], dtype=torch.long)}, "empty"),
        ({"head_ids": torch.tensor([1, 2]), "fallback_id": 3}, "fallback_id 3 is not in the draft vocabulary"),
        ({"fallback_id": 10}, "fallback_id 10 is not in the draft vocabulary"),
        ({"tp_size": 2}, "needs this rank's shard"),
    ],
)
def test_bad_spaces_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VocabSpace.build(10, **kwargs)


def test_the_head_and_the_policy_refuse_a_fallback_the_draft_cannot_score():
    space = VocabSpace.build(10, head_ids=torch.tensor([2, 3, 4]))
    table = CandidateTable(2, 2, fallback_id=7)
    with pytest.raises(ValueError, match="DraftHead: fallback_id 7 is not in the draft vocabulary"):
        DraftHead(torch.randn(3, 4), table, space, head_options(kernel="torch"))
    cfg = parse_config({"policy": "window", "capacity": 4})
    with pytest.raises(ValueError, match="build_policy: fallback_id 7 is not in the draft vocabulary"):
        build_policy(cfg, 2, fallback_id=7, model=ModelContext(space=space))
    policy = build_policy(cfg, 2, model=ModelContext(space=space))  # default: the space's own fallback
    assert policy.table.fallback_id == space.fallback_id == 2


def test_the_head_reads_a_d2t_draft_through_its_space():
    """A d2t head scores each set id with the head row the space maps it to: the logits equal hidden @ W[row].T."""
    g = torch.Generator().manual_seed(0)
    hot = torch.tensor([5, 1, 8, 3])
    space = VocabSpace.build(10, head_ids=hot)
    weight = torch.randn(4, 6, generator=g)
    table = CandidateTable(2, 3, fallback_id=space.fallback_id)
    table.assign(torch.tensor([1]), torch.tensor([[3, 8, 6]]))  # 6 has no head row: a dead column
    hidden = torch.randn(1, 6, generator=g)
    out = DraftHead(weight, table, space, head_options(kernel="torch", batch="per-request"))(hidden, torch.tensor([1]))
    ids = table.ids[1].tolist()
    rows = {int(h): j for j, h in enumerate(hot.tolist())}
    want = [float(hidden[0] @ weight[rows[i]]) if i in rows else float("-inf") for i in ids]
    torch.testing.assert_close(out.logits[0, : len(ids)], torch.tensor(want))


def _calls(name: str) -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                if (f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)) == name:
                    found.append(str(path.relative_to(PACKAGE)))
    return found


def test_the_draft_vocabulary_is_built_in_one_place():
    """The id -> head row map and the fallback check live in ``vocab.py`` alone: every other module gets a space."""
    assert set(_calls("head_row_map")) == {"vocab.py"}
    refusing = [
        str(p.relative_to(PACKAGE))
        for p in sorted(PACKAGE.rglob("*.py"))
        if "is not in the draft vocabulary" in p.read_text(encoding="utf-8")
    ]
    assert refusing == ["vocab.py"]
