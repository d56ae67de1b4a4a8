"""``python -m sglang_specvocab.tools.record_sglang``: print the installed SGLang's signatures and source hashes of the recorded
targets, in ``upstream.py``'s format, each changed one marked ``# CHANGED``.

Compare them with ``upstream.py`` after reading what changed in the SGLang source (a changed hash: port that body
into its copy in ``from-sglang/`` first).
A target whose module exists but fails to import (a missing optional dependency, say) is reported as
``# IMPORT FAILED``, not as a changed signature: its signature could not be read at all. On a machine
without torchvision/vllm (a CPU machine) their empty stand-ins are served first, as the tests do.
Exit status: 0 all recorded signatures and hashes match, 1 some changed or are missing, 2 some could not be imported
(3 both).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

from ..copies import (
    installed_sglang_version,
    recorded_bodies,
    recorded_signatures,
    signature_text,
    source_hash,
    supported_versions,
)
from .testing.standins import install

CHANGED, IMPORT_FAILED = 1, 2


class _ImportFailed(Exception):
    """The target's module exists but importing it raised."""


def resolve(target: str) -> Any:
    """The object named ``target``: modules imported part by part, then attributes.

    Raises ``_ImportFailed`` when a module on the path exists but raises on import, and
    ``AttributeError``/``ImportError`` when the target is not there (a real change)."""
    parts = target.split(".")
    obj: Any = None
    for i, part in enumerate(parts):
        name = ".".join(parts[: i + 1])
        is_module = obj is None or (hasattr(obj, "__path__") and not hasattr(obj, part))
        if is_module and importlib.util.find_spec(name) is not None:  # the parent is imported already
            try:
                obj = importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 -- the module exists but raised: its targets cannot be read
                raise _ImportFailed(f"importing {name}: {type(exc).__name__}: {exc}") from None
        elif obj is None:
            raise ImportError(f"no module {name!r}")
        else:
            obj = getattr(obj, part)
    return obj


def main() -> int:
    install()  # only for those of torchvision/vllm that are not installed
    version = installed_sglang_version()
    base = version if version in supported_versions() else supported_versions()[-1]
    print(f"# installed SGLang {version}; targets recorded for {base}")
    status, counts, first_failure = 0, {"unchanged": 0, "changed": 0, "import failed": 0}, None
    groups = [(group, recorded, signature_text) for group, recorded in recorded_signatures(base).items()]
    groups += [(group, recorded, source_hash) for group, recorded in recorded_bodies().items()]
    for group, recorded, read in groups:
        print(f"{group} = {{")
        for target, want in recorded.items():
            try:
                got = read(resolve(target))
                mark = "" if got == want else "  # CHANGED"
            except _ImportFailed as exc:
                got, mark = f"<not checked: {exc}>", "  # IMPORT FAILED"
                first_failure = first_failure or str(exc)
            except (ImportError, AttributeError, ValueError) as exc:
                got, mark = f"<missing: {exc}>", "  # CHANGED"
            except (OSError, TypeError) as exc:  # source_hash: no source to read, so not the recorded body
                got, mark = f"<no source: {exc}>", "  # CHANGED"
            kind = {"": "unchanged", "  # CHANGED": "changed"}.get(mark, "import failed")
            counts[kind] += 1
            status |= {"unchanged": 0, "changed": CHANGED, "import failed": IMPORT_FAILED}[kind]
            print(f"    {target!r}: {got!r},{mark}")
        print("}")
    print(f"# {sum(counts.values())} targets: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    if first_failure:
        print(f"# some SGLang modules could not be imported, so their signatures were not checked: {first_failure}")
    return status


if __name__ == "__main__":
    sys.exit(main())
