source /tmp/b/env.sh; cd /tmp/r
A="bench.rep_ms=50 bench.warmup_ms=10 bench.cudagraph_replay=false"
bench() { local k=$1; shift; local t0=$(date +%s)
  make bench PY=python3 kernel=$k BENCH_DIR=/tmp/b/$k "$@" > /tmp/b/$k.log 2>&1
  echo "BENCH_DONE $k rc=$? wall_s=$(( $(date +%s)-t0 ))" >> /tmp/b/done.log; }
bench matmul ARGS="$A"
bench linear ARGS="$A${LINEAR_DTYPE:+ dtype=$LINEAR_DTYPE}"
bench softmax ARGS="$A"
echo "ALL_DONE" >> /tmp/b/done.log
