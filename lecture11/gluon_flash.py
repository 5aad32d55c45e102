"""
Gluon 版 FlashAttention-3（Hopper / H200）：Triton 编译器替我们做掉的那几件事——TMA、mbarrier、异步 wgmma、
warp 专门化、两组 warpgroup 轮流——自己一件件写出来，每一件买到了多少速度？

FlashAttention-3 [S91] 的前向 = FA2 的在线 softmax + 三件 Hopper 专属的事：(1) 生产者/消费者异步（TMA 搬 K/V，
专门的生产者 warp 只发 TMA）；(2) 乒乓（§3.1）：两个计算 warpgroup 轮流，一个做 softmax 时另一个做矩阵乘；
(3) 组内重叠（§3.2）：先发第 j+1 块的 QKᵀ，再在它跑着的时候做第 j 块的 softmax。
一个内核 _attn_fwd，constexpr 开关一步步加上去（variant= 选一步）。H200 实测（bf16，B·N = 32k，d = 128，
N = 4k / 16k，TFLOP/s；cuDNN 690 / 625，bench/results/gluon_bench.json）：
  "pipelined" A：一个 warpgroup，TMA + mbarrier + 异步 wgmma，K/V 3 级缓冲              406 / 431
  "ws"        B：+ 1 个生产者 warp 填 K/V 环（ready / empty 两组 mbarrier），1 个计算组    362 / 384  慢了：一组自己的
              softmax 和矩阵乘还是串行的，生产者没有替它省下什么（TMA 本来就是异步的）
  "ws2"       C：两个计算组各算 64 行 Q，共用每一份 K/V（empty 计数 2）                 628 / 652  +55%：一组做 softmax
              时另一组的 wgmma 在跑（warp 调度器自己就交错开了），每块 K/V 读一次供 128 行用
  "overlap"   D1：C + 组内重叠                                                        612 / 607  没有再快：Tensor Core
              已经被另一组喂满，两块 S 同时活着还多占寄存器
  "pingpong"  D2：D1 + 两组用 mbarrier 轮流发矩阵乘                                    567 / 611  更慢：强制的轮流只
              多出等待（ncu：barrier 停顿）；C 里硬件自然形成的交错已经是乒乓想要的效果
  "persist"   E：C 做成持久内核：每个 SM 一个程序，按"长块先、蛇形"的静态顺序走一串 Q 块，下一个 Q 块在本块最后的
              PV 和写回时就读进来（q_empty）。N = 1k 的 C 每个程序只走 1–8 块 K/V，开头（mbarrier 初始化、等 Q）和
              收尾摊不开；E 把它们藏到前一个 Q 块后面（= "best"）。--explore（gluon_explore_1k_4k.json）：
              N = 1k 500 → 552，causal 333 → 409（+23%）；N = 4k 613 → 640，causal 533 → 536
Gluon 3.6 都写得出来：寄存器重分配（FA3 的 setmaxnreg）= gl.warp_specialize 的 worker_num_regs + 内核的 maxnreg；
轮流用 mbarrier（不需要 named barrier）。写不成 FA3 原样的：每组 128 行的 Q 块（d = 128 时 Gluon 生成的 softmax
多占寄存器，溢出 92–148 字节），所以每组 64 行。N = 1k 上 E 明显最快，更长时不慢于 C（best_variant）。
反向（attention_backward；输入要梯度时 attention() 自动走它）：一个程序拿住 128 行 K/V（两个计算组各 64 行），
Q、dO 块流过（同一套生产者 + 环），每对块 5 次矩阵乘（Sᵀ、dPᵀ、dV、dK、dQ）——triton_flash 默认的反向另开 dQ 内核，
共 7 次。H200、06 的基准（N ≥ 4k）：cuDNN 的 1.00–1.02×（d = 128）、0.93–1.01×（d = 64）。每一步买到的
（同一次运行里前后两版的比）：
  dQ 跨程序相加（fp32 累加器）：每组从寄存器原子加自己那份（v1）→ FA3 的做法：两组交换 dSᵀ（共享内存 + mbarrier），
      各算 dQ 的一半列，写进共享内存，用 TMA 的归约写回（cp.reduce.async.bulk.tensor；Gluon 3.6 的 Python 层没包装，
      _tma_reduce_add 直接调 IR 构造器）：L2 流量减半、溢出 828 / 872 → 192 / 352 字节（full / causal），
      d = 128 快 1.6–1.8×
  LSE、D：每轮从全局读再 convert_layout（经共享内存、要同步）→ 生产者用 TMA 和 Q、dO 一起读进同一格：
      d = 128 快 1.24–1.33×、d = 64 快 1.10–1.18×（ncu：Tensor Core 忙 49% → 64%，cuDNN 66%）
  d = 64 的 Q 块 64 → 128 行（bwd_tile_config）：每轮的矩阵乘大一倍，快 1.04–1.10×

形状（flash-attn 布局）：q、k、v [B, N, H, d]（Hk | H：GQA），bf16 / fp16，d ∈ {64, 128}，任意 N，causal = 左上角对齐
（Nq = Nk）。out [B, N, H, d]，LSE [B, H, N]（自然对数，fp32）。TMA 描述符把连续的 q 看成二维 [B·N, H·d]：一个 Q 块 =
行 [b·N + m0, +BLOCK_M)、列 [h·d, +d)；块跨过序列末尾读到的行被掩掉（key 列 ≥ N → −∞，多出的 Q 行不写回）。
运行（只在 Hopper 上；没有 GPU 时一行 SKIP、退出码 77）：
  python3 lecture11/gluon_flash.py [--seed N] [--only V ...]   每个 variant 和反向对照 float64 参考（flash-attn 判据）
  python3 lecture11/gluon_flash.py --bench --out DIR          前向的每一步 vs triton_flash、cuDNN、FLASH
                                                              （反向的对照在 bench/triton_bench.py 里，带 NaN 检查）
  python3 lecture11/gluon_flash.py --explore-bwd --out DIR    反向的块 × N × causal 对 cuDNN，bwd_tile_config 的出处
                                                              （→ DIR/gluon_bwd_explore.json；--ns 同 --explore）
  python3 lecture11/gluon_flash.py --explore --out DIR        扫 variant × (BLOCK_N, STAGES)，tile_config 的出处
                                                              （N = 4k、16k → DIR/gluon_explore.json；提交的那份
                                                              早于步骤 E，只有 C–D2）
  python3 lecture11/gluon_flash.py --explore --ns 1024 --variants pipelined ws ws2 overlap pingpong --out DIR
                                                              N = 1k 的 A–D2 → DIR/gluon_explore_1k.json
  python3 lecture11/gluon_flash.py --explore --ns 1024 4096 --variants pipelined ws2 persist --out DIR
                                                              E 对 A、C → DIR/gluon_explore_1k_4k.json
                                                              （best_variant 的出处；16k：--ns 16384 --variants
                                                              ws2 persist → gluon_explore_16k.json）
依赖 torch、triton ≥ 3.6（triton.experimental.gluon；Gluon 的接口还在变，本文件按 3.6 写）。
"""
import argparse
import functools
import itertools
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))
sys.path.insert(0, HERE)
from course_utils import check_bool, check_choice, check_int, check_real, gpu_meta  # noqa: E402
import flash_lab as fl  # noqa: E402  （基准的形状和 FLOP 算法；只依赖 numpy）

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
    from triton._C.libtriton import ir as _ir
    from triton.language.core import builtin as _builtin
    GLUON_ERROR = None
except Exception as exc:            # 没有 triton，或者 triton 太旧、没有 Gluon：模块照样能 import，attention() 报错
    triton = gluon = gl = None
    GLUON_ERROR = f"{type(exc).__name__}: {exc}"

VARIANTS = ("pipelined", "ws", "ws2", "overlap", "pingpong", "persist")
BEST = "persist"      # 实测：N = 1k 上明显最快，4k、16k 上不慢于 C（bench/results/gluon_explore_*.json，best_variant）
HEAD_DIMS = (64, 128)
LOG2E = math.log2(math.e)


# ============================================================================
# 每个 variant 打开哪些开关（步骤 A → D2，每一步只多一件事）
#   WS         生产者 warp + 计算 warpgroup（否则一个 warpgroup 自己发 TMA、自己算）
#   CONSUMERS  计算 warpgroup 的个数（每个算一个 BLOCK_M 行的 Q 块）
#   OVERLAP    组内重叠：QK^T_j 和 P_{j-1}V_{j-1} 一起发出后，只等 QK^T_j 就开始 softmax
#   PINGPONG   两个 warpgroup 轮流发矩阵乘
#   PERSIST    持久内核（步骤 E，在 C 上加）：每个 SM 一个程序，自己走过一串 Q 块（见 _tile_order）
# ============================================================================
_OFF = dict(OVERLAP=False, PINGPONG=False, PERSIST=False)
FLAGS = {
    "pipelined": dict(_OFF, WS=False, CONSUMERS=1),
    "ws": dict(_OFF, WS=True, CONSUMERS=1),
    "ws2": dict(_OFF, WS=True, CONSUMERS=2),
    "overlap": dict(_OFF, WS=True, CONSUMERS=2, OVERLAP=True),
    "pingpong": dict(_OFF, WS=True, CONSUMERS=2, OVERLAP=True, PINGPONG=True),
    "persist": dict(_OFF, WS=True, CONSUMERS=2, PERSIST=True),
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
    # 块大小按 --explore 的实测（bench/results/gluon_explore.json）：d = 128 时 BLOCK_N 128 × 3 级比 64 × 4 级快 10–25%
    # worker_regs 只是记账：内核 _attn_fwd 的 gl.warp_specialize 调用里写死了 [24] / [240, 24]（Gluon 要字面的列表），
    # 改这里就要改那里——tests/test_lecture11_gluon.py 对照两处
    # 持久内核 d = 64 用 3 级：和 4 级在 1k、4k 上差 ≤ 1.6%，16k 上快 3%（bench/results/gluon_explore_1k_4k.json、_16k.json）
    stages = 3 if d == 128 or f["PERSIST"] else 4
    return (64, 128, stages, 4, 168, (240, 24))


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
    def _load_kv(k_desc, v_desc, k_bufs, v_bufs, ready, i, j, kv_row0, kv_col, pred, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr):
        """
        把第 j 块 K、V（各 [BLOCK_N, d]）用 TMA 读进环的第 i % STAGES 格；两次拷贝的字节到齐时 ready 完成。
        i = 这是环上的第几块（持久内核里跨 Q 块往下数），j = 这个 Q 块要的第几块 K/V；不持久时 i = j。
        """
        slot = i % STAGES
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
            _load_kv(k_desc, v_desc, k_bufs, v_bufs, ready, j, j, kv_row0, kv_col, True, BLOCK_N, STAGES)

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
    #   持久内核（步骤 E）一个程序连着算好几个 Q 块：环接着往下转，第 j 块在环上是第 base + j 块（base = 之前各
    #   Q 块的块数之和），Q 的 mbarrier 每个 Q 块完成一个相位（q_phase）；最后一次 QKᵀ 等完就 arrive q_empty，
    #   生产者这时就能把下一个 Q 块读进同一格——读 Q 的延迟藏在最后一次 PV 和写回后面。
    # ========================================================================
    @gluon.jit
    def _consumer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, turn, O, LSE, qk_scale,
                  b, h, m0, N, H, q_row, q_col, kv_row0, kv_col, n_blocks, n_total,
                  me: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr, CAUSAL: gl.constexpr, PRODUCE: gl.constexpr, OVERLAP: gl.constexpr,
                  PINGPONG: gl.constexpr, RETURN_LSE: gl.constexpr, q_empty, base, q_phase,
                  PERSIST: gl.constexpr):
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
                _load_kv(k_desc, v_desc, k_bufs, v_bufs, ready, j, j, kv_row0, kv_col, j < n_total, BLOCK_N, STAGES)
        mbarrier.wait(q_bar.index(me), q_phase)

        # 第 0 轮：S_0 = Q K_0^T（K 块 [BLOCK_N, d] 的转置视图 [d, BLOCK_N] 当 B 操作数）
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        slot0 = base % STAGES
        mbarrier.wait(ready.index(slot0), (base // STAGES) & 1)
        _issue(turn, me, 0, PINGPONG)
        s_tok = warpgroup_mma(q_tile, k_bufs.index(slot0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        _pass(turn, me, PINGPONG)
        s = warpgroup_mma_wait(0, deps=[s_tok, q_tile, k_bufs.index(slot0)])[0]
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
            slot = (base + j) % STAGES
            prev = (base + j - 1) % STAGES
            if PRODUCE:
                _load_kv(k_desc, v_desc, k_bufs, v_bufs, ready, j + STAGES - 2, j + STAGES - 2, kv_row0, kv_col,
                         j + STAGES - 2 < n_total, BLOCK_N, STAGES)
            mbarrier.wait(ready.index(slot), ((base + j) // STAGES) & 1)
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

        if PERSIST:
            mbarrier.arrive(q_empty.index(me))                                # 这个 Q 块的 QKᵀ 全做完了
        # 收尾轮：最后一块的 PV
        last = (base + n_blocks - 1) % STAGES
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        _issue(turn, me, n_blocks, PINGPONG)
        o_tok = warpgroup_mma(p_op, v_bufs.index(last), acc, is_async=True)
        _pass(turn, me, PINGPONG)
        acc = warpgroup_mma_wait(0, deps=[o_tok, p_op, v_bufs.index(last)])[0]
        if not PRODUCE:
            mbarrier.arrive(empty.index(last))
            # 空轮（只有 ws2 causal 的下面那组会走）：另一组还要用的块，等它到了就放回，发射权照常交出
            for j in range(n_blocks, n_total):
                mbarrier.wait(ready.index((base + j) % STAGES), ((base + j) // STAGES) & 1)
                _issue(turn, me, j + 1, PINGPONG)
                _pass(turn, me, PINGPONG)
                mbarrier.arrive(empty.index((base + j) % STAGES))
        m_o = gl.convert_layout(m_i, gl.SliceLayout(1, o_layout))
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
        _epilogue(acc, m_o, l_o, O, LSE, b, h, m0, N, H, HEAD_DIM, BLOCK_M, RETURN_LSE)

    # ========================================================================
    # 一个 Q 块的几何：第 pid_m 块（CONSUMERS·BLOCK_M 行）、第 bh = b·H + h 个（序列, 头）
    # ========================================================================
    @gluon.jit
    def _geometry(pid_m, bh, N, H, GROUP, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  CONSUMERS: gl.constexpr, CAUSAL: gl.constexpr):
        """
        返回 (b, h, m0, q_row, q_col, kv_row0, kv_col, n_blocks0, n_blocks1)：q_row、q_col 是二维视图 [B·N, H·d] 里
        Q 块的行、列；n_blocks0 / 1 = 0 号 / 最后一个计算组要走的 K/V 块数（causal 只到自己最后一行，左上角对齐）。
        生产者要搬的块数 = n_blocks1（最下面那组要得最多）。
        """
        b = bh // H
        h = bh % H
        m0 = pid_m * (CONSUMERS * BLOCK_M)
        n_all = gl.cdiv(N, BLOCK_N)
        n_blocks0 = n_all
        n_blocks1 = n_all
        if CAUSAL:
            n_blocks0 = gl.cdiv(gl.minimum(m0 + BLOCK_M, N), BLOCK_N)
            n_blocks1 = gl.cdiv(gl.minimum(m0 + CONSUMERS * BLOCK_M, N), BLOCK_N)
        # GQA：GROUP 个 query 头共用一个 K/V 头
        return b, h, m0, b * N + m0, h * HEAD_DIM, b * N, (h // GROUP) * HEAD_DIM, n_blocks0, n_blocks1

    @gluon.jit
    def _tile_order(t, n_m, BH, CHUNK_HEADS):
        """
        持久内核的第 t 个 Q 块是哪一块：→ (pid_m, bh)。
        头按 CHUNK_HEADS 个一段；段内先排所有头最长的 Q 块（causal 时最后一块最长），再排次长的……
        这样同时在算的 Q 块落在少数几个头上（它们的 K/V 留在 L2 里，被这几个头的所有 Q 块重用），
        而且相邻的 Q 块一样长：按"蛇形"把它们发给各程序时（见 _tile_of），每个程序分到的总块数差不多。
        """
        chunk = t // (CHUNK_HEADS * n_m)
        heads = gl.minimum(CHUNK_HEADS, BH - chunk * CHUNK_HEADS)      # 最后一段可能不满
        r = t - chunk * CHUNK_HEADS * n_m
        return n_m - 1 - r // heads, chunk * CHUNK_HEADS + r % heads

    @gluon.jit
    def _tile_of(k, p, G):
        """程序 p（共 G 个）的第 k 个 Q 块在 _tile_order 里的序号：蛇形，偶数轮 p、奇数轮 G − 1 − p
        （长块在前：第 0 轮拿最长块的程序第 1 轮拿那一轮最短的，两两配平）。"""
        return k * G + gl.where(k % 2 == 0, p, G - 1 - p)

    @gluon.jit
    def _n_mine(tiles, p, G):
        """程序 p 分到几个 Q 块：每个整轮一个；最后不满的一轮只有蛇形位置 < 余数的程序有。"""
        full = tiles // G
        pos = gl.where(full % 2 == 0, p, G - 1 - p)
        return full + (pos < tiles - full * G).to(gl.int32)

    @gluon.jit
    def _producer_tiles(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, q_empty, N, H, GROUP,
                        BH, CHUNK_HEADS, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        STAGES: gl.constexpr, CAUSAL: gl.constexpr):
        """持久内核的生产者：按程序的 Q 块顺序，每块先发第 0 块 K/V，再（等两个计算组放回 Q 格）发 Q，再发其余 K/V。"""
        n_m = gl.cdiv(N, 2 * BLOCK_M)
        p = gl.program_id(0)
        G = gl.num_programs(0)
        n_mine = _n_mine(n_m * BH, p, G)                                 # 这个程序的 Q 块数
        base = 0
        for k in range(n_mine):
            pid_m, bh = _tile_order(_tile_of(k, p, G), n_m, BH, CHUNK_HEADS)
            b, h, m0, q_row, q_col, kv_row0, kv_col, nb0, n_total = _geometry(pid_m, bh, N, H, GROUP, HEAD_DIM,
                                                                              BLOCK_M, BLOCK_N, 2, CAUSAL)
            for j in range(n_total):
                i = base + j
                mbarrier.wait(empty.index(i % STAGES), ((i // STAGES) & 1) ^ 1)
                _load_kv(k_desc, v_desc, k_bufs, v_bufs, ready, i, j, kv_row0, kv_col, True, BLOCK_N, STAGES)
                if j == 0:      # 第 0 块 K/V 先发：等 Q 格的时候它已经在路上
                    for c in gl.static_range(2):
                        mbarrier.wait(q_empty.index(c), (k & 1) ^ 1)             # 第 0 个 Q 块不等
                        mbarrier.expect(q_bar.index(c), q_desc.block_type.nbytes)
                        tma.async_copy_global_to_shared(q_desc, [q_row + c * BLOCK_M, q_col], q_bar.index(c),
                                                        q_smem.index(c))
            base += n_total

    @gluon.jit
    def _consumer_tiles(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, turn, q_empty, O, LSE,
                        qk_scale, N, H, GROUP, BH, CHUNK_HEADS, me: gl.constexpr, HEAD_DIM: gl.constexpr,
                        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                        RETURN_LSE: gl.constexpr):
        """持久内核的计算组 me：和生产者走同样的 Q 块序列，每块就是不持久时的 _consumer（环接着往下转）。"""
        n_m = gl.cdiv(N, 2 * BLOCK_M)
        p = gl.program_id(0)
        G = gl.num_programs(0)
        n_mine = _n_mine(n_m * BH, p, G)
        base = 0
        for k in range(n_mine):
            pid_m, bh = _tile_order(_tile_of(k, p, G), n_m, BH, CHUNK_HEADS)
            b, h, m0, q_row, q_col, kv_row0, kv_col, nb0, n_total = _geometry(pid_m, bh, N, H, GROUP, HEAD_DIM,
                                                                              BLOCK_M, BLOCK_N, 2, CAUSAL)
            n_blocks = nb0 if me == 0 else n_total
            _consumer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, turn, O, LSE, qk_scale,
                      b, h, m0 + me * BLOCK_M, N, H, q_row + me * BLOCK_M, q_col, kv_row0, kv_col, n_blocks, n_total,
                      me, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, False, False, False, RETURN_LSE,
                      q_empty, base, k & 1, True)
            base += n_total

    # ========================================================================
    # 内核：不持久时 program (i, b·H + h) 负责第 b 个序列、第 h 个头的 CONSUMERS 个相邻 Q 块
    #   （行 [i·CONSUMERS·BLOCK_M, +CONSUMERS·BLOCK_M)）；持久时（PERSIST）grid = (SM 数,)，每个程序走一串 Q 块
    #   warp_specialize 的 worker_num_regs（[24]、[240, 24]）写死在调用里：和 tile_config 的 worker_regs 是同一组数
    # ========================================================================
    @gluon.jit
    def _attn_fwd(q_desc, k_desc, v_desc, O, LSE, qk_scale, N, H, GROUP, BH, CHUNK_HEADS,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr, WS: gl.constexpr, CONSUMERS: gl.constexpr, OVERLAP: gl.constexpr,
                  PINGPONG: gl.constexpr, PERSIST: gl.constexpr, RETURN_LSE: gl.constexpr):
        # 共享内存：Q [CONSUMERS, BLOCK_M, d]，K、V 环 [STAGES, BLOCK_N, d]
        # 布局 = 描述符的 NVMMA 布局（TMA 写、wgmma 读）
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, BLOCK_M, HEAD_DIM], q_desc.layout)
        k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(CONSUMERS):
            mbarrier.init(q_bar.index(c), count=1)
            mbarrier.init(q_empty.index(c), count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=CONSUMERS)     # 一格要所有计算组都用完才能重填
        for c in gl.static_range(2):
            mbarrier.init(turn.index(c), count=1)
        fence_async_shared()                                   # 初始化对 TMA（异步代理）可见
        if PINGPONG:
            mbarrier.arrive(turn.index(0))                     # 0 号组先发

        if PERSIST:          # 步骤 E：两个计算组 + 生产者，各自走同一串 Q 块
            gl.warp_specialize([
                (_consumer_tiles, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, turn, q_empty,
                                   O, LSE, qk_scale, N, H, GROUP, BH, CHUNK_HEADS, gl.constexpr(0), HEAD_DIM, BLOCK_M,
                                   BLOCK_N, STAGES, CAUSAL, RETURN_LSE)),
                (_consumer_tiles, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, turn, q_empty,
                                   O, LSE, qk_scale, N, H, GROUP, BH, CHUNK_HEADS, gl.constexpr(1), HEAD_DIM, BLOCK_M,
                                   BLOCK_N, STAGES, CAUSAL, RETURN_LSE)),
                (_producer_tiles, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, q_empty, N, H,
                                   GROUP, BH, CHUNK_HEADS, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
            ], [4, 1], [240, 24])
        else:
            pid_m = gl.num_programs(0) - 1 - gl.program_id(0)     # 倒序发：causal 时最长的 Q 块先上 SM
            b, h, m0, q_row, q_col, kv_row0, kv_col, n_blocks0, n_blocks1 = _geometry(
                pid_m, gl.program_id(1), N, H, GROUP, HEAD_DIM, BLOCK_M, BLOCK_N, CONSUMERS, CAUSAL)
            n_total = n_blocks1                       # 生产者搬的块数 = 最下面那组要的块数
            if WS:
                # 赋给变量的元组里，constexpr 会变成 int32 张量；worker 的参数元组也不能用 + 拼：
                # worker 的参数整个写在调用处
                io = (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, turn, O, LSE, qk_scale,
                      b, h)
                tail = (q_empty, 0, 0)                # 不持久：环从 0 数起，Q 的相位 0
                if CONSUMERS == 1:
                    gl.warp_specialize([
                        (_consumer, io + (m0, N, H, q_row, q_col, kv_row0, kv_col, n_blocks0, n_total,
                                          gl.constexpr(0), HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL,
                                          gl.constexpr(False), OVERLAP, PINGPONG, RETURN_LSE) + tail
                         + (gl.constexpr(False),)),
                        (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, q_row,
                                     q_col, kv_row0, kv_col, n_total, BLOCK_M, BLOCK_N, STAGES, CONSUMERS)),
                    ], [1], [24])
                else:                   # 默认分区 = 计算组 0；worker = 计算组 1（4 warp）、生产者（1 warp）
                    gl.warp_specialize([
                        (_consumer, io + (m0, N, H, q_row, q_col, kv_row0, kv_col, n_blocks0, n_total,
                                          gl.constexpr(0), HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL,
                                          gl.constexpr(False), OVERLAP, PINGPONG, RETURN_LSE) + tail
                         + (gl.constexpr(False),)),
                        (_consumer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, turn, O,
                                     LSE, qk_scale, b, h, m0 + BLOCK_M, N, H, q_row + BLOCK_M, q_col, kv_row0, kv_col,
                                     n_blocks1, n_total, gl.constexpr(1), HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL,
                                     gl.constexpr(False), OVERLAP, PINGPONG, RETURN_LSE, q_empty, 0, 0,
                                     gl.constexpr(False))),
                        (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, q_row,
                                     q_col, kv_row0, kv_col, n_total, BLOCK_M, BLOCK_N, STAGES, CONSUMERS)),
                    ], [4, 1], [240, 24])
            else:
                _consumer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, ready, empty, turn, O, LSE, qk_scale,
                          b, h, m0, N, H, q_row, q_col, kv_row0, kv_col, n_blocks0, n_total,
                          0, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, True, OVERLAP, PINGPONG, RETURN_LSE,
                          q_empty, 0, 0, False)


# ============================================================================
# 主机端：检查参数 → 描述符 → 启动。参数先查（CPU 上也能测），设备后查。
# ============================================================================
_GL_DTYPES = {}          # torch dtype → gluon dtype（第一次用时填）
_LAYOUTS = {}            # (block_shape, dtype) → NVMMASharedLayout：每组形状只算一次


def _check_args(q, k, v, causal, softmax_scale, variant, return_lse, where="attention"):
    """坏输入 → ValueError / TypeError，消息里有参数名和允许的取值。返回 (variant, scale)。"""
    check_bool("causal", causal, where=where)
    check_bool("return_lse", return_lse, where=where)
    variant = check_choice("variant", variant, ("best",) + VARIANTS, where=where)
    if torch is None:
        raise RuntimeError(f"{where} 需要 torch（{GLUON_ERROR or '没有安装 torch'}）")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}：{name} 必须是 torch.Tensor，收到 {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{where}：{name} 必须是 4 维 [B, N, H, d]，收到形状 {tuple(t.shape)}")
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"{where}：{name} 的 dtype 只能是 torch.bfloat16 / torch.float16，收到 {t.dtype}")
    batch, n, hq, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"{where}：k、v 的形状必须相同，收到 {tuple(k.shape)} 和 {tuple(v.shape)}")
    if k.shape[0] != batch or k.shape[1] != n or k.shape[3] != d:
        raise ValueError(f"{where}：k、v 必须是 [B, N, Hk, d]，B、N、d 和 q 相同"
                         f"（q {tuple(q.shape)}，k {tuple(k.shape)}）")
    if d not in HEAD_DIMS:
        raise ValueError(f"{where}：头维 d 只能是 {' / '.join(map(str, HEAD_DIMS))}，收到 {d}")
    if k.shape[2] < 1 or hq % k.shape[2] != 0:
        raise ValueError(f"{where}：q 的头数 {hq} 必须是 k、v 头数 {k.shape[2]} 的整数倍（GQA）")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{where}：q、k、v 的 dtype 必须相同，收到 {q.dtype}、{k.dtype}、{v.dtype}")
    if n < 1 or batch < 1:
        raise ValueError(f"{where}：B、N 必须 ≥ 1，收到 B={batch}、N={n}")
    if softmax_scale is None:
        scale = 1.0 / math.sqrt(d)
    else:
        scale = check_real("softmax_scale", softmax_scale, lo=0, lo_open=True, where=where, type_error=ValueError)
    return (best_variant(d, n) if variant == "best" else variant), scale


def best_variant(d, n):
    """variant="best" 选哪一步：按 H200 上的实测，量过的形状都用 BEST（persist，步骤 E）。
    同一次运行里比（bench/results/gluon_explore_1k_4k.json：E 对 A、C；gluon_explore_16k.json：E 对 C）：N = 1k 上 E 明显
    最快（+11–26%；d = 64 原来最快的 pipelined 375 / 268 → E 419 / 291 TFLOP/s）；N = 4k、16k 上 E 比 C 快 0–9%，
    但这在运行之间的起伏之内（同一个 ws2 配置 d = 128、16k 在三次运行里是 616 / 652 / 685），只能说"不慢于 C"。
    测试 test_best_variant_rule_follows_the_committed_sweeps 对照这两份扫描。d、n 留着：以后按形状选。"""
    check_choice("d", d, HEAD_DIMS, where="best_variant")
    return BEST


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
            _GL_DTYPES.update({torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32})
        _LAYOUTS[key] = gl.NVMMASharedLayout.get_default_for(list(block), _GL_DTYPES[dtype])
    return _LAYOUTS[key]


def _desc(t2d, block):
    """
    连续的 t2d → 块 block 的 TMA 描述符（基址 16 字节对齐、行步长是 16 字节的倍数）：q、k、v 看成二维 [B·N, H·d]
    （16 位），反向的 dQ 累加器看成 [B·H·n_pad, d]（fp32），反向的 LSE / D 是一维的 [2·B·H·n_pad]（fp32）。
    """
    return TensorDescriptor.from_tensor(t2d, list(block), _layout(block, t2d.dtype))


def attention(q, k, v, causal=False, softmax_scale=None, variant="best", return_lse=False):
    """
    q [B, N, H, d]，k、v [B, N, Hk, d]（Hk | H）→ out [B, N, H, d]
    （return_lse 时再返回 lse [B, H, N]，自然对数，fp32）。
    variant：'pipelined' / 'ws' / 'ws2' / 'overlap' / 'pingpong' / 'persist'（'best' = best_variant(d, N)），见开头。
    主机端不同步：只做形状检查、建描述符、启动一次内核。
    """
    variant, scale = _check_args(q, k, v, causal, softmax_scale, variant, return_lse)
    _check_device(q, k, v)
    if (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled():
        out, lse = _AttentionFn.apply(q, k, v, causal, scale, variant)      # 可求导：反向 = attention_backward
        return (out, lse) if return_lse else out
    return _launch(q, k, v, causal, scale, variant, return_lse)


def persistent_grid(n_m, bh, n_sm):
    """
    持久内核（variant "persist"）的 grid 和每段的头数：n_m·bh 个 Q 块，程序数 G = min(Q 块数, SM 数)，
    每个 SM 一个程序（ws2 的 3 个 warpgroup × 168 个寄存器占满一个 SM 的寄存器堆）。
    段的头数 = ⌈2G / n_m⌉：一段大约两轮（每轮每个程序一个 Q 块）——蛇形发块时第 0 轮拿到长块的程序，第 1 轮拿到短块，
    两轮合起来每个程序的块数差不多；同时在算的 Q 块只落在一段的头上（N = 1k、d = 128 时 33 个头的 K/V，17 MB，
    小于 H200 的 50 MB L2）。
    """
    for name, x in (("n_m", n_m), ("bh", bh), ("n_sm", n_sm)):
        check_int(name, x, lo=1, where="persistent_grid")
    tiles = n_m * bh
    g = min(tiles, n_sm)
    return (g,), max(1, min(bh, -(-2 * g // n_m)))


def persistent_schedule(n_m, bh, n_sm):
    """
    主机上照抄内核的发块规则（_tile_order、_tile_of、_n_mine），返回每个程序依次算的 (pid_m, bh) 列表。
    内核里的那份在 CPU 上跑不了：测试用这一份检查"每个 Q 块恰好算一次"，基准用它报每个程序分到的 K/V 块数。
    """
    (g,), chunk = persistent_grid(n_m, bh, n_sm)
    tiles = n_m * bh

    def order(t):                                   # = _tile_order
        c = t // (chunk * n_m)
        heads = min(chunk, bh - c * chunk)
        r = t - c * chunk * n_m
        return n_m - 1 - r // heads, c * chunk + r % heads

    full = tiles // g
    out = []
    for p in range(g):
        mine = full + int((p if full % 2 == 0 else g - 1 - p) < tiles - full * g)      # = _n_mine
        out.append([order(k * g + (p if k % 2 == 0 else g - 1 - p)) for k in range(mine)])   # = _tile_of
    return out


def schedule_balance(n, bh, n_sm, causal, d=128):
    """
    持久内核每个程序要走的 K/V 块数 → (最多, 平均)；最多 / 平均 = 静态分配的尾巴。
    块数和内核的 _geometry 同一个算法：Q 块 pid_m（R = CONSUMERS·BLOCK_M 行）causal 时走到 min((pid_m + 1)·R, n)。
    """
    check_int("n", n, lo=1, where="schedule_balance")
    block_m, block_n = tile_config("persist", d)[:2]
    rows = FLAGS["persist"]["CONSUMERS"] * block_m
    n_m = -(-n // rows)
    work = [sum(-(-min((pid_m + 1) * rows, n) // block_n) if causal else -(-n // block_n) for pid_m, _ in prog)
            for prog in persistent_schedule(n_m, bh, n_sm)]
    return max(work), sum(work) / len(work)


def _launch(q, k, v, causal, scale, variant, return_lse, tiles=None, programs=None):
    """
    检查过的输入 → 启动。tiles = (BLOCK_N, STAGES) 时换掉 tile_config 的这两项（--explore 扫配置用）；
    programs：持久内核最多几个程序（默认 = SM 数）。自检用 SELFTEST_PROGRAMS：小形状也让每个程序走好几个 Q 块。
    """
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
    n_m = triton.cdiv(n, f["CONSUMERS"] * block_m)                           # 每个 (序列, 头) 的 Q 块数
    if f["PERSIST"]:
        grid, chunk = persistent_grid(n_m, batch * hq, programs or _triton_flash()._sm_count(q.device))
    else:
        grid, chunk = (n_m, batch * hq), 1
    extra = {} if maxnreg is None else {"maxnreg": maxnreg}
    _attn_fwd[grid](q_desc, k_desc, v_desc, out, lse, scale * LOG2E, n, hq, hq // hk, batch * hq, chunk,
                    HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal,
                    RETURN_LSE=return_lse, num_warps=num_warps, **f, **extra)
    return (out, lse) if return_lse else out


# ############################################################################
# 反向（FA3 的做法）：一个主内核，每对 (K/V 块, Q 块) 5 次矩阵乘；dQ 经共享内存用 TMA 归约加回全局
# ############################################################################
# 记号：S = scale·Q Kᵀ，P = exp(S − LSE)，dV = Pᵀ dO，dP = dO Vᵀ，dS = P ∘ (dP − D)，D = rowsum(dO ∘ O)，
#       dQ = scale·dS K，dK = scale·dSᵀ Q。
# 程序 (i, b·H + h) 拿住第 i 个 K/V 块（两个计算组各 BLOCK_N 行），走过它看得到的所有 Q 块，每个计算组每一轮：
#   Sᵀ = K Qᵀ → Pᵀ = exp2(Sᵀ·scale·log2 e − LSE·log2 e) → dV += Pᵀ dO → dPᵀ = V dOᵀ → dSᵀ = Pᵀ ∘ (dPᵀ − D)
#   → dK += dSᵀ Q → dSᵀ 写进共享内存、和另一组交换 → dQ 的一半列 = dS K（K 方向走满两组的 K/V 行）
#   → 写进共享内存，TMA 归约加进 fp32 的 dQ 累加器（不同 K/V 块的程序加到同一块 dQ 上）。
# 为什么算转置（Sᵀ 而不是 S）：wgmma 的 A 操作数可以在寄存器里，而 dV += Pᵀ dO、dK += dSᵀ Q 要的 A 正是 Pᵀ、dSᵀ，
# 并且行 = key 行，和 dK、dV 累加器同一种分布——Pᵀ、dSᵀ 不经过共享内存（FA3 的 "swapAB"）。
# dQ = dS K 要 dS 当 A：寄存器里的 dSᵀ 换不成 dS 的分布（要跨线程转置），而它本来就要写进共享内存给另一组用：
# [BLOCK_N, BLOCK_M] 的格子读的时候用 .permute((1, 0)) 视图 [BLOCK_M, BLOCK_N]
# （16 位数的 wgmma 允许 A 从共享内存转置读）。
# 每块 Q 行的 LSE·log2 e、D：预处理内核写成按头排的 [2, B·H, n_pad]，生产者每格用一维 TMA 和 Q、dO 一起读进来，
# 计算组直接按沿列广播的布局从共享内存读（每轮从全局读、再 convert_layout 的做法慢 1.1–1.3×）。
# 第一版每个计算组各算自己 64 行 K 的那份 dQ、从寄存器原子加（red.global.add.v2）：L2 流量是这里的两倍、
# 原子加的地址逼得 ptxas 溢出 ~830 字节，d = 128 时慢 1.6–1.8×（代码在 git 18929f1）。
# 和 triton_flash.py 默认的反向比：那里 dK/dV 内核 5 次 + 单独的 dQ 内核再算一遍 QKᵀ、dO Vᵀ = 7 次矩阵乘。
# worker_regs（最后一项）只是记账：_attn_bwd 的 gl.warp_specialize 调用里写死了同样的 [240, 24]（测试对照两处）
BWD_TILES = {64: (128, 64, 2, 2, 4, 168, (240, 24)),
             128: (64, 64, 2, 3, 4, 168, (240, 24))}


def bwd_tile_config(d):
    """
    反向的块：(BLOCK_M, BLOCK_N, CONSUMERS, STAGES, num_warps, maxnreg, worker_regs)。
    BLOCK_N = 每个计算组拿的 K/V 行数（程序的 K/V 块 = CONSUMERS·BLOCK_N = 128 行）；BLOCK_M = 每轮流过的 Q / dO 块的
    行数；STAGES = Q / dO 环的格数。
    寄存器账（每线程，128 线程的计算组）：dK、dV 累加器各 BLOCK_N·d/128 个 fp32（d = 128：64 + 64），Sᵀ、dPᵀ 各
    BLOCK_N·BLOCK_M/128（d = 128：32 + 32），Pᵀ、dSᵀ 的 16 位 A 操作数再各一半，dQ 的一半 BLOCK_M·d/2/128（这时 Sᵀ、
    dPᵀ 已经死了）。一个计算组拿 128 行 K/V 时 d = 128 的 dK + dV 就有 256 个：必溢出——所以两个计算组各 64 行，
    共用每一份 Q / dO（empty 计数 2，和前向的 ws2 一样）。
    d = 64 的 dK + dV 只有 64 个：BLOCK_M 加到 128（Sᵀ、dPᵀ 各 64 个），每轮的矩阵乘大一倍、同步和等待少一半；
    ptxas 溢出 196 字节，实测仍比 BLOCK_M = 64（4 格、不溢出）快 4–10%（bench/results/gluon_bwd_explore.json）。
    共享内存：K、V 2·CONSUMERS·BLOCK_N·d·2 字节 + STAGES·2·BLOCK_M·d·2（Q、dO）+ 4·BLOCK_N·BLOCK_M·2（dSᵀ：两组 ×
    奇偶两份）+ 2·BLOCK_M·(d/2)·4（两组的 fp32 dQ 半块）+ STAGES·2·BLOCK_M·4（每格的 LSE·log2 e、D）；
    按这个式子 d = 128 时 230 912 字节、d = 64 时 198 656 字节，再加 mbarrier 和对齐，ptxas 报 231 360 / 199 072
    （上限 232 448；d = 64 再加一格，式子就正好到上限，加上 mbarrier 就超了）。CONSUMERS 只能是 2（两组交换 dSᵀ、
    各算 dQ 的一半列是为两组写的；_launch_bwd 检查）。
    溢出（triton 3.6 为 sm_90a 编译，ptxas -v）：d = 128 full / causal 124 / 44 字节，d = 64 196 / 196 字节
    （bench/results/gluon_bwd_ptxas.log）。
    """
    return BWD_TILES[check_choice("d", d, tuple(BWD_TILES), where="bwd_tile_config")]


PRE_BLOCK = 64        # 预处理一个程序的行数（[B·N·H] 里的行）


if gl is not None:
    @gluon.jit
    def _head_major(rows, N, H, PAD):
        """[B·N·H] 里的行 r = (b·N + n)·H + h → 按头排的 [B, H, PAD] 里的行 (b·H + h)·PAD + n（int64）。
        LSE（PAD = N）、STATS 和 dQ 累加器（PAD = n_pad）都按头排：一个头的一块 Q 行在里面是连续的。"""
        h = rows % H
        bn = rows // H                                                      # = b·N + n
        return ((bn // N) * H + h).to(gl.int64) * PAD + bn % N

    @gluon.jit
    def _bwd_preprocess(O, DO, LSE, STATS, DQ_ACC, N, H, ROWS, DQ_PAD, HEAD_DIM: gl.constexpr, BLOCK: gl.constexpr):
        """
        D = rowsum(dO ∘ O) 和 LSE·log2 e 写进 STATS [2, B·H, DQ_PAD]（fp32，按头排，生产者用 TMA 按块读），顺手把
        fp32 的 dQ 累加器 [B, H, DQ_PAD, d] 清零（同一批行，一次扫过；每个头的行补齐到 BLOCK_M 的倍数，TMA 的块不跨头，
        补出来的行只会被加 0、也不会被读，不用清）。
        o、dO 看成 [B·N·H, d] 的行：行 r = (b·N + n)·H + h。
        """
        tpc: gl.constexpr = HEAD_DIM // 8                 # 一行几个线程（每个线程 8 个 16 位数 = 16 字节）
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // tpc, tpc], [4, 1], [1, 0])
        rows = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, layout))
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
        offs = gl.expand_dims(rows.to(gl.int64) * HEAD_DIM, 1) + gl.expand_dims(cols, 0)
        ok = gl.expand_dims(rows < ROWS, 1)
        o = gl.load(O + offs, mask=ok, other=0.0).to(gl.float32)
        do = gl.load(DO + offs, mask=ok, other=0.0).to(gl.float32)
        delta = gl.sum(o * do, axis=1)
        # STATS [2, B·H, DQ_PAD]：[0] = LSE·log2 e，[1] = D（补出来的位置主机上清零：被掩掉的 query 不能是 NaN）
        dq_rows = _head_major(rows, N, H, DQ_PAD)
        row_ok = rows < ROWS
        lse = gl.load(LSE + _head_major(rows, N, H, N), mask=row_ok, other=0.0)
        gl.store(STATS + dq_rows, lse * 1.4426950408889634, mask=row_ok)
        gl.store(STATS + (ROWS // N) * DQ_PAD + dq_rows, delta, mask=row_ok)
        offs = gl.expand_dims(dq_rows * HEAD_DIM, 1) + gl.expand_dims(cols, 0)
        gl.store(DQ_ACC + offs, gl.zeros([BLOCK, HEAD_DIM], gl.float32, layout=layout), mask=ok)

    @gluon.jit
    def _dq_convert(DQ_ACC, DQ, N, H, ROWS, DQ_PAD, scale, HEAD_DIM: gl.constexpr, BLOCK: gl.constexpr):
        """
        反向的收尾：dQ = scale · 累加器，fp32 [B, H, DQ_PAD, d] → 输入的 dtype [B, N, H, d]。两边每行的 d 个数都连续，
        只是行的顺序不同（头、位置对调）；按输出的行 r = (b·N + n)·H + h 排，每行整行读、整行写。
        （torch.mul 对转置视图做同样的事要 323 µs，cuDNN 自己的换 dtype 内核 111 µs：bench/results/ncu/ 的 gluon-bwd。）
        """
        tpc: gl.constexpr = HEAD_DIM // 4                 # 一行几个线程（每个线程 4 个 fp32 = 16 字节）
        layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 // tpc, tpc], [4, 1], [1, 0])
        rows = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, layout))
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
        ok = gl.expand_dims(rows < ROWS, 1)
        src = _head_major(rows, N, H, DQ_PAD)
        x = gl.load(DQ_ACC + gl.expand_dims(src * HEAD_DIM, 1) + gl.expand_dims(cols, 0), mask=ok, other=0.0)
        dst = gl.expand_dims(rows.to(gl.int64) * HEAD_DIM, 1) + gl.expand_dims(cols, 0)
        gl.store(DQ + dst, (x * scale).to(DQ.dtype.element_ty), mask=ok)

    @gluon.jit
    def _mask_t(p_t, k0, m0, N, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr):
        """
        p_t = Pᵀ [BLOCK_N, BLOCK_M]（行 = key，列 = query）：key ≥ N、query ≥ N、（causal）key > query → 0。
        key ≥ N 的行是下一个序列的 K（或 TMA 补的 0）：不掩掉的话会经 dS K 加进 dQ。只在边上的块调用。
        """
        # _opaque：下标和循环无关，不挡住的话 LLVM 把它们提到循环外一直占着寄存器（d = 128 causal 时多溢出 76 字节）
        keys = k0 + _opaque(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, p_t.type.layout)))
        qs = m0 + _opaque(gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, p_t.type.layout)))
        ok = gl.expand_dims(keys < N, 1) & gl.expand_dims(qs < N, 0)
        if CAUSAL:
            ok = ok & (gl.expand_dims(keys, 1) <= gl.expand_dims(qs, 0))
        return gl.where(ok, p_t, 0.0)

    @gluon.jit
    def _opaque(x):
        """
        x 原样返回，但编译器看不穿（有副作用的内联汇编不能提到循环外）。用途：和循环无关的下标（_mask_t 的 key、
        query 下标），LLVM 会把它们提到循环外、一直占着寄存器，逼得 ptxas 溢出；放在循环里现算只要几条整数指令。
        （v1 用它挡原子加的列下标：那里 64 对 64 位偏移被提到循环外。）
        """
        return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _bwd_producer(q_desc, do_desc, k_desc, v_desc, st_desc, q_bufs, do_bufs, lse_bufs, dlt_bufs, k_smem, v_smem,
                      kv_bar, ready, empty, q_row_start, st_row_start, st_half, q_col, kv_row, kv_col, n_total,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
        """
        生产者分区（1 个 warp）：先发这个程序的 K、V 块（每个计算组一份 [BLOCK_N, d]），再按顺序填 Q / dO 环：
        第 t 个 Q 块放第 t % STAGES 格，ready / empty 的相位规则和前向的 K/V 环（_load_kv）一样；每格四次 TMA：
        Q、dO 块和这块 Q 行的 LSE·log2 e、D（_load_kv 只发两份，所以这里自己写）。
        q_row_start = 第一个要流过的 Q 块在 [B·N, H·d] 里的行；st_row_start = 它在 STATS 里的位置，st_half = D 那一半
        的偏移。
        """
        mbarrier.expect(kv_bar.index(0), CONSUMERS * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
        for c in gl.static_range(CONSUMERS):
            tma.async_copy_global_to_shared(k_desc, [kv_row + c * BLOCK_N, kv_col], kv_bar.index(0), k_smem.index(c))
            tma.async_copy_global_to_shared(v_desc, [kv_row + c * BLOCK_N, kv_col], kv_bar.index(0), v_smem.index(c))
        for t in range(n_total):
            slot = t % STAGES
            mbarrier.wait(empty.index(slot), ((t // STAGES) & 1) ^ 1)
            bar = ready.index(slot)
            mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes + 2 * st_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [q_row_start + t * BLOCK_M, q_col], bar, q_bufs.index(slot))
            tma.async_copy_global_to_shared(do_desc, [q_row_start + t * BLOCK_M, q_col], bar, do_bufs.index(slot))
            tma.async_copy_global_to_shared(st_desc, [st_row_start + t * BLOCK_M], bar, lse_bufs.index(slot))
            tma.async_copy_global_to_shared(st_desc, [st_half + st_row_start + t * BLOCK_M], bar, dlt_bufs.index(slot))

    @_builtin
    def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """
        TMA 的归约写回：全局里 coord 起的一块 += 共享内存 src（cp.reduce.async.bulk.tensor … .add，L2 里原子地加）。
        Gluon 3.6 的 hopper.tma 只包装了拷贝（async_copy_shared_to_global），IR 构造器里却有这条
        （create_async_tma_reduce，Triton 的 desc.atomic_add 就降到它）：照 async_copy_shared_to_global 的样子包一层。
        和 TMA 写回一样是 bulk group：改写 src 之前要 tma.store_wait。
        """
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)

    # ========================================================================
    # 计算组的一轮（FA3 的 dQ 做法）：
    #   两个计算组各拿程序 K/V 块的 64 行，dSᵀ 各写一半进共享内存；两半都到齐（ds_bar）后，每组算 dQ 的一半列：
    #   dQ[:, 列的一半] = dS₀ K₀[:, 一半] + dS₁ K₁[:, 一半]（K 方向 128 行，一次走完整个 K/V 块）。于是每个 Q 块、
    #   每个 K/V 块只归约一次 [BLOCK_M, d] 的 fp32（v1 两组各一次：L2 上的归约流量是这里的两倍），不从寄存器发原子加：
    #   结果写进共享内存，由 TMA 的归约写回（cp.reduce.async.bulk.tensor … add.f32）加到全局的 fp32 累加器，
    #   计算组不等它完成（下一轮写同一块共享内存之前才 store_wait）。
    #   dSᵀ 的共享内存按轮的奇偶双份：第 t + 2 轮改写第 t 轮那份时，另一组一定已经做完第 t 轮的 dQ（它 arrive 第 t + 1
    #   轮的 ds_bar 在那之后，而本组过了第 t + 1 轮的 wait 才走到 t + 2）。
    #   causal：两组都从第 0 组的第一个 Q 块开始走（BLOCK_M ≤ BLOCK_N 时第 1 组的第一块整块被掩掉、白算一块；
    #   BLOCK_M = 128 时那一块对第 1 组也有一部分可见），交换 dSᵀ 时两组步调一致。
    # ========================================================================
    @gluon.jit
    def _bwd_step(j, start, dk, dv, q_bufs, do_bufs, lse_bufs, dlt_bufs, k_smem, v_smem, ds_smem, dq_smem, ready, empty,
                  ds_bar, dq_desc, qk_scale, N, dq_row0, k0, me: gl.constexpr, HEAD_DIM: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
        """_bwd_consumer_tma 的一轮：第 j 个 Q 块（环上第 t = j − start 格）。"""
        st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, BLOCK_M, 16])  # Sᵀ、dPᵀ [BLOCK_N, BLOCK_M]
        kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, HEAD_DIM, 16])    # dK、dV [BLOCK_N, d]
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
        HALF: gl.constexpr = HEAD_DIM // 2                                    # 本组算 dQ 的哪几列：[me·HALF, +HALF)
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, HALF, 16])    # dQ 的一半 [BLOCK_M, HALF]
        dtype: gl.constexpr = k_smem.dtype
        k_t = k_smem.index(me)                                                # [BLOCK_N, d]
        v_t = v_smem.index(me)
        my_dq = dq_smem.index(me)                                             # [BLOCK_M, HALF]，fp32
        t = j - start
        slot = t % STAGES
        m0 = j * BLOCK_M
        zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
        mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
        q_t = q_bufs.index(slot)                                              # [BLOCK_M, d]
        do_t = do_bufs.index(slot)
        # 这块 Q 行的 LSE·log2 e、D：生产者和 Q、dO 一起用 TMA 读进共享内存，这里按沿列广播的布局读出来
        lse2 = lse_bufs.index(slot).load(gl.SliceLayout(0, st_layout))
        s_tok = warpgroup_mma(k_t, q_t.permute((1, 0)), zero_s, use_acc=False, is_async=True)     # Sᵀ = K Qᵀ
        dp_tok = warpgroup_mma(v_t, do_t.permute((1, 0)), zero_s, use_acc=False, is_async=True)   # dPᵀ = V dOᵀ
        s_t = warpgroup_mma_wait(1, deps=[s_tok, k_t, q_t])[0]
        p_t = gl.exp2(s_t * qk_scale - gl.expand_dims(lse2, 0))
        need_mask = (k0 + BLOCK_N > N) | (m0 + BLOCK_M > N)                   # 这组的 K 行、这块 Q 行跨过序列末尾
        if CAUSAL:
            need_mask = need_mask | (m0 < k0 + BLOCK_N)                      # 碰到对角线（或整块在它上面）的块
        if need_mask:
            p_t = _mask_t(p_t, k0, m0, N, CAUSAL, BLOCK_N, BLOCK_M)
        p_op = gl.convert_layout(p_t.to(dtype), a_layout)                     # Pᵀ 当 A 操作数，留在寄存器里
        dv_tok = warpgroup_mma(p_op, do_t, dv, is_async=True)                 # dV += Pᵀ dO
        dp_t, dv = warpgroup_mma_wait(0, deps=[dp_tok, dv_tok, v_t, do_t, p_op])[:2]
        d_i = dlt_bufs.index(slot).load(gl.SliceLayout(0, st_layout))
        ds_t = (p_t * (dp_t - gl.expand_dims(d_i, 0))).to(dtype)              # dSᵀ（没乘 scale：最后乘）
        ds_op = gl.convert_layout(ds_t, a_layout)
        dk_tok = warpgroup_mma(ds_op, q_t, dk, is_async=True)                 # dK += dSᵀ Q
        ds_mine = ds_smem.index((t % 2) * 2 + me)                             # [BLOCK_N, BLOCK_M]
        ds_mine.store(ds_t)
        fence_async_shared()                                                  # 普通写 → wgmma / 另一组（异步代理）读
        gl.thread_barrier()                                                   # 本组 128 个线程都写完，才替全组 arrive
        mbarrier.arrive(ds_bar.index(t % 2))
        dk = warpgroup_mma_wait(0, deps=[dk_tok, ds_op, q_t])[0]
        mbarrier.arrive(empty.index(slot))                                    # Q、dO 这一格用完了
        mbarrier.wait(ds_bar.index(t % 2), (t // 2) & 1)                      # 两组的 dSᵀ 都在共享内存里了
        ds0 = ds_smem.index((t % 2) * 2)
        ds1 = ds_smem.index((t % 2) * 2 + 1)
        zero_q = gl.zeros([BLOCK_M, HALF], gl.float32, layout=dq_layout)
        dq_tok = warpgroup_mma(ds0.permute((1, 0)), k_smem.index(0).slice(me * HALF, HALF, dim=1), zero_q,
                               use_acc=False, is_async=True)
        dq_tok = warpgroup_mma(ds1.permute((1, 0)), k_smem.index(1).slice(me * HALF, HALF, dim=1), dq_tok,
                               is_async=True)
        dq = warpgroup_mma_wait(0, deps=[dq_tok, ds0, ds1, k_smem])[0]
        tma.store_wait(0)                                                     # 上一轮的归约读完了 my_dq
        gl.thread_barrier()
        my_dq.store(dq)
        fence_async_shared()
        gl.thread_barrier()
        _tma_reduce_add(dq_desc, [dq_row0 + m0, me * HALF], my_dq)           # 全局 dQ 累加器 += my_dq（L2 里原子地加）
        return dk, dv

    @gluon.jit
    def _bwd_consumer_tma(q_bufs, do_bufs, lse_bufs, dlt_bufs, k_smem, v_smem, ds_smem, dq_smem, kv_bar, ready, empty,
                          ds_bar, dq_desc, DK, DV, qk_scale, scale, b, h, N, H, n_pad, k0, start, n_q,
                          me: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                          STAGES: gl.constexpr, CAUSAL: gl.constexpr):
        """计算组 me 拿 K/V 的第 k0 行起 BLOCK_N 行，走 Q 块 start .. n_q − 1（每一轮见 _bwd_step）。"""
        kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, HEAD_DIM, 16])    # dK、dV [BLOCK_N, d]
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
        dq_row0 = (b * H + h) * n_pad                                         # 这个头在 dQ 累加器里的第 0 行
        mbarrier.wait(kv_bar.index(0), 0)
        for j in range(start, n_q):
            dk, dv = _bwd_step(j, start, dk, dv, q_bufs, do_bufs, lse_bufs, dlt_bufs, k_smem, v_smem, ds_smem, dq_smem,
                               ready, empty, ds_bar, dq_desc, qk_scale, N, dq_row0, k0, me, HEAD_DIM, BLOCK_M, BLOCK_N,
                               STAGES, CAUSAL)
        tma.store_wait(0)

        # 收尾：dK 乘 scale，dK、dV 写回（只写 < N 的行）；DK、DV 是 [B, N, H, d]（每个 query 头一份，GQA 在主机上求和）
        rows = k0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, kv_layout))
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, kv_layout))
        offs = gl.expand_dims(((b * N + rows).to(gl.int64) * H + h) * HEAD_DIM, 1) + gl.expand_dims(cols, 0)
        ok = gl.expand_dims(rows < N, 1)
        gl.store(DK + offs, (dk * scale).to(DK.dtype.element_ty), mask=ok)
        gl.store(DV + offs, dv.to(DV.dtype.element_ty), mask=ok)

    @gluon.jit
    def _attn_bwd(q_desc, do_desc, k_desc, v_desc, st_desc, DQ, DK, DV, qk_scale, scale, N, H, GROUP, n_pad,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CONSUMERS: gl.constexpr,
                  STAGES: gl.constexpr, CAUSAL: gl.constexpr):
        """
        程序 (i, b·H + h)：第 b 个序列、第 h 个 query 头，K/V 行 [i·CONSUMERS·BLOCK_N, +CONSUMERS·BLOCK_N)。
        一个头一个头地发：同时在跑的程序只落在几个头上，共用的 Q、dO、dQ 累加器留在 L2 里（先发所有头的第 i 块、
        或 causal 时按段先发最长的块，都实测过，更慢或没有区别）。
        """
        pid_n = gl.program_id(0)                 # causal 时小的 i 看到的 Q 块最多：正序发就是最长的先上 SM
        bh = gl.program_id(1)
        b = bh // H
        h = bh % H
        n0 = pid_n * (CONSUMERS * BLOCK_N)
        kv_row = b * N + n0                      # 二维视图 [B·N, Hk·d] 里的行、列
        kv_col = (h // GROUP) * HEAD_DIM
        q_col = h * HEAD_DIM
        n_q = gl.cdiv(N, BLOCK_M)
        # 第一个要算的 Q 块：causal 时从含第 n0 行的块开始（更早的块整块在对角线之上）。两组从同一块走起
        # （见上面的说明），交换 dSᵀ 时步调一致
        k1 = n0 + BLOCK_N                        # 第 1 组的 K/V 行
        start0 = 0
        if CAUSAL:
            start0 = n0 // BLOCK_M
        n_total = n_q - start0                   # 生产者搬的 Q / dO 块数

        # 共享内存：K、V [CONSUMERS, BLOCK_N, d]（整个程序不动），Q、dO 环 [STAGES, BLOCK_M, d]，
        #           dSᵀ [2·2, BLOCK_N, BLOCK_M]（奇偶两份 × 两组），dQ 的两个半块 [2, BLOCK_M, d/2]（fp32）
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [CONSUMERS, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [CONSUMERS, BLOCK_N, HEAD_DIM], v_desc.layout)
        q_bufs = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
        do_bufs = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
        lse_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], st_desc.layout)
        dlt_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], st_desc.layout)
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], q_desc.dtype)
        ds_smem = gl.allocate_shared_memory(q_desc.dtype, [4, BLOCK_N, BLOCK_M], ds_layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar.index(0), count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=CONSUMERS)     # 一格 Q / dO 要所有计算组都用完才能重填
        fence_async_shared()

        # DQ = fp32 累加器 [B·H·n_pad, d] 的 TMA 描述符，块 [BLOCK_M, d/2]（一个计算组归约的那一半）
        dq_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, HEAD_DIM // 2], DQ.layout)
        ds_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(2):
            mbarrier.init(ds_bar.index(s), count=2)
        fence_async_shared()
        # 默认分区 = 计算组 0；worker = 计算组 1（4 warp）、生产者（1 warp）。worker 的参数写成字面的元组：
        # 拼接（io + ...）会把 constexpr 拆成普通 int、把描述符拆散，worker 就不认了；start0 也要是张量
        gl.warp_specialize([
            (_bwd_consumer_tma, (q_bufs, do_bufs, lse_bufs, dlt_bufs, k_smem, v_smem, ds_smem, dq_smem, kv_bar, ready,
                                 empty, ds_bar, DQ, DK, DV, qk_scale, scale, b, h, N, H, n_pad, n0, start0, n_q,
                                 gl.constexpr(0), HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
            (_bwd_consumer_tma, (q_bufs, do_bufs, lse_bufs, dlt_bufs, k_smem, v_smem, ds_smem, dq_smem, kv_bar, ready,
                                 empty, ds_bar, DQ, DK, DV, qk_scale, scale, b, h, N, H, n_pad, k1,
                                 gl.to_tensor(start0), n_q, gl.constexpr(1), HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                                 CAUSAL)),
            (_bwd_producer, (q_desc, do_desc, k_desc, v_desc, st_desc, q_bufs, do_bufs, lse_bufs, dlt_bufs, k_smem,
                             v_smem, kv_bar, ready, empty, b * N + start0 * BLOCK_M, bh * n_pad + start0 * BLOCK_M,
                             gl.num_programs(1) * n_pad, q_col, kv_row, kv_col, n_total, BLOCK_M, BLOCK_N, STAGES,
                             CONSUMERS)),
        ], [4, 1], [240, 24])


def _check_bwd_args(q, k, v, out, lse, do, causal, softmax_scale):
    """attention_backward 的参数检查（先于设备检查，CPU 上也能测）。返回 scale。"""
    _, scale = _check_args(q, k, v, causal, softmax_scale, "best", False, where="attention_backward")
    batch, n, hq, _ = q.shape
    for name, t in (("out", out), ("do", do)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention_backward：{name} 必须是 torch.Tensor，收到 {type(t).__name__}")
        if t.shape != q.shape:
            raise ValueError(f"attention_backward：{name} 的形状必须和 q 相同 {tuple(q.shape)}，收到 {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise TypeError(f"attention_backward：{name} 的 dtype 必须和 q 相同（{q.dtype}），收到 {t.dtype}")
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"attention_backward：lse 必须是 torch.Tensor，收到 {type(lse).__name__}")
    if tuple(lse.shape) != (batch, hq, n) or lse.dtype != torch.float32:
        raise ValueError(f"attention_backward：lse 必须是 float32 的 [B, H, N] = {(batch, hq, n)}"
                         f"（attention(..., return_lse=True) 给的那个），收到 {lse.dtype} {tuple(lse.shape)}")
    return scale


def attention_backward(q, k, v, out, lse, do, causal=False, softmax_scale=None):
    """
    注意力的反向：q [B, N, H, d]、k、v [B, N, Hk, d]、前向的 out [B, N, H, d] 和 lse [B, H, N]（自然对数），
    上游梯度 do [B, N, H, d] → (dq, dk, dv)，形状、dtype 和 q、k、v 相同。causal、softmax_scale 必须和前向一样。
    GQA（Hk < H）：内核给每个 query 头写一份 fp32 的 dK、dV，主机上按组求和。
    dQ 不逐位可复现：不同 K/V 块的程序用 TMA 归约把各自那份加进同一个 fp32 累加器，先后由调度决定，两次运行的 dq
    相差最多 ~3e-5（相对，bench/results/gluon_bwd_explore.json 的 rel_diff）；dK、dV 是逐位可复现的。要逐位可复现的梯度用
    triton_flash.flash_attn_func（默认的 split 反向，没有原子操作）。
    """
    scale = _check_bwd_args(q, k, v, out, lse, do, causal, softmax_scale)
    _check_device(q, k, v)
    for name, t in (("out", out), ("lse", lse), ("do", do)):
        if not t.is_cuda or t.device != q.device:
            raise RuntimeError(f"attention_backward：{name} 必须在和 q 同一块 CUDA GPU 上，收到 {t.device}")
    return _launch_bwd(q, k, v, out, lse, do, causal, scale)


def _launch_bwd(q, k, v, out, lse, do, causal, scale, tile=None):
    """检查过的输入 → 预处理（D、清零 dQ 累加器）→ 主内核 → dQ 乘 scale 换 dtype（GQA：dK、dV 按组求和）。"""
    batch, n, hq, d = q.shape
    hk = k.shape[2]
    group = hq // hk
    q, k, v, out, do, lse = (t.contiguous() for t in (q, k, v, out, do, lse))
    block_m, block_n, cons, stages, num_warps, maxnreg, _ = tile or bwd_tile_config(d)   # tile：--explore-bwd 用
    if cons != 2:                 # 内核是为两个计算组写的（交换 dSᵀ、各算 dQ 的一半列），见 bwd_tile_config
        raise ValueError(f"_launch_bwd：反向的块 CONSUMERS 只能是 2，收到 {cons}（tile={tile}）")
    n_pad = triton.cdiv(n, block_m) * block_m                                 # 每个头的行补齐到 BLOCK_M 的倍数
    # [2, B·H·n_pad]：LSE·log2 e、D，每个头补齐到 BLOCK_M 的倍数，生产者按块用 TMA 读。补出来的位置要清零
    # （被掩掉的 query 不能是 NaN）；N 是 BLOCK_M 的倍数时没有补的位置，预处理写满每一格，省一次清零
    alloc = torch.empty if n_pad == n else torch.zeros
    stats = alloc((2 * batch * hq * n_pad,), device=q.device, dtype=torch.float32)
    dq_acc = torch.empty((batch, hq, n_pad, d), device=q.device, dtype=torch.float32)  # 预处理内核清零
    rows = batch * n * hq
    _bwd_preprocess[(triton.cdiv(rows, PRE_BLOCK),)](out, do, lse, stats, dq_acc, n, hq, rows, n_pad, HEAD_DIM=d,
                                                     BLOCK=PRE_BLOCK, num_warps=4)
    # GQA：每个 query 头一份 fp32 的 dK、dV [B, N, H, d]，之后按组求和；否则直接写输入的 dtype
    acc_dtype = q.dtype if group == 1 else torch.float32
    dk = torch.empty((batch, n, hq, d), device=q.device, dtype=acc_dtype)
    dv = torch.empty((batch, n, hq, d), device=q.device, dtype=acc_dtype)
    q_desc = _desc(q.view(batch * n, hq * d), (block_m, d))                  # [B·N, H·d]，块 [BLOCK_M, d]
    do_desc = _desc(do.view(batch * n, hq * d), (block_m, d))
    k_desc = _desc(k.view(batch * n, hk * d), (block_n, d))                  # [B·N, Hk·d]，块 [BLOCK_N, d]
    v_desc = _desc(v.view(batch * n, hk * d), (block_n, d))
    dq_desc = _desc(dq_acc.view(batch * hq * n_pad, d), (block_m, d // 2))  # 块 = 一个计算组归约的那一半
    st_desc = _desc(stats, (block_m,))                                         # 一维，块 = BLOCK_M 个 fp32
    grid = (triton.cdiv(n, cons * block_n), batch * hq)
    _attn_bwd[grid](q_desc, do_desc, k_desc, v_desc, st_desc, dq_desc, dk, dv, scale * LOG2E, scale, n, hq, group,
                    n_pad, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CONSUMERS=cons, STAGES=stages, CAUSAL=causal,
                    num_warps=num_warps, maxnreg=maxnreg)
    dq = torch.empty_like(q)                                                  # [B, H, n_pad, d] → [B, N, H, d]
    _dq_convert[(triton.cdiv(rows, PRE_BLOCK),)](dq_acc, dq, n, hq, rows, n_pad, scale, HEAD_DIM=d, BLOCK=PRE_BLOCK,
                                                 num_warps=4)
    if group > 1:                                                             # [B, N, Hk, GROUP, d] → 组内求和
        dk = dk.view(batch, n, hk, group, d).sum(3).to(q.dtype)
        dv = dv.view(batch, n, hk, group, d).sum(3).to(q.dtype)
    return dq, dk, dv


if torch is not None:
    class _AttentionFn(torch.autograd.Function):
        """attention 的 autograd：前向 = _launch（带 LSE），反向 = _launch_bwd。lse 不可求导。"""

        @staticmethod
        def forward(ctx, q, k, v, causal, scale, variant):
            out, lse = _launch(q, k, v, causal, scale, variant, True)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.set_materialize_grads(False)          # lse 没有梯度：不让 autograd 每次为它启动一个填零的内核
            ctx.causal, ctx.scale = causal, scale
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, do, _dlse):
            if do is None:                            # 损失没用到 out（set_materialize_grads(False) 时不补零）
                return None, None, None, None, None, None
            q, k, v, out, lse = ctx.saved_tensors
            dq, dk, dv = _launch_bwd(q, k, v, out, lse, do, ctx.causal, ctx.scale)
            return dq, dk, dv, None, None, None


# ============================================================================
# GPU 自检：flash-attn 的判据（和 triton_flash.check_gpu 同一个）
#   ‖ours − ref64‖/‖ref64‖ ≤ 2 × ‖torch低精度 − ref64‖/‖ref64‖ + 1e-6；LSE 用最大绝对误差，同样 ≤ 2 × torch 的 + 1e-6
# ============================================================================
def _triton_flash():
    """lecture11/triton_flash.py：float64 参考、误差函数、基准里对照的 flash_attn_func、SM 数 _sm_count。"""
    import triton_flash
    return triton_flash


SELFTEST_SHAPES = (   # (B, N, H, Hk)：不规则的 N（1、不满一块、跨几块、多出一行），B/H 也不规则
    (1, 1, 2, 2), (2, 77, 3, 3), (1, 1000, 4, 2), (1, 4097, 2, 1), (3, 384, 2, 2),
)


# 持久内核自检时的程序数：自检形状的 Q 块数是 2、6、32、66、18，5 个程序时除了 2 都要走好几轮，
# 6、32、66、18 还都剩一轮不满（_n_mine 的余数、蛇形的奇数轮）
SELFTEST_PROGRAMS = 5


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
            runs = [(v_, None) for v_ in variants]
            if "persist" in variants:          # 持久内核再跑一遍 3 个程序：SM 多于 Q 块时每个程序只走 1 块，
                runs.append(("persist", SELFTEST_PROGRAMS))   # 跨 Q 块的环、Q 的相位、q_empty 都走不到
            for variant, programs in runs:
                name = f"B{batch} N{n} H{hq}/{hk} d{d}{' causal' if causal else ''}"
                label = variant if programs is None else f"{variant}/{programs}"
                try:
                    out, lse = (attention(q, k, v, causal=causal, variant=variant, return_lse=True) if programs is None
                                else _launch(q, k, v, causal, d ** -0.5, variant, True, programs=programs))
                    e_o, e_l = tf._rel_err(out, ref_o), tf._lse_err(lse, ref_l)
                    err = ""
                except Exception as exc:                 # 编译 / 运行失败也记一行，接着测别的
                    e_o = e_l = float("inf")
                    err = _short(exc)
                torch_errs = {"out": t_o, "lse": t_l}
                ok = all(tf.within_torch_bound(f, e, torch_errs)[0] for f, e in (("out", e_o), ("lse", e_l)))
                rows.append((str(dtype).replace("torch.", ""), label, name, e_o, t_o, e_l, t_l, ok, err))
    return rows


def check_gpu_bwd(seed, dtypes=None, shapes=SELFTEST_SHAPES):
    """
    反向（前向用 BEST，经 attention() 的 autograd）：dq、dk、dv 和 float64 参考比，判据和前向相同
    （≤ 2 × PyTorch 低精度的误差 + 1e-6）；再算一遍（"rerun" 行）：dK、dV 要逐位相同，dQ 经 TMA 归约、先后不定，
    不要求逐位相同，只要两次的相对差 ≤ EXPLORE_BWD_TOL（见 attention_backward；这一行的 ours 列 = 这个相对差，
    torch 列是 None）。
    输入、参考、误差函数都用 triton_flash 的（make_case、run_reference、field_errors）：参考 = 同样的输入在 float64 /
    低精度里走一遍 autograd。返回行 (dtype, case, field, ours, torch, ok, err)。
    """
    tf = _triton_flash()
    dtypes = dtypes or (torch.bfloat16, torch.float16)
    gen = torch.Generator().manual_seed(seed + 1)
    rows = []
    for dtype in dtypes:
        for (batch, n, hq, hk), d, causal in ((s, d, c) for s in shapes for d in HEAD_DIMS for c in (False, True)):
            name = f"B{batch} N{n} H{hq}/{hk} d{d}{' causal' if causal else ''}"
            case = tf.make_case(name, batch, n, n, hq, hk, d, dtype, "cuda", gen, causal=causal)
            ref = tf.run_reference(case)                                                    # float64
            torch_errs = tf.field_errors(tf.run_reference(case, dtype=dtype), ref)          # torch 低精度
            q, k, v = (case[x].detach().clone().requires_grad_(True) for x in ("q", "k", "v"))
            try:
                attention(q, k, v, causal=causal).backward(case["do"])
                grads = dict(zip(("dq", "dk", "dv"), (q.grad.double(), k.grad.double(), v.grad.double())))
                first = (k.grad.clone(), v.grad.clone())
                q.grad = k.grad = v.grad = None
                attention(q, k, v, causal=causal).backward(case["do"])          # 再算一遍：dK、dV 要逐位相同
                same = all(torch.equal(a, b) for a, b in zip(first, (k.grad, v.grad)))
                dq_diff = tf._rel_err(q.grad.double(), grads["dq"])            # dQ：两次的相对差
                err = "" if same else "dk、dv 两次不逐位相同"
            except Exception as exc:
                grads, same, dq_diff, err = None, False, float("inf"), _short(exc)
            dt = str(dtype).replace("torch.", "")
            rows.append((dt, name, "rerun", dq_diff, None, same and dq_diff <= EXPLORE_BWD_TOL, err))
            for f, r in zip(("dq", "dk", "dv"), ref[2:]):
                e = float("inf") if grads is None else tf._rel_err(grads[f], r)
                ok, t = tf.within_torch_bound(f, e, torch_errs)
                if grads is not None and float(r.norm()) == 0.0:
                    # 梯度恰好是 0（N = 1：只有一个 key，dS = P∘(dP − D) ≡ 0）：相对误差没有意义。我们的 D 按
                    # FlashAttention 的恒等式 rowsum(dO∘O) 算，和 dP 差一点舍入，dq、dk 是很小的非零数；
                    # 改成和同一用例的 dV 比大小（‖ours‖ / ‖dV‖ ≤ 1e-4）
                    e, t = _zero_grad_err(grads[f], ref[4]), 0.0
                    ok = e <= ZERO_GRAD_TOL
                rows.append((dt, name, f, e, t, ok, err))
    return rows


ZERO_GRAD_TOL = 1e-4


def _zero_grad_err(x, dv_ref):
    """参考梯度恒为 0 时的误差：‖x‖ / ‖dV 的参考‖（NaN / inf 算作无穷大）。"""
    if not bool(torch.isfinite(x).all()):
        return float("inf")
    return float(x.norm() / dv_ref.norm().clamp_min(1e-30))


def _selftest(seed=None, only=VARIANTS + ("bwd",)):
    """only：查哪几项（前向的 variant 名，"bwd" = 反向）。编译占了大半时间，GPU 机器上可以分几个进程并行跑。"""
    if torch is None or not torch.cuda.is_available():
        print("SKIP: 没有 CUDA GPU（本文件的内核只在 Hopper 上跑：wgmma、TMA、setmaxnreg）")
        sys.exit(77)
    if GLUON_ERROR is not None:
        print(f"SKIP: 这个 triton 没有可用的 Gluon（需要 triton ≥ 3.6）：{GLUON_ERROR}")
        sys.exit(77)
    if torch.cuda.get_device_capability()[0] != 9:
        print(f"SKIP: 本内核只为 Hopper（sm_90）写，这块 GPU 是 {torch.cuda.get_device_name()}")
        sys.exit(77)
    seed = _triton_flash()._pick_seed(seed)
    print(f"gluon_flash 自检：{torch.cuda.get_device_name()}，torch {torch.__version__}，triton {triton.__version__}，"
          f"种子 {seed}（复现：python3 lecture11/gluon_flash.py --seed {seed}）")
    t0 = time.time()
    rows = check_gpu(seed, variants=tuple(v for v in VARIANTS if v in only))
    if rows:
        print(f"  {'dtype':<9s}{'variant':<11s}{'case':<26s}{'out':>10s}{'torch':>10s}{'lse':>10s}{'torch':>10s}  ok")
    for dt, var, name, e_o, t_o, e_l, t_l, ok, err in rows:
        print(f"  {dt:<9s}{var:<11s}{name:<26s}{e_o:>10.2e}{t_o:>10.2e}{e_l:>10.2e}{t_l:>10.2e}  "
              f"{'✓' if ok else '✗'} {err}")
    failed = [r for r in rows if not r[7]]
    t1 = time.time()
    bwd_rows = check_gpu_bwd(seed) if "bwd" in only else []
    if bwd_rows:
        print(f"  反向（前向 {BEST}）：")
        print(f"  {'dtype':<9s}{'case':<26s}{'field':<7s}{'ours':>10s}{'torch':>10s}  ok")
    for dt, name, f, e, t, ok, err in bwd_rows:
        print(f"  {dt:<9s}{name:<26s}{f:<7s}{e:>10.2e}{'–' if t is None else format(t, '.2e'):>10s}  "
              f"{'✓' if ok else '✗'} {err}")
    if bwd_rows:
        print(f"  rerun = 同样的输入再算一遍反向：dk、dv 要逐位相同；ours 列 = 两次 dq 的相对差（dq 经 TMA 归约，"
              f"先后不定，要求 ≤ {EXPLORE_BWD_TOL:.0e}）")
    failed_bwd = [r for r in bwd_rows if not r[5]]
    if failed or failed_bwd:
        print(f"gluon_flash 自检失败：前向 {len(failed)} / {len(rows)} 项，反向 {len(failed_bwd)} / {len(bwd_rows)} 项"
              f"（种子 {seed}）")
        sys.exit(1)
    print(f"gluon_flash 自检通过：前向 {len(rows)} 项（{t1 - t0:.0f} s）、反向 {len(bwd_rows)} 项"
          f"（{time.time() - t1:.0f} s）误差都 ≤ 2 × PyTorch 低精度注意力的误差")


# ============================================================================
# 基准：每个 variant 和 triton_flash.flash_attn_func、SDPA（cuDNN、FLASH）比；B·N = TOKENS（32768）个 token，
# H·d = HIDDEN（2048）；形状、FLOP 算法用 flash_lab.py 的，SDPA 后端用 triton_flash.py 的（和 06 同一份）
# ============================================================================
BENCH_NS = (1024, 4096, 16384)


def _tflops(batch, heads, n, d, causal, ms):
    """前向的 flash_lab.attention_flops（4·B·H·N²·d，causal 减半）/ 时间 → TFLOP/s。"""
    return fl.attention_flops(batch, heads, n, d, causal, "fwd") / (ms * 1e-3) / 1e12


def _gluon_impl(variant, q, k, v, causal):
    return attention(q, k, v, causal=causal, variant=variant)


def _short(exc):
    """异常 → 一行（表里放得下）。"""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:100] if text else ''}"


def bench(out_dir):
    from triton.testing import do_bench
    tf = _triton_flash()
    quick_launch = tf.Launch(autotune=False, gluon=False)                                 # 固定配置：不花时间调优
    impls = {f"gluon:{var}": functools.partial(_gluon_impl, var) for var in VARIANTS}
    impls["triton_flash"] = lambda q, k, v, c: tf.flash_attn_func(q, k, v, causal=c, launch=quick_launch)
    impls["sdpa:cudnn"] = tf.sdpa_fn("sdpa-cudnn")
    impls["sdpa:flash"] = tf.sdpa_fn("sdpa-flash")
    results, t_start = [], time.time()
    for d in HEAD_DIMS:
        for n in BENCH_NS:
            batch, heads = fl.BENCH_TOKENS // n, fl.BENCH_HIDDEN // d
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
    info = gpu_meta(torch, dtype="bfloat16", tokens=fl.BENCH_TOKENS, hidden=fl.BENCH_HIDDEN,
                    seconds=round(time.time() - t_start, 1),
                    tiles={v: {d: tile_config(v, d)[:5] for d in HEAD_DIMS} for v in VARIANTS}, rows=results)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "gluon_bench.json")
    with open(path, "w") as fh:
        json.dump(info, fh, indent=1, ensure_ascii=False)
    print(f"写好 {path}（{info['seconds']} s）")


EXPLORE_TILES = {64: ((128, 2), (128, 3), (128, 4), (64, 4)), 128: ((64, 4), (128, 2), (128, 3))}
EXPLORE_VARIANTS = ("ws2", "overlap", "pingpong", "persist")


EXPLORE_NS = (4096, 16384)


def explore_name(ns=EXPLORE_NS, stem="gluon_explore"):
    """--explore 写的文件名：默认的 N（4k、16k）→ gluon_explore.json，其余按 N 命名
    （--ns 1024 → gluon_explore_1k.json）。--explore-bwd 用 stem="gluon_bwd_explore"，规则相同。"""
    if tuple(ns) == EXPLORE_NS:
        return f"{stem}.json"
    return f"{stem}_" + "_".join(f"{n // 1024}k" if n % 1024 == 0 else str(n) for n in ns) + ".json"


def explore(out_dir, ns=EXPLORE_NS, variants=EXPLORE_VARIANTS, name=None):
    """调参：variant × (BLOCK_N, STAGES) 在 N ∈ ns 上的 TFLOP/s（BLOCK_M 按 tile_config；EXPLORE_VARIANTS 以外的
    variant 只测 tile_config 的那一组），写 DIR/name（默认 explore_name(ns)）。tile_config 里的选择来自
    gluon_explore.json，best_variant 的来自 gluon_explore_1k_4k.json 和 gluon_explore_16k.json。"""
    from triton.testing import do_bench
    rows, t_start = [], time.time()
    for d in HEAD_DIMS:
        for n in ns:
            batch, heads = fl.BENCH_TOKENS // n, fl.BENCH_HIDDEN // d
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
                print(f"  d={d:<4d}N={n:<6d}causal={causal!s:<6s}{variant:<10s}"
                      f"BLOCK_N={tiles[0]:<4d}STAGES={tiles[1]}  "
                      + (f"{row['tflops']:6.1f} TFLOP/s" if "tflops" in row else row["error"]), flush=True)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name or explore_name(ns))
    with open(path, "w") as fh:
        json.dump(gpu_meta(torch, dtype="bfloat16", seconds=round(time.time() - t_start, 1), rows=rows), fh, indent=1)
    print(f"写好 {path}")


# --explore-bwd 比的反向块（bwd_tile_config 的出处；d = 64 再大一格 STAGES 就超出共享内存）
EXPLORE_BWD_TILES = {64: ((64, 64, 2, 4, 4, 168, (240, 24)), (64, 64, 2, 6, 4, 168, (240, 24)),
                          (128, 64, 2, 2, 4, 168, (240, 24))),
                     128: ((64, 64, 2, 2, 4, 168, (240, 24)), (64, 64, 2, 3, 4, 168, (240, 24)))}


EXPLORE_BWD_TOL = 1e-3     # 块不同只改 fp32 累加的顺序（和 dQ 归约的先后）：梯度的相对差在 1e-5 量级，超过它就是算错了


def explore_bwd(out_dir, ns=EXPLORE_NS, tiles=EXPLORE_BWD_TILES):
    """
    调参：反向主内核的块（EXPLORE_BWD_TILES）在 N ∈ ns、full / causal 上的时间，和 cuDNN 的整个反向比；每个块的
    梯度和默认块的梯度比（triton_flash._rel_err，三个梯度取最大；> EXPLORE_BWD_TOL 的块记 ok = False、打 ✗，
    不能当选）。写 DIR/gluon_bwd_explore.json（默认的 N；其余按 N 命名，和 --explore 一样）。
    计时的是 _launch_bwd（预处理 + 主内核 + dQ 换 dtype），cuDNN 是 autograd 的 backward（do_bench 每次清梯度）：
    cuDNN 那边多了 autograd 的一点主机时间，在 N ≥ 4k 的毫秒级时间里可以忽略。
    """
    from triton.testing import do_bench
    for n in ns:
        check_int("ns", n, lo=1, where="explore_bwd")
    tf = _triton_flash()
    cudnn = tf.sdpa_fn("sdpa-cudnn")
    rows, t_start = [], time.time()
    for d in HEAD_DIMS:
        for n, causal in itertools.product(ns, (False, True)):
            batch, heads = fl.BENCH_TOKENS // n, fl.BENCH_HIDDEN // d
            q, k, v, do = (torch.randn(batch, n, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            scale = d ** -0.5
            out, lse = _launch(q, k, v, causal, scale, BEST, True)
            ref = _launch_bwd(q, k, v, out, lse, do, causal, scale)
            qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
            o_cudnn = cudnn(qg, kg, vg, causal)
            ms_cudnn = do_bench(functools.partial(o_cudnn.backward, do, retain_graph=True), warmup=5, rep=25,
                                grad_to_none=[qg, kg, vg])
            del o_cudnn, qg, kg, vg
            for tile in tiles[d]:
                row = dict(d=d, N=n, causal=causal, tile=list(tile[:6]), default=tile == bwd_tile_config(d),
                           cudnn_ms=ms_cudnn)
                try:
                    got = _launch_bwd(q, k, v, out, lse, do, causal, scale, tile)
                    row["rel_diff"] = max(tf._rel_err(a.float(), b.float()) for a, b in zip(got, ref))
                    row["ok"] = row["rel_diff"] <= EXPLORE_BWD_TOL
                    row["ms"] = do_bench(functools.partial(_launch_bwd, q, k, v, out, lse, do, causal, scale, tile),
                                         warmup=5, rep=25)
                    row["vs_cudnn"] = ms_cudnn / row["ms"]
                except Exception as exc:
                    row["error"] = _short(exc)
                rows.append(row)
                print(f"  d={d:<4d}N={n:<6d}causal={causal!s:<6s}tile={tile[:4]}{' *' if row['default'] else '  '}  "
                      + (f"{row['ms']:7.3f} ms  cuDNN {ms_cudnn:7.3f} ms  ×{row['vs_cudnn']:.3f}  "
                         f"和默认块的梯度差 {row['rel_diff']:.1e} {'✓' if row['ok'] else '✗ 算错了'}"
                         if "ms" in row else row["error"]), flush=True)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, explore_name(ns, "gluon_bwd_explore"))
    with open(path, "w") as fh:
        json.dump(gpu_meta(torch, dtype="bfloat16", seconds=round(time.time() - t_start, 1), rows=rows), fh, indent=1)
    print(f"写好 {path}（* = bwd_tile_config 现在的选择；× = cuDNN 时间 / 这个块的时间）")


BENCH_COLS = tuple(f"gluon:{v}" for v in VARIANTS) + ("triton_flash", "sdpa:cudnn", "sdpa:flash")


def _print_row(row, first, cols=BENCH_COLS):
    """一行：TFLOP/s（括号里是 / cuDNN 的比值）；失败的写 ERR（原因在表后）。"""
    if first:
        print("TFLOP/s（bf16；括号 = / cuDNN）")
        print(f"{'d':>4s}{'N':>7s}{'causal':>7s}" + "".join(f"{c.split(':')[-1]:>16s}" for c in cols))
    ref = row["tflops"].get("sdpa:cudnn")
    cells = []
    for c in cols:
        t = row["tflops"].get(c)
        cells.append(f"{'ERR':>16s}" if t is None else f"{t:8.1f} ({t / ref:4.2f})" if ref else f"{t:16.1f}")
    print(f"{row['d']:>4d}{row['N']:>7d}{str(row['causal']):>7s}" + "".join(cells), flush=True)
    for name, err in row["errors"].items():
        print(f"      {name}: {err}")


def _parse_args(argv=None):
    ap = argparse.ArgumentParser(description="Gluon 版 FlashAttention-3 前向（Hopper）：自检 / 基准")
    ap.add_argument("--seed", type=int, default=None, help="自检的随机种子（默认按时间取，打印出来）")
    ap.add_argument("--bench", action="store_true", help="跑基准（代替自检）")
    ap.add_argument("--explore", action="store_true", help="扫 variant × (BLOCK_N, STAGES)（代替自检）")
    ap.add_argument("--explore-bwd", action="store_true",
                    help="反向的块（EXPLORE_BWD_TILES）× N × causal，对 cuDNN（代替自检）→ DIR/gluon_bwd_explore.json")
    ap.add_argument("--ns", type=int, nargs="+", default=list(EXPLORE_NS),
                    help="--explore 测哪几个 N（默认 4096 16384；文件名跟着变：--ns 1024 → gluon_explore_1k.json）")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(EXPLORE_VARIANTS),
                    help="--explore 测哪几步（默认 EXPLORE_VARIANTS：扫块大小；其余只测 tile_config 的那一组）")
    ap.add_argument("--out", default=os.path.join(HERE, "bench", "results"), help="基准 JSON 写到哪个目录")
    ap.add_argument("--only", nargs="+", choices=VARIANTS + ("bwd",), default=VARIANTS + ("bwd",),
                    help="自检只查这几项（前向的 variant、bwd = 反向）")
    return ap.parse_args(argv)


def _measure(args):
    """--bench / --explore：只在有 Gluon 的 CUDA GPU 上。"""
    if torch is None or not torch.cuda.is_available() or GLUON_ERROR is not None:
        print("SKIP: 基准要 CUDA GPU 和 triton ≥ 3.6 的 Gluon")
        sys.exit(77)
    if args.explore_bwd:
        explore_bwd(args.out, ns=tuple(args.ns))
    elif args.explore:
        explore(args.out, ns=tuple(args.ns), variants=tuple(args.variants))
    else:
        bench(args.out)


if __name__ == "__main__":
    _args = _parse_args()
    if _args.bench or _args.explore or _args.explore_bwd:
        _measure(_args)
    else:
        _selftest(_args.seed, tuple(_args.only))
