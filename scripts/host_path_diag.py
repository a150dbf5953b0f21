"""Host-path diagnosis on a GPU (docs/kernels/host_path.md's tables): per case, wall us per call
(N back-to-back calls, one sync) of ours and eager, plain triton.testing.do_bench of both, how
many of our launches took the JIT path and how many host TMA descriptors the armed launches built
during the timed calls (a planned call on pointers seen before takes neither); how many armed
launches reached Triton's C launcher; then cProfile's top entries for four cases. Conv training
is read through autograd and with its backward called directly (docs/kernels/conv.md); every
training case again with autograd on the calling thread ("[calling thread]"), and conv's again
with its backward's CUDA graphs off ("[no graphs]").

    python scripts/host_path_diag.py [N] [case,substrings]
    PYTHONPATH=<checkout of an older commit> python scripts/host_path_diag.py   # its kernels

Bad arguments or no GPU: one line, exit 2."""

import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH: see above
import kernels  # noqa: E402
from experiments.host_path import wall_us  # noqa: E402  (warm-up, calls, one sync)
from kernels import _graphs  # noqa: E402

if not torch.cuda.is_available():
    sys.exit("host_path_diag: needs a CUDA GPU")
try:
    N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    assert N >= 10
except (ValueError, AssertionError):
    print(f"host_path_diag: N must be an int >= 10, got {sys.argv[1]!r}", file=sys.stderr)
    sys.exit(2)
dev, dt = "cuda", torch.bfloat16
g = torch.Generator(device=dev).manual_seed(0)
r = lambda *s: torch.randn(*s, device=dev, dtype=dt, generator=g)
cl = lambda t: t.to(memory_format=torch.channels_last)

a, b = r(1024, 1024), r(1024, 1024)
a2, b2 = r(16, 4096), r(4096, 14336)
x, w, bias = r(16, 4096), r(4096, 4096), r(4096)
xb = r(2048, 4096)
s = r(64, 128)
s2 = r(4096, 4096)
c1, k1 = cl(r(32, 256, 14, 14)), cl(r(256, 256, 3, 3))
c2, k2 = cl(r(32, 64, 56, 56)), cl(r(64, 64, 3, 3))
c3, k3 = cl(r(32, 512, 7, 7)), cl(r(2048, 512, 1, 1))
xg = x.clone().requires_grad_()
wg = w.clone().requires_grad_()
sg = s.clone().requires_grad_()
dy_l = r(16, 4096)
dy_s = r(64, 128)


def conv_training(x0, w0, stride, padding):
    """A training step of our conv through autograd, the same forward and backward called
    directly (no autograd: kernels.conv2d under no_grad, then conv2d_backward in this thread),
    and eager's step: the conv backward's host path read three ways."""
    from kernels.conv.backward import conv2d_backward

    xt, wt = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    dy = cl(torch.randn(F.conv2d(x0, w0, None, stride, padding).shape, device=dev, dtype=dt,
                        generator=g))  # fmt: skip
    pair = (stride, stride), (padding, padding), (1, 1)

    def ours():
        xt.grad = wt.grad = None
        kernels.conv2d(xt, wt, None, stride, padding).backward(dy)

    def direct():
        with torch.no_grad():
            kernels.conv2d(x0, w0, None, stride, padding)
            conv2d_backward(dy, x0, w0, None, 0, *pair, True, True, False)

    def eager():
        xt.grad = wt.grad = None
        F.conv2d(xt, wt, None, stride, padding).backward(dy)

    return (ours, eager), (direct, eager)


def lin_fb_ours():
    kernels.linear(xg, wg, bias, "gelu").backward(dy_l)


def lin_fb_eager():
    F.gelu(F.linear(xg, wg, bias)).backward(dy_l)


def sm_fb_ours():
    kernels.softmax(sg, -1).backward(dy_s)


def sm_fb_eager():
    torch.softmax(sg, -1).backward(dy_s)


cases = {
    "matmul 1024^3": (lambda: kernels.matmul(a, b), lambda: torch.matmul(a, b)),
    "matmul 16x4096x14336": (lambda: kernels.matmul(a2, b2), lambda: torch.matmul(a2, b2)),
    "linear+gelu 16x4096x4096": (
        lambda: kernels.linear(x, w, bias, "gelu"),
        lambda: F.gelu(F.linear(x, w, bias)),
    ),
    "linear+gelu 2048x4096x4096": (
        lambda: kernels.linear(xb, w, bias, "gelu"),
        lambda: F.gelu(F.linear(xb, w, bias)),
    ),
    "linear fwd_bwd 16x4096x4096": (lin_fb_ours, lin_fb_eager),
    "softmax 64x128": (lambda: kernels.softmax(s, -1), lambda: torch.softmax(s, -1)),
    "softmax 4096x4096": (lambda: kernels.softmax(s2, -1), lambda: torch.softmax(s2, -1)),
    "softmax fwd_bwd 64x128": (sm_fb_ours, sm_fb_eager),
    "conv 32x256x14x14 3x3": (
        lambda: kernels.conv2d(c1, k1, None, 1, 1),
        lambda: F.conv2d(c1, k1, None, 1, 1),
    ),
    "conv 32x64x56x56 3x3": (
        lambda: kernels.conv2d(c2, k2, None, 1, 1),
        lambda: F.conv2d(c2, k2, None, 1, 1),
    ),
    "conv 32x512x7x7 1x1": (lambda: kernels.conv2d(c3, k3), lambda: F.conv2d(c3, k3)),
}
c4, k4 = cl(r(32, 128, 56, 56)), cl(r(128, 128, 3, 3) * 0.05)
for label, (x0, w0, stride, padding) in {
    "32x64x56x56 3x3": (c2, k2 * 0.05, 1, 1),
    "32x128x56x56 3x3 s2": (c4, k4, 2, 1),
}.items():
    through_autograd, called_directly = conv_training(x0, w0, stride, padding)
    cases[f"conv fwd_bwd {label}"] = through_autograd
    cases[f"conv fwd+bwd direct {label}"] = called_directly


def calling_thread(step):
    """The training step with autograd's engine on the calling thread: a CUDA backward otherwise
    runs on the engine's device thread, where our Python backward (not eager's C++ one) ran 2-3x
    slower than on the main thread in some processes (docs/kernels/host_path.md)."""

    def call():
        with torch.autograd.set_multithreading_enabled(False):
            step()

    return call


def ungraphed(step):
    """The training step with the conv backward's CUDA graphs off (kernels._graphs.GRAPHS) for
    the call: its launches one by one, as before the graphs (docs/kernels/host_path.md,
    "Graphed backward")."""

    def call():
        saved, _graphs.GRAPHS = _graphs.GRAPHS, False
        try:
            step()
        finally:
            _graphs.GRAPHS = saved

    return call


for name in [n for n in cases if "fwd_bwd" in n]:
    cases[f"{name} [calling thread]"] = tuple(calling_thread(step) for step in cases[name])
for name in [n for n in cases if n.startswith("conv fwd_bwd") and "[" not in n]:
    ours, eager = cases[name]
    cases[f"{name} [no graphs]"] = (ungraphed(ours), eager)
only = sys.argv[2].split(",") if len(sys.argv) > 2 else None



counts = {"jit": 0, "desc": 0}
raw_seen = []
try:
    from kernels import _launch

    orig_launch = _launch.Step._launch

    def launch(self, tensors, *args, **kwargs):
        counts["jit"] += 1
        return orig_launch(self, tensors, *args, **kwargs)

    _launch.Step._launch = launch

    orig_desc_cache = _launch.desc_cache

    def desc_cache(dtype, shape, strides, block, padding="zero", expand=None):
        """An armed launch's descriptor cache, counting its misses (each builds and encodes a
        host TMA descriptor): a pointer seen before builds none."""

        def counted(desc):
            counts["desc"] += 1
            return desc if expand is None else expand(desc)

        return orig_desc_cache(dtype, shape, strides, block, padding, counted)

    _launch.desc_cache = desc_cache
    orig_raw = _launch._raw_entry

    def raw(compiled):
        got = orig_raw(compiled)
        raw_seen.append(got is not None)
        return got

    _launch._raw_entry = raw
    new = True
except (ImportError, AttributeError):
    new = False
print(
    "kernels:",
    kernels.__file__,
    "armed launches" if new else "no kernels._launch",
    torch.__version__,
    triton.__version__,
)
HEAD = ("case", "ours us", "eager us", "e/o", "db ours", "db eager", "e/o")
print(f"{HEAD[0]:36} " + " ".join(f"{h:>8}" for h in HEAD[1:]) + "  jit-launches desc-builds")
for name, (ours, eager) in cases.items():
    if only and not any(o in name for o in only):
        continue
    try:
        ours()
        ours()
        counts["jit"] = counts["desc"] = 0
        o = wall_us(ours, N)
        jit, desc = counts["jit"], counts["desc"]
        e = wall_us(eager, N)
        do = triton.testing.do_bench(ours, return_mode="median") * 1e3
        de = triton.testing.do_bench(eager, return_mode="median") * 1e3
        print(f"{name:36} {o:8.1f} {e:8.1f} {e / o:5.2f} {do:8.1f} {de:8.1f} {de / do:5.2f}  "
              f"{jit:12d} {desc:11d}")  # fmt: skip
    except Exception as exc:
        print(f"{name:36} FAILED {type(exc).__name__}: {str(exc)[:300]}")
print("C launcher reached:", sum(raw_seen), "of", len(raw_seen), "armed launches")
for name, (ours, _) in cases.items():
    profiled = ("matmul 1024", "conv 32x256", "softmax 64x128", "linear+gelu 16")
    if not any(k in name for k in profiled):
        continue
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        ours()
    torch.cuda.synchronize()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(10)
    print(f"--- profile: {name}, 300 calls")
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[-2200:])
