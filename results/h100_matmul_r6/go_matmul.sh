# H100: matmul make bench, then matmul's and linear's GPU tests.
source ${ENVF:-/tmp/b/env.sh}; cd ${R:-/tmp/r}
A="bench.rep_ms=50 bench.warmup_ms=10 bench.cudagraph_replay=false"
t0=$(date +%s)
make bench PY=python3 kernel=matmul BENCH_DIR=/tmp/b/matmul ARGS="$A" > /tmp/b/matmul.log 2>&1
echo "BENCH_DONE matmul rc=$? wall_s=$(( $(date +%s)-t0 )) sha=$KBENCH_GIT_SHA" >> /tmp/b/done.log
t0=$(date +%s)
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels_matmul.py tests/test_kernels_linear.py > /tmp/b/gputests.log 2>&1
echo "GPUTESTS_DONE rc=$? wall_s=$(( $(date +%s)-t0 ))" >> /tmp/b/done.log
echo "ALL_DONE_1" >> /tmp/b/done.log
