"""
flash-decoding 写成 Triton 内核：decode 时每个序列只有一个新 token，怎样让 132 个 SM 都忙起来、读 K/V 接近拷贝带宽？

flash_decode(q, k_cache, v_cache, cache_seqlens)：把 key 轴切成几段（split-KV）并行，GQA 一组 query 头共用一次
K/V 读取，各段的部分结果用 LSE 合并（flash_lab 的 flash-decoding 一节是同一个算法的 numpy 版）。主机端不同步；
任意 d ≤ 256、任意个新 token（行多时转给 triton_flash 的前向内核）。
内容：
  内核     _decode_kernel（每段一个程序）、_decode_merge_kernel（LSE 合并）
  规划     decode_plan（配置、段数）、decode_splits、decode_route、decode_smem_bytes、decode_fit_smem、
           decode_merge_config、decode_probe_shape（一次调用的时间线探针）
  入口     flash_decode；参考 reference_decode（float64）、sdpa_decode
  检查     check_decode：对照 reference_decode，CPU 上用 Triton 解释器（fp32，误差 < CPU_TOL），
           GPU 上误差 ≤ 2 × SDPA 的误差
形状：q [B, n, Hq, d]，k_cache、v_cache [B, S_max, Hk, d]，cache_seqlens [B]（int32）→ out [B, n, Hq, d]。
triton_flash 重新导出这里的公开名字（triton_flash.flash_decode 照常可用）。H200 上的速度：lecture11/bench/README.md。

运行：
  python3 lecture11/flash_decode.py [--seed N]
      有 GPU：bf16 / fp16 真实尺寸；没有 GPU：以 TRITON_INTERPRET=1 重新运行自己（CPU 解释器，小尺寸 fp32）。
依赖 torch、triton、triton_flash（同一文件夹）。
"""
import argparse
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))
from course_utils import check_bool, check_choice, check_device, check_int, check_memory  # noqa: E402

try:
    import torch
    import triton
    import triton.language as tl
except ImportError:
    if __name__ == "__main__":      # 按仓库约定打印一行 SKIP、退出码 77
        print("SKIP: 没有安装 torch / triton（本模块需要 triton 和 Linux）")
        sys.exit(77)
    raise

from fast_launch import _PLANS, _Plan, _current_stream, _launch_hooks_active, _should_record, _sm_count  # noqa: E402
from triton_flash import (_DTYPES, CPU_TOL, INTERPRET, MAX_HEAD_DIM, Launch,  # noqa: E402
                          _check_float_dtype, _check_gen, _check_runnable, _check_scale, _check_tensors, _fwd,
                          _load_rows, _lse_scratch, _pick_seed, _pow2, _prec, _rel_err, _rows_layout, _scalar,
                          allowed_mask, reference_attention, torch_bound)


# ============================================================================
# v3：flash-decoding（split-KV）
#   decode 时每个序列只有 1 个（或几个）新 query，FlashAttention 的"一个程序一个 Q 块"只有 B·Hq 个程序，
#   GPU 上 132 个 SM 大半空着（B = 1 时尤其如此）。flash-decoding 把 key 轴也切开，分两步（两个内核）：
#     第一步 _decode_kernel：grid (num_splits, B·Hk)，程序 (s, b·Hk + h) 读第 b 个序列、第 h 个 K/V 头的第 s 段 key；
#       同一组 R = Hq/Hk 个 query 头（× n 个新 token）一起当作 Q 块的 R·n 行（GQA 打包：K/V 只读一遍）。
#       num_splits = 1 时直接写输出（没有第二步）；否则把这一段的部分结果（归一化过的 o_s、以 2 为底的 lse_s）写进
#       fp32 草稿区（只存 R·n 个真的行）。
#     第二步 _decode_merge_kernel：程序 (r, b·Hk + h, c) 一次读进第 r 行的所有段的第 c 段列（d 切成 ⌈d / D_CHUNK⌉ 段），
#       LSE 合并（flash_lab 的 flash-decoding 一节）：M = max_s lse_s，w_s = 2^(lse_s − M)，o = Σ w_s·o_s / Σ w_s。
#       它在整个调用的关键路径上（第一步全部结束之后才能开始）：一个 warp（按段求和都在线程内，不跨 warp 归约），
#       程序少时把 d 切开（B = 1：32 行 × 4 段列 = 128 个程序，各读 2 KB）；H200 上 1.25 → 0.5 µs
#       （decode_merge_config）。
#     试过"最后到的程序合并"（一个内核、原子计数器，省一次启动）：H200 上反而慢。
#   缓存 k_cache、v_cache [B, S_max, Hk, d]，cache_seqlens [B]（int32，每个序列的有效前缀长度 L_b）。
#   n 个新 token 的第 i 个位于 L_b − n + i（右下角对齐），只看 key j ≤ L_b − n + i（它们之间也是 causal）。
#   GPU 上检查 L_b ≤ S_max 要同步一次，所以不查：内核把 L_b 截到 [0, S_max]（多出的部分当作被掩掉），绝不越界读。
#   d 不是 2 的幂时两个内核都补到 BLOCK_D 列（补出的列读 0、不写回，同 v2 的 _load_rows）；(Hq/Hk)·n 行放不进
#   一个程序（> MAX_DECODE_ROWS）时整个调用转给 v2 的前向内核（decode_route、_decode_fwd）。配置按共享内存的估计
#   缩小（decode_smem_bytes、decode_fit_smem）：d = 256、128 行时原来的 (128, 4, 3) 要 448 KiB，H200 只有 227 KiB。
#   段的边界在内核里由 L_b 算：⌈L_b / BLOCK_N⌉ 个块平均分给各段（相邻两段最多差一个块），主机端不需要知道 L_b。
#   PDL（Hopper 的 programmatic dependent launch）：第二步（以及第一步相对它前面的内核）可以在前一个内核还没结束时
#   就被发射、在 SM 上等着（gdc_wait），省掉内核之间的发射空档；任何读写都在 gdc_wait 之后，所以结果不变
#   （唯一的例外是计时探针的入口时间戳：它只写自己的缓冲区）。
#   第二步过了自己的 gdc_wait 就放行后面的内核（gdc_launch_dependents）：下一次调用的第一步（或者任何用 PDL 发射的
#   后续内核）可以提前发射。
# ============================================================================
@triton.jit
def _store_mask(row_ok, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """写回掩码：真的行、真的列（d 是 2 的幂时没有补出来的列：只看行，[行, 1]，和不补列时生成的代码一样）。"""
    if BLOCK_D == HEAD_DIM:
        ok = row_ok[:, None]
    else:
        ok = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    return ok


@triton.jit
def _decode_store(OUT, o, b, h, rows, row_ok, offs_d, stride_qb, stride_qn, stride_qh,
                  N_NEW: tl.constexpr, R: tl.constexpr):
    """第 r = g·n + i 行 → 输出 [b, i, h·R + g, :]（rows 可以是一个块的行，也可以是单独一行；OUT 和 Q 同步长）。"""
    ptrs = OUT + b * stride_qb + (rows % N_NEW) * stride_qn + (h * R + rows // N_NEW) * stride_qh
    tl.store(ptrs + offs_d, o.to(OUT.dtype.element_ty), mask=row_ok)


@triton.jit
def _probe(STAMPS, program, field: tl.constexpr):
    """
    计时探针：把 %globaltimer（GPU 的全局时钟，ns，所有 SM 同一个）写进 STAMPS[program, field]；field 3 写 SM 号。
    每个程序一行 [入口, gdc_wait 之后, 完成, SM 号]（bench/decode_bench.py 的"一次调用的时间线"用它）。"完成"在两个
    内核里不一样：第一步是循环结束（K/V 都读完了，部分结果还没写），合并内核是所有线程都发出了写之后。
    """
    if field == 3:
        tl.store(STAMPS + program * 4 + 3, tl.extra.cuda.smid().to(tl.int64))
    else:
        tl.store(STAMPS + program * 4 + field, tl.extra.cuda.globaltimer())


@triton.jit
def _decode_kernel(Q, K, V, SEQLENS, OUT, O_PART, LSE_PART, STAMPS, qk_scale, S_MAX, N_KV_HEADS, N_SPLITS,
                   stride_qb, stride_qn, stride_qh,      # Q、OUT：[B, n, Hq, d]（_decode 保证步长相同）
                   stride_kb, stride_kn, stride_kh,      # K、V 缓存：[B, S_max, Hk, d]（同上）
                   N_NEW: tl.constexpr, R: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr, SPLIT: tl.constexpr,
                   PDL: tl.constexpr, STAMP: tl.constexpr = False):
    split = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)           # int64：B = 64、S_max = 128k 时 b·stride_kb 超过 2^31
    b = bh // N_KV_HEADS
    h = bh % N_KV_HEADS
    if STAMP:                                     # 探针默认关：STAMP 是编译期常数，关着时这段代码不生成
        _probe(STAMPS, bh * N_SPLITS + split, 0)
    if PDL:
        tl.extra.cuda.gdc_wait()                  # 前一个内核的写入此后才可见：所有读写都在这之后
        tl.extra.cuda.gdc_launch_dependents()     # 合并内核现在就可以发射（它会在自己的 gdc_wait 处等本内核结束）
    if STAMP:
        _probe(STAMPS, bh * N_SPLITS + split, 1)
    seq_len = tl.minimum(tl.maximum(tl.load(SEQLENS + b), 0), S_MAX)   # 截到 [0, S_max]：坏的长度也不会越界读
    n_blocks = tl.cdiv(seq_len, BLOCK_N)          # 块平均分给各段：段数不整除块数时也用满所有程序
    lo = (split * n_blocks // N_SPLITS) * BLOCK_N
    hi = tl.minimum(((split + 1) * n_blocks // N_SPLITS) * BLOCK_N, seq_len)

    rows = tl.arange(0, BLOCK_M)                  # 行 r = g·n + i：组内第 g 个 query 头、第 i 个新 token
    row_ok = rows < R * N_NEW
    last_key = seq_len - N_NEW + rows % N_NEW     # 第 i 个新 token 的位置 = 它能看到的最后一个 key
    offs_d = tl.arange(0, BLOCK_D)                # d 补到 BLOCK_D（2 的幂、≥ 16）：补出来的列读 0、不写回
    q_ptrs = (Q + b * stride_qb + (rows % N_NEW)[:, None] * stride_qn + (h * R + rows // N_NEW)[:, None] * stride_qh
              + offs_d[None, :])
    q = _load_rows(q_ptrs, rows, R * N_NEW, offs_d, HEAD_DIM, BLOCK_D, True)        # [BLOCK_M, BLOCK_D]
    out_ok = _store_mask(row_ok, offs_d, HEAD_DIM, BLOCK_D)                          # [BLOCK_M, BLOCK_D]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)       # 以 2 为底的行最大值
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_kb + h * stride_kh
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < hi
        k = _load_rows(k_base + cols[:, None] * stride_kn + offs_d[None, :], cols, hi, offs_d, HEAD_DIM, BLOCK_D, True)
        v = _load_rows(v_base + cols[:, None] * stride_kn + offs_d[None, :], cols, hi, offs_d, HEAD_DIM, BLOCK_D, True)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale                # [BLOCK_M, BLOCK_N]，log2 单位
        if N_NEW == 1:
            visible = col_ok[None, :]
        else:
            visible = col_ok[None, :] & (cols[None, :] <= last_key[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)     # 整行还没看到 key：别算出 −inf − (−inf)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new

    if STAMP:
        _probe(STAMPS, bh * N_SPLITS + split, 2)
        _probe(STAMPS, bh * N_SPLITS + split, 3)
    seen = l_i > 0                                # 这一段里没有可见 key 的行：o = 0、lse = −∞（合并时权重 0）
    o = acc / tl.where(seen, l_i, 1.0)[:, None]
    if SPLIT:
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        part = (bh * N_SPLITS + split) * (R * N_NEW) + rows     # 草稿区 [B·Hk, num_splits, R·n, (d)]：只存真的行
        tl.store(LSE_PART + part, lse, mask=row_ok)
        tl.store(O_PART + part[:, None] * HEAD_DIM + offs_d[None, :], o, mask=out_ok)   # 草稿区只存 d 个真的列
    else:
        _decode_store(OUT, o, b, h, rows[:, None], out_ok, offs_d[None, :], stride_qb, stride_qn, stride_qh,
                      N_NEW, R)


@triton.jit
def _decode_merge_kernel(O_PART, LSE_PART, OUT, STAMPS, N_KV_HEADS, N_SPLITS, stride_qb, stride_qn, stride_qh,
                         N_NEW: tl.constexpr, R: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
                         D_CHUNK: tl.constexpr, PDL: tl.constexpr, STAMP: tl.constexpr = False):
    """第二步：程序 (r, b·Hk + h, c) 把第 r 行（组内头 g、新 token i）的 N_SPLITS 段的第 c 段列一次读进来合并。"""
    r = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    program = (bh * tl.num_programs(0) + r) * tl.num_programs(2) + tl.program_id(2)     # 探针的行号
    if STAMP:
        _probe(STAMPS, program, 0)
    if PDL:
        tl.extra.cuda.gdc_wait()                  # 等第一步全部写完（PDL 发射时可能提前到了 SM 上）
        tl.extra.cuda.gdc_launch_dependents()     # 后面的内核现在就可以发射（它们在自己的 gdc_wait 处等本内核结束）
    if STAMP:
        _probe(STAMPS, program, 1)
    splits = tl.arange(0, BLOCK_S)
    s_ok = splits < N_SPLITS
    part = (bh * N_SPLITS + splits) * (R * N_NEW) + r                               # [BLOCK_S]
    offs_d = tl.program_id(2) * D_CHUNK + tl.arange(0, D_CHUNK)
    if HEAD_DIM % D_CHUNK == 0:                   # 段列正好铺满 d（d 是 2 的幂时总是这样）：不用列掩码
        ok = s_ok[:, None]
    else:                                         # 最后一段列越过 d：多出的列不读
        ok = s_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    lse = tl.load(LSE_PART + part, mask=s_ok, other=float("-inf"))
    o = tl.load(O_PART + part[:, None] * HEAD_DIM + offs_d[None, :], mask=ok, other=0.0)  # [BLOCK_S, D_CHUNK]
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)                # 整行没有可见 key（L_b = 0）：输出 0
    w = tl.exp2(lse - m_safe)                                    # [BLOCK_S]：每段占的 softmax 质量
    total = tl.sum(w, 0)
    merged = tl.sum(w[:, None] * o, 0) / tl.where(total > 0, total, 1.0)            # [D_CHUNK]
    _decode_store(OUT, merged, bh // N_KV_HEADS, bh % N_KV_HEADS, r, offs_d < HEAD_DIM, offs_d,
                  stride_qb, stride_qn, stride_qh, N_NEW, R)
    if STAMP:
        tl.debug_barrier()                        # 所有线程都发出了写，才算"活干完"
        _probe(STAMPS, program, 2)
        _probe(STAMPS, program, 3)


# 每次循环读的 key 数、warp 数、流水级数 (BLOCK_N, warps, stages)：H200 上 sweep 选的（bench/results/
# decode_bench.json 的 meta.decode_config）。每段的 key 多时 (64, 4, 4) 略快；每段 ≤ 512 个 key 时
# (128, 4, 3) 快约 10%（循环次数减半，流水线的填充 / 排空少一半）。解释器用小块，几十个 key 也跨好几块。
DECODE_CONFIG_GPU = (64, 4, 4)
DECODE_CONFIG_SHORT_GPU = (128, 4, 3)
DECODE_CONFIG_INTERPRET = (16, 4, 1)
DECODE_CONFIG = DECODE_CONFIG_INTERPRET if INTERPRET else DECODE_CONFIG_GPU
DECODE_CONFIG_SHORT = DECODE_CONFIG_INTERPRET if INTERPRET else DECODE_CONFIG_SHORT_GPU
SHORT_SPLIT_KEYS = 512
MAX_SPLITS = 256
MAX_DECODE_ROWS = 128          # 一个程序的 Q 块最多 (Hq/Hk)·n 行；更多的行转给 v2 的前向内核（decode_route）
SMEM_LIMIT_SM90 = 232448       # H100 / H200 一个程序最多可用（opt-in）的共享内存，227 KiB；解释器上按它算
SMEM_SLACK = 1024              # decode_smem_bytes 给行归约、屏障留的余量


def _pad_d(d):
    """head dim 补到的列数 BLOCK_D：2 的幂（tl.arange 要）、≥ 16（tl.dot 要），和 v2 的 _fwd 一样。"""
    return max(16, triton.next_power_of_2(d))


def decode_smem_bytes(config, rows, d, dtype_bytes):
    """
    第一步内核（_decode_kernel）一个程序要的共享内存，字节，往大里估。config = (BLOCK_N, warps, stages)；
    rows = (Hq/Hk)·n，Q 块补到 BLOCK_M = max(16, 2 的幂) 行；d 补到 BLOCK_D（_pad_d）；dtype_bytes = q 的元素字节数。
        2·BLOCK_N·BLOCK_D·e·max(stages, 2)   K、V 块，流水线每一级各一份（cp.async 提前读后面的块）；stages = 1 时
                                             不提前读，但读进来的块还要转一次布局，也按 2 份算
      + BLOCK_M·BLOCK_D·e                    Q 块：第一个 tl.dot 的左操作数，整个循环都放在共享内存里
      + BLOCK_M·BLOCK_N·e                    P 块：第二个 tl.dot 之前转布局
      + SMEM_SLACK                           行归约（max、sum）、屏障
    合并内核（几 KB）不算。例：d = 256、R·n = 128、(128, 4, 3)，H200 上 Triton 报 OutOfResources（要 458752），
    这里估 492544。tests/test_lecture11_decode.py 在 CPU 上为 sm_90 编译内核，核对估计 ≥ Triton 算出的值。
    """
    config, rows, d, dtype_bytes = _check_smem_args("decode_smem_bytes", config, rows, d, dtype_bytes)
    return _smem_bytes(config, rows, d, dtype_bytes)


def _smem_bytes(config, rows, d, dtype_bytes):
    block_n, _, stages = config
    block_m, block_d = max(16, triton.next_power_of_2(rows)), _pad_d(d)
    kv = 2 * block_n * block_d * dtype_bytes * max(stages, 2)
    return kv + block_m * block_d * dtype_bytes + block_m * block_n * dtype_bytes + SMEM_SLACK


def decode_fit_smem(config, rows, d, dtype_bytes, limit=SMEM_LIMIT_SM90):
    """
    把 config 缩到 decode_smem_bytes ≤ limit：先减流水级数（减到 2；每次循环读的 key 数不变），再把 BLOCK_N 减半
    （减到 16）。到底了还放不下 → None（decode_route 就转给前向内核）。放得下的 config 原样返回。
    """
    config, rows, d, dtype_bytes = _check_smem_args("decode_fit_smem", config, rows, d, dtype_bytes)
    return _fit_smem(config, rows, d, dtype_bytes, check_int("limit", limit, lo=1, where="decode_fit_smem"))


def _fit_smem(config, rows, d, dtype_bytes, limit=SMEM_LIMIT_SM90):
    block_n, warps, stages = config
    while _smem_bytes((block_n, warps, stages), rows, d, dtype_bytes) > limit:
        if stages > 2:
            stages -= 1
        elif block_n > 16:
            block_n //= 2
        else:
            return None
    return block_n, warps, stages


def decode_route(rows, d, dtype_bytes, limit=SMEM_LIMIT_SM90):
    """
    flash_decode 走哪条路："split"（v3 的两个内核）或 "fwd"（v2 的前向内核 _fwd）。rows = (Hq/Hk)·n。
    【规则】rows > MAX_DECODE_ROWS，或者缩到最小的配置（decode_fit_smem）也放不进 limit → "fwd"；否则 "split"。
    【为什么】split-KV 的一个程序把一组 R 个头的 R·n 行放在一个 Q 块里，累加器 [R·n, d] 在寄存器里：128 行、d = 256
        已经是 4 个 warp 每个线程 256 个 fp32。行更多时 query 本身就够铺满 GPU，不必再切 key 轴：前向内核有
        ⌈n / BLOCK_M⌉ × B × Hq 个程序，key 是缓存每行的前 L_b 个（_decode_fwd）。代价：它不打包 GQA 的头，K/V 每个
        query 头各读一遍（R 遍）。两条路的结果都对照 reference_decode 检查。
    """
    _, rows, d, dtype_bytes = _check_smem_args("decode_route", DECODE_CONFIG, rows, d, dtype_bytes)
    return _route(rows, d, dtype_bytes, check_int("limit", limit, lo=1, where="decode_route"))


def _route(rows, d, dtype_bytes, limit=SMEM_LIMIT_SM90):
    if rows > MAX_DECODE_ROWS or _fit_smem(DECODE_CONFIG, rows, d, dtype_bytes, limit) is None:
        return "fwd"
    return "split"


def decode_splits(B, Hk, S, n_sm=132, block_n=None):
    """
    split 的启发式（和 flash_lab.best_splits 同一个想法：程序数排成整波、铺满所有 SM；FlashAttention-2 的
    num_splits_heuristic 也是这样挑的）。

    【规则】B·Hk·s 个程序排成 ⌈B·Hk·s / n_sm⌉ 波，波效率 = 程序数 / (波数 · n_sm)。在 1…⌊S / block_n⌋（每段至少
        一个块，且 ≤ MAX_SPLITS）里取波效率 ≥ 0.95 × 最高波效率的最小 s（段越少，合并越省事）。
        S 用缓存长度 S_max（主机端不知道每个序列的真实长度，读它要同步）。
    【实测】H200（132 个 SM，我们的两种配置每个 SM 同时都只放得下一个程序）上，Hk = 8 时 B = 1 / 8 / 64
        最快的段数是 16 / 2 / 1（decode_bench.json 的 sweep），正是这条规则给出的。sweep 里别的配置能更快的
        只有 B = 1、S = 8k：(64, 4, 2) × 66 段快 4%（8.7 对 9.1 µs）；没收进规则，因为 S = 32k、128k 上多段不快。
    """
    where = "decode_splits"
    B, Hk, S = (check_int(n, v, lo=1, where=where) for n, v in (("B", B), ("Hk", Hk), ("S", S)))
    n_sm = check_int("n_sm", n_sm, lo=1, where=where)
    block_n = DECODE_CONFIG[0] if block_n is None else check_int("block_n", block_n, lo=1, where=where)
    return _splits(B, Hk, S, n_sm, block_n)


def _splits(B, Hk, S, n_sm, block_n):
    cap = max(1, min(MAX_SPLITS, S // block_n))

    def efficiency(s):
        programs = B * Hk * s
        return programs / (math.ceil(programs / n_sm) * n_sm)

    best = max(efficiency(s) for s in range(1, cap + 1))
    return next(s for s in range(1, cap + 1) if efficiency(s) >= 0.95 * best)


def decode_plan(B, Hk, S, n_sm=132, num_splits=None, config=None, *, rows=1, d=128, dtype_bytes=2,
                smem_limit=SMEM_LIMIT_SM90):
    """
    flash_decode 的配置和段数：先按 DECODE_CONFIG 的块大小定段数，每段 ≤ SHORT_SPLIT_KEYS 个 key 时换成
    DECODE_CONFIG_SHORT（大块），再按最终的块大小定段数——但大块会让段数变少时不换（缓存短、每段只有一两个
    大块：B = 1、S = 1k 时 (128, 4, 3) × 8 段 4.6 µs，(64, 4, 4) × 16 段 3.9 µs，decode_bench.json 的 sweep）。
    两种配置都先经过 decode_fit_smem（rows = (Hq/Hk)·n、d、dtype_bytes 决定共享内存；默认值是基准的形状：
    R·n ≤ 16、d = 128、bf16，这时两种配置都放得下、原样用）；大块配置要缩才放得下时不换它。
    num_splits、config 给了就用给的（config 给了、段数没给时按它的块大小定段数；给的 config 不缩：那是实验用的）。
    返回 ((BLOCK_N, warps, stages), 段数)。
    调用者先用 decode_route 确认走 "split"（否则缩不下时这里报 ValueError）。
    """
    where = "decode_plan"
    B, Hk, S, n_sm = (check_int(n, v, lo=1, where=where) for n, v in (("B", B), ("Hk", Hk), ("S", S), ("n_sm", n_sm)))
    if num_splits is not None:
        num_splits = check_int("num_splits", num_splits, lo=1, hi=MAX_SPLITS, where=where)
    if config is not None:
        config = _check_decode_config("config", config, where)
    _, rows, d, dtype_bytes = _check_smem_args(where, DECODE_CONFIG, rows, d, dtype_bytes)
    smem_limit = check_int("smem_limit", smem_limit, lo=1, where=where)
    return _plan(B, Hk, S, n_sm, num_splits, config, rows, d, dtype_bytes, smem_limit)


def _plan(B, Hk, S, n_sm, num_splits, config, rows, d, dtype_bytes, smem_limit):
    if config is None:
        long_cfg = _fit_smem(DECODE_CONFIG, rows, d, dtype_bytes, smem_limit)
        if long_cfg is None:
            raise ValueError(f"decode_plan：rows={rows}、d={d}、{dtype_bytes} 字节的元素放不进 {smem_limit} 字节的"
                             "共享内存：这样的调用走前向内核（decode_route）")
        short_cfg = DECODE_CONFIG_SHORT                 # 大块配置的好处就是块大：要缩才放得下时不换它
        if _fit_smem(short_cfg, rows, d, dtype_bytes, smem_limit) != short_cfg:
            short_cfg = long_cfg
        guess = num_splits or _splits(B, Hk, S, n_sm, long_cfg[0])
        short = S / guess <= SHORT_SPLIT_KEYS
        if short and num_splits is None and _splits(B, Hk, S, n_sm, short_cfg[0]) < guess:
            short = False         # 大块让段数变少（S = 1k：16 → 8 段）：段数比循环次数要紧，不换
        config = short_cfg if short else long_cfg
    return config, num_splits or _splits(B, Hk, S, n_sm, config[0])


MERGE_MIN_CHUNK = 32           # 合并内核每个程序至少读 32 列（再细，程序多出来的发射开销比省下的延迟大）
MERGE_ELEMS_PER_THREAD = 64    # 合并内核每个线程最多拿 [段, 列] 里的 64 个 fp32（再多寄存器就溢出）


def decode_merge_config(rows, d, splits, n_sm=132):
    """
    第二步（合并内核）的 (BLOCK_S, D_CHUNK, warps)。rows = B·Hk·R·n（要合并的行数），splits = 段数；
    BLOCK_S = 段数向上取到 2 的幂（至少 2），一个程序一次读进来的段数。

    【为什么】合并只有几 µs，却整个落在调用的关键路径上（第一步全部结束才能开始），要的是延迟低，不是吞吐：
      · 一个 warp 一行：按段求和都在一个线程里做，不用 warp 之间经共享内存归约；
      · 行数少于 SM 数时把 d 切成几段列（每段 ≥ MERGE_MIN_CHUNK 列），程序数 = rows × 段列数 ≤ n_sm：
        每个程序读的字节少，各自的读同时在路上；
      · 段多时（BLOCK_S · D_CHUNK 超过 32 × MERGE_ELEMS_PER_THREAD）加 warp，免得寄存器溢出；最多 8 个 warp——
        段很多、d 又大、行数还多于 SM 时（例如 256 段 × d = 256）每个线程仍会超过 64 个（少见，只是慢）。
    【d 不是 2 的幂】按补到 2 的幂的 d 切（D_CHUNK 是 2 的幂），段列数 = ⌈d / D_CHUNK⌉：最后一段列越过 d 的部分
      不读不写（d = 80、D_CHUNK = 32：发 3 段列，第 3 段只有 16 列有用；补到 128 列时的第 4 段整段越界，不发）。
    【报错】rows、splits、n_sm < 1，d 不在 1…MAX_HEAD_DIM 之间 → ValueError。
    【实测】H200、B = 1、Hq/Hk = 32/8、d = 128、16 段（bench/results/decode_merge_try.json）：
      合并内核自己 1.25 µs（4 warp、整行）→ 0.51 µs（1 warp、4 段列 × 32）；B = 1、S = 32k 一次调用 35.5 → 34.5 µs，
      S = 8k 10.7 → 9.2 µs；B = 8（256 行，不切列）1 warp 和 4 warp 相差 ≤ 0.2%。
    """
    where = "decode_merge_config"
    rows, d = check_int("rows", rows, lo=1, where=where), check_int("d", d, lo=1, hi=MAX_HEAD_DIM, where=where)
    splits = check_int("splits", splits, lo=1, hi=MAX_SPLITS, where=where)
    return _merge_config(rows, d, splits, check_int("n_sm", n_sm, lo=1, where=where))


def _merge_config(rows, d, splits, n_sm=132):
    block_s = max(2, triton.next_power_of_2(splits))
    chunk = triton.next_power_of_2(d)
    while chunk > MERGE_MIN_CHUNK and rows * -(-d // (chunk // 2)) <= n_sm:      # 段列数 ⌈d / (chunk / 2)⌉
        chunk //= 2
    want = -(-block_s * chunk // (32 * MERGE_ELEMS_PER_THREAD))          # 向上取整
    warps = min(8, triton.next_power_of_2(max(1, want)))
    return block_s, chunk, warps


_SMEM = {}
_HOPPER = {}
DECODE_PDL = True       # 两个内核都用 PDL 发射；Hopper 之前的 GPU、解释器上自动不用


def _pdl_modes(device, pdl):
    """(第一步, 第二步) 各自的启动参数：PDL = 内核里的 gdc_wait 开关 + 启动时的 launch_pdl。"""
    check_choice("pdl", pdl, (True, False, "merge"), where="flash_decode")      # 1、0 不当成 True、False
    if pdl is not False and not INTERPRET and device.type == "cuda":
        key = device.index if device.index is not None else torch.cuda.current_device()
        if key not in _HOPPER:                    # griddepcontrol 是 sm_90 的指令
            _HOPPER[key] = torch.cuda.get_device_capability(key)[0] >= 9
        if _HOPPER[key]:
            on, off = dict(PDL=True, launch_pdl=True), dict(PDL=False)
            return (on if pdl is True else off), on
    return dict(PDL=False), dict(PDL=False)


def _smem_limit(device):
    """一个程序最多可用的共享内存（字节）：GPU 上问一次驱动（opt-in 的上限，Triton 检查的也是它），解释器上按 sm_90。"""
    if device.type != "cuda":
        return SMEM_LIMIT_SM90
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SMEM:
        props = torch.cuda.get_device_properties(key)
        _SMEM[key] = getattr(props, "shared_memory_per_block_optin", SMEM_LIMIT_SM90)
    return _SMEM[key]


class _Scratch:
    """
    flash_decode 的草稿区（各段的 o_s、lse_s；转给前向内核时的 cu_seqlens_k），按 (设备, stream) 缓存、只增不减：
    每次调用不再新建张量。同一个 stream 上的调用按顺序执行，不会同时用同一块；不同 stream 各有一份。
    CUDA 图捕获期间分配的不缓存（那块内存属于图）。
    """
    _cache = {}
    _cu = {}

    @classmethod
    def get(cls, device, n_rows, d):
        """n_rows = B·Hk·num_splits·R·n 行 → (o_part [n_rows·d]，lse_part [n_rows])，fp32。"""
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        key = (device, stream)
        have = cls._cache.get(key)
        if have is not None and have[0].numel() >= n_rows * d and have[1].numel() >= n_rows:
            return have
        bufs = (torch.empty(n_rows * d, device=device, dtype=torch.float32),
                torch.empty(n_rows, device=device, dtype=torch.float32))
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            cls._cache[key] = bufs
        return bufs

    @classmethod
    def cu(cls, device, n):
        """_decode_fwd 的 cu_seqlens_k：int32、至少 n 个，同样按 (设备, stream) 缓存、只增不减。"""
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        key = (device, stream)
        have = cls._cu.get(key)
        if have is not None and have.numel() >= n:
            return have
        buf = torch.empty(n, device=device, dtype=torch.int32)
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            cls._cu[key] = buf
        return buf


def flash_decode(q, k_cache, v_cache, cache_seqlens, num_splits=None, softmax_scale=None, out=None):
    """
    flash-decoding：新 token 的 query 对 KV 缓存的有效前缀做注意力。

    【形状】q [B, Hq, d]（每个序列 1 个新 token）或 [B, n, Hq, d]（n 个新 token，它们之间 causal，右下角对齐：
        第 i 个位于 L_b − n + i）；k_cache、v_cache [B, S_max, Hk, d]；cache_seqlens int32 [B]，n ≤ L_b ≤ S_max
        → 返回和 q 同形状、同 dtype。Hq 是 Hk 的倍数；n ≥ 1 任意；1 ≤ d ≤ 256 任意（内核里补到 2 的幂、≥ 16 列，
        补出的列读 0、不写回；flash-attn 的 CUDA 内核要 d 是 8 的倍数，这里不要求，和 v2 一样）。
    【两条路】(Hq/Hk)·n ≤ MAX_DECODE_ROWS（= 128）行时 split-KV 的两个内核；更多时（或共享内存放不下时）v2 的
        前向内核（decode_route、_decode_fwd）。调用方式、结果、out=、不同步、CUDA 图都一样，只有 num_splits 不起作用。
        配置按共享内存的估计缩小（decode_smem_bytes、decode_fit_smem），不会超过 GPU 的上限。
    【num_splits】key 轴切成几段（None → decode_plan 按 decode_splits 选）；段数多于块数时多出的段为空，结果不变。
    【out】可选：写进这个张量（和 q 同形状、同 dtype、同设备，最后一维连续，不和输入共用内存）并返回它——
        每一步都不再分配（CUDA 图里也常这样用）。
    【主机端】没有同步（不读 cache_seqlens 的值）；CPU 张量上才检查 L_b 的范围，GPU 上 L_b 被截到 [0, S_max]。
        同一组形状第二次起走快速路径（_Plan：检查过的形状按键记住，直接调用编译好的内核；前向内核那条路只有注意力
        内核走 _Plan，检查照常做，算 cu_seqlens 的小内核每次照常经过 Triton 启动）；可以在 CUDA 图里捕获。
    """
    key, ptrs = _decode_key(q, k_cache, v_cache, cache_seqlens, num_splits, softmax_scale, out)
    fast = _PLANS.get(key) if key is not None else None
    if fast and not _launch_hooks_active():      # 钩子、stream 每次调用只查一次
        return fast(q, out, ptrs, key[-1])
    return _decode(q, k_cache, v_cache, cache_seqlens, num_splits, softmax_scale, None,
                   key if _should_record(key) else None, out)


class _DecodeFast:
    """
    flash_decode 的快速路径：一到两个 _Plan（第一步、第二步），加上 q、k_cache、v_cache、cache_seqlens、out 各自碰到的
    字节数。
    形状、步长都在键里，所以字节数是定的，每次只有地址不同：out= 和输入是否重叠只剩几次整数比较（原来每次
    重算四个张量的字节区间，约 2 µs）。地址由 _decode_key 取一次，两个内核共用。
    """
    __slots__ = ("plans", "extents")

    def __init__(self, plans, q, k, v, lens, out):
        self.plans = plans
        self.extents = tuple(_byte_extent(t) for t in (q, k, v, lens, out))

    def __call__(self, q, out, ptrs, stream):
        if out is None:
            out = torch.empty_like(q)
            ptrs = (*ptrs[:4], out.data_ptr())
        else:                                    # 键只记 out 的布局：和输入是否重叠每次都要看地址
            _check_spans("flash_decode", (ptrs[4], ptrs[4] + self.extents[4]),
                         [(ptrs[j], ptrs[j] + self.extents[j]) for j in range(4)])
        for plan in self.plans:
            plan.launch_ptrs(ptrs, stream)
        return out


def _byte_extent(t):
    """张量 t 碰到的字节数：(Σ (size − 1)·stride + 1)·元素字节（PyTorch 的步长都 ≥ 0）；空张量 → 0。"""
    if t.is_contiguous():                 # 常见情况：一段连续的字节（含空张量），不用逐维求和
        return t.numel() * t.element_size()
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))) * t.element_size()


def _byte_range(t):
    """张量 t 碰到的字节 [起点, 终点)：起点 = data_ptr，长度 = _byte_extent。"""
    start = t.data_ptr()
    return start, start + _byte_extent(t)


def _check_out_alias(out, inputs, where):
    """out 和任何一个输入的字节区间相交 → ValueError（内核边读边写会读到写过的值；视图、切片也算）。"""
    _check_spans(where, _byte_range(out), [_byte_range(t) for t in inputs])


def _check_spans(where, out_span, input_spans):
    """字节区间 [o0, o1) 和任何一个 [t0, t1) 相交 → ValueError；首尾相接不算相交。"""
    o0, o1 = out_span
    for t0, t1 in input_spans:
        if o0 < t1 and t0 < o1:
            raise ValueError(f"{where}：out 不能和 q、k_cache、v_cache、cache_seqlens 共用内存（内核边读边写会读到写过"
                             f"的值），out 的字节 [{o0:#x}, {o1:#x}) 和一个输入的 [{t0:#x}, {t1:#x}) 相交")


def _decode_key(q, k, v, lens, num_splits, softmax_scale, out=None):
    """
    快速路径的键：决定检查结果和编译结果的一切（形状、步长、dtype、设备、16 字节对齐、两个参数、out 的布局），
    最后一项是当前 stream。返回 (键, 地址)：地址 = 五个张量（q、k、v、lens、out）的 data_ptr（out 没给时 None），
    快速路径直接拿去启动。只给 GPU；不是张量、参数不可哈希等情况返回 (None, None)（走正常路径，由 _check_decode 报错）。
    """
    try:
        if INTERPRET or not q.is_cuda:
            return None, None
        # 键里原样放进去的调用者参数只有这两个（其余都取自张量的属性）：不可哈希（如 num_splits=[2]）时在这里
        # 抛 TypeError → None，否则 _PLANS.get(键) 才报 "unhashable"，而不是 _check_decode 的 ValueError
        hash((num_splits, softmax_scale))
        dev = q.get_device()
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), lens.data_ptr(), None if out is None else out.data_ptr())
        o = None if out is None else (type(out), out.shape, out.stride(), out.dtype, out.get_device(), ptrs[4] % 16)
        key = ("decode", q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
               lens.dtype, lens.shape, lens.stride(), dev, k.get_device(), v.get_device(), lens.get_device(),
               ptrs[0] % 16, ptrs[1] % 16, ptrs[2] % 16, ptrs[3] % 16,
               num_splits, type(num_splits), softmax_scale, type(softmax_scale), o, _current_stream(dev))
        return key, ptrs
    except (AttributeError, TypeError):
        return None, None


def _decode(q, k_cache, v_cache, cache_seqlens, num_splits, softmax_scale, config, plan_key=None, out=None,
            pdl=None, stamps=None):
    """正常路径：检查输入、选配置和段数、拿草稿区、启动一到两个内核；plan_key 不是 None 时把这次启动记成 _Plan。
    config = (BLOCK_N, warps, stages)；None = 按每段的 key 数在 DECODE_CONFIG / DECODE_CONFIG_SHORT 里选
    （都经过 decode_fit_smem）。pdl：None = DECODE_PDL（Hopper 及以后的 GPU 上）；"merge" = 只给合并内核；True / False。
    stamps：None，或 (第一步的, 合并内核的) 两个 int64 张量，各 [程序数, 4]（decode_probe_shape）：打开计时探针。
    decode_route 给 "fwd" 时（(Hq/Hk)·n 行放不进一个程序）交给 _decode_fwd：那条路没有 _DecodeFast（每次都走这里），
    config、pdl、stamps 只属于 split-KV 的两个内核，给了就报 ValueError。"""
    squeeze, scale, splits = _check_decode(q, k_cache, v_cache, cache_seqlens, num_splits, softmax_scale, out)
    batch, n_new, hq, d = q.shape[0], 1 if squeeze else q.shape[1], q.shape[-2], q.shape[-1]
    s_max, hk = k_cache.shape[1], k_cache.shape[2]
    group = hq // hk
    limit = _smem_limit(q.device)
    if _route(group * n_new, d, q.element_size(), limit) == "fwd":
        if config is not None or pdl is not None or stamps is not None:
            raise ValueError(f"_decode：(Hq/Hk)·n = {group * n_new} 行走前向内核（decode_route），"
                             "config、pdl、stamps 只用于 split-KV 的两个内核")
        if plan_key is not None:
            _PLANS[plan_key] = False            # 这组形状没有 _DecodeFast：flash_decode 不再为它记录
        return _decode_fwd(q, k_cache, v_cache, cache_seqlens, scale, out, squeeze)
    (block_n, warps, stages), splits = decode_plan(batch, hk, s_max, _sm_count(q.device), splits, config,
                                                   rows=group * n_new, d=d, dtype_bytes=q.element_size(),
                                                   smem_limit=limit)
    block_m = max(16, triton.next_power_of_2(group * n_new))        # tl.dot 要求每维 ≥ 16
    o_part, lse_part = _Scratch.get(q.device, batch * hk * splits * group * n_new, d)
    out = torch.empty_like(q) if out is None else out
    q, k_cache, v_cache, o, copied = _shared_strides(q, k_cache, v_cache, out)
    if copied:                            # 记下的 _Plan 会拿调用者张量的地址配拷贝的步长：这组形状不记
        if plan_key is not None:
            _PLANS[plan_key] = False
        plan_key = None
    # q、out 是 [B, Hq, d] 时没有 n 这一维：它的步长记 0（唯一的 i = 0）
    sq = (q.stride(0), 0, q.stride(1)) if squeeze else (q.stride(0), q.stride(1), q.stride(2))
    pdl = _pdl_modes(q.device, DECODE_PDL if pdl is None else pdl)
    st1 = st2 = None
    if stamps is not None:
        st1, st2 = _check_stamps(stamps, decode_probe_shape(batch, hk, group * n_new, d, splits, _sm_count(q.device)),
                                 q.device)
    launches = [(_decode_kernel, (splits, batch * hk),
                 (q, k_cache, v_cache, cache_seqlens, o, o_part, lse_part, st1, scale * math.log2(math.e),
                  s_max, hk, splits, *sq, *k_cache.stride()[:3]),
                 dict(N_NEW=n_new, R=group, HEAD_DIM=d, BLOCK_D=_pad_d(d), BLOCK_M=block_m, BLOCK_N=block_n,
                      PREC=_prec(q.dtype), SPLIT=splits > 1, STAMP=st1 is not None, num_warps=warps,
                      num_stages=stages, **pdl[0]))]
    if splits > 1:
        block_s, d_chunk, merge_warps = decode_merge_config(batch * hk * group * n_new, d, splits, _sm_count(q.device))
        launches.append((_decode_merge_kernel, (group * n_new, batch * hk, triton.cdiv(d, d_chunk)),
                         (o_part, lse_part, o, st2, hk, splits, *sq),
                         dict(N_NEW=n_new, R=group, HEAD_DIM=d, BLOCK_S=block_s, D_CHUNK=d_chunk,
                              STAMP=st2 is not None, num_warps=merge_warps, **pdl[1])))
    for kernel, grid, args, kwargs in launches:
        kernel[grid](*args, **kwargs)
    # 图捕获期间的草稿区属于图：不记；开着探针的启动也不记（快速路径永远是不带探针的那一份）
    if plan_key is not None and stamps is None and not torch.cuda.is_current_stream_capturing():
        tensors = (q, k_cache, v_cache, cache_seqlens, out)
        plans = tuple(_Plan.build(kernel, args, kwargs, grid, tensors) for kernel, grid, args, kwargs in launches)
        _PLANS[plan_key] = all(plans) and _DecodeFast(plans, q, k_cache, v_cache, cache_seqlens, out)
    if o is not out:
        out.copy_(o)
    return out


# 转给前向内核时用固定配置（_fixed_config）、不自动调优：调优要同步、把内核量好几遍（CUDA 图捕获里不能做），
# 而且换了配置结果会变（图重放和直接调用要逐位相同）
_ROUTED_LAUNCH = Launch(autotune=False)
_CU_GAPS = {}


def _cu_gaps(batch, n, device):
    """cu_seqlens_q = [0, n, n, 2n, 2n, …, B·n]（2B + 1 个）：第 2b 段是序列 b 的 n 个 query，第 2b + 1 段是空的
    （_decode_fwd）。按 (B, n, 设备) 缓存（同 _cu_dense）。"""
    key = (batch, n, device)
    cu = _CU_GAPS.get(key)
    if cu is None:
        cu = (torch.arange(2 * batch + 1, device=device, dtype=torch.int32) + 1) // 2 * n
        if not (cu.is_cuda and torch.cuda.is_current_stream_capturing()):   # 图捕获期间分配的内存不能缓存
            _CU_GAPS[key] = cu
    return cu


@triton.jit
def _cache_cu_kernel(SEQLENS, CU_K, batch, rows_per_seq, S_MAX, BLOCK: tl.constexpr):
    """cu_seqlens_k：cu[2b] = b·S'，cu[2b + 1] = b·S' + L_b（L_b 截到 [0, S_max]），cu[2B] = (B − 1)·S' + S_max。"""
    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = b < batch
    length = tl.minimum(tl.maximum(tl.load(SEQLENS + b, mask=ok, other=0), 0), S_MAX)
    tl.store(CU_K + 2 * b, b * rows_per_seq, mask=ok)
    tl.store(CU_K + 2 * b + 1, b * rows_per_seq + length, mask=ok)
    tl.store(CU_K + 2 * batch + b * 0, (batch - 1) * rows_per_seq + S_MAX + b * 0, mask=b == 0)


def _cache_rows(cache, s_max):
    """
    缓存 [B, S_max, Hk, d] 看成打包的 [行, Hk, d]（同一块内存，不拷贝）→ (视图, S')：序列 b 从第 b·S' 行开始。
    要 stride(0) 是 stride(1) 的整数倍（连续的缓存、更大的缓存切出来的一段都是）；B = 1 时 S' = S_max。
    行数 (B − 1)·S' + S_max：最后一个元素正好是缓存的最后一个元素。不能这样看时返回 None。
    """
    batch, _, hk, d = cache.shape
    sb, sn, sh, _ = cache.stride()
    if batch == 1:
        per = s_max
    elif sn > 0 and sb % sn == 0:
        per = sb // sn
    else:
        return None
    return cache.as_strided(((batch - 1) * per + s_max, hk, d), (sn, sh, 1), cache.storage_offset()), per


def _shared_strides(q, k, v, out):
    """
    split-KV 的内核对 Q、OUT 只收一组步长，对 K、V 缓存也只收一组（Triton 教程 06-fused-attention 的做法）。通常本来
    就相同：out 由 empty_like(q) 分配，两个缓存也一样分配。不同时拷成连续的（q 很小；缓存要整块拷，慢但对）。
    返回 (q, k, v, o, copied)：内核写 o（和 q 同步长）；o 不是 out 时调用者最后把 o 拷进 out。
    """
    o, copied = out, False
    if not _same_layout(q, out):
        q, copied = q.contiguous(), True
        if not _same_layout(out, q):
            o = torch.empty_like(q)
    if not _same_layout(k, v):
        k, v, copied = k.contiguous(), v.contiguous(), True
    return q, k, v, o, copied


def _same_layout(a, b):
    """同形状的 a、b 能共用一组步长：长度 > 1 的维步长相同（长度 1 的维下标总是 0，步长是多少都一样）。"""
    return a.stride() == b.stride() or all(n == 1 or sa == sb for n, sa, sb in zip(a.shape, a.stride(), b.stride()))


def _decode_fwd(q, k_cache, v_cache, cache_seqlens, scale, out, squeeze):
    """
    (Hq/Hk)·n 行放不进一个 split-KV 程序时（decode_route 给 "fwd"）：用 v2 的前向内核 _fwd 算同一个结果。
    _fwd 收打包的 q [总行数, Hq, d] 和 cu_seqlens：第 b 段的 query 是 cu_q[b]:cu_q[b + 1]，key 是 cu_k[b]:cu_k[b + 1]
    （_seq_bounds：起点和长度都是相邻两个数给的）。缓存里序列 b 的 key 从第 b·S' 行开始、只有前 L_b 个有效——
    起点和长度凑不成一个 cu 数组，所以每个序列后面插一段空序列（0 个 query，key 是这一行缓存里剩下的部分）：
        cu_q = [0, n, n, 2n, 2n, …, B·n]                 _cu_gaps，按形状缓存
        cu_k = [0, L_0, S', S' + L_1, 2S', …, (B − 1)·S' + S_max]   _cache_cu_kernel 在设备上由 cache_seqlens 算，不同步
    空序列的程序一进内核就返回（len_q = 0）。causal 是 v2 的右下角对齐（len_q = n，len_k = L_b：第 i 个 query 位于
    L_b − n + i），正是 flash_decode 的约定。out 直接当 _fwd 的输出（看成 [B·n, Hq, d]；看不成时算完再拷进去）。
    """
    batch, hq, d = q.shape[0], q.shape[-2], q.shape[-1]
    n_new, s_max = 1 if squeeze else q.shape[1], k_cache.shape[1]
    out = torch.empty_like(q) if out is None else out
    q4, o4 = (q.unsqueeze(1), out.unsqueeze(1)) if squeeze else (q, out)           # [B, n, Hq, d]
    qp = _rows_layout(q4).view(batch * n_new, hq, d)                               # [B·n, Hq, d]：通常只是换视图
    try:
        op = o4.view(batch * n_new, hq, d)
    except RuntimeError:
        op = None
    if op is not None and not _same_layout(op, qp):       # _fwd 的 Q、O 共用一组步长：out 拼不成 q 的布局时
        op = None                                         # 另写一块（连续的，和 qp 同步长），最后拷进去
    views = [_cache_rows(t, s_max) for t in (k_cache, v_cache)]
    if None in views or views[0][1] != views[1][1] or not _same_layout(views[0][0], views[1][0]):
        # K、V 的 S' 或步长不同（或拼不成）：拷成连续的，S' = S_max（_fwd 的 K、V 共用一组步长）
        views = [_cache_rows(t.contiguous(), s_max) for t in (k_cache, v_cache)]
    (kp, per), (vp, _) = views                    # [(B − 1)·S' + S_max, Hk, d]
    if (batch - 1) * per + s_max >= 2**31:
        raise ValueError(f"flash_decode：(Hq/Hk)·n 行走前向内核时 cu_seqlens 是 int32，缓存的行数 "
                         f"(B − 1)·S' + S_max 要 < 2^31，收到 B={batch}、S'={per}、S_max={s_max}")
    cu_q = _cu_gaps(batch, n_new, q.device)
    cu_k = _Scratch.cu(q.device, 2 * batch + 1)
    _cache_cu_kernel[(triton.cdiv(batch, 256),)](cache_seqlens, cu_k, batch, per, s_max, BLOCK=256)
    capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
    lse = None if capturing else _lse_scratch(q.device, hq * batch * n_new)       # 没人读它（同 _DenseFast）
    lse = None if lse is None else lse[:hq * batch * n_new].view(hq, batch * n_new)
    plan_key = None
    if q.is_cuda and not INTERPRET and not capturing:   # 键：决定 _fwd 编译结果和标量参数的一切（同 _plan_key）
        plan_key = ("decode-fwd", qp.shape, qp.stride(), kp.shape, kp.stride(), vp.shape, vp.stride(), qp.dtype,
                    qp.device, scale, batch, n_new, s_max, None if op is None else op.stride(), qp.data_ptr() % 16,
                    kp.data_ptr() % 16, vp.data_ptr() % 16, None if op is None else op.data_ptr() % 16)
    o, _ = _fwd(qp, kp, vp, cu_q, cu_k, n_new, s_max, scale, (-1, 0), None, None, 0.0, 0, _ROUTED_LAUNCH, 0.0,
                plan_key=plan_key, out=op, lse=lse)
    if op is None:
        o4.copy_(o.view(o4.shape))
    return out


def decode_probe_shape(batch, hk, rows_per_head, d, splits, n_sm=132):
    """
    计时探针（_decode 的 stamps）要的两块 int64 缓冲区的形状：第一步 [splits·B·Hk, 4]，合并内核 [行数 × 段列数, 4]
    （没有合并内核时 [0, 4]）。rows_per_head = R·n。每行是 [入口, gdc_wait 之后, 活干完, SM 号]，
    时间是 %globaltimer 的 ns。
    """
    where = "decode_probe_shape"
    batch, hk = check_int("batch", batch, lo=1, where=where), check_int("hk", hk, lo=1, where=where)
    rows_per_head = check_int("rows_per_head", rows_per_head, lo=1, where=where)
    splits = check_int("splits", splits, lo=1, hi=MAX_SPLITS, where=where)
    d, n_sm = check_int("d", d, lo=1, hi=MAX_HEAD_DIM, where=where), check_int("n_sm", n_sm, lo=1, where=where)
    merge = 0
    if splits > 1:
        rows = batch * hk * rows_per_head
        merge = rows * -(-d // _merge_config(rows, d, splits, n_sm)[1])       # 行 × ⌈d / D_CHUNK⌉ 段列
    return (splits * batch * hk, 4), (merge, 4)


_PROBE_IN_INTERPRETER = False    # 测试用：把 _probe 换成不读 %globaltimer 的版本时才打开（解释器里没有那条指令）


def _check_stamps(stamps, shapes, device):
    """stamps 必须是两个 int64、连续、形状对得上、和 q 在同一设备上的张量（探针只在 GPU 上有）
    → (第一步的, 合并内核的或 None)。"""
    if INTERPRET and not _PROBE_IN_INTERPRETER:
        raise ValueError("_decode：stamps（计时探针，读 %globaltimer）只能在 GPU 上用，解释器里没有这条指令")
    if not (isinstance(stamps, (tuple, list)) and len(stamps) == 2):
        raise TypeError(f"_decode：stamps 必须是 (第一步的, 合并内核的) 两个张量，收到 {type(stamps).__name__}")
    for t, shape, name in zip(stamps, shapes, ("stamps[0]", "stamps[1]")):
        if not (isinstance(t, torch.Tensor) and t.device == device and t.dtype == torch.int64 and t.is_contiguous()
                and tuple(t.shape) == shape):
            raise ValueError(f"_decode：{name} 必须是 {device} 上连续的 int64 张量、形状 {shape}"
                             f"（decode_probe_shape），收到 {getattr(t, 'shape', type(t).__name__)}")
    return stamps[0], (stamps[1] if shapes[1][0] else None)


def reference_decode(q, k_cache, v_cache, cache_seqlens, softmax_scale=None, dtype=torch.float64):
    """
    参考实现：逐个序列只取有效前缀 [0, L_b)，交给 reference_attention（causal、右下角对齐：n 个新 token 之间也
    causal；GQA、按 dtype 算，默认 float64，都在那里）。形状约定同 flash_decode。
    """
    _check_reference_decode("reference_decode", q, k_cache, v_cache, cache_seqlens, softmax_scale)
    _check_float_dtype("dtype", dtype, "reference_decode")
    squeeze = q.dim() == 3
    q4 = q.unsqueeze(1) if squeeze else q                                            # [B, n, Hq, d]
    outs = [reference_attention(q4[b:b + 1], k_cache[b:b + 1, :length], v_cache[b:b + 1, :length], causal=True,
                                softmax_scale=softmax_scale, dtype=dtype)[0]          # [1, n, Hq, d]
            for b, length in enumerate(cache_seqlens.tolist())]
    out = torch.cat(outs)
    return out.squeeze(1) if squeeze else out


def sdpa_decode(q, k_cache, v_cache, cache_seqlens, softmax_scale=None):
    """第二个参考：torch 的 F.scaled_dot_product_attention 在每个序列的有效前缀上（同 dtype，enable_gqa）。"""
    softmax_scale = _check_reference_decode("sdpa_decode", q, k_cache, v_cache, cache_seqlens, softmax_scale)
    squeeze = q.dim() == 3
    q4 = q.unsqueeze(1) if squeeze else q
    n_new = q4.shape[1]
    outs = []
    for b, length in enumerate(cache_seqlens.tolist()):
        qb = q4[b].transpose(0, 1).unsqueeze(0)                                      # [1, Hq, n, d]
        kb = k_cache[b, :length].transpose(0, 1).unsqueeze(0)                        # [1, Hk, L, d]
        vb = v_cache[b, :length].transpose(0, 1).unsqueeze(0)
        mask = allowed_mask(n_new, length, causal=True, device=q.device)             # [n, L]，右下角对齐
        o = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=softmax_scale,
                                                             enable_gqa=True)
        outs.append(o[0].transpose(0, 1))                                            # [n, Hq, d]
    out = torch.stack(outs)
    return out.squeeze(1) if squeeze else out


def make_decode_case(gen, batch, lengths, s_max, hq, hk, d, n_new=1, dtype=torch.float32, device="cpu"):
    """随机的一组 decode 输入：缓存里有效前缀之外填 NaN（读到就会露馅）。返回 (q, k_cache, v_cache, seqlens)。"""
    _check_make_decode_case(gen, batch, lengths, s_max, hq, hk, d, n_new, dtype, device)
    shape_q = (batch, hq, d) if n_new == 1 else (batch, n_new, hq, d)
    q = torch.randn(shape_q, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    k = torch.randn((batch, s_max, hk, d), generator=gen, dtype=torch.float32)
    v = torch.randn((batch, s_max, hk, d), generator=gen, dtype=torch.float32)
    for b, length in enumerate(lengths):
        k[b, length:] = float("nan")
        v[b, length:] = float("nan")
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    return q, k.to(device=device, dtype=dtype), v.to(device=device, dtype=dtype), seqlens.to(device)


def decode_cases(gen, device="cpu", dtype=torch.float32, big=False):
    """自检用例：不规则的 B 和长度（含 1、n 和 S_max）、GQA 1/2/4、n = 1、2、3、70、段数 1 / 自动 / 多于块数、
    d 不是 2 的幂、(Hq/Hk)·n > MAX_DECODE_ROWS（转前向内核）。big（GPU）时缓存放大 16 倍，再加四个真实尺寸：
    d = 256 × 128 行（以前超过 H200 的共享内存）、d = 80 × n = 64、n = 128 × GQA 4（转前向内核）、d = 111。"""
    where = "decode_cases"                        # gen 由 make_decode_case 检查
    check_device("device", device, where=where)
    _check_float_dtype("dtype", dtype, where, _DTYPES)
    return _decode_cases(gen, device, dtype, check_bool("big", big, where))


def _decode_cases(gen, device, dtype, big):
    f = 16 if big else 1                          # GPU 上把缓存放大 16 倍
    specs = [  # (名字, lengths, S_max, Hq, Hk, d, n, num_splits)
        ("n=1 GQA4 auto", [37, 1, 50], 50, 8, 2, 32, 1, None),
        ("n=1 MHA 1 split", [23 * f, 64 * f], 64 * f, 2, 2, 64, 1, 1),
        ("n=3 GQA2 5 splits", [3, 41 * f, 29 * f], 45 * f, 4, 2, 16, 3, 5),
        ("n=1 GQA4 splits>blocks", [19, 7], 21, 4, 1, 128, 1, 9),
        ("n=2 GQA2 d=40 3 splits", [2, 33 * f, 50 * f], 50 * f, 4, 2, 40, 2, 3),
        ("n=70 GQA2 -> fwd", [70, 90 * f], 96 * f, 4, 2, 24, 70, None),
    ]
    if big:
        specs += [
            ("n=64 GQA2 d=256 (128 rows)", [64, 1500, 4096], 4096, 16, 8, 256, 64, None),
            ("n=64 MHA d=80", [64, 2000, 3000], 3000, 8, 8, 80, 64, None),
            ("n=128 GQA4 -> fwd", [128, 3000, 4096], 4096, 32, 8, 128, 128, None),
            ("n=1 GQA4 d=111", [1, 2500, 4096], 4096, 32, 8, 111, 1, None),
        ]
    for name, lengths, s_max, hq, hk, d, n_new, splits in specs:
        yield name, splits, make_decode_case(gen, len(lengths), lengths, s_max, hq, hk, d, n_new, dtype, device)


def decode_limit(q, k_cache, v_cache, cache_seqlens, ref):
    """flash_decode 的误差要 < 这个上限（ref = reference_decode 的 float64 结果；check_decode 和测试共用）：
    fp32（解释器）CPU_TOL；fp16 / bf16 是 2 × 同 dtype 的 SDPA 对 ref 的误差（flash-attn 的判据，+1e-6 防 0）。"""
    _check_reference_decode("decode_limit", q, k_cache, v_cache, cache_seqlens, None)
    if not isinstance(ref, torch.Tensor):
        raise TypeError(f"decode_limit：ref 必须是 reference_decode 给出的张量，收到 {type(ref).__name__}")
    if ref.shape != q.shape:
        raise ValueError(f"decode_limit：ref 的形状必须和 q 相同 {tuple(q.shape)}，收到 {tuple(ref.shape)}")
    if q.dtype == torch.float32:
        return CPU_TOL
    return torch_bound(_rel_err(sdpa_decode(q, k_cache, v_cache, cache_seqlens), ref))


def _plan_text(q, k_cache, num_splits):
    """这个用例走的是哪条路：前向内核，或者 split-KV 的配置 (BLOCK_N, warps, stages)、段数、合并内核的程序数
    （行 × 段列）和 warp 数（decode_route、decode_plan、decode_merge_config，和 _decode 里同样的几个函数）。"""
    batch, hq, d = q.shape[0], q.shape[-2], q.shape[-1]
    n_new, hk = (1 if q.dim() == 3 else q.shape[1]), k_cache.shape[2]
    n_sm, limit = _sm_count(q.device), _smem_limit(q.device)
    if _route(hq // hk * n_new, d, q.element_size(), limit) == "fwd":
        return f"(Hq/Hk)·n = {hq // hk * n_new} 行 → 前向内核（_decode_fwd）"
    config, splits = _plan(batch, hk, k_cache.shape[1], n_sm, num_splits, None, hq // hk * n_new, d,
                           q.element_size(), limit)
    if splits == 1:
        return f"配置 {config}，1 段（不合并）"
    rows = batch * hq * n_new
    _, chunk, warps = _merge_config(rows, d, splits, n_sm)
    return f"配置 {config}，{splits} 段，合并 {rows} 行 × {-(-d // chunk)} 段列 × {warps} warp"


def check_decode(device="cpu", dtype=torch.float32, seed=None, verbose=True):
    """
    v3 的检查：flash_decode 对 float64 参考，误差要 < decode_limit（CPU 解释器 fp32：CPU_TOL；GPU fp16/bf16：
    2 × 同 dtype 的 SDPA 对 float64 参考的误差，flash-attn 的判据）。先打印再断言；返回最大误差。
    """
    where = "check_decode"
    device = check_choice("device", device, ("cpu", "cuda"), where)
    _check_float_dtype("dtype", dtype, where, _DTYPES)
    verbose = check_bool("verbose", verbose, where)
    seed = _pick_seed(seed, where)
    gen = torch.Generator().manual_seed(seed)
    print(f"  [decode] 种子 {seed}（复现：python3 lecture11/triton_flash.py --kernel decode --seed {seed}）")
    worst, failed = 0.0, []
    for name, splits, (q, k, v, lens) in decode_cases(gen, device, dtype, big=device != "cpu"):
        ref = reference_decode(q, k, v, lens)
        err = _rel_err(flash_decode(q, k, v, lens, num_splits=splits), ref)
        limit = decode_limit(q, k, v, lens, ref)
        if verbose or not err < limit:
            print(f"  {name:<28s} out {err:.1e}（上限 {limit:.1e}）  {_plan_text(q, k, splits)}"
                  + ("" if err < limit else "  ✗"))
        failed += [] if err < limit else [(name, err)]
        worst = max(worst, err)
    assert not failed, f"flash_decode 误差超过上限（种子 {seed}）：{failed}"
    return worst


# ---------------------------------------------------------------------------- 输入检查
def _check_decode(q, k_cache, v_cache, cache_seqlens, num_splits, softmax_scale, out=None):
    """flash_decode 的输入检查：只查不需要同步的性质（形状、dtype、设备）；cache_seqlens 的值只在 CPU 上查。"""
    where = "flash_decode"
    kv_layout = "[B, S_max, Hk, d]"
    hq, hk, d = _check_tensors(where, [("q", q, (3, 4), "[B, Hq, d]（1 个新 token）或 [B, n, Hq, d]"),
                                       ("k_cache", k_cache, (4,), kv_layout), ("v_cache", v_cache, (4,), kv_layout)])
    _check_runnable(q)
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"{where}：k_cache、v_cache 必须是形状相同的 {kv_layout}，收到 "
                         f"{tuple(k_cache.shape)} 和 {tuple(v_cache.shape)}")
    batch, n_new, s_max = q.shape[0], (1 if q.dim() == 3 else q.shape[1]), k_cache.shape[1]
    if k_cache.shape[0] != batch:
        raise ValueError(f"{where}：q 和 k_cache 的 batch 维必须相同，收到 {batch} 和 {k_cache.shape[0]}")
    check_int("B（q.shape[0]）", batch, lo=1, where=where, type_error=ValueError)
    check_int("head dim d", d, lo=1, hi=MAX_HEAD_DIM, where=where, type_error=ValueError)   # 内核里补到 BLOCK_D
    check_int("n（新 token 数，q.shape[1]）", n_new, lo=1, where=where, type_error=ValueError)   # 多了转前向内核
    check_int("S_max（k_cache.shape[1]）", s_max, lo=1, where=where, type_error=ValueError)
    if any(t.stride(-1) != 1 for t in (q, k_cache, v_cache)):
        raise ValueError(f"{where}：q、k_cache、v_cache 的最后一维必须连续（stride(-1) == 1）")
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32:
        raise TypeError(f"{where}：cache_seqlens 必须是 int32 的 torch.Tensor，"
                        f"收到 {getattr(cache_seqlens, 'dtype', type(cache_seqlens).__name__)}")
    if tuple(cache_seqlens.shape) != (batch,) or cache_seqlens.device != q.device:
        raise ValueError(f"{where}：cache_seqlens 必须是形状 [B]=({batch},)、和 q 在同一设备（{q.device}）上，"
                         f"收到形状 {tuple(cache_seqlens.shape)}、设备 {cache_seqlens.device}")
    if not cache_seqlens.is_cuda:     # CPU 上查值不用同步；GPU 上不查（内核把长度截到 S_max，不会越界读）
        lo, hi = int(cache_seqlens.min()), int(cache_seqlens.max())
        if lo < n_new or hi > s_max:
            raise ValueError(f"{where}：cache_seqlens 的每个值必须在 n…S_max = {n_new}…{s_max} 之间"
                             f"（有效前缀不能超过缓存，且要包含 n 个新 token），收到最小 {lo}、最大 {hi}")
    if num_splits is not None:
        num_splits = check_int("num_splits", _scalar(num_splits), lo=1, hi=MAX_SPLITS, where=where,
                               type_error=ValueError)
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dtype != q.dtype:
            raise TypeError(f"{where}：out 必须是 dtype 和 q 相同（{q.dtype}）的 torch.Tensor，"
                            f"收到 {getattr(out, 'dtype', type(out).__name__)}")
        if out.shape != q.shape or out.device != q.device or out.stride(-1) != 1:
            raise ValueError(f"{where}：out 必须和 q 同形状 {tuple(q.shape)}、同设备 {q.device}、最后一维连续，"
                             f"收到形状 {tuple(out.shape)}、设备 {out.device}、stride {tuple(out.stride())}")
        _check_out_alias(out, (q, k_cache, v_cache, cache_seqlens), where)
    return q.dim() == 3, _check_scale(softmax_scale, d, where), num_splits


def _check_smem_args(where, config, rows, d, dtype_bytes):
    """decode_smem_bytes / decode_fit_smem / decode_route / decode_plan 共用：配置、行数、d、元素字节数。"""
    config = _check_decode_config("config", config, where)
    rows = check_int("rows", rows, lo=1, where=where)
    d = check_int("d", d, lo=1, hi=MAX_HEAD_DIM, where=where)
    dtype_bytes = check_int("dtype_bytes", dtype_bytes, where=where)
    return config, rows, d, check_choice("dtype_bytes", dtype_bytes, (2, 4), where)     # fp16 / bf16、fp32


def _check_decode_config(name, config, where):
    """(BLOCK_N, warps, stages)：BLOCK_N 是 16…256 的 2 的幂（tl.dot 要），warps 是 1…32 的 2 的幂，stages 1…8。"""
    if not isinstance(config, (tuple, list)):
        raise TypeError(f"{where}：{name} 必须是 (BLOCK_N, warps, stages) 三个整数，收到 {type(config).__name__}")
    ok = len(config) == 3 and all(type(x) is int for x in config)
    if not (ok and _pow2(config[0]) and 16 <= config[0] <= 256 and _pow2(config[1]) and config[1] <= 32
            and 1 <= config[2] <= 8):
        raise ValueError(f"{where}：{name} 必须是 (BLOCK_N, warps, stages)：BLOCK_N 是 16…256 的 2 的幂、"
                         f"warps 是 1…32 的 2 的幂、stages 在 1…8 之间，收到 {config!r}")
    return tuple(config)


def _check_reference_decode(where, q, k_cache, v_cache, cache_seqlens, softmax_scale):
    """两个参考实现（主机上逐个序列算）的输入：任意浮点 dtype；cache_seqlens 的值要在 n…S_max 里（读它）。"""
    for name, t, dims in (("q", q, (3, 4)), ("k_cache", k_cache, (4,)), ("v_cache", v_cache, (4,))):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}：{name} 必须是 torch.Tensor，收到 {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{where}：{name}.dtype 必须是浮点类型，收到 {t.dtype}")
        if t.dim() not in dims:
            raise ValueError(f"{where}：{name} 的维数必须是 {' 或 '.join(map(str, dims))}，收到形状 {tuple(t.shape)}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"{where}：k_cache、v_cache 的形状必须相同，收到 {tuple(k_cache.shape)} 和 "
                         f"{tuple(v_cache.shape)}")
    batch, n_new, hq, d = q.shape[0], (1 if q.dim() == 3 else q.shape[1]), q.shape[-2], q.shape[-1]
    _, s_max, hk, dk = k_cache.shape
    if k_cache.shape[0] != batch or dk != d or hk == 0 or hq % hk:
        raise ValueError(f"{where}：k_cache {tuple(k_cache.shape)} 和 q {tuple(q.shape)} 对不上（batch、head dim 相同，"
                         "q 的头数是 k_cache 的整数倍）")
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.is_floating_point() or cache_seqlens.is_complex():
        raise TypeError(f"{where}：cache_seqlens 必须是整数的 torch.Tensor，收到 "
                        f"{getattr(cache_seqlens, 'dtype', type(cache_seqlens).__name__)}")
    if tuple(cache_seqlens.shape) != (batch,):
        raise ValueError(f"{where}：cache_seqlens 的形状必须是 [B]=({batch},)，收到 {tuple(cache_seqlens.shape)}")
    if batch and not (n_new <= int(cache_seqlens.min()) and int(cache_seqlens.max()) <= s_max):
        raise ValueError(f"{where}：cache_seqlens 的每个值必须在 n…S_max = {n_new}…{s_max} 之间，收到 "
                         f"{cache_seqlens.tolist()[:8]}")
    return None if softmax_scale is None else _check_scale(softmax_scale, d, where)


def _check_make_decode_case(gen, batch, lengths, s_max, hq, hk, d, n_new, dtype, device):
    where = "make_decode_case"
    _check_gen(gen, where)
    batch, s_max = check_int("batch", batch, lo=1, where=where), check_int("s_max", s_max, lo=1, where=where)
    hq, hk = check_int("hq", hq, lo=1, where=where), check_int("hk", hk, lo=1, where=where)
    if hq % hk:
        raise ValueError(f"{where}：hq 必须是 hk 的整数倍（GQA/MQA），收到 hq={hq}、hk={hk}")
    d = check_int("d", d, lo=1, hi=MAX_HEAD_DIM, where=where)
    n_new = check_int("n_new", n_new, lo=1, where=where)
    if not isinstance(lengths, (list, tuple)):
        raise TypeError(f"{where}：lengths 必须是每个序列的有效长度的 list，收到 {type(lengths).__name__}")
    if len(lengths) != batch:
        raise ValueError(f"{where}：lengths 要有 batch = {batch} 个，收到 {len(lengths)} 个")
    for i, n in enumerate(lengths):
        check_int(f"lengths[{i}]", n, lo=n_new, hi=s_max, where=where)
    _check_float_dtype("dtype", dtype, where, _DTYPES)
    check_device("device", device, where=where)
    check_memory("batch × s_max × hk × d", 8 * 2 * batch * s_max * hk * d + 8 * batch * n_new * hq * d, where)


# ============================================================================
# 自检
# ============================================================================
def _selftest(seed=None):
    if torch.cuda.is_available() and not INTERPRET:
        print(f"flash_decode 自检：GPU（{torch.cuda.get_device_name()}），bf16/fp16，真实尺寸")
        for dtype in (torch.bfloat16, torch.float16):
            worst = check_decode("cuda", dtype, seed=seed)
            print(f"flash_decode 自检通过（GPU，{dtype}）：最大相对误差 {worst:.1e} ≤ 2 × SDPA 的误差")
        return
    if not INTERPRET:
        # 没有 GPU：以解释器模式重新运行自己（TRITON_INTERPRET 必须在定义内核之前设置）
        print("没有 CUDA：以 TRITON_INTERPRET=1 重新运行自检（解释器，小尺寸，fp32）")
        argv = [] if seed is None else ["--seed", str(seed)]
        rc = subprocess.call([sys.executable, os.path.abspath(__file__), *argv],
                             env=dict(os.environ, TRITON_INTERPRET="1"))
        if rc != 0:
            sys.exit(rc)
        return
    t0 = time.time()
    worst = check_decode("cpu", torch.float32, seed=seed)
    print(f"flash_decode 自检通过（解释器）：和 float64 参考的最大相对误差 {worst:.1e} < {CPU_TOL:.0e}，"
          f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="flash_decode 自检：和 float64 参考 reference_decode 比较")
    ap.add_argument("--seed", type=int, default=None, help="随机输入的种子（默认由时间决定，运行时会打印）")
    _selftest(**vars(ap.parse_args()))
