"""A failing shape is a recorded row, W&B never holds the only copy, and no key leaks."""

import json
import os

import pytest
import torch

from experiments import measure, registry, run
from experiments.records import read_jsonl, validate
from experiments.tracking import Tracker, redact

CPU_OVERRIDES = ["bench=quick", "dtype=fp32"]
# The interpreter takes a good part of a second a softmax call: where a test checks what a row
# says rather than its timing, the fewest calls the bench config allows.
FEWEST_CALLS = ["bench.latency_calls=1", "bench.repeats=1", "bench.min_warmup_calls=1",
                "+kernel.shape_sets.tuned=[{m: 37, n: 100}, {m: 2, n: 4097}]", "shapes=tuned"]


def run_job(compose_job, *overrides):
    cfg = compose_job([*CPU_OVERRIDES, *overrides])
    rows = run.run(cfg)
    output_dir = run.job_identity()[0]
    assert rows == read_jsonl(output_dir / "results.jsonl")
    return rows, output_dir


@pytest.mark.slow
def test_one_failing_shape_leaves_a_failed_row_and_the_rest(compose_job, monkeypatch):
    real = measure._measure

    def flaky(job, shape, index, record, progress):
        if shape["m"] == 33:  # the second cpu shape
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        return real(job, shape, index, record, progress)

    monkeypatch.setattr(measure, "_measure", flaky)
    rows, _ = run_job(compose_job, "kernel=matmul", "mode=eager", "wandb.mode=disabled")
    statuses = [r["status"] for r in rows]  # the shapes after the failed one still run
    assert statuses[1] == "failed" and statuses[:1] + statuses[2:] == ["ok"] * (len(rows) - 1)
    assert len(rows) >= 3
    assert rows[1]["reason"].startswith("OutOfMemoryError: CUDA out of memory")
    assert rows[1]["stage"] is not None and rows[1]["time_ms_p50"] is None
    assert all(validate(r) == [] for r in rows)


def test_a_wrong_kernel_fails_correctness_and_is_not_timed(compose_job, monkeypatch):
    wrong = registry.triton_ops()
    wrong.matmul = lambda a, b: torch.matmul(a, b) * 1.01  # 1% off: far over the fp32 budget
    monkeypatch.setattr(registry, "triton_ops", lambda: wrong)
    monkeypatch.setattr("experiments.modes.triton_ops", lambda: wrong)
    rows, _ = run_job(compose_job, "kernel=matmul", "mode=triton", "wandb.mode=disabled")
    for row in rows:
        assert row["status"] == "failed" and row["stage"] == "correctness"
        assert "relative error" in row["reason"] and row["max_rel_err"] == pytest.approx(0.01, 1e-3)
        assert row["time_ms_p50"] is None and row["speedup_vs_eager"] is None


def test_nan_output_is_caught(compose_job, monkeypatch):
    broken = registry.triton_ops()
    broken.softmax = lambda x, dim: torch.full_like(x, float("nan"))
    monkeypatch.setattr("experiments.modes.triton_ops", lambda: broken)
    rows, _ = run_job(compose_job, "kernel=softmax", "mode=triton", "wandb.mode=disabled")
    assert all("NaN" in row["reason"] for row in rows)


@pytest.mark.slow
def test_offline_wandb_writes_a_run_without_network_and_no_key(compose_job, monkeypatch):
    secret = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there
    rows, output_dir = run_job(compose_job, "kernel=softmax", "mode=eager", "wandb.mode=offline")
    assert [r["status"] for r in rows] == ["ok", "ok"]
    runs = list((output_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    for path in output_dir.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_wandb_failure_keeps_the_records(compose_job, monkeypatch):
    import wandb

    def unreachable(*args, **kwargs):
        raise wandb.errors.CommError("could not reach the W&B server")

    monkeypatch.setattr(wandb, "init", unreachable)
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)  # online needs a key; init never sends it
    rows, output_dir = run_job(compose_job, "kernel=softmax", "mode=eager", "wandb.mode=online")
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert json.loads((output_dir / "env.json").read_text())["config"]["wandb"]["mode"] == "online"


def test_disabled_tracker_does_nothing(tmp_path):
    tracker = Tracker({"mode": "disabled", "project": "p"}, {}, tmp_path, "n", "g", [])
    tracker.log_row({"shape_label": "1x1", "status": "ok"}, 0)
    tracker.finish([], {}, None)
    assert not (tmp_path / "wandb").exists()


def test_redact_masks_keys_overrides_and_the_env_key(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "abcdef123456")
    tree = {
        "wandb": {"api_key": "x", "project": "p"},
        "argv": ["+wandb.api_key=x", "kernel=m"],
        "note": "key abcdef123456 leaked",
    }
    assert redact(tree) == {
        "wandb": {"api_key": "<redacted>", "project": "p"},
        "argv": ["+wandb.api_key=<redacted>", "kernel=m"],
        "note": "key <redacted> leaked",
    }
    assert os.environ["WANDB_API_KEY"] == "abcdef123456"


@pytest.mark.parametrize(
    "value", ["1", "1e3", "null", "true", "it's", "a\\b", "2026-11-22/10-00-00"]
)
def test_worker_passes_the_wandb_group_as_a_string(value):
    """A sweep folder named "1" once reached wandb.init as the int 1, which wandb refused."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from experiments.tracking import run_group
    from experiments.worker import quoted

    override = OverridesParser.create().parse_override(f"wandb.group={quoted(value)}")
    assert override.value() == value
    assert run_group(None, 1, "name") == "1" and run_group(None, None, "name") == "name"


def test_a_gradient_the_mode_never_made_is_named_as_the_cause():
    """FlagGems' bottleneck fwd_bwd on the H100 left a parameter without a gradient, and the row
    said only "'NoneType' object has no attribute 'detach'"; the row now says what happened."""
    x = torch.randn(3, 4, requires_grad=True)
    weight = torch.randn(4, 4, requires_grad=True)

    def step():  # a forward whose op records history for x but not for weight
        for t in (x, weight):
            t.grad = None
        out = x @ weight.detach()
        out.backward(torch.ones_like(out))
        return out

    with pytest.raises(RuntimeError, match=r"no gradient on 1 of the 2 tensors .* indices \[1\]"):
        measure.outputs_of(step, [x], [weight], fwd_bwd=True)
    weight.requires_grad_(False)
    assert len(measure.outputs_of(step, [x], [], fwd_bwd=True)) == 2  # output and x's gradient


def test_a_dead_workers_row_keeps_its_last_error_line():
    """A worker that exits outside every shape's handler (exit code 1 in the H100 study) left a
    row without a cause; now the row quotes the last error line the worker printed."""
    from experiments.worker import last_error

    traceback = ["Traceback (most recent call last):\n", '  File "m.py", line 3, in f\n',
                 "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised: boom\n",
                 "\n", "Set the environment variable HYDRA_FULL_ERROR=1 for a stack trace.\n",
                 "[2026-11-26 21:27:52,212][submitit][INFO] - Job completed\n"]  # fmt: skip
    assert last_error(traceback) == (
        "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised: boom")
    assert last_error(["error: kernel=nope is not registered\n"]).startswith("error: kernel=nope")
    assert last_error(["KeyboardInterrupt\n"]) == "KeyboardInterrupt"
    assert last_error(["all shapes measured\n", "Traceback (most recent call last):\n"]) is None


@pytest.mark.slow
def test_a_row_notes_the_config_its_first_call_chose(compose_job, monkeypatch):
    """softmax's first call on a GPU picks its short-row tile (and its row loop) by timing
    candidates; the row's notes name the choice, and each row chooses afresh (the
    cache is reset as torch.compile's is). Here the timer is a stand-in and the interpreter
    runs the kernels."""
    import importlib

    softmax_module = importlib.import_module("kernels.softmax.dispatch")
    monkeypatch.setattr(softmax_module, "_tunable", lambda launch, device: True)
    monkeypatch.setattr(softmax_module, "TUNE_MIN_BYTES", 0)  # the cpu shapes are small
    monkeypatch.setattr(softmax_module, "TUNE_ROUNDS", 1)  # the stand-in timer is exact

    def timer(fn):  # no call: _tuned_config has already run every candidate once, to warm up
        return 1.0 / fn.args[0].num_warps  # more warps, faster: a non-pick candidate wins

    monkeypatch.setattr(softmax_module, "_time_candidate", timer)
    for _ in range(2):  # the second job in this process chooses again and says so again
        rows, output_dir = run_job(compose_job, "kernel=softmax", "mode=triton",
                                   "wandb.mode=disabled", *FEWEST_CALLS)
        (output_dir / "results.jsonl").unlink()
        assert [r["status"] for r in rows] == ["ok", "ok"]
        (note,) = [n for n in rows[0]["notes"] if n.startswith("softmax forward")]
        assert note.startswith("softmax forward float32 37 x 100: chose tile ")
        # N = 4097 takes the row loop, which the first call times too
        (note,) = [n for n in rows[1]["notes"] if n.startswith("softmax forward")]
        assert note.startswith("softmax forward float32 ") and " x 4097: chose online " in note
