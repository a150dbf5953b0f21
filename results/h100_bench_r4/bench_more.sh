#!/usr/bin/env bash
# Second stage on the same machine: wait for stage 1 (ALL_DONE_1), then bench KERNELS from the
# new .device/head.tgz in /tmp/r2 (detached). usage: KERNELS="matmul linear" bash .device/bench_more.sh
ROOT=$(pwd)
rm -rf /tmp/r2 && mkdir -p /tmp/r2 && tar xzf .device/head.tgz -C /tmp/r2
echo "export PYTHONPATH=/tmp/site KBENCH_GIT_SHA=$(cat .device/head.sha) PYTHONUNBUFFERED=1" > /tmp/b/env2.sh
cp "$ROOT/.device/go4.sh" /tmp/b/go4.sh
cat > /tmp/b/stage2.sh <<EOS
while ! grep -q ALL_DONE_1 /tmp/b/done.log 2>/dev/null; do sleep 5; done
TESTS="$TESTS" KERNELS="$KERNELS" TAG=2 R=/tmp/r2 ENVF=/tmp/b/env2.sh bash /tmp/b/go4.sh
EOS
setsid nohup bash /tmp/b/stage2.sh > /tmp/b/stage2.out 2>&1 < /dev/null &
sleep 1; echo "stage 2 queued: $KERNELS at $(cat .device/head.sha)"; cat /tmp/b/done.log 2>/dev/null
