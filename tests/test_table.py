import pytest
import torch

from sglang_specvocab.table import CandidateTable, compact, unique_first


def test_new_table_rows_hold_the_fallback_set():
    t = CandidateTable(4, 6, fallback_id=7)
    assert t.ids.dtype == torch.int32 and t.cnt.dtype == torch.int32
    assert t.ids.shape == (4, 6)
    assert all(t.row(r) == [7] for r in range(4))


def test_assign_sorts_dedupes_and_pads_with_fallback_in_place():
    t = CandidateTable(3, 5, fallback_id=1)
    ids_ptr, cnt_ptr = t.ids.data_ptr(), t.cnt.data_ptr()
    t.assign(torch.tensor([2, 1]), torch.tensor([[9, 3, 9, -1, 3, 0], [-1, -1, -1, -1, -1, -1]]))
    assert t.row(2) == [0, 3, 9]
    assert t.ids[2].tolist() == [0, 3, 9, 1, 1]
    assert t.row(1) == [1]  # nothing valid: the fallback set, never an empty row
    assert t.row(0) == [1]  # untouched
    assert (t.ids.data_ptr(), t.cnt.data_ptr()) == (ids_ptr, cnt_ptr)


def test_reset_one_row_leaves_the_others():
    t = CandidateTable(3, 4)
    t.assign(torch.tensor([1, 2]), torch.tensor([[5, 6], [7, 8]]))
    t.reset(torch.tensor([1]))
    assert t.row(1) == [0] and t.row(2) == [7, 8]


def test_contains_matches_python_membership():
    t = CandidateTable(3, 8, fallback_id=4)
    t.assign(torch.tensor([1, 2]), torch.tensor([[10, 2, 30, -1], [5, 5, 5, 5]]))
    tokens = torch.tensor([[2, 3, 30, 4, -1, 10], [5, 4, 6, 0, 2**30, -3]])
    got = t.contains(torch.tensor([1, 2]), tokens)
    sets = [{10, 2, 30}, {5}]
    want = [[tok in sets[b] for tok in tokens[b].tolist()] for b in range(2)]
    assert got.tolist() == want


def test_unique_first_and_compact():
    x = torch.tensor([[3, 1, 3, -1, 2, 1], [-1, -1, 4, 4, 4, 0]])
    assert unique_first(x).tolist() == [[3, 1, 2, -1, -1, -1], [4, 0, -1, -1, -1, -1]]
    assert compact(x, x >= 2).tolist() == [[3, 3, 2, -1, -1, -1], [4, 4, 4, -1, -1, -1]]


@pytest.mark.parametrize(
    "kwargs,msg",
    [
        (dict(num_rows=0, capacity=4), "num_rows = 0"),
        (dict(num_rows=2, capacity=0), "capacity = 0"),
        (dict(num_rows=2, capacity=4, fallback_id=-1), "fallback_id = -1"),
    ],
)
def test_bad_table_arguments(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        CandidateTable(**kwargs)
