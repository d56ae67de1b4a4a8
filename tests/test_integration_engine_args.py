"""The offline API's keyword ``speculative_dynvocab_config`` on CPU (light SGLang environment, tiny checkpoints, no
model started): ``sglang.Engine(...)`` names the DYNVOCAB policy YAML exactly as the server flag
``--speculative-dynvocab-config`` does: the same config, the same precedence over ``$SGLANG_DYNVOCAB_CONFIG``, the same
refusals, SGLang's own ``ServerArgs`` record, and the value travels to spawned processes with the pickled record.
``ServerArgs(...)`` itself does not take the keyword (that would need a subclass in place of SGLang's class in every
process); SGLang's ``--config`` YAML names the flag."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import spawn_result

pytestmark = [pytest.mark.sglang, pytest.mark.usefixtures("no_dynvocab_env")]

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
FULL = CONFIGS / "full.yaml"  # not the default (microspec.yaml): a fall-back to the default cannot pass


def fields(tiny) -> dict:
    return dict(
        model_path=str(tiny.target),
        speculative_algorithm="DYNVOCAB",
        speculative_draft_model_path=str(tiny.root / "draft-full"),
        device="cpu",
    )


def flag_args(tiny, config) -> list[str]:
    """The same server on the command line, the config given by the flag."""
    out = ["--model-path", str(tiny.target), "--speculative-algorithm", "DYNVOCAB"]
    out += ["--speculative-draft-model-path", str(tiny.root / "draft-full"), "--device", "cpu"]
    return out + ["--speculative-dynvocab-config", str(config)]


def keyword(tiny, config, **extra):
    return engine_server_args(**{**fields(tiny), **extra}, speculative_dynvocab_config=config)


def engine_server_args(**kwargs):
    """The record ``sglang.Engine(**kwargs)`` builds: ``load_plugins()``, then ``self.server_args_class(**kwargs)``
    with ``log_level`` defaulted (``Engine.__init__`` of the pinned SGLang), before it launches anything."""
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.plugins import load_plugins

    load_plugins()
    kwargs.setdefault("log_level", "error")
    return Engine.server_args_class(**kwargs)


def refusal(server_args) -> str:
    from sglang_specvocab.errors import SpecVocabError

    with pytest.raises(SpecVocabError) as info:
        server_args.resolve_once()
    return str(info.value)


def test_keyword_names_the_same_config_as_the_flag(sg, tmp_path, monkeypatch):
    from sglang.srt.arg_groups.model_override_base import resolving_view
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    from sglang_specvocab.integration.algorithm import FLAG, config_location, load_server_config

    kw, cli = keyword(sg, str(FULL)), prepare_server_args(flag_args(sg, FULL))
    assert config_location(kw) == config_location(cli) == (str(FULL), FLAG)
    assert type(kw) is type(cli) is ServerArgs  # SGLang's own class: the path is a bookkeeping attribute
    assert load_server_config(kw).policy == load_server_config(cli).policy == "full"
    kw.resolve_once()
    cli.resolve_once()
    views = [resolving_view(sa) for sa in (kw, cli)]
    picked = [(v.speculative_num_steps, v.speculative_eagle_topk, v.max_running_requests) for v in views]
    assert picked[0] == picked[1] == (5, 4, 48)  # the same EAGLE defaults as the flag's server
    assert load_server_config(kw).source == str(FULL)

    # a relative path, a Path and ~ become absolute against the cwd at construction, as the flag's value does
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert config_location(keyword(sg, "rel.yaml")) == config_location(prepare_server_args(flag_args(sg, "rel.yaml")))
    assert config_location(keyword(sg, Path("rel.yaml")))[0] == str(tmp_path / "rel.yaml")
    assert config_location(keyword(sg, "~/p.yaml"))[0] == str(tmp_path / "home" / "p.yaml")


def test_keyword_beats_the_env_var_and_none_falls_back(sg, monkeypatch, tmp_path):
    from sglang_specvocab.integration.algorithm import ENV, FLAG, config_location, default_config_path

    monkeypatch.setenv(ENV, str(tmp_path / "env.yaml"))
    assert config_location(keyword(sg, str(FULL))) == (str(FULL), FLAG)
    assert config_location(keyword(sg, None)) == (str(tmp_path / "env.yaml"), f"${ENV}")
    monkeypatch.delenv(ENV)
    assert config_location(keyword(sg, None))[0] == str(default_config_path())


def _child(queue, server_args):
    """Runs in a spawned process, like SGLang's scheduler: the record is unpickled before any plug-in loads."""
    try:
        loaded_before = "sglang_specvocab.integration.plugin" in sys.modules
        from sglang_specvocab.integration.algorithm import config_location

        queue.put(("ok", loaded_before, type(server_args).__name__, config_location(server_args)))
    except BaseException as exc:  # noqa: BLE001  (report, do not hang the parent)
        import traceback

        queue.put(("error", repr(exc), traceback.format_exc(), None))


def test_keyword_travels_with_the_pickled_record(sg):
    from sglang_specvocab.integration.algorithm import FLAG, config_location

    sa = keyword(sg, str(FULL))
    copy = pickle.loads(pickle.dumps(sa))
    assert config_location(copy) == (str(FULL), FLAG)

    result = spawn_result(_child, sa)
    assert result[0] == "ok", result[2]
    # SGLang's class in the fresh child, which needed nothing of the plug-in to unpickle it
    assert result[1:] == (False, "ServerArgs", (str(FULL), FLAG))


def test_bad_config_files_are_refused_with_the_flags_message(sg, tmp_path):
    from sglang.srt.server_args import prepare_server_args

    typo = tmp_path / "typo.yaml"
    typo.write_text("policy: window\ncapacity: 8\nwindw: {}\n")
    cycle = tmp_path / "cycle.yaml"  # contains itself (an alias inside its anchor): one ConfigError, no recursion
    cycle.write_text("&top\npolicy: union\nmembers:\n  - *top\n")
    cases = [(tmp_path / "missing.yaml", "cannot read config file"), (typo, "unknown key 'windw'")]
    for path, part in [*cases, (cycle, "(cycle: top level -> members[0] -> top level)")]:
        by_keyword = refusal(keyword(sg, str(path)))
        by_flag = refusal(prepare_server_args(flag_args(sg, path)))
        assert by_keyword == by_flag
        assert part in by_keyword and f"DYNVOCAB policy config {path}" in by_keyword


def test_a_wrong_keyword_is_refused_when_the_record_is_built(sg):
    from sglang_specvocab.errors import ConfigError

    for value, shown in ((3, "int 3"), (b"p.yaml", "bytes b'p.yaml'"), (["p.yaml"], "list ['p.yaml']")):
        with pytest.raises(ConfigError) as info:
            keyword(sg, value)
        assert str(info.value) == (
            "speculative_dynvocab_config must be the path of a DYNVOCAB policy YAML (a str or os.PathLike), "
            f"got {shown}"
        )
    # a misspelt keyword is still SGLang's own refusal, not silently dropped
    with pytest.raises(TypeError, match="Unexpected keyword argument 'speculative_dynvocab_cfg'"):
        engine_server_args(**fields(sg), speculative_dynvocab_cfg=str(FULL))
    # ServerArgs(...) is SGLang's class, which has no such field: its own refusal (docs/serving.md names the ways that work)
    from sglang.srt.server_args import ServerArgs

    with pytest.raises(TypeError, match="Unexpected keyword argument 'speculative_dynvocab_config'"):
        ServerArgs(**fields(sg), speculative_dynvocab_config=str(FULL))


def test_keyword_for_another_algorithm_warns_like_the_flag(sg, caplog):
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()  # prepare_server_args would reset the logging caplog reads
    ServerArgs.add_cli_args(parser)
    args = flag_args(sg, FULL)
    args[args.index("DYNVOCAB")] = "EAGLE3"
    with caplog.at_level("WARNING", logger="sglang_specvocab.integration.plugin"):
        keyword(sg, str(FULL))  # DYNVOCAB: no warning
        assert caplog.messages == []
        keyword(sg, str(FULL), speculative_algorithm="EAGLE3")
        ServerArgs.from_cli_args(parser.parse_args(args))
    assert caplog.messages == [
        "speculative_dynvocab_config is ignored: the speculative algorithm is EAGLE3, not DYNVOCAB",
        "--speculative-dynvocab-config is ignored: the speculative algorithm is EAGLE3, not DYNVOCAB",
    ]


def test_sglangs_config_yaml_names_the_flag(sg, tmp_path):
    """SGLang's ``--config`` YAML takes the flag by its name, as every other server option."""
    from sglang.srt.server_args import prepare_server_args

    from sglang_specvocab.integration.algorithm import FLAG, config_location

    yaml = tmp_path / "server.yaml"
    yaml.write_text(
        f"model-path: {sg.target}\nspeculative-algorithm: DYNVOCAB\n"
        f"speculative-draft-model-path: {sg.root / 'draft-full'}\ndevice: cpu\n"
        f"speculative-dynvocab-config: {FULL}\n"
    )
    assert config_location(prepare_server_args(["--config", str(yaml)])) == (str(FULL), FLAG)


def test_an_engine_module_imported_after_the_plugins_loaded_takes_the_keyword(sg, monkeypatch):
    """A script that loaded the plug-ins before it imported SGLang's engine module: ``Engine.__init__`` calls
    ``load_plugins()`` (hooked) before it builds the record, which wraps the class attribute then."""
    import sglang.srt.entrypoints.engine as engine_module
    from sglang.srt.server_args import ServerArgs

    from sglang_specvocab.integration.algorithm import FLAG, config_location

    monkeypatch.setattr(engine_module.Engine, "server_args_class", ServerArgs)  # as a fresh import binds it
    assert type(engine_server_args(**fields(sg))) is ServerArgs
    assert config_location(keyword(sg, str(FULL))) == (str(FULL), FLAG)
    assert engine_module.Engine.server_args_class.__wrapped__ is ServerArgs


def test_engine_builds_its_record_with_the_keyword(sg, monkeypatch):
    from sglang.srt.server_args import ServerArgs

    from sglang_specvocab.integration.algorithm import ENV, FLAG, config_location, load_server_config

    monkeypatch.setenv(ENV, str(CONFIGS / "microspec.yaml"))  # the keyword must win over it
    sa = engine_server_args(**fields(sg), speculative_dynvocab_config=str(FULL))
    assert config_location(sa) == (str(FULL), FLAG) and type(sa) is ServerArgs
    sa.resolve_once()
    assert load_server_config(sa).policy == "full"
    assert config_location(pickle.loads(pickle.dumps(sa))) == (str(FULL), FLAG)


ENGINE_SCRIPT = """
import json, sys
import sglang
import sglang.srt.entrypoints.engine as engine_module
from sglang_specvocab.errors import SpecVocabError
from sglang_specvocab.integration.algorithm import config_location

class Resolved(Exception):
    pass

def stop(server_args):  # Engine._launch_subprocesses: resolve_once(), then this; nothing is launched
    raise Resolved(server_args)

engine_module._set_envs_and_config = stop
fields, config, missing = json.loads(sys.argv[1])
try:
    sglang.Engine(**fields, speculative_dynvocab_config=config)
except Resolved as done:
    print("LOCATION", json.dumps(config_location(done.args[0])))
try:
    sglang.Engine(**fields, speculative_dynvocab_config=missing)
except SpecVocabError as exc:
    print("REFUSED", json.dumps(str(exc)))
"""


def test_sglang_engine_call_in_a_fresh_process(sg, tmp_path):
    """``sglang.Engine(...)`` as a user's script calls it: the plug-in loads inside ``Engine.__init__`` (through the
    entry point), after SGLang bound ``Engine.server_args_class``; stopped right after resolution."""
    from sglang.srt.server_args import prepare_server_args

    from sglang_specvocab.integration.algorithm import FLAG
    from sglang_specvocab.tools.testing.standins import child_preamble

    missing = tmp_path / "missing.yaml"
    run = subprocess.run(
        [sys.executable, "-c", child_preamble() + ENGINE_SCRIPT, json.dumps([fields(sg), str(FULL), str(missing)])],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=tmp_path,
    )
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in run.stdout.splitlines() if " " in line}
    assert run.returncode == 0 and "LOCATION" in lines and "REFUSED" in lines, run.stderr[-3000:]
    assert json.loads(lines["LOCATION"]) == [str(FULL), FLAG]
    assert json.loads(lines["REFUSED"]) == refusal(prepare_server_args(flag_args(sg, missing)))
