"""A static HTML report of a results folder: the dashboard for users without a W&B account.

    python -m analysis.report results/current/h100/study outputs/report

It holds every figure of analysis.figures (in FIGURES order, each under the first paragraph of
its function's docstring), the geomean table, and the per-shape rows, all made from the records by
code. Records timed on a CPU put figures.CPU_MARK at the top of the page, as on every figure.
"""

import argparse
import html
from pathlib import Path

from analysis import figures, models_report
from analysis.load import caption, load_results
from analysis.summary import geomean_table

ROW_COLUMNS = ["kernel", "mode", "dtype", "pass", "activations", "shape_label", "status",
               "time_ms_p50", "eager_time_ms_p50", "speedup_vs_eager", "call_latency_us_p50",
               "tflops", "gbps", "max_rel_err", "compile_cold_s", "reason"]


def figure_sections(images: list[Path]) -> list[str]:
    """One <h3> per figure of FIGURES that was drawn, its docstring's first line, then its PNGs
    (a per-kernel figure: one per kernel)."""
    parts = []
    for name, (function, needs_kernel) in figures.FIGURES.items():
        drawn = [p for p in images
                 if (p.stem.startswith(f"{name}_") if needs_kernel else p.stem == name)]
        if drawn:
            summary = " ".join((function.__doc__ or "").strip().split("\n\n")[0].split())
            parts.append(f"<h3>{html.escape(name)}</h3><p>{html.escape(summary)}</p>")
            parts += [f"<img src='figures/{p.name}' alt='{html.escape(p.stem)}'>" for p in drawn]
    return parts


def model_section(images: list[Path]) -> list[str]:
    """The whole models' figure (analysis.models_report), where the records hold model rows."""
    drawn = [p for p in images if p.stem == "model_speedups"]
    if not drawn:
        return []
    summary = " ".join(models_report.model_speedups.__doc__.strip().split("\n\n")[0].split())
    return [f"<h3>model_speedups</h3><p>{html.escape(summary)}</p>",
            f"<img src='figures/{drawn[0].name}' alt='model_speedups'>"]


def build(results_dir: Path, out_dir: Path) -> Path:
    results = load_results(results_dir)
    frame = results.frame
    out_dir.mkdir(parents=True, exist_ok=True)
    written = figures.save_all(frame, out_dir / "figures")
    written += models_report.save_figure(frame, out_dir / "figures")
    images = [p for p in written if p.suffix == ".png"]
    cpu_note = ""
    if figures.measured_on_cpu(frame):
        cpu_note = (f"<p class='cpu-mark'>{html.escape(figures.CPU_MARK)}: these records were "
                    "timed on a CPU (Triton in its interpreter, Inductor's CPU backend); they "
                    "check the pipeline and say nothing about a GPU.</p>")
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Triton vs torch.compile: {html.escape(str(results_dir))}</title>",
        "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}"
        "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}"
        f"img{{max-width:100%}}.cpu-mark{{color:{figures.CPU_MARK_COLOR};font-weight:bold;"
        f"font-size:1.3em;border:2px solid {figures.CPU_MARK_COLOR};padding:6px}}"
        "</style></head><body>",
        "<h1>Triton vs torch.compile vs eager</h1>",
        cpu_note,
        f"<p>{html.escape(caption(frame))}. Records from <code>{html.escape(str(results_dir))}"
        f"</code>: {len(frame)} rows.</p>",
        "<h2>Geomean speedup against eager</h2>",
        geomean_table(frame).to_html(),
        "<h2>Figures</h2>",
        *figure_sections(images),
        *model_section(images),
        "<h2>All rows</h2>",
        frame[[c for c in ROW_COLUMNS if c in frame]].to_html(index=False, float_format="%.4g"),
    ]
    if results.problems:
        items = "".join(f"<li>{html.escape(p)}</li>" for p in results.problems)
        parts.insert(-2, f"<h2>Records that did not load</h2><ul>{items}</ul>")
    parts.append("</body></html>")
    path = out_dir / "report.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    print(build(args.results_dir, args.out_dir))


if __name__ == "__main__":
    main()
