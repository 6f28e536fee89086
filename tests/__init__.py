"""depositd's tests. A package so that `tests.support` is importable from every test module
(pytest puts the folder holding `tests/` on `sys.path` when it loads `tests/conftest.py`)."""
