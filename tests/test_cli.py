"""The one command, ``sglang-specvocab``: every subcommand answers --help, and one exit-status rule holds
for all of them (0 success, 1 a check failed, 2 refused input with one ``error:`` line, 130 interrupted)."""

import subprocess
import sys

import pytest

from sglang_specvocab.errors import SpecVocabError
from sglang_specvocab.tools import cli

SUBCOMMANDS = {  # subcommand -> an option its help must list
    ("lab",): "--per-category",
    ("replay",): "--trace",
    ("check-config",): "--vocab-size",
    ("build-freq",): "--cooccurrence",
    ("build-data",): "--conversations",
    ("train-ranker",): "--rank",
    ("train-router",): "--top-l",
    ("train-eagle3",): "--ttt-steps",
    ("report-eagle3",): "DRAFT",
    ("convert-gemma3",): "--chat-template",
    ("bench", "kernels"): "--time-budget-s",
    ("bench", "specbench"): "--limit-per-category",
    ("bench", "rounds"): "--batch-sizes",
    ("check-lossless",): "--tiny",
    ("tiny-checkpoints",): "--draft-vocab",
}


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS), ids=" ".join)
def test_every_subcommand_explains_itself(command, capsys):
    assert cli.main([*command, "--help"]) == 0
    assert SUBCOMMANDS[command] in capsys.readouterr().out


def test_the_top_level_help_lists_every_subcommand_and_the_exit_rule(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in {c[0] for c in SUBCOMMANDS}:
        assert f"    {command}" in out
    assert "refused input" in out and "130" in out


def test_python_dash_m_runs_the_command_without_importing_torch_for_help():
    code = (
        "import sys, runpy; sys.argv = ['sglang-specvocab', 'check-config', '--help']\n"
        "try:\n    runpy.run_module('sglang_specvocab', run_name='__main__')\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "assert 'torch' not in sys.modules, 'help imported torch'\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert "--vocab-size" in run.stdout


@pytest.mark.parametrize(
    "argv, message",
    [
        (["nope"], "invalid choice: 'nope'"),
        (["lab", "--config", "c.yaml", "--steps", "0"], "argument --steps: must be at least 1, got 0"),
        (["bench", "kernels", "--ops", "indexed,bogus"], "bogus: choose from indexed"),
        (["check-lossless", "--out", "o", "--concurrency", "1,x"], "must be integers separated by commas"),
        (["replay", "--config", "c.yaml"], "the following arguments are required: --trace, --out"),
        (["train-ranker", "--rank", "8", "--out", "r.pt", "--source", "web"], "invalid choice: 'web'"),
        (["train-router", "--config", "c.yaml", "--out", "r.pt", "--positions", "-1"], "argument --positions"),
    ],
)
def test_refused_arguments_exit_2_with_one_error_line(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1


def test_refused_input_found_while_running_exits_2_with_one_error_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: window\ncapacity: 0\n")
    assert cli.main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: capacity = 0 is invalid") and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_a_passing_and_a_failing_check_and_an_interrupt(monkeypatch, capsys):
    outcomes = iter([0, 1, KeyboardInterrupt(), SpecVocabError("the input names what is wrong")])

    def run(args):
        outcome = next(outcomes)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(cli.checks, "_run_check_lossless", run)
    argv = ["check-lossless", "--out", "o", "--config", "name=a,args=--x"]
    assert [cli.main(argv) for _ in range(4)] == [0, 1, 130, 2]
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "sglang-specvocab: interrupted; finished requests are cached, rerun the same command to resume",
        "error: the input names what is wrong",
    ]


def test_the_command_line_is_recorded_as_typed(monkeypatch):
    seen = {}
    monkeypatch.setattr(cli.checks, "_run_check_config", lambda args: seen.setdefault("line", args.command_line) and 0)
    assert cli.main(["check-config", "my config.yaml"]) == 0
    assert seen["line"] == "sglang-specvocab check-config 'my config.yaml'"


def test_the_trained_modes_default_to_the_measured_recipe():
    """train-ranker/train-router with no recording flags: teacher-forced text of 2,000 conversations, and the
    steps that made benchmarks/lab-gemma3-270m-trained (ranker 1500, router 800); decode keeps 32 prompts, build-data's
    mixed documents 300 (its --ranker-texts), and an EAGLE-3 draft's chains are recorded 4 steps deep."""
    from sglang_specvocab.tools.lab.rankers import DEFAULT_PROMPTS

    ranker = cli.parser().parse_args(["train-ranker", "--rank", "64", "--out", "r.pt"])
    router = cli.parser().parse_args(["train-router", "--config", "c.yaml", "--out", "r.pt"])
    assert (ranker.source, ranker.steps, ranker.positions, ranker.seq_len) == ("text", 1500, 64, 512)
    assert (router.source, router.steps) == ("text", 800)
    assert ranker.prompts is None and DEFAULT_PROMPTS == {"text": 2000, "mixed": 300, "decode": 32}
    assert ranker.draft_steps == 4 and (ranker.code_share, ranker.multilingual_share) == (0.25, 0.5)


def test_the_dtype_choices_are_the_trainers():
    """tools/cli/train.py names the dtypes without importing torch (for --help); they are the trainer's, no more."""
    from sglang_specvocab.tools.cli import train as cli_train
    from sglang_specvocab.tools.train.command import DTYPES

    assert set(cli_train.DTYPES) == set(DTYPES)


def test_typed_settings_take_every_option_with_the_command_lines_defaults():
    """train-eagle3, bench kernels and build-freq read their command lines into dataclasses once (``from_args``):
    each has a field for every option, with the same default, so no option is dropped on the way in."""
    from dataclasses import asdict, fields
    from pathlib import Path

    from sglang_specvocab.tools.bench.kernels_sweep import KernelBench
    from sglang_specvocab.tools.lab.frequency import FrequencyCount
    from sglang_specvocab.tools.train.settings import TrainEagle3

    cases = (
        (["train-eagle3"], TrainEagle3, {}),
        (["bench", "kernels"], KernelBench, {}),
        (["build-freq", "--sharegpt", "--out", "x.npz"], FrequencyCount, {"out": Path("x.npz"), "sharegpt": True}),
    )
    for argv, cls, required in cases:
        given = {k: v for k, v in vars(cli.parser().parse_args(argv)).items() if not callable(v)}
        given.pop("bench", None)  # the subcommand's name under bench
        names = {f.name for f in fields(cls)}
        assert set(given) - {"command"} <= names, f"{cls.__name__} lacks {set(given) - names}"
        defaults = asdict(cls(**required))
        assert {k: v for k, v in given.items() if k in defaults and v != defaults[k]} == {}, cls.__name__
        assert cls.from_args(cli.parser().parse_args(argv)) == cls(**{k: given[k] for k in given if k in names})
