"""The seams to other libraries' private names: one module per library, the only place trl-warmup reaches
past a library's public API. Each module states the versions it was written against and checked on, lists
its targets (`TARGETS`), and `check()` resolves every one at the installed version
(tests/unit/test_compat.py), so a release that moved one fails in seconds, naming the seam function.
"""
