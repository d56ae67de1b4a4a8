"""``python -m sglang_specvocab``: the ``sglang-specvocab`` command (``cli.main``)."""

from .tools.cli import main

raise SystemExit(main())
