"""README.md states the answer from the committed records, briefly and without history."""

import math
import re

import pandas as pd

from analysis import headline, study_summary
from tests.conftest import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def test_the_headline_table_is_the_records():
    """README.md's generated blocks are what analysis.headline makes of results/current: the
    per-op bench table and the study's (regenerate them with `python -m analysis.headline
    --write` after promoting new records or a study summary)."""
    assert headline.generated(README) == README


def test_the_study_block_says_where_the_study_goes_until_one_is_committed():
    block = README.split(headline.STUDY_START, 1)[1].split(headline.STUDY_END, 1)[0]
    if headline.study_summaries():
        assert "| op | pass | GPU |" in block
    else:
        assert "No study committed yet" in block and "docs/study.md" in block
        assert "| op | GPU |" in README.split(headline.START, 1)[1]  # the bench table stays


def test_the_headline_covers_every_op_with_current_records():
    ops = {row["op"] for row in headline.rows()}
    assert ops == {"matmul", "linear", "softmax", "conv"}
    for row in headline.rows():
        assert row["triton"] is not None, row


def summary(rows):
    """A study_summary table from (op, dtype, pass, ours, compile, fastest) and defaults."""
    table = []
    for op, dtype, pass_name, ours, compiled, fastest in rows:
        row = dict.fromkeys(study_summary.COLUMNS, math.nan)
        row.update(gpu="NVIDIA H100 80GB HBM3", op=op, dtype=dtype, shapes=2, fastest=fastest,
                   ours_mode="triton", ours_speedup=ours, ours_latency_speedup=ours / 2,
                   ours_compile_cold_s=0.5, compile_mode="max-autotune",
                   compile_speedup=compiled, compile_latency_speedup=compiled * 2,
                   compile_cold_s=3.0, compile_warm_s=1.0, compile_fused_attention=0,
                   static_view_gain_max_autotune=1.2,
                   static_view_latency_gain_max_autotune=1.5, rows_ok=20, rows_failed=0,
                   rows_skipped=2, rows_noisy=1, **{"pass": pass_name})  # fmt: skip
        table.append(row)
    return pd.DataFrame(table, columns=study_summary.COLUMNS)


def test_the_study_block_is_the_committed_summary(tmp_path):
    """On a study summary (as results/current/h100/study would hold): the table's bf16 rows, the
    sentences citing rows, the bench table replaced by a pointer, --check failing on a change."""
    folder = tmp_path / "current" / "h100" / "study"
    folder.mkdir(parents=True)
    table = summary([
        ("matmul", "bf16", "fwd", 0.98, 1.10, "compile"),
        ("softmax", "bf16", "fwd", 1.60, 1.20, "ours"),
        ("softmax", "fp32", "fwd_bwd", 1.30, 1.25, "ours"),
        ("attention", "bf16", "fwd", 0.50, 2.00, "compile"),
    ])  # fmt: skip
    table.loc[3, "compile_fused_attention"] = 2
    (folder / study_summary.CSV).write_text(study_summary.csv_text(table))
    readme = tmp_path / "README.md"
    readme.write_text(f"# t\n{headline.START}\n| old |\n{headline.END}\n\n"
                      f"{headline.STUDY_START}\nnothing yet\n{headline.STUDY_END}\n")  # fmt: skip
    args = ["--readme", str(readme), "--current", str(tmp_path / "current")]
    assert headline.main(["--check", *args]) == 1
    assert headline.main(["--write", *args]) == 0
    assert headline.main(["--check", *args]) == 0
    text = readme.read_text()
    assert "| old |" not in text and "replaces the per-op bench table" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "H100" in line]
    assert [r.split(" | ")[0:2] for r in rows] == [["| matmul", "fwd"], ["| softmax", "fwd"],
                                                    ["| attention", "fwd"]]  # fmt: skip
    assert (
        "| softmax | fwd | H100 | triton | 1.60x, 0.80x | - | - | max-autotune | 1.20x, 2.40x "
        "| 3.0 s, 1.0 s | -, 1.50x | ours |"
    ) in text
    prose = " ".join(text.split(headline.STUDY_END)[0].split("\n\n")[-1].split())
    assert "best GPU time on 2 of 4 op/dtype/pass rows" in prose
    assert "softmax bf16 fwd (1.60x against 1.20x), softmax fp32 fwd_bwd (1.30x against 1.25x)" in (
        prose)  # fmt: skip
    assert "torch.compile has it on 2, most clearly attention bf16 fwd (2.00x against 0.50x)" in (
        prose)  # fmt: skip
    assert "2 of 2 rows of memory-bound ops (softmax)" in prose
    assert "fused attention call on 2 of 2 shapes" in prose
    assert ("max-autotune runs at a median 1.20x of its speed and 1.50x of its call latency "
            "(4 rows)") in prose
    (folder / study_summary.CSV).write_text(
        study_summary.csv_text(table.assign(ours_speedup=table["ours_speedup"] * 1.1))
    )
    assert headline.main(["--check", *args]) == 1


def test_the_readme_is_short_and_names_no_rounds():
    assert len(README.splitlines()) <= 200
    assert not re.search(r"\bround \d+|\b_r\d+\b|\bprobe_", README, flags=re.IGNORECASE)


def test_the_readme_links_resolve():
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if "://" not in target:
            assert (REPO_ROOT / target).exists(), target
