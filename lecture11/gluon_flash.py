"""
Gluon 版 FlashAttention-3 前向（Hopper / H200）：Triton 编译器替我们做掉的那几件事——TMA、mbarrier、异步 wgmma、
warp 专门化、两组 warpgroup 的乒乓调度——自己一件件写出来，每一件买到了多少速度？

FlashAttention-3 [S91] 的前向 = FA2 的在线 softmax 算法 + 三件 Hopper 专属的事：
  (1) 生产者/消费者异步：TMA 单元搬 K/V（不占线程）、专门的生产者 warp 只发 TMA，计算 warpgroup 只做 wgmma 和 softmax；
  (2) 乒乓调度（§3.1）：两个计算 warpgroup 轮流，一个做矩阵乘时另一个做 softmax
      （exp 在 MUFU 上慢，和 Tensor Core 错开）；
  (3) 组内重叠（§3.2）：先发第 j+1 块的 QK^T，再在它跑着的时候做第 j 块的 softmax。
本文件一个内核 _attn_fwd，用 constexpr 开关一步步加上去（variant= 选一步，基准表里一行一步）：
  "pipelined"  步骤 A：一个 warpgroup（4 warp），Q/K/V 用 TMA（张量描述符）读进共享内存，mbarrier 等数据，
               wgmma 异步发出；K/V 有 STAGES 份缓冲（软件流水：算第 j 块时第 j+1、j+2 块已经在路上）
  "ws"         步骤 B：gl.warp_specialize：1 个生产者 warp 填 K/V 环（ready / empty 两组 mbarrier），1 个计算 warpgroup
  "ws2"        步骤 C：两个计算 warpgroup 各算一个 Q 块（同一 (b, h) 的相邻两块），共用每一份 K/V（empty 计数 2）
  "overlap"    步骤 D1：ws2 + 组内重叠（FA3 §3.2）
  "pingpong"   步骤 D2：overlap + 两组之间用 mbarrier 轮流发矩阵乘（FA3 §3.1）= "best"
一份机制一份代码：softmax 更新 _softmax_step、掩码 _mask、收尾 _epilogue、消费者循环 _consumer、
生产者 _producer 各一个。

形状（flash-attn 布局）：q、k、v [B, N, H, d]（k、v 可以有更少的头 Hk | H：GQA），bf16 / fp16，d ∈ {64, 128}，
任意 N（最后一块不满时掩码），causal = 标准的左上角对齐（Nq = Nk）。out [B, N, H, d]，LSE [B, H, N]（自然对数，fp32）。
张量描述符：把连续的 q 看成二维 [B·N, H·d]，一个 Q 块 = 行 [b·N + m0, +BLOCK_M)、列 [h·d, +d)（行步长 H·d·2 字节，
16 字节对齐）。块跨过本序列末尾时读到下一个序列的行（或 TMA 补的 0）：key 列 ≥ N 一律掩成 −∞，多出的 Q 行不写回。
单位：TFLOP/s = 4·B·H·N²·d / 时间（causal 减半）。

运行（只在 Hopper GPU 上；没有 GPU 时打印一行 SKIP、退出码 77）：
  python3 lecture11/gluon_flash.py [--seed N]      每个 variant × d × causal × dtype × 不规则 N，和 float64 参考比
                                                   （flash-attn 的判据：误差 ≤ 2 × PyTorch 低精度注意力的误差）
  python3 lecture11/gluon_flash.py --bench --out DIR   和 triton_flash、SDPA（cuDNN、FLASH）比速度，
                                                       写 DIR/gluon_bench.json
依赖 torch、triton ≥ 3.6（triton.experimental.gluon；Gluon 的接口还在变，本文件按 3.6 写）。
"""
import argparse
import datetime
import functools
import itertools
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))
from course_utils import check_bool, check_choice  # noqa: E402

try:
    import torch
except ImportError:                 # 只编译内核（不运行）时可以没有 torch
    torch = None
try:
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    GLUON_ERROR = None
except Exception as exc:            # 没有 triton，或者 triton 太旧、没有 Gluon：模块照样能 import，attention() 报错
    triton = gluon = gl = None
    GLUON_ERROR = f"{type(exc).__name__}: {exc}"

VARIANTS = ("pipelined", "ws", "ws2", "overlap", "pingpong")
BEST = "ws2"          # 实测最快的一步（results/gluon_explore.json）：后两步在 Gluon 3.6 里没有再变快
HEAD_DIMS = (64, 128)
LOG2E = math.log2(math.e)


# ============================================================================
# 每个 variant 打开哪些开关（步骤 A → D2，每一步只多一件事）
#   WS         生产者 warp + 计算 warpgroup（否则一个 warpgroup 自己发 TMA、自己算）
#   CONSUMERS  计算 warpgroup 的个数（每个算一个 BLOCK_M 行的 Q 块）
#   OVERLAP    组内重叠：QK^T_j 和 P_{j-1}V_{j-1} 一起发出后，只等 QK^T_j 就开始 softmax
#   PINGPONG   两个 warpgroup 轮流发矩阵乘
# ============================================================================
FLAGS = {
    "pipelined": dict(WS=False, CONSUMERS=1, OVERLAP=False, PINGPONG=False),
    "ws": dict(WS=True, CONSUMERS=1, OVERLAP=False, PINGPONG=False),
    "ws2": dict(WS=True, CONSUMERS=2, OVERLAP=False, PINGPONG=False),
    "overlap": dict(WS=True, CONSUMERS=2, OVERLAP=True, PINGPONG=False),
    "pingpong": dict(WS=True, CONSUMERS=2, OVERLAP=True, PINGPONG=True),
}


def tile_config(variant, d):
    """
    (BLOCK_M, BLOCK_N, STAGES, num_warps, maxnreg, worker_regs)。BLOCK_M 是每个计算 warpgroup 的 Q 行数。
    寄存器账（每线程，128 线程的 warpgroup）：O 累加器 BLOCK_M·d/128 个 fp32，S 是 BLOCK_M·BLOCK_N/128，
    P（16 位，两个一包）再一半，外加 softmax 的临时量。下面每一组都用 triton 3.6 为 sm_90 编译、ptxas -v 看过：
    没有溢出（spill 0 字节）。溢出过的组合：一个 warpgroup 128 × 128（d = 64：376 字节）、128 × 64（d = 128：92 字节）；
    两个计算组时 128 × 64（d = 128：148 字节）——FA3 的 CUTLASS 内核能用 128 行，Triton 生成的 softmax 多占寄存器。
    共享内存（H200 每块 ≤ 227 KiB）：Q CONSUMERS·BLOCK_M·d·2 字节 + STAGES·2·BLOCK_N·d·2 字节。
    寄存器重分配（FA3 的 setmaxnreg）：gl.warp_specialize 的 worker_num_regs 给每个 worker 分区定寄存器数，
    默认分区拿剩下的（按内核的 maxnreg 算）：3 个 warpgroup × 168 = 生产者 24 + 两个计算组各 240（生产者那 1 个 warp
    也占一整个 warpgroup 的寄存器，分配以 warpgroup 为单位）。
    步骤 A（没有生产者分区）至少 3 级：第 j 轮发的 TMA 放进第 j − 2 块的格子。
    """
    f = FLAGS[variant]
    if not f["WS"]:
        return (128, 64, 3, 4, None, ()) if d == 64 else (64, 128, 3, 4, None, ())
    if f["CONSUMERS"] == 1:                       # 默认分区 4 warp + 生产者 1 warp（按 warpgroup 算：8 warp）
        return (128, 64, 4, 4, 232, (24,)) if d == 64 else (64, 64, 4, 4, 232, (24,))
    # worker 顺序：计算组 1（4 warp）、生产者（1 warp）
    # 块大小按 --explore 的实测（results/gluon_explore.json）：d = 128 时 BLOCK_N 128 × 3 级比 64 × 4 级快 10–25%
    return (64, 128, 4, 4, 168, (240, 24)) if d == 64 else (64, 128, 3, 4, 168, (240, 24))


if gl is not None:
    # ========================================================================
    # 内核的小零件：掩码、一步在线 softmax、收尾
    # ========================================================================
    @gluon.jit
    def _mask(s, m0, n0, N, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
        """s [BLOCK_M, BLOCK_N]（mma 布局）：key 列 ≥ N 或（causal）列 > 行 → −∞。只在边上的块调用。"""
        rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s.type.layout))
        cols = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s.type.layout))
        ok = gl.expand_dims(cols < N, 0) & gl.expand_dims(rows >= 0, 1)
        if CAUSAL:
            ok = ok & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1))
        return gl.where(ok, s, float("-inf"))

    @gluon.jit
    def _softmax_step(s, m_i, l_i, qk_scale):
        """
        在线 softmax 的一步（以 2 为底：qk_scale = softmax_scale·log2 e 已经乘进去，
        exp2(s·c − m) 是一条 FMA + 一条 MUFU）。
        s [BLOCK_M, BLOCK_N] fp32；m_i、l_i [BLOCK_M]（以 2 为底的行最大值、行和）。
        返回 p（未归一化的概率）、新的 m、l，和旧累加器要乘的 alpha = 2^(m_old − m_new)。
        """
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        alpha = gl.exp2(m_i - m_new)                                        # 第一块：2^(−∞) = 0
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
        l_new = l_i * alpha + gl.sum(p, axis=1)
        return p, m_new, l_new, alpha

    @gluon.jit
    def _epilogue(acc, m_i, l_i, O, LSE, b, h, m0, N, H, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                  RETURN_LSE: gl.constexpr):
        """O = acc / l 写回 out[b, m0 + i, h, :]（只写 < N 的行）；LSE = (m + log2 l)·ln 2 写回 lse[b, h, m0 + i]。"""
        layout: gl.constexpr = acc.type.layout
        rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
        o = acc / gl.expand_dims(l_i, 1)
        row_off = ((b * N + rows).to(gl.int64) * H + h) * HEAD_DIM           # out 连续：[B, N, H, d]
        ptrs = O + gl.expand_dims(row_off, 1) + gl.expand_dims(cols, 0)
        gl.store(ptrs, o.to(O.dtype.element_ty), mask=gl.expand_dims(rows < N, 1))
        if RETURN_LSE:
            lse_rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
            lse = (m_i + gl.log2(l_i)) * 0.6931471805599453                  # 以 2 为底 → 自然对数
            gl.store(LSE + (b * H + h).to(gl.int64) * N + lse_rows, lse, mask=lse_rows < N)

    # ========================================================================
    # K/V 环：第 j 块放在第 j % STAGES 格；第 j 块是这一格的第 j // STAGES 次使用，mbarrier 的相位 = 使用次数的奇偶
    #   ready[s]：生产者 expect(字节数) + 两次 TMA，数据到齐时完成一个相位；消费者 wait(ready[s], (j // STAGES) & 1)
    #   empty[s]：消费者用完后 arrive（计数 = 计算 warpgroup 的个数）；生产者在第 u 次填这一格前等第 u − 1 次用完：
    #             wait(empty[s], ((j // STAGES) & 1) ^ 1)——新初始化的 mbarrier 等"相位 1"立即返回，所以第一圈不等
    # ========================================================================
    @gluon.jit
    def _load_kv(k_desc, v_desc, k_bufs, v_bufs, ready, j, kv_row0, kv_col, pred, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr):
        """把第 j 块 K、V（各 [BLOCK_N, d]）用 TMA 读进第 j % STAGES 格；两次拷贝的字节到齐时 ready 完成。"""
        slot = j % STAGES
        bar = ready.index(slot)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(k_desc, [kv_row0 + j * BLOCK_N, kv_col], bar, k_bufs.index(slot), pred=pred)
        tma.async_copy_global_to_shared(v_desc, [kv_row0 + j * BLOCK_N, kv_col], bar, v_bufs.index(slot), pred=pred)

    @gluon.jit
    def _producer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, q_row, q_col, kv_row0, kv_col,
                  n_total, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CONSUMERS: gl.constexpr):
        """生产者分区（1 个 warp）：先发 Q 块，再按顺序填 K/V 环，每格等它上一次的使用者都 arrive 了 empty。"""
        for c in gl.static_range(CONSUMERS):
            mbarrier.expect(q_bar.index(c), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [q_row + c * BLOCK_M, q_col], q_bar.index(c), q_smem.index(c))
        for j in range(n_total):
            mbarrier.wait(empty.index(j % STAGES), ((j // STAGES) & 1) ^ 1)
            _load_kv(k_desc, v_desc, k_bufs, v_bufs, ready, j, kv_row0, kv_col, True, BLOCK_N, STAGES)

    @gluon.jit
    def _issue(turn, me: gl.constexpr, r, PINGPONG: gl.constexpr):
        """乒乓：第 r 次发矩阵乘之前等轮到自己（turn[me] 的第 r 个相位；0 号的第一个相位由内核开头预先 arrive）。"""
        if PINGPONG:
            mbarrier.wait(turn.index(me), r & 1)

    @gluon.jit
    def _pass(turn, me: gl.constexpr, PINGPONG: gl.constexpr):
        """乒乓：矩阵乘发出去了，把发射权交给另一组（它的 softmax 由此和我们的矩阵乘重叠）。"""
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - me))

    # ========================================================================
    # 计算 warpgroup：一个 Q 块 [BLOCK_M, d] 走过它看得到的 n_blocks 个 K/V 块。FA3 的顺序（§3.2 的算法 2）：
    #   第 0 轮：S_0 = Q K_0^T → softmax → P_0
    #   第 j 轮：发 S_j = Q K_j^T 和 O += P_{j-1} V_{j-1}（两个异步 wgmma）
    #           → 等 S_j → softmax_j → 等 O → 放回第 j−1 块 → O *= alpha
    #   收尾轮：O += P_{n-1} V_{n-1}
    #   OVERLAP=False 时"等 S_j"等的是两个矩阵乘都完（wait 0），softmax 不和 PV 重叠；OVERLAP=True 时只等 S_j
    #   （wgmma 按发出顺序完成：还剩 ≤ 1 个在飞 = S_j 已好），softmax_j 和 P_{j-1}V_{j-1} 同时跑。
    #   ws2 的 causal：两组的块数不同，下面那组多走几轮"空轮"（等 ready、arrive empty、交出发射权），
    #   因为 empty 要两组都 arrive 才完成，乒乓也要两组轮数相同。
    #   PRODUCE=True（步骤 A，没有生产者分区）：第 j 轮自己发第 j + STAGES − 2 块的 TMA，放进第 j − 2 块的格子
    #   （它的 PV 在第 j − 1 轮已经等完了）；开头预先发 STAGES − 1 块。
    # ========================================================================
    @gluon.jit
    def _consumer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, turn, O, LSE, qk_scale,
                  b, h, m0, N, H, q_row, q_col, kv_row0, kv_col, n_blocks, n_total,
                  me: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr, CAUSAL: gl.constexpr, PRODUCE: gl.constexpr, OVERLAP: gl.constexpr,
                  PINGPONG: gl.constexpr, RETURN_LSE: gl.constexpr):
        # wgmma 的累加器布局：4 个 warp 沿行排（每个 warp 16 行一份），一条指令算 [16·4, N] × K=16
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        # P 留在寄存器里当 A 操作数（FA3 的 RS-GEMM：不经过共享内存）；16 位数 k_width = 2
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        dtype: gl.constexpr = q_desc.dtype
        q_tile = q_smem.index(me)                                            # [BLOCK_M, d]
        if PRODUCE:
            mbarrier.expect(q_bar.index(0), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [q_row, q_col], q_bar.index(0), q_tile)
            for j in gl.static_range(STAGES - 1):
                _load_kv(k_desc, v_desc, k_bufs, v_bufs, ready, j, kv_row0, kv_col, j < n_total, BLOCK_N, STAGES)
        mbarrier.wait(q_bar.index(me), 0)

        # 第 0 轮：S_0 = Q K_0^T（K 块 [BLOCK_N, d] 的转置视图 [d, BLOCK_N] 当 B 操作数）
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        mbarrier.wait(ready.index(0), 0)
        _issue(turn, me, 0, PINGPONG)
        s_tok = warpgroup_mma(q_tile, k_bufs.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        _pass(turn, me, PINGPONG)
        s = warpgroup_mma_wait(0, deps=[s_tok, q_tile, k_bufs.index(0)])[0]
        s = _mask(s, m0, 0, N, CAUSAL, BLOCK_M, BLOCK_N)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale)
        acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)

        # 只有"边上的块"要掩码：含列 ≥ N 的最后一块，causal 时还有碰到对角线的块（列 > 块里最小的行 m0）
        first_masked = N // BLOCK_N
        if CAUSAL:
            first_masked = gl.minimum(first_masked, m0 // BLOCK_N)
        for j in range(1, n_blocks):
            slot = j % STAGES
            prev = (j - 1) % STAGES
            if PRODUCE:
                _load_kv(k_desc, v_desc, k_bufs, v_bufs, ready, j + STAGES - 2, kv_row0, kv_col,
                         j + STAGES - 2 < n_total, BLOCK_N, STAGES)
            mbarrier.wait(ready.index(slot), (j // STAGES) & 1)
            p_op = gl.convert_layout(p.to(dtype), p_layout)                 # [BLOCK_M, BLOCK_N]，A 操作数布局
            _issue(turn, me, j, PINGPONG)
            s_tok = warpgroup_mma(q_tile, k_bufs.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            o_tok = warpgroup_mma(p_op, v_bufs.index(prev), acc, is_async=True)
            _pass(turn, me, PINGPONG)
            s = warpgroup_mma_wait(1 if OVERLAP else 0, deps=[s_tok, q_tile, k_bufs.index(slot)])[0]
            if j >= first_masked:
                s = _mask(s, m0, j * BLOCK_N, N, CAUSAL, BLOCK_M, BLOCK_N)
            p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale)
            acc = warpgroup_mma_wait(0, deps=[o_tok, p_op, v_bufs.index(prev)])[0]
            if not PRODUCE:
                mbarrier.arrive(empty.index(prev))                            # 第 j−1 块（K 和 V）用完了
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)

        # 收尾轮：最后一块的 PV
        last = (n_blocks - 1) % STAGES
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        _issue(turn, me, n_blocks, PINGPONG)
        o_tok = warpgroup_mma(p_op, v_bufs.index(last), acc, is_async=True)
        _pass(turn, me, PINGPONG)
        acc = warpgroup_mma_wait(0, deps=[o_tok, p_op, v_bufs.index(last)])[0]
        if not PRODUCE:
            mbarrier.arrive(empty.index(last))
            # 空轮（只有 ws2 causal 的下面那组会走）：另一组还要用的块，等它到了就放回，发射权照常交出
            for j in range(n_blocks, n_total):
                mbarrier.wait(ready.index(j % STAGES), (j // STAGES) & 1)
                _issue(turn, me, j + 1, PINGPONG)
                _pass(turn, me, PINGPONG)
                mbarrier.arrive(empty.index(j % STAGES))
        m_o = gl.convert_layout(m_i, gl.SliceLayout(1, o_layout))
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
        _epilogue(acc, m_o, l_o, O, LSE, b, h, m0, N, H, HEAD_DIM, BLOCK_M, RETURN_LSE)

    # ========================================================================
    # 内核：program (i, b·H + h) 负责第 b 个序列、第 h 个头的 CONSUMERS 个相邻 Q 块
    #   （行 [i·CONSUMERS·BLOCK_M, +CONSUMERS·BLOCK_M)）
    # ========================================================================
    @gluon.jit
    def _attn_fwd(q_desc, k_desc, v_desc, O, LSE, qk_scale, N, H, GROUP,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr, WS: gl.constexpr, CONSUMERS: gl.constexpr, OVERLAP: gl.constexpr,
                  PINGPONG: gl.constexpr, RETURN_LSE: gl.constexpr):
        pid_m = gl.num_programs(0) - 1 - gl.program_id(0)     # 倒序发：causal 时最长的 Q 块先上 SM
        bh = gl.program_id(1)
        b = bh // H
        h = bh % H
        m0 = pid_m * (CONSUMERS * BLOCK_M)
        q_row = b * N + m0                      # 二维视图 [B·N, H·d] 里的行、列
        q_col = h * HEAD_DIM
        kv_row0 = b * N
        kv_col = (h // GROUP) * HEAD_DIM        # GQA：GROUP 个 query 头共用一个 K/V 头

        # 每组要走的 K/V 块数：causal 只到自己最后一行（左上角对齐），非 causal 全部
        n_all = gl.cdiv(N, BLOCK_N)
        n_blocks0 = n_all
        n_blocks1 = n_all
        if CAUSAL:
            n_blocks0 = gl.cdiv(gl.minimum(m0 + BLOCK_M, N), BLOCK_N)
            n_blocks1 = gl.cdiv(gl.minimum(m0 + CONSUMERS * BLOCK_M, N), BLOCK_N)
        n_total = n_blocks1                       # 生产者搬的块数 = 上面那组要的块数

        # 共享内存：Q [CONSUMERS, BLOCK_M, d]，K、V 环 [STAGES, BLOCK_N, d]
        # 布局 = 描述符的 NVMMA 布局（TMA 写、wgmma 读）
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, BLOCK_M, HEAD_DIM], q_desc.layout)
        k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(CONSUMERS):
            mbarrier.init(q_bar.index(c), count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=CONSUMERS)     # 一格要所有计算组都用完才能重填
        for c in gl.static_range(2):
            mbarrier.init(turn.index(c), count=1)
        fence_async_shared()                                   # 初始化对 TMA（异步代理）可见
        if PINGPONG:
            mbarrier.arrive(turn.index(0))                     # 0 号组先发

        if WS:
            # 赋给变量的元组里，constexpr 会变成 int32 张量；worker 的参数元组也不能用 + 拼：worker 的参数整个写在调用处
            io = (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, turn, O, LSE, qk_scale, b, h)
            if CONSUMERS == 1:
                gl.warp_specialize([
                    (_consumer, io + (m0, N, H, q_row, q_col, kv_row0, kv_col, n_blocks0, n_total, gl.constexpr(0),
                                      HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, gl.constexpr(False), OVERLAP,
                                      PINGPONG, RETURN_LSE)),
                    (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, q_row, q_col,
                                 kv_row0, kv_col, n_total, BLOCK_M, BLOCK_N, STAGES, CONSUMERS)),
                ], [1], [24])
            else:                                   # 默认分区 = 计算组 0；worker = 计算组 1（4 warp）、生产者（1 warp）
                gl.warp_specialize([
                    (_consumer, io + (m0, N, H, q_row, q_col, kv_row0, kv_col, n_blocks0, n_total, gl.constexpr(0),
                                      HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, gl.constexpr(False), OVERLAP,
                                      PINGPONG, RETURN_LSE)),
                    (_consumer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, turn, O, LSE,
                                 qk_scale, b, h, m0 + BLOCK_M, N, H, q_row + BLOCK_M, q_col, kv_row0, kv_col, n_blocks1,
                                 n_total,
                                      gl.constexpr(1), HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL,
                                      gl.constexpr(False), OVERLAP, PINGPONG, RETURN_LSE)),
                    (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, q_row, q_col,
                                 kv_row0, kv_col, n_total, BLOCK_M, BLOCK_N, STAGES, CONSUMERS)),
                ], [4, 1], [240, 24])
        else:
            _consumer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, turn, O, LSE, qk_scale,
                      b, h, m0, N, H, q_row, q_col, kv_row0, kv_col, n_blocks0, n_total,
                      0, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, True, OVERLAP, PINGPONG, RETURN_LSE)


# ============================================================================
# 主机端：检查参数 → 描述符 → 启动。参数先查（CPU 上也能测），设备后查。
# ============================================================================
_GL_DTYPES = {}          # torch dtype → gluon dtype（第一次用时填）
_LAYOUTS = {}            # (block_shape, dtype) → NVMMASharedLayout：每组形状只算一次


def _check_args(q, k, v, causal, softmax_scale, variant, return_lse):
    """坏输入 → ValueError / TypeError，消息里有参数名和允许的取值。返回 (variant, scale)。"""
    check_bool("causal", causal, where="attention")
    check_bool("return_lse", return_lse, where="attention")
    variant = check_choice("variant", variant, ("best",) + VARIANTS, where="attention")
    variant = BEST if variant == "best" else variant
    if torch is None:
        raise RuntimeError(f"attention 需要 torch（{GLUON_ERROR or '没有安装 torch'}）")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention：{name} 必须是 torch.Tensor，收到 {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"attention：{name} 必须是 4 维 [B, N, H, d]，收到形状 {tuple(t.shape)}")
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"attention：{name} 的 dtype 只能是 torch.bfloat16 / torch.float16，收到 {t.dtype}")
    batch, n, hq, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"attention：k、v 的形状必须相同，收到 {tuple(k.shape)} 和 {tuple(v.shape)}")
    if k.shape[0] != batch or k.shape[1] != n or k.shape[3] != d:
        raise ValueError(f"attention：k、v 必须是 [B, N, Hk, d]，B、N、d 和 q 相同"
                         f"（q {tuple(q.shape)}，k {tuple(k.shape)}）")
    if d not in HEAD_DIMS:
        raise ValueError(f"attention：头维 d 只能是 {' / '.join(map(str, HEAD_DIMS))}，收到 {d}")
    if k.shape[2] < 1 or hq % k.shape[2] != 0:
        raise ValueError(f"attention：q 的头数 {hq} 必须是 k、v 头数 {k.shape[2]} 的整数倍（GQA）")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"attention：q、k、v 的 dtype 必须相同，收到 {q.dtype}、{k.dtype}、{v.dtype}")
    if n < 1 or batch < 1:
        raise ValueError(f"attention：B、N 必须 ≥ 1，收到 B={batch}、N={n}")
    if softmax_scale is None:
        scale = 1.0 / math.sqrt(d)
    elif isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) \
            or not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"attention：softmax_scale 必须是 None 或有限的正数，收到 {softmax_scale!r}")
    else:
        scale = float(softmax_scale)
    return variant, scale


def _check_device(q, k, v):
    if GLUON_ERROR is not None:
        raise RuntimeError(f"attention 需要 triton ≥ 3.6 的 Gluon（triton.experimental.gluon）：{GLUON_ERROR}")
    if not torch.cuda.is_available():
        raise RuntimeError("attention 需要 CUDA GPU（Hopper，sm_90，如 H100 / H200）：这台机器没有 CUDA")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_cuda or t.device != q.device:
            raise RuntimeError(f"attention：{name} 必须在和 q 同一块 CUDA GPU 上，收到 {t.device}")
    major, minor = torch.cuda.get_device_capability(q.device)
    if major != 9:
        raise RuntimeError(f"attention：本内核只为 Hopper（sm_90）写（wgmma、setmaxnreg），"
                           f"这块 GPU 是 sm_{major}{minor}")


def _layout(block, dtype):
    key = (tuple(block), dtype)
    if key not in _LAYOUTS:
        if not _GL_DTYPES:
            _GL_DTYPES.update({torch.bfloat16: gl.bfloat16, torch.float16: gl.float16})
        _LAYOUTS[key] = gl.NVMMASharedLayout.get_default_for(list(block), _GL_DTYPES[dtype])
    return _LAYOUTS[key]


def _desc(t2d, block):
    """t2d [B·N, H·d] 连续 → 块 block 的 TMA 描述符（基址 16 字节对齐、行步长 H·d·2 字节是 16 的倍数）。"""
    return TensorDescriptor.from_tensor(t2d, list(block), _layout(block, t2d.dtype))


def attention(q, k, v, causal=False, softmax_scale=None, variant="best", return_lse=False):
    """
    q [B, N, H, d]，k、v [B, N, Hk, d]（Hk | H）→ out [B, N, H, d]
    （return_lse 时再返回 lse [B, H, N]，自然对数，fp32）。
    variant：'pipelined' / 'ws' / 'ws2' / 'overlap' / 'pingpong'（= 'best'），见文件开头。
    主机端不同步：只做形状检查、建描述符、启动一次内核。
    """
    variant, scale = _check_args(q, k, v, causal, softmax_scale, variant, return_lse)
    _check_device(q, k, v)
    return _launch(q, k, v, causal, scale, variant, return_lse)


def _launch(q, k, v, causal, scale, variant, return_lse, tiles=None):
    """检查过的输入 → 启动。tiles = (BLOCK_N, STAGES) 时换掉 tile_config 的这两项（--explore 扫配置用）。"""
    batch, n, hq, d = q.shape
    hk = k.shape[2]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    block_m, block_n, stages, num_warps, maxnreg, _ = tile_config(variant, d)
    if tiles is not None:
        block_n, stages = tiles
    f = FLAGS[variant]
    out = torch.empty_like(q)                                                 # [B, N, H, d]
    lse = torch.empty((batch, hq, n), device=q.device, dtype=torch.float32) if return_lse else out
    q_desc = _desc(q.view(batch * n, hq * d), (block_m, d))                  # [B·N, H·d]，块 [BLOCK_M, d]
    k_desc = _desc(k.view(batch * n, hk * d), (block_n, d))                  # [B·N, Hk·d]，块 [BLOCK_N, d]
    v_desc = _desc(v.view(batch * n, hk * d), (block_n, d))
    grid = (triton.cdiv(n, f["CONSUMERS"] * block_m), batch * hq)
    extra = {} if maxnreg is None else {"maxnreg": maxnreg}
    _attn_fwd[grid](q_desc, k_desc, v_desc, out, lse, scale * LOG2E, n, hq, hq // hk,
                    HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal,
                    RETURN_LSE=return_lse, num_warps=num_warps, **f, **extra)
    return (out, lse) if return_lse else out


# ============================================================================
# GPU 自检：flash-attn 的判据（和 triton_flash.check_gpu 同一个）
#   ‖ours − ref64‖/‖ref64‖ ≤ 2 × ‖torch低精度 − ref64‖/‖ref64‖ + 1e-6；LSE 用最大绝对误差，同样 ≤ 2 × torch 的 + 1e-6
# ============================================================================
def _triton_flash():
    """lecture11/triton_flash.py：float64 参考 reference_attention、误差函数、基准里对照的 flash_attn_func。"""
    import triton_flash
    return triton_flash


SELFTEST_SHAPES = (   # (B, N, H, Hk)：不规则的 N（1、不满一块、跨几块、多出一行），B/H 也不规则
    (1, 1, 2, 2), (2, 77, 3, 3), (1, 1000, 4, 2), (1, 4097, 2, 1), (3, 384, 2, 2),
)


def check_gpu(seed, variants=VARIANTS, dtypes=None, shapes=SELFTEST_SHAPES):
    tf = _triton_flash()
    dtypes = dtypes or (torch.bfloat16, torch.float16)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rows = []
    for dtype in dtypes:
        for (batch, n, hq, hk), d, causal in ((s, d, c) for s in shapes for d in HEAD_DIMS for c in (False, True)):
            q = torch.randn(batch, n, hq, d, device="cuda", dtype=dtype, generator=gen)
            k = torch.randn(batch, n, hk, d, device="cuda", dtype=dtype, generator=gen)
            v = torch.randn(batch, n, hk, d, device="cuda", dtype=dtype, generator=gen)
            ref_o, ref_l = tf.reference_attention(q, k, v, causal=causal)                       # float64
            low_o, low_l = tf.reference_attention(q, k, v, causal=causal, dtype=dtype)          # torch 低精度
            t_o, t_l = tf._rel_err(low_o, ref_o), tf._lse_err(low_l, ref_l)
            for variant in variants:
                name = f"B{batch} N{n} H{hq}/{hk} d{d}{' causal' if causal else ''}"
                try:
                    out, lse = attention(q, k, v, causal=causal, variant=variant, return_lse=True)
                    e_o, e_l = tf._rel_err(out, ref_o), tf._lse_err(lse, ref_l)
                    err = ""
                except Exception as exc:                 # 编译 / 运行失败也记一行，接着测别的
                    e_o = e_l = float("inf")
                    err = _short(exc)
                ok = e_o <= 2 * t_o + 1e-6 and e_l <= 2 * t_l + 1e-6
                rows.append((str(dtype).replace("torch.", ""), variant, name, e_o, t_o, e_l, t_l, ok, err))
    return rows


def _selftest(seed=None):
    if torch is None or not torch.cuda.is_available():
        print("SKIP: 没有 CUDA GPU（本文件的内核只在 Hopper 上跑：wgmma、TMA、setmaxnreg）")
        sys.exit(77)
    if GLUON_ERROR is not None:
        print(f"SKIP: 这个 triton 没有可用的 Gluon（需要 triton ≥ 3.6）：{GLUON_ERROR}")
        sys.exit(77)
    if torch.cuda.get_device_capability()[0] != 9:
        print(f"SKIP: 本内核只为 Hopper（sm_90）写，这块 GPU 是 {torch.cuda.get_device_name()}")
        sys.exit(77)
    seed = int(time.time()) % 100000 if seed is None else seed
    print(f"gluon_flash 自检：{torch.cuda.get_device_name()}，torch {torch.__version__}，triton {triton.__version__}，"
          f"种子 {seed}（复现：python3 lecture11/gluon_flash.py --seed {seed}）")
    t0 = time.time()
    rows = check_gpu(seed)
    print(f"  {'dtype':<9s}{'variant':<11s}{'case':<26s}{'out':>10s}{'torch':>10s}{'lse':>10s}{'torch':>10s}  ok")
    for dt, var, name, e_o, t_o, e_l, t_l, ok, err in rows:
        print(f"  {dt:<9s}{var:<11s}{name:<26s}{e_o:>10.2e}{t_o:>10.2e}{e_l:>10.2e}{t_l:>10.2e}  "
              f"{'✓' if ok else '✗'} {err}")
    failed = [r for r in rows if not r[7]]
    if failed:
        print(f"gluon_flash 自检失败：{len(failed)} / {len(rows)} 项（种子 {seed}）")
        sys.exit(1)
    print(f"gluon_flash 自检通过：{len(rows)} 项误差都 ≤ 2 × PyTorch 低精度注意力的误差，{time.time() - t0:.0f} s")


# ============================================================================
# 基准：每个 variant 和 triton_flash.flash_attn_func、SDPA（cuDNN、FLASH）比；B·N = 32768 个 token，H·d = 2048
# ============================================================================
BENCH_NS = (1024, 4096, 16384)


def _tflops(batch, heads, n, d, causal, ms):
    flops = 4.0 * batch * heads * n * n * d / (2 if causal else 1)
    return flops / (ms * 1e-3) / 1e12


def _sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = getattr(SDPBackend, backend)

    def run(q, k, v, causal):
        with sdpa_kernel(be):                                                 # SDPA 要 [B, H, N, d]
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)
    return run


def _gluon_impl(variant, q, k, v, causal):
    return attention(q, k, v, causal=causal, variant=variant)


def _short(exc):
    """异常 → 一行（表里放得下）。"""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:100] if text else ''}"


def bench(out_dir):
    from triton.testing import do_bench
    tf = _triton_flash()
    quick_launch = tf.Launch(autotune=False)                                 # 固定配置：不花时间调优
    impls = {f"gluon:{var}": functools.partial(_gluon_impl, var) for var in VARIANTS}
    impls["triton_flash"] = lambda q, k, v, c: tf.flash_attn_func(q, k, v, causal=c, launch=quick_launch)
    impls["sdpa:cudnn"] = _sdpa("CUDNN_ATTENTION")
    impls["sdpa:flash"] = _sdpa("FLASH_ATTENTION")
    results, t_start = [], time.time()
    for d in HEAD_DIMS:
        for n in BENCH_NS:
            batch, heads = 32768 // n, 2048 // d
            q, k, v = (torch.randn(batch, n, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for causal in (False, True):
                row = {"d": d, "N": n, "B": batch, "H": heads, "causal": causal, "tflops": {}, "errors": {}}
                for name, fn in impls.items():
                    try:
                        ms = do_bench(functools.partial(fn, q, k, v, causal), warmup=5, rep=20)
                        row["tflops"][name] = _tflops(batch, heads, n, d, causal, ms)
                    except Exception as exc:
                        row["errors"][name] = _short(exc)
                results.append(row)
                _print_row(row, first=len(results) == 1)
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": datetime.datetime.now().isoformat(timespec="seconds"), "dtype": "bfloat16",
            "tokens": 32768, "hidden": 2048, "seconds": round(time.time() - t_start, 1),
            "tiles": {v: {d: tile_config(v, d)[:5] for d in HEAD_DIMS} for v in VARIANTS}, "rows": results}
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "gluon_bench.json")
    with open(path, "w") as fh:
        json.dump(info, fh, indent=1, ensure_ascii=False)
    print(f"写好 {path}（{info['seconds']} s）")


EXPLORE_TILES = {64: ((128, 2), (128, 3), (128, 4), (64, 4)), 128: ((64, 4), (128, 2), (128, 3))}
EXPLORE_VARIANTS = ("ws2", "overlap", "pingpong")


def explore(out_dir, ns=(4096, 16384), variants=EXPLORE_VARIANTS, name="gluon_explore.json"):
    """调参：计算组两个的 variant × (BLOCK_N, STAGES) 在 N = 4k、16k 上的 TFLOP/s（BLOCK_M 固定 64 行 / 组），
    写 DIR/gluon_explore.json。tile_config 里的选择来自这张表。"""
    from triton.testing import do_bench
    rows, t_start = [], time.time()
    for d in HEAD_DIMS:
        for n in ns:
            batch, heads = 32768 // n, 2048 // d
            q, k, v = (torch.randn(batch, n, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            grid = [(v_, t) for v_ in variants for t in (EXPLORE_TILES[d] if v_ in EXPLORE_VARIANTS
                                                          else (tile_config(v_, d)[1:3],))]
            for causal, (variant, tiles) in itertools.product((False, True), grid):
                row = dict(d=d, N=n, causal=causal, variant=variant, block_n=tiles[0], stages=tiles[1])
                try:
                    ms = do_bench(functools.partial(_launch, q, k, v, causal, d ** -0.5, variant, False, tiles),
                                  warmup=5, rep=20)
                    row["tflops"] = _tflops(batch, heads, n, d, causal, ms)
                except Exception as exc:
                    row["error"] = _short(exc)
                rows.append(row)
                print(f"  d={d:<4d}N={n:<6d}causal={causal!s:<6s}{variant:<9s}BLOCK_N={tiles[0]:<4d}STAGES={tiles[1]}  "
                      + (f"{row['tflops']:6.1f} TFLOP/s" if "tflops" in row else row["error"]), flush=True)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path, "w") as fh:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "date": datetime.datetime.now().isoformat(timespec="seconds"),
                   "seconds": round(time.time() - t_start, 1), "rows": rows}, fh, indent=1)
    print(f"写好 {path}")


BENCH_COLS = tuple(f"gluon:{v}" for v in VARIANTS) + ("triton_flash", "sdpa:cudnn", "sdpa:flash")


def _print_row(row, first):
    """一行：TFLOP/s（括号里是 / cuDNN 的比值）；失败的写 ERR（原因在表后）。"""
    if first:
        print("TFLOP/s（bf16；括号 = / cuDNN）")
        print(f"{'d':>4s}{'N':>7s}{'causal':>7s}" + "".join(f"{c.split(':')[-1]:>16s}" for c in BENCH_COLS))
    ref = row["tflops"].get("sdpa:cudnn")
    cells = []
    for c in BENCH_COLS:
        t = row["tflops"].get(c)
        cells.append(f"{'ERR':>16s}" if t is None else f"{t:8.1f} ({t / ref:4.2f})" if ref else f"{t:16.1f}")
    print(f"{row['d']:>4d}{row['N']:>7d}{str(row['causal']):>7s}" + "".join(cells), flush=True)
    for name, err in row["errors"].items():
        print(f"      {name}: {err}")


def main(argv=None):
    ap = argparse.ArgumentParser(description="Gluon 版 FlashAttention-3 前向（Hopper）：自检 / 基准")
    ap.add_argument("--seed", type=int, default=None, help="自检的随机种子（默认按时间取，打印出来）")
    ap.add_argument("--bench", action="store_true", help="跑基准（代替自检）")
    ap.add_argument("--explore", action="store_true", help="扫计算组两个的 variant × (BLOCK_N, STAGES)（代替自检）")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="基准 JSON 写到哪个目录")
    args = ap.parse_args(argv)
    if not (args.bench or args.explore):
        _selftest(args.seed)
        return
    if torch is None or not torch.cuda.is_available() or GLUON_ERROR is not None:
        print("SKIP: 基准要 CUDA GPU 和 triton ≥ 3.6 的 Gluon")
        sys.exit(77)
    (explore if args.explore else bench)(args.out)


if __name__ == "__main__":
    main()
