source /tmp/b/env.sh; cd /tmp/r
t0=$(date +%s)
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels_matmul.py tests/test_kernels_linear.py tests/test_kernels_softmax.py tests/test_kernels_conv.py tests/test_gpu_pipeline.py > /tmp/b/gputests.log 2>&1
echo "GPUTESTS_DONE rc=$? wall_s=$(( $(date +%s)-t0 ))" >> /tmp/b/done.log
A="bench.rep_ms=50 bench.warmup_ms=10 bench.cudagraph_replay=false"
bench() { local k=$1; shift; local t0=$(date +%s)
  make bench PY=python3 kernel=$k BENCH_DIR=/tmp/b/$k "$@" > /tmp/b/$k.log 2>&1
  echo "BENCH_DONE $k rc=$? wall_s=$(( $(date +%s)-t0 ))" >> /tmp/b/done.log; }
bench matmul ARGS="$A"
bench softmax ARGS="$A"
bench conv ARGS="$A" BENCH_conv='"kernel=conv mode=triton kernel.bias=true,false shapes=resnet50" "kernel=conv kernel.activation=relu mode=triton,default,max-autotune-no-cudagraphs shapes=resnet50_core"'
bench linear ARGS="$A dtype=bf16"
echo "ALL_DONE" >> /tmp/b/done.log
