"""The SGLang plug-in on CPU (light SGLang environment): registration, the flag, EAGLE defaults, every
refusal before start, the version/signature check, the worker classes, and loading through the
entry point in a spawned child process (as SGLang's scheduler does)."""

from __future__ import annotations

import hashlib
import pickle
import re
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import SG_DRAFT_VOCAB, SG_VOCAB, spawn_result

from sglang_specvocab.copies.upstream import SGLANG_VERSION

pytestmark = [pytest.mark.sglang, pytest.mark.usefixtures("no_dynvocab_env")]

ROOT = Path(__file__).resolve().parents[1]
VOCAB, DRAFT_VOCAB = SG_VOCAB, SG_DRAFT_VOCAB  # the sg fixture's checkpoints
CONFIGS = ROOT / "configs"


def argv(tiny, *extra, draft="draft-full", config=CONFIGS / "microspec.yaml"):
    out = ["--model-path", str(tiny.target), "--speculative-algorithm", "DYNVOCAB"]
    out += ["--speculative-draft-model-path", str(tiny.root / draft), "--device", "cpu"]
    if config is not None:
        out += ["--speculative-dynvocab-config", str(config)]
    return out + list(extra)


def resolved(args):
    from sglang.srt.arg_groups.model_override_base import resolving_view
    from sglang.srt.server_args import prepare_server_args

    sa = prepare_server_args(args)
    sa.resolve_once()
    return sa, resolving_view(sa)


def refusal(args) -> str:
    with pytest.raises(Exception) as info:
        resolved(args)
    return str(info.value)


# --- registration, flag, defaults, worker class -------------------------------------------------


def test_prepare_server_args_defaults_and_worker_class(sg):
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_specvocab.integration.algorithm import ATTR, DynVocabAlgo
    from sglang_specvocab.integration.worker import DynVocabDraftWorker, DynVocabWorkerV2

    sa = prepare_server_args(argv(sg))
    assert getattr(sa, ATTR) == str(CONFIGS / "microspec.yaml")
    assert getattr(pickle.loads(pickle.dumps(sa)), ATTR) == getattr(sa, ATTR)  # travels to the scheduler
    sa.resolve_once()
    from sglang.srt.arg_groups.model_override_base import resolving_view

    v = resolving_view(sa)
    # SGLang's EAGLE defaults: auto steps/topk/draft tokens for a Llama target, 48 requests, no overlap on CPU
    assert v.speculative_algorithm == "DYNVOCAB"
    assert (v.speculative_num_steps, v.speculative_eagle_topk, v.speculative_num_draft_tokens) == (5, 4, 8)
    assert v.max_running_requests == 48 and v.disable_overlap_schedule
    algo = SpeculativeAlgorithm.from_string("dynvocab")
    assert isinstance(algo, DynVocabAlgo)
    worker = algo.create_worker(sa)
    assert worker is DynVocabWorkerV2 and issubclass(worker, EAGLEWorkerV2)
    assert issubclass(worker.draft_worker_cls, EagleDraftWorker) and worker.draft_worker_cls is DynVocabDraftWorker

    # topk 1: draft tokens = steps + 1, explicit max running requests kept
    _, v = resolved(
        argv(
            sg,
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "9",
            "--max-running-requests",
            "7",
            draft="draft-d2t",
        )
    )
    assert (v.speculative_num_steps, v.speculative_eagle_topk, v.speculative_num_draft_tokens) == (3, 1, 4)
    assert v.max_running_requests == 7


def test_spec_class_answers_as_eagle3(sg):
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string("DYNVOCAB")
    eagle3 = SpeculativeAlgorithm.EAGLE3
    for name in (
        "is_eagle",
        "is_eagle3",
        "carries_draft_hidden_states",
        "need_topk",
        "supports_grammar_overlap",
        "has_draft_kv",
        "is_speculative",
        "is_some",
    ):
        assert getattr(algo, name)() is True, name
    assert algo.supports_mixed_chunk() is False and algo.is_none() is False and algo.is_standalone() is False
    assert algo.get_platform_worker_cls() is None
    # every public method of the enum is answered (a __getattr__ fallback to EAGLE3 for the rest)
    for name in dir(eagle3):
        if not name.startswith("_"):
            assert hasattr(algo, name), name
    assert algo.value == eagle3.value
    pool = SimpleNamespace(req_to_token=torch.zeros(5, 8, dtype=torch.int32))
    fm = algo.create_future_map(torch.device("cpu"), pool)
    assert isinstance(fm, FutureMap) and fm.spec_algo is algo and fm.req_pool_size == 5


def test_register_is_idempotent_and_flag_sources(sg, monkeypatch, tmp_path):
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative import spec_registry

    from sglang_specvocab.integration import plugin
    from sglang_specvocab.integration.algorithm import config_location, default_config_path

    before = spec_registry._REGISTRY["DYNVOCAB"]
    plugin.register()
    load_plugins()
    plugin._registered = False  # as if a second copy of the plug-in ran in this process
    plugin.register()
    assert spec_registry._REGISTRY["DYNVOCAB"] is before
    sa = prepare_server_args(argv(sg))  # the flag is added once (argparse would refuse a duplicate)

    # flag > $SGLANG_DYNVOCAB_CONFIG > the shipped microspec.yaml; relative paths become absolute
    monkeypatch.chdir(tmp_path)
    assert config_location(sa)[0] == str(CONFIGS / "microspec.yaml")
    sa = prepare_server_args(argv(sg, config="rel.yaml"))
    assert config_location(sa) == (str(tmp_path / "rel.yaml"), "--speculative-dynvocab-config")
    sa = prepare_server_args(argv(sg, config=None))
    path, origin = config_location(sa)
    assert path == str(default_config_path()) and Path(path).is_file() and "default" in origin
    monkeypatch.setenv("SGLANG_DYNVOCAB_CONFIG", "env.yaml")
    assert config_location(sa) == (str(tmp_path / "env.yaml"), "$SGLANG_DYNVOCAB_CONFIG")
    sa = prepare_server_args(argv(sg, config=CONFIGS / "full.yaml"))
    assert config_location(sa)[0] == str(CONFIGS / "full.yaml")


# --- refusals before start --------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--speculative-use-rejection-sampling"], "--speculative-use-rejection-sampling"),
        (["--pp-size", "2", "--disable-overlap-schedule"], "--pp-size"),
        (["--tp-size", "2", "--attn-dp-size", "2"], "--attn-dp-size"),
        (["--enable-multi-layer-eagle"], "--enable-multi-layer-eagle"),
        (["--disaggregation-mode", "decode"], "--disaggregation-mode"),
        (["--enable-mixed-chunk"], "--enable-mixed-chunk"),
        (["--speculative-token-map", "x.pt"], "--speculative-token-map"),
        (["--enable-lora", "--max-lora-rank", "8", "--lora-target-modules", "q_proj"], "--enable-lora"),
        (["--tp-size", "2", "--enable-attn-tp-input-scattered"], "--enable-attn-tp-input-scattered"),
        (["--enable-unified-memory"], "--enable-unified-memory"),
    ],
)
def test_unsupported_combinations_are_refused(sg, extra, flag):
    msg = refusal(argv(sg, *extra))
    assert f"DYNVOCAB does not support {flag}" in msg and "Remove" in msg


def test_unsupported_table_rows(sg):
    """Each row of the one table refuses on its own (also the ones SGLang itself refuses first)."""
    from sglang_specvocab.integration.algorithm import UNSUPPORTED, UnsupportedCombinationError, check_combinations

    on = dict(
        speculative_use_rejection_sampling=True,
        speculative_use_block_verification=True,
        pp_size=2,
        attn_dp_size=2,
        enable_multi_layer_eagle=True,
        disaggregation_mode="prefill",
        enable_mixed_chunk=True,
        speculative_token_map="m.pt",
        enable_lora=True,
        enable_attn_tp_input_scattered=True,
        enable_unified_memory=True,
    )
    off = dict(
        speculative_use_rejection_sampling=False,
        speculative_use_block_verification=False,
        pp_size=1,
        attn_dp_size=1,
        enable_dp_attention=False,
        enable_multi_layer_eagle=False,
        speculative_adaptive=False,
        disaggregation_mode="null",
        enable_mixed_chunk=False,
        speculative_token_map=None,
        enable_lora=None,
        lora_paths=None,
        enable_attn_tp_input_scattered=False,
        enable_unified_memory=False,
    )
    check_combinations(SimpleNamespace(**off))
    hit = set()
    for key, value in on.items():
        with pytest.raises(UnsupportedCombinationError) as info:
            check_combinations(SimpleNamespace(**{**off, key: value}))
        hit.add(next(r.flag for r in UNSUPPORTED if f"support {r.flag}:" in str(info.value)))
    assert hit == {r.flag for r in UNSUPPORTED}


# --- --speculative-adaptive: supported, SGLang's own resolution -------------------------------------


def test_adaptive_resolves_as_for_eagle3(sg):
    """SGLang keeps --speculative-adaptive on for DYNVOCAB (its check knows EAGLE/EAGLE3 only: hooked) and
    resolves the same chain parameters as for EAGLE3; other algorithms still get SGLang's own answer."""
    from sglang.srt.speculative import adaptive_spec_params as asp

    from sglang_specvocab.integration.plugin import adaptive_reason_hook

    views = {}
    for algo in ("DYNVOCAB", "EAGLE3"):
        args = argv(sg, "--speculative-adaptive")
        args[args.index("DYNVOCAB")] = algo
        _, v = resolved(args)
        views[algo] = (
            v.speculative_adaptive,
            v.speculative_eagle_topk,
            v.speculative_num_steps,
            v.speculative_num_draft_tokens,
        )
    assert views["DYNVOCAB"] == views["EAGLE3"] and views["DYNVOCAB"][:2] == (True, 1)
    steps = views["DYNVOCAB"][2]
    assert steps in asp.resolve_candidate_steps_from_config(None) and views["DYNVOCAB"][3] == steps + 1

    sa, _ = resolved(argv(sg, "--speculative-adaptive"))
    calls = []
    assert adaptive_reason_hook(lambda a: calls.append(a) or "no", sa) is None and calls == []  # DYNVOCAB
    eagle = argv(sg, "--speculative-adaptive")
    eagle[eagle.index("DYNVOCAB")] = "EAGLE3"
    sa, _ = resolved(eagle)
    assert adaptive_reason_hook(lambda a: calls.append(a) or "sglang's reason", sa) == "sglang's reason"
    assert calls == [sa]


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"], "--speculative-eagle-topk"),
        (["--enable-two-batch-overlap"], "--enable-two-batch-overlap"),
    ],
)
def test_adaptive_conflicts_are_refused_not_silently_dropped(sg, extra, flag):
    msg = refusal(argv(sg, "--speculative-adaptive", *extra))
    assert f"--speculative-adaptive does not support {flag}" in msg and "Remove --speculative-adaptive" in msg


def test_adaptive_conflict_rows():
    from sglang_specvocab.integration.algorithm import ADAPTIVE_CONFLICTS, UnsupportedCombinationError, check_adaptive

    ok = dict(speculative_adaptive=True, speculative_eagle_topk=1, enable_two_batch_overlap=False, enable_pdmux=False)
    check_adaptive(SimpleNamespace(**ok))
    check_adaptive(SimpleNamespace(**{**ok, "speculative_eagle_topk": None}))  # SGLang picks 1 for adaptive
    check_adaptive(SimpleNamespace(**{**ok, "speculative_adaptive": False, "speculative_eagle_topk": 4}))
    hit = set()
    for key, value in (("speculative_eagle_topk", 2), ("enable_two_batch_overlap", True), ("enable_pdmux", True)):
        with pytest.raises(UnsupportedCombinationError) as info:
            check_adaptive(SimpleNamespace(**{**ok, key: value}))
        hit.add(next(flag for flag, _, _ in ADAPTIVE_CONFLICTS if f"support {flag} " in str(info.value)))
    assert hit == {flag for flag, _, _ in ADAPTIVE_CONFLICTS}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _aligned_retrieval(tmp_path: Path) -> Path:
    import numpy as np

    from sglang_specvocab.vocab_data import save_frequency_table

    save_frequency_table(tmp_path / "f.npz", np.arange(VOCAB, dtype=np.int64), tokenizer="tiny", source="test")
    text = "policy: retrieval\nretrieval: {table: f.npz, static_size: 16, dynamic_size: 16}\nalign: {rank: 8}\n"
    return _write(tmp_path / "aligned.yaml", text)


def test_bad_configs_are_refused(sg, tmp_path, monkeypatch):
    big = _write(tmp_path / "big.yaml", f"policy: window\ncapacity: {DRAFT_VOCAB + 1}\n")
    cases = [
        (argv(sg, config=tmp_path / "missing.yaml"), ["cannot read config file", "missing.yaml"]),
        (
            argv(sg, config=_write(tmp_path / "typo.yaml", "policy: window\ncapacity: 8\nwindw: {}\n")),
            ["unknown key 'windw'"],
        ),
        (
            argv(sg, config=big, draft="draft-d2t"),
            [
                f"capacity = {DRAFT_VOCAB + 1} is invalid: must be at most the vocabulary size {DRAFT_VOCAB}",
                "draft-d2t (a d2t draft",
            ],
        ),
        (
            argv(sg, config=_write(tmp_path / "huge.yaml", f"policy: window\ncapacity: {VOCAB + 1}\n")),
            [f"must be at most the vocabulary size {VOCAB} of the draft head", "a full-vocabulary draft"],
        ),
        # shipped data files were built for Gemma-3's 262144-token vocabulary
        (
            argv(sg, config=CONFIGS / "frspec.yaml"),
            [
                "static.table = 'data/gemma3-270m-sharegpt.freq.npz' is invalid",
                "262144-token vocabulary",
                f"the target model has {VOCAB}",
            ],
        ),
        (argv(sg, config=CONFIGS / "evospec.yaml"), ["retrieval.table", "262144-token vocabulary"]),
        (
            argv(
                sg,
                config=_write(tmp_path / "rank.yaml", "policy: lowrank\nlowrank: {rank: 4, topk: 16, ranker: r.pt}\n"),
            ),
            ["lowrank.ranker = 'r.pt' is invalid", "is not a file"],
        ),
        (argv(sg, draft="target"), ["needs an EAGLE-3 draft", "LlamaForCausalLM"]),
        # head options the server cannot honour, named by their key
        (
            argv(sg, config=_write(tmp_path / "packed.yaml", "policy: window\ncapacity: 8\nhead: {mode: packed}\n")),
            ["packed.yaml: head.mode = 'packed' is invalid for the server", "use head.mode: fused"],
        ),
        (
            argv(
                sg,
                config=_write(
                    tmp_path / "wide.yaml",
                    f"policy: window\ncapacity: 8\nhead: {{union_capacity: {DRAFT_VOCAB + 1}}}\n",
                ),
                draft="draft-d2t",
            ),
            [f"head.union_capacity = {DRAFT_VOCAB + 1} is invalid: must be at most the vocabulary size {DRAFT_VOCAB}"],
        ),
        # EvoSpec's online alignment runs in the reference decoder only: a server would ignore it
        (
            argv(sg, config=_aligned_retrieval(tmp_path)),
            ["align = {'rank': 8", "reference decoder", "remove the align"],
        ),
    ]
    for args, parts in cases:
        msg = refusal(args)
        for part in parts:
            assert part in msg, (part, msg)
    # the same capacity is fine for a full-vocabulary draft; the env var is the fall-back
    resolved(argv(sg, config=big))
    monkeypatch.setenv("SGLANG_DYNVOCAB_CONFIG", str(tmp_path / "nope.yaml"))
    msg = refusal(argv(sg, config=None))
    assert "nope.yaml" in msg and "$SGLANG_DYNVOCAB_CONFIG" in msg
    resolved(argv(sg))  # the flag wins over the env var


def test_capacity_below_draft_topk_is_refused(sg, tmp_path):
    """Every set the head or a union reads must hold at least --speculative-eagle-topk ids (explicit or EAGLE's
    auto choice, 4 for this Llama target), else the draft's top-k would fail in CUDA-graph capture."""
    small = _write(tmp_path / "small.yaml", "policy: window\ncapacity: 3\n")
    msg = refusal(argv(sg, config=small))  # auto topk
    assert "small.yaml: capacity = 3 is invalid with --speculative-eagle-topk 4: must be at least" in msg
    explicit = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "6", "--speculative-num-draft-tokens", "8")
    msg = refusal(argv(sg, *explicit, config=small))
    assert "capacity = 3 is invalid with --speculative-eagle-topk 6" in msg
    member = _write(
        tmp_path / "member.yaml",
        "policy: union\nmembers:\n  - {policy: window, capacity: 64}\n  - {policy: window, capacity: 2}\n",
    )
    msg = refusal(argv(sg, config=member))
    assert "member.yaml members[1]: capacity = 2 is invalid with --speculative-eagle-topk 4" in msg
    ranker = _write(tmp_path / "ranker.yaml", "policy: lowrank\nlowrank: {rank: 4, topk: 2}\n")
    assert "lowrank.topk = 2 is invalid with --speculative-eagle-topk 4" in refusal(argv(sg, config=ranker))
    # a chain (topk 1) fits the same small set; a dense policy has no set
    _, v = resolved(argv(sg, "--speculative-eagle-topk", "1", "--speculative-num-steps", "3", config=small))
    assert v.speculative_eagle_topk == 1
    resolved(argv(sg, config=CONFIGS / "full.yaml"))


# --- version and signature checks -------------------------------------------------------------


def test_version_and_signature_checks(sg, monkeypatch):
    import sglang_specvocab.copies as P

    assert P.supported_versions() == [SGLANG_VERSION]
    assert (
        P.check_sglang(worker=True) == SGLANG_VERSION
    )  # every recorded signature and body matches the installed SGLang
    with pytest.raises(
        P.SGLangCompatibilityError, match=rf"supports SGLang {re.escape(SGLANG_VERSION)} only, but SGLang 0\.0\.1 is "
    ):
        P.check_sglang_version("0.0.1")  # a version no plug-in release supports
    monkeypatch.setattr(P, "installed_sglang_version", lambda: "0.6.0")
    with pytest.raises(P.SGLangCompatibilityError, match=r"0\.6\.0 is installed"):
        P.check_sglang()
    monkeypatch.undo()

    target = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.verify"
    with pytest.raises(P.SGLangCompatibilityError) as info:
        P.check_signatures({target: "(self, batch)"})
    msg = str(info.value)
    assert target in msg and "recorded  (self, batch)" in msg and "pp_proxy_tensors=None" in msg
    with pytest.raises(P.SGLangCompatibilityError, match="not found"):
        P.check_signatures({"sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.gone": "(self)"})

    # a changed signature of a live method is caught (simulated by swapping the method)
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    monkeypatch.setattr(EagleDraftWorker, "alloc_memory_pool", lambda self, memory_pool_config=None: None)
    with pytest.raises(P.SGLangCompatibilityError, match="EagleDraftWorker.alloc_memory_pool"):
        P.check_signatures(P.recorded_signatures()["WORKER"])

    # the copies' folder is not importable by name; its modules load by path, once
    assert not P.COPIES_DIR.name.isidentifier()
    mod = P.load_copy("eagle_worker_v2")
    assert callable(mod.worker_init) and P.load_copy("eagle_worker_v2") is mod


def test_copies_checker_tells_an_import_failure_from_a_change(sg, monkeypatch, tmp_path, capsys):
    """``python -m sglang_specvocab.tools.record_sglang``: every recorded target (signatures and bodies) matches here; a module
    that fails to import is reported as such (exit bit 2), apart from a changed or missing target (exit bit 1)."""
    import sglang_specvocab.tools.record_sglang as checker

    assert checker.main() == 0
    out = capsys.readouterr().out
    assert "CHANGED" not in out and "IMPORT FAILED" not in out and " 0 changed, 0 import failed" in out

    pkg = tmp_path / "fakesglang"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ok.py").write_text("def f(a, b=1):\n    pass\n\n\ndef h(x):\n    return x\n\n\ndef k():\n    pass\n")
    (pkg / "broken.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    recorded = {"G": {"fakesglang.ok.f": "(a, b=1)", "fakesglang.ok.g": "(a)", "fakesglang.broken.h": "(x)"}}
    monkeypatch.setattr(checker, "recorded_signatures", lambda base: recorded)
    h = hashlib.sha256(b"def h(x):\n    return x\n").hexdigest()[:16]  # the source hash: sha256 of the source
    bodies = {"B": {"fakesglang.ok.h": h, "fakesglang.ok.k": "0" * 16}}
    monkeypatch.setattr(checker, "recorded_bodies", lambda: bodies)
    assert checker.main() == checker.CHANGED | checker.IMPORT_FAILED
    out = capsys.readouterr().out
    lines = {line.split(":")[0].strip(): line for line in out.splitlines()}
    assert lines["'fakesglang.ok.f'"].endswith("'(a, b=1)',")
    assert "<missing" in lines["'fakesglang.ok.g'"] and lines["'fakesglang.ok.g'"].endswith("# CHANGED")
    broken = lines["'fakesglang.broken.h'"]
    assert "no_such_dependency_xyz" in broken and broken.endswith("# IMPORT FAILED")
    assert lines["'fakesglang.ok.h'"].endswith(f"'{h}',")
    assert lines["'fakesglang.ok.k'"].endswith("# CHANGED") and "B = {" in out
    assert "# 5 targets: 2 unchanged, 2 changed, 1 import failed" in out


# --- the worker (CPU: construction wiring and allocation, with the GPU parts faked) --------------


def test_worker_init_and_alloc_memory_pool(sg, monkeypatch):
    from sglang.srt.speculative import eagle_worker_v2 as ew
    from transformers import AutoConfig

    from sglang_specvocab.integration.worker import DynVocabDraftWorker, DynVocabWorkerV2
    from sglang_specvocab.policies import load_config

    # DynVocabWorkerV2.__init__ (the copied EAGLE init) builds the draft worker class it names
    spec = SimpleNamespace(
        speculative_eagle_topk=1,
        speculative_num_steps=3,
        speculative_num_draft_tokens=4,
        speculative_algorithm="DYNVOCAB",
        speculative_adaptive=False,
        speculative_adaptive_config=None,
    )
    monkeypatch.setattr(ew, "get_spec", lambda: spec)
    monkeypatch.setattr(ew, "get_device", lambda: SimpleNamespace(device="cpu"))
    monkeypatch.setattr(ew, "get_schedule", lambda: SimpleNamespace(page_size=1))
    monkeypatch.setattr(ew, "get_parallel", lambda: SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True)))
    monkeypatch.setattr(ew, "get_plan_stream", lambda device: (None, nullcontext()))
    built = []

    class Recorder(DynVocabWorkerV2):
        draft_worker_cls = staticmethod(lambda *a: built.append(a) or SimpleNamespace(dynvocab_policy="p"))

    w = Recorder("sa", 0, 1234, "target")
    assert built == [("sa", 0, 1234, "target")] and w.dynvocab_policy == "p"
    assert (w.topk, w.speculative_num_steps, w.speculative_num_draft_tokens, w.page_size) == (1, 3, 4, 1)
    assert w.adaptive_controller is None and w._target_worker == "target" and w._hosts_draft
    assert w._dv_live == {} and w._dv_seen is None  # DYNVOCAB state (tests/test_integration_worker.py)
    # with --speculative-adaptive: SGLang's controller over this worker, starting at the configured steps
    from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController

    spec.speculative_adaptive = True
    w = Recorder("sa", 0, 1234, "target")
    assert isinstance(w.adaptive_controller, AdaptiveController) and w.adaptive_controller.worker is w
    assert w.adaptive_controller.params.get_steps_for_batch(1) == 3 and 0 in w.adaptive_controller.candidate_steps

    # alloc_memory_pool: EAGLE's (faked) then the policy table sized by the request pool, then the GPU head
    monkeypatch.setattr(ew.EagleDraftWorker, "alloc_memory_pool", lambda self, **kw: None)
    d = object.__new__(DynVocabDraftWorker)
    d.device = torch.device("cpu")
    d.dynvocab_config = load_config(CONFIGS / "microspec.yaml")
    hf = AutoConfig.from_pretrained(sg.draft_d2t)
    d.draft_runner = SimpleNamespace(
        model=SimpleNamespace(
            lm_head=SimpleNamespace(weight=torch.zeros(DRAFT_VOCAB, 4)),
            model=SimpleNamespace(embed_tokens=SimpleNamespace(weight=torch.zeros(VOCAB, 4))),
        ),
        model_config=SimpleNamespace(hf_config=hf, model_path=str(sg.draft_d2t)),
    )
    d.target_worker = SimpleNamespace(
        model_runner=SimpleNamespace(model_config=SimpleNamespace(vocab_size=VOCAB, hf_eos_token_id={3, 2}))
    )
    pool = SimpleNamespace(req_to_token=torch.zeros(49, 16, dtype=torch.int32))
    installed = []
    monkeypatch.setattr(DynVocabDraftWorker, "install_dynvocab_head", lambda self: installed.append(self))
    d.alloc_memory_pool(req_to_token_pool=pool)
    assert installed == [d] and d.dynvocab_telemetry.rounds.shape == (49,)
    table = d.dynvocab_policy.table
    assert table.ids.shape == (49, 3072) and table.cnt.shape == (49,) and int(table.cnt[0]) >= 1
    assert d.dynvocab_policy.model.eos_token_ids == (2, 3) and d.dynvocab_policy.model.vocab_size == VOCAB

    d.dynvocab_config = load_config(CONFIGS / "full.yaml")
    d.alloc_memory_pool(req_to_token_pool=pool)
    assert d.dynvocab_policy.table is None  # dense policy: no table


# --- the entry point in a spawned process -----------------------------------------------------


def _child(queue, server_args):
    """Runs in a spawned process, like SGLang's scheduler: plug-ins come from the entry points."""
    try:
        from sglang.srt.plugins import load_plugins
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        load_plugins()
        load_plugins()
        algo = SpeculativeAlgorithm.from_string("DYNVOCAB")
        import argparse

        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        flags = [a for a in parser._actions if "--speculative-dynvocab-config" in a.option_strings]
        queue.put(
            (
                "ok",
                type(algo).__module__ + "." + type(algo).__name__,
                len(flags),
                getattr(server_args, "_dynvocab_config", None),
            )
        )
    except BaseException as exc:  # noqa: BLE001  (report, do not hang the parent)
        import traceback

        queue.put(("error", repr(exc), traceback.format_exc(), None))


def test_plugin_loads_in_spawned_child_through_the_entry_point(sg):
    from importlib.metadata import entry_points

    from sglang.srt.server_args import prepare_server_args

    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("dynvocab") == "sglang_specvocab.integration.plugin:register", (
        "entry point missing: pip install --no-build-isolation --no-deps -e . (a stale sglang_specvocab.egg-info "
        "in the working directory shadows the installed metadata: python setup.py egg_info refreshes it)"
    )
    sa = prepare_server_args(argv(sg))
    result = spawn_result(_child, sa)
    assert result[0] == "ok", result[2]
    assert result[1:] == ("sglang_specvocab.integration.algorithm.DynVocabAlgo", 1, str(CONFIGS / "microspec.yaml"))


@pytest.mark.parametrize(
    "extra, piece, config_text",
    [
        (["--enable-mixed-chunk"], "DYNVOCAB does not support --enable-mixed-chunk", None),
        ([], None, None),  # accepted: resolves
        # a config that contains itself (an alias inside its anchor) was a RecursionError traceback, exit 1
        ([], "(cycle: top level -> members[0] -> top level)", "&top\npolicy: union\nmembers:\n  - *top\n"),
    ],
    ids=["mixed-chunk", "accepted", "cyclic-config"],
)
def test_a_refused_launch_exits_2_with_one_line_and_no_traceback(sg, tmp_path, extra, piece, config_text):
    """What ``python -m sglang.launch_server`` does before it starts anything (load the plug-ins, prepare the
    server args), in a child process: a refusal is one ``error:`` line and exit status 2."""
    import subprocess
    import sys

    from sglang_specvocab.tools.testing.standins import child_preamble

    config = CONFIGS / "microspec.yaml"
    if config_text is not None:
        config = tmp_path / "policy.yaml"
        config.write_text(config_text)

    script = child_preamble() + (
        "import sys\n"
        "from sglang.srt.plugins import load_plugins\n"
        "from sglang.srt.server_args import prepare_server_args\n"
        "load_plugins()\n"
        "prepare_server_args(sys.argv[1:]).resolve_once()\n"
        "print('resolved')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, *argv(sg, *extra, config=config)],
        capture_output=True,
        text=True,
        check=False,
        timeout=240,
        cwd=tmp_path,
    )
    if piece is None:
        assert run.returncode == 0 and "resolved" in run.stdout, run.stderr[-2000:]
        return
    err = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert len(err) == 1 and piece in err[0]
