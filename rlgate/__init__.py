"""rlgate's product commands: the `rlgate` command line (`cli.py` and its `cli_*.py`
parts), `rlgate up` (`up.py`), `rlgate demo` (`demo*.py`) and `rlgate export`
(`export.py`). The top layer: it imports the gateway, the trainer, the engine and the
core; none of them imports it."""

__version__ = "0.1.0"
