"""Fuzz the public kernel API of every registered op against float64 (hypothesis).

A case is one call of our function (experiments.registry: `OpSpec.triton`) with random shapes,
a dtype, input views (contiguous, transposed, sliced, offset, split, channels_last), the op's
own arguments (bias, activation, stride, padding, dilation, dim) and, for the ops that train,
gradients. It passes when every output and gradient is finite and within
experiments.correctness's tolerance of the same call in float64 (the op's eager function on the
same rounded values). A failing case prints one line: the command that reruns it, then the call.

    python -m experiments.fuzz --cases 1000                  # a GPU: 10% autotuned, the rest not
    python -m experiments.fuzz --case '{"op": "matmul", ...}' # rerun one printed case
    pytest tests/test_fuzz.py                                # CPU, Triton interpreter, 300+ cases

On a GPU every new shape would autotune (seconds a case). `--autotune-share` (default 0.1) is
the share of cases that do; the others take a heuristic pick: Triton's autotuner is handed only
the smallest of the configs its own pruning keeps (see `heuristic_configs`), and the softmax
first-call tuner is switched off (kernels.softmax.dispatch.TUNE), so a case compiles at most one
config per kernel and times nothing. The autotuned cases run first, so their tuned picks are the
ones cached for their shapes.
"""

import argparse
import contextlib
import copy
import importlib
import json
import math
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import torch

if not torch.cuda.is_available():  # before any kernel is imported: `triton.jit` reads it
    import os

    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as seed_of
from hypothesis import strategies as st

from experiments import registry
from experiments.correctness import relative_error, tolerance

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
VIEWS = ("contiguous", "transposed", "sliced", "offset", "split")
ACTIVATIONS = (None, "none", "relu", "gelu", "gelu_tanh", "silu")


@dataclass
class Case:
    """One call: `tensors` are (name, shape, view) in the function's positional order (None for an
    absent bias), `kwargs` the rest of its arguments."""

    op: str
    dtype: str
    tensors: list
    kwargs: dict = field(default_factory=dict)
    grad: bool = False
    seed: int = 0

    def call_text(self) -> str:
        spec = registry.get(self.op)
        parts = ["None" if t is None else f"{t[0]}[{'x'.join(map(str, t[1]))} {t[2]}]"
                 for t in self.tensors]
        parts += [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{spec.triton.replace(':', '.')}({', '.join(parts)}) {self.dtype}" + (
            " +grad" if self.grad else "")

    def reproducer(self) -> str:
        """One line: the command that reruns this case, then the call it makes."""
        return (f"python -m experiments.fuzz --case '{json.dumps(asdict(self))}'"
                f"  # {self.call_text()}")


# ---- case strategies, one per op (a registered op without one fails tests/test_fuzz.py) ----
def _dim(draw, high):
    """Sizes 1 to `high`, mostly small: odd and prime sizes come up as often as round ones."""
    return draw(st.one_of(st.integers(1, min(high, 17)), st.integers(1, high)))


def _bounded(draw, n, high, budget):
    """n sizes of at most `high` each whose product stays within `budget` (the interpreter's
    time), drawn one after another."""
    sizes = []
    for i in range(n):  # an early size leaves room for the later ones
        room = budget // max(1, math.prod(sizes)) // (1 if i == n - 1 else n - i)
        sizes.append(_dim(draw, max(1, min(high, room))))
    return sizes


@st.composite
def matmul_case(draw, high, budget):
    m, n, k = _bounded(draw, 3, high, budget)
    return [("a", [m, k], draw(st.sampled_from(VIEWS))),
            ("b", [k, n], draw(st.sampled_from(VIEWS)))], {}


@st.composite
def linear_case(draw, high, budget):
    lead = [] if draw(st.booleans()) else [draw(st.integers(1, 3))]
    m, n, k = _bounded(draw, 3, high, budget // max(1, math.prod(lead)))
    bias = draw(st.booleans())
    tensors = [("x", [*lead, m, k], draw(st.sampled_from(VIEWS))),
               ("weight", [n, k], draw(st.sampled_from(VIEWS))),
               ("bias", [n], draw(st.sampled_from(("contiguous", "offset", "sliced")))) if bias
               else None]
    return tensors, {"activation": draw(st.sampled_from(ACTIVATIONS))}


@st.composite
def softmax_case(draw, high, budget):
    ndim = draw(st.integers(1, 3))
    shape = _bounded(draw, ndim, high, budget)
    dim = draw(st.integers(-ndim, ndim - 1))
    return [("x", shape, draw(st.sampled_from(VIEWS)))], {"dim": dim}


def _pair_or_int(draw, low, high):
    return draw(st.one_of(st.integers(low, high), st.tuples(st.integers(low, high),
                                                             st.integers(low, high))))


@st.composite
def conv_case(draw, high, budget):
    stride, padding, dilation = (_pair_or_int(draw, 1, 3), _pair_or_int(draw, 0, 3),
                                 _pair_or_int(draw, 1, 2))
    pairs = [(v, v) if isinstance(v, int) else v for v in (stride, padding, dilation)]
    r, s = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    # the smallest input that the window fits into: dilation * (kernel - 1) + 1 - 2 * padding
    low_h = max(1, pairs[2][0] * (r - 1) + 1 - 2 * pairs[1][0])
    low_w = max(1, pairs[2][1] * (s - 1) + 1 - 2 * pairs[1][1])
    side = max(low_h, low_w, int(math.sqrt(max(1, budget // (r * s * 8)))) // 4)
    h = draw(st.integers(low_h, max(low_h, min(high, side))))
    w = draw(st.integers(low_w, max(low_w, min(high, side))))
    n, c, k = _bounded(draw, 3, min(high, 64), max(1, budget // (h * w * r * s)))
    batched = draw(st.booleans()) or n > 1
    x_shape = [n, c, h, w] if batched else [c, h, w]
    x_views = ("contiguous", "channels_last", "sliced", "offset", "transposed") if batched else (
        "contiguous", "sliced", "offset")
    tensors = [("x", x_shape, draw(st.sampled_from(x_views))),
               ("weight", [k, c, r, s], draw(st.sampled_from(("contiguous", "channels_last",
                                                               "offset")))),
               ("bias", [k], "contiguous") if draw(st.booleans()) else None]
    return tensors, {"stride": stride, "padding": padding, "dilation": dilation,
                     "activation": draw(st.sampled_from(ACTIVATIONS))}


@st.composite
def sdpa_case(draw, high, budget):
    """q (batch, heads, seq_q, head_dim), k and v of kv_heads dividing heads (grouped-query
    where fewer); head_dim a multiple of 8 in 16-128, the fused attention's range."""
    kv_heads = draw(st.integers(1, 3))
    heads = kv_heads * draw(st.integers(1, 3))
    head_dim = draw(st.sampled_from((16, 24, 32, 64, 72, 128)))
    batch, seq_q, seq_k = _bounded(draw, 3, high, max(1, budget // (heads * head_dim)))
    causal = draw(st.booleans())
    # Where every query sees one key (one key; or causal with one query, which sees key 0
    # alone) every softmax is exactly 1 and dQ exactly 0 in float64, while any rounded backward
    # (torch's math path in fp32 too) leaves ~1e-7 of dO·V - rowsum(dO·O): the zero-reference
    # rule of _compare would fail it. Causal with two queries is nearly that: dQ is one row's,
    # over two keys, dS = P0·P1·(dP0 - dP1), a difference of rounded products, where
    # FlashAttention's Δ = rowsum(dO·O) from the rounded O costs ulps that the math path's
    # softmax backward does not (fp16: 2.05e-3 against eager's 1e-3, seed 8637). So two keys,
    # and three queries and keys when causal.
    seq_k = max(3 if causal else 2, seq_k)
    seq_q = max(3, seq_q) if causal else seq_q
    views = ("contiguous", "transposed", "sliced", "offset")
    tensors = [("query", [batch, heads, seq_q, head_dim], draw(st.sampled_from(views))),
               ("key", [batch, kv_heads, seq_k, head_dim], draw(st.sampled_from(views))),
               ("value", [batch, kv_heads, seq_k, head_dim], draw(st.sampled_from(views)))]
    return tensors, {"is_causal": causal, "enable_gqa": heads != kv_heads}


CASES = {"matmul": matmul_case, "linear": linear_case, "softmax": softmax_case,
         "conv": conv_case, "sdpa": sdpa_case}


def fuzzed_ops() -> list[str]:
    """Every registered op but the composed blocks, which only call these ops."""
    return registry.names("op")


@st.composite
def cases(draw, ops=None, dtypes=tuple(DTYPES), high=300, budget=200_000):
    """A Case of one of `ops` (default: every registered op but the composed blocks)."""
    op = draw(st.sampled_from(sorted(ops or fuzzed_ops())))
    tensors, kwargs = draw(CASES[op](high, budget))
    grad = "fwd_bwd" in registry.get(op).passes and draw(st.booleans())
    return Case(op, draw(st.sampled_from(dtypes)), [list(t) if t else None for t in tensors],
                kwargs, grad, draw(st.integers(0, 2**16)))


# ---- running a case ----
def make_tensor(shape, view, dtype, device, generator) -> torch.Tensor:
    """Random values of `shape` laid out as `view` describes (values never all zero)."""
    def randn(*size):
        return torch.randn(size, generator=generator, device=device).to(dtype)

    if view == "transposed" and len(shape) >= 2:
        return randn(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
    if view == "sliced":
        return randn(*shape[:-1], 2 * shape[-1])[..., ::2]
    if view == "offset":  # the storage starts one element in: a misaligned base pointer
        return randn(math.prod(shape) + 1)[1:].view(shape)
    if view == "split":  # rows padded to a longer stride, as a torch.split piece
        return randn(*shape[:-1], shape[-1] + 3)[..., : shape[-1]]
    if view == "channels_last" and len(shape) == 4:
        return randn(*shape).contiguous(memory_format=torch.channels_last)
    return randn(*shape)


def _compare(name: str, out, ref, limit: float) -> str | None:
    if out.shape != ref.shape:
        return f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    if not torch.isfinite(out).all():
        return f"{name}: NaN or inf"
    if not ref.abs().max() > 0:  # e.g. relu of an all-negative 1x1 output: must be exactly zero
        return None if not out.abs().max() > 0 else f"{name}: nonzero where the reference is 0"
    error = relative_error(out, ref)
    return None if error <= limit else f"{name}: relative error {error:.3g} > {limit:.3g}"


def _eager_errors(eager, case: Case, args, ref, ref_args, grad_out) -> list[float]:
    """Eager PyTorch's own relative errors on the same rounded inputs in the same dtype (the
    output, then each gradient). On a few elements one rounding is the whole norm (a 1x1 bf16
    gelu gradient is 2% off in eager as well), so a case fails only where ours is off by more
    than the dtype's tolerance AND by more than twice what eager gets."""
    mine = [None if a is None else a.detach().clone().requires_grad_(case.grad) for a in args]
    with _tf32_off():
        out = eager(*mine, **case.kwargs)
        errors = [relative_error(out, ref) if ref.abs().max() > 0 else 0.0]
        if case.grad:
            out.backward(grad_out)
            errors += [relative_error(a.grad, r.grad) if r.grad.abs().max() > 0 else 0.0
                       for a, r in zip(mine, ref_args, strict=True) if a is not None]
    return errors


@contextlib.contextmanager
def _tf32_off():
    """torch's own TF32 switches off (cuDNN's is on by default, and the conv kernel follows it)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def run_case(case: Case, device: str) -> str | None:
    """None if our call matches float64, else what differs. Errors raised by our call count as
    failures too (every case is a valid call of the API)."""
    spec = registry.get(case.op)
    ours, eager = registry.resolve(spec.triton), spec.eager
    generator = torch.Generator(device=device).manual_seed(case.seed)
    dtype = DTYPES[case.dtype]
    args = [None if t is None else make_tensor(t[1], t[2], dtype, device, generator)
            for t in case.tensors]
    ref_args = [None if a is None else a.detach().to(torch.float64) for a in args]
    if case.grad:
        for a in (*args, *ref_args):
            if a is not None:
                a.requires_grad_()
    try:
        with _tf32_off():  # fp32 is checked at fp32's tolerance: TF32 off, as the harness sets it
            out = ours(*args, **copy.deepcopy(case.kwargs))
    except Exception as exc:  # noqa: BLE001 (any error of a valid call is the finding)
        return f"raised {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
    ref = eager(*ref_args, **case.kwargs)
    if out.dtype != dtype:
        return f"output dtype {out.dtype} != {dtype}"
    grad_out = None
    if case.grad:
        grad_out = torch.randn(out.shape, generator=generator, device=device).to(dtype)
        with _tf32_off():
            out.backward(grad_out)
        ref.backward(grad_out.to(torch.float64))
    eager_errors = iter(_eager_errors(eager, case, args, ref, ref_args, grad_out))
    tol = tolerance(case.dtype, tf32=False)
    if problem := _compare("output", out.detach(), ref.detach(), max(tol, 2 * next(eager_errors))):
        return problem
    if case.grad:
        for t, a, r in zip(case.tensors, args, ref_args, strict=True):
            if a is None:
                continue
            limit = max(tol, 2 * next(eager_errors))
            if problem := _compare(f"grad {t[0]}", a.grad, r.grad, limit):
                return problem
    return None


# ---- skipping per-shape autotuning ----
def _tile_volume(config) -> float:
    sizes = [v for k, v in config.all_kwargs().items()
             if k.upper().startswith("BLOCK") and isinstance(v, int)]
    return math.prod(sizes) * max(1, config.num_stages or 1)


@contextlib.contextmanager
def heuristic_configs():
    """Triton's autotuners keep only the smallest config (tile volume times stages) of those their
    own pruning leaves, so a new shape compiles one config and times none; the softmax first-call
    tuner keeps its heuristic pick. Undone on exit."""
    from triton.runtime import autotuner

    prune = autotuner.Autotuner.prune_configs

    def smallest(self, kwargs, *args, **more):
        configs = prune(self, kwargs, *args, **more)
        return [min(configs, key=_tile_volume)] if configs else configs

    # by module path: the package `kernels` exports a function named softmax
    softmax = importlib.import_module("kernels.softmax.dispatch")
    tune = softmax.TUNE
    autotuner.Autotuner.prune_configs, softmax.TUNE = smallest, False
    try:
        yield
    finally:
        autotuner.Autotuner.prune_configs, softmax.TUNE = prune, tune


# ---- the driver ----
def fuzz(n: int, device: str, seed: int, autotuned: bool, high: int, budget: int,
         tally: Counter, failures: list) -> None:
    """Run `n` hypothesis cases; every case is tallied, failures shrunk and kept (printed)."""
    if n < 1:
        return

    @settings(max_examples=n, deadline=None, database=None, derandomize=False,
              phases=(Phase.generate, Phase.shrink), report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck))
    @given(case=cases(high=high, budget=budget))
    def one(case):
        tally["cases"] += 1
        tally[f"op:{case.op}"] += 1
        tally[f"dtype:{case.dtype}"] += 1
        tally["autotuned" if autotuned else "heuristic"] += 1
        tally["grad"] += case.grad
        problem = run_case(case, device)
        if problem:
            raise AssertionError(f"{problem}: {case.reproducer()}")

    try:
        seed_of(seed)(one)()
    except Exception as exc:  # noqa: BLE001 (the shrunk failure, or hypothesis's own error)
        failures.append(str(exc).strip().splitlines()[0])


def _run_workers(args, argv: list[str], tally: Counter, failures: list) -> None:
    """Split the cases over `args.workers` processes, seeds apart, and add up what they found."""
    import subprocess

    base, skip = [], False
    for arg in argv:  # the caller's arguments less those each worker gets its own value of
        if skip:
            skip = False
        elif arg.split("=")[0] in ("--workers", "--cases", "--seed"):
            skip = "=" not in arg
        else:
            base.append(arg)
    share = [args.cases // args.workers + (i < args.cases % args.workers)
             for i in range(args.workers)]  # fmt: skip
    procs = [subprocess.Popen(
        [sys.executable, "-m", "experiments.fuzz", *base, "--workers", "1", "--cases", str(n),
         "--seed", str(args.seed + 1000 * i), "--summary-json"],
        stdout=subprocess.PIPE, text=True) for i, n in enumerate(share) if n]  # fmt: skip
    for proc in procs:
        out, _ = proc.communicate()
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if proc.returncode or not lines:
            failures.append(f"a worker exited {proc.returncode} without its summary")
            continue
        summary = json.loads(lines[-1])
        tally.update(summary["tally"])
        failures.extend(summary["failures"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000, help="cases in all (default 1000)")
    parser.add_argument("--autotune-share", type=float, default=0.1,
                        help="share of cases with per-shape autotuning on (default 0.1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--max-dim", type=int, default=512, help="largest size of any dim")
    parser.add_argument("--budget", type=int, default=1 << 22,
                        help="bound on a case's work (product of its main sizes)")
    parser.add_argument("--case", help="rerun one case: the JSON a failure printed")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes sharing the cases (each a seed of its own): compiling a "
                        "new shape's kernel is CPU work, and a GPU host has the cores")
    parser.add_argument("--summary-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 0 <= args.autotune_share <= 1 or args.cases < 1 or args.workers < 1:
        print("error: --cases and --workers must be >= 1 and --autotune-share within [0, 1]",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.case:
        case = Case(**json.loads(args.case))
        problem = run_case(case, args.device)
        print(f"{'FAIL ' + problem if problem else 'ok'}: {case.call_text()}")
        return 1 if problem else 0
    tally, failures, started = Counter(), [], time.perf_counter()
    if args.workers > 1:
        _run_workers(args, argv if argv is not None else sys.argv[1:], tally, failures)
    else:
        tuned = round(args.cases * args.autotune_share)
        fuzz(tuned, args.device, args.seed, True, args.max_dim, args.budget, tally, failures)
        with heuristic_configs():
            fuzz(args.cases - tuned, args.device, args.seed + 1, False, args.max_dim,
                 args.budget, tally, failures)  # fmt: skip
    if args.summary_json:
        print(json.dumps({"tally": tally, "failures": failures}))
        return 0
    wall = time.perf_counter() - started
    ops = {k[3:]: v for k, v in sorted(tally.items()) if k.startswith("op:")}
    dtypes = {k[6:]: v for k, v in sorted(tally.items()) if k.startswith("dtype:")}
    print(f"fuzz: {tally['cases']} cases ({tally['autotuned']} autotuned, {tally['heuristic']} "
          f"heuristic, {tally['grad']} with gradients) on {args.device} in {wall:.0f} s; "
          f"ops {ops}; dtypes {dtypes}; mismatches {len(failures)}")
    for line in failures:
        print(f"FAIL {line}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
