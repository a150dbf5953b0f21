"""README.md states the answer from the committed records, briefly and without history."""

import re

from analysis import headline
from tests.conftest import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def test_the_headline_table_is_the_records():
    """README.md's table is what analysis.headline makes of results/current (regenerate it with
    `python -m analysis.headline --write` after promoting new records)."""
    assert headline.spliced(README, headline.table()) == README


def test_the_headline_covers_every_op_with_current_records():
    ops = {row["op"] for row in headline.rows()}
    assert ops == {"matmul", "linear", "softmax", "conv"}
    for row in headline.rows():
        assert row["triton"] is not None, row


def test_the_readme_is_short_and_names_no_rounds():
    assert len(README.splitlines()) <= 200
    assert not re.search(r"\bround \d+|\b_r\d+\b|\bprobe_", README, flags=re.IGNORECASE)


def test_the_readme_links_resolve():
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if "://" not in target:
            assert (REPO_ROOT / target).exists(), target
