"""The whole-model answer, from the committed model records (results/current/<gpu>/models/),
scored as PyTorch's compiler dashboard scores its suites.

    python -m analysis.models_report               # print the README block
    python -m analysis.models_report --write       # README.md's block and each models/README.md
    python -m analysis.models_report --check       # exit 1 if either differs from the records
    python -m analysis.models_report --figure DIR  # model_speedups.png/.svg of the records

README.md (`<!-- models:start -->`): per GPU, model and pass (inference, training), the best of
ours (triton, triton-compiled), the best compile mode and the best peer, each as its GPU time
against eager measured in the same job, and the pass rate: `ok` cells of every mode run, the
`skipped` ones apart. Each results/current/<gpu>/models/README.md holds every row: GPU time and
call latency against eager, compile cold/warm, graphs, peak memory against eager's, accuracy
against eager's own, fallbacks, or the reason a row failed or was skipped.
"""

import argparse
import sys
from pathlib import Path

import pandas as pd

from analysis.headline import spliced
from analysis.load import load_results
from experiments import registry

ROOT = Path(__file__).resolve().parent.parent
CURRENT = ROOT / "results" / "current"
README = ROOT / "README.md"
START, END = "<!-- models:start -->", "<!-- models:end -->"
OURS = ("triton", "triton-compiled")
COMPILE = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
PASS_NAMES = {"fwd": "inference", "fwd_bwd": "training"}
FOLDER = "models"


def model_frame(current: Path = CURRENT) -> pd.DataFrame:
    """Every model row of every results/current/<gpu>/models folder, with a `gpu` column."""
    frames = []
    for gpu_dir in sorted(p for p in current.iterdir() if p.is_dir()) if current.is_dir() else []:
        folder = gpu_dir / FOLDER
        if not folder.is_dir() or not list(folder.rglob("results.jsonl")):
            continue
        frame = load_results(folder).frame
        frame = frame[frame["kernel"].isin(registry.names("model"))].copy()
        frame["gpu"] = gpu_dir.name
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _best(rows: pd.DataFrame, modes) -> pd.Series | None:
    ok = rows[rows["mode"].isin(modes) & (rows["status"] == "ok")]
    if ok.empty:
        return None
    return ok.loc[ok["speedup_vs_eager"].idxmax()]


def _cell(best: pd.Series | None) -> str:
    return "-" if best is None else f"{best['mode']} {best['speedup_vs_eager']:.2f}x"


def _title(model: str) -> str:
    from experiments.models import MODELS

    return MODELS[model].title if model in MODELS else model


def summary_rows(frame: pd.DataFrame) -> list[dict]:
    rows = []
    if frame.empty:
        return rows
    peers = sorted(set(frame["mode"]) - set(OURS) - set(COMPILE) - {"eager", "torchscript"})
    for (gpu, model, pass_name), group in frame.groupby(["gpu", "kernel", "pass"], sort=False):
        ran = group[group["status"] != "skipped"]
        rows.append({
            "gpu": gpu, "model": model, "pass": pass_name,
            "ours": _best(group, OURS), "compile": _best(group, COMPILE),
            "peer": _best(group, peers),
            "ok": int((ran["status"] == "ok").sum()), "ran": len(ran),
            "skipped": int((group["status"] == "skipped").sum()),
        })  # fmt: skip
    order = {name: i for i, name in enumerate(registry.names("model"))}
    return sorted(rows, key=lambda r: (r["gpu"], order.get(r["model"], 99), r["pass"]))


def _pair(row: dict | None) -> str:
    if row is None:
        return "not run"
    return f"{_cell(row['ours'])}; {_cell(row['compile'])}"


def table(frame: pd.DataFrame) -> str:
    """One line per GPU and model, the passes side by side: at most 6 columns on the first
    screen; every row is in the folder's README."""
    lines = ["| model | GPU | inference: ours; best compile mode | training: ours; best compile "
             "mode | best peer, inference; training | ok / run |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    by_model: dict[tuple, dict] = {}
    for r in summary_rows(frame):
        by_model.setdefault((r["gpu"], r["model"]), {})[r["pass"]] = r
    for (gpu, model), passes in by_model.items():
        fwd, train = passes.get("fwd"), passes.get("fwd_bwd")
        peers = "; ".join(_cell(p["peer"]) if p else "-" for p in (fwd, train))
        ok, ran = sum(p["ok"] for p in passes.values()), sum(p["ran"] for p in passes.values())
        skipped = sum(p["skipped"] for p in passes.values())
        note = f" ({skipped} skipped)" if skipped else ""
        lines.append(f"| {_title(model)} | {gpu.upper()} | {_pair(fwd)} | {_pair(train)} | "
                     f"{peers} | {ok} / {ran}{note} |")
    return "\n".join(lines) + "\n"


def readme_text(current: Path = CURRENT) -> str:
    frame = model_frame(current)
    if frame.empty:
        return ("No whole-model records committed yet: `make sweep kernel=resnet50,llama "
                "mode=eager,triton,default pass=fwd,fwd_bwd`\n([docs/models.md](docs/models.md)),"
                " then `make promote ... NAME=models` and `python -m analysis.models_report "
                "--write`.\n")  # fmt: skip
    folders = ", ".join(f"`results/current/{g}/{FOLDER}`" for g in sorted(set(frame["gpu"])))
    caption = (f"Whole models, {', '.join(sorted(set(frame['dtype'])))}: each best mode's GPU time"
               f" per step x eager in the same job, from {folders} (every row, compile time, "
               "memory and accuracy: its README; [docs/models.md](docs/models.md)).")
    return f"{caption}\n\n{table(frame)}"


def _fmt(value, pattern: str) -> str:
    return "-" if value is None or pd.isna(value) else pattern.format(value)


def _fallbacks(value) -> str:
    if not isinstance(value, dict):
        return "-"
    left = {reason: n for counts in value.values() for reason, n in counts.items()
            if reason != "ours"}  # fmt: skip
    return "none" if not left else "; ".join(f"{r} x{n}" for r, n in sorted(left.items()))


def folder_readme(frame: pd.DataFrame, gpu: str) -> str:
    rows = frame[frame["gpu"] == gpu]
    lines = [
        f"# Whole models on the {gpu.upper()}",
        "",
        "Generated by `python -m analysis.models_report --write` from the records below this "
        "folder; the fields are docs/records.md's. Ratios are against eager in the same job "
        "(above 1: faster, less memory, or a larger error than eager's).",
        "",
        "| model | pass | mode | status | GPU ms (x eager) | call latency x eager | compile "
        "cold / warm s | graphs, breaks | peak memory x eager | accuracy x eager | fallbacks |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {name: i for i, name in enumerate(registry.names("model"))}
    rows = rows.assign(_order=rows["kernel"].map(order)).sort_values(["_order", "pass", "mode"])
    for _, r in rows.iterrows():
        if r["status"] != "ok":
            lines.append(f"| {_title(r['kernel'])} | {PASS_NAMES.get(r['pass'], r['pass'])} | "
                         f"{r['mode']} | {r['status']}: {r['reason']} | | | | | | | |")
            continue
        graphs = "-" if pd.isna(r["graphs_compiled"]) else (
            f"{int(r['graphs_compiled'])}, {int(r['graph_breaks'])}")
        lines.append(
            f"| {_title(r['kernel'])} | {PASS_NAMES.get(r['pass'], r['pass'])} | {r['mode']} | "
            "ok | "
            f"{r['time_ms_p50']:.2f} ({r['speedup_vs_eager']:.2f}x) | "
            f"{_fmt(r['latency_speedup_vs_eager'], '{:.2f}x')} | "
            f"{_fmt(r['compile_cold_s'], '{:.1f}')} / {_fmt(r['compile_warm_s'], '{:.1f}')} | "
            f"{graphs} | {_fmt(r['peak_mem_ratio'], '{:.2f}')} | "
            f"{_fmt(r['accuracy_ratio'], '{:.2f}')} | {_fallbacks(r['fallbacks'])} |")
    return "\n".join(lines) + "\n"


def outputs(readme: str, current: Path = CURRENT) -> dict[Path, str]:
    """Each generated file (README.md, every models/README.md) and its text from `current`."""
    frame = model_frame(current)
    made = {README: spliced(readme, readme_text(current), START, END)}
    for gpu in sorted(set(frame["gpu"])) if not frame.empty else []:
        made[current / gpu / FOLDER / "README.md"] = folder_readme(frame, gpu)
    return made


def model_speedups(frame: pd.DataFrame):
    """GPU time per step against eager by model and mode, inference and training side by side
    (one row of panels per GPU); None where the records hold no model rows."""
    from analysis import figures

    rows = frame[frame["kernel"].isin(registry.names("model")) & (frame["status"] == "ok")]
    rows = rows.dropna(subset=["speedup_vs_eager"])
    if rows.empty:
        return None
    gpus = sorted(rows["gpu_name"].fillna("cpu").unique())
    passes = [p for p in PASS_NAMES if p in set(rows["pass"])]
    fig, axes = figures._figure(len(gpus), len(passes), sharey=True,
                                figsize=(1.5 + 5.5 * len(passes), 1.0 + 4.0 * len(gpus)))
    for i, gpu in enumerate(gpus):
        for j, pass_name in enumerate(passes):
            ax, cell = axes[i][j], rows[(rows["gpu_name"].fillna("cpu") == gpu)
                                        & (rows["pass"] == pass_name)]  # fmt: skip
            models_here = [m for m in registry.names("model") if m in set(cell["kernel"])]
            modes = figures.ordered_modes(cell["mode"])
            width = 0.8 / max(1, len(modes))
            for k, mode in enumerate(modes):
                for x, model in enumerate(models_here):
                    values = cell.loc[(cell["kernel"] == model) & (cell["mode"] == mode),
                                      "speedup_vs_eager"]  # fmt: skip
                    if values.empty:
                        continue
                    value = float(values.median())
                    ax.bar(x - 0.4 + width * (k + 0.5), value - 1.0, bottom=1.0, width=width,
                           color=figures.mode_color(mode), gid=f"{model}:{mode}",
                           label=mode if x == 0 else None)  # fmt: skip
            ax.axhline(1.0, color="black", lw=1, ls="--", gid="parity")
            ax.set_xticks(range(len(models_here)), [_title(m) for m in models_here],
                          rotation=20, ha="right")  # fmt: skip
            ax.set_title(f"{figures.short_gpu(gpu)}, {PASS_NAMES[pass_name]}")
            figures._speedup_axis(ax, rows["speedup_vs_eager"].min(),
                                  rows["speedup_vs_eager"].max())  # fmt: skip
            ax.legend(fontsize=6, ncol=2, loc="upper left")
        axes[i][0].set_ylabel("GPU time per step: speedup vs eager (log)")
    return figures._finish(fig, rows, "Whole models: speedup over eager by mode (above 1 = "
                                      "faster than eager in the same job)")


def save_figure(frame: pd.DataFrame, out_dir: Path) -> list[Path]:
    from analysis import figures

    fig = model_speedups(frame)
    if fig is None:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix, metadata in ((".png", figures.PNG_METADATA), (".svg", figures.SVG_METADATA)):
        paths.append(out_dir / f"model_speedups{suffix}")
        fig.savefig(paths[-1], dpi=figures.DPI, metadata=metadata)
    figures.plt.close(fig)
    return paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--current", type=Path, default=CURRENT)
    parser.add_argument("--figure", type=Path, help="write model_speedups.png/.svg here")
    args = parser.parse_args(argv)
    if args.figure:
        for path in save_figure(model_frame(args.current), args.figure):
            print(path)
        return 0
    made = outputs(README.read_text(), args.current)
    if args.check:
        stale = [str(p) for p, text in made.items() if not p.exists() or p.read_text() != text]
        if stale:
            print(f"stale against the records: {stale}; run `python -m analysis.models_report "
                  "--write`", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    if args.write:
        for path, text in made.items():
            path.write_text(text)
    print(readme_text(args.current), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
