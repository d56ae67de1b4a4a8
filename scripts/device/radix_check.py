#!/usr/bin/env python3
"""Insert into and match against the pinned SGLang's radix cache on the CPU, through a chosen tree core.

How the device's "Rust TreeCore panicked ... UnknownKind(N)" was traced (README, finding 4): the
Rust tree core bundled in the sglang wheel is built against torch 2.14.1 and misreads tensors of
another torch. In an environment with the pinned sglang (plus `datasets`, which SGLang's test kits import):

    python scripts/device/radix_check.py rust     # torch 2.13: ok; torch 2.11: the panic (exit 1)
    python scripts/device/radix_check.py python   # the Python tree core: ok on both

Without the wheel's rust_tree_core/mem_cache*.so (the device stage drops it), "rust" resolves to the
Python tree core by itself; the first output line names the core that served.
"""

from __future__ import annotations

import sys
import types
from array import array

from sglang_specvocab.tools.testing.standins import install

install(("torchvision", "vllm"))  # stand-ins where they are missing (a CPU machine)


def main(backend: str) -> int:
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.test.kits.unified_radix_cache import fixtures
    from sglang.test.kits.unified_radix_cache.config import CacheConfig

    fixtures.get_device = lambda: "cpu"
    # The kits wrap the Rust core in a test-only inspection build the wheel does not ship: serve the
    # production core instead (imported only when chosen), and skip the kits' inspector assertion.
    kit = types.ModuleType("sglang.test.kits.unified_radix_cache.rust_unified_tree_core_inspector")

    def production_core(params):
        from sglang.srt.mem_cache.rust_tree_core.adapter import RustUnifiedTreeCore

        return RustUnifiedTreeCore(params)

    kit.RustUnifiedTreeCoreInspector = production_core
    sys.modules[kit.__name__] = kit
    fixtures.UnifiedTreeCoreInspectionInterface = object
    cache, allocator, _ = fixtures.build_fixture(CacheConfig(), tree_core_backend=backend)
    print(f"tree core: {type(cache.tree_core).__name__} (asked for {backend}); torch {torch.__version__}")
    tokens = list(range(10, 30))
    try:
        cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=allocator.alloc(len(tokens))))
        hit = fixtures.match_prefix(cache, tokens[:15]).device_prefix_len
    except RuntimeError as exc:
        print(f"failed: {exc}")
        return 1
    print(f"inserted {len(tokens)} tokens, matched a prefix of {hit} of 15")
    return 0 if hit == 15 else 1


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("rust", "python"):
        sys.exit("usage: radix_check.py rust|python")
    sys.exit(main(sys.argv[1]))
