"""A disk cache for data derived from model weights (clusters, rankers), keyed by the weights' hash."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: cache_dir is read by the model registry, which --help imports
    import torch


def write_whole(path: str | Path, write: Callable[[Path], object]) -> object:
    """``write(tmp)`` into a temporary file beside ``path`` (its suffix kept, for writers that read it), then renamed
    over ``path``: readers, and a process killed meanwhile, never see half a file, and no temporary file stays. A
    ``write`` that returns False (it wrote nothing: a plot without matplotlib) leaves ``path`` as it was. Returns
    what ``write`` returned."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        result = write(tmp)
        if result is not False:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; give it a normal file's mode
            os.replace(tmp, path)
        return result
    finally:
        tmp.unlink(missing_ok=True)


def cache_dir() -> Path:
    return Path(os.environ.get("SGLANG_SPECVOCAB_CACHE", Path.home() / ".cache" / "sglang_specvocab"))


def weights_key(*tensors: torch.Tensor, **params) -> str:
    """A short hash of the tensors' shapes, dtypes and bytes plus ``params`` (the build settings)."""
    import torch  # here, not at the top: cache_dir stays free of torch (see above)

    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    h.update(repr(sorted(params.items())).encode())
    return h.hexdigest()[:20]


def cached(kind: str, key: str, build: Callable[[], dict[str, torch.Tensor]], root: Path | None = None) -> dict:
    """``build()``'s tensors, computed once per ``(kind, key)`` and kept under the cache folder."""
    import torch  # here, not at the top: cache_dir stays free of torch (see above)

    path = (root or cache_dir()) / kind / f"{key}.pt"
    if path.is_file():
        try:
            return torch.load(path, weights_only=True)
        except Exception:  # noqa: BLE001, S110  (a damaged entry is rebuilt, never trusted)
            pass
    data = build()
    write_whole(path, lambda tmp: torch.save(data, tmp))
    return data
