"""A plain SGLang (no ``--speculative-algorithm DYNVOCAB``) with the package installed behaves as without it.

Each child process below builds the same plain server arguments every way SGLang does (``ServerArgs(...)`` before
and after the plug-ins load, ``prepare_server_args``, ``Engine.server_args_class`` and a real ``sglang.Engine(...)``
stopped right after resolution) and reports what SGLang sees: the record's class, its fields, the dict
``/server_info`` serves (``build_server_info``) and the custom metric labels ``OpenAIServingBase`` keeps. One child
loads no plug-in (SGLang's switch ``SGLANG_PLUGINS``), one loads this one through its entry point, one loads it on
"another SGLang version"; the reports must be equal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict

import pytest

from sglang_specvocab.copies.upstream import SGLANG_VERSION

pytestmark = [pytest.mark.sglang, pytest.mark.usefixtures("no_dynvocab_env")]

CHILD = """
import json, sys
from types import SimpleNamespace

import msgspec

mode, fields, argv = json.loads(sys.argv[1])
if mode == "other-version":  # the plug-in's check sees an SGLang it does not support
    from sglang_specvocab import copies

    copies.installed_sglang_version = lambda: "0.6.0"

import sglang
import sglang.srt.entrypoints.engine as engine_module
import sglang.srt.server_args as server_args_module
from sglang.srt.entrypoints.openai import serving_base
from sglang.srt.plugins import hook_registry, load_plugins
from sglang.srt.server_args import prepare_server_args
from sglang.srt.speculative.spec_registry import get_spec
from sglang.srt.utils.common import build_server_info

# In a dict: HookRegistry rebinds every module global that holds a replaced class, this script's included.
SGLANG = {"ServerArgs": server_args_module.ServerArgs}
records = {"before plug-ins": server_args_module.ServerArgs(**fields)}
load_plugins()
cls = SGLANG["ServerArgs"]
records["ServerArgs(...)"] = server_args_module.ServerArgs(**fields)
records["prepare_server_args"] = prepare_server_args(argv)
records["Engine.server_args_class"] = engine_module.Engine.server_args_class(**fields)


class Resolved(Exception):
    pass


def stop(server_args):  # Engine._launch_subprocesses: resolve_once(), then this; nothing is launched
    raise Resolved(server_args)


engine_module._set_envs_and_config = stop
try:
    sglang.Engine(**fields)
except Resolved as done:
    records["Engine(...)"] = done.args[0]

serving_base.get_observability = lambda: SimpleNamespace(tokenizer_metrics_allowed_custom_labels=["tenant"])


def labels(record):
    handler = SimpleNamespace()
    serving_base.OpenAIServingBase.__init__(handler, SimpleNamespace(server_args=record))
    return sorted(handler.allowed_custom_labels or [])


def info(record):
    return json.loads(json.dumps(msgspec.to_builtins(build_server_info(record, {})), default=str))


print("REPORT " + json.dumps({
    "dynvocab": get_spec("DYNVOCAB") is not None,
    "hooked": sorted(hook_registry.HookRegistry._hooks),
    "class": {
        "sglang.srt.server_args": server_args_module.ServerArgs is cls,
        "serving_base": serving_base.ServerArgs is cls,
        "engine": engine_module.ServerArgs is cls,
        "fields": [f.name for f in msgspec.structs.fields(server_args_module.ServerArgs)],
    },
    "type is ServerArgs": {name: type(r) is cls for name, r in records.items()},
    "server_info": {name: info(r) for name, r in records.items()},
    "labels": {name: labels(r) for name, r in records.items()},
}))
"""


@pytest.fixture(scope="module")
def report(sg, tmp_path_factory):
    """``report(mode, **env)``: the child's report and its stderr (each asked once per module)."""
    from sglang_specvocab.tools.testing.standins import child_preamble

    # a fixed seed: resolution draws one otherwise
    fields = dict(model_path=str(sg.target), device="cpu", log_level="error", random_seed=7)
    argv = ["--model-path", str(sg.target), "--device", "cpu", "--log-level", "error", "--random-seed", "7"]
    done = {}

    def run_child(mode: str, **env) -> tuple[dict, str]:
        key = (mode, tuple(sorted(env.items())))
        if key not in done:
            run = subprocess.run(
                [sys.executable, "-c", child_preamble() + CHILD, json.dumps([mode, fields, argv])],
                capture_output=True,
                text=True,
                check=False,
                timeout=300,
                cwd=tmp_path_factory.mktemp("child"),
                env={**os.environ, **env},
            )
            lines = [line for line in run.stdout.splitlines() if line.startswith("REPORT ")]
            assert run.returncode == 0 and len(lines) == 1, run.stderr[-3000:]
            done[key] = json.loads(lines[0].removeprefix("REPORT ")), run.stderr
        return done[key]

    return run_child


NO_PLUGINS = {"SGLANG_PLUGINS": "none-of-them"}  # SGLang's switch: load only the plug-ins named
WAYS = ["before plug-ins", "ServerArgs(...)", "prepare_server_args", "Engine.server_args_class", "Engine(...)"]
SEEN = ("class", "type is ServerArgs", "server_info", "labels")  # what SGLang sees of the plain server


def test_a_plain_server_with_the_plugin_loaded_is_sglangs_own(report):
    without, _ = report("plain", **NO_PLUGINS)
    loaded, _ = report("plain")
    assert not without["dynvocab"] and loaded["dynvocab"]  # the switch worked; the entry point loaded the plug-in
    for got in (without, loaded):
        assert list(got["type is ServerArgs"]) == WAYS
        # the name SGLang binds everywhere is SGLang's class, and every record is of that class, not a subclass
        assert all(v is True for k, v in got["class"].items() if k != "fields"), got["class"]
        assert all(got["type is ServerArgs"].values()), got["type is ServerArgs"]
        # serving_base's isinstance check keeps the custom metric labels, a record from before the plug-ins included
        assert got["labels"] == {name: ["tenant"] for name in WAYS}
    assert loaded["class"]["fields"] == without["class"]["fields"]
    for name in WAYS:  # what /server_info serves, for each way of building the record
        assert loaded["server_info"][name] == without["server_info"][name], name


def test_another_sglang_version_is_one_warning_line_and_the_plugin_stays_out(report):
    without, _ = report("plain", **NO_PLUGINS)
    other, stderr = report("other-version")
    assert "Traceback" not in stderr and "Failed to" not in stderr, stderr[-3000:]
    mentions = [line for line in stderr.splitlines() if "0.6.0" in line]
    assert len(mentions) == 1, stderr[-3000:]
    assert f"supports SGLang {SGLANG_VERSION} only, but SGLang 0.6.0 is installed" in mentions[0]
    assert mentions[0].endswith("; the DYNVOCAB plug-in is not loaded"), mentions[0]
    # nothing registered: no algorithm, no hook; the plain server is SGLang's own
    assert other["dynvocab"] is False and other["hooked"] == without["hooked"] == []
    assert {k: other[k] for k in SEEN} == {k: without[k] for k in SEEN}


@pytest.mark.parametrize("failing", ["version", "signatures"])
def test_register_on_another_sglang_logs_one_line_and_registers_nothing(sg, monkeypatch, caplog, failing):
    """``register()`` itself (in this process the plug-in is already in: SGLang's registries are swapped for empty
    ones): one WARNING record, on one line, without a traceback; no algorithm, no hook, no exception."""
    from sglang.srt.plugins import hook_registry as hr
    from sglang.srt.speculative import spec_registry

    from sglang_specvocab import copies
    from sglang_specvocab.integration import plugin

    if failing == "version":
        monkeypatch.setattr(copies, "installed_sglang_version", lambda: "0.6.0")
    else:

        def changed(recorded):
            raise copies.SGLangCompatibilityError("these SGLang callables changed:\n  a.b:\n    recorded  (x)\n")

        monkeypatch.setattr(copies, "check_signatures", changed)
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(spec_registry, "_REGISTRY", {})
    monkeypatch.setattr(hr.HookRegistry, "_hooks", defaultdict(list))
    with caplog.at_level("INFO"):
        plugin.register()
    assert [(r.name, r.levelname, r.exc_info) for r in caplog.records] == [(plugin.__name__, "WARNING", None)]
    (message,) = caplog.messages
    assert "\n" not in message and message.endswith("; the DYNVOCAB plug-in is not loaded")
    if failing == "signatures":
        assert message.startswith(
            "these SGLang callables changed (python -m sglang_specvocab.tools.record_sglang lists them)"
        )
    assert spec_registry._REGISTRY == {} and hr.HookRegistry._hooks == {} and plugin._registered is False


def test_the_entry_module_imports_no_sglang_before_its_check():
    """On another SGLang a moved module must not fail the import of the entry point (a traceback per process)."""
    code = (
        "import sys\nimport sglang_specvocab.integration.plugin\n"
        "print(sorted(m for m in sys.modules if m == 'sglang' or m.startswith('sglang.')))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert run.stdout.strip() == "[]"
