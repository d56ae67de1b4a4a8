"""Tiny random checkpoints for tests that need real files on disk: a Llama target with an offline
tokenizer and two EAGLE-3 drafts for it, in the format the pinned SGLang loads.

:func:`make_tiny_checkpoints` writes, under ``out``:

- ``target/``: a random ``LlamaForCausalLM`` (``TARGET_SHAPE``: 4 layers, hidden 64, a real-size
  vocabulary, default 128256 like Llama-3), ``tie_word_embeddings: false`` (what Llama-3-8B
  has, and what SGLang's EAGLE-3 worker expects when a draft borrows the target's LM head:
  ``set_embed_and_head`` hands the draft the target's separate ``lm_head``), saved as bf16
  ``model.safetensors`` + ``config.json`` + ``generation_config.json``, and a tokenizer built
  locally (:func:`build_tokenizer`): byte-level BPE whose 256 byte symbols cover any text, no
  merges, filler tokens up to the vocabulary size, bos/eos/pad, and a minimal chat template;
- ``draft-d2t/``: an EAGLE-3 draft (``LlamaForCausalLMEagle3``) with its own 32768-token head
  and ``d2t``/``t2d``; the hot ids (:func:`hot_ids`) are the special and byte tokens (ids
  ``0 .. NUM_FIXED-1``, so the draft can propose EOS and spell any text) plus a seeded random
  sample of the filler ids, sorted; ``d2t`` is therefore non-trivial (not all zeros);
- ``draft-full/``: an EAGLE-3 draft over the full vocabulary with ``draft_vocab_size: null``:
  no ``lm_head.weight`` in the file, SGLang binds the target's LM head at load time
  (``load_lm_head_from_target``), which costs no memory and is what a full-vocabulary draft
  ships as (e.g. ``nvidia/gpt-oss-120b-Eagle3``).

Both drafts have the target's hidden size (so SGLang shares the target's embedding) and
``eagle_config.eagle_aux_hidden_state_layer_ids`` set explicitly to distinct ids
(:func:`tiny_capture_layers`): SGLang's default ``[2, n//2, n-3]`` repeats or goes out of range
for ``n <= 6`` layers. The draft weights are random (:func:`sglang_specvocab.tools.train.model.build_draft`;
the d2t head starts at the target's rows of the hot ids). Everything is a function of ``seed``:
the same seed gives byte-identical files (with the same transformers, whose
version the configs record).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...errors import SpecVocabError
from ..train.checkpoint import save_checkpoint
from ..train.model import Eagle3Config, build_draft, check_capture_layers

TARGET_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
)
DRAFT_VOCAB = 32768
SPECIAL_TOKENS = ("<|pad|>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot|>")
PAD_ID, BOS_ID, EOS_ID, EOT_ID = range(len(SPECIAL_TOKENS))
NUM_FIXED = len(SPECIAL_TOKENS) + 256  # specials, then the 256 byte-level symbols
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|eot|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SUBDIRS = ("target", "draft-d2t", "draft-full")


@dataclass
class TinyCheckpoints:
    root: Path
    target: Path
    draft_d2t: Path
    draft_full: Path
    vocab_size: int
    draft_vocab_size: int
    capture_layers: list[int]
    sizes: dict[str, int] = field(default_factory=dict)  # relative file path -> bytes

    def summary(self) -> str:
        lines = [
            (
                f"tiny checkpoints in {self.root} (vocab {self.vocab_size}, d2t draft vocab {self.draft_vocab_size}, "
                f"aux hidden state layer ids {[i - 1 for i in self.capture_layers]})"
            )
        ]
        for sub in SUBDIRS:
            files = {k: v for k, v in self.sizes.items() if k.split("/")[0] == sub}
            lines.append(f"  {sub}/  ({_human(sum(files.values()))})")
            lines += [f"    {k.split('/', 1)[1]:<28} {_human(v):>10}" for k, v in sorted(files.items())]
        return "\n".join(lines)


def _human(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} GiB"


def tiny_capture_layers(num_layers: int) -> list[int]:
    """Three distinct capture layers for a small target: ``[1, n//2, n-1]`` (the hidden states
    entering those layers; the config stores them minus one, as SGLang adds one back)."""
    if num_layers < 4:
        raise SpecVocabError(
            f"a tiny EAGLE-3 target needs at least 4 layers for 3 distinct capture layers, got {num_layers}"
        )
    return check_capture_layers([1, num_layers // 2, num_layers - 1], num_layers)


def hot_ids(vocab_size: int, draft_vocab_size: int, seed: int) -> torch.Tensor:
    """The d2t draft's target ids, ascending: ``0 .. NUM_FIXED-1`` (specials and bytes) and a
    seeded random sample of ``draft_vocab_size - NUM_FIXED`` of the other ids."""
    if not NUM_FIXED <= draft_vocab_size < vocab_size:
        raise SpecVocabError(
            f"draft vocabulary size {draft_vocab_size} is invalid for a {vocab_size}-token vocabulary: "
            f"must be in [{NUM_FIXED}, {vocab_size - 1}]"
        )
    g = torch.Generator().manual_seed(seed + 1)
    rest = torch.randperm(vocab_size - NUM_FIXED, generator=g)[: draft_vocab_size - NUM_FIXED] + NUM_FIXED
    return torch.cat([torch.arange(NUM_FIXED), rest.sort().values]).to(torch.int64)


def build_tokenizer(vocab_size: int):
    """A ``PreTrainedTokenizerFast`` of exactly ``vocab_size`` tokens, built without the hub:
    byte-level BPE with no merges (text becomes one token per byte, and decodes back), the
    specials first, then the bytes, then filler tokens ``tok<i>`` that only generation produces."""
    # heavy: tokenizers, only to build checkpoints
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast  # heavy: transformers

    if vocab_size < NUM_FIXED + 1:
        raise SpecVocabError(f"vocabulary size {vocab_size} is too small: at least {NUM_FIXED + 1}")
    symbols = byte_symbols()
    if set(symbols) != set(pre_tokenizers.ByteLevel.alphabet()):
        raise AssertionError("byte-level alphabet mismatch")
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    vocab.update({s: len(SPECIAL_TOKENS) + i for i, s in enumerate(symbols)})
    vocab.update({f"tok{i}": i for i in range(NUM_FIXED, vocab_size)})
    assert len(vocab) == vocab_size
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    bos = SPECIAL_TOKENS[BOS_ID]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, BOS_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=SPECIAL_TOKENS[EOS_ID],
        pad_token=SPECIAL_TOKENS[PAD_ID],
        chat_template=CHAT_TEMPLATE,
        model_max_length=TARGET_SHAPE["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )


def byte_symbols() -> list[str]:
    """GPT-2's byte-level symbol of every byte 0..255 (what ``ByteLevel`` pre-tokenization emits)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def build_target(vocab_size: int, seed: int):
    """The random target (float32 in memory; saved as bf16)."""
    from transformers import LlamaConfig, LlamaForCausalLM  # heavy: transformers

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        **TARGET_SHAPE,
        hidden_act="silu",
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        initializer_range=0.2,  # spread-out logits: greedy decoding is not one repeated token
        tie_word_embeddings=False,
        bos_token_id=BOS_ID,
        eos_token_id=[EOS_ID, EOT_ID],
        pad_token_id=PAD_ID,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def make_tiny_checkpoints(
    out: str | Path,
    vocab_size: int = 128256,
    seed: int = 0,
    *,
    force: bool = False,
    draft_vocab_size: int = DRAFT_VOCAB,
    dtype: torch.dtype = torch.bfloat16,
) -> TinyCheckpoints:
    """Write ``out/target``, ``out/draft-d2t`` and ``out/draft-full`` (see the module docstring).

    Refuses a non-empty ``out`` unless ``force`` (which removes only the three sub-folders)."""
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise SpecVocabError(f"{root} exists and is not a directory")
    if root.exists() and any(root.iterdir()):
        if not force:
            raise SpecVocabError(f"{root} is not empty; pass --force (force=True) to overwrite")
        for sub in SUBDIRS:
            shutil.rmtree(root / sub, ignore_errors=True)
    hot = hot_ids(vocab_size, draft_vocab_size, seed)  # validates the sizes before any work
    layers = tiny_capture_layers(TARGET_SHAPE["num_hidden_layers"])

    target = build_target(vocab_size, seed)
    tdir = root / "target"
    target.to(dtype).save_pretrained(tdir, safe_serialization=True)
    target.float()
    build_tokenizer(vocab_size).save_pretrained(tdir)

    for name, dv, hot_sel, draft_seed in (
        ("draft-d2t", draft_vocab_size, hot, seed + 2),
        ("draft-full", None, None, seed + 3),
    ):
        cfg = Eagle3Config.for_target(target, draft_vocab_size=dv, capture_layers=layers)
        draft = build_draft(target, cfg, hot_sel, seed=draft_seed)
        save_checkpoint(draft, root / name, dtype)

    sizes = {
        str(p.relative_to(root)): p.stat().st_size
        for sub in SUBDIRS
        for p in sorted((root / sub).rglob("*"))
        if p.is_file()
    }
    return TinyCheckpoints(
        root=root,
        target=tdir,
        draft_d2t=root / "draft-d2t",
        draft_full=root / "draft-full",
        vocab_size=vocab_size,
        draft_vocab_size=draft_vocab_size,
        capture_layers=layers,
        sizes=sizes,
    )
