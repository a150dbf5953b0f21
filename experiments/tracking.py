"""Weights & Biases logging, one run per job, never the only copy of a result.

results.jsonl is written first; W&B gets a copy. Any W&B failure (no network, no key, a broken
install) is one warning and the job carries on. Offline runs are written under the job's output
directory and uploaded later with `make sync`.
"""

import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

SECRET_KEY = re.compile(r"(api[_-]?key|token|secret|password)", re.IGNORECASE)
REDACTED = "<redacted>"


def find_secret_keys(config, path: str = "") -> list[str]:
    """Dotted paths of config keys that look like credentials."""
    found = []
    if isinstance(config, dict):
        for key, value in config.items():
            dotted = f"{path}.{key}" if path else str(key)
            if SECRET_KEY.search(str(key)):
                found.append(dotted)
            found += find_secret_keys(value, dotted)
    elif isinstance(config, list):
        for i, value in enumerate(config):
            found += find_secret_keys(value, f"{path}[{i}]")
    return found


def redact(value):
    """A copy of a config tree with credential-looking keys and the W&B key's value masked.

    Strings are checked too: a Hydra override such as `+wandb.api_key=...` keeps only its key.
    """
    api_key = os.environ.get("WANDB_API_KEY")
    if isinstance(value, dict):
        return {k: REDACTED if SECRET_KEY.search(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        key, equals, _ = value.partition("=")
        if equals and SECRET_KEY.search(key):
            return f"{key}={REDACTED}"
        if api_key and api_key in value:
            return value.replace(api_key, REDACTED)
    return value


def scrub_hydra_dir(output_dir: Path) -> None:
    """Rewrite the config dumps Hydra made before the job started, with credentials masked."""
    import yaml

    for path in (Path(output_dir) / ".hydra").glob("*.yaml"):
        path.write_text(yaml.safe_dump(redact(yaml.safe_load(path.read_text())), sort_keys=False))


def run_group(group, sweep_name: str | None, name: str) -> str:
    """The W&B group: wandb.group if set, else the sweep folder's name, else the run name. Always a
    string: a sweep folder named "1" reaches the config as the int 1, which wandb refuses."""
    return str(group or sweep_name or name)


class Tracker:
    """A thin, failure-proof wrapper over one wandb run."""

    def __init__(
        self,
        wandb_cfg: dict,
        config: dict,
        output_dir: Path,
        name: str,
        group: str,
        tags: list[str],
    ):
        self.run = None
        self.mode = wandb_cfg["mode"]
        if self.mode == "disabled":
            return
        try:
            import wandb

            self._wandb = wandb
            self.run = wandb.init(
                mode=self.mode,
                project=wandb_cfg["project"],
                entity=wandb_cfg.get("entity"),
                group=group,
                name=name,
                tags=sorted(set(tags)),
                config=redact(config),
                dir=str(output_dir),
                reinit="finish_previous",  # a multirun in one process never reuses a run
                settings=wandb.Settings(console="off", quiet=True, x_disable_stats=True),
            )
        except Exception as exc:
            log.warning(
                "W&B init failed (%s: %s); records are still written to JSONL",
                type(exc).__name__,
                redact(str(exc)),
            )
            self.run = None

    @property
    def run_dir(self) -> str | None:
        return getattr(self.run, "dir", None) if self.run else None

    def _safely(self, what: str, fn) -> None:
        if self.run is None:
            return
        try:
            fn()
        except Exception as exc:
            log.warning(
                "W&B %s failed (%s: %s); JSONL records are unaffected",
                what,
                type(exc).__name__,
                redact(str(exc)),
            )

    def log_row(self, row: dict, step: int) -> None:
        metrics = {
            f"{row['shape_label']}/{k}": v
            for k, v in row.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and v is not None
        }
        metrics["status_ok"] = int(row["status"] == "ok")
        self._safely("log", lambda: self.run.log(metrics, step=step))

    def finish(self, rows: list[dict], summary: dict, code_dir: Path | None) -> None:
        def upload():
            columns = sorted({k for row in rows for k in row})
            table = self._wandb.Table(columns=columns)
            for row in rows:
                table.add_data(*[_cell(row.get(c)) for c in columns])
            self.run.log({"rows": table})
            self.run.summary.update(summary)
            if code_dir is not None and Path(code_dir).is_dir() and any(Path(code_dir).iterdir()):
                artifact = self._wandb.Artifact(f"inductor-code-{self.run.id}", type="code")
                artifact.add_dir(str(code_dir))
                self.run.log_artifact(artifact)

        self._safely("upload", upload)
        self._safely("finish", lambda: self.run.finish())
        self.run = None


def _cell(value):
    """wandb.Table cells must be scalars or strings."""
    if isinstance(value, dict | list):
        return str(value)
    return value
