"""Inputs of the logits ops shared by the CPU and GPU tests: runs of rows on one slot, dead columns, negative ids."""

import torch
from literal import runs_to_slots

# (run lengths, slots, W, d): tree branches (runs of 1..10 rows), runs around the kernels' 16- and 32-row
# pieces (up to 40), one slot for every row (a union table), single rows; W and d off every tile size
# (d = 33 and 3: element loads on a GPU).
RUN_CASES = {
    "branches": ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 6, 37, 40),
    "long_runs": ([40, 17, 16, 15, 33, 1, 32, 31], 5, 21, 33),
    "one_slot": ([40], 1, 70, 72),
    "singles": ([1] * 23, 9, 16, 3),
}


def runs_case(seed, dtype, lengths, R, W, d, V=97):
    """(hidden, weight, ids, cnt, row_to_slot) on the CPU: consecutive runs of ``lengths`` rows on R slots."""
    g = torch.Generator().manual_seed(seed)
    M = sum(lengths)
    hidden = torch.randn(M, d, generator=g).to(dtype)
    weight = torch.randn(V, d, generator=g).to(dtype)
    ids = torch.randint(0, V, (R, W), generator=g, dtype=torch.int32)
    ids[:, -1] = ids[:, 0]  # duplicate ids in a row
    neg = torch.rand(R, W, generator=g) < 0.2  # dead columns inside and past the count, any negative value
    ids[neg] = torch.tensor([-1, -(2**31)], dtype=torch.int32)[torch.randint(0, 2, (int(neg.sum()),), generator=g)]
    ids[0, :32] = -1  # whole 16- and 32-column tiles of dead ids inside the count
    cnt = torch.randint(1, W + 1, (R,), generator=g, dtype=torch.int32)
    cnt[0] = W
    cnt[-1] = 1 if R > 1 else W
    slot = torch.tensor(runs_to_slots(lengths, R, seed), dtype=torch.int32)
    return hidden, weight, ids, cnt, slot
