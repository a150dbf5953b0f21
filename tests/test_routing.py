"""kernels.enable(): a model's own torch calls routed to our kernels, forward and backward,
checked against float64, with the calls it cannot take left to torch and counted."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kernels
from kernels import routing
from tests.conftest import DEVICE

ROUTED_ATTRIBUTES = [(route.owner, route.attribute) for route in routing.ROUTES]


class EveryRoute(nn.Module):
    """One call of each routed function, as models write them: nn.Conv2d (plain, strided,
    depthwise), nn.Linear on a 4-D input, torch.matmul, `@`, bmm, addmm and softmax in its
    three spellings, mm, one softmax with dtype=float32 as Llama's attention calls it, and
    scaled_dot_product_attention on transposed head views."""

    def __init__(self, c=6):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.depthwise = nn.Conv2d(c, c, 3, stride=2, padding=1, groups=c, bias=False)
        self.proj = nn.Linear(c, 32)
        self.head = nn.Parameter(torch.randn(32, 7) / 6)
        self.bias = nn.Parameter(torch.randn(7))
        self.mix = nn.Parameter(torch.randn(7, 7) / 3)

    def forward(self, x):
        y = F.relu(self.depthwise(self.conv(x)))  # (n, c, 4, 4)
        t = self.proj(y.permute(0, 2, 3, 1))  # (n, 4, 4, 32): a non-contiguous linear input
        t = t.flatten(1, 2)  # (n, 16, 32)
        heads = t.unflatten(-1, (2, 16)).transpose(1, 2)  # (n, 2, 16, 16): transposed views
        t = F.scaled_dot_product_attention(heads, heads, heads, is_causal=True)
        t = t.transpose(1, 2).flatten(2)
        scores = torch.matmul(t, t.transpose(1, 2)) / 4  # (n, 16, 16)
        p = F.softmax(scores, dim=-1, dtype=torch.float32).to(t.dtype)
        t = torch.bmm(p, t).softmax(-1) @ self.head  # (n, 16, 7)
        rows = torch.mm(torch.addmm(self.bias, t.reshape(-1, 7), self.mix), self.mix.t())
        return torch.softmax(rows, -1)


def _model(dtype, seed=0):
    torch.manual_seed(seed)
    return EveryRoute().to(DEVICE, dtype)


def _inputs(dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, 8, 8, generator=g).to(DEVICE, dtype)


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture(autouse=True)
def _routing_off():
    routing.reset_counts()
    yield
    kernels.disable()
    routing.reset_counts()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_every_route_matches_float64_forward_and_backward(dtype):
    model, x = _model(dtype), _inputs(dtype)
    reference = _model(torch.float64)
    with kernels.enabled():
        out = model(x)
        out.square().sum().backward()
    ref_out = reference(x.double())
    ref_out.square().sum().backward()
    budget = 1e-4 if dtype == torch.float32 else 3e-2  # bf16: every intermediate rounds
    assert _rel(out, ref_out) < budget
    for (name, p), ref in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert p.grad is not None, name
        assert _rel(p.grad, ref.grad) < 2 * budget, name
    taken = routing.counts()
    for op in routing.OPS:
        assert taken[op] == {routing.OURS: taken[op][routing.OURS]} and taken[op][routing.OURS]
    assert taken["softmax"][routing.OURS] == 3 and taken["conv2d"][routing.OURS] == 2


def test_the_routes_go_back_to_torch_exactly():
    before = [(owner, attribute, owner.__dict__.get(attribute)) for owner, attribute
              in ROUTED_ATTRIBUTES]  # fmt: skip
    kernels.enable()
    assert all(getattr(owner, attribute).__name__.startswith("routed_")
               for owner, attribute in ROUTED_ATTRIBUTES)  # fmt: skip
    kernels.enable(ops=["softmax"])  # a second enable replaces the first
    assert torch.matmul is before[3][2] and F.softmax.__name__ == "routed_softmax"
    kernels.disable()
    kernels.disable()  # twice is harmless
    for owner, attribute, value in before:
        assert owner.__dict__.get(attribute) is value, attribute
    assert "__matmul__" not in torch.Tensor.__dict__  # TensorBase's own method again


def test_contexts_nest_and_restore_what_was_there():
    original = F.linear
    with kernels.enabled(ops=["linear"]):
        outer = F.linear
        with kernels.enabled(custom_ops=True):
            assert F.linear is not outer and torch.matmul.__name__ == "routed_matmul"
        assert F.linear is outer and torch.matmul.__name__ != "routed_matmul"
        assert routing.is_enabled()
    assert F.linear is original and not routing.is_enabled()
    with kernels.enabled():
        kernels.disable()  # inside the block: the block's exit has nothing left to undo
        assert F.linear is original
    assert F.linear is original


def test_what_ours_cannot_take_falls_back_with_its_reason_counted():
    with kernels.enabled():
        a = torch.randn(4, 5, dtype=torch.float64)
        torch.testing.assert_close(torch.matmul(a, a.t()), a @ a.t())
        x = torch.randn(2, 4, 6, 6, requires_grad=True)
        w = torch.randn(4, 2, 3, 3, requires_grad=True)  # groups=2 of 4 channels, training
        F.conv2d(x, w, groups=2).sum().backward()
        torch.softmax(torch.randn(3, 4), 1, dtype=torch.float64)
        torch.addmm(torch.randn(3, 3), torch.randn(3, 2), torch.randn(2, 3))
        q = torch.randn(1, 2, 5, 16)
        F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(5, 5, dtype=torch.bool))
    taken = routing.counts()
    assert taken["matmul"] == {"dtype float64": 2}
    assert taken["conv2d"] == {"grouped conv (1 < groups < C) in training: no Triton backward": 1}
    assert taken["softmax"] == {"softmax to dtype float64": 1}
    assert taken["addmm"] == {"addmm whose input is not a bias row": 1}
    assert list(taken["sdpa"].values()) == [1] and "mask" in next(iter(taken["sdpa"]))
    assert x.grad is not None and w.grad is not None
    assert routing.fallback_share(taken) == 1.0


def test_a_meta_tensor_is_left_to_torch():
    a = torch.empty(4, 4, device="meta")
    with kernels.enabled():
        assert torch.mm(a, a).device.type == "meta"
    assert routing.counts()["mm"] == {"meta tensor": 1}


def test_record_lists_every_call_with_its_shapes_and_arguments():
    calls = []
    model, x = _model(torch.float32), _inputs(torch.float32)
    with torch.no_grad(), kernels.enabled(record=calls):
        model(x)
    ops = [c["op"] for c in calls]
    assert ops == ["conv2d", "conv2d", "linear", "sdpa", "matmul", "softmax", "bmm", "softmax",
                   "matmul", "addmm", "mm", "softmax"]  # fmt: skip
    depthwise = calls[1]
    assert depthwise["groups"] == 6 and depthwise["stride"] == (2, 2)
    assert depthwise["x"] == [2, 6, 8, 8] and depthwise["dtype"] == "float32"
    assert calls[2]["layout"].startswith("strides") and calls[5]["dtype_to"] == "float32"
    assert calls[3]["causal"] and calls[3]["q"] == [2, 2, 16, 16]
    assert all(c["routed"] and c["reason"] is None and c["grad"] is False for c in calls)


def test_unknown_ops_are_refused_before_anything_is_patched():
    with pytest.raises(ValueError, match=r"unknown ops \['attention2'\]"):
        kernels.enable(ops=["attention2"])
    with pytest.raises(ValueError, match="unknown ops"):
        with kernels.enabled(exclude=["nope"]):
            pass
    assert not routing.is_enabled()


@pytest.mark.slow
def test_custom_ops_compile_into_one_graph_of_the_model():
    """custom_ops=True: torch.compile traces the routed functions into our custom ops, with no
    graph break (Inductor's CPU backend here), and matches float64 forward and backward."""
    model, x = _model(torch.float32), _inputs(torch.float32)
    reference = _model(torch.float64)
    compiled = torch.compile(model, fullgraph=True)
    with kernels.enabled(custom_ops=True):
        out = compiled(x)
        out.square().sum().backward()
    ref_out = reference(x.double())
    ref_out.square().sum().backward()
    assert _rel(out, ref_out) < 1e-4
    for p, ref in zip(model.parameters(), reference.parameters(), strict=True):
        assert _rel(p.grad, ref.grad) < 2e-4
