source /tmp/b/env.sh; cd /tmp/r
A="bench.rep_ms=50 bench.warmup_ms=10 bench.cudagraph_replay=false"
t0=$(date +%s)
make bench PY=python3 kernel=softmax BENCH_DIR=/tmp/b/softmax ARGS="$A" > /tmp/b/softmax.log 2>&1
echo "BENCH_DONE softmax rc=$? wall_s=$(( $(date +%s)-t0 ))" >> /tmp/b/done.log
echo "ALL_DONE" >> /tmp/b/done.log
