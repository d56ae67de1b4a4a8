"""The tools: the CPU policy lab, the EAGLE-3 trainer, the benchmarks, the command line, the test fixtures.

Nothing here is loaded by an SGLang server process; the core (the package's other modules) never imports from here
(``tests/test_imports.py``).
"""
