"""
gluon_kernels · gluon_flash 的内核本身（Gluon 写的 FA3 式前向、反向）：只在 triton ≥ 3.6 的 Gluon 可用时导入。

gluon_flash.py 讲每一步做什么、为什么，主机端的启动、检查、autograd 和自检也在那里；这里只放 @gluon.jit 的函数
和它们共用的状态，顶层直接导入 Gluon（没有它时 import 本模块失败，gluon_flash 记下原因、attention() 报错）。
状态照 Gluon 教程的做法捆成 aggregate：编译期的结构体，字段是张量、共享内存 / TMA 描述符或 constexpr，方法是
@gluon.jit 函数（内联进调用处，生成的代码和把字段一个个传进去一样）。
  前向   _FwdArgs（标量、输出指针、块大小、开关、寄存器布局）、_QSlots（Q 格）、_KVRing（K/V 环）、_Turn（乒乓的
         发射权）、_QTile（一个 Q 块的几何）。_attn_fwd：生产者（_producer / _producer_tiles）用 TMA 填 K/V 环，
         计算组（_consumer / _consumer_tiles）做在线 softmax 和 wgmma；constexpr 开关（gluon_flash.FLAGS）A → E
  反向   _bwd_preprocess（D = Σ dO∘O、LSE 按头排）；_attn_bwd（一个程序拿住 128 行 K/V：_KVHold；Q、dO 流过：_QStream；
         两组交换 dSᵀ、归约 dQ：_DQSwap；5 次矩阵乘）；_dq_convert（fp32 的 dQ 累加器 → 输入的 dtype）
依赖 triton ≥ 3.6（triton.experimental.gluon；Gluon 的接口还在变，本文件按 3.6 写）。
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton._C.libtriton import ir as _ir
from triton.language.core import builtin as _builtin

try:
    from triton.experimental.gluon import aggregate                # triton ≥ 3.7 的公开名字
except ImportError:                                                # 3.6 只有这个（它的 blackwell/float2.py 也这样导入）
    from triton.language.core import _aggregate as aggregate

constexpr_function = gluon.constexpr_function
Desc = tma.tensor_descriptor                       # TMA 描述符（主机上 TensorDescriptor.from_tensor 建的）
Smem = gl.shared_memory_descriptor                 # 共享内存里的一块（数据或一组 mbarrier）


# ========================================================================
# 前向的状态
#   整数参数等于 1 时 Triton 把它特化成 constexpr（N = 1、GROUP = 1 ……）；aggregate 的字段类型是固定的，
#   所以内核入口先 gl.to_tensor 一下
# ========================================================================
@aggregate
class _FwdArgs:
    """一次前向启动：标量参数和输出指针（张量字段），块大小、开关和由它们定下的寄存器布局（constexpr 字段）。"""
    qk_scale: gl.tensor          # softmax_scale·log2 e（以 2 为底的在线 softmax）
    N: gl.tensor                 # 序列长度
    H: gl.tensor                 # query 头数
    GROUP: gl.tensor             # GQA：几个 query 头共用一个 K/V 头
    BH: gl.tensor                # B·H（持久内核的 Q 块编号用）
    CHUNK_HEADS: gl.tensor       # 持久内核一段几个头（gluon_flash.persistent_grid）
    O: gl.tensor                 # out [B, N, H, d]
    LSE: gl.tensor               # lse [B, H, N]（RETURN_LSE 时）
    HEAD_DIM: gl.constexpr
    BLOCK_M: gl.constexpr
    BLOCK_N: gl.constexpr
    STAGES: gl.constexpr
    CAUSAL: gl.constexpr
    OVERLAP: gl.constexpr
    RETURN_LSE: gl.constexpr
    s_layout: gl.constexpr       # S [BLOCK_M, BLOCK_N] 的 wgmma 累加器布局
    o_layout: gl.constexpr       # O [BLOCK_M, d] 的
    p_layout: gl.constexpr       # P 当 wgmma 的 A 操作数留在寄存器里（FA3 的 RS-GEMM：不经过共享内存）

    @constexpr_function
    def __init__(self, qk_scale, N, H, GROUP, BH, CHUNK_HEADS, O, LSE, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL,
                 OVERLAP, RETURN_LSE):
        self.qk_scale, self.N, self.H, self.GROUP, self.BH, self.CHUNK_HEADS = qk_scale, N, H, GROUP, BH, CHUNK_HEADS
        self.O, self.LSE = O, LSE
        self.HEAD_DIM, self.BLOCK_M, self.BLOCK_N = gl.constexpr(HEAD_DIM), gl.constexpr(BLOCK_M), gl.constexpr(BLOCK_N)
        self.STAGES, self.CAUSAL = gl.constexpr(STAGES), gl.constexpr(CAUSAL)
        self.OVERLAP, self.RETURN_LSE = gl.constexpr(OVERLAP), gl.constexpr(RETURN_LSE)
        # 4 个 warp 沿行排（每个 warp 16 行一份），一条 wgmma 算 [16·4, n] × K=16
        s_layout = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
        o_layout = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
        self.s_layout, self.o_layout = gl.constexpr(s_layout), gl.constexpr(o_layout)
        self.p_layout = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))  # 16 位数


@aggregate
class _QSlots:
    """
    Q 块的格子 smem [CONSUMERS, BLOCK_M, d]，每个计算组一格。ready[c]：TMA 到齐时完成一个相位；
    free[c]：计算组做完这个 Q 块的最后一次 QKᵀ（只有持久内核用：生产者这时就能往同一格读下一个 Q 块）。
    """
    desc: Desc
    smem: Smem
    ready: Smem
    free: Smem

    @constexpr_function
    def __init__(self, desc, smem, ready, free):
        self.desc, self.smem, self.ready, self.free = desc, smem, ready, free

    @gluon.jit
    def load(self, c, row, col):
        """Q 的 [BLOCK_M, d] 块（二维视图 [B·N, H·d] 里第 row 行、第 col 列起）读进第 c 格。"""
        mbarrier.expect(self.ready.index(c), self.desc.block_type.nbytes)
        tma.async_copy_global_to_shared(self.desc, [row, col], self.ready.index(c), self.smem.index(c))

    @gluon.jit
    def wait(self, c, phase):
        mbarrier.wait(self.ready.index(c), phase)

    @gluon.jit
    def release(self, c):
        mbarrier.arrive(self.free.index(c))

    @gluon.jit
    def wait_free(self, c, phase):
        mbarrier.wait(self.free.index(c), phase)


# K/V 环：第 i 块放在第 i % STAGES 格；第 i 块是这一格的第 i // STAGES 次使用，mbarrier 的相位 = 使用次数的奇偶
#   ready[s]：生产者 expect(字节数) + 两次 TMA，数据到齐时完成一个相位；消费者 wait(ready[s], (i // STAGES) & 1)
#   empty[s]：消费者用完后 arrive（计数 = 计算 warpgroup 的个数）；生产者在第 u 次填这一格前等第 u − 1 次用完：
#             wait(empty[s], ((i // STAGES) & 1) ^ 1)——新初始化的 mbarrier 等"相位 1"立即返回，所以第一圈不等
#   i 是环上的第几块：持久内核里跨 Q 块往下数（第 j 块 K/V 是环上的第 base + j 块），不持久时 i = j
@aggregate
class _KVRing:
    """K、V 环 [STAGES, BLOCK_N, d] 和它的两组 mbarrier（见上面的规则）。"""
    k_desc: Desc
    v_desc: Desc
    k_bufs: Smem
    v_bufs: Smem
    ready: Smem
    empty: Smem
    STAGES: gl.constexpr

    @constexpr_function
    def __init__(self, k_desc, v_desc, k_bufs, v_bufs, ready, empty, STAGES):
        self.k_desc, self.v_desc, self.k_bufs, self.v_bufs = k_desc, v_desc, k_bufs, v_bufs
        self.ready, self.empty, self.STAGES = ready, empty, gl.constexpr(STAGES)

    @gluon.jit
    def load(self, i, j, row0, col, pred):
        """第 j 块 K、V（行 row0 + j·BLOCK_N 起）读进环上第 i 块的格子；pred = False 时什么都不发。"""
        BLOCK_N: gl.constexpr = self.k_desc.block_type.shape[0]
        slot = i % self.STAGES
        bar = self.ready.index(slot)
        mbarrier.expect(bar, self.k_desc.block_type.nbytes + self.v_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(self.k_desc, [row0 + j * BLOCK_N, col], bar, self.k_bufs.index(slot), pred=pred)
        tma.async_copy_global_to_shared(self.v_desc, [row0 + j * BLOCK_N, col], bar, self.v_bufs.index(slot), pred=pred)

    @gluon.jit
    def wait_ready(self, i):
        mbarrier.wait(self.ready.index(i % self.STAGES), (i // self.STAGES) & 1)

    @gluon.jit
    def wait_empty(self, i):
        mbarrier.wait(self.empty.index(i % self.STAGES), ((i // self.STAGES) & 1) ^ 1)

    @gluon.jit
    def release(self, i):
        mbarrier.arrive(self.empty.index(i % self.STAGES))

    @gluon.jit
    def k(self, i):
        return self.k_bufs.index(i % self.STAGES)                         # [BLOCK_N, d]

    @gluon.jit
    def v(self, i):
        return self.v_bufs.index(i % self.STAGES)


@aggregate
class _Turn:
    """乒乓（PINGPONG）：两个计算组轮流发矩阵乘，bars[c] 的第 r 个相位 = 轮到 c 组第 r 次发。不乒乓时方法是空的。"""
    bars: Smem
    PINGPONG: gl.constexpr

    @constexpr_function
    def __init__(self, bars, PINGPONG):
        self.bars, self.PINGPONG = bars, gl.constexpr(PINGPONG)

    @gluon.jit
    def wait_mine(self, me: gl.constexpr, r):
        """第 r 次发矩阵乘之前等轮到自己（0 号的第一个相位由内核开头预先 arrive）。"""
        if self.PINGPONG:
            mbarrier.wait(self.bars.index(me), r & 1)

    @gluon.jit
    def hand_over(self, me: gl.constexpr):
        """矩阵乘发出去了，把发射权交给另一组（它的 softmax 由此和我们的矩阵乘重叠）。"""
        if self.PINGPONG:
            mbarrier.arrive(self.bars.index(1 - me))


@aggregate
class _QTile:
    """
    一个 Q 块（CONSUMERS·BLOCK_M 行）的几何：第 b 个序列、第 h 个头、行 m0 起；q_row、q_col 是二维视图 [B·N, H·d]
    里 Q 块的行、列，kv_row0、kv_col 是 [B·N, Hk·d] 里这个序列的第 0 行、这个头的 K/V 列；n_blocks0 / n_blocks1 = 0 号 /
    最后一个计算组要走的 K/V 块数（causal 只到自己最后一行）。生产者要搬的块数 = n_blocks1（最下面那组要得最多）。
    """
    b: gl.tensor
    h: gl.tensor
    m0: gl.tensor
    q_row: gl.tensor
    q_col: gl.tensor
    kv_row0: gl.tensor
    kv_col: gl.tensor
    n_blocks0: gl.tensor
    n_blocks1: gl.tensor

    @constexpr_function
    def __init__(self, b, h, m0, q_row, q_col, kv_row0, kv_col, n_blocks0, n_blocks1):
        self.b, self.h, self.m0, self.q_row, self.q_col = b, h, m0, q_row, q_col
        self.kv_row0, self.kv_col, self.n_blocks0, self.n_blocks1 = kv_row0, kv_col, n_blocks0, n_blocks1


@gluon.jit
def _geometry(a, pid_m, bh, CONSUMERS: gl.constexpr):
    """第 bh = b·H + h 个（序列, 头）的第 pid_m 个 Q 块 → _QTile（causal = 左上角对齐）。"""
    b = bh // a.H
    h = bh % a.H
    m0 = pid_m * (CONSUMERS * a.BLOCK_M)
    n_all = gl.cdiv(a.N, a.BLOCK_N)
    n_blocks0 = n_all
    n_blocks1 = n_all
    if a.CAUSAL:
        n_blocks0 = gl.cdiv(gl.minimum(m0 + a.BLOCK_M, a.N), a.BLOCK_N)
        n_blocks1 = gl.cdiv(gl.minimum(m0 + CONSUMERS * a.BLOCK_M, a.N), a.BLOCK_N)
    # GQA：GROUP 个 query 头共用一个 K/V 头
    return _QTile(b, h, m0, b * a.N + m0, h * a.HEAD_DIM, b * a.N, (h // a.GROUP) * a.HEAD_DIM, n_blocks0, n_blocks1)


# ========================================================================
# 内核的小零件：掩码、一步在线 softmax、收尾
# ========================================================================
@gluon.jit
def _mask(s, m0, n0, N, CAUSAL: gl.constexpr):
    """s [BLOCK_M, BLOCK_N]（mma 布局），行 m0 起、列 n0 起：key 列 ≥ N 或（causal）列 > 行 → −∞。只在边上的块调用。"""
    rows = m0 + gl.arange(0, s.shape[0], layout=gl.SliceLayout(1, s.type.layout))
    cols = n0 + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
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
def _epilogue(a, acc, m_i, l_i, b, h, m0):
    """O = acc / l 写回 out[b, m0 + i, h, :]（只写 < N 的行）；LSE = (m + log2 l)·ln 2 写回 lse[b, h, m0 + i]。"""
    layout: gl.constexpr = acc.type.layout
    rows = m0 + gl.arange(0, a.BLOCK_M, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, a.HEAD_DIM, layout=gl.SliceLayout(0, layout))
    o = acc / gl.expand_dims(l_i, 1)
    row_off = ((b * a.N + rows).to(gl.int64) * a.H + h) * a.HEAD_DIM     # out 连续：[B, N, H, d]
    ptrs = a.O + gl.expand_dims(row_off, 1) + gl.expand_dims(cols, 0)
    gl.store(ptrs, o.to(a.O.dtype.element_ty), mask=gl.expand_dims(rows < a.N, 1))
    if a.RETURN_LSE:
        lse_rows = m0 + gl.arange(0, a.BLOCK_M, layout=gl.SliceLayout(1, layout))
        lse = (m_i + gl.log2(l_i)) * 0.6931471805599453                  # 以 2 为底 → 自然对数
        gl.store(a.LSE + (b * a.H + h).to(gl.int64) * a.N + lse_rows, lse, mask=lse_rows < a.N)


# ========================================================================
# 生产者（1 个 warp）：先发 Q 块，再按顺序填 K/V 环，每格等它上一次的使用者都 arrive 了 empty
# ========================================================================
@gluon.jit
def _producer(qs, ring, tile, CONSUMERS: gl.constexpr):
    BLOCK_M: gl.constexpr = qs.desc.block_type.shape[0]
    for c in gl.static_range(CONSUMERS):
        qs.load(c, tile.q_row + c * BLOCK_M, tile.q_col)
    for j in range(tile.n_blocks1):
        ring.wait_empty(j)
        ring.load(j, j, tile.kv_row0, tile.kv_col, True)

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
#   持久内核（步骤 E）一个程序连着算好几个 Q 块：环接着往下转（base = 之前各 Q 块的块数之和），Q 的 mbarrier 每个
#   Q 块完成一个相位（q_phase）；最后一次 QKᵀ 等完就放回 Q 格，生产者这时就能把下一个 Q 块读进同一格——读 Q 的延迟
#   藏在最后一次 PV 和写回后面。
# ========================================================================
@gluon.jit
def _consumer(a, qs, ring, turn, tile, me: gl.constexpr, base, q_phase, PRODUCE: gl.constexpr,
              PERSIST: gl.constexpr):
    BLOCK_M: gl.constexpr = a.BLOCK_M
    BLOCK_N: gl.constexpr = a.BLOCK_N
    STAGES: gl.constexpr = a.STAGES
    dtype: gl.constexpr = qs.desc.dtype
    m0 = tile.m0 + me * BLOCK_M                                         # 本组的 Q 行
    n_blocks = tile.n_blocks0 if me == 0 else tile.n_blocks1           # 本组要走的 K/V 块数
    n_total = tile.n_blocks1                                            # 生产者搬的块数
    q_tile = qs.smem.index(me)                                          # [BLOCK_M, d]
    if PRODUCE:
        qs.load(0, tile.q_row, tile.q_col)
        for j in gl.static_range(STAGES - 1):
            ring.load(j, j, tile.kv_row0, tile.kv_col, j < n_total)
    qs.wait(me, q_phase)

    # 第 0 轮：S_0 = Q K_0^T（K 块 [BLOCK_N, d] 的转置视图 [d, BLOCK_N] 当 B 操作数）
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=a.s_layout)
    k_0 = ring.k(base)
    ring.wait_ready(base)
    turn.wait_mine(me, 0)
    s_tok = warpgroup_mma(q_tile, k_0.permute((1, 0)), zero_s, use_acc=False, is_async=True)
    turn.hand_over(me)
    s = warpgroup_mma_wait(0, deps=[s_tok, q_tile, k_0])[0]
    s = _mask(s, m0, 0, a.N, a.CAUSAL)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, a.s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, a.s_layout))
    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, a.qk_scale)
    acc = gl.zeros([BLOCK_M, a.HEAD_DIM], gl.float32, layout=a.o_layout)

    # 只有"边上的块"要掩码：含列 ≥ N 的最后一块，causal 时还有碰到对角线的块（列 > 块里最小的行 m0）
    first_masked = a.N // BLOCK_N
    if a.CAUSAL:
        first_masked = gl.minimum(first_masked, m0 // BLOCK_N)
    for j in range(1, n_blocks):
        i = base + j                                                    # 环上的第几块
        if PRODUCE:
            ring.load(j + STAGES - 2, j + STAGES - 2, tile.kv_row0, tile.kv_col, j + STAGES - 2 < n_total)
        ring.wait_ready(i)
        p_op = gl.convert_layout(p.to(dtype), a.p_layout)               # [BLOCK_M, BLOCK_N]，A 操作数布局
        k_j = ring.k(i)
        v_prev = ring.v(i - 1)
        turn.wait_mine(me, j)
        s_tok = warpgroup_mma(q_tile, k_j.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        o_tok = warpgroup_mma(p_op, v_prev, acc, is_async=True)
        turn.hand_over(me)
        s = warpgroup_mma_wait(1 if a.OVERLAP else 0, deps=[s_tok, q_tile, k_j])[0]
        if j >= first_masked:
            s = _mask(s, m0, j * BLOCK_N, a.N, a.CAUSAL)
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, a.qk_scale)
        acc = warpgroup_mma_wait(0, deps=[o_tok, p_op, v_prev])[0]
        if not PRODUCE:
            ring.release(i - 1)                                         # 第 j−1 块（K 和 V）用完了
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, a.o_layout)), 1)

    if PERSIST:
        qs.release(me)                                                  # 这个 Q 块的 QKᵀ 全做完了
    # 收尾轮：最后一块的 PV
    last = base + n_blocks - 1
    p_op = gl.convert_layout(p.to(dtype), a.p_layout)
    v_last = ring.v(last)
    turn.wait_mine(me, n_blocks)
    o_tok = warpgroup_mma(p_op, v_last, acc, is_async=True)
    turn.hand_over(me)
    acc = warpgroup_mma_wait(0, deps=[o_tok, p_op, v_last])[0]
    if not PRODUCE:
        ring.release(last)
        # 空轮（只有 ws2 causal 的下面那组会走）：另一组还要用的块，等它到了就放回，发射权照常交出
        for j in range(n_blocks, n_total):
            ring.wait_ready(base + j)
            turn.wait_mine(me, j + 1)
            turn.hand_over(me)
            ring.release(base + j)
    m_o = gl.convert_layout(m_i, gl.SliceLayout(1, a.o_layout))
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, a.o_layout))
    _epilogue(a, acc, m_o, l_o, tile.b, tile.h, m0)

# ========================================================================
# 持久内核（步骤 E）：grid = (SM 数,)，每个程序按 _tile_order / _tile_of 走一串 Q 块（两个计算组 + 生产者各走一遍）
# ========================================================================
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
def _producer_tiles(a, qs, ring):
    """持久内核的生产者：按程序的 Q 块顺序，每块先发第 0 块 K/V，再（等两个计算组放回 Q 格）发 Q，再发其余 K/V。"""
    n_m = gl.cdiv(a.N, 2 * a.BLOCK_M)
    p = gl.program_id(0)
    G = gl.num_programs(0)
    n_mine = _n_mine(n_m * a.BH, p, G)                               # 这个程序的 Q 块数
    base = 0
    for k in range(n_mine):
        pid_m, bh = _tile_order(_tile_of(k, p, G), n_m, a.BH, a.CHUNK_HEADS)
        tile = _geometry(a, pid_m, bh, 2)
        for j in range(tile.n_blocks1):
            i = base + j
            ring.wait_empty(i)
            ring.load(i, j, tile.kv_row0, tile.kv_col, True)
            if j == 0:      # 第 0 块 K/V 先发：等 Q 格的时候它已经在路上
                for c in gl.static_range(2):
                    qs.wait_free(c, (k & 1) ^ 1)                          # 第 0 个 Q 块不等
                    qs.load(c, tile.q_row + c * a.BLOCK_M, tile.q_col)
        base += tile.n_blocks1

@gluon.jit
def _consumer_tiles(a, qs, ring, turn, me: gl.constexpr):
    """持久内核的计算组 me：和生产者走同样的 Q 块序列，每块就是不持久时的 _consumer（环接着往下转）。"""
    n_m = gl.cdiv(a.N, 2 * a.BLOCK_M)
    p = gl.program_id(0)
    G = gl.num_programs(0)
    n_mine = _n_mine(n_m * a.BH, p, G)
    base = 0
    for k in range(n_mine):
        pid_m, bh = _tile_order(_tile_of(k, p, G), n_m, a.BH, a.CHUNK_HEADS)
        tile = _geometry(a, pid_m, bh, 2)
        _consumer(a, qs, ring, turn, tile, me, base, k & 1, False, True)
        base += tile.n_blocks1

# ========================================================================
# 内核：不持久时 program (i, b·H + h) 负责第 b 个序列、第 h 个头的 CONSUMERS 个相邻 Q 块
#   （行 [i·CONSUMERS·BLOCK_M, +CONSUMERS·BLOCK_M)）；持久时（PERSIST）grid = (SM 数,)，每个程序走一串 Q 块
#   warp_specialize 的 worker_num_regs（[24]、[240, 24]）写死在调用里：和 tile_config 的 worker_regs 是同一组数
#   worker 的参数元组写在调用处（赋给变量或用 + 拼起来的元组里，constexpr 会变成 int32 张量）
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
    q_free = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(CONSUMERS):
        mbarrier.init(q_bar.index(c), count=1)
        mbarrier.init(q_free.index(c), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=CONSUMERS)     # 一格要所有计算组都用完才能重填
    for c in gl.static_range(2):
        mbarrier.init(turn_bars.index(c), count=1)
    fence_async_shared()                                   # 初始化对 TMA（异步代理）可见
    if PINGPONG:
        mbarrier.arrive(turn_bars.index(0))                # 0 号组先发

    a = _FwdArgs(qk_scale, gl.to_tensor(N), gl.to_tensor(H), gl.to_tensor(GROUP), gl.to_tensor(BH),
                 gl.to_tensor(CHUNK_HEADS), O, LSE, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, OVERLAP, RETURN_LSE)
    qs = _QSlots(q_desc, q_smem, q_bar, q_free)
    ring = _KVRing(k_desc, v_desc, k_bufs, v_bufs, ready, empty, STAGES)
    turn = _Turn(turn_bars, PINGPONG)
    if PERSIST:          # 步骤 E：两个计算组 + 生产者，各自走同一串 Q 块
        gl.warp_specialize([
            (_consumer_tiles, (a, qs, ring, turn, gl.constexpr(0))),
            (_consumer_tiles, (a, qs, ring, turn, gl.constexpr(1))),
            (_producer_tiles, (a, qs, ring)),
        ], [4, 1], [240, 24])
    else:
        pid_m = gl.num_programs(0) - 1 - gl.program_id(0)     # 倒序发：causal 时最长的 Q 块先上 SM
        tile = _geometry(a, pid_m, gl.program_id(1), CONSUMERS)
        if WS:           # 不持久：环从 0 数起（base = 0），Q 的相位 0
            if CONSUMERS == 1:
                gl.warp_specialize([
                    (_consumer, (a, qs, ring, turn, tile, gl.constexpr(0), 0, 0, gl.constexpr(False),
                                 gl.constexpr(False))),
                    (_producer, (qs, ring, tile, CONSUMERS)),
                ], [1], [24])
            else:        # 默认分区 = 计算组 0；worker = 计算组 1（4 warp）、生产者（1 warp）
                gl.warp_specialize([
                    (_consumer, (a, qs, ring, turn, tile, gl.constexpr(0), 0, 0, gl.constexpr(False),
                                 gl.constexpr(False))),
                    (_consumer, (a, qs, ring, turn, tile, gl.constexpr(1), 0, 0, gl.constexpr(False),
                                 gl.constexpr(False))),
                    (_producer, (qs, ring, tile, CONSUMERS)),
                ], [4, 1], [240, 24])
        else:            # 步骤 A：一个 warpgroup 自己发 TMA、自己算
            _consumer(a, qs, ring, turn, tile, 0, 0, 0, True, False)


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
# 反向的状态
# ========================================================================
@aggregate
class _BwdArgs:
    """一次反向启动：标量、dK / dV 指针，块大小和寄存器布局（constexpr）。"""
    qk_scale: gl.tensor          # softmax_scale·log2 e
    scale: gl.tensor             # softmax_scale（dK 最后乘）
    N: gl.tensor
    H: gl.tensor
    n_pad: gl.tensor             # 每个头补齐到 BLOCK_M 的倍数的行数（STATS、dQ 累加器按头排）
    DK: gl.tensor                # dK、dV [B, N, H, d]（每个 query 头一份，GQA 在主机上求和）
    DV: gl.tensor
    HEAD_DIM: gl.constexpr
    BLOCK_M: gl.constexpr
    BLOCK_N: gl.constexpr
    STAGES: gl.constexpr
    CAUSAL: gl.constexpr
    HALF: gl.constexpr           # 每个计算组算 dQ 的 d/2 列
    st_layout: gl.constexpr      # Sᵀ、dPᵀ [BLOCK_N, BLOCK_M] 的 wgmma 累加器布局
    kv_layout: gl.constexpr      # dK、dV [BLOCK_N, d]
    a_layout: gl.constexpr       # Pᵀ、dSᵀ 当 A 操作数（留在寄存器里）
    dq_layout: gl.constexpr      # dQ 的一半 [BLOCK_M, d/2]

    @constexpr_function
    def __init__(self, qk_scale, scale, N, H, n_pad, DK, DV, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL):
        self.qk_scale, self.scale, self.N, self.H, self.n_pad, self.DK, self.DV = qk_scale, scale, N, H, n_pad, DK, DV
        self.HEAD_DIM, self.BLOCK_M, self.BLOCK_N = gl.constexpr(HEAD_DIM), gl.constexpr(BLOCK_M), gl.constexpr(BLOCK_N)
        self.STAGES, self.CAUSAL, self.HALF = gl.constexpr(STAGES), gl.constexpr(CAUSAL), gl.constexpr(HEAD_DIM // 2)
        mma = gl.NVMMADistributedLayout                    # 4 个 warp 沿行排，一条 wgmma 算 [64, n] × K=16
        self.st_layout = gl.constexpr(mma(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_M, 16]))
        kv_layout = mma(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
        self.kv_layout = gl.constexpr(kv_layout)
        self.a_layout = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2))
        self.dq_layout = gl.constexpr(mma(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM // 2, 16]))


@aggregate
class _KVHold:
    """程序拿住的 K、V [CONSUMERS, BLOCK_N, d]（每个计算组一份，程序里不动），[B·N, Hk·d] 的第 row 行、第 col 列起。"""
    k_desc: Desc
    v_desc: Desc
    k_smem: Smem
    v_smem: Smem
    bar: Smem
    row: gl.tensor
    col: gl.tensor

    @constexpr_function
    def __init__(self, k_desc, v_desc, k_smem, v_smem, bar, row, col):
        self.k_desc, self.v_desc, self.k_smem, self.v_smem = k_desc, v_desc, k_smem, v_smem
        self.bar, self.row, self.col = bar, row, col

    @gluon.jit
    def load(self, CONSUMERS: gl.constexpr):
        BLOCK_N: gl.constexpr = self.k_desc.block_type.shape[0]
        mbarrier.expect(self.bar.index(0), CONSUMERS * (self.k_desc.block_type.nbytes + self.v_desc.block_type.nbytes))
        for c in gl.static_range(CONSUMERS):
            tma.async_copy_global_to_shared(self.k_desc, [self.row + c * BLOCK_N, self.col], self.bar.index(0),
                                            self.k_smem.index(c))
            tma.async_copy_global_to_shared(self.v_desc, [self.row + c * BLOCK_N, self.col], self.bar.index(0),
                                            self.v_smem.index(c))

    @gluon.jit
    def wait(self):
        mbarrier.wait(self.bar.index(0), 0)


@aggregate
class _QStream:
    """
    流过程序的 Q 块：Q、dO [STAGES, BLOCK_M, d] 和这块 Q 行的 LSE·log2 e、D [STAGES, BLOCK_M] 的环，ready / empty 的
    相位规则同前向的 K/V 环（第 t 块在第 t % STAGES 格）。第 t 块 = [B·N, H·d] 里 q_row0 + t·BLOCK_M 行、q_col 列起，
    STATS [2, B·H·n_pad] 里第 st_row0 + t·BLOCK_M 个（D 再加 st_half）。
    """
    q_desc: Desc
    do_desc: Desc
    st_desc: Desc
    q_bufs: Smem
    do_bufs: Smem
    lse_bufs: Smem
    dlt_bufs: Smem
    ready: Smem
    empty: Smem
    q_row0: gl.tensor
    q_col: gl.tensor
    st_row0: gl.tensor
    st_half: gl.tensor
    STAGES: gl.constexpr

    @constexpr_function
    def __init__(self, q_desc, do_desc, st_desc, q_bufs, do_bufs, lse_bufs, dlt_bufs, ready, empty, q_row0, q_col,
                 st_row0, st_half, STAGES):
        self.q_desc, self.do_desc, self.st_desc = q_desc, do_desc, st_desc
        self.q_bufs, self.do_bufs, self.lse_bufs, self.dlt_bufs = q_bufs, do_bufs, lse_bufs, dlt_bufs
        self.ready, self.empty = ready, empty
        self.q_row0, self.q_col, self.st_row0, self.st_half = q_row0, q_col, st_row0, st_half
        self.STAGES = gl.constexpr(STAGES)

    @gluon.jit
    def load(self, t):
        """生产者：第 t 块的四份（Q、dO、LSE·log2 e、D）读进第 t % STAGES 格，先等这一格上一次用完。"""
        BLOCK_M: gl.constexpr = self.q_desc.block_type.shape[0]
        slot = t % self.STAGES
        mbarrier.wait(self.empty.index(slot), ((t // self.STAGES) & 1) ^ 1)
        bar = self.ready.index(slot)
        mbarrier.expect(bar, self.q_desc.block_type.nbytes + self.do_desc.block_type.nbytes
                        + 2 * self.st_desc.block_type.nbytes)
        row = self.q_row0 + t * BLOCK_M
        st = self.st_row0 + t * BLOCK_M
        tma.async_copy_global_to_shared(self.q_desc, [row, self.q_col], bar, self.q_bufs.index(slot))
        tma.async_copy_global_to_shared(self.do_desc, [row, self.q_col], bar, self.do_bufs.index(slot))
        tma.async_copy_global_to_shared(self.st_desc, [st], bar, self.lse_bufs.index(slot))
        tma.async_copy_global_to_shared(self.st_desc, [self.st_half + st], bar, self.dlt_bufs.index(slot))

    @gluon.jit
    def wait(self, t):
        mbarrier.wait(self.ready.index(t % self.STAGES), (t // self.STAGES) & 1)

    @gluon.jit
    def release(self, t):
        mbarrier.arrive(self.empty.index(t % self.STAGES))


@aggregate
class _DQSwap:
    """
    两个计算组交换 dSᵀ、各算 dQ 的一半列再归约：ds_smem [2·2, BLOCK_N, BLOCK_M]（轮的奇偶两份 × 两组），
    ds_bar[t % 2]（两组都写完，计数 2），dq_smem [2, BLOCK_M, d/2]（fp32，每组一块），dq_desc = fp32 的 dQ 累加器
    [B·H·n_pad, d] 的描述符，块 [BLOCK_M, d/2]。
    """
    ds_smem: Smem
    ds_bar: Smem
    dq_smem: Smem
    dq_desc: Desc

    @constexpr_function
    def __init__(self, ds_smem, ds_bar, dq_smem, dq_desc):
        self.ds_smem, self.ds_bar, self.dq_smem, self.dq_desc = ds_smem, ds_bar, dq_smem, dq_desc

    @gluon.jit
    def put(self, t, me: gl.constexpr, ds_t):
        """本组第 t 轮的 dSᵀ 写进共享内存，替全组 arrive（另一组和 wgmma 才能读）。"""
        self.ds_smem.index((t % 2) * 2 + me).store(ds_t)
        fence_async_shared()                                              # 普通写 → wgmma / 另一组（异步代理）读
        gl.thread_barrier()                                               # 本组 128 个线程都写完，才替全组 arrive
        mbarrier.arrive(self.ds_bar.index(t % 2))

    @gluon.jit
    def wait_both(self, t):
        mbarrier.wait(self.ds_bar.index(t % 2), (t // 2) & 1)             # 两组的 dSᵀ 都在共享内存里了

    @gluon.jit
    def ds(self, t, c):
        return self.ds_smem.index((t % 2) * 2 + c)                        # [BLOCK_N, BLOCK_M]

    @gluon.jit
    def reduce(self, dq, row, me: gl.constexpr):
        """本组的 dQ 半块 [BLOCK_M, d/2] 经共享内存、用 TMA 归约加进全局累加器的 row 行、me·d/2 列起（不等它完成）。"""
        my_dq = self.dq_smem.index(me)
        tma.store_wait(0)                                                 # 上一轮的归约读完了 my_dq
        gl.thread_barrier()
        my_dq.store(dq)
        fence_async_shared()
        gl.thread_barrier()
        _tma_reduce_add(self.dq_desc, [row, me * dq.shape[1]], my_dq)     # L2 里原子地加


@gluon.jit
def _bwd_producer(qst, kv, n_total, CONSUMERS: gl.constexpr):
    """生产者分区（1 个 warp）：先发这个程序的 K、V 块，再按顺序填 Q / dO 环（每格四次 TMA）。"""
    kv.load(CONSUMERS)
    for t in range(n_total):
        qst.load(t)

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
def _bwd_step(a, qst, kv, dqx, t, m0, dk, dv, dq_row, k0, me: gl.constexpr):
    """计算组 me 的第 t 轮：Q 行 m0 起的一块（环上第 t 块），本组的 K/V 行 k0 起；返回更新过的 dK、dV。"""
    dtype: gl.constexpr = kv.k_smem.dtype
    k_t = kv.k_smem.index(me)                                             # [BLOCK_N, d]
    v_t = kv.v_smem.index(me)
    slot = t % a.STAGES
    zero_s = gl.zeros([a.BLOCK_N, a.BLOCK_M], gl.float32, layout=a.st_layout)
    qst.wait(t)
    q_t = qst.q_bufs.index(slot)                                          # [BLOCK_M, d]
    do_t = qst.do_bufs.index(slot)
    # 这块 Q 行的 LSE·log2 e、D：生产者和 Q、dO 一起用 TMA 读进共享内存，这里按沿列广播的布局读出来
    lse2 = qst.lse_bufs.index(slot).load(gl.SliceLayout(0, a.st_layout))
    s_tok = warpgroup_mma(k_t, q_t.permute((1, 0)), zero_s, use_acc=False, is_async=True)     # Sᵀ = K Qᵀ
    dp_tok = warpgroup_mma(v_t, do_t.permute((1, 0)), zero_s, use_acc=False, is_async=True)   # dPᵀ = V dOᵀ
    s_t = warpgroup_mma_wait(1, deps=[s_tok, k_t, q_t])[0]
    p_t = gl.exp2(s_t * a.qk_scale - gl.expand_dims(lse2, 0))
    need_mask = (k0 + a.BLOCK_N > a.N) | (m0 + a.BLOCK_M > a.N)           # 这组的 K 行、这块 Q 行跨过序列末尾
    if a.CAUSAL:
        need_mask = need_mask | (m0 < k0 + a.BLOCK_N)                    # 碰到对角线（或整块在它上面）的块
    if need_mask:
        p_t = _mask_t(p_t, k0, m0, a.N, a.CAUSAL, a.BLOCK_N, a.BLOCK_M)
    p_op = gl.convert_layout(p_t.to(dtype), a.a_layout)                   # Pᵀ 当 A 操作数，留在寄存器里
    dv_tok = warpgroup_mma(p_op, do_t, dv, is_async=True)                 # dV += Pᵀ dO
    dp_t, dv = warpgroup_mma_wait(0, deps=[dp_tok, dv_tok, v_t, do_t, p_op])[:2]
    d_i = qst.dlt_bufs.index(slot).load(gl.SliceLayout(0, a.st_layout))
    ds_t = (p_t * (dp_t - gl.expand_dims(d_i, 0))).to(dtype)              # dSᵀ（没乘 scale：最后乘）
    ds_op = gl.convert_layout(ds_t, a.a_layout)
    dk_tok = warpgroup_mma(ds_op, q_t, dk, is_async=True)                 # dK += dSᵀ Q
    dqx.put(t, me, ds_t)
    dk = warpgroup_mma_wait(0, deps=[dk_tok, ds_op, q_t])[0]
    qst.release(t)                                                        # Q、dO 这一格用完了
    dqx.wait_both(t)
    ds0 = dqx.ds(t, 0)
    ds1 = dqx.ds(t, 1)
    zero_q = gl.zeros([a.BLOCK_M, a.HALF], gl.float32, layout=a.dq_layout)
    dq_tok = warpgroup_mma(ds0.permute((1, 0)), kv.k_smem.index(0).slice(me * a.HALF, a.HALF, dim=1), zero_q,
                           use_acc=False, is_async=True)
    dq_tok = warpgroup_mma(ds1.permute((1, 0)), kv.k_smem.index(1).slice(me * a.HALF, a.HALF, dim=1), dq_tok,
                           is_async=True)
    dq = warpgroup_mma_wait(0, deps=[dq_tok, ds0, ds1, kv.k_smem])[0]
    dqx.reduce(dq, dq_row + m0, me)                                       # 全局 dQ 累加器 += 本组的一半
    return dk, dv

@gluon.jit
def _bwd_consumer(a, qst, kv, dqx, b, h, k0, start, n_q, me: gl.constexpr):
    """计算组 me 拿 K/V 的第 k0 行起 BLOCK_N 行，走 Q 块 start .. n_q − 1（每一轮见 _bwd_step）。"""
    dk = gl.zeros([a.BLOCK_N, a.HEAD_DIM], gl.float32, layout=a.kv_layout)
    dv = gl.zeros([a.BLOCK_N, a.HEAD_DIM], gl.float32, layout=a.kv_layout)
    dq_row = (b * a.H + h) * a.n_pad                                      # 这个头在 dQ 累加器里的第 0 行
    kv.wait()
    for j in range(start, n_q):
        dk, dv = _bwd_step(a, qst, kv, dqx, j - start, j * a.BLOCK_M, dk, dv, dq_row, k0, me)
    tma.store_wait(0)

    # 收尾：dK 乘 scale，dK、dV 写回（只写 < N 的行）；DK、DV 是 [B, N, H, d]（每个 query 头一份，GQA 在主机上求和）
    rows = k0 + gl.arange(0, a.BLOCK_N, layout=gl.SliceLayout(1, a.kv_layout))
    cols = gl.arange(0, a.HEAD_DIM, layout=gl.SliceLayout(0, a.kv_layout))
    offs = gl.expand_dims(((b * a.N + rows).to(gl.int64) * a.H + h) * a.HEAD_DIM, 1) + gl.expand_dims(cols, 0)
    ok = gl.expand_dims(rows < a.N, 1)
    gl.store(a.DK + offs, (dk * a.scale).to(a.DK.dtype.element_ty), mask=ok)
    gl.store(a.DV + offs, dv.to(a.DV.dtype.element_ty), mask=ok)

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
    n_q = gl.cdiv(N, BLOCK_M)
    # 第一个要算的 Q 块：causal 时从含第 n0 行的块开始（更早的块整块在对角线之上）。两组从同一块走起
    # （见上面的说明），交换 dSᵀ 时步调一致
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
    dq_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, HEAD_DIM // 2], DQ.layout)
    ds_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(2):
        mbarrier.init(ds_bar.index(s), count=2)
    fence_async_shared()

    a = _BwdArgs(qk_scale, scale, gl.to_tensor(N), gl.to_tensor(H), gl.to_tensor(n_pad), DK, DV, HEAD_DIM, BLOCK_M,
                 BLOCK_N, STAGES, CAUSAL)
    kv = _KVHold(k_desc, v_desc, k_smem, v_smem, kv_bar, b * N + n0, (h // GROUP) * HEAD_DIM)  # [B·N, Hk·d] 的行、列
    qst = _QStream(q_desc, do_desc, st_desc, q_bufs, do_bufs, lse_bufs, dlt_bufs, ready, empty,
                   b * N + start0 * BLOCK_M, h * HEAD_DIM, bh * n_pad + start0 * BLOCK_M, gl.num_programs(1) * n_pad,
                   STAGES)
    dqx = _DQSwap(ds_smem, ds_bar, dq_smem, DQ)                # DQ：fp32 dQ 累加器的描述符，块 [BLOCK_M, d/2]
    # 默认分区 = 计算组 0；worker = 计算组 1（4 warp）、生产者（1 warp）。start0 要是张量（两组的参数类型一样）
    gl.warp_specialize([
        (_bwd_consumer, (a, qst, kv, dqx, b, h, n0, gl.to_tensor(start0), n_q, gl.constexpr(0))),
        (_bwd_consumer, (a, qst, kv, dqx, b, h, n0 + BLOCK_N, gl.to_tensor(start0), n_q, gl.constexpr(1))),
        (_bwd_producer, (qst, kv, n_total, CONSUMERS)),
    ], [4, 1], [240, 24])


if __name__ == "__main__":          # 内核的检查在 gluon_flash（没有 Hopper GPU 时一行 SKIP、退出码 77）
    import gluon_flash
    gluon_flash._selftest()
