"""`make bench kernel=<op>`: an op's speed-target grids, then its targets table.

    python -m experiments.bench softmax [--dir multirun/bench-softmax/<stamp>]
        [--grids 6,7[,paired]] [HYDRA OVERRIDES]

Runs each of the op's bench grids (experiments/registry.py, OpSpec.bench) as one Hydra multirun
into <dir>/<i>, then its paired runs if it has any (experiments.paired, into
<dir>/paired_ab.jsonl), then prints analysis.targets over <dir> and writes it to
<dir>/targets.txt. `--grids` runs only the grids it numbers (1-based, as `make bench` prints
them; each still into <dir>/<i>) and the paired runs only if it names `paired`: the conv
training grids alone, say, where the whole bench outlasts a machine's time. Eager is measured
inside every job (speedup_vs_eager pairs the mode's calls with eager's), so no grid needs an
eager job. A grid that fails leaves its rows and the rest run;
the exit status is then 1.
"""

import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

from experiments import registry


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-") or "=" in args[0]:
        print(f"error: make bench needs kernel=<op>; one of {' '.join(registry.OPS)}",
              file=sys.stderr)  # fmt: skip
        return 2
    name, overrides = args[0], args[1:]
    if name not in registry.OPS:
        print(f"error: unknown kernel {name!r}; choose one of {' '.join(registry.OPS)}",
              file=sys.stderr)  # fmt: skip
        return 2
    spec = registry.OPS[name]
    out = Path(f"multirun/bench-{name}/{time.strftime('%Y-%m-%d_%H-%M-%S')}")
    if "--dir" in overrides:
        at = overrides.index("--dir")
        out = Path(overrides[at + 1])
        del overrides[at : at + 2]
    grids, with_paired = set(range(1, len(spec.bench) + 1)), True
    if "--grids" in overrides:
        at = overrides.index("--grids")
        value = overrides[at + 1] if at + 1 < len(overrides) else ""
        del overrides[at : at + 2]
        names = [v.strip() for v in value.split(",") if v.strip()]
        with_paired = "paired" in names
        numbers = [v for v in names if v != "paired"]
        if not names or not all(v.isdigit() and 1 <= int(v) <= len(spec.bench) for v in numbers):
            print(f"error: --grids takes grid numbers 1-{len(spec.bench)} of {name} and "
                  f"'paired', comma-separated; got {value!r}", file=sys.stderr)  # fmt: skip
            return 2
        grids = {int(v) for v in numbers}
    rc = 0
    for i, grid in enumerate(spec.bench, 1):
        if i not in grids:
            continue
        print(f"bench {name} [{i}]: {grid} {' '.join(overrides)}", flush=True)
        command = [sys.executable, "-m", "experiments.run", "--multirun", *shlex.split(grid),
                   f"hydra.sweep.dir={out}/{i}", *overrides]  # fmt: skip
        rc |= subprocess.run(command).returncode != 0
    jsonl = out / "paired_ab.jsonl"
    paired = ["--paired", str(jsonl)] if spec.paired else []
    runs = spec.paired if with_paired else ()
    if runs and not torch.cuda.is_available():
        # the paired runs time on a GPU; their target lines read n/a (a miss) without records
        print(f"bench {name} [paired]: skipped, no CUDA device", file=sys.stderr)
        runs = ()
    for arguments in runs:
        print(f"bench {name} [paired]: {arguments}", flush=True)  # each appends to the one file
        out.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "experiments.paired", *shlex.split(arguments),
                   "--jsonl", str(jsonl)]  # fmt: skip
        with (out / "paired_ab.txt").open("a") as log:
            result = subprocess.run(command, stdout=subprocess.PIPE, text=True)
            log.write(result.stdout)
        print(result.stdout, end="")
        rc |= result.returncode != 0
    targets = subprocess.run(
        [sys.executable, "-m", "analysis.targets", str(out), "--kernel", name, *paired],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    print(targets.stdout, end="")
    (out / "targets.txt").write_text(targets.stdout)
    return 1 if rc or targets.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
