"""
gluon_kernels · gluon_flash 的内核本身（Gluon 写的 FA3 式前向、反向）：只在 triton ≥ 3.6 的 Gluon 可用时导入。

gluon_flash.py 讲每一步做什么、为什么，主机端的启动、检查、autograd 和自检也在那里；这里只放 @gluon.jit 的函数，
顶层直接导入 Gluon（没有它时 import 本模块失败，gluon_flash 记下原因、attention() 报错）。
  前向   _attn_fwd：生产者 warp（_producer / _producer_tiles）用 TMA 填 K/V 环，计算组（_consumer / _consumer_tiles）
         做在线 softmax 和 wgmma；constexpr 开关（gluon_flash.FLAGS）一步步打开 A → E
  反向   _bwd_preprocess（D = Σ dO∘O、LSE 按头排）、_attn_bwd（一个程序拿住 128 行 K/V，Q、dO 流过，5 次矩阵乘）、
         _dq_convert（fp32 的 dQ 累加器 → 输入的 dtype）；_tma_reduce_add 直接调 IR 构造器做 TMA 归约写回
依赖 triton ≥ 3.6（triton.experimental.gluon；Gluon 的接口还在变，本文件按 3.6 写）。
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton._C.libtriton import ir as _ir
from triton.language.core import builtin as _builtin


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


if __name__ == "__main__":          # 内核的检查在 gluon_flash（没有 Hopper GPU 时一行 SKIP、退出码 77）
    import gluon_flash
    gluon_flash._selftest()
