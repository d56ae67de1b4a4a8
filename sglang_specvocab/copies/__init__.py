"""SGLang-version-specific code and the checks that the installed SGLang is the one it was written for.

One folder per supported SGLang version, ``sglang-<version>/`` next to this file. The folder name is
not a Python identifier on purpose: nothing imports it by accident; its modules are loaded by path
(``load_copy``). Each folder holds

- ``signatures.py``: ``PLUGIN`` and ``WORKER``, the recorded signature of every SGLang callable the
  plug-in subclasses, overrides, wraps or calls by a private name (see ``signature_text``);
- the copied-and-trimmed SGLang methods the integration needs (``eagle_worker_v2.py`` ...).

``check_sglang()`` runs when the plug-in loads: it refuses any SGLang version without a folder here,
with a message naming the installed and the supported versions, then compares ``PLUGIN`` (and
``WORKER`` where the worker modules are already imported; ``integration.plugin`` checks ``WORKER``
again before it hands out the worker class). A changed signature is refused with the target, the
recorded and the installed signature: adapt the copies, then re-record. The plug-in logs a refusal as
one warning line and stays out of that SGLang.

``python -m sglang_specvocab.copies`` prints the installed signatures in the recorded format.

``has_draft_topk_hook()``: whether the installed SGLang has the hooks of the repository's
``patches/sglang-0.5.23-draft-topk-hook.diff`` (a draft top-k supplied by the plug-in, a prefill event,
the draft worker class as a class attribute). Where it does, the worker uses SGLang's own methods and
none of the copies (``integration/worker.py`` decides once, when it is imported); their signatures are
``HOOK`` in ``signatures.py``.
"""

from __future__ import annotations

import importlib.util
import inspect
import pkgutil
import sys
from functools import cache
from importlib import metadata
from pathlib import Path
from types import ModuleType

from ..errors import SpecVocabError

PATCH_ROOT = Path(__file__).resolve().parent
_MODULE_PREFIX = "sglang_specvocab.copies._loaded"


class SGLangCompatibilityError(SpecVocabError):
    """The installed SGLang is not one this plug-in supports (version or a changed signature)."""


def supported_versions() -> list[str]:
    """The SGLang versions with a patch folder, sorted."""
    found = [p.name.removeprefix("sglang-") for p in PATCH_ROOT.glob("sglang-*") if (p / "signatures.py").is_file()]
    return sorted(found, key=lambda v: [int(x) if x.isdigit() else x for x in v.split(".")])


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
            f"install a supported version (pip install 'sglang=={supported[-1]}') or add "
            f"sglang_specvocab/copies/sglang-<version>/ after porting the copied methods"
        )
    return version


def patch_dir(version: str | None = None) -> Path:
    """The folder of ``version`` (default: the installed, checked version)."""
    return PATCH_ROOT / f"sglang-{check_sglang_version(version)}"


def load_copy(name: str, version: str | None = None) -> ModuleType:
    """Module ``name`` of the version folder, loaded by path once per process."""
    version = check_sglang_version(version)
    key = f"{_MODULE_PREFIX}.v{version.replace('.', '_').replace('-', '_')}.{name}"
    if key in sys.modules:
        return sys.modules[key]
    path = PATCH_ROOT / f"sglang-{version}" / f"{name}.py"
    if not path.is_file():
        raise SGLangCompatibilityError(f"{path}: missing; the patch folder of SGLang {version} is incomplete")
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
    """``{"PLUGIN": {...}, "WORKER": {...}}`` recorded for ``version`` (default: the installed one)."""
    mod = load_copy("signatures", version)
    return {"PLUGIN": dict(mod.PLUGIN), "WORKER": dict(mod.WORKER)}


def check_signatures(recorded: dict[str, str]) -> None:
    """Compare each ``target -> signature`` with the installed SGLang; raise listing every difference."""
    problems = []
    for target, want in recorded.items():
        try:
            got = signature_text(pkgutil.resolve_name(target))
        except (ImportError, AttributeError, ValueError) as exc:
            problems.append(f"  {target}: not found in the installed SGLang ({type(exc).__name__}: {exc})")
            continue
        if got != want:
            problems.append(f"  {target}:\n    recorded  {want}\n    installed {got}")
    if problems:
        raise SGLangCompatibilityError(
            f"the installed SGLang {installed_sglang_version()} differs from what sglang-specvocab was written "
            "for; these SGLang callables changed (port the copies in sglang_specvocab/copies/, then re-record "
            "their signatures):\n" + "\n".join(problems)
        )


WORKER_MODULE = "sglang.srt.speculative.eagle_worker_v2"


def check_sglang(*, worker: bool | None = None) -> str:
    """The plug-in load check: version, then ``PLUGIN`` signatures, then ``WORKER`` ones.

    ``worker=None`` checks ``WORKER`` only when its modules are already imported (importing them costs
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
            "sglang-specvocab knows the hook of patches/sglang-0.5.23-draft-topk-hook.diff only"
        )
    check_signatures(load_copy("signatures").HOOK)
    return True


@cache
def _worker_checked(version: str) -> bool:
    check_signatures(recorded_signatures(version)["WORKER"])
    return True


def check_worker_signatures() -> None:
    """Check ``WORKER`` (once per process when it passes)."""
    _worker_checked(check_sglang_version())


__all__ = [
    "PATCH_ROOT",
    "SGLangCompatibilityError",
    "check_sglang",
    "check_sglang_version",
    "check_signatures",
    "check_worker_signatures",
    "has_draft_topk_hook",
    "installed_sglang_version",
    "load_copy",
    "patch_dir",
    "recorded_signatures",
    "signature_text",
    "supported_versions",
]
