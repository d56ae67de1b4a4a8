"""The SGLang plug-in entry point: ``sglang.srt.plugins: dynvocab = sglang_specvocab.integration.plugin:register``.

SGLang's ``load_plugins()`` calls ``register()`` in every server process (launcher, tokenizer,
detokenizer, each spawned scheduler), possibly more than once; ``register()`` is idempotent. It

1. checks the installed SGLang (``sglang_specvocab.copies.check_sglang``: ``copies/upstream.py``'s version only, and
   the recorded signatures of everything the plug-in subclasses, overrides or calls privately). On any
   other SGLang it logs one warning line and returns: the plug-in stays out (no algorithm, flag or hook)
   and the process runs as without it. This module imports no SGLang before that check (``names``
   holds what it needs), so a moved SGLang module cannot fail the entry point's import either;
2. registers ``DYNVOCAB`` with ``SpeculativeAlgorithm.register`` (spec class ``DynVocabAlgo``,
   overlap scheduling supported, ``validate_server_args`` = the refusals of ``algorithm.py``); the
   worker factory imports the worker module only when the scheduler asks for the worker class;
3. adds the server flag ``--speculative-dynvocab-config PATH``;
4. lets ``sglang.Engine(...)`` take the same path as the keyword ``speculative_dynvocab_config``;
5. lets SGLang's ``--speculative-adaptive`` run with DYNVOCAB: SGLang's own check
   (``adaptive_spec_params.adaptive_unsupported_reason``) accepts the names EAGLE and EAGLE3 only and
   otherwise turns adaptive off with a warning; an ``AROUND`` hook answers "supported" for DYNVOCAB,
   whose ``validate_server_args`` (run before it) already refused every option adaptive cannot run with
   (``algorithm.check_adaptive``). Every other algorithm gets SGLang's answer unchanged.

A process that does not select DYNVOCAB keeps SGLang's own ``ServerArgs``: the plug-in replaces no class,
so every record, whenever it was built, is of SGLang's class (its ``isinstance`` checks, its fields and
``/server_info`` are unchanged). The visible additions are the flag in every parser (it does nothing
unless given) and DYNVOCAB among the algorithms.

How the flag is added (the least fragile way in the pinned SGLang): ``ServerArgs`` is a ``msgspec`` Struct whose
fields are collected from the ``arg_groups/fields`` namespaces when ``sglang.srt.server_args`` is
first imported, which happens before any plug-in runs, so a plug-in cannot add a *field* to it. The
parser, though, is built by the static method ``ServerArgs.add_cli_args(parser)`` and the record by
the class method ``ServerArgs.from_cli_args(args)``. Two ``AFTER`` hooks through SGLang's own plug-in
``HookRegistry`` (applied by ``load_plugins`` after all plug-ins ran) add the argument to the parser
and copy its value into the record as the bookkeeping attribute ``_dynvocab_config`` (an absolute
path). Bookkeeping attributes are allowed on the sealed record and travel with it: ``ServerArgs``
pickles its ``__dict__`` (``ServerArgs.__reduce__``), so the spawned scheduler sees the value. Both
hooked signatures are recorded and checked. Every launcher that builds its parser through
``ServerArgs.add_cli_args`` (``sglang serve``, ``python -m sglang.launch_server``,
``prepare_server_args``) gets the flag, and SGLang's ``--config`` YAML can name it too.

The keyword of ``sglang.Engine(...)`` (the offline API): ``Engine.__init__`` calls ``load_plugins()``,
then ``self.server_args_class(**kwargs)``. A Struct's constructor is msgspec's C code: it refuses an
unknown keyword and calls no Python ``__init__`` or ``__new__`` a hook could wrap, so ``ServerArgs(...)``
itself could take the keyword only through a subclass with the field put in place of SGLang's class in
every process (what an earlier version did: ``/server_info`` gained a field, and a record built before
the plug-ins loaded failed SGLang's ``isinstance`` checks against the rebound name). Instead ``register``
wraps the class attribute ``Engine.server_args_class`` in ``EngineServerArgs``: it takes the keyword out,
builds the record with the class that was there (SGLang's) and keeps the path as the flag's hook does
(``_keep_config``: the same normalisation, type check, warning and ``_dynvocab_config``); without the
keyword it is that class's own call. The engine module may be imported after the plug-ins loaded (a
script that called ``load_plugins()`` first); an ``AFTER`` hook on ``load_plugins``, which
``Engine.__init__`` calls before it builds the record, wraps it then. ``ServerArgs(...)`` does not take
the keyword (msgspec's "Unexpected keyword argument"): build such a record with
``prepare_server_args([..., "--speculative-dynvocab-config", PATH])``, or name the config by
``$SGLANG_DYNVOCAB_CONFIG``. Precedence: the flag or the keyword, else ``$SGLANG_DYNVOCAB_CONFIG``
(children inherit the environment), else the ``microspec.yaml`` shipped in ``sglang_specvocab.configs``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from ..copies import SGLangCompatibilityError, check_sglang, check_worker_signatures
from ..errors import ConfigError, SpecVocabError
from .names import ATTR, ENV, FLAG, NAME

logger = logging.getLogger(__name__)

DEST = "speculative_dynvocab_config"  # Engine's keyword
# The flag's argparse dest: not the keyword's name, so nothing mistakes it for a field of ServerArgs;
# from_cli_args_hook keeps it, and its messages name the flag.
FLAG_DEST = "dynvocab_config_flag"
SERVER_ARGS = "sglang.srt.server_args.ServerArgs"
ENGINE_MODULE = "sglang.srt.entrypoints.engine"
LOAD_PLUGINS = "sglang.srt.plugins.load_plugins"
HOOK_TARGETS = (
    f"{SERVER_ARGS}.add_cli_args",
    f"{SERVER_ARGS}.from_cli_args",
    "sglang.srt.speculative.adaptive_spec_params.adaptive_unsupported_reason",
    LOAD_PLUGINS,
)

_registered = False


def register() -> None:
    """Register DYNVOCAB, the flag and Engine's keyword (idempotent). On an unsupported SGLang: one warning, nothing
    registered."""
    global _registered
    if _registered:
        return
    try:
        check_sglang()
    except SGLangCompatibilityError as exc:
        # Raised, it would be a traceback from load_plugins() in every process; one line says why DYNVOCAB is missing.
        logger.warning("%s; the %s plug-in is not loaded", _one_line(exc), NAME)
        return
    # SGLang's modules: only once the installed SGLang is known to be supported
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    from .algorithm import DynVocabAlgo, validate_server_args

    existing = get_spec(NAME)
    if existing is None:
        SpeculativeAlgorithm.register(
            NAME,
            supports_overlap=True,
            validate_server_args=validate_server_args,
            spec_class=DynVocabAlgo,
        )(worker_factory)
    elif type(existing).__name__ != DynVocabAlgo.__name__:
        raise RuntimeError(f"speculative algorithm {NAME} is already registered by someone else: {existing!r}")
    _register_hooks()
    _install_engine_server_args()
    _install_refusal_hook()
    _registered = True


def _one_line(exc: Exception) -> str:
    """The check's message on one line: a signature report lists every change on lines of its own."""
    first, *rest = str(exc).splitlines()
    if not rest:
        return first
    return f"{first.rstrip(':')} (python -m sglang_specvocab.tools.record_sglang lists them)"


def _install_refusal_hook() -> None:
    """A refusal that reaches the top of a launch (``prepare_server_args`` raising in the launching
    process) is printed as one ``error: ...`` line with exit status 2, as the CLI does, instead of a
    traceback; any other exception goes to the previous hook. Only uncaught exceptions of the main
    thread reach ``sys.excepthook``: code that catches the refusal is unaffected."""
    previous = sys.excepthook
    if getattr(previous, "_dynvocab_refusal_hook", False):
        return

    def hook(exc_type, exc, tb):
        if issubclass(exc_type, SpecVocabError):
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)  # SystemExit from the hook sets the exit status
        previous(exc_type, exc, tb)

    hook._dynvocab_refusal_hook = True
    sys.excepthook = hook


def worker_factory(server_args):
    """``create_worker``'s factory: the worker class, after checking the worker-level signatures."""
    check_worker_signatures()
    from .worker import DynVocabWorkerV2  # SGLang's worker and model code: only in the scheduler, when asked

    return DynVocabWorkerV2


# --- the flag ---------------------------------------------------------------------------------


def add_cli_args_hook(result, parser):
    """AFTER ``ServerArgs.add_cli_args(parser)``: add ``--speculative-dynvocab-config``."""
    if any(FLAG in action.option_strings for action in parser._actions):
        return
    parser.add_argument(
        FLAG,
        dest=FLAG_DEST,
        type=str,
        default=None,
        metavar="PATH",
        help=f"The policy YAML of --speculative-algorithm {NAME} (sglang-specvocab). Default: ${ENV}, "
        "else the shipped microspec.yaml.",
    )
    return


def from_cli_args_hook(result, cls, args):
    """AFTER ``ServerArgs.from_cli_args(args)``: keep the flag's value on the record (absolute path)."""
    value = getattr(args, FLAG_DEST, None)
    if value is not None:
        _keep_config(result, value, FLAG)
    return result


def _keep_config(record: Any, value: Any, given_as: str) -> str:
    """Store the policy YAML path (absolute, ``~`` expanded, against this process's cwd) as ``ATTR``.

    Shared by the flag and the keyword, so both give the same path, the same errors and the same warning.
    """
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ConfigError(
            f"{given_as} must be the path of a {NAME} policy YAML (a str or os.PathLike), "
            f"got {type(value).__name__} {value!r}"
        )
    path = os.path.abspath(os.path.expanduser(value))
    setattr(record, ATTR, path)  # a bookkeeping attribute: allowed on the record before it is sealed
    algo = (getattr(record, "speculative_algorithm", None) or "").upper()
    if algo != NAME:
        logger.warning("%s is ignored: the speculative algorithm is %s, not %s", given_as, algo or "unset", NAME)
    return path


# --- the keyword of Engine(...) -------------------------------------------------------------------


class EngineServerArgs:
    """``Engine.server_args_class`` while the plug-in is loaded: the class that was there (SGLang's ``ServerArgs``),
    called without the keyword ``speculative_dynvocab_config``, whose path it keeps on the record as the flag's hook
    does. Without the keyword it is that class's own call; attribute reads go through to that class."""

    def __init__(self, server_args_class: type) -> None:
        self.__wrapped__ = server_args_class

    def __call__(self, *args, **kwargs):
        value = kwargs.pop(DEST, None)
        record = self.__wrapped__(*args, **kwargs)
        if value is not None:
            _keep_config(record, value, DEST)
        return record

    def __getattr__(self, name: str):
        if name == "__wrapped__":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.__wrapped__, name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self.__wrapped__!r}>"


def _install_engine_server_args() -> None:
    """Wrap ``Engine.server_args_class`` (once) where the engine module is imported; a later import is wrapped by
    ``load_plugins_hook``. Inside ``Engine(...)`` both run before ``self.server_args_class(**kwargs)``."""
    engine = sys.modules.get(ENGINE_MODULE)
    cls = getattr(engine, "Engine", None)
    current = None if cls is None else cls.__dict__.get("server_args_class")
    if current is not None and not isinstance(current, EngineServerArgs):
        cls.server_args_class = EngineServerArgs(current)


def load_plugins_hook(result):
    """AFTER ``load_plugins()``: an engine module imported after the plug-ins loaded gets its keyword here
    (``Engine.__init__`` calls ``load_plugins()`` first; the module binds the hooked function)."""
    _install_engine_server_args()
    return result


# --- --speculative-adaptive ------------------------------------------------------------------------


def adaptive_reason_hook(original, server_args):
    """AROUND ``adaptive_unsupported_reason(server_args)``: None (supported) for DYNVOCAB, SGLang's answer otherwise."""
    from sglang.srt.arg_groups.overrides import resolving_view  # late: resolution-time only

    if (resolving_view(server_args).speculative_algorithm or "").upper() == NAME:
        return None  # validate_server_args refused what adaptive cannot run with (algorithm.check_adaptive)
    return original(server_args)


def _register_hooks() -> None:
    from sglang.srt.plugins import hook_registry as hr  # late: keeps the plug-in's import (every server process) light

    hooks = (
        (add_cli_args_hook, hr.HookType.AFTER),
        (from_cli_args_hook, hr.HookType.AFTER),
        (adaptive_reason_hook, hr.HookType.AROUND),
        (load_plugins_hook, hr.HookType.AFTER),
    )
    for target, (hook, kind) in zip(HOOK_TARGETS, hooks, strict=True):
        if not any(h is hook for _, h, _ in hr.HookRegistry._hooks.get(target, ())):
            hr.HookRegistry.register(target, hook, kind)
    # Inside load_plugins() the hooks are applied after every plug-in ran; called directly (tests,
    # embedders), apply them now.
    if hr._current_plugin_source.get() is None:
        hr.HookRegistry.apply_hooks()


__all__ = [
    "DEST",
    "ENGINE_MODULE",
    "FLAG_DEST",
    "HOOK_TARGETS",
    "LOAD_PLUGINS",
    "SERVER_ARGS",
    "EngineServerArgs",
    "adaptive_reason_hook",
    "add_cli_args_hook",
    "from_cli_args_hook",
    "load_plugins_hook",
    "register",
    "worker_factory",
]
