"""rlgate core: settings, database access and API keys, shared by every rlgate process.

The bottom layer: it imports nothing from gateway, trainer or engine (tests/test_imports.py).
"""
