"""analysis.summary reads committed and synthetic records into geomean tables."""

import json
import math

import pytest

from analysis.summary import geomean_table, load_rows, main
from experiments.records import FIELDS, Record, validate
from tests.conftest import REPO_ROOT

H100 = REPO_ROOT / "results" / "current" / "h100" / "study"


def write_rows(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def row(mode, speedup, status="ok", static=()):
    return Record(kernel="softmax", mode=mode, shape={"m": 1, "n": 1}, shape_label="1x1",
                  shape_set="default", dtype="bf16", pass_="fwd", tf32=False, device="cuda",
                  static_inputs=list(static), run_name=f"softmax-{mode}", job_id="sweep/0",
                  status=status, reason=None if status == "ok" else "OOM",
                  time_ms_p50=speedup and 0.01, max_rel_err=speedup and 1e-3,
                  speedup_vs_eager=speedup,
                  latency_speedup_vs_eager=None if speedup is None else speedup / 2).to_json()


def test_geomean_per_mode_and_view(tmp_path):
    write_rows(tmp_path / "a" / "results.jsonl", [row("triton", 2.0), row("triton", 8.0)])
    write_rows(tmp_path / "b" / "results.jsonl", [
        row("reduce-overhead", 0.5), row("reduce-overhead", 1.5, static=["x"]),
        row("reduce-overhead", None, status="failed")])
    (tmp_path / "b" / "results.jsonl").open("a").write('{"kernel": "softm')  # truncated
    table = geomean_table(load_rows(tmp_path))
    triton = table.loc[("softmax", "bf16", "fwd", "inputs", "triton")]
    assert triton["speedup_vs_eager"] == pytest.approx(4.0)
    assert triton["latency_speedup_vs_eager"] == pytest.approx(2.0)
    assert triton["shapes_ok"] == 2 and triton["not_ok"] == 0
    copied = table.loc[("softmax", "bf16", "fwd", "inputs", "reduce-overhead")]
    assert copied["speedup_vs_eager"] == 0.5 and copied["not_ok"] == 1
    assert table.loc[("softmax", "bf16", "fwd", "static", "reduce-overhead")]["shapes_ok"] == 1


def test_skipped_lines_are_reported_on_stderr(tmp_path, capsys):
    write_rows(tmp_path / "a" / "results.jsonl", [row("triton", 2.0), {"kernel": "softmax"}])
    main([str(tmp_path)])
    out, err = capsys.readouterr()
    assert "triton" in out
    assert f"{tmp_path / 'a' / 'results.jsonl'}:2: missing field" in err


def test_empty_folder_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no results.jsonl"):
        main([str(tmp_path)])


@pytest.mark.skipif(not H100.exists(), reason="no committed H100 records")
def test_committed_h100_records_follow_the_schema():
    frame = load_rows(H100)
    assert {"matmul", "linear", "softmax", "conv"} <= set(frame["kernel"])
    for record in frame[FIELDS].to_dict("records"):
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v)
                 for k, v in record.items()}
        assert validate(clean) == [], record["shape_label"]
