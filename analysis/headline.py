"""The README's answer, generated: per op and GPU, the best Triton and the best compile mode
against eager, by GPU time and by call latency, from the committed records.

    python -m analysis.headline                 # print the tables
    python -m analysis.headline --write         # put them in README.md between their markers
    python -m analysis.headline --check         # exit 1 if README.md's tables differ

Two blocks. The study's (`<!-- study:start -->`): from each results/current/<gpu>/study/
study_summary.csv (analysis.study_summary; `make study`, docs/study.md), the bf16 rows of every
op and pass, then a few sentences made from all its rows by fixed rules (where ours is fastest
and by how much, where the compiler is, by bound, call latency, the CUDA-graph views), each
citing its rows; until a study is committed, a line saying so. The per-op bench table
(`<!-- headline:start -->`; once a study is committed, a line pointing to it, and `--benches`
prints the table) is made as follows.

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
import textwrap
from pathlib import Path

import pandas as pd

from analysis.load import load_results
from experiments import registry
from experiments.records import geomean

ROOT = Path(__file__).resolve().parent.parent
CURRENT = ROOT / "results" / "current"
README = ROOT / "README.md"
START, END = "<!-- headline:start -->", "<!-- headline:end -->"
STUDY_START, STUDY_END = "<!-- study:start -->", "<!-- study:end -->"
STUDY_DTYPE = "bf16"  # the study table's rows (else the first dtype a summary has); the CSV: all
TRITON_MODES = ("triton", "triton-compiled")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _op_folders(gpu_dir: Path) -> list[Path]:
    """The folders of one GPU that hold an op's current records: named <op> or <op>_<what>."""
    folders = [
        p
        for p in gpu_dir.iterdir()
        if p.is_dir() and any(p.name == op or p.name.startswith(f"{op}_") for op in registry.OPS)
    ]
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
    key = [
        "gpu",
        "kernel",
        "mode",
        "shape_set",
        "shape_label",
        "dtype",
        "pass",
        "epilogue",
        "activations",
    ]
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
    lines.append(
        f"{noisy} of these {total} rows are flagged noisy (their repeats spread more "
        "than 5%); they are kept, so every mode of a set covers the same shapes."
    )
    return "\n".join(lines) + "\n"


def spliced(readme: str, text: str, start: str = START, end: str = END) -> str:
    if start not in readme or end not in readme:
        raise ValueError(f"README.md lacks the {start} / {end} markers")
    head, rest = readme.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{text}{end}{tail}"


# ---------------------------------------------------------------------------------------------
# The study (analysis.study_summary's CSV per GPU)
# ---------------------------------------------------------------------------------------------
def study_summaries(current: Path = CURRENT) -> list[tuple[str, pd.DataFrame]]:
    """(gpu folder, its study summary) for each results/current/<gpu>/study/study_summary.csv."""
    from analysis import study_summary

    paths = sorted(current.glob(f"*/study/{study_summary.CSV}"))
    return [(path.parent.parent.name, study_summary.read(path)) for path in paths]


def _pair(speedup, latency) -> str:
    return "-" if pd.isna(speedup) else f"{speedup:.2f}x, {latency:.2f}x"


def table_dtype(summaries) -> str:
    dtypes = [d for _, t in summaries for d in t["dtype"]]
    return STUDY_DTYPE if STUDY_DTYPE in dtypes or not dtypes else dtypes[0]


def _seconds(cold, warm) -> str:
    return "-" if pd.isna(cold) else f"{cold:.1f} s, {warm:.1f} s"


def _gains(row) -> str:
    """Call latency with static activations over latency with inputs: reduce-overhead's,
    max-autotune's."""
    gains = [row[f"static_view_latency_gain_{m}"] for m in ("reduce_overhead", "max_autotune")]
    return "-" if all(pd.isna(g) for g in gains) else ", ".join(
        "-" if pd.isna(g) else f"{g:.2f}x" for g in gains)  # fmt: skip


def study_table(summaries) -> str:
    dtype = table_dtype(summaries)
    lines = ["| op | pass | GPU | ours | GPU time, call latency | best peer | GPU time, call "
             "latency | best compile mode | GPU time, call latency | its compile: first call, "
             "after reset | static activations: latency gain (RO, MA) | fastest |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for gpu, table in summaries:
        for _, row in table[table["dtype"] == dtype].iterrows():
            cells = [row["op"], row["pass"], gpu.upper()]
            for who in ("ours", "peer", "compile"):
                mode = row[f"{who}_mode"]
                cells += [mode if isinstance(mode, str) else "-",
                          _pair(row[f"{who}_speedup"], row[f"{who}_latency_speedup"])]  # fmt: skip
            cells += [_seconds(row["compile_cold_s"], row["compile_warm_s"]), _gains(row),
                      row["fastest"]]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _label(row, gpus: int) -> str:
    where = f" ({row['gpu_folder'].upper()})" if gpus > 1 else ""
    return f"{row['op']} {row['dtype']} {row['pass']}{where}"


def _cited(rows: pd.DataFrame, mine: str, other: str, gpus: int, top: int = 3) -> str:
    """The `top` rows where `mine` leads `other` most: "op dtype pass (1.59x against 1.23x)"."""
    ranked = rows.assign(margin=rows[f"{mine}_speedup"] / rows[f"{other}_speedup"])
    ranked = ranked.sort_values("margin", ascending=False).head(top)
    return ", ".join(f"{_label(r, gpus)} ({r[f'{mine}_speedup']:.2f}x against "
                     f"{r[f'{other}_speedup']:.2f}x)" for _, r in ranked.iterrows())  # fmt: skip


def _wrapped(text: str) -> str:
    return textwrap.fill(text, width=100, break_long_words=False, break_on_hyphens=False) + "\n"


def study_sentences(summaries) -> str:
    """Three or four sentences from every row of the committed summaries, by fixed rules."""
    if not summaries:
        return ""
    frame = pd.concat([t.assign(gpu_folder=g) for g, t in summaries], ignore_index=True)
    gpus = len(summaries)
    both = frame.dropna(subset=["ours_speedup", "compile_speedup"])
    total = len(both)
    if total == 0:
        return "No row of the study has both an ok Triton and an ok compile mode on every shape."
    ours = both[both["fastest"] == "ours"]
    compiled = both[both["fastest"] == "compile"]
    others = {who: int((both["fastest"] == who).sum()) for who in ("peer", "eager")}
    sentences = []
    if len(ours):
        sentences.append(f"Hand-written Triton has the best GPU time on {len(ours)} of {total} "
                         "op/dtype/pass rows; it leads the best compile mode most on "
                         f"{_cited(ours, 'ours', 'compile', gpus)}.")  # fmt: skip
    else:
        sentences.append(f"Hand-written Triton has the best GPU time on none of {total} "
                         "op/dtype/pass rows; it comes closest to the best compile mode on "
                         f"{_cited(both, 'ours', 'compile', gpus, top=1)}.")  # fmt: skip
    cost = (f"; the best compile mode's first call takes a median "
            f"{both['compile_cold_s'].median():.1f} s per shape, ours "
            f"{both['ours_compile_cold_s'].median():.1f} s")  # fmt: skip
    if len(compiled):
        sentences.append(f"torch.compile has it on {len(compiled)}, most clearly "
                         f"{_cited(compiled, 'compile', 'ours', gpus)}{cost}.")  # fmt: skip
    else:
        sentences.append(f"torch.compile has the best GPU time on none{cost}.")
    if any(others.values()):
        sentences[-1] = (f"{sentences[-1][:-1]}; a peer library has it on {others['peer']}, eager "
                         f"on {others['eager']}.")  # fmt: skip
    bound = both["op"].map(lambda op: "memory" if registry.is_memory_bound(op) else "compute")
    by_bound = []
    for kind in ("memory", "compute"):
        rows = both[bound == kind]
        if len(rows):
            ops = ", ".join(dict.fromkeys(rows["op"]))
            by_bound.append(f"{int((rows['fastest'] == 'ours').sum())} of {len(rows)} rows of "
                            f"{kind}-bound ops ({ops})")  # fmt: skip
    why = f"Ours is fastest on {' and on '.join(by_bound)}"
    attention = both[both["op"] == "attention"]
    fused = attention["compile_fused_attention"].fillna(0).sum()
    if len(attention) and fused:
        why += (f"; on attention Inductor replaced the written-out block by one fused attention "
                f"call on {int(fused)} of {int(attention['shapes'].sum())} shapes "
                "(compile_fused_attention)")  # fmt: skip
    sentences.append(why + ".")
    latency = (f"By call latency ours beats eager on "
               f"{int((both['ours_latency_speedup'] > 1).sum())} of {total} rows and the best "
               f"compile mode on {int((both['compile_latency_speedup'] > 1).sum())}")  # fmt: skip
    gains = [
        f"{mode} runs at a median {frame[column].median():.2f}x of its speed and "
        f"{frame[column.replace('gain', 'latency_gain')].median():.2f}x of its call latency "
        f"({int(frame[column].notna().sum())} rows)"
        for mode, column in (("reduce-overhead", "static_view_gain_reduce_overhead"),
                             ("max-autotune", "static_view_gain_max_autotune"))
        if frame[column].notna().any()
    ]  # fmt: skip
    if gains:
        latency += ("; with static activations instead of inputs (which the CUDA-graph modes "
                    f"copy into their graphs on every call), {' and '.join(gains)}")  # fmt: skip
    sentences.append(latency + ".")
    return _wrapped(" ".join(sentences))


def study_text(current: Path = CURRENT) -> str:
    summaries = study_summaries(current)
    if not summaries:
        return (
            "No study committed yet: `make study` on a 4-GPU host ([docs/study.md]"
            "(docs/study.md)),\nthen `make promote ... NAME=study`, `python -m "
            "analysis.study_summary` and\n`python -m analysis.headline --write` put its "
            "table and its answer here.\n"
        )
    folders = ", ".join(f"`results/current/{gpu}/study`" for gpu, _ in summaries)
    caption = (
        f"{table_dtype(summaries)}, activations as inputs; each best mode's GPU time and call "
        f"latency x eager, geomean over the op's shapes, from {folders} (`study_summary.csv`: "
        "every dtype, the compile cost, the CUDA-graph views, row counts). First calls use the "
        "host's shared compile caches ([docs/study.md](docs/study.md))."
    )
    return f"{_wrapped(caption)}\n{study_table(summaries)}\n{study_sentences(summaries)}"


def headline_text(current: Path = CURRENT) -> str:
    """The per-op bench table, or once a study is committed, a line pointing to it."""
    if study_summaries(current):
        return (
            "The study above replaces the per-op bench table; its records stay in "
            "`results/current/<gpu>/<op>/` (`python -m analysis.headline --benches`).\n"
        )
    return table(current)


def generated(readme: str, current: Path = CURRENT) -> str:
    """README.md's text with both generated blocks made from `current`."""
    readme = spliced(readme, headline_text(current))
    return spliced(readme, study_text(current), STUDY_START, STUDY_END)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update README.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md differs")
    parser.add_argument("--benches", action="store_true", help="print the per-op bench table")
    parser.add_argument("--current", type=Path, default=CURRENT)
    parser.add_argument("--readme", type=Path, default=README)
    args = parser.parse_args(argv)
    if args.benches:
        print(table(args.current), end="")
        return 0
    readme = args.readme.read_text()
    text = generated(readme, args.current)
    if args.check:
        if text != readme:
            print(f"{args.readme}'s generated tables differ from the records: run "
                  "`python -m analysis.headline --write`", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    if args.write:
        args.readme.write_text(text)
    print(headline_text(args.current), study_text(args.current), sep="\n", end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
