# usage (detached): KERNELS="..." TAG=x R=/tmp/r ENVF=/tmp/b/env.sh bash go4.sh
source ${ENVF:-/tmp/b/env.sh}; cd ${R:-/tmp/r}
A="bench.rep_ms=50 bench.warmup_ms=10 bench.cudagraph_replay=false"
bench() { local k=$1; shift; local t0=$(date +%s)
  make bench PY=python3 kernel=$k BENCH_DIR=/tmp/b/$k "$@" > /tmp/b/$k.log 2>&1
  echo "BENCH_DONE $k rc=$? wall_s=$(( $(date +%s)-t0 )) sha=$KBENCH_GIT_SHA" >> /tmp/b/done.log; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader >> /tmp/b/done.log
for k in ${KERNELS:-matmul linear conv}; do bench $k ARGS="$A"; done
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader >> /tmp/b/done.log
if [ -n "$TESTS" ]; then t0=$(date +%s)
  timeout ${TT:-420} python3 -m pytest -m gpu -q -p no:cacheprovider --durations=15 tests/test_kernels_matmul.py tests/test_kernels_linear.py tests/test_kernels_softmax.py tests/test_kernels_conv.py tests/test_gpu_pipeline.py > /tmp/b/gputests.log 2>&1
  echo "GPUTESTS_DONE rc=$? wall_s=$(( $(date +%s)-t0 ))" >> /tmp/b/done.log; fi
echo "ALL_DONE_${TAG:-1}" >> /tmp/b/done.log
