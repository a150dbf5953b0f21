#!/bin/bash
# One device call (at most 10 min) for the under-filled-grid work (docs/kernels/matmul.md,
# "Split-K and stream-K on under-filled grids"): the split GEMM GPU tests, the forced (tile,
# decomposition) probe of the TMA GEMM on the models' GEMMs against cuBLAS, then the linear and
# matmul shape sets recorded from the models in the harness, forward and fwd_bwd, and whole-model
# training steps with the time left. Carry .whl (the py3.12 wheels of `make wheelhouse`:
# hydra-core, omegaconf, antlr4, ...). Records come back as $OUT/records.tgz, the probe as
# $OUT/gemm_probe.{txt,csv}.
export PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-585}  # seconds this call may run
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
timeout 70 python3 -m pytest tests/test_kernels_matmul.py -q -p no:cacheprovider -k "split_k_tma_on_gpu or paths_on_gpu" > $OUT/gemm_tests.log 2>&1; echo "gemm tests rc=$? $(el)s"; tail -3 $OUT/gemm_tests.log
timeout 200 python3 -m experiments.gemm_probe --shapes convnext_tiny,vit_b_16,llama --gemm 1568,512,4608 --gemm 6272,128,1152 --gemm 512,512,512 --gemm 6272,256,2304 --gemm 6272,256,1024 --conv resnet50 --splits 1,2,3,4 --csv $OUT/gemm_probe.csv > $OUT/gemm_probe.txt 2>&1; echo "probe rc=$? $(el)s"
S="bench.repeats=2 bench.rep_ms=50 wandb.mode=disabled"
timeout 120 python3 -m experiments.run --multirun kernel=linear mode=triton kernel.activation=none pass=fwd,fwd_bwd dtype=bf16 shapes=convnext_tiny,vit_b_16,llama $S hydra.sweep.dir=/tmp/r/linear > $OUT/linear.log 2>&1; echo "linear rc=$? $(el)s"
timeout 50 python3 -m experiments.run --multirun kernel=matmul mode=triton pass=fwd,fwd_bwd dtype=bf16 shapes=llama $S hydra.sweep.dir=/tmp/r/matmul > $OUT/matmul.log 2>&1; echo "matmul rc=$? $(el)s"
[ $(el) -lt 420 ] && timeout $(( BUDGET - $(el) )) python3 -m experiments.run --multirun kernel=convnext_tiny,vit_b_16 mode=triton pass=fwd_bwd $S hydra.sweep.dir=/tmp/r/models > $OUT/models.log 2>&1; echo "models rc=$? $(el)s"
cd /tmp/r && find . -name results.jsonl -o -name env.json -o -name multirun.yaml | grep -v inductor_code | tar czf $OUT/records.tgz -T -
cat /tmp/r/*/*/results.jsonl | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['kernel'], r['pass'], r.get('shape_set'), r.get('shape_label'), r['status'], round(r.get('speedup_vs_eager') or 0, 3), (r.get('reason') or '')[:80])"
