#!/bin/bash
# The GPU measurements issues 60 and 63 still lack, packed for one device call of at most 10 min
# (a .whl folder carried beside it: the py3.12 wheels of hydra-core, omegaconf, antlr4, pydantic and
# its deps, flag-gems, sqlalchemy, greenlet, liger-kernel, about 10 MB, from `make wheelhouse`):
# the attention GPU tests, the bench at 16k and ViT, the fused attention block against compile, and
# the whole-model modes not yet run; the records come back as $OUT/runA.tgz.
export PYTHONUNBUFFERED=1
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
timeout 120 python3 -m pytest tests/test_kernels_attention.py -m gpu -q -p no:cacheprovider > $OUT/attn_tests.log 2>&1; echo "attn tests rc=$? $(el)s"; tail -3 $OUT/attn_tests.log
timeout 110 python3 scripts/attention_bench.py --budget 95 --seqs 16384 --csv $OUT/attention_bench_16k_vit.csv > $OUT/attn_bench.log 2>&1; echo "bench rc=$? $(el)s"
S="bench.repeats=2 bench.rep_ms=50 wandb.mode=disabled"
timeout 100 python3 -m experiments.run --multirun kernel=attention kernel.form=fused mode=triton,default,max-autotune-no-cudagraphs pass=fwd,fwd_bwd $S hydra.sweep.dir=/tmp/r/block > $OUT/block.log 2>&1; echo "block rc=$? $(el)s"
timeout $(( (575 - $(el)) / 3 )) python3 -m experiments.run --multirun kernel=resnet50,vit_b_16 mode=default,triton-compiled pass=fwd $S hydra.sweep.dir=/tmp/r/m1 > $OUT/m1.log 2>&1; echo "m1 rc=$? $(el)s"
timeout $(( 575 - $(el) )) python3 -m experiments.run --multirun kernel=llama,convnext_tiny,mobilenet_v2,resnet50,vit_b_16 mode=reduce-overhead,flaggems,liger pass=fwd $S hydra.sweep.dir=/tmp/r/m2 > $OUT/m2.log 2>&1; echo "m2 rc=$? $(el)s"
cd /tmp/r && find . -name results.jsonl -o -name env.json -o -name multirun.yaml | grep -v inductor_code | tar czf $OUT/runA.tgz -T -
cat /tmp/r/*/*/results.jsonl | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['kernel'], r['mode'], r['pass'], r['status'], r.get('shape_label'), (r.get('reason') or '')[:160], r.get('speedup_vs_eager'), r.get('accuracy_ratio'))"
