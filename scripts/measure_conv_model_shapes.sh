#!/bin/bash
# One device call (at most 10 min) for the conv side of the model-shapes work (issue 62): the
# conv shape sets recorded from MobileNetV2 and ConvNeXt-T in the harness (triton vs eager,
# bias-free as the models call them), forward first, then whole-model training steps, then the
# sets' fwd_bwd with the time left; each step under `timeout`, so a cut-off step loses only its
# unfinished shapes. Carry .whl (the py3.12 wheels of `make wheelhouse`). Records come back as
# $OUT/records.tgz; the last lines are one row per record.
export PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-540}  # seconds this call may run
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
left() { echo $(( BUDGET - $(el) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 120 python3 -m pytest tests/test_kernels_conv.py tests/test_conv_backward.py -q -p no:cacheprovider -k "every_persistent_tile_on_gpu or few_channel or graphed_depthwise or depthwise_training" > $OUT/conv_tests.log 2>&1; echo "conv tests rc=$? $(el)s"; tail -2 $OUT/conv_tests.log
S="bench.repeats=2 bench.rep_ms=50 wandb.mode=disabled"
C="kernel=conv mode=triton kernel.bias=false dtype=bf16 $S"
timeout 130 python3 -m experiments.run --multirun $C pass=fwd shapes=mobilenet_v2 hydra.sweep.dir=/tmp/r/conv_fwd > $OUT/conv_fwd.log 2>&1; echo "conv fwd rc=$? $(el)s"
timeout $(( $(left) < 260 ? $(left) : 260 )) python3 -m experiments.run --multirun kernel=mobilenet_v2,convnext_tiny mode=triton pass=fwd_bwd $S hydra.sweep.dir=/tmp/r/models > $OUT/models.log 2>&1; echo "models rc=$? $(el)s"
[ $(left) -gt 30 ] && timeout $(left) python3 -m experiments.run --multirun $C pass=fwd_bwd shapes=convnext_tiny,mobilenet_v2 hydra.sweep.dir=/tmp/r/conv_fwd_bwd > $OUT/conv_fwd_bwd.log 2>&1; echo "conv fwd_bwd rc=$? $(el)s"
cd /tmp/r && find . -name results.jsonl -o -name env.json -o -name multirun.yaml | grep -v inductor_code | tar czf $OUT/records.tgz -T -
cat /tmp/r/*/*/results.jsonl | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['kernel'], r['pass'], r.get('shape_set'), r.get('shape_label'), r['status'], round(r.get('speedup_vs_eager') or 0, 3), (r.get('reason') or '')[:80])"
