"""The python blocks of docs/guide.md run (tests/guide.rs runs its shell blocks)."""
import os
import re

import pytest

from conftest import REPO

BLOCKS = re.findall(r"^```python\n(.*?)^```", (REPO / "docs" / "guide.md").read_text(), flags=re.S | re.M)


def test_the_guide_has_python_blocks():
    assert BLOCKS


@pytest.mark.parametrize("code", BLOCKS)
def test_a_python_block_of_the_guide_runs(code, zoo, monkeypatch):
    monkeypatch.setenv("KILN_ZOO", str(zoo))
    exec(compile(code, "docs/guide.md", "exec"), {})
