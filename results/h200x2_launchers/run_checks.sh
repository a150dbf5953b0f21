#!/usr/bin/env bash
# Issue 7 GPU checks on a 2-GPU host, from a clean copy of HEAD (.device/head.tgz).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site KBENCH_GIT_SHA=$(cat .device/head.sha) PYTHONUNBUFFERED=1
rm -rf /tmp/r /tmp/w && mkdir -p /tmp/r /tmp/w && tar xzf .device/head.tgz -C /tmp/r && cd /tmp/r
nvidia-smi -L; which flock
GRID="kernel=matmul,softmax,linear mode=eager,triton"
run() { local name=$1; shift; local t0=$(date +%s); "$@" > /tmp/w/$name.log 2>&1; echo "$name rc=$? wall_s=$(( $(date +%s)-t0 ))" | tee -a /tmp/w/walls.txt; }
run gpus make sweep PY=python3 $GRID ARGS="bench=quick launcher=gpus hydra.sweep.dir=/tmp/w/gpus"
run local env CUDA_VISIBLE_DEVICES=0 make sweep PY=python3 $GRID ARGS="bench=quick hydra.sweep.dir=/tmp/w/local"
run fault env CUDA_VISIBLE_DEVICES=0 make sweep PY=python3 kernel=softmax,matmul mode=eager,triton ARGS="fault.kind=null,illegal_address shapes=small bench=quick hydra.sweep.dir=/tmp/w/fault"
grep -h "launcher=gpus" /tmp/w/gpus/.submitit/*/*.out /tmp/w/gpus/.submitit/*/*.err 2>/dev/null | head -8
python3 - <<'PY'
import json, glob, os, collections
def rows(d):
    out = {}
    for f in glob.glob(f"/tmp/w/{d}/**/results.jsonl", recursive=True):
        if os.path.dirname(f) == f"/tmp/w/{d}": continue  # the merged file
        for line in open(f):
            r = json.loads(line); out[(r["kernel"], r["mode"], r["shape_label"])] = r
    return out
for d in ("gpus", "local"):
    for f in sorted(glob.glob(f"/tmp/w/{d}/*/env.json")):
        e = json.load(open(f)); flat = {}
        def walk(x, p=""):
            if isinstance(x, dict):
                for k, v in x.items(): walk(v, f"{p}.{k}" if p else k)
            else: flat[p] = x
        walk(e)
        print(d, os.path.basename(os.path.dirname(f)), {k: v for k, v in flat.items() if any(s in k.lower() for s in ("uuid", "visible", "launcher", "gpu_name"))})
a, b = rows("gpus"), rows("local")
print(f"{'kernel':8} {'mode':7} {'shape':22} {'gpus_ms':>9} {'local_ms':>9} {'ratio':>6}")
rs = []
for k in sorted(set(a) & set(b)):
    x, y = a[k].get("time_ms_p50"), b[k].get("time_ms_p50")
    if x and y:
        rs.append(x / y); print(f"{k[0]:8} {k[1]:7} {k[2][:22]:22} {x:9.4f} {y:9.4f} {x/y:6.3f}")
import statistics
if rs: print("rows", len(rs), "median ratio", statistics.median(rs), "min", min(rs), "max", max(rs))
for f in sorted(glob.glob("/tmp/w/fault/*/results.jsonl")):
    rr = [json.loads(l) for l in open(f)]
    print("fault", os.path.basename(os.path.dirname(f)), [(r["kernel"], r["mode"], r["status"], (r.get("reason") or "")[:60]) for r in rr])
PY
cat /tmp/w/walls.txt
tail -25 /tmp/w/gpus.log; tail -12 /tmp/w/fault.log
(cd /tmp/w && tar czf $OUT/issue7.tgz --exclude='inductor_code' --exclude='wandb' --exclude='.submitit' . )
