#!/usr/bin/env bash
# H100: the softmax `small` grid only (launch-bound sizes), at HEAD.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 KBENCH_GIT_SHA=$(cat .device/head.sha)
rm -rf /tmp/r && mkdir -p /tmp/r && tar xzf .device/head.tgz -C /tmp/r && cd /tmp/r
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
t0=$(date +%s)
make bench PY=python3 kernel=softmax BENCH_DIR=$OUT/softmax_small ARGS="bench.rep_ms=50 bench.warmup_ms=10 bench.cudagraph_replay=false" BENCH_softmax='"kernel=softmax mode=eager,triton,default,reduce-overhead shapes=small"' > $OUT/softmax_small.log 2>&1
echo "rc=$? t=$(( $(date +%s)-t0 ))"
cat $OUT/softmax_small/targets.txt
rm -rf $(find $OUT -type d -name inductor_code) 2>/dev/null; true
