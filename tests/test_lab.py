"""The lab end to end on a tiny local checkpoint (a trained BPE tokenizer + a random Llama)."""

import json

import pytest
import torch
from helpers import tiny_llama

from sglang_specvocab.cli import main
from sglang_specvocab.prompts import format_prompt, load_questions


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from sglang_specvocab.prompts import load_questions

    corpus = [t for q in load_questions() for t in q.turns] * 3
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<s>", "</s>", "<unk>"])
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    path = tmp_path_factory.mktemp("tiny-ckpt")
    fast.save_pretrained(path)
    model = tiny_llama(vocab_size=len(fast), dtype=torch.float32)
    model.save_pretrained(path)
    return path


def test_lab_writes_table_json_markdown_and_plot(tiny_checkpoint, tmp_path, capsys):
    cfg = tmp_path / "small-window.yaml"
    cfg.write_text("policy: window\ncapacity: 64\n")
    out = tmp_path / "out"
    rc = main(
        [
            "lab",
            "--config",
            str(cfg),
            "--model",
            str(tiny_checkpoint),
            "--draft-layers",
            "2",
            "--per-category",
            "1",
            "--max-new-tokens",
            "6",
            "--topk",
            "2",
            "--steps",
            "3",
            "--draft-tokens",
            "5",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    printed = capsys.readouterr().out
    assert rc == 0
    result = json.loads((out / "lab.json").read_text())
    assert result["lossless"] is True and result["mismatches"] == []
    assert result["model"] == str(tiny_checkpoint) and "command" in result and result["versions"]["torch"]
    cats = ["math_reasoning", "mt_bench", "qa", "rag", "summarization", "translation", "overall"]
    assert [(r["config"], r["category"]) for r in result["rows"]] == [
        (c, k) for c in ("full", "small-window") for k in cats
    ]
    keys = {
        "config",
        "policy",
        "category",
        "accept_length",
        "coverage",
        "mean_set_size",
        "max_set_size",
        "tokens_per_s",
        "n_prompts",
    }
    for r in result["rows"]:
        assert keys <= set(r)
        assert r["accept_length"] >= 1.0 and 0.0 <= r["coverage"] <= 1.0 and r["tokens_per_s"] > 0
    overall = {r["config"]: r for r in result["rows"] if r["category"] == "overall"}
    assert overall["full"]["coverage"] == 1.0 and overall["full"]["mean_set_size"] == result["vocab_size"]
    assert overall["small-window"]["max_set_size"] <= 64
    assert overall["full"]["n_prompts"] == 7  # 6 questions, the MT-Bench one with two turns
    assert "| small-window | window | overall |" in printed
    md = (out / "lab.md").read_text()
    assert md.count("\n|") >= 15
    full, small = overall["full"]["accept_length"], overall["small-window"]["accept_length"]
    assert f"| full | full | {full:.2f} | 100.0% | 1.000 |" in md
    assert f"| small-window | window | {small:.2f} | {small / full:.1%} |" in md
    assert (out / "lab.png").read_bytes()[:4] == b"\x89PNG"


def test_lab_refuses_a_capacity_larger_than_the_vocabulary(tiny_checkpoint, tmp_path, capsys):
    rc = main(["lab", "--config", "configs/microspec.yaml", "--model", str(tiny_checkpoint), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "configs/microspec.yaml: capacity = 3072 is invalid: must be at most the vocabulary size" in err


@pytest.mark.parametrize(
    "args,piece",
    [
        (["--config", "nope.yaml"], "cannot read config file nope.yaml"),
        (
            ["--config", "configs/full.yaml", "--model", "/nonexistent"],
            "not one of the named models (gemma3-270m, smollm2-135m) and not a local directory",
        ),
        (["--config", "configs/full.yaml", "--draft-layers", "x"], "--draft-layers = 'x' is invalid"),
        (["--config", "configs/full.yaml", "--draft", "eagle3"], "--draft = 'eagle3' is invalid"),
        (
            ["--config", "configs/full.yaml", "--draft", "eagle3:/nonexistent"],
            "EAGLE-3 draft /nonexistent: cannot read",
        ),
        (["--config", "configs/full.yaml", "--max-new-tokens", "0"], "argument --max-new-tokens: must be at least 1"),
        (["--config", "configs/full.yaml", "--topk", "0"], "argument --topk: must be at least 1"),
        (["--config", "configs/full.yaml", "--batch", "0"], "argument --batch: must be at least 1"),
        (["--config", "configs/full.yaml", "--batch", "two"], "argument --batch: 'two' is not an integer"),
        (["--config", "configs/full.yaml", "--questions", "/nonexistent.jsonl"], "cannot read questions file"),
    ],
)
def test_lab_argument_errors(args, piece, capsys, tmp_path):
    assert main(["lab", *args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and piece in err, err


def test_lab_with_an_eagle3_draft(tiny_checkpoint, tmp_path, monkeypatch):
    """--draft eagle3:DIR runs the reference decoder with an EAGLE-3 draft (both head kinds); without
    --draft, the full-vocabulary draft the trainer leaves in the cache for the model is the default."""
    from transformers import AutoModelForCausalLM

    from sglang_specvocab.train import checkpoint as C
    from sglang_specvocab.train import model as M

    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    cache = tmp_path / "cache"
    monkeypatch.setenv("SGLANG_SPECVOCAB_CACHE", str(cache))
    full = cache / "drafts" / f"{tiny_checkpoint.name}-eagle3-full"
    for path, dv in ((full, None), (tmp_path / "d2t", 128)):
        cfg = M.Eagle3Config.for_target(model, draft_vocab_size=dv, capture_layers=[1, 2, 3])
        hot = None if dv is None else torch.arange(0, 2 * dv, 2)
        C.save_checkpoint(M.build_draft(model, cfg, hot), path, torch.float32)
    cfg = tmp_path / "small-window.yaml"
    cfg.write_text("policy: window\ncapacity: 64\n")
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"category": "qa", "turns": ["Why?"]}\n{"category": "math", "turns": ["1+1?", "2+2?"]}\n')
    common = [
        "lab",
        "--config",
        str(cfg),
        "--model",
        str(tiny_checkpoint),
        "--questions",
        str(questions),
        "--max-new-tokens",
        "8",
        "--no-progress",
    ]
    for draft, name in ((None, "auto"), (f"eagle3:{tmp_path / 'd2t'}", "d2t")):
        out = tmp_path / name
        assert main([*common, "--out", str(out), *(["--draft", draft] if draft else [])]) == 0
        result = json.loads((out / "lab.json").read_text())
        assert result["lossless"] is True
        assert result["draft"] == f"EAGLE-3 draft {full if draft is None else tmp_path / 'd2t'}"
        dense = next(r for r in result["rows"] if r["config"] == "full" and r["category"] == "overall")
        assert dense["mean_set_size"] == (result["vocab_size"] if draft is None else 128)


def test_question_files(tmp_path):
    qs = load_questions()
    assert {q.category for q in qs} == {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"}
    p = tmp_path / "q.jsonl"
    p.write_text('{"question_id": 1, "category": "writing", "turns": ["a", "b"]}\n{"category": "qa", "turns": []}\n')
    with pytest.raises(Exception, match="line 2: 'turns' must be a non-empty list"):
        load_questions(p)
    lines = [("writing", 1), ("writing", 2), ("writing", 3), ("coding", 4), ("qa", 5), ("coding", 6), ("qa", 7)]
    p.write_text("".join(f'{{"question_id": {i}, "category": "{c}", "turns": ["t"]}}\n' for c, i in lines))
    got = [(q.category, q.qid) for q in load_questions(p, per_category=3)]
    # MT-Bench subcategories fold into one and are sampled in turn
    assert got == [("mt_bench", "1"), ("mt_bench", "4"), ("mt_bench", "2"), ("qa", "5"), ("qa", "7")]


def test_prompt_format_without_chat_template():
    class Plain:
        chat_template = None

    assert format_prompt(Plain(), ["Hi?"], []) == "Question: Hi?\nAnswer:"
    assert (
        format_prompt(Plain(), ["Hi?", "More?"], [" Hello. "])
        == "Question: Hi?\nAnswer: Hello.\nQuestion: More?\nAnswer:"
    )


def test_interrupted_lab_keeps_the_finished_turns(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    from sglang_specvocab.lab.decoder import SpeculativeDecoder

    real = SpeculativeDecoder.generate
    calls = {"n": 0}

    def generate(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 6:  # in the middle of the third turn (two configs per turn)
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SpeculativeDecoder, "generate", generate)
    cfg = tmp_path / "w.yaml"
    cfg.write_text("policy: window\ncapacity: 64\n")
    out = tmp_path / "out"
    rc = main(
        [
            "lab",
            "--config",
            str(cfg),
            "--model",
            str(tiny_checkpoint),
            "--draft-layers",
            "1",
            "--max-new-tokens",
            "4",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 130
    result = json.loads((out / "lab.json").read_text())
    assert result["complete"] is False
    overall = {r["config"]: r for r in result["rows"] if r["category"] == "overall"}
    assert overall["full"]["n_prompts"] == overall["w"]["n_prompts"] == 2
    assert "INTERRUPTED" in (out / "lab.md").read_text()


def test_lab_lockstep_batch_union_masked_and_visible(tiny_checkpoint, tmp_path, capsys):
    """--batch B: first turns decoded B at a time over one table, one head call per draft step; the union head
    masked to each request's set (own) and seeing the whole union (all) both stay lossless; own accepts what
    per-request accepts; the batch's union of sets is reported beside each request's own set."""
    cfgs = []
    for name, head in [("own", "{batch: union, union_view: own}"), ("all", "{batch: union, union_view: all}"),
                       ("per", "{batch: per-request}")]:  # fmt: skip
        cfgs.append(tmp_path / f"union-{name}.yaml")
        cfgs[-1].write_text(f"policy: window\ncapacity: 64\nhead: {head}\n")
    out = tmp_path / "out"
    rc = main(["lab", "--config", *map(str, cfgs), "--model", str(tiny_checkpoint), "--draft-layers", "2",
               "--per-category", "1", "--max-new-tokens", "6", "--topk", "2", "--steps", "3", "--draft-tokens", "5",
               "--batch", "3", "--out", str(out), "--no-progress"])  # fmt: skip
    capsys.readouterr()
    assert rc == 0
    result = json.loads((out / "lab.json").read_text())
    assert result["lossless"] is True and result["batch"] == 3
    assert result["heads"] == {"full": "stock (dense)", "union-own": "union, union_view own",
                               "union-all": "union, union_view all", "union-per": "per-request"}  # fmt: skip
    overall = {r["config"]: r for r in result["rows"] if r["category"] == "overall"}
    assert all(r["n_prompts"] == 6 for r in overall.values())  # first turns only
    assert overall["union-own"]["accept_length"] == overall["union-per"]["accept_length"]
    assert overall["union-own"]["coverage"] == overall["union-per"]["coverage"]
    for name in ("union-own", "union-all", "union-per"):
        r = overall[name]
        assert r["mean_set_size"] < r["mean_union_size"] <= 3 * 64
    assert overall["full"]["mean_union_size"] == result["vocab_size"]
    md = (out / "lab.md").read_text()
    assert "3 questions in lockstep" in md and "| mean union |" in md


def test_lab_refuses_a_lockstep_batch_with_online_lora_before_loading(tmp_path, capsys):
    import numpy as np

    from sglang_specvocab.vocab_data import save_frequency_table

    save_frequency_table(tmp_path / "f.npz", np.arange(400, 0, -1), tokenizer="tiny", source="test")
    cfg = tmp_path / "evo.yaml"
    cfg.write_text(
        f"policy: retrieval\nretrieval: {{table: {tmp_path / 'f.npz'}, static_size: 64, dynamic_size: 16}}\nalign: {{}}\n"
    )
    rc = main(["lab", "--config", str(cfg), "--model", "/nonexistent", "--batch", "2", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and f"{cfg}: align (online LoRA" in err and "batch = 2 is invalid with it, must be 1" in err


def test_union_stats_count_distinct_ids_of_distinct_questions():
    import numpy as np

    from sglang_specvocab.lab.unions import union_stats

    # question q's sets are {q, 100} and {q, 101}: a batch of b distinct questions has b + (1 or 2) distinct ids
    sets = [[np.array([q, 100]), np.array([q, 101])] for q in range(6)]
    stats = union_stats(sets, (1, 4, 6), samples=50, seed=1)
    assert [s["batch"] for s in stats] == [1, 4, 6] and all(s["mean_set"] == 2 for s in stats)
    assert stats[0]["mean_union"] == 2 and stats[0]["ratio"] == 1.0
    for s, b in zip(stats[1:], (4, 6), strict=True):
        assert b + 1 <= s["p10_union"] <= s["p90_union"] <= b + 2 and b + 1 <= s["mean_union"] <= b + 2
    with pytest.raises(Exception, match="batch 7 needs at least 7 questions, 6 were decoded"):
        union_stats(sets, (7,), samples=1)
