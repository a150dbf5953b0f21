# H100: linear bf16 bench (the make bench grids at dtype=bf16), then linear's GPU tests.
source ${ENVF:-/tmp/b/env.sh}; cd ${R:-/tmp/r}
A="bench.rep_ms=50 bench.warmup_ms=10 bench.cudagraph_replay=false dtype=bf16"
t0=$(date +%s)
make bench PY=python3 kernel=linear BENCH_DIR=/tmp/b/linear ARGS="$A" > /tmp/b/linear.log 2>&1
echo "BENCH_DONE linear rc=$? wall_s=$(( $(date +%s)-t0 )) sha=$KBENCH_GIT_SHA" >> /tmp/b/done.log
t0=$(date +%s)
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels_linear.py tests/test_kernels_matmul.py > /tmp/b/gputests.log 2>&1
echo "GPUTESTS_DONE rc=$? wall_s=$(( $(date +%s)-t0 ))" >> /tmp/b/done.log
echo "ALL_DONE_1" >> /tmp/b/done.log
