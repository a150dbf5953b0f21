#!/bin/bash
# One device call (at most 10 min) for the under-filled-grid work (docs/kernels/matmul.md,
# "Split-K on under-filled grids"): the GEMM GPU tests, the forced (tile, split) probe of the
# TMA GEMM on the models' linear GEMMs against cuBLAS, then the conv shape sets recorded from the
# models, forward, in the harness. Carry .whl (the py3.12 wheels of `make wheelhouse`: hydra-core,
# omegaconf, antlr4, ...). Records come back as $OUT/records.tgz, the probe as $OUT/gemm_probe.*.
export PYTHONUNBUFFERED=1
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
timeout 150 python3 -m pytest tests/test_kernels_matmul.py tests/test_kernels_linear.py -q -p no:cacheprovider -x -k "gpu or split" > $OUT/gemm_tests.log 2>&1; echo "gemm tests rc=$? $(el)s"; tail -3 $OUT/gemm_tests.log
timeout 280 python3 -m experiments.gemm_probe --shapes convnext_tiny,vit_b_16,llama --gemm 1568,512,4608 --gemm 6272,128,1152 --gemm 512,512,512 --gemm 6272,256,2304 --gemm 6272,256,1024 --conv resnet50,mobilenet_v2 --splits 1,2,3,4 --csv $OUT/gemm_probe.csv > $OUT/gemm_probe.txt 2>&1; echo "probe rc=$? $(el)s"
S="bench.repeats=2 bench.rep_ms=50 wandb.mode=disabled"
timeout $(( 585 - $(el) )) python3 -m experiments.run --multirun kernel=conv mode=triton kernel.bias=false pass=fwd shapes=resnet50,mobilenet_v2,convnext_tiny $S hydra.sweep.dir=/tmp/r/conv_fwd > $OUT/conv_fwd.log 2>&1; echo "conv fwd rc=$? $(el)s"
cd /tmp/r && find . -name results.jsonl -o -name env.json -o -name multirun.yaml | grep -v inductor_code | tar czf $OUT/records.tgz -T -
cut -c1-150 $OUT/gemm_probe.txt | head -80
