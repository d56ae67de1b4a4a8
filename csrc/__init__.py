"""The kernel sources, shipped inside the package as ``sglang_specvocab.csrc`` so that a wheel built
without torch can compile them on first use (``sglang_specvocab/ops/_ext.py``, recipe in ``recipe.py``)."""
