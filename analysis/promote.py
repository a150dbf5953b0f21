"""Copy a finished run's records into results/current/<gpu>/<name>, and nothing else.

    python -m analysis.promote multirun/bench-softmax/2026-11-25_10-00-00 h100 softmax
    make promote RUN=multirun/bench-softmax/2026-11-25_10-00-00 GPU=h100 NAME=softmax

`make bench` and `make sweep` write to multirun/; this copies what a reader needs from one of
their folders (a bench folder with its numbered sweeps, or one sweep): each job's results.jsonl
with the env.json beside it, at the same relative path (analysis.load reads every results.jsonl
below a folder with the env.json beside it, so each row keeps its own job's GPU, versions and
fused epilogue), plus targets.txt and paired_ab.jsonl where present, and writes a README.md stub
(source folder, date, git commits, GPU, the sweeps' overrides, this command). It never copies
W&B run internals (wandb/), Hydra dumps (.hydra/, .hydra-worker/), Inductor's generated code
(inductor_code/), logs or scripts. An existing destination is refused unless --force (which
replaces it) or --merge (which adds the run's files to it, refusing any that is there already,
and appends what it added to the README: a study run in pieces, say another dtype's). Edit the
README stub to say what the run shows; commit the folder.
"""

import argparse
import datetime as dt
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from analysis.load import load_results
from experiments.records import read_jsonl

RECORD_FILES = ("results.jsonl", "env.json")
EXTRA_FILES = ("targets.txt", "paired_ab.jsonl")
SKIP_DIRS = {"wandb", ".hydra", ".hydra-worker", "inductor_code", "__pycache__"}
ALLOWED = set(RECORD_FILES) | set(EXTRA_FILES) | {"README.md"}
DEFAULT_ROOT = Path("results") / "current"


def _skipped(rel: Path) -> bool:
    return any(part in SKIP_DIRS for part in rel.parts)


def files_to_copy(src: Path) -> list[Path]:
    """The paths (relative to src) promote copies: every results.jsonl outside the skipped
    folders, the env.json beside each, and targets.txt / paired_ab.jsonl anywhere."""
    chosen = set()
    for path in src.rglob("results.jsonl"):
        rel = path.relative_to(src)
        if _skipped(rel):
            continue
        chosen.add(rel)
        if (path.parent / "env.json").is_file():
            chosen.add(rel.parent / "env.json")
    for name in EXTRA_FILES:
        for path in src.rglob(name):
            rel = path.relative_to(src)
            if not _skipped(rel) and path.is_file():
                chosen.add(rel)
    return sorted(chosen)


def _job_dirs_without_records(src: Path) -> list[Path]:
    """Hydra job folders (they hold .hydra or .hydra-worker) with no results.jsonl: an
    unfinished or failed job."""
    jobs = {p.parent for name in (".hydra", ".hydra-worker") for p in src.rglob(name)
            if p.is_dir() and not _skipped(p.parent.relative_to(src))}  # fmt: skip
    return sorted(job for job in jobs if not (job / "results.jsonl").is_file())


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return ""
    return out.stdout.strip()


def _sweep_overrides(src: Path) -> list[str]:
    """The task overrides of each sweep below src (its multirun.yaml), one line per sweep."""
    lines = []
    for path in sorted(src.rglob("multirun.yaml")):
        if _skipped(path.relative_to(src)):
            continue
        try:
            task = yaml.safe_load(path.read_text(encoding="utf-8"))["hydra"]["overrides"]["task"]
        except (OSError, yaml.YAMLError, KeyError, TypeError):
            continue
        rel = path.parent.relative_to(src).as_posix()
        lines.append(f"{rel}: {' '.join(task)}")
    return lines


def _envs(dest: Path) -> list[dict]:
    envs = []
    for path in sorted(dest.rglob("env.json")):
        try:
            envs.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return envs


def readme_stub(src: Path, gpu: str, name: str, dest: Path, command: str, date: str) -> str:
    envs = _envs(dest)
    gpus = sorted({e.get("gpu_name") for e in envs if e.get("gpu_name")})
    shas = sorted({e.get("git_sha") for e in envs if e.get("git_sha")})
    dirty = any(e.get("git_dirty") for e in envs)
    versions = sorted({f"torch {e.get('torch')}, triton {e.get('triton')}" for e in envs
                       if e.get("torch")})  # fmt: skip
    head = _git("rev-parse", "--short", "HEAD") or "unknown"
    frame = load_results(dest).frame
    kernels = ", ".join(sorted(frame["kernel"].dropna().unique()))
    modes = ", ".join(sorted(frame["mode"].dropna().unique()))
    dtypes = ", ".join(sorted(frame["dtype"].dropna().unique()))
    passes = ", ".join(sorted(frame["pass"].dropna().unique()))
    lines = [
        f"# {gpu} {name}: {kernels} ({modes})",
        "",
        "TODO: one paragraph on what this run shows and which figures quote it.",
        "",
        f"- source: `{src}` (the run folder on the machine that promoted it; not committed)",
        f"- promoted: {date}, at repo commit {head}, by `{command}`",
        f"- GPU: {', '.join(gpus) or 'unknown'}; {'; '.join(versions) or 'versions unknown'}",
        f"- kernels at commit(s): {', '.join(shas) or 'unknown'}"
        + (" (a dirty tree)" if dirty else ""),
        f"- records: {len(frame)} rows from {len(envs)} job(s); dtypes {dtypes}; passes {passes}",
    ]
    sweeps = _sweep_overrides(src)
    if sweeps:
        lines += ["", "Sweeps (Hydra task overrides, one per numbered sweep folder):", ""]
        lines += [f"    {s}" for s in sweeps]
    lines += [
        "",
        "Files: each job's `results.jsonl` and `env.json` at its path in the run folder;",
        "`targets.txt` (the `analysis.targets` output) and `paired_ab.jsonl` where the run had",
        "them.",
        "",
    ]
    return "\n".join(lines)


def merged_note(src: Path, files: list[Path], dest: Path, command: str, date: str) -> str:
    """The README lines that say what a --merge added."""
    added = [dest / rel for rel in files if rel.name == "results.jsonl"]
    rows = [row for path in added for row in read_jsonl(path)]
    facts = {key: ", ".join(sorted({str(r.get(key)) for r in rows})) for key in ("dtype", "pass")}
    return (f"\nMerged {date} from `{src}` by `{command}`: {len(rows)} rows from {len(added)} "
            f"job(s); dtypes {facts['dtype']}; passes {facts['pass']}.\n")


def promote(src, gpu: str, name: str, root=DEFAULT_ROOT, force: bool = False,
            command: str | None = None, merge: bool = False) -> Path:  # fmt: skip
    """Copy src's records into root/gpu/name (with merge: into it as it is); returns that
    folder."""
    src, root = Path(src), Path(root)
    if not src.is_dir():
        raise SystemExit(f"error: {src} is not a folder")
    for part in (gpu, name):
        if not part or "/" in part or part.startswith("."):
            raise SystemExit(f"error: bad gpu/name {part!r} (one folder name each)")
    files = files_to_copy(src)
    if not any(rel.name == "results.jsonl" for rel in files):
        raise SystemExit(f"error: no results.jsonl under {src} (is the run finished?)")
    for job in _job_dirs_without_records(src):
        print(f"warning: {job} has no results.jsonl (unfinished or failed job)", file=sys.stderr)
    dest = root / gpu / name
    if force and merge:
        raise SystemExit("error: --force replaces the folder and --merge adds to it: pass one")
    if merge:
        if not dest.is_dir():
            raise SystemExit(f"error: {dest} does not exist (--merge adds to a promoted folder)")
        clashes = [rel.as_posix() for rel in files if (dest / rel).exists()]
        if clashes:
            raise SystemExit(f"error: --merge would overwrite {len(clashes)} file(s) of {dest}, "
                             f"first {clashes[0]}; nothing was copied")  # fmt: skip
    elif dest.exists():
        if not force:
            raise SystemExit(f"error: {dest} exists (pass --force to replace it, --merge to add "
                             "to it)")  # fmt: skip
        shutil.rmtree(dest)
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, dest / rel)
    results = load_results(dest)
    for problem in results.problems:
        print(f"warning: {problem}", file=sys.stderr)
    command = command or shlex.join(["python", "-m", "analysis.promote", str(src), gpu, name])
    date = dt.date.today().isoformat()
    readme = dest / "README.md"
    if merge and readme.is_file():
        with readme.open("a", encoding="utf-8") as out:
            out.write(merged_note(src, files, dest, command, date))
    else:
        readme.write_text(readme_stub(src, gpu, name, dest, command, date), encoding="utf-8")
    return dest


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a finished multirun or bench folder")
    parser.add_argument("gpu", help="e.g. h100, h200")
    parser.add_argument("name", help="the folder's name under results/current/<gpu>/")
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT,
                        help=f"where the gpu folders are (default: {DEFAULT_ROOT})")
    parser.add_argument("--force", action="store_true", help="replace an existing folder")
    parser.add_argument("--merge", action="store_true",
                        help="add the run's files to an existing folder, none overwritten")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "-m", "analysis.promote", *(argv if argv is not None
                                                                 else sys.argv[1:])])
    dest = promote(args.run, args.gpu, args.name, args.root, args.force, command, args.merge)
    count = sum(1 for p in dest.rglob("*") if p.is_file())
    print(f"{dest}: {count} files; edit {dest / 'README.md'} and commit the folder")


if __name__ == "__main__":
    main()
