"""What the tests share: data builders, stand-ins, process handles and page helpers (plain functions and
classes). Test modules import from here only, never from another test module or a conftest
(tests/core/test_architecture.py checks it); fixtures stay in the conftest.py files, which build them from
these helpers. tests/README.md says how the tests are laid out."""
