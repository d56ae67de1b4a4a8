"""The SGLang plug-in entry point: ``sglang.srt.plugins: dynvocab = sglang_specvocab.integration.plugin:register``.

SGLang's ``load_plugins()`` calls ``register()`` in every server process (launcher, tokenizer,
detokenizer, each spawned scheduler), possibly more than once; ``register()`` is idempotent. It

1. checks the installed SGLang (``sglang_specvocab.patches.check_sglang``: version 0.5.23 only, and
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
first imported, which happens before any plug-in runs, so a plug-in cannot add a *field*. The
parser, though, is built by the static method ``ServerArgs.add_cli_args(parser)`` and the record by
the class method ``ServerArgs.from_cli_args(args)``. Two ``AFTER`` hooks through SGLang's own plug-in
``HookRegistry`` (applied by ``load_plugins`` after all plug-ins ran) add the argument to the parser
and copy its value into the record as the bookkeeping attribute ``_dynvocab_config`` (an absolute
path). Bookkeeping attributes are allowed on the sealed record and travel with it: ``ServerArgs``
pickles its ``__dict__`` (``ServerArgs.__reduce__``), so the spawned scheduler sees the value. Both
hooked signatures are recorded and checked. Every launcher that builds its parser through
``ServerArgs.add_cli_args`` (``sglang serve``, ``python -m sglang.launch_server``,
``prepare_server_args``) gets the flag, and SGLang's ``--config`` YAML can name it too.
``Engine(...)``/``ServerArgs(**kwargs)`` take fields only: there, set ``SGLANG_DYNVOCAB_CONFIG``,
the fall-back the flag overrides (children inherit the environment). With neither, the ``microspec.yaml``
shipped in ``sglang_specvocab.configs`` is used.
"""

from __future__ import annotations

import logging
import os
import sys

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import get_spec

from ..errors import SpecVocabError
from ..patches import SGLangCompatibilityError, check_sglang, check_worker_signatures
from .algorithm import ATTR, ENV, FLAG, NAME, DynVocabAlgo, validate_server_args

logger = logging.getLogger(__name__)

DEST = "speculative_dynvocab_config"
HOOK_TARGETS = (
    "sglang.srt.server_args.ServerArgs.add_cli_args",
    "sglang.srt.server_args.ServerArgs.from_cli_args",
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
        dest=DEST,
        type=str,
        default=None,
        metavar="PATH",
        help=f"The policy YAML of --speculative-algorithm {NAME} (sglang-specvocab). Default: ${ENV}, "
        "else the shipped microspec.yaml.",
    )
    return


def from_cli_args_hook(result, cls, args):
    """AFTER ``ServerArgs.from_cli_args(args)``: keep the flag's value on the record (absolute path)."""
    value = getattr(args, DEST, None)
    if value is not None:
        setattr(result, ATTR, os.path.abspath(os.path.expanduser(value)))
        algo = (getattr(result, "speculative_algorithm", None) or "").upper()
        if algo != NAME:
            logger.warning("%s is ignored: --speculative-algorithm is %s, not %s", FLAG, algo or "unset", NAME)
    return result


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
    "HOOK_TARGETS",
    "adaptive_reason_hook",
    "add_cli_args_hook",
    "from_cli_args_hook",
    "register",
    "worker_factory",
]
