"""What the shipped Triton kernels compile to on a GPU, worked out on a machine without one.

    TRITON_INTERPRET=0 python -m experiments.resources --kernel conv [--shapes resnet50]
        [--dtype bf16] [--pass fwd|fwd_bwd] [--arch 90] [--sms 132] [--set bias=false ...]
        [--json out.json]
    make resources kernel=conv ARGS="--shapes resnet50"

Each shape of a conf shape set goes through the same call the benchmark's `triton` mode makes
(experiments.workloads), on CPU tensors, with the kernels' dispatch told that the tensors sit on
a GPU of compute capability `--arch` with `--sms` SMs (kernels._common.pretend_gpu). Nothing is
launched: every Triton launch is compiled for that target instead, and an autotuned kernel has
each of its candidate configs compiled (which one wins is only known on the GPU). ptxas, as
Triton bundles it, reports the registers and spills of each compiled kernel; shared memory comes
from Triton's own metadata, and CTAs/SM is how many programs those two (and the warp and CTA
limits) let one SM hold at once. The `ptx` column is a hash of the generated PTX: two commits
that print the same hashes generate the same code, which is how a refactor of a kernel is
checked without a GPU.

Caveats: the GPU machines may run another Triton and ptxas than this one (the header names
this one's), and the figures are the compiler's, not a profiler's.
"""

import argparse
import contextlib
import hashlib
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

CONF = Path(__file__).resolve().parent.parent / "conf" / "kernel"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class Compiled:
    """One compiled kernel: its name and constexprs, launch options and the compiler's report."""

    kernel: str
    constexprs: dict
    num_warps: int
    num_stages: int
    shared_bytes: int
    registers: int | None
    spill_stores: int | None
    spill_loads: int | None
    ptx_sha: str
    ctas_per_sm: int | None = None  # resident CTAs per SM that registers and shared memory allow
    autotuned: bool = False  # one candidate of an autotuner (the GPU picks among them)
    grids: list = field(default_factory=list)  # launch grids seen, one per launch
    shapes: list = field(default_factory=list)  # the shape labels that launched it

    @property
    def tile(self) -> str:
        c = self.constexprs
        rows = c.get("BLOCK_M") or c.get("BLOCK_ROWS")
        if rows is None and "BLOCK_H" in c:
            rows = f"{c['BLOCK_H']}*{c['BLOCK_W']}"
        dims = [rows, c.get("BLOCK_N") or c.get("BLOCK_COLS") or c.get("CHUNK"), c.get("BLOCK_K")]
        return "x".join(str(d) for d in dims if d is not None) or "-"


class OfflineCompiler:
    """Inside `active()`, every Triton launch compiles for `target` and returns without running;
    each autotuner compiles all its candidate configs. The records collect in `compiled`."""

    def __init__(self, arch: int, warp_size: int = 32):
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend

        self.target = GPUTarget("cuda", arch, warp_size)
        self.backend = make_backend(self.target)
        self.compiled: dict[tuple, Compiled] = {}
        self.shape = "?"
        self._binders: dict = {}
        self._autotuning = 0
        self.timing_host = False  # launches return at once (compile_shapes' host timing)

    @contextlib.contextmanager
    def active(self):
        from triton.runtime import jit
        from triton.runtime.autotuner import Autotuner

        if not hasattr(jit, "create_function_from_signature"):
            raise RuntimeError(
                f"triton {_triton_version()} lacks jit.create_function_from_signature; use 3.4-3.8"
            )
        compiler = self
        saved = jit.JITFunction.run, Autotuner._bench, Autotuner.run

        def run(fn, *args, grid, warmup, **kwargs):
            if compiler.timing_host:
                return None  # compiled already: nothing more to do or to count
            return compiler._compile(fn, args, kwargs, grid)

        def tune(tuner, *args, **kwargs):
            if not compiler.timing_host:
                tuner.cache.clear()  # every shape compiles every candidate, cached key or not
            return saved[2](tuner, *args, **kwargs)

        def bench(tuner, *args, config, **meta):
            if config.pre_hook:  # e.g. the TMA descriptors' block shapes for this config
                config.pre_hook({**tuner.nargs, **meta, **config.all_kwargs()})
            compiler._autotuning += 1
            try:
                tuner.fn.run(*args, **meta, **config.all_kwargs())
            finally:
                compiler._autotuning -= 1
            return [float(len(compiler.compiled))]  # a made-up time: the first config "wins"

        jit.JITFunction.run, Autotuner._bench, Autotuner.run = run, bench, tune
        try:
            yield self
        finally:
            jit.JITFunction.run, Autotuner._bench, Autotuner.run = saved

    def _compile(self, fn, args, kwargs, grid):
        import triton
        from triton.compiler import ASTSource
        from triton.runtime import jit

        try:
            from triton.experimental.gluon._runtime import GluonASTSource
        except ImportError:  # a Triton without Gluon
            GluonASTSource = ASTSource

        kwargs["debug"] = kwargs.get("debug", fn.debug) or triton.knobs.runtime.debug
        kwargs["instrumentation_mode"] = triton.knobs.compilation.instrumentation_mode
        binder = self._binders.get(fn)
        if binder is None:
            binder = jit.create_function_from_signature(fn.signature, fn.params, self.backend)
            self._binders[fn] = binder
        bound_args, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(
            self.backend, kwargs, bound_args, specialization, options
        )
        names = [p.name for p in fn.params]
        meta = {names[path[0]]: value for path, value in constexprs.items() if len(path) == 1}
        key = (fn.__name__, repr(signature), repr(sorted(meta.items())), repr(attrs),
               repr(sorted(options.__dict__.items())))  # fmt: skip
        record = self.compiled.get(key)
        if record is None:
            # a Gluon kernel (triton.experimental.gluon) brings its own source class
            source = GluonASTSource if getattr(fn, "is_gluon", lambda: False)() else ASTSource
            kernel = triton.compile(
                source(fn, signature, constexprs, attrs),
                target=self.target,
                options=options.__dict__,
            )
            registers, stores, loads = _ptxas_report(kernel.asm["ptx"], self.target.arch)
            record = Compiled(
                kernel=fn.__name__,
                constexprs={k: _plain(v) for k, v in meta.items() if k.isupper()},
                num_warps=kernel.metadata.num_warps,
                num_stages=kernel.metadata.num_stages,
                shared_bytes=kernel.metadata.shared,
                registers=registers,
                spill_stores=stores,
                spill_loads=loads,
                ptx_sha=ptx_digest(kernel.asm["ptx"]),
                ctas_per_sm=ctas_per_sm(
                    self.target.arch, registers, kernel.metadata.shared, kernel.metadata.num_warps
                ),
                autotuned=self._autotuning > 0,
            )
            self.compiled[key] = record
        if grid is not None:
            grid = grid(bound_args) if callable(grid) else grid
            grid = tuple(int(g) for g in grid)
            if grid not in record.grids:
                record.grids.append(grid)
        if self.shape not in record.shapes:
            record.shapes.append(self.shape)
        return None


def ptx_digest(ptx: str) -> str:
    """A hash of the PTX instructions alone: without the line info (`.loc`, `.file`, the debug
    sections and their labels) and comments, which move with every edit of the source file."""
    code = ptx.split("\t.file\t", 1)[0]
    # The kernel's name (and its parameters' names, which derive from it) is left out, so a
    # kernel renamed without a change to its code keeps its hash.
    for name in set(re.findall(r"\.entry\s+(\w+)", code)):
        code = re.sub(rf"\b{name}(?=\W|_param_)", "KERNEL", code)
    kept = []
    for line in code.splitlines():
        line = line.split("//", 1)[0].strip()
        if not line or line.startswith(".loc") or re.fullmatch(r"\$L__(tmp|func_\w+)\d*:", line):
            continue
        kept.append(line)
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()[:12]


# Per-SM limits by compute capability (CUDA occupancy tables): shared memory a CTA may use in all
# (bytes), with 1 KB reserved per CTA; resident warps; resident CTAs. Every one of these has a
# 64K-register file, allocated per warp in units of 256 registers.
SM_LIMITS = {
    80: (167936, 64, 32),
    86: (102400, 48, 16),
    89: (102400, 48, 24),
    90: (233472, 64, 32),
}


def ctas_per_sm(arch: int, registers: int | None, shared_bytes: int, num_warps: int) -> int | None:
    """How many CTAs of this kernel fit on one SM at once: the tightest of registers, shared
    memory, warps and the CTA limit (None for an arch not in SM_LIMITS or without a register
    count)."""
    if arch not in SM_LIMITS or registers is None:
        return None
    smem, max_warps, max_ctas = SM_LIMITS[arch]
    per_warp = -(-registers * 32 // 256) * 256
    fits = [max_ctas, max_warps // num_warps, (65536 // per_warp) // num_warps]
    if shared_bytes:
        fits.append(smem // (shared_bytes + 1024))
    return max(0, min(fits))


def _plain(value):
    return value if isinstance(value, bool | int | float | str) or value is None else str(value)


def _triton_version() -> str:
    import triton

    return triton.__version__


def _ptxas_report(ptx: str, arch: int) -> tuple[int | None, int | None, int | None]:
    """(registers, spill store bytes, spill load bytes) from `ptxas -v`, with Triton's flags."""
    from triton import knobs

    ptxas = knobs.nvidia.ptxas.path
    suffix = "a" if arch >= 90 else ""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        cmd = [ptxas, "-v", "--regAllocOptLevel=2", f"--gpu-name=sm_{arch}{suffix}", str(src),
               "-o", str(Path(tmp) / "k.cubin")]  # fmt: skip
        log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return (
        int(regs.group(1)) if regs else None,
        int(spills.group(1)) if spills else None,
        int(spills.group(2)) if spills else None,
    )


def load_kernel_cfg(kernel: str, overrides: list[str]):
    from omegaconf import OmegaConf

    from experiments.workloads import kernel_config

    path = CONF / f"{kernel}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in CONF.glob("*.yaml"))
        raise ValueError(f"unknown kernel {kernel!r}; choose one of {known}")
    cfg = kernel_config(kernel)
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected key=value")
    return OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))


def compile_shapes(kernel, shapes, dtype_name, pass_name, arch, sms, overrides=(), host_calls=0):
    """Compile every kernel launch the `triton` mode makes for these shapes: (compiler, shape set,
    labels, host us). With host_calls > 0 each shape's call is then repeated that many times
    with every Triton launch returning at once, and host us maps each label to the median CPU
    microseconds a call took: the kernels' Python wrappers (and autotuners' key lookups), not
    Triton's own launch path (argument binding, the C launcher) nor the driver."""
    from experiments.registry import check_pass, make_workload, triton_ops
    from experiments.workloads import resolve_shapes
    from kernels._common import is_interpreter, pretend_gpu

    if is_interpreter():
        raise RuntimeError(
            "run with TRITON_INTERPRET=0 (without a GPU, importing experiments switches the "
            "interpreter on, and the interpreter's configs are not the GPU's)"
        )
    if dtype_name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype_name!r}; choose one of {sorted(DTYPES)}")
    cfg = load_kernel_cfg(kernel, list(overrides))
    workload = make_workload(cfg)
    check_pass(workload.name, pass_name)
    set_name, parsed = resolve_shapes(workload, cfg, shapes, on_gpu=True)
    dtype = DTYPES[dtype_name]
    compiler = OfflineCompiler(arch)
    generator = torch.Generator().manual_seed(0)
    labels, host_us = [], {}
    with compiler.active(), pretend_gpu((arch // 10, arch % 10), sms):
        for shape in parsed:
            if workload.unsupported_shape(shape, pass_name, SimpleNamespace(kind="triton")):
                continue  # a shape mode=triton skips (e.g. a grouped conv's backward)
            compiler.shape = workload.label(shape)
            labels.append(compiler.shape)
            module = workload.make_module(shape, triton_ops()).to(dtype)
            inputs = workload.make_inputs(shape, dtype, "cpu", generator)
            if pass_name == "fwd_bwd":
                inputs = tuple(t.requires_grad_() for t in inputs)

            def call(module=module, inputs=inputs):
                if pass_name == "fwd_bwd":
                    out = module(*inputs)
                    out.backward(torch.empty_like(out))
                else:
                    with torch.no_grad():
                        module(*inputs)

            call()  # compiles
            if host_calls > 0:
                compiler.timing_host = True
                times = []
                for _ in range(host_calls):
                    start = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - start)
                compiler.timing_host = False
                host_us[compiler.shape] = statistics.median(times) * 1e6
    return compiler, set_name, labels, host_us


def table(records: list[Compiled]) -> str:
    head = ["kernel", "tile", "warps", "stages", "regs", "spill st/ld", "smem KB", "CTAs/SM",
            "grid", "ptx", "shapes"]  # fmt: skip
    rows = []
    for r in records:
        grids = [g[: max(i + 1 for i, d in enumerate(g) if d != 1 or i == 0)] for g in r.grids]
        grid = ",".join("x".join(map(str, g)) for g in grids[:3]) or "-"
        if len(grids) > 3:
            grid += f" +{len(grids) - 3}"
        shapes = r.shapes[0] + (f" +{len(r.shapes) - 1}" if len(r.shapes) > 1 else "")
        spills = "-" if r.spill_stores is None else f"{r.spill_stores}/{r.spill_loads}"
        rows.append([
            r.kernel + (" (autotune)" if r.autotuned else ""), r.tile, str(r.num_warps),
            str(r.num_stages), str(r.registers), spills, f"{r.shared_bytes / 1024:.0f}",
            "-" if r.ctas_per_sm is None else str(r.ctas_per_sm), grid, r.ptx_sha, shapes,
        ])  # fmt: skip
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in [head, *rows]]  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", required=True, help="a registered op (experiments/registry.py)")
    parser.add_argument("--shapes", default="auto", help="a shape set of conf/kernel/<kernel>.yaml")
    parser.add_argument("--dtype", default="bf16", help="fp16, bf16 or fp32")
    parser.add_argument("--pass", dest="pass_name", default="fwd", help="fwd or fwd_bwd")
    parser.add_argument("--arch", type=int, default=90, help="compute capability, 90 = sm_90a")
    parser.add_argument("--sms", type=int, default=132, help="SM count (H100 SXM: 132)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[],
        help="kernel config override, e.g. bias=false or activation=relu",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the records here")
    parser.add_argument(
        "--host-calls", type=int, default=0,
        help="then time this many calls per shape with nothing launched: the Python host path",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        compiler, set_name, labels, host_us = compile_shapes(
            args.kernel, args.shapes, args.dtype, args.pass_name, args.arch, args.sms,
            args.overrides, args.host_calls,
        )  # fmt: skip
    except (ValueError, RuntimeError) as exc:  # bad input (ConfigError is a ValueError): one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from triton import knobs

    records = list(compiler.compiled.values())
    if args.json:
        payload = {"kernel": args.kernel, "shapes": set_name, "dtype": args.dtype,
                   "pass": args.pass_name, "arch": args.arch, "sms": args.sms,
                   "triton": _triton_version(), "ptxas": knobs.nvidia.ptxas.version,
                   "labels": labels, "host_us": host_us,
                   "compiled": [asdict(r) for r in records]}  # fmt: skip
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    print(
        f"# {args.kernel} {set_name} {args.dtype} {args.pass_name}: {len(labels)} shapes, "
        f"{len(records)} compiled kernels for sm_{args.arch} ({args.sms} SMs), offline: triton "
        f"{_triton_version()}, ptxas {knobs.nvidia.ptxas.version}, torch {torch.__version__}"
    )
    print(table(records))
    if host_us:
        print(f"\n# host path: median of {args.host_calls} calls, launches returning at once "
              "(the kernels' Python wrappers; not Triton's launch path or the driver)")  # fmt: skip
        width = max(len(label) for label in host_us)
        for label, us in host_us.items():
            print(f"{label.ljust(width)}  {us:7.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
