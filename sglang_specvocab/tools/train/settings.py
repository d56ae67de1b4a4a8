"""``train-eagle3``'s options as one typed object: read from the command line once (``from_args``, at the CLI's
edge), then handed to the command's steps (``command.py``) and its data builders (``train.py``). The defaults are
the command line's (``cli/train.py`` documents each option)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..options import FromArgs


@dataclass
class TrainEagle3(FromArgs):
    command: str = "train-eagle3"
    # the target, the draft vocabulary and the data
    target: str = "gemma3-270m"
    out: str | None = None  # None: the package cache's drafts/ folder (settled by the command)
    head: str = "d2t"
    draft_vocab: int = 32768
    freq: str = "auto"
    source: str = "sharegpt"
    data: str | None = None
    val_data: str | None = None
    prepare_data: bool = False
    states: str | None = None
    resume_state: str | None = None
    conversations: int = 2000
    skip: int = 1000
    prompt_tokens: int = 512
    max_new_tokens: int = 256
    gen_batch_size: int = 32
    val: int = 32
    val_new_tokens: int = 128
    # the optimisation
    val_every: int = 250
    steps: int = 2000
    batch_size: int = 8
    lr: float = 3e-4
    warmup: int | None = None
    lr_floor: float = 0.1
    step_weight: float = 1.0
    fc_norm: bool = False
    time_budget_s: float | None = None
    loss_vocab: int = 32768
    init: str = "target"
    init_from: str | None = None
    seq_len: int = 1024
    ttt_steps: int = 5
    aux_layer_ids: list[int] | None = None
    seed: int = 0
    # where and how
    device: str = "auto"  # settled to cuda or cpu by the command
    dtype: str = "auto"
    train_dtype: str = "bfloat16"
    save_dtype: str = "bfloat16"
    log_every: int = 100
    command_line: str | None = None
    started: float | None = None  # the command's start (perf_counter): --time-budget-s counts from it

    def record(self) -> dict:
        """The options as ``training.json`` keeps them (the start time apart)."""
        return {k: v for k, v in asdict(self).items() if k != "started"}


__all__ = ["TrainEagle3"]
