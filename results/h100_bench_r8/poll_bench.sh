#!/usr/bin/env bash
limit=${1:-540}; start=$(date +%s)
while [ $(( $(date +%s) - start )) -lt $limit ]; do
  grep -q ALL_DONE /tmp/b/done.log 2>/dev/null && break
  sleep 10
done
cat /tmp/b/done.log 2>/dev/null
(cd /tmp/b && tar czf $OUT/bench.tgz --exclude='inductor_code' --exclude='.submitit' . 2>/dev/null)
for k in matmul linear softmax conv; do [ -f /tmp/b/$k/targets.txt ] && { echo "== $k"; grep -E "PASS|MISS" /tmp/b/$k/targets.txt; }; done
tail -3 /tmp/b/gputests.log 2>/dev/null
for f in /tmp/b/*.log; do echo "-- $f"; tail -2 $f; done
echo "wandb offline runs: $(find /tmp/b -maxdepth 6 -type d -name "offline-run-*" | wc -l)"
