"""The SGLang-specific code and the checks that the installed SGLang is the one it was written for.

- ``upstream.py``: the seam, the one place that names the supported SGLang: ``SGLANG_VERSION``, the
  recorded signatures (``PLUGIN``, ``WORKER``, ``HOOK``) and the hashes of the upstream sources the
  copies reproduce (``BODIES``, ``KERNEL_BODIES``);
- ``from-sglang/``: the copied-and-trimmed SGLang methods the integration needs (``eagle_worker_v2.py``
  ...). The folder name is not a Python identifier on purpose: nothing imports it by accident (importing
  this package never imports SGLang's worker modules); its modules are loaded by path (``load_copy``).

``check_sglang()`` runs when the plug-in loads: it refuses any SGLang version but ``SGLANG_VERSION``,
with a message naming the installed and the supported versions, then compares ``PLUGIN`` (and the worker
checks where the worker modules are already imported; ``integration.plugin`` runs them again before it
hands out the worker class). The worker checks (``check_worker_signatures``, once per process) compare
``WORKER``, then, where the copies run, ``BODIES``. A changed signature is refused with the target, the
recorded and the installed signature; a changed body with the target and both hashes: port the copies,
then re-record. The plug-in logs a refusal as one warning line and stays out of that SGLang.

``python -m sglang_specvocab.tools.record_sglang`` prints the installed signatures and hashes in the recorded format.

``has_draft_topk_hook()``: whether the installed SGLang has the hooks of the repository's
``patches/sglang-draft-topk-hook.diff`` (a draft top-k supplied by the plug-in, a prefill event,
the draft worker class as a class attribute). Where it does, the worker uses SGLang's own methods and
none of the copies (``integration/worker.py`` decides once, when it is imported), so their upstream
bodies are not checked; the hook's signatures are ``HOOK`` in ``upstream.py``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import pkgutil
import sys
import textwrap
from functools import cache
from importlib import metadata
from pathlib import Path
from types import ModuleType

from ..errors import SpecVocabError
from . import upstream

COPIES_DIR = Path(__file__).resolve().parent / "from-sglang"
_MODULE_PREFIX = "sglang_specvocab.copies._loaded"


class SGLangCompatibilityError(SpecVocabError):
    """The installed SGLang is not one this plug-in supports (version or a changed signature)."""


def supported_versions() -> list[str]:
    """The SGLang versions the plug-in supports: ``upstream.SGLANG_VERSION`` only."""
    return [upstream.SGLANG_VERSION]


def installed_sglang_version() -> str | None:
    """The installed SGLang's version (distribution metadata, else ``sglang.__version__``), or None."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        pass
    try:
        import sglang  # optional: SGLang may be absent
    except ImportError:
        return None
    return getattr(sglang, "__version__", None)


def check_sglang_version(version: str | None = None) -> str:
    """Return the installed (or given) SGLang version if supported; else raise ``SGLangCompatibilityError``."""
    version = installed_sglang_version() if version is None else version
    supported = supported_versions()
    if version not in supported:
        installed = "is not installed" if version is None else f"{version} is installed"
        raise SGLangCompatibilityError(
            f"sglang-specvocab (DYNVOCAB) supports SGLang {', '.join(supported)} only, but SGLang {installed}; "
            f"install a supported version (pip install 'sglang=={supported[-1]}') or port the copies in "
            f"sglang_specvocab/copies/from-sglang/ and re-record sglang_specvocab/copies/upstream.py"
        )
    return version


def load_copy(name: str, version: str | None = None) -> ModuleType:
    """Module ``name`` of ``from-sglang/``, loaded by path once per process.

    ``version`` (default: the installed one) must be the supported version: the copies are its code."""
    check_sglang_version(version)
    key = f"{_MODULE_PREFIX}.{name}"
    if key in sys.modules:
        return sys.modules[key]
    path = COPIES_DIR / f"{name}.py"
    if not path.is_file():
        raise SGLangCompatibilityError(
            f"{path}: missing; the copies of SGLang {upstream.SGLANG_VERSION} are incomplete"
        )
    spec = importlib.util.spec_from_file_location(key, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    return module


def signature_text(obj) -> str:
    """``inspect.signature`` of ``obj`` without annotations: names, kinds and defaults only.

    Annotations are left out because SGLang writes them as strings in some modules and as objects in
    others; a renamed, added, removed or re-defaulted parameter still changes the text.
    """
    sig = inspect.signature(obj)
    empty = inspect.Parameter.empty
    params = [p.replace(annotation=empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def recorded_signatures(version: str | None = None) -> dict[str, dict[str, str]]:
    """``{"PLUGIN": {...}, "WORKER": {...}}`` recorded in ``upstream.py`` (``version``: checked, as the
    recording is of that version)."""
    check_sglang_version(version)
    return {"PLUGIN": dict(upstream.PLUGIN), "WORKER": dict(upstream.WORKER)}


def recorded_bodies() -> dict[str, dict[str, str]]:
    """``{"BODIES": {...}, "KERNEL_BODIES": {...}}``: the source hashes recorded in ``upstream.py``."""
    return {"BODIES": dict(upstream.BODIES), "KERNEL_BODIES": dict(upstream.KERNEL_BODIES)}


def source_hash(obj) -> str:
    """sha256 of ``obj``'s dedented source, first 16 hex digits: changes with any edit to the body.

    A Triton kernel (``triton.jit``) is hashed by the Python function it wraps (``.fn``)."""
    if not (inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isclass(obj)) and hasattr(obj, "fn"):
        obj = obj.fn
    source = textwrap.dedent(inspect.getsource(obj))
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _differences(recorded: dict[str, str], read, show, unreadable: tuple = ()) -> list[str]:
    """One line per ``target -> value`` of ``recorded`` that the installed SGLang does not match: missing, unreadable
    (``unreadable`` exceptions of ``read``) or other (``show(target, recorded, installed)``)."""
    problems = []
    for target, want in recorded.items():
        try:
            got = read(pkgutil.resolve_name(target))
        except (ImportError, AttributeError, ValueError) as exc:
            problems.append(f"  {target}: not found in the installed SGLang ({type(exc).__name__}: {exc})")
            continue
        except unreadable as exc:  # no source file: the body cannot be compared, so it is not trusted
            problems.append(f"  {target}: its source cannot be read ({type(exc).__name__}: {exc})")
            continue
        if got != want:
            problems.append(show(target, want, got))
    return problems


def check_bodies(recorded: dict[str, str]) -> None:
    """Compare each ``target -> source hash`` with the installed SGLang; raise listing every difference."""
    problems = _differences(
        recorded, source_hash, lambda t, want, got: f"  {t}: recorded {want}, installed {got}", (OSError, TypeError)
    )
    if problems:
        raise SGLangCompatibilityError(
            f"the installed SGLang {installed_sglang_version()} changed the body of SGLang code that "
            "sglang-specvocab copies (sglang_specvocab/copies/from-sglang/); port each change into its copy, "
            "then re-record the hashes in sglang_specvocab/copies/upstream.py "
            "(python -m sglang_specvocab.tools.record_sglang prints them), or use an SGLang with the draft top-k "
            "hook (patches/sglang-draft-topk-hook.diff):\n" + "\n".join(problems)
        )


def check_signatures(recorded: dict[str, str]) -> None:
    """Compare each ``target -> signature`` with the installed SGLang; raise listing every difference."""
    problems = _differences(
        recorded, signature_text, lambda t, want, got: f"  {t}:\n    recorded  {want}\n    installed {got}"
    )
    if problems:
        raise SGLangCompatibilityError(
            f"the installed SGLang {installed_sglang_version()} differs from what sglang-specvocab was written "
            "for; these SGLang callables changed (port the copies in sglang_specvocab/copies/, then re-record "
            "their signatures):\n" + "\n".join(problems)
        )


WORKER_MODULE = "sglang.srt.speculative.eagle_worker_v2"


def check_sglang(*, worker: bool | None = None) -> str:
    """The plug-in load check: version, then ``PLUGIN`` signatures, then the worker checks (``WORKER``, ``BODIES``).

    ``worker=None`` runs the worker checks only when its modules are already imported (importing them costs
    seconds and thousands of modules in processes that never build a worker); True forces it.
    """
    version = check_sglang_version()
    sigs = recorded_signatures(version)
    check_signatures(sigs["PLUGIN"])
    if worker or (worker is None and WORKER_MODULE in sys.modules):
        check_worker_signatures()
    return version


@cache
def has_draft_topk_hook() -> bool:
    """True where the installed SGLang has the draft top-k hook (checked against ``HOOK``), else False.

    Raises ``SGLangCompatibilityError`` if it has the hook with other signatures than the recorded ones.
    """
    from sglang.srt.speculative import eagle_worker_v2 as ew  # the worker module: imported only to build a worker

    if not hasattr(ew.EagleDraftWorker, "set_draft_topk_hook"):
        return False
    if getattr(ew.EAGLEWorkerV2, "draft_worker_cls", None) is not ew.EagleDraftWorker:
        raise SGLangCompatibilityError(
            "the installed SGLang has EagleDraftWorker.set_draft_topk_hook but not EAGLEWorkerV2.draft_worker_cls; "
            "sglang-specvocab knows the hook of patches/sglang-draft-topk-hook.diff only"
        )
    check_signatures(upstream.HOOK)
    return True


@cache
def _worker_checked(version: str) -> bool:
    check_signatures(recorded_signatures(version)["WORKER"])
    if not has_draft_topk_hook():  # the copies run: their upstream bodies must be the copied ones
        check_bodies(upstream.BODIES)
    return True


def check_worker_signatures() -> None:
    """Check ``WORKER``, then ``BODIES`` where the copies run (once per process when it passes)."""
    _worker_checked(check_sglang_version())


__all__ = [
    "COPIES_DIR",
    "SGLangCompatibilityError",
    "check_bodies",
    "check_sglang",
    "check_sglang_version",
    "check_signatures",
    "check_worker_signatures",
    "has_draft_topk_hook",
    "installed_sglang_version",
    "load_copy",
    "recorded_bodies",
    "recorded_signatures",
    "signature_text",
    "source_hash",
    "supported_versions",
]
