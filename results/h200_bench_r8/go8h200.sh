source /tmp/b/env.sh; cd /tmp/r
A="bench.rep_ms=50 bench.warmup_ms=10 bench.cudagraph_replay=false"
bench() { local k=$1; shift; local t0=$(date +%s)
  make bench PY=python3 kernel=$k BENCH_DIR=/tmp/b/$k "$@" > /tmp/b/$k.log 2>&1
  echo "BENCH_DONE $k rc=$? wall_s=$(( $(date +%s)-t0 ))" >> /tmp/b/done.log; }
bench matmul ARGS="$A"
bench softmax ARGS="$A"
bench linear ARGS="$A dtype=bf16"
t0=$(date +%s)
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_kernels_matmul.py tests/test_kernels_softmax.py > /tmp/b/gputests.log 2>&1
echo "GPUTESTS_DONE rc=$? wall_s=$(( $(date +%s)-t0 ))" >> /tmp/b/done.log
echo "ALL_DONE" >> /tmp/b/done.log
