#!/usr/bin/env bash
# 第 19 讲 · 工作台 ring_multi_gpu.py 的时间线测量：环形注意力每轮的"算"和"传"有多少重叠（2 块 GPU，NCCL）。
#
#   bash lecture19/bench/run_ring_gpu.sh          # 2 块 GPU：四个变体，各一次 torchrun（提交的那次共 118 s），再合并
#   bash lecture19/bench/run_ring_gpu.sh --quick  # 2 块 GPU：同样四个变体，每块 1k / 2k token（冒烟测试，约 2 分钟）
#   bash lecture19/bench/run_ring_gpu.sh --cpu    # 没有 GPU：gloo + CPU + 小尺寸，走一遍同样的代码；结果写到临时目录
#
# 变体（NCCL / PyTorch 的环境变量在建通信器时读，所以每个变体是单独的一次 torchrun）：
#   default    每块用 PyTorch 的 FlashAttention-2 内核（aten），NCCL 默认设置
#   nchannels2 同上，NCCL_MAX_NCHANNELS=2：NCCL 的 P2P 内核最多用 2 个通道（2 个线程块），少和注意力抢 SM
#   highprio   同上（NCCL 默认通道数），TORCH_NCCL_HIGH_PRIORITY=1：PyTorch 把 NCCL 的流建成高优先级，
#              NCCL 的线程块不必排在注意力内核还没发出去的线程块后面
#   triton     每块换成第 11 讲的 triton_flash.flash_attn_func（第一次调用时编译、调优，约多 30 s）
# 每个变体写 lecture19/bench/results/ring_timeline/<变体>.json（含每次重复的原始样本），最后合并进
# lecture19/bench/results/ring_multi_gpu.json 的 "timeline" 一节（正确性、旧计时、拓扑不动），再读结果、画图。
# NCCL_NVLS_ENABLE=0 一直设着（NVLink SHARP 多播在这类机器上会出问题）。
# 一个变体失败或超时（timeout）不影响其他变体；合并只收写出来的 JSON。PYTHON=... 可换解释器（默认 python3）。
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0
export PYTHONUNBUFFERED=1
MODE=${1:-}
OUT=lecture19/bench/results/ring_timeline
RESULTS=lecture19/bench/results/ring_multi_gpu.json
EXTRA=()
REPORT=(--replot)                                    # GPU：重画已提交的图 lecture19/bench/results/ring_multi_gpu.png；其余：lecture19/bench/figures/quick/
LIMIT=120                                            # 每个变体的上限（秒）；triton 另算（要编译）
TLIMIT=210
case "$MODE" in
  --cpu)
    OUT=$(mktemp -d)
    cp "$RESULTS" "$OUT/ring_multi_gpu.json"           # 合并进副本：提交的结果不动
    RESULTS=$OUT/ring_multi_gpu.json
    EXTRA=(--cpu)
    REPORT=(--quick)
    LIMIT=120; TLIMIT=120 ;;
  --quick)
    OUT=$(mktemp -d)
    cp "$RESULTS" "$OUT/ring_multi_gpu.json"
    RESULTS=$OUT/ring_multi_gpu.json
    EXTRA=(--quick)
    REPORT=(--quick)
    LIMIT=90; TLIMIT=180 ;;
  "") ;;
  *) echo "用法：bash lecture19/bench/run_ring_gpu.sh [--quick|--cpu]"; exit 2 ;;
esac
mkdir -p "$OUT"
echo "== $(date -Is) 变体 JSON → $OUT；合并 → $RESULTS"

variant() {   # variant 名字 块 上限秒 [环境变量=值 ...]
  local name=$1 block=$2 limit=$3
  shift 3
  echo "== $(date +%T) 变体 $name（block = $block，环境：NCCL_NVLS_ENABLE=0 $*）"
  rm -f "$OUT/$name.json"
  env "$@" timeout -k 10 "$limit" "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 \
    lecture19/bench/ring_multi_gpu.py --timeline --variant "$name" --block "$block" --out "$OUT/$name.json" \
    ${EXTRA[@]+"${EXTRA[@]}"} || echo "!! 变体 $name 失败或超时（退出码 $?），跳过"
}

START=$SECONDS
variant default aten "$LIMIT"
variant nchannels2 aten "$LIMIT" NCCL_MAX_NCHANNELS=2
variant highprio aten "$LIMIT" TORCH_NCCL_HIGH_PRIORITY=1
if [ "$MODE" = "--cpu" ]; then
  variant triton explicit "$TLIMIT"                 # CPU 上没有 Triton 内核：只走一遍变体的流程
else
  variant triton triton "$TLIMIT"
fi
JSONS=("$OUT"/default.json "$OUT"/nchannels2.json "$OUT"/highprio.json "$OUT"/triton.json)
HAVE=()
for j in "${JSONS[@]}"; do [ -f "$j" ] && HAVE+=("$j"); done
if [ ${#HAVE[@]} -eq 0 ]; then
  echo "!! 没有一个变体写出结果"; exit 1
fi
"$PY" lecture19/bench/ring_multi_gpu.py --merge "${HAVE[@]}" --results "$RESULTS" || exit 1
"$PY" lecture19/bench/ring_multi_gpu.py --results "$RESULTS" ${REPORT[@]+"${REPORT[@]}"} || exit 1
echo "== 完成：${#HAVE[@]}/4 个变体，$((SECONDS - START)) s；结果 $RESULTS"
