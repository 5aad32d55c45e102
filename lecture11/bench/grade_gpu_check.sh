#!/usr/bin/env bash
# GPU 评分（tools/grade_gpu.py）的一次完整检查：课程的解答应得满分，不跳块的慢解得规则给的部分分，
# 缓存结果的作弊、对角块不掩码、dQ 不掩码被拒绝；写出 H200 的校准系数（学生树里"课程的时间"= v2 × 系数）。
#   bash lecture11/bench/grade_gpu_check.sh [--dry-run]
# 结果（每次运行的 JSON；日志里有 GPU、驱动、torch、triton 版本）写到 $OUT（默认 lecture11/bench/results/grade_gpu/）；
# 校准文件 grade_gpu_h200.json 也写在那里（tools/grade_gpu.py 读默认位置的那一份）。--dry-run：没有 GPU，
# 解释器里极小尺寸走一遍（分数无意义，只查流程和语料的去向）。H200 上约 2–4 分钟。
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-lecture11/bench/results/grade_gpu}
mkdir -p "$OUT"
PY=${PY:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
DRY=""
[ "${1:-}" = "--dry-run" ] && DRY="--dry-run"
LOG="$OUT/grade_gpu_check.log"
: > "$LOG"
{
  date -u
  "$PY" -c 'import platform, torch, triton; print("python", platform.python_version(), "torch", torch.__version__,
"triton", triton.__version__, "cuda", torch.version.cuda,
"gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")'
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
} 2>&1 | tee -a "$LOG"

status=0
run() {            # run 名字 参数...
  local name=$1; shift
  echo "== $name: tools/grade_gpu.py $DRY $*" | tee -a "$LOG"
  local t0=$SECONDS
  "$PY" tools/grade_gpu.py $DRY "$@" --out "$OUT/$name.json" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "   ($name: rc=$rc, $((SECONDS - t0)) s)" | tee -a "$LOG"
  [ "$rc" = 0 ] || status=1
}
run solution
run solution_v2_baseline --baseline v2         # 学生树里的做法（没有课程内核），先不带校准：看 v2 与 v1 差多少
run no_tile_skip --variant no_tile_skip
run cache --variant cache
run diag_unmasked --variant diag_unmasked
run dq_unmasked --variant dq_unmasked
"$PY" tools/grade_gpu.py --summarize "$OUT" 2>&1 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "结果在 $OUT（退出码 $status）" | tee -a "$LOG"
exit $status
