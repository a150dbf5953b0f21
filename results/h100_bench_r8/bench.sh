#!/usr/bin/env bash
# Final benchmarks: `make bench` per kernel (detached; survives the call), then the GPU tests.
# usage: bash .device/bench.sh    then    bash .device/poll_bench.sh <seconds>
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
ROOT=$(pwd)
rm -rf /tmp/r /tmp/b && mkdir -p /tmp/r /tmp/b && tar xzf .device/head.tgz -C /tmp/r
echo "export PYTHONPATH=/tmp/site KBENCH_GIT_SHA=$(cat .device/head.sha) PYTHONUNBUFFERED=1" > /tmp/b/env.sh
source /tmp/b/env.sh; cd /tmp/r
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
cp "$ROOT/.device/${1:-go.sh}" /tmp/b/go.sh
TESTS="$TESTS" TESTFILES="$TESTFILES" KERNELS="$KERNELS" TAG=1 setsid nohup bash /tmp/b/go.sh > /tmp/b/go.out 2>&1 < /dev/null &
sleep 2; echo started
