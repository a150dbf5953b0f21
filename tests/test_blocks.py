"""The composed blocks (experiments/blocks.py): registered as workloads of the ops they call,
each mode's module against float64 on odd sizes, the calls mode=triton makes, the weights'
scale, the cost formulas against their ops' own, and Inductor's attention rewrite.

The harness runs each block on its `cpu` set through the CLI in tests/test_experiment.py, and
through every dtype, strided inputs and gradients in tests/test_ops_api.py (both parametrise
over the registry).
"""

import copy
import shlex
import warnings

import pytest
import torch
from omegaconf import OmegaConf

from experiments import blocks, registry, single_ops
from experiments.correctness import allowed_error, relative_error, tolerance
from experiments.registry import eager_ops, make_workload, triton_ops
from experiments.workloads import resolve_shapes, with_ops
from tests.conftest import CONF_DIR, DEVICE, REPO_ROOT, fast_subset

BLOCKS = {"mlp": ("linear",), "attention": ("matmul", "softmax"), "bottleneck": ("conv",)}
# more odd sizes than the cpu sets hold: one token, a batch of heads, a batch of images
EXTRA_SHAPES = {
    "mlp": {"m": 1, "d": 17, "ffn": 33},
    "attention": {"batch": 2, "heads": 3, "seq": 9, "head_dim": 8},
    "bottleneck": {"n": 2, "c": 6, "h": 7, "w": 5, "width": 3},
}


def _workload(name):
    cfg = OmegaConf.load(CONF_DIR / "kernel" / f"{name}.yaml")
    return cfg, make_workload(cfg)


def _eager(workload, shape, dtype, generator):
    module = workload.make_module(shape, eager_ops()).to(DEVICE)
    workload.init_parameters(module, generator)
    return module.to(dtype)


# ---------------------------------------------------------------------------------------------
# The registry: blocks are workloads of registered ops, and add no function of their own
# ---------------------------------------------------------------------------------------------
def test_the_blocks_are_registered_as_composed_workloads():
    assert {name for name, spec in registry.OPS.items() if spec.composed} == set(BLOCKS)
    for name, ops in BLOCKS.items():
        spec = registry.OPS[name]
        assert spec.composed == ops and spec.workload.name == name
        assert spec.function is None and spec.eager is None
        assert spec.triton == "+".join(registry.OPS[op].triton for op in ops)
        assert spec.triton_compiled == "+".join(registry.OPS[op].triton_compiled for op in ops)
        assert all(grid.startswith(f"kernel={name} ") for grid in spec.bench) and spec.bench
        assert (CONF_DIR / "kernel" / f"{name}.yaml").is_file()
    assert all(registry.OPS[name].passes == ("fwd", "fwd_bwd") for name in BLOCKS)
    assert (REPO_ROOT / "docs" / "blocks.md").is_file()
    for impl in ("eager", "triton", "triton_compiled"):
        assert not set(vars(registry.namespace(impl))) & set(BLOCKS)


def test_a_block_of_an_op_without_a_mode_is_skipped_in_that_mode():
    """Its triton_compiled follows its ops': None where one lacks it, so `unsupported` skips it."""
    registry.register(registry.OpSpec(
        name="half", function="half", workload=single_ops.MatmulWorkload, eager=torch.neg,
        triton="kernels:matmul", triton_compiled=None, bound="memory",
    ))  # fmt: skip
    try:
        spec = registry.register(registry.OpSpec(
            name="pair", function=None, workload=single_ops.MatmulWorkload, eager=None,
            triton=None, triton_compiled=None, bound="compute", composed=("matmul", "half"),
        ))  # fmt: skip
        assert spec.triton == "kernels:matmul+kernels:matmul" and spec.triton_compiled is None
        compiled = OmegaConf.create({"name": "triton-compiled", "kind": "triton_compiled"})
        assert registry.unsupported(compiled, "pair").startswith("unsupported: pair has no")
        assert registry.unsupported(OmegaConf.create({"name": "t", "kind": "triton"}),
                                    "pair") is None  # fmt: skip
    finally:
        registry.unregister("pair")
        registry.unregister("half")


def test_a_block_of_unknown_or_composed_ops_is_refused():
    for parts in (("matmul", "nope"), ("mlp",)):
        with pytest.raises(ValueError, match="composed of registered single ops"):
            registry.OpSpec("x", None, single_ops.MatmulWorkload, None, None, None,
                            bound="compute", composed=parts)  # fmt: skip


@pytest.mark.parametrize("name", fast_subset(BLOCKS, ["mlp"]))
def test_the_bench_grids_compose_into_jobs_the_block_runs(name):
    """Every job of `make bench kernel=<name>` passes the CLI's checks (a shape key named like a
    credential, say, is refused there) in a pass the block has."""
    from experiments import schema
    from experiments.run import refuse_secrets

    spec = registry.OPS[name]
    for grid in spec.bench:
        schema.preflight(["--multirun", *shlex.split(grid)], CONF_DIR, check_secrets=refuse_secrets)
        overrides = dict(item.split("=", 1) for item in shlex.split(grid))
        assert set(overrides.get("pass", "fwd").split(",")) <= set(spec.passes)


@pytest.mark.parametrize("name", list(BLOCKS))
def test_every_shape_set_fits_its_description(name):
    cfg, workload = _workload(name)
    sets = {key: resolve_shapes(workload, cfg, key, on_gpu=True)[1] for key in cfg.shape_sets}
    assert resolve_shapes(workload, cfg, "auto", on_gpu=False)[0] == "cpu"
    if name == "mlp":
        assert [s["m"] for s in sets["llama3_8b"]] == [16, 128, 2048, 8192]
        assert {(s["d"], s["ffn"]) for s in sets["llama3_8b"]} == {(4096, 14336)}
    if name == "attention":  # the float64 check holds ~5 score-sized tensors: 4 GB each at most
        assert max(s["batch"] * s["heads"] * s["seq"] ** 2 for s in sets["default"]) <= 2**29
        assert {s["seq"] for s in sets["default"]} == {1024, 2048, 4096, 8192}
    if name == "bottleneck":
        assert [(s["c"], s["width"], s["h"]) for s in sets["resnet50"]] == [
            (256, 64, 56),
            (1024, 256, 14),
        ]


# ---------------------------------------------------------------------------------------------
# Each mode's module against float64, and the calls mode=triton makes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype_name", fast_subset(["fp32", "bf16"]))
@pytest.mark.parametrize("name", list(BLOCKS))
def test_ours_matches_float64_on_odd_sizes(name, dtype_name):
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    _, workload = _workload(name)
    shape = workload.parse_shape(EXTRA_SHAPES[name])
    generator = torch.Generator(device=DEVICE).manual_seed(3)
    eager = _eager(workload, shape, dtype, generator)
    ours = with_ops(eager, triton_ops())
    reference = copy.deepcopy(eager).to(torch.float64)
    inputs = workload.make_inputs(shape, dtype, DEVICE, generator)
    train = "fwd_bwd" in registry.OPS[name].passes
    inputs = [t.requires_grad_(train) for t in inputs]
    ref_inputs = [t.detach().to(torch.float64).requires_grad_(train) for t in inputs]
    out, expected = ours(*inputs), reference(*ref_inputs)
    assert out.dtype == dtype and out.shape == expected.shape
    if name == "bottleneck":
        assert out.is_contiguous(memory_format=torch.channels_last)
    # the harness's budget for the dtype; on a GPU fp32 runs TF32 dots where torch allows them
    # (cuDNN's switch for the convs, matmul's for the GEMMs), as the harness records it
    tf32 = DEVICE == "cuda" and (torch.backends.cudnn.allow_tf32 if name == "bottleneck"
                                 else torch.backends.cuda.matmul.allow_tf32)  # fmt: skip
    limit = tolerance(dtype_name, tf32=tf32)
    assert relative_error(out, expected) < limit
    if train:
        grad = torch.randn(out.shape, generator=generator, device=DEVICE)
        out.backward(grad.to(dtype))
        expected.backward(grad.to(torch.float64))
        got = [t.grad for t in inputs] + [p.grad.clone() for p in ours.parameters()]
        want = [t.grad for t in ref_inputs] + [p.grad for p in reference.parameters()]
        # eager on the same inputs: a block rounds every intermediate to the dtype, so a
        # gradient may sit past the dtype's budget in eager too, and the harness then holds
        # a row to EAGER_FACTOR x eager's error (experiments.correctness.allowed_error)
        for p in eager.parameters():  # ours shares them (with_ops)
            p.grad = None
        eager_inputs = [t.detach().clone().requires_grad_() for t in inputs]
        eager(*eager_inputs).backward(grad.to(dtype))
        baseline = [t.grad for t in eager_inputs] + [p.grad for p in eager.parameters()]
        for g, w, e in zip(got, want, baseline, strict=True):
            assert relative_error(g, w) < allowed_error(limit, relative_error(e, w))


class Recorder:
    """An ops namespace that logs each call (function, non-tensor arguments) and runs eager's."""

    def __init__(self):
        self.calls = []
        for function, eager in vars(eager_ops()).items():
            setattr(self, function, self._logged(function, eager))

    def _logged(self, function, eager):
        def call(*args, **kwargs):
            given = (*args, *(kwargs[k] for k in sorted(kwargs)))  # keywords: the activation
            plain = tuple(a for a in given if not isinstance(a, torch.Tensor) and a is not None)
            self.calls.append((function, plain))
            return eager(*args, **kwargs)

        return call


@pytest.mark.parametrize("name", list(BLOCKS))
def test_each_block_calls_its_ops_with_the_fused_epilogues(name):
    _, workload = _workload(name)
    shape = workload.parse_shape(EXTRA_SHAPES[name])
    generator = torch.Generator(device=DEVICE).manual_seed(4)
    recorder = Recorder()
    module = with_ops(_eager(workload, shape, torch.float32, generator), recorder)
    module(*workload.make_inputs(shape, torch.float32, DEVICE, generator))
    expected = {
        "mlp": [("linear", ("gelu",)), ("linear", ())],  # bias+gelu in the first's epilogue
        "attention": [("matmul", ()), ("softmax", (-1,)), ("matmul", ())],
        "bottleneck": [
            ("conv2d", (1, 0, 1, "relu")),
            ("conv2d", (1, 1, 1, "relu")),
            ("conv2d", (1, 0, 1, "relu")),  # with residual=x: the shortcut, then the relu
        ],
    }[name]
    assert recorder.calls == expected


@pytest.mark.slow
def test_attention_puts_the_scale_where_a_kernel_takes_it():
    """Our softmax and its custom op take scale= (the scale in their load), a peer's GEMM may
    take alpha= (quack's epilogue), torch's ops neither: those modules multiply the scores,
    the pattern Inductor rewrites. Swapping the namespace on a copy (with_ops, as the harness
    does) decides it again, and every form gives eager's output."""
    _, workload = _workload("attention")
    shape = workload.parse_shape(EXTRA_SHAPES["attention"])
    generator = torch.Generator(device=DEVICE).manual_seed(6)
    eager = _eager(workload, shape, torch.float32, generator)
    assert eager.scale_in is None and not blocks.takes(torch.softmax, "scale")
    inputs = workload.make_inputs(shape, torch.float32, DEVICE, generator)
    expected = eager(*inputs)

    def matmul_alpha(a, b, *, alpha=1.0):
        return torch.matmul(a, b) * alpha

    alpha_ops = copy.copy(eager_ops())
    alpha_ops.matmul = matmul_alpha
    for ops, where in ((triton_ops(), "softmax"), (registry.namespace("triton_compiled"),
                       "softmax"), (alpha_ops, "matmul"), (Recorder(), None)):  # fmt: skip
        module = with_ops(eager, ops)
        assert module.scale_in == where and eager.scale_in is None
        assert relative_error(module(*inputs), expected) < tolerance("fp32", False)


@pytest.mark.parametrize("train", [False, True], ids=["fwd", "fwd_bwd"])
def test_the_fused_form_runs_ours_as_one_attention_kernel(train):
    """kernel.form=fused: our namespaces compute the block with the fused attention (one
    kernels.sdpa call), eager's still writes it out; both match float64, gradients too."""
    kernel = OmegaConf.merge(OmegaConf.load(CONF_DIR / "kernel" / "attention.yaml"),
                             {"form": "fused"})  # fmt: skip
    workload = make_workload(kernel)
    shape = workload.parse_shape({"batch": 2, "heads": 2, "seq": 19, "head_dim": 16})
    generator = torch.Generator(device=DEVICE).manual_seed(8)
    eager = _eager(workload, shape, torch.float32, generator)
    inputs = [t.requires_grad_(train) for t in workload.make_inputs(shape, torch.float32, DEVICE,
                                                                    generator)]  # fmt: skip
    reference = copy.deepcopy(eager).double()
    want = reference(*(t.detach().double().requires_grad_(train) for t in inputs))
    assert not eager.fused
    for ops in (triton_ops(), registry.namespace("triton_compiled")):
        module = with_ops(eager, ops)
        calls = []
        with kernels_sdpa_spy(ops, calls):
            got = module(*inputs)
        assert module.fused and len(calls) == 1
        assert relative_error(got, want) < tolerance("fp32", False)
        if train:
            grads = torch.autograd.grad(got.sum(), inputs)
            dq = torch.autograd.grad(eager(*inputs).sum(), inputs)
            for a, b in zip(grads, dq, strict=True):
                assert relative_error(a, b) < 10 * tolerance("fp32", False)
    with pytest.raises(Exception, match="kernel.form='flash'"):
        make_workload(OmegaConf.merge(kernel, {"form": "flash"}))


class kernels_sdpa_spy:  # noqa: N801 (a context manager named as what it watches)
    """Counts the calls a namespace's sdpa takes while the block runs."""

    def __init__(self, ops, calls):
        self.ops, self.calls, self.real = ops, calls, ops.sdpa

    def __enter__(self):
        def spy(*args, **kwargs):
            self.calls.append(args[0].shape)
            return self.real(*args, **kwargs)

        self.ops.sdpa = spy

    def __exit__(self, *exc):
        self.ops.sdpa = self.real


def test_weights_are_scaled_by_fan_in_so_activations_keep_unit_variance():
    _, workload = _workload("mlp")
    shape = workload.parse_shape({"m": 256, "d": 512, "ffn": 1024})
    generator = torch.Generator(device=DEVICE).manual_seed(5)
    module = _eager(workload, shape, torch.float32, generator)
    for name, p in module.named_parameters():
        fan_in = p[0].numel() if name.endswith("weight") else 1
        assert 0.9 < p.std().item() * fan_in**0.5 < 1.1, name
    (x,) = workload.make_inputs(shape, torch.float32, DEVICE, generator)
    assert 0.5 < module(x).var().item() < 3  # gelu's output plus two unit-variance biases

    _, workload = _workload("bottleneck")
    shape = workload.parse_shape({"n": 2, "c": 64, "h": 8, "w": 8, "width": 16})
    module = _eager(workload, shape, torch.float32, generator)
    (x,) = workload.make_inputs(shape, torch.float32, DEVICE, generator)
    assert 0.5 < module(x).var().item() < 3


# ---------------------------------------------------------------------------------------------
# Costs: a block's FLOPs are its ops' FLOPs
# ---------------------------------------------------------------------------------------------
def test_block_flops_are_the_sum_of_their_ops():
    cfg = OmegaConf.create({"bias": True, "activation": "gelu", "memory_format": "nhwc"})
    linear, matmul = single_ops.LinearWorkload(cfg), single_ops.MatmulWorkload(cfg)
    conv = single_ops.ConvWorkload(cfg)
    m, d, f = 2048, 4096, 14336
    for pass_name in ("fwd", "fwd_bwd"):
        mlp = make_workload(OmegaConf.create({"name": "mlp"})).flops(
            {"m": m, "d": d, "ffn": f}, pass_name
        )
        assert mlp == (linear.flops({"m": m, "n": f, "k": d}, pass_name)
                       + linear.flops({"m": m, "n": d, "k": f}, pass_name))  # fmt: skip
    b, h, s, hd = 1, 16, 4096, 128
    attention = make_workload(OmegaConf.create({"name": "attention"}))
    products = (matmul.flops({"batch": b * h, "m": s, "n": s, "k": hd}, "fwd")
                + matmul.flops({"batch": b * h, "m": s, "n": hd, "k": s}, "fwd"))  # fmt: skip
    shape = {"batch": b, "heads": h, "seq": s, "head_dim": hd}
    assert attention.flops(shape, "fwd") == products
    assert attention.flops(shape, "fwd_bwd") == 3 * products  # the backward's four products
    # the fused lower bound leaves the heads·seq² scores out
    assert attention.min_bytes(shape, "fwd", 2) == 4 * b * h * s * hd * 2
    n, c, width, hw = 32, 256, 64, 56
    bottleneck = make_workload(OmegaConf.create({"name": "bottleneck"}))
    convs = [(c, width, 1, 0), (width, width, 3, 1), (width, c, 1, 0)]
    assert bottleneck.flops({"n": n, "c": c, "h": hw, "w": hw, "width": width}, "fwd") == sum(
        conv.flops(
            conv.parse_shape(
                {"n": n, "c": ci, "h": hw, "w": hw, "k": k, "r": r, "s": r, "padding": pad}
            ),
            "fwd",
        )
        for ci, k, r, pad in convs
    )
    bottleneck_shape = {"n": n, "c": c, "h": hw, "w": hw, "width": width}
    assert bottleneck.flops(bottleneck_shape, "fwd_bwd") == 3 * bottleneck.flops(
        bottleneck_shape, "fwd"
    )


# ---------------------------------------------------------------------------------------------
# Inductor's attention rewrite: what a compiled row's fused-attention flag reads
# ---------------------------------------------------------------------------------------------
# the custom ops' case compiles a C++ kernel for the scale on the CPU (15 s): slow
@pytest.mark.parametrize("impl", ["eager", pytest.param("triton_compiled", marks=pytest.mark.slow)])
@pytest.mark.slow
def test_inductor_rewrites_the_attention_block_into_sdpa_but_not_our_custom_ops(impl):
    from torch._inductor.utils import run_and_get_code

    _, workload = _workload("attention")
    shape = workload.parse_shape({"batch": 1, "heads": 2, "seq": 17, "head_dim": 16})
    generator = torch.Generator(device=DEVICE).manual_seed(6)
    eager = _eager(workload, shape, torch.float32, generator)
    module = with_ops(eager, registry.namespace(impl))
    inputs = workload.make_inputs(shape, torch.float32, DEVICE, generator)
    torch.compiler.reset()
    torch._dynamo.utils.counters.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, codes = run_and_get_code(torch.compile(module, fullgraph=True), *inputs)
    fused = impl == "eager"  # torch's matmul/softmax: the pattern; our custom ops: opaque
    assert (blocks.fused_attention_rewrites() > 0) == fused
    assert any("scaled_dot_product" in code for code in codes) == fused
    assert relative_error(out, eager(*inputs)) < tolerance("fp32", tf32=False)
    torch.compiler.reset()
