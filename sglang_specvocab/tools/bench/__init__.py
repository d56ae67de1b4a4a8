"""Benchmarks and checks: ``kernels`` (the head ops against torch and the dense heads, ``timing`` and
``kernels_report``), ``specbench`` and ``lossless`` against SGLang servers, which ``server`` launches
and reaches. Every result records its device, versions and command.
"""
