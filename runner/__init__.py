"""latchwork's runner layer: the node process, the task loop, the CLI and the dev servers."""

__version__ = "0.1.0"
