"""Runs every ```python block of docs/migration.md, in order, each in a fresh namespace in a
temporary directory (the ```py blocks are the seed's code and are not run). The Agent Lightning
block gets `agl store` through AGL_STORE_URL (conftest.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from conftest import extra

PAGE = Path(__file__).resolve().parents[3] / "docs" / "migration.md"


def _blocks():
    text = PAGE.read_text()
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_the_page_has_the_seed_and_agl_blocks():
    text = PAGE.read_text()
    assert len(_blocks()) == 7
    assert text.count("```py\n") == 7


@pytest.mark.parametrize("index", range(7))
def test_block_runs(index, tmp_path, monkeypatch, request):
    code = _blocks()[index]
    for name in ("gymnasium", "agentlightning"):
        if name in code:
            extra(name)
    if "agentlightning" in code:
        monkeypatch.setenv("AGL_STORE_URL", request.getfixturevalue("agl_store"))
        monkeypatch.setenv("AGL_CURRENT_ROLE", "runner")
        monkeypatch.setenv("AGL_MANAGED_STORE", "0")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{PAGE.name} block {index + 1}", "exec"), {"__name__": f"migration_{index}"})
