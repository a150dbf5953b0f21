"""The README's answer, generated: per op and GPU, the best Triton and the best compile mode
against eager, by GPU time and by call latency, from the committed records.

    python -m analysis.headline                 # print the table
    python -m analysis.headline --write         # put it in README.md between its markers
    python -m analysis.headline --check         # exit 1 if README.md's table differs

It reads the records folders of results/current/<gpu>/ named after an op (`softmax`,
`softmax_small`, ...; one bench or sweep each), not other sets kept beside them; a measurement
found in two folders counts once, from the folder named after the op. Per
op and GPU it takes the ok rows of the default view (bf16, forward, activations as inputs) and
the shape set that the most modes ran (then the one with the most shapes), so both sides of a
comparison cover the same shapes; each figure is a geomean over those shapes of the row's own
ratio to eager (measured in the same job). Unlike the figures, the table keeps rows flagged
noisy, so that every mode of a set covers the same shapes; the line under it says how many there
are.
A cell is "-" where the current records hold no such mode.
"""

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from analysis.load import load_results
from experiments import registry
from experiments.records import geomean

ROOT = Path(__file__).resolve().parent.parent
CURRENT = ROOT / "results" / "current"
README = ROOT / "README.md"
START, END = "<!-- headline:start -->", "<!-- headline:end -->"
TRITON_MODES = ("triton", "triton-compiled")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _op_folders(gpu_dir: Path) -> list[Path]:
    """The folders of one GPU that hold an op's current records: named <op> or <op>_<what>."""
    folders = [p for p in gpu_dir.iterdir() if p.is_dir()
               and any(p.name == op or p.name.startswith(f"{op}_") for op in registry.OPS)]
    return sorted(folders, key=lambda p: (p.name not in registry.OPS, p.name))


def _frame(current: Path) -> pd.DataFrame:
    frames = []
    for gpu_dir in sorted(p for p in current.iterdir() if p.is_dir()):
        for folder in _op_folders(gpu_dir):
            frame = load_results(folder).frame
            if not frame.empty:
                frames.append(frame.assign(gpu=gpu_dir.name))
    if not frames:
        return pd.DataFrame()
    # A measurement found in two folders (a bench and an older set kept beside it) counts once,
    # from the folder named after the op.
    frame = pd.concat(frames, ignore_index=True)
    key = ["gpu", "kernel", "mode", "shape_set", "shape_label", "dtype", "pass", "epilogue",
           "activations"]
    return frame.drop_duplicates(subset=key, keep="first")


def _best(rows: pd.DataFrame, modes) -> tuple[str, float, float] | None:
    """(mode, GPU-time x eager, call-latency x eager) of the mode with the best GPU time."""
    best = None
    for mode in modes:
        mine = rows[rows["mode"] == mode]
        if mine.empty:
            continue
        gpu = geomean(mine["speedup_vs_eager"].dropna().tolist())
        latency = geomean(mine["latency_speedup_vs_eager"].dropna().tolist())
        if gpu is not None and (best is None or gpu > best[1]):
            best = (mode, gpu, math.nan if latency is None else latency)
    return best


def rows(current: Path = CURRENT) -> list[dict]:
    frame = _frame(current)
    out = []
    if frame.empty:
        return out
    view = frame[(frame["status"] == "ok") & (frame["activations"] == "inputs")
                 & (frame["dtype"] == "bf16") & (frame["pass"] == "fwd")]  # fmt: skip
    for op in registry.OPS:
        for gpu in sorted(view["gpu"].unique()):
            mine = view[(view["kernel"] == op) & (view["gpu"] == gpu)].copy()
            if mine.empty:
                continue
            # a shape set with another fused epilogue (conv with and without bias) is another set
            pairs = zip(mine["shape_set"], mine["epilogue"], strict=True)
            mine["shape_set"] = [f"{s}, {e}" if isinstance(e, str) else s for s, e in pairs]
            # the set the most modes besides eager ran, then the one with the most shapes
            timed = mine[mine["mode"] != "eager"].groupby("shape_set")
            ranked = pd.DataFrame({"modes": timed["mode"].nunique(),
                                   "shapes": timed["shape_label"].nunique()})  # fmt: skip
            shape_set = ranked.sort_values(["modes", "shapes"], ascending=False).index[0]
            mine = mine[mine["shape_set"] == shape_set]
            out.append({
                "op": op, "gpu": gpu, "shapes": f"{shape_set} ({mine['shape_label'].nunique()})",
                "rows": len(mine), "noisy": int(mine["noisy"].fillna(False).astype(bool).sum()),
                "triton": _best(mine, TRITON_MODES), "compile": _best(mine, COMPILE_MODES),
            })  # fmt: skip
    return out


def _cell(best, index: int) -> str:
    if best is None or math.isnan(best[index]):
        return "-"
    return f"{best[index]:.2f}x"


def table(current: Path = CURRENT) -> str:
    lines = [
        "| op | GPU | shape set, epilogue (shapes) | best Triton | GPU time | call latency "
        "| best compile mode | GPU time | call latency |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    used = rows(current)
    for row in used:
        tri, comp = row["triton"], row["compile"]
        lines.append(
            f"| {row['op']} | {row['gpu'].upper()} | {row['shapes']} "
            f"| {tri[0] if tri else '-'} | {_cell(tri, 1)} | {_cell(tri, 2)} "
            f"| {comp[0] if comp else '-'} | {_cell(comp, 1)} | {_cell(comp, 2)} |"
        )
    noisy, total = sum(r["noisy"] for r in used), sum(r["rows"] for r in used)
    lines.append("")
    lines.append(f"{noisy} of these {total} rows are flagged noisy (their repeats spread more "
                 "than 5%); they are kept, so every mode of a set covers the same shapes.")
    return "\n".join(lines) + "\n"


def spliced(readme: str, text: str) -> str:
    if START not in readme or END not in readme:
        raise ValueError(f"README.md lacks the {START} / {END} markers")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{text}{END}{tail}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update README.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md differs")
    parser.add_argument("--current", type=Path, default=CURRENT)
    args = parser.parse_args(argv)
    text = table(args.current)
    readme = README.read_text()
    if args.check:
        if spliced(readme, text) != readme:
            print("README.md's headline table differs from the records: run "
                  "`python -m analysis.headline --write`", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    if args.write:
        README.write_text(spliced(readme, text))
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
