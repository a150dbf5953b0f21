"""The environment of the harness's child processes (a study's multiruns, an isolated job's
worker). Light on purpose: the study driver imports it without importing torch.

    child_env(extra)  os.environ plus `extra`, with Python's bytecode cached (below)
"""

import os
from pathlib import Path

# Where the children of a study or sweep keep Python's bytecode when the host forbids writing it
# beside the sources (PYTHONDONTWRITEBYTECODE, as some GPU images set over their installs).
CACHE_HOME = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
BYTECODE_CACHE = Path(CACHE_HOME, "kbench", "pycache")


def child_env(extra: dict | None = None) -> dict:
    """os.environ (plus `extra`) for a harness child process, with Python's bytecode cached.

    Under PYTHONDONTWRITEBYTECODE every new process compiles torch's Python sources on import:
    about 10 s a process on an H200 host against 3.3 s from bytecode, and a study job starts two
    (docs/study.md, "Per-job overhead"). The child instead writes bytecode under BYTECODE_CACHE
    (PYTHONPYCACHEPREFIX; an existing prefix is kept), never beside the installed sources, so
    only the first process compiles them. A first call's lazy imports (in compile_cold_s) then
    load bytecode too, as they do on a host without the switch."""
    env = {**os.environ, **(extra or {})}
    if env.pop("PYTHONDONTWRITEBYTECODE", ""):
        env.setdefault("PYTHONPYCACHEPREFIX", str(BYTECODE_CACHE))
    return env
