"""``python -m sglang_specvocab.patches``: print the installed SGLang's signatures of the recorded targets.

Compare them with ``sglang-<version>/signatures.py`` after reading what changed in the SGLang source.
"""

from __future__ import annotations

import pkgutil
import sys

from . import installed_sglang_version, recorded_signatures, signature_text, supported_versions


def main() -> int:
    version = installed_sglang_version()
    base = version if version in supported_versions() else supported_versions()[-1]
    print(f"# installed SGLang {version}; targets recorded for {base}")
    status = 0
    for group, sigs in recorded_signatures(base).items():
        print(f"{group} = {{")
        for target, want in sigs.items():
            try:
                got = signature_text(pkgutil.resolve_name(target))
            except (ImportError, AttributeError, ValueError) as exc:
                got, status = f"<missing: {exc}>", 1
            mark = "" if got == want else "  # CHANGED"
            status |= int(bool(mark))
            print(f"    {target!r}: {got!r},{mark}")
        print("}")
    return status


if __name__ == "__main__":
    sys.exit(main())
