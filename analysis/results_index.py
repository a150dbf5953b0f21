"""Write results/INDEX.md: each folder removed from results/, and the commit that still holds it.

    python -m analysis.results_index                     # (re)writes results/INDEX.md
    python -m analysis.results_index --check             # exit 1 when INDEX.md is out of date
    python -m analysis.results_index --archive 3619ef5   # only the folders of that commit's tree

A folder is "archived" when git history has it directly under results/ and the working tree no
longer does. Its commit is `git log -1 --format=%H <archive> -- results/<folder>`: the last commit
that changed it, so `git checkout <commit> -- results/<folder>` brings it back as it was. The
archive commit is --archive, or by default the newest commit whose tree still has the folder
(HEAD while the removal is not committed, else the parent of the commit that removed it). Each
entry gives the first line of the folder's README, what its records hold (kernels, modes, dtypes,
passes, GPU, read from its results.jsonl and env.json files at that commit) and which
results/current folders were promoted from it (their README's "- source: `results/<folder>..."
line). The text depends only on history and results/current, so reruns give the same file.
"""

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
INDEX = Path("results") / "INDEX.md"
INTERNALS = ("wandb", ".hydra", ".hydra-worker", "inductor_code")
SOURCE_LINE = re.compile(r"^- source: `results/([^/`]+)", re.MULTILINE)


def _git(repo: Path, *args: str, stdin: str | None = None) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True,
                         text=True, check=True)  # fmt: skip
    return out.stdout


def _natural(name: str):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def archived_folders(repo: Path = REPO_ROOT, archive: str | None = None) -> list[tuple[str, str]]:
    """(folder, commit that last held it) for each folder under results/ that history has and
    the working tree does not, in natural name order."""
    if archive:
        listed = _git(repo, "ls-tree", "-d", "--name-only", archive, "results/").split()
        names = {Path(p).name for p in listed}
    else:
        paths = _git(repo, "log", "--no-renames", "--format=", "--name-only", "HEAD", "--",
                     "results/").split("\n")  # fmt: skip
        names = {p.split("/")[1] for p in paths if p.count("/") >= 2}
    listed_head = _git(repo, "ls-tree", "-d", "--name-only", "HEAD", "results/").split()
    head_tree = {Path(p).name for p in listed_head}
    folders = []
    for name in sorted(names - {"current"}, key=_natural):
        if (repo / "results" / name).is_dir():
            continue
        rev = archive
        if rev is None:
            if name in head_tree:
                rev = "HEAD"  # removed in the working tree, not yet committed
            else:
                removal = _git(repo, "log", "-1", "--format=%H", "HEAD", "--", f"results/{name}")
                rev = f"{removal.strip()}^"
        last = _git(repo, "log", "-1", "--format=%H", rev, "--", f"results/{name}").strip()
        if last:
            folders.append((name, last))
    return folders


def _blobs(repo: Path, commit: str, paths: list[str]) -> list[str]:
    """The text of each path at commit, through one `git cat-file --batch`."""
    if not paths:
        return []
    proc = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch"],
                          input="".join(f"{commit}:{p}\n" for p in paths).encode(),
                          capture_output=True, check=True)  # fmt: skip
    data, texts, pos = proc.stdout, [], 0
    for _ in paths:
        end = data.index(b"\n", pos)
        header = data[pos:end].split()
        pos = end + 1
        if len(header) < 3 or header[1] == b"missing":
            texts.append("")
            continue
        size = int(header[2])
        texts.append(data[pos:pos + size].decode("utf-8", "replace"))
        pos += size + 1
    return texts


def _gpu(name: str) -> str:
    short = name.replace("NVIDIA", "").split()
    return short[0] if short else name


def describe(repo: Path, name: str, commit: str) -> tuple[str, str]:
    """(the README's first line, what the folder holds) at commit."""
    files = _git(repo, "ls-tree", "-r", "--name-only", commit, f"results/{name}/").splitlines()
    readme = f"results/{name}/README.md"
    subject = _git(repo, "log", "-1", "--format=%s", commit).strip().replace("`", "")
    title = f"(no README; last commit: {subject[:150] + ('...' if len(subject) > 150 else '')})"
    if readme in files:
        for line in _blobs(repo, commit, [readme])[0].splitlines():
            if line.strip():
                title = line.lstrip("#").strip().replace("`", "")
                break
    kept = [f for f in files if not any(part in INTERNALS for part in f.split("/"))]
    internals = len(files) - len(kept)
    records = [f for f in kept if f.endswith("/results.jsonl")]
    envs = [f for f in kept if f.endswith("/env.json")]
    kinds: dict[str, set] = {"kernel": set(), "mode": set(), "dtype": set(), "pass": set()}
    rows = 0
    for text in _blobs(repo, commit, records):
        for line in text.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if not isinstance(row, dict):
                continue
            rows += 1
            for key, values in kinds.items():
                if row.get(key):
                    values.add(str(row[key]))
    gpus = set()
    for text in _blobs(repo, commit, envs):
        try:
            gpu = json.loads(text).get("gpu_name")
        except (ValueError, AttributeError):
            continue
        if gpu:
            gpus.add(_gpu(gpu))
    if records:
        parts = [", ".join(sorted(gpus)) or "GPU unknown",
                 ", ".join(sorted(kinds["kernel"])) + f" ({', '.join(sorted(kinds['mode']))})",
                 ", ".join(sorted(kinds["dtype"])), ", ".join(sorted(kinds["pass"])),
                 f"{rows} rows from {len(records)} results.jsonl"]  # fmt: skip
        holds = "; ".join(parts)
    else:
        suffixes = Counter(Path(f).suffix or Path(f).name for f in kept)
        holds = "no records: " + ", ".join(f"{n} {s}" for s, n in sorted(suffixes.items()))
    holds += f"; {len(files)} files"
    if internals:
        holds += f", {internals} of them W&B / Hydra / Inductor-code internals"
    return title, holds


def promoted_from(repo: Path = REPO_ROOT) -> dict[str, list[str]]:
    """{archived folder: [results/current folders whose README names it as their source]}."""
    current = repo / "results" / "current"
    found: dict[str, list[str]] = {}
    for readme in sorted(current.rglob("README.md")) if current.is_dir() else []:
        for source in SOURCE_LINE.findall(readme.read_text(encoding="utf-8")):
            found.setdefault(source, []).append(readme.parent.relative_to(repo).as_posix())
    return found


def render(repo: Path = REPO_ROOT, archive: str | None = None) -> str:
    """The text of results/INDEX.md."""
    repo = Path(repo)
    folders = archived_folders(repo, archive)
    promoted = promoted_from(repo)
    lines = [
        "# Archived results folders",
        "",
        "Written by `python -m analysis.results_index` (do not edit by hand; rerun it after",
        "removing a folder from results/). The records a reader needs are in",
        "[results/current](current/README.md). Each folder below was removed from the tree; its",
        "commit is the last one that changed it, so it holds the folder as it was, with the run's",
        "logs, scripts and W&B / Hydra / Inductor-code files. To bring one back into the working",
        "tree (this also stages it; `git rm -r --cached results/<folder>` unstages it):",
        "",
        "    git checkout <commit> -- results/<folder>",
        "",
        "or to read it without touching the tree: `git show <commit>:results/<folder>/README.md`,",
        "`git archive <commit> results/<folder> | tar -x -C /tmp`.",
        "",
        f"{len(folders)} folders.",
    ]
    for name, commit in folders:
        title, holds = describe(repo, name, commit)
        lines += ["", f"## {name}", "", title, "", f"- holds: {holds}"]
        if name in promoted:
            lines.append("- promoted to: " + ", ".join(f"`{p}`" for p in promoted[name]))
        lines += [f"- commit: {commit}", f"- restore: `git checkout {commit} -- results/{name}`"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", help="the commit before the removal (default: per folder, "
                        "the newest commit whose tree still has it)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if results/INDEX.md differs from what would be written")
    parser.add_argument("--dry-run", action="store_true", help="print the text, write nothing")
    args = parser.parse_args(argv)
    text = render(REPO_ROOT, args.archive)
    path = REPO_ROOT / INDEX
    if args.dry_run:
        sys.stdout.write(text)
    elif args.check:
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            raise SystemExit(f"{INDEX} is out of date: run python -m analysis.results_index")
        print(f"{INDEX} is up to date")
    else:
        path.write_text(text, encoding="utf-8")
        print(f"wrote {INDEX}: {text.count(chr(10) + '## ')} folders")


if __name__ == "__main__":
    main()
