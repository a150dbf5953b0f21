"""The typed schema of every config key: its type (OmegaConf structured configs) and its range
(annotated-types constraints, checked by pydantic), one dataclass per group.

The YAML files under conf/ stay the user-facing defaults. The schema validates a composed config
without changing it: the job runs on the config exactly as composed (an int stays an int, so the
config hash of a good config is what it was before the schema existed). Two places validate:

- `preflight(argv)`, in `python -m experiments.run` before Hydra starts: it composes the config of
  every job of the command line (every value of every sweep, as Hydra's basic sweeper would) and
  validates each, so a bad value anywhere in a sweep stops it before any job runs or any output
  folder is made;
- `validate(cfg, launcher)`, in each job (experiments.run.prepare), for jobs started some other way
  (a submitit worker, the tests' in-process runs).

A problem is one `ConfigError` line naming the key, the value and what is allowed; the CLI prints
it as `error: ...` and exits 2. docs/configuration.md lists every key with its type and range.
"""

import dataclasses
import json
import netrc
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import annotated_types as at
import pydantic
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf import errors as oc_errors

from experiments.errors import ConfigError

FORBID = pydantic.ConfigDict(extra="forbid")  # an unknown key is a typo, not a new setting


@dataclass(frozen=True)
class OneOf:
    """The allowed values of a key (OmegaConf sees the plain type; pydantic checks the choice)."""

    choices: tuple

    def __call__(self, value):
        if value not in self.choices:
            raise ValueError(self.text())
        return value

    def text(self) -> str:
        return "one of " + ", ".join("null" if c is None else str(c).lower()
                                     if isinstance(c, bool) else str(c) for c in self.choices)


@dataclass(frozen=True)
class Described:
    """What a key allows, in words, where its type and range do not say it."""

    text: str


def one_of(*choices):
    check = OneOf(tuple(choices))
    return pydantic.AfterValidator(check)


# ---- shorthands: the type OmegaConf checks, plus the range pydantic checks ----
def Count(low: int, high: int):  # noqa: N802 (used as a type)
    return Annotated[int, at.Ge(low), at.Le(high)]


Millis = Annotated[float, at.Ge(0), at.Le(600_000)]
PositiveMillis = Annotated[float, at.Gt(0), at.Le(600_000)]
Name = Annotated[str, at.MinLen(1)]

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# peer / peer_direct: another library's kernels, through its API or launched directly
MODE_KINDS = ("eager", "triton", "compile", "triton_compiled", "torchscript", "peer", "peer_direct")
FAULT_KINDS = ("raise", "nan_output", "oom", "kill", "illegal_address", "exit")


@dataclass
class BenchConfig:
    """conf/bench/*.yaml: timing budgets and switches."""

    __pydantic_config__ = FORBID
    warmup_ms: Millis = 25
    rep_ms: PositiveMillis = 100
    min_warmup_calls: Count(0, 1000) = 3
    repeats: Count(1, 101) = 3
    noisy_threshold: Annotated[float, at.Gt(0), at.Le(10)] = 0.05
    latency_calls: Count(1, 100_000) = 50
    correctness_seeds: Count(1, 100) = 3
    flush_l2: bool = True
    cudagraph_replay: bool = True
    static_inputs: bool = False
    cpu_threads: Count(1, 1024) = 1


@dataclass
class WandbConfig:
    """conf/wandb/default.yaml. `online` also needs a W&B key (checked in `validate`)."""

    __pydantic_config__ = FORBID
    mode: Annotated[str, one_of("offline", "online", "disabled")] = "offline"
    project: Name = "triton-vs-compile"
    entity: Name | None = None
    group: Name | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class CompileConfig:
    """conf/compile/default.yaml: shared by every torch.compile mode."""

    __pydantic_config__ = FORBID
    fullgraph: bool = False
    dynamic: bool | None = False
    options: dict[str, Any] = field(default_factory=dict)
    fresh_cache: bool = True
    save_code: bool = True


@dataclass
class ModeConfig:
    """conf/mode/*.yaml."""

    __pydantic_config__ = FORBID
    name: Name = "eager"
    kind: Annotated[str, one_of(*MODE_KINDS)] = "eager"
    compile_mode: Annotated[str, one_of(*COMPILE_MODES)] | None = None
    ops: Annotated[Any, Described("all or a list of op names"),
                   pydantic.PlainValidator(pydantic.TypeAdapter(Literal["all"] | list[str])
                                           .validate_python)] = "all"


@dataclass
class DtypeConfig:
    """conf/dtype/*.yaml."""

    __pydantic_config__ = FORBID
    name: Annotated[str, one_of("bf16", "fp16", "fp32")] = "bf16"
    torch_dtype: Annotated[str, one_of("bfloat16", "float16", "float32")] = "bfloat16"
    tf32: bool = False


@dataclass
class PassConfig:
    """conf/pass/*.yaml (a group named after a Python keyword: validated on its own)."""

    __pydantic_config__ = FORBID
    name: Annotated[str, one_of("fwd", "fwd_bwd")] = "fwd"


@dataclass
class LauncherConfig:
    """conf/launcher/*.yaml: our own key; hydra.launcher is checked per launcher below."""

    __pydantic_config__ = FORBID
    name: Annotated[str, one_of("local", "gpus", "gpus_pool", "slurm")] = "local"


@dataclass
class FaultConfig:
    """The `fault` testing aid (experiments.faults)."""

    __pydantic_config__ = FORBID
    kind: Annotated[str, one_of(*FAULT_KINDS)] | None = None
    shape: Count(0, 1_000_000) = 0


@dataclass
class Config:
    """conf/config.yaml's own keys and its groups (`pass` is a keyword: PassConfig, separately;
    `kernel` is each op's own: its workload parses and checks the shapes)."""

    __pydantic_config__ = FORBID
    name: Name = "run"
    shapes: Name = "auto"
    device: Annotated[str, one_of("auto", "cuda", "cpu")] = "auto"
    seed: Count(0, 2**63 - 1) = 0
    resume: bool = False
    isolate: Annotated[Any, one_of("auto", True, False)] = "auto"
    fault: FaultConfig | None = field(default_factory=FaultConfig)
    kernel: dict[str, Any] = field(default_factory=dict)
    mode: ModeConfig = field(default_factory=ModeConfig)
    dtype: DtypeConfig = field(default_factory=DtypeConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)


# ---- hydra.launcher: the keys our launcher files set ----
Minutes = Count(1, 525_600)


@dataclass
class GpusLauncherConfig:
    """launcher=gpus: submitit's LocalLauncher, untyped in Hydra (no plugin schema applies, see
    conf/launcher/gpus.yaml), so every key of the plugin's LocalQueueConf plus `setup` is here."""

    __pydantic_config__ = FORBID
    _target_: Name = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"
    submitit_folder: Name = "${hydra.sweep.dir}/.submitit/%j"
    timeout_min: Minutes = 720
    cpus_per_task: Count(1, 4096) | None = None
    gpus_per_node: Count(0, 64) | None = 1
    tasks_per_node: Count(1, 1) = 1  # one process per job: the GPU lock is per process
    mem_gb: Count(1, 1 << 20) | None = None
    nodes: Count(1, 1) = 1
    name: Name = "${hydra.job.name}"
    stderr_to_stdout: bool = False
    setup: list[str] | None = None


@dataclass
class GpusPoolLauncherConfig(GpusLauncherConfig):
    """launcher=gpus_pool: launcher=gpus's keys, its own launcher class and the pool's size."""

    _target_: Name = "hydra_plugins.kbench_launchers.pool.PooledLocalLauncher"
    pool_size: Count(1, 64) | None = None  # tasks; None: one per visible GPU


@dataclass
class SlurmLauncherRanges:
    """launcher=slurm: the plugin's SlurmQueueConf types every key at composition; these are the
    ranges of the keys conf/launcher/slurm.yaml documents (other plugin keys pass untouched)."""

    __pydantic_config__ = pydantic.ConfigDict(extra="allow")
    timeout_min: Minutes = 120
    nodes: Count(1, 1) = 1  # a job is one process on one node
    tasks_per_node: Count(1, 1) = 1
    gpus_per_node: Count(0, 64) | None = 1
    cpus_per_task: Count(1, 4096) | None = 8
    mem_gb: Count(1, 1 << 20) | None = 64
    array_parallelism: Count(1, 1_000_000) = 8
    setup: list[str] | None = None


LAUNCHER_SCHEMAS = {"gpus": GpusLauncherConfig, "gpus_pool": GpusPoolLauncherConfig,
                    "slurm": SlurmLauncherRanges}  # fmt: skip
GROUP_SCHEMAS = {"pass": PassConfig}  # validated beside Config


def register() -> None:
    """The schemas in Hydra's ConfigStore (group `schema`), for `--cfg`-style inspection and for
    configs that want to extend them; conf/ does not list them in its defaults (see above)."""
    store = ConfigStore.instance()
    store.store(group="schema", name="config", node=Config)
    store.store(group="schema", name="pass", node=PassConfig)
    for name, node in LAUNCHER_SCHEMAS.items():
        store.store(group="schema", name=f"launcher_{name}", node=node)


register()


# ---- what each key allows, in words (for the error line and docs/configuration.md) ----
def allowed(annotation) -> str:
    """'a float > 0 and <= 600000', 'one of offline, online, disabled', ... from a type hint."""
    optional = False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional, annotation = True, args[0]
    base, metadata = annotation, ()
    if typing.get_origin(annotation) is Annotated:
        base, *metadata = typing.get_args(annotation)
    words = []
    for meta in metadata:
        check = getattr(meta, "func", None)
        if isinstance(check, OneOf) or isinstance(meta, Described):
            words = [meta.text if isinstance(meta, Described) else check.text()]
            break
    else:
        words = [_type_words(base)]
        bounds = [(">", "gt"), (">=", "ge"), ("<", "lt"), ("<=", "le")]
        limits = [f"{sign} {getattr(m, attr)}" for m in metadata for sign, attr in bounds
                  if hasattr(m, attr) and type(m).__name__ == attr.capitalize()]
        if any(isinstance(m, at.MinLen) for m in metadata):
            words = ["a non-empty string"]
        if len(limits) == 2 and limits[0] == f">= {limits[1][3:]}" and limits[1][:2] == "<=":
            limits = [f"= {limits[1][3:]}"]  # a range of one value
        if limits:
            words.append(" and ".join(limits))
    return " ".join(words) + (" or null" if optional else "")


def _type_words(base) -> str:
    origin = typing.get_origin(base)
    if origin is list:
        return "a list of strings"
    if origin is dict or base is dict:
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        base, "any value"
    )


def _hint(schema, path: list[str]):
    """The type hint of a dotted key under `schema`, or None."""
    for i, name in enumerate(path):
        hints = typing.get_type_hints(schema, include_extras=True)
        if name not in hints:
            return None
        hint = hints[name]
        if i == len(path) - 1:
            return hint
        if typing.get_origin(hint) in (typing.Union, types.UnionType):  # Optional[Dataclass]
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        if not dataclasses.is_dataclass(hint):
            return None
        schema = hint
    return None


def _show(value) -> str:
    if isinstance(value, str):
        return value or "''"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return json.dumps(value, default=str) if isinstance(value, dict | list) else str(value)


def _keys(schema) -> str:
    return ", ".join(f.name for f in dataclasses.fields(schema))


def _select(values: dict, key: str, default=None):
    return OmegaConf.select(OmegaConf.create(values), key, default=default,
                            throw_on_resolution_failure=False)


def _check(schema, values: dict, prefix: str) -> None:
    """Types (OmegaConf merge into the structured schema), then ranges (pydantic): one line.
    A schema that lets unknown keys through (another schema types them) skips the merge."""
    if schema.__pydantic_config__.get("extra") == "allow":
        return _ranges(schema, values, prefix)
    try:
        typed = OmegaConf.merge(OmegaConf.structured(schema), values)
    except oc_errors.OmegaConfBaseException as exc:
        key = str(getattr(exc, "full_key", "") or "")
        path = [p for p in key.split(".") if p]
        value = _select(values, key) if path else None
        dotted = f"{prefix}{key}"
        if isinstance(exc, oc_errors.ConfigKeyError) or _hint(schema, path) is None:
            parent = _hint(schema, path[:-1]) if len(path) > 1 else schema
            known = _keys(parent) if dataclasses.is_dataclass(parent) else ""
            where = f"{prefix}{'.'.join(path[:-1])}{'.' if len(path) > 1 else ''}*"
            where = "the top level" if where == "*" else where
            raise ConfigError(
                f"{dotted}={_show(value)}: unknown key" + (f"; {where} takes {known}"
                                                           if known else "")
            ) from None
        raise ConfigError(
            f"{dotted}={_show(value)}: expected {allowed(_hint(schema, path))}"
        ) from None
    del typed  # the values as given go to pydantic: OmegaConf turns 2 into true for a bool
    _ranges(schema, values, prefix)


def _ranges(schema, values: dict, prefix: str) -> None:
    try:
        pydantic.TypeAdapter(schema).validate_python(values)
    except pydantic.ValidationError as exc:
        error = exc.errors()[0]
        path = []  # the loc's field names (pydantic adds union members' and validators' names)
        for part in map(str, error["loc"]):
            if _hint(schema, [*path, part]) is not None or error["type"] == "extra_forbidden":
                path.append(part)
        hint = _hint(schema, path)
        dotted = prefix + ".".join(path)
        value = _select(values, ".".join(path), default=error["input"])
        if error["type"] == "extra_forbidden":
            raise ConfigError(f"{dotted}={_show(value)}: unknown key") from None
        what = allowed(hint) if hint is not None else error["msg"]
        raise ConfigError(f"{dotted}={_show(value)}: expected {what}") from None


def has_wandb_key() -> bool:
    """A W&B key in the environment, or one `wandb login` stored in ~/.netrc for the W&B host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def validate(cfg: DictConfig | dict, launcher: DictConfig | dict | None = None) -> None:
    """Raise ConfigError (one line) if any key of a composed job config, or of its hydra.launcher,
    has a wrong type or an out-of-range value. `cfg` itself is left as it is."""
    values = dict(cfg) if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=False)
    values.pop("hydra", None)  # Hydra's own keys (hydra.launcher is `launcher`, below)
    values = OmegaConf.to_container(OmegaConf.create(values), resolve=True)
    for group, schema in GROUP_SCHEMAS.items():
        _check(schema, values.pop(group, {}) or {}, f"{group}.")
    _check(Config, values, "")
    mode = values.get("wandb", {}).get("mode")
    if mode == "online" and not has_wandb_key():
        raise ConfigError(
            "wandb.mode=online: no W&B key; allowed: online with WANDB_API_KEY set (or after "
            "`wandb login`), else offline (`make sync` uploads later) or disabled"
        )
    name = values.get("launcher", {}).get("name")
    if launcher is not None and name in LAUNCHER_SCHEMAS:
        if not isinstance(launcher, dict):
            launcher = OmegaConf.to_container(launcher, resolve=False)
        _check(LAUNCHER_SCHEMAS[name], launcher, "hydra.launcher.")


# ---- the CLI's check of every job before Hydra starts ----
def _one_line(exc: Exception) -> str:
    """Hydra's and OmegaConf's multi-line messages (and their cause) as one line."""
    parts = [str(exc)]
    if exc.__cause__ is not None and str(exc.__cause__) not in parts[0]:
        parts.append(str(exc.__cause__))
    lines = [line.strip() for part in parts for line in part.splitlines() if line.strip()]
    text, listing = "", False
    for line in lines:
        if line.startswith("Config search path"):
            break  # Hydra's search path: where it looked, not what is wrong
        if line.startswith(("full_key:", "object_type=", "reference_type=", "See https://")):
            continue
        item = listing and " " not in line  # an entry of "Available options in 'mode':"
        separator = ", " if item and not text.endswith(":") else " " if text.endswith(
            (":", ".")) else "; "
        text += (separator if text else "") + line
        listing = line.endswith(":") or item
    return text.replace(":;", ":")


def _sweep_jobs(overrides: list[str], config_name: str) -> list[list[str]]:
    """The override lists to validate for a multirun: the first value of every sweep, then each
    other value of each sweep in turn (every value is checked without composing the whole grid).
    Sweeps set in the config (hydra.sweeper.params, as +experiment files do) count too."""
    from hydra import compose
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()

    def first_values(parsed):
        return [f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}"
                if o.is_sweep_override() else o.input_line for o in parsed]

    base = compose(config_name, overrides=first_values(parser.parse_overrides(overrides)),
                   return_hydra_config=True)
    params = base.hydra.sweeper.get("params") or {}
    parsed = parser.parse_overrides([f"{k}={v}" for k, v in params.items()] + overrides)
    first = first_values(parsed)
    jobs = [first]
    for i, override in enumerate(parsed):
        if override.is_sweep_override():
            for value in list(override.sweep_string_iterator())[1:]:
                jobs.append([*first[:i], f"{override.get_key_element()}={value}", *first[i + 1:]])
    return jobs


def preflight(argv: list[str], conf_dir, check_secrets=None) -> None:
    """Compose and validate every job that `python -m experiments.run argv` would run; raise
    ConfigError (one line) on the first problem. Nothing is written or measured. Runs that only
    print (--help, --cfg, --info, ...) or read another config folder are left to Hydra and to the
    job's own validation."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.errors import HydraException

    args = get_args_parser().parse_args(argv)
    if (args.help or args.hydra_help or args.cfg or args.info or args.shell_completion
            or args.config_dir or args.config_path or args.experimental_rerun):
        return
    config_name = args.config_name or "config"
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            jobs = _sweep_jobs(args.overrides, config_name) if args.multirun else [args.overrides]
            for job in jobs:
                cfg = compose(config_name, overrides=job, return_hydra_config=True)
                if check_secrets is not None:
                    check_secrets(cfg)
                validate(cfg, cfg.hydra.launcher)
    except (HydraException, oc_errors.OmegaConfBaseException) as exc:
        raise ConfigError(_one_line(exc)) from None


def markdown_tables() -> str:
    """Every key with its type, range and default: `python -m experiments.schema` prints what
    docs/configuration.md holds."""
    sections = [("", Config), ("pass.", PassConfig), ("fault.", FaultConfig),
                ("mode.", ModeConfig), ("dtype.", DtypeConfig), ("bench.", BenchConfig),
                ("wandb.", WandbConfig), ("compile.", CompileConfig), ("launcher.", LauncherConfig),
                ("hydra.launcher. (launcher=gpus)", GpusLauncherConfig),
                ("hydra.launcher. (launcher=gpus_pool)", GpusPoolLauncherConfig),
                ("hydra.launcher. (launcher=slurm)", SlurmLauncherRanges)]
    out = []
    for prefix, node in sections:
        key_prefix, _, note = prefix.partition(" ")
        out += [f"### `{key_prefix or 'top level'}` {note}".rstrip(), "",
                "| key | allowed | default |", "|---|---|---|"]
        hints = typing.get_type_hints(node, include_extras=True)
        for f in dataclasses.fields(node):
            if dataclasses.is_dataclass(f.type) or f.name == "fault":
                continue
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else (
                f.default)
            out.append(f"| `{key_prefix}{f.name}` | {allowed(hints[f.name])} | "
                       f"`{_show(default)}` |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown_tables())
