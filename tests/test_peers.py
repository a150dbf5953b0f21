"""The peer libraries as modes (experiments/peers.py, docs/peers.md).

Liger-Kernel's Triton kernels run in the interpreter: mode=liger and liger-direct go through the
real harness on the cpu shape sets. FlagGems (its import looks for a GPU; its LibEntry wrappers
need compiled kernels) and QuACK (CuTe DSL) cannot run on a CPU: their modes are tested through
their `skipped` rows, and their adapters through the harness with each library function replaced
by its aten twin (what flag_gems registers its functions for), so that on a GPU only the library
itself is new. A missing package, or one whose import fails, gives skipped rows and one log line.

`make peers` installs the libraries; without them the tests that need one skip, unless
KBENCH_PEERS_REQUIRED=1 (CI sets it after `make peers`) makes that a failure.
"""

import dataclasses
import importlib.machinery
import os
import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from analysis import figures
from experiments import peers
from experiments.errors import ConfigError
from experiments.records import validate
from tests.conftest import REPO_ROOT, fast_subset


@pytest.fixture(autouse=True)
def fresh_peer_state():
    """Each test imports (or fails to import) the libraries afresh and builds its own callables."""
    for cached in (peers.import_error, peers._ops, peers._warn_once):
        cached.cache_clear()
    yield
    for cached in (peers.import_error, peers._ops, peers._warn_once):
        cached.cache_clear()


def require(module: str):
    if peers.installed(module):
        return
    message = f"{module} is not installed: `make peers` (docs/peers.md)"
    if os.environ.get("KBENCH_PEERS_REQUIRED") == "1":
        pytest.fail(message)
    pytest.skip(message)


def run(compose_job, *overrides):
    from experiments.run import run as run_job

    return run_job(compose_job(["bench=quick", "wandb.mode=disabled", "device=cpu", *overrides]))


def check_ok(rows, mode):
    assert rows, "no rows"
    for row in rows:
        assert validate(row) == [], validate(row)
        assert row["mode"] == mode and row["status"] == "ok", row["reason"]
        assert row["max_rel_err"] <= row["tolerance"] and row["seeds_checked"] == 2
        assert row["call_latency_us_p50"] > 0 and row["time_ms_p50"] > 0


# ---------------------------------------------------------------------------------------------
# The table, the requirements file and the make targets agree
# ---------------------------------------------------------------------------------------------
def test_every_peer_is_pinned_and_has_a_mode_config():
    from omegaconf import OmegaConf

    pins = (REPO_ROOT / "requirements-peers.txt").read_text().splitlines()
    functions = {"matmul", "linear", "softmax", "conv2d", "sdpa"}
    for name, peer in peers.PEERS.items():
        assert f"{peer.package}=={peer.version}" in [line.split()[0] for line in pins if line]
        assert set(peer.limits) <= functions and set(peer.direct_ops) <= set(peer.limits)
        mode = OmegaConf.load(REPO_ROOT / "conf" / "mode" / f"{name}.yaml")
        assert (mode.name, mode.kind, mode.ops) == (name, "peer", "all")


def test_make_peers_never_lets_pip_resolve_dependencies():
    def dry_run(*args):
        return subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=REPO_ROOT,
                              capture_output=True, text=True, check=True).stdout  # fmt: skip

    assert "pip install -q --no-deps -r requirements-peers.txt" in dry_run("peers", "PY=python")
    assert "requirements-peers.txt" not in dry_run("wheelhouse")  # the default stays as it was
    assert "--no-deps" in dry_run("wheelhouse", "PEERS=1").split("requirements-peers.txt")[1]


def test_peers_are_coloured_apart_from_the_other_modes():
    ours = {figures.mode_color(m) for m in figures.MODES}
    theirs = [figures.mode_color(m) for name in peers.PEERS for m in (name, name + "-direct")]
    assert len(set(theirs)) == len(theirs) and not ours & set(theirs)


# ---------------------------------------------------------------------------------------------
# What each library cannot run: skipped rows whose reason says so
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, reason",
    [
        (["kernel=matmul", "mode=liger"], "unsupported by liger-kernel 0.8.5: it has no matmul"),
        (["kernel=conv", "mode=quack"], "unsupported by quack-kernels 0.6.5: it has no conv2d"),
        (["kernel=attention", "mode=liger"], "it has no matmul kernel"),  # a block: every op
        (["kernel=softmax", "mode=liger", "kernel.dim=0"], "softmax over dim 0"),
        (["kernel=matmul", "mode=quack", "dtype=fp32"], "fp32 operands"),
        (["kernel=matmul", "mode=quack", "pass=fwd_bwd"], "has no backward registered"),
        (["kernel=attention", "mode=quack", "pass=fwd_bwd"], "matmul (in attention) with pass"),
        (["kernel=linear", "mode=quack", "pass=fwd_bwd"], "linear+gelu with pass=fwd_bwd"),
        (["kernel=mlp", "mode=quack", "pass=fwd_bwd"], "linear+activation (in mlp) with pass"),
        (["kernel=softmax", "mode=liger", "mode.kind=peer_direct", "mode.name=liger-direct",
          "pass=fwd_bwd"], "the direct kernel call is forward only"),
        (["kernel=matmul", "mode=flaggems", "mode.kind=peer_direct",
          "mode.name=flaggems-direct"], "no direct kernel call for matmul"),
    ],
)  # fmt: skip
def test_what_a_library_lacks_is_skipped_with_its_reason(compose_job, overrides, reason):
    rows = run(compose_job, *overrides)
    assert rows and {r["status"] for r in rows} == {"skipped"}
    assert all(reason in r["reason"] for r in rows), rows[0]["reason"]


@pytest.mark.parametrize("mode", ["flaggems", "quack"])
def test_gpu_only_peers_are_skipped_on_cpu_with_the_reason(compose_job, mode, caplog):
    rows = run(compose_job, "kernel=softmax", f"mode={mode}", "dtype=fp32")
    assert {r["status"] for r in rows} == {"skipped"}
    package = peers.PEERS[mode].package
    if peers.installed(peers.PEERS[mode].module):
        assert all(r["reason"].startswith(f"unavailable on cpu: {package} needs a CUDA GPU")
                   for r in rows)  # fmt: skip
    warnings = [r.message for r in caplog.records if r.name == "experiments.peers"]
    assert len(warnings) == 1 and f"mode={mode}" in warnings[0]


def test_a_missing_package_gives_skipped_rows_and_one_line(compose_job, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # as if it were not installed
    rows = run(compose_job, "kernel=softmax", "mode=liger", "dtype=fp32")
    assert {r["status"] for r in rows} == {"skipped"}
    assert all(r["reason"] == "unavailable: liger-kernel is not installed (`make peers`; "
               "docs/peers.md)" for r in rows)  # fmt: skip
    warnings = [r.message for r in caplog.records if r.name == "experiments.peers"]
    assert warnings == [f"mode=liger: {rows[0]['reason']}; its rows are skipped"]


def test_an_import_that_fails_gives_skipped_rows_with_its_error(compose_job, monkeypatch,
                                                                tmp_path):  # fmt: skip
    broken = tmp_path / "site" / "broken_peer"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise RuntimeError('No device were detected !\\nmore')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    peer = dataclasses.replace(peers.PEERS["liger"], module="broken_peer")
    monkeypatch.setitem(peers.PEERS, "liger", peer)
    rows = run(compose_job, "kernel=softmax", "mode=liger", "dtype=fp32")
    assert {r["reason"] for r in rows} == {
        "unavailable: liger-kernel cannot be imported: RuntimeError: No device were detected !"
    }


@pytest.mark.slow
def test_a_peer_mode_must_name_its_library(tmp_path):
    with pytest.raises(ConfigError, match="one of \\['flaggems-direct', 'liger-direct'"):
        peers.check(types.SimpleNamespace(name="liger", kind="peer_direct"))
    with pytest.raises(ConfigError, match="got 'triton'"):
        peers.check(types.SimpleNamespace(name="triton", kind="peer"))
    result = subprocess.run(
        [sys.executable, "-m", "experiments.run", "kernel=softmax", "mode=liger",
         "mode.name=liger2", "wandb.mode=disabled", f"hydra.run.dir={tmp_path}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        "error: mode.kind=peer needs mode.name to name a library: one of ['flaggems', 'liger', "
        "'quack'] (got 'liger2'; docs/peers.md)"
    ]


# ---------------------------------------------------------------------------------------------
# Liger-Kernel in the interpreter, through the real harness on the cpu shape sets
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides",
    [
        ["dtype=fp32"],
        pytest.param(["dtype=bf16"], marks=pytest.mark.slow),  # its forward upcasts: right here too
        pytest.param(["dtype=fp32", "pass=fwd_bwd"], marks=pytest.mark.slow),
        pytest.param(["dtype=fp16", "pass=fwd_bwd"], marks=pytest.mark.slow),
    ],
    ids=lambda o: "-".join(v.split("=")[1] for v in o),
)
def test_liger_softmax_runs_in_the_interpreter(compose_job, overrides):
    require("liger_kernel")
    check_ok(run(compose_job, "kernel=softmax", "mode=liger", *overrides), "liger")


def test_liger_direct_launches_its_kernel(compose_job):
    require("liger_kernel")
    rows = run(compose_job, "kernel=softmax", "mode=liger", "mode.kind=peer_direct",
               "mode.name=liger-direct", "dtype=fp32")  # fmt: skip
    check_ok(rows, "liger-direct")
    x = torch.randn(7, 1823)[:, 5:1500]  # a row-strided view: the call makes it contiguous
    direct = peers.PEERS["liger"].direct()["softmax"]
    torch.testing.assert_close(direct(x, -1), torch.softmax(x, -1))
    torch.testing.assert_close(direct(x.view(7, 1, -1).expand(7, 3, -1), -1),
                               torch.softmax(x, -1)[:, None].expand(7, 3, -1))  # fmt: skip


def test_liger_bf16_backward_is_not_run_in_the_interpreter(compose_job):
    require("liger_kernel")
    rows = run(compose_job, "kernel=softmax", "mode=liger", "dtype=bf16", "pass=fwd_bwd")
    assert {r["status"] for r in rows} == {"skipped"}
    assert "triton-lang/triton#10945" in rows[0]["reason"]


@pytest.mark.slow
@pytest.mark.integration
def test_liger_through_the_cli(tmp_path):
    require("liger_kernel")
    result = subprocess.run(
        ["make", "--no-print-directory", "experiment", f"PY={sys.executable}", "kernel=softmax",
         "mode=liger", "dtype=fp32",
         f"ARGS=bench=quick wandb.mode=disabled hydra.run.dir={tmp_path}/run"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "softmax-liger-fp32-fwd on cpu: 2 ok, 0 failed, 0 skipped" in result.stdout
    from experiments.records import read_jsonl

    check_ok(read_jsonl(tmp_path / "run" / "results.jsonl"), "liger")


# ---------------------------------------------------------------------------------------------
# FlagGems' and QuACK's adapters, with each library function replaced by its aten twin
# ---------------------------------------------------------------------------------------------
def aten_flag_gems() -> types.ModuleType:
    """flag_gems' op functions as the aten ops they implement (their registration names)."""
    aten = torch.ops.aten
    return types.SimpleNamespace(
        mm=aten.mm, bmm=aten.bmm, addmm=aten.addmm, sum_dim=aten.sum.dim_IntList,
        softmax=aten._softmax, softmax_backward=aten._softmax_backward_data,
        relu=aten.relu, gelu=aten.gelu, silu=aten.silu, threshold_backward=aten.threshold_backward,
        gelu_backward=aten.gelu_backward, silu_backward=aten.silu_backward,
        conv2d=lambda x, w, b, stride, padding, dilation, groups: aten.convolution(
            x, w, b, [stride] * 2, [padding] * 2, [dilation] * 2, False, [0, 0], groups),
        scaled_dot_product_attention=F.scaled_dot_product_attention,
    )  # fmt: skip


def aten_quack() -> types.ModuleType:
    """quack's softmax, gemm and linear functions as the torch ops they compute, with the
    shapes and activation names they take."""
    activations = {"relu": F.relu, "gelu_erf": F.gelu, "silu": F.silu,
                   "gelu_tanh_approx": lambda y: F.gelu(y, approximate="tanh")}  # fmt: skip

    def softmax(x):
        assert x.dim() == 2, "quack.softmax takes (M, N)"
        return torch.softmax(x, -1)

    def gemm(a, b, alpha=1.0):
        assert a.dim() == b.dim() and a.dim() in (2, 3), "gemm takes (M, K) or (L, M, K)"
        return torch.matmul(a, b) * alpha

    def linear_act_func(x, weight, activation, bias, store_preact):
        assert not store_preact
        return None, activations[activation](F.linear(x, weight, bias)).detach()  # postact

    return types.SimpleNamespace(softmax=softmax, gemm=gemm, linear_func=F.linear,
                                 linear_act_func=linear_act_func)  # fmt: skip


def stand_in(monkeypatch, name, functions):
    """`functions` installed as package `module` of peer `name`, which may run on a CPU."""
    peer = peers.PEERS[name]
    modules = {peer.module: functions}
    if name == "quack":
        modules |= {"quack.gemm_interface": functions, "quack.linear": functions}
    for module, namespace in modules.items():
        fake = types.ModuleType(module)
        fake.__dict__.update(vars(namespace))
        fake.__spec__ = importlib.machinery.ModuleSpec(module, None)
        monkeypatch.setitem(sys.modules, module, fake)
    monkeypatch.setitem(peers.PEERS, name, dataclasses.replace(peer, gpu_only=None))


@pytest.mark.parametrize(
    "overrides",
    # the fast suite: the blocks, which call every op's adapter (conv, matmul and softmax,
    # linear) on small shapes
    fast_subset([
        ["kernel=matmul"],
        ["kernel=linear", "kernel.activation=relu", "pass=fwd_bwd"],
        ["kernel=linear", "kernel.activation=gelu", "kernel.bias=false", "pass=fwd_bwd"],
        ["kernel=linear", "kernel.activation=gelu_tanh", "pass=fwd_bwd"],
        ["kernel=linear", "kernel.activation=silu"],
        ["kernel=softmax", "pass=fwd_bwd"],
        ["kernel=softmax", "kernel.dim=0", "pass=fwd_bwd"],
        ["kernel=conv", "kernel.activation=relu"],
        ["kernel=sdpa", "pass=fwd_bwd"],
        ["kernel=attention", "pass=fwd_bwd"],
        ["kernel=mlp", "pass=fwd_bwd"],
        ["kernel=bottleneck"],
    ], [["kernel=attention", "pass=fwd_bwd"], ["kernel=mlp", "pass=fwd_bwd"],
        ["kernel=bottleneck"]]),
    ids=lambda o: "-".join(v.split("=")[1] for v in o),
)
def test_the_flaggems_adapter_with_aten_twins(compose_job, monkeypatch, overrides):
    stand_in(monkeypatch, "flaggems", aten_flag_gems())
    check_ok(run(compose_job, "mode=flaggems", "dtype=fp32", *overrides), "flaggems")


@pytest.mark.parametrize(
    "overrides",
    fast_subset([
        ["kernel=matmul"],  # its cpu set holds a batched shape: (L, M, K) operands
        ["kernel=linear"],  # gelu: the fused-epilogue path, forward
        ["kernel=linear", "kernel.activation=none", "pass=fwd_bwd"],
        ["kernel=softmax", "pass=fwd_bwd"],
        # (batch, heads, ...) flattened to what it takes; the scale as the GEMM's alpha
        ["kernel=attention"],
        ["kernel=mlp"],
    ], [["kernel=attention"], ["kernel=mlp"]]),
    ids=lambda o: "-".join(v.split("=")[1] for v in o),
)
def test_the_quack_adapter_with_torch_twins(compose_job, monkeypatch, overrides):
    stand_in(monkeypatch, "quack", aten_quack())
    check_ok(run(compose_job, "mode=quack", "dtype=fp16", *overrides), "quack")
