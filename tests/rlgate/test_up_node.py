"""`rlgate up`'s one-line note on a node too old for OpenClaw, with a real `node` script
on PATH answering --version."""

from __future__ import annotations

import pytest

from rlgate.up_node import node_note


@pytest.mark.parametrize(
    ("version", "warned"),
    [("v22.3.0", True), ("v24.15.9", True), ("v24.16.0", False), ("v25.1.0", False)],
)
def test_an_old_node_is_named_in_one_line(tmp_path, monkeypatch, version, warned):
    node = tmp_path / "node"
    node.write_text(f"#!/bin/sh\necho {version}\n")
    node.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    note = node_note()
    assert (note is not None) == warned
    if warned:
        assert version in note and ">= 24.16" in note and "\n" not in note


def test_no_node_no_note(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert node_note() is None
