"""latchwork's runner layer: the node process, the task loop, the CLI and the dev servers."""

#: the one place the version is defined (pyproject.toml reads it); a store format change needs a
#: new one (runner.store.migrations.RELEASES, checked by tests/test_store_format.py)
__version__ = "0.3.0.dev0"
