"""The SGLang plug-in entry point: ``sglang.srt.plugins: dynvocab = sglang_specvocab.integration.plugin:register``.

SGLang's ``load_plugins()`` calls ``register()`` in every server process (launcher, tokenizer,
detokenizer, each spawned scheduler), possibly more than once; ``register()`` is idempotent. It

1. checks the installed SGLang (``sglang_specvocab.copies.check_sglang``: version 0.5.23 only, and
   the recorded signatures of everything the plug-in subclasses, overrides or calls privately);
2. registers ``DYNVOCAB`` with ``SpeculativeAlgorithm.register`` (spec class ``DynVocabAlgo``,
   overlap scheduling supported, ``validate_server_args`` = the refusals of ``algorithm.py``); the
   worker factory imports the worker module only when the scheduler asks for the worker class;
3. adds the server flag ``--speculative-dynvocab-config PATH``;
4. lets SGLang's ``--speculative-adaptive`` run with DYNVOCAB: SGLang's own check
   (``adaptive_spec_params.adaptive_unsupported_reason``) accepts the names EAGLE and EAGLE3 only and
   otherwise turns adaptive off with a warning; an ``AROUND`` hook answers "supported" for DYNVOCAB,
   whose ``validate_server_args`` (run before it) already refused every option adaptive cannot run with
   (``algorithm.check_adaptive``). Every other algorithm gets SGLang's answer unchanged.

How the flag is added (the least fragile way in 0.5.23): ``ServerArgs`` is a ``msgspec`` Struct whose
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

The keyword ``speculative_dynvocab_config=PATH`` of ``ServerArgs(...)`` and ``sglang.Engine(...)`` (the
offline API: ``Engine.__init__`` calls ``load_plugins()``, then ``self.server_args_class(**kwargs)``). A
Struct's constructor is msgspec's C code: it refuses an unknown keyword and calls no Python ``__init__``
or ``__new__`` a hook could wrap, so the one way in is a class that has the field.
``DynVocabServerArgs`` is ``ServerArgs`` plus that one optional field, without CLI metadata (the flag
stays the only CLI spelling); its ``__post_init__`` and the flag's hook both go through ``_keep_config``
(same normalisation, type check, warning and ``_dynvocab_config``). A ``REPLACE`` hook on
``sglang.srt.server_args.ServerArgs`` puts it where the class is looked up (the module attribute and
every module global bound to SGLang's class: ``HookRegistry`` propagates a class replacement), and
``register`` points ``Engine.server_args_class`` (a class attribute, which the propagation misses) at
it. The flag's two hooks stay on SGLang's class (``SGLANG_SERVER_ARGS``), which the subclass inherits.
A subclass keeps ``isinstance(..., ServerArgs)`` true; SGLang's resolution leaves a field outside its
namespaces out of the runtime namespace bags; the record pickles by reference to this module, which a
spawned child imports when it unpickles the record, before it loads the plug-ins. A ``ServerArgs``
built before ``load_plugins()`` ran is SGLang's own class and refuses the keyword (msgspec's
"Unexpected keyword argument"); ``Engine(...)`` loads the plug-ins itself. Precedence: the flag or the
keyword, else ``$SGLANG_DYNVOCAB_CONFIG`` (children inherit the environment), else the
``microspec.yaml`` shipped in ``sglang_specvocab.configs``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from sglang.srt import server_args as _server_args  # the module: HookRegistry rebinds the name ServerArgs
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import get_spec

from ..copies import SGLangCompatibilityError, check_sglang, check_worker_signatures
from ..errors import ConfigError, SpecVocabError
from .algorithm import ATTR, ENV, FLAG, NAME, DynVocabAlgo, validate_server_args

logger = logging.getLogger(__name__)

DEST = "speculative_dynvocab_config"  # the keyword (a field of DynVocabServerArgs)
# The flag's argparse dest: not the field's name, so from_cli_args does not pass the flag's value as the
# keyword; from_cli_args_hook keeps it, for SGLang's class and the subclass alike, and its messages name the flag.
FLAG_DEST = "dynvocab_config_flag"
SERVER_ARGS = "sglang.srt.server_args.ServerArgs"
ENGINE_MODULE = "sglang.srt.entrypoints.engine"
# SGLang's own class, whatever ``SERVER_ARGS`` names by the time hooks apply (the class REPLACE goes first): the
# flag's hooks sit on it, so DynVocabServerArgs inherits them and code that kept SGLang's class still gets them.
# Named through __base__ only: HookRegistry's propagation rebinds every module global that holds SGLang's class.
SGLANG_SERVER_ARGS = f"{__name__}.DynVocabServerArgs.__base__"
HOOK_TARGETS = (
    SERVER_ARGS,
    f"{SGLANG_SERVER_ARGS}.add_cli_args",
    f"{SGLANG_SERVER_ARGS}.from_cli_args",
    "sglang.srt.speculative.adaptive_spec_params.adaptive_unsupported_reason",
)

_registered = False


def register() -> None:
    """Register DYNVOCAB and the flag (idempotent). Raises if the installed SGLang is unsupported."""
    global _registered
    if _registered:
        return
    try:
        check_sglang()
    except SGLangCompatibilityError as exc:
        # load_plugins() logs a plug-in's exception and goes on, so a launch with
        # --speculative-algorithm DYNVOCAB would only say "unknown algorithm". Register a refusing
        # stand-in (when this SGLang's registry still allows it) so resolution fails with the reason.
        _register_refusal(exc)
        raise
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
    _register_cli_hooks()
    _install_engine_server_args()
    _install_refusal_hook()
    _registered = True


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


def _register_refusal(reason: Exception) -> None:
    def refuse(server_args):
        raise reason

    try:
        if get_spec(NAME) is None:
            SpeculativeAlgorithm.register(NAME, supports_overlap=True, validate_server_args=refuse)(refuse)
    except Exception:  # an SGLang whose registry differs: the logged reason is all we can give
        logger.exception("could not register a refusing %s stand-in", NAME)


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
        path = _keep_config(result, value, FLAG)
        if isinstance(result, DynVocabServerArgs):
            result.speculative_dynvocab_config = path  # the record shows it as the keyword would
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


# --- the keyword (ServerArgs(...), Engine(...)) -----------------------------------------------------


class DynVocabServerArgs(_server_args.ServerArgs):
    """SGLang's ``ServerArgs`` plus the keyword ``speculative_dynvocab_config`` (installed by ``register``).

    A plain annotation (no ``A[..., Arg]``): SGLang derives no CLI flag from it; ``add_cli_args`` and
    ``from_cli_args`` are SGLang's, hooked. ``__post_init__`` runs for every construction, an unpickled
    copy included (the value is then already absolute).
    """

    speculative_dynvocab_config: str | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.speculative_dynvocab_config is not None:
            self.speculative_dynvocab_config = _keep_config(self, self.speculative_dynvocab_config, DEST)


def _install_engine_server_args() -> None:
    """``Engine.server_args_class`` was bound to SGLang's class when the engine module was imported (an
    engine module imported later binds ``DynVocabServerArgs`` through the module attribute). Inside
    ``Engine(...)`` this runs before ``self.server_args_class(**kwargs)``. A class a fork put there stays."""
    engine = sys.modules.get(ENGINE_MODULE)
    cls = getattr(engine, "Engine", None)
    if cls is not None and cls.__dict__.get("server_args_class") is DynVocabServerArgs.__base__:
        cls.server_args_class = DynVocabServerArgs


# --- --speculative-adaptive ------------------------------------------------------------------------


def adaptive_reason_hook(original, server_args):
    """AROUND ``adaptive_unsupported_reason(server_args)``: None (supported) for DYNVOCAB, SGLang's answer otherwise."""
    from sglang.srt.arg_groups.overrides import resolving_view  # late: resolution-time only

    if (resolving_view(server_args).speculative_algorithm or "").upper() == NAME:
        return None  # validate_server_args refused what adaptive cannot run with (algorithm.check_adaptive)
    return original(server_args)


def _register_cli_hooks() -> None:
    from sglang.srt.plugins import hook_registry as hr  # late: keeps the plug-in's import (every server process) light

    hooks = (
        (DynVocabServerArgs, hr.HookType.REPLACE),
        (add_cli_args_hook, hr.HookType.AFTER),
        (from_cli_args_hook, hr.HookType.AFTER),
        (adaptive_reason_hook, hr.HookType.AROUND),
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
    "SERVER_ARGS",
    "SGLANG_SERVER_ARGS",
    "DynVocabServerArgs",
    "adaptive_reason_hook",
    "add_cli_args_hook",
    "from_cli_args_hook",
    "register",
    "worker_factory",
]
