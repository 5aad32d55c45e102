"""第 11 讲（numpy 部分）练习的评分检查：在线 softmax、merge_states、FA2 前向与 IO 账、重算反向、split-KV decode。

每个检查用固定种子、不规则的尺寸，和这里手写的 float64 参考（不调用 flash_lab 自己的参考实现）比较，
失败时说出第一条没满足的性质。被测函数一律经模块属性调用（fl.merge_states），错误答案语料才能替换它。
"""
import math

import numpy as np
from grading import close, exercise, expect, expect_no_calls, module
from hypothesis import given, settings
from hypothesis import strategies as st

fl = module("lecture11", "flash_lab")


# =============================================================================
# 这个文件自己的 float64 参考（按定义写，不分块）
# =============================================================================
def _softmax_ref(x):
    """逐行 softmax；整行 −∞ 的行给 0。"""
    x = np.asarray(x, dtype=np.float64)
    top = np.max(x, axis=-1, keepdims=True) if x.shape[-1] else np.zeros(x.shape[:-1] + (1,))
    empty = np.isneginf(top)
    w = np.exp(x - np.where(empty, 0.0, top))
    tot = w.sum(axis=-1, keepdims=True)
    return np.where(tot > 0, w / np.where(tot > 0, tot, 1.0), 0.0)


def _state_ref(x, v=None):
    """一段分数的 (m, l, o)：m = 最大值，l = Σ e^{x−m}，o = Σ e^{x−m}·v。空段 (−∞, 0, 0)。"""
    x = np.asarray(x, dtype=np.float64)
    if x.shape[-1] == 0:
        m = -np.inf * np.ones(x.shape[:-1])
        return m, np.zeros_like(m), None if v is None else np.zeros(x.shape[:-1] + (v.shape[1],))
    m = x.max(axis=-1)
    w = np.exp(x - np.where(np.isneginf(m), 0.0, m)[..., None])
    return m, w.sum(axis=-1), None if v is None else w @ v


def _visible_ref(N, Nk, causal, shift=0):
    """[N, Nk]：query i（位置 Nk − N + i）看得见 key j ⇔ j ≤ Nk − N + i（右下角对齐）；shift 只给诊断用。"""
    if not causal:
        return np.ones((N, Nk), dtype=bool)
    return np.arange(Nk)[None, :] <= (Nk - N) + np.arange(N)[:, None] + shift


def _attention_ref(Q, K, V, causal=False, scale=None, shift=0):
    """整张矩阵的注意力：返回 (O, L, P)。没有可见 key 的行 O = 0、L = −∞、P = 0。"""
    N, d = Q.shape
    Nk = K.shape[0]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    vis = _visible_ref(N, Nk, causal, shift)
    S = np.where(vis, scale * (Q @ K.T), -np.inf)             # [N, Nk]
    has = vis.any(axis=1)
    top = np.where(has, S.max(axis=1), 0.0)
    W = np.where(vis, np.exp(S - top[:, None]), 0.0)
    tot = W.sum(axis=1)
    P = W / np.where(has, tot, 1.0)[:, None]
    with np.errstate(divide="ignore"):
        L = np.where(has, top + np.log(np.where(has, tot, 1.0)), -np.inf)
    return P @ V, L, P


def _grads_ref(Q, K, V, dO, causal=False, scale=None):
    """loss = Σ O∘dO 对 Q、K、V 的梯度，用整张 P 按链式法则写（D 取 rowsum(P∘dP)，另一种写法）。"""
    scale = 1.0 / math.sqrt(Q.shape[1]) if scale is None else scale
    _, _, P = _attention_ref(Q, K, V, causal, scale)
    dPm = dO @ V.T                                            # [N, Nk]
    dSm = P * (dPm - (P * dPm).sum(axis=1, keepdims=True))
    return scale * (dSm @ K), scale * (dSm.T @ Q), P.T @ dO


def _qkv(rng, N, Nk, d, dv, spread=1.0):
    return (spread * rng.standard_normal((N, d)), spread * rng.standard_normal((Nk, d)),
            rng.standard_normal((Nk, dv)))


def _live_ref(N, Nk, Br, Bc, causal):
    """[Tr, Tc]：块 (i, j) 里有没有至少一对看得见的 (query, key)，逐对数出来。"""
    vis = _visible_ref(N, Nk, causal)
    return np.array([[vis[i0:i0 + Br, j0:j0 + Bc].any() for j0 in range(0, Nk, Bc)]
                     for i0 in range(0, N, Br)])


def _block_rows(n, b):
    return np.array([min(b, n - s) for s in range(0, n, b)])


# 不规则的形状 (N, Nk, d, dv, Br, Bc)：块不整除、块比长度大、N ≠ Nk、N > Nk、单元素
FWD_SHAPES = [(1, 1, 1, 1, 1, 1), (37, 23, 6, 9, 8, 5), (50, 64, 8, 5, 16, 12), (17, 40, 3, 7, 64, 7),
              (64, 64, 16, 16, 16, 16), (9, 33, 5, 4, 2, 1), (29, 29, 4, 3, 6, 4), (41, 13, 5, 6, 7, 3)]


# =============================================================================
# 练习 11.1：在线 softmax
# =============================================================================
def _online(x, block):
    y, passes = fl.softmax_online(x, block=block)
    expect(passes == 2, f"softmax_online 应返回 (y, 2)：在线 softmax 只读两遍数据，收到遍数 {passes!r}")
    return y


@exercise("11.1")
def test_online_softmax_equals_three_pass():
    rng = np.random.default_rng(1101)
    for shape, block in (((3, 1), 1), ((4, 37), 5), ((2, 3, 50), 7), ((5, 128), 128), ((3, 129), 128),
                         ((2, 10), 64), ((6, 301), 37), ((1, 2), 1)):
        x = 4 * rng.standard_normal(shape)
        close(_online(x, block), _softmax_ref(x), atol=1e-14, rtol=1e-12,
              message=f"形状 {shape}、block = {block}：在线 softmax 与三遍 softmax 不一致")
    # 被掩码的位置（−∞）：随机散布、整行 −∞、第一块全是 −∞
    x = 3 * rng.standard_normal((5, 23))
    x[rng.random(x.shape) < 0.3] = -np.inf
    x[1] = -np.inf
    x[3, :8] = -np.inf
    for block in (1, 4, 8, 23, 50):
        y = _online(x, block)
        expect(not np.isnan(y).any(), f"block = {block}：含 −∞ 的输入给出了 NaN（exp(−∞ − (−∞)) 要避开）")
        expect(np.array_equal(y[1], np.zeros(23)), f"block = {block}：整行都是 −∞ 的行应输出全 0")
        close(y, _softmax_ref(x), atol=1e-14, rtol=1e-12,
              message=f"block = {block}：含 −∞（被掩码）的行与三遍 softmax 不一致")


@exercise("11.1")
def test_online_softmax_huge_logits_do_not_overflow():
    rng = np.random.default_rng(1102)
    base = 30 * rng.standard_normal((4, 97))
    want = _softmax_ref(base)
    for shift in (800.0, -800.0, 1e5, -1e5):
        with np.errstate(over="ignore", invalid="ignore"):
            y = _online(base + shift, 10)
        expect(np.isfinite(y).all(), f"分数整体加上 {shift:g} 后结果有 NaN/inf：exp 之前要先减去（当前的）最大值")
        close(y, want, atol=1e-12, rtol=1e-9, message=f"softmax 应与平移无关：分数加上 {shift:g} 后结果变了")


@exercise("11.1")
def test_online_softmax_rescales_running_sum():
    # 最大值在后面的块里、前面的块分量不小：旧的 l 不乘 exp(m − m') 就错
    rows = np.array([[0.0] * 7 + [3.0, 6.0, 9.0],
                     [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0],
                     [5.0, -1.0, 0.0, 2.0, 5.5, 5.0, 9.0, 9.5, 3.0, 12.0]])
    for block in (1, 2, 3, 4):
        close(_online(rows, block), _softmax_ref(rows), atol=1e-14, rtol=1e-12,
              message=f"块边界处没有按新的最大值重新缩放已累加的分母（block = {block}，最大值出现在后面的块）")
    expect_no_calls(fl.softmax_online, ["softmax_3pass", "partial_state", "merge_states", "naive_attention"],
                    why="在线 softmax 的 (m, l) 递推要自己写")


class _Reads(np.ndarray):
    """记下每次对 x（或它的切片）做的运算读了多宽：WIDTHS 里一项 = 那次运算的最后一维长度。"""
    WIDTHS = []

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        for t in inputs:
            if isinstance(t, _Reads):
                _Reads.WIDTHS.append(t.shape[-1])
        plain = [t.view(np.ndarray) if isinstance(t, _Reads) else t for t in inputs]
        return getattr(ufunc, method)(*plain, **kwargs)


@exercise("11.1")
def test_online_softmax_reads_statistics_block_by_block():
    # 在线 softmax 的意义：统计量 (m, l) 那一遍一块一块地读（每次最多 block 个元素），整行只在最后归一化时读一遍。
    # 三遍 softmax（先整行求 max、再整行 exp、再求和）结果一样，但整行读了不止一遍——它不是这个练习要写的算法。
    rng = np.random.default_rng(1104)
    x = 3 * rng.standard_normal((4, 50))
    real = fl.check_array

    def keep_wrapper(name, value, **kw):                 # 入口的检查照做，但把记账的视图原样交给练习的代码
        real(name, np.asarray(value), **kw)
        return value
    from grading import patched
    for block in (7, 16):
        _Reads.WIDTHS = []
        with patched("lecture11", "flash_lab", "check_array", keep_wrapper):
            y, _ = fl.softmax_online(x.copy().view(_Reads), block)
        close(np.asarray(y), _softmax_ref(x), atol=1e-14, rtol=1e-12, message=f"在线 softmax 的结果不对（block = {block}）")
        expect(_Reads.WIDTHS, "练习代码把 x 又转换了一次（如 np.asarray(x)）：入口的 check_array 已经把它变成 float64 数组，"
                              "直接用它（这个检查要数你读 x 的方式）")
        whole = sum(w > block for w in _Reads.WIDTHS)
        expect(whole <= 1 and any(w <= block for w in _Reads.WIDTHS),
               f"统计量 (m, l) 要一块一块地更新（每次最多 block = {block} 个元素），整行只能在最后归一化时读一遍；"
               f"你的实现整行读了 x {whole} 遍——这是三遍 softmax，不是在线 softmax")


@exercise("11.1")
@settings(deadline=None, max_examples=25)
@given(st.integers(0, 2**32 - 1), st.integers(1, 40), st.integers(1, 45))
def test_online_softmax_any_block_property(seed, n, block):
    rng = np.random.default_rng(seed)
    x = 6 * rng.standard_normal((3, n)) + rng.choice([0.0, 500.0, -500.0])
    x[rng.random(x.shape) < 0.2] = -np.inf
    close(_online(x, block), _softmax_ref(x), atol=1e-14, rtol=1e-12,
          message=f"长度 {n}、block = {block}（种子 {seed}）：在线 softmax 与三遍 softmax 不一致")


# =============================================================================
# 练习 11.2：merge_states
# =============================================================================
def _close_state(got, want, msg):
    m, l, o = got
    expect(np.array_equal(np.asarray(m), want[0]), f"{msg}：合并后的 m 应是各段最大值中最大的那个")
    close(l, want[1], atol=1e-300, rtol=1e-12, message=f"{msg}：分母 l 不对")
    if want[2] is None:
        expect(o is None, f"{msg}：o 同为 None 时结果的 o 也应是 None")
    else:
        close(o, want[2], atol=1e-12, rtol=1e-12, message=f"{msg}：输出 o 不对")


@exercise("11.2")
def test_merge_of_pieces_equals_whole():
    rng = np.random.default_rng(1121)
    x = 8 * rng.standard_normal((3, 211))                   # 各段最大值差得多：不换算一眼就错
    v = rng.standard_normal((211, 5))
    whole = _state_ref(x, v)
    for _trial in range(6):
        cuts = np.sort(rng.integers(0, 212, size=rng.integers(1, 7)))   # 可以重复：有空段
        edges = np.concatenate([[0], cuts, [211]])
        pieces = [(_state_ref(x[:, a:b], v[a:b])) for a, b in zip(edges[:-1], edges[1:])]
        order = rng.permutation(len(pieces))
        acc = pieces[order[0]]
        for k in order[1:]:
            acc = fl.merge_states(acc, pieces[k])
        _close_state(acc, whole, f"切点 {cuts.tolist()}、按顺序 {order.tolist()} 合并各段后应等于整段")
        # 只合并分母（o 为 None）
        accl = (pieces[0][0], pieces[0][1], None)
        for p in pieces[1:]:
            accl = fl.merge_states(accl, (p[0], p[1], None))
        _close_state(accl, (whole[0], whole[1], None), f"切点 {cuts.tolist()}、o = None")


def _random_state(rng, R, dv):
    m = rng.uniform(-40, 40, R)
    l = rng.uniform(0.5, 20, R)
    o = rng.standard_normal((R, dv)) * l[:, None]
    empty = rng.random(R) < 0.25
    m[empty], l[empty], o[empty] = -np.inf, 0.0, 0.0
    return m, l, o


@exercise("11.2")
@settings(deadline=None, max_examples=25)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.integers(1, 4))
def test_merge_commutative_associative(seed, R, dv):
    rng = np.random.default_rng(seed)
    a, b, c = (_random_state(rng, R, dv) for _ in range(3))
    ab, ba = fl.merge_states(a, b), fl.merge_states(b, a)
    expect(not any(np.isnan(x).any() for x in ab + ba),
           f"合并结果里有 NaN（种子 {seed}）：两边 m 都是 −∞（空）的行算了 −∞ − (−∞)，减数里的 −∞ 要换成 0")
    expect(all(np.array_equal(x, y) for x, y in zip(ab, ba)),
           f"交换律应逐位成立：merge(a, b) 与 merge(b, a) 不同（种子 {seed}）")
    left, right = fl.merge_states(ab, c), fl.merge_states(a, fl.merge_states(b, c))
    expect(np.array_equal(left[0], right[0]), f"结合律：两种合并顺序的 m 不同（种子 {seed}）")
    close(left[1], right[1], atol=1e-300, rtol=1e-12, message=f"结合律：(a·b)·c 与 a·(b·c) 的 l 不同（种子 {seed}）")
    close(left[2], right[2], atol=1e-10, rtol=1e-12, message=f"结合律：(a·b)·c 与 a·(b·c) 的 o 不同（种子 {seed}）")


@exercise("11.2")
def test_merge_empty_state_is_identity():
    rng = np.random.default_rng(1123)
    a = _random_state(rng, 7, 3)
    empty = (np.full(7, -np.inf), np.zeros(7), np.zeros((7, 3)))
    with np.errstate(invalid="raise"):                       # exp(−∞ − (−∞)) 会在这里报出来
        try:
            got = [fl.merge_states(a, empty), fl.merge_states(empty, a), fl.merge_states(empty, empty)]
        except FloatingPointError:
            expect(False, "合并空状态 (−∞, 0, 0) 时算了 −∞ − (−∞)（NaN）：减数里的 −∞ 要换成 0")
    for res, what in zip(got[:2], ("merge(a, 空)", "merge(空, a)")):
        expect(all(np.array_equal(x, y) for x, y in zip(res, a)), f"{what} 应逐位等于 a：空状态是单位元")
    m, l, o = got[2]
    expect(np.isneginf(m).all() and np.array_equal(l, np.zeros(7)) and np.array_equal(o, np.zeros((7, 3))),
           "两个空状态合并应仍是空状态 (−∞, 0, 0)，不能出现 NaN")


@exercise("11.2")
def test_merge_rescales_to_new_max():
    a = (np.array([0.0, 4.0, -3.0]), np.array([2.0, 1.5, 4.0]), np.array([[1.0, 2.0], [0.5, -1.0], [3.0, 1.0]]))
    b = (np.array([2.0, 1.0, -3.0]), np.array([3.0, 2.0, 0.5]), np.array([[4.0, 5.0], [2.0, 2.0], [-1.0, 0.0]]))
    m = np.maximum(a[0], b[0])
    wa, wb = np.exp(a[0] - m), np.exp(b[0] - m)              # 两边都换算到新的最大值
    got = fl.merge_states(a, b)
    expect(np.array_equal(got[0], m), "合并后的 m 应是 max(m_a, m_b)")
    close(got[1], wa * a[1] + wb * b[1], atol=1e-15, rtol=1e-13,
          message="合并时没有按新的最大值重新缩放分母：l 应为 e^{m_a−m}·l_a + e^{m_b−m}·l_b")
    close(got[2], wa[:, None] * a[2] + wb[:, None] * b[2], atol=1e-15, rtol=1e-13,
          message="输出要按和分母同样的权重相加：o 应为 e^{m_a−m}·o_a + e^{m_b−m}·o_b")
    expect_no_calls(fl.merge_states, ["partial_state", "softmax_3pass", "softmax_online", "split_kv_decode",
                                      "naive_attention"], why="合并两个状态的换算要自己写")


# =============================================================================
# 练习 11.3：FA2 前向（order="fa2"）与它的 IO 账
# =============================================================================
def _check_fwd(Q, K, V, Br, Bc, causal, scale, where):
    O, L, io = fl.flash_fwd(Q, K, V, Br, Bc, causal, scale, order="fa2")
    O_ref, L_ref, _ = _attention_ref(Q, K, V, causal, scale)
    empty = np.isneginf(L_ref)
    if empty.any():
        expect(np.array_equal(O[empty], np.zeros_like(O[empty])) and np.isneginf(L[empty]).all(),
               f"{where}：没有可见 key 的行（causal 且 N > Nk 的前 N − Nk 行）应给 O = 0、L = −∞")
    bad = np.flatnonzero(np.abs(O - O_ref).max(axis=1) > 1e-12 + 1e-10 * np.abs(O_ref).max(axis=1))
    if causal and bad.size:
        row = int(bad[0])
        pos = K.shape[0] - Q.shape[0] + row
        for shift, how in ((-1, "少看了对角线上的 key（它自己的位置）——对角块的掩码写成了 k < q，或跳过整块的条件差了一"), (1, "多看了一个 key（k ≤ q + 1）")):
            O_sh = _attention_ref(Q, K, V, True, scale, shift=shift)[0]
            expect(not np.allclose(O[row], O_sh[row], atol=1e-12, rtol=1e-10),
                   f"{where}：causal 掩码错了一位：第 {row} 行 query（位置 {pos}）{how}；"
                   f"它应看得见位置 0…{pos} 的 key（含它自己）")
        expect(False, f"{where}：第 {row} 行 query（位置 {pos}）的输出不对；它应看得见位置 0…{pos} 的 key"
                      f"（含它自己）——查一查跳过整块的条件、对角块里的掩码和在线 softmax 的更新")
    close(O, O_ref, atol=1e-12, rtol=1e-10, message=f"{where}：输出与逐行 softmax 注意力不一致")
    close(np.where(empty, 0.0, L), np.where(empty, 0.0, L_ref), atol=1e-12, rtol=1e-12,
          message=f"{where}：L（每行的 log-sum-exp = m + log l）不对")
    return io


@exercise("11.3")
def test_fa2_forward_matches_attention():
    rng = np.random.default_rng(1131)
    for N, Nk, d, dv, Br, Bc in FWD_SHAPES:
        Q, K, V = _qkv(rng, N, Nk, d, dv)
        for scale in (None, 0.37):
            _check_fwd(Q, K, V, Br, Bc, False, scale, f"非 causal，N={N}、Nk={Nk}、d={d}、dv={dv}、Br={Br}、Bc={Bc}")


@exercise("11.3")
def test_fa2_forward_causal():
    rng = np.random.default_rng(1132)
    for N, Nk, d, dv, Br, Bc in FWD_SHAPES + [(12, 12, 4, 4, 4, 4), (10, 16, 3, 2, 3, 5), (16, 16, 2, 2, 5, 3)]:
        Q, K, V = _qkv(rng, N, Nk, d, dv)
        _check_fwd(Q, K, V, Br, Bc, True, None, f"causal，N={N}、Nk={Nk}、Br={Br}、Bc={Bc}")


@exercise("11.3")
def test_fa2_lse_with_huge_logits():
    rng = np.random.default_rng(1133)
    for N, Nk, Br, Bc, causal in ((23, 31, 5, 4, False), (23, 31, 5, 4, True), (19, 8, 4, 3, True)):
        Q, K, V = _qkv(rng, N, Nk, 4, 3, spread=25.0)        # 分数上千：exp 之前不减最大值就溢出
        with np.errstate(over="ignore", invalid="ignore"):
            _check_fwd(Q, K, V, Br, Bc, causal, None, f"分数很大（|S| 上千），causal={causal}")


@exercise("11.3")
def test_fa2_io_ledger_equals_formula():
    rng = np.random.default_rng(1134)
    for N, Nk, d, dv, Br, Bc in FWD_SHAPES:
        Q, K, V = _qkv(rng, N, Nk, d, dv)
        for causal in (False, True):
            where = f"N={N}、Nk={Nk}、d={d}、dv={dv}、Br={Br}、Bc={Bc}、causal={causal}"
            io = fl.flash_fwd(Q, K, V, Br, Bc, causal, order="fa2")[2]
            q_read = io.notes.get("Q", {}).get("read", 0)
            expect(q_read == N * d, f"{where}：FA2 里每个 Q 块只读一遍，Q 应读 N·d = {N * d} 个元素，账上是 {q_read}")
            for what, kind, want in (("O", "write", N * dv), ("L", "write", N)):
                got = io.notes.get(what, {}).get(kind, 0)
                expect(got == want, f"{where}：{what} 应在循环结束后只写一遍（{want} 个元素），账上是 {got}")
            live = _live_ref(N, Nk, Br, Bc, causal)
            pairs = np.multiply.outer(_block_rows(N, Br), _block_rows(Nk, Bc))
            kv = int((live * _block_rows(Nk, Bc)[None, :]).sum()) * (d + dv)
            got = io.notes.get("K,V", {}).get("read", 0)
            expect(got == kv, f"{where}：K、V 应只读活块（至少一对可见的块），共 {kv} 个元素，账上是 {got}")
            want = fl.fa_io_formula(N, d, 4 * d * Bc, "fa2", Nk=Nk, dv=dv, Br=Br, Bc=Bc, causal=causal)
            expect(io.total == want, f"{where}：读写总数 {io.total} ≠ fa_io_formula 的 {want}")
            flops = 2 * int((pairs * live).sum()) * (d + dv)
            expect(io.flops == flops, f"{where}：FLOPs 应为 2·Σ_活块 br·bc·(d + dv) = {flops}，账上是 {io.flops}")
    expect_no_calls(fl._fwd_fa2, ["naive_attention", "standard_attention", "reference_lse", "flash_fwd", "_fwd_fa1",
                                  "softmax_3pass", "softmax_online", "split_kv_decode"],
                    why="FA2 的分块循环要自己写")


# =============================================================================
# 练习 11.4：重算的反向
# =============================================================================
BWD_SHAPES = [(12, 12, 4, 4, 4, 5), (9, 14, 5, 3, 4, 3), (11, 6, 3, 4, 5, 2), (1, 7, 2, 3, 1, 4),
              (20, 20, 6, 2, 7, 20), (16, 9, 3, 3, 16, 1)]


def _bwd_inputs(rng, N, Nk, d, dv, causal, scale):
    Q, K, V = _qkv(rng, N, Nk, d, dv)
    dO = rng.standard_normal((N, dv))
    O, L, _ = _attention_ref(Q, K, V, causal, scale)
    return Q, K, V, O, dO, L


@exercise("11.4")
def test_bwd_matches_reference_gradients():
    rng = np.random.default_rng(1141)
    for N, Nk, d, dv, Br, Bc in BWD_SHAPES:
        for causal in (False, True):
            for scale in (None, 0.7):
                Q, K, V, O, dO, L = _bwd_inputs(rng, N, Nk, d, dv, causal, scale)
                got = fl.flash_bwd(Q, K, V, O, dO, L, Br, Bc, causal, scale)[:3]
                want = _grads_ref(Q, K, V, dO, causal, scale)
                for name, g, w in zip(("dQ", "dK", "dV"), got, want):
                    close(g, w, atol=1e-11, rtol=1e-9,
                          message=f"{name} 与整张矩阵的链式法则不一致（N={N}、Nk={Nk}、Br={Br}、Bc={Bc}、"
                                  f"causal={causal}、scale={scale}）")


@exercise("11.4")
def test_bwd_matches_finite_differences():
    rng = np.random.default_rng(1142)
    eps = 1e-6                                                # 中心差分：截断 O(eps²)，舍入 O(1e-16 / eps)
    for N, Nk, d, dv, Br, Bc, causal in ((7, 10, 3, 2, 3, 4, True), (8, 5, 4, 3, 3, 2, False)):
        Q, K, V, O, dO, L = _bwd_inputs(rng, N, Nk, d, dv, causal, None)
        got = fl.flash_bwd(Q, K, V, O, dO, L, Br, Bc, causal)[:3]
        for which, name in enumerate(("Q", "K", "V")):
            X = (Q, K, V)[which]
            for _ in range(3):
                r, c = int(rng.integers(X.shape[0])), int(rng.integers(X.shape[1]))
                vals = []
                for sgn in (1, -1):
                    args = [Q.copy(), K.copy(), V.copy()]
                    args[which][r, c] += sgn * eps
                    vals.append(float(np.sum(_attention_ref(*args, causal)[0] * dO)))
                num = (vals[0] - vals[1]) / (2 * eps)
                expect(abs(num - got[which][r, c]) < 1e-7,
                       f"d{name}[{r}, {c}] = {got[which][r, c]:.8g}，有限差分给 {num:.8g}（causal={causal}）")


@exercise("11.4")
def test_bwd_recomputes_p_from_saved_lse():
    rng = np.random.default_rng(1143)
    for N, Nk, d, dv, Br, Bc, causal in ((10, 13, 4, 3, 3, 4, True), (9, 9, 3, 5, 4, 2, False)):
        Q, K, V, O, dO, L = _bwd_inputs(rng, N, Nk, d, dv, causal, None)
        base = fl.flash_bwd(Q, K, V, O, dO, L, Br, Bc, causal)[:3]
        half = fl.flash_bwd(Q, K, V, O, dO, L + math.log(2.0), Br, Bc, causal)[:3]
        for name, h, b in zip(("dQ", "dK", "dV"), half, base):
            close(h, b / 2, atol=1e-13, rtol=1e-11,
                  message=f"反向要用传入的 L 重算 P = exp(S − L)（不要自己重新求行最大值、分母）："
                          f"把 L 加上 log 2，{name} 应正好减半")


def _bwd_io_ref(N, Nk, d, dv, Br, Bc, causal):
    """flash_bwd 的 IO 账（docstring 里的约定），按块数出来：(读 + 写的元素数, FLOPs)。"""
    live = _live_ref(N, Nk, Br, Bc, causal)
    br, bc = _block_rows(N, Br), _block_rows(Nk, Bc)
    rows = int((live * br[:, None]).sum())                    # Σ_活块 br_i
    total = (2 * N * dv + N) + N * d + 2 * Nk * (d + dv) + rows * (d + dv + 2) + rows * 2 * d
    flops = 2 * int((np.multiply.outer(br, bc) * live).sum()) * (3 * d + 2 * dv)
    return total, flops


@exercise("11.4")
def test_bwd_io_ledger():
    rng = np.random.default_rng(1144)
    for N, Nk, d, dv, Br, Bc in BWD_SHAPES:
        for causal in (False, True):
            Q, K, V, O, dO, L = _bwd_inputs(rng, N, Nk, d, dv, causal, None)
            io = fl.flash_bwd(Q, K, V, O, dO, L, Br, Bc, causal)[3]
            where = f"N={N}、Nk={Nk}、d={d}、dv={dv}、Br={Br}、Bc={Bc}、causal={causal}"
            kv = io.notes.get("K,V", {}).get("read", 0)
            expect(kv == Nk * (d + dv), f"{where}：外层循环 K、V 的块，K、V 只读一遍（{Nk * (d + dv)} 个元素），账上是 {kv}")
            total, flops = _bwd_io_ref(N, Nk, d, dv, Br, Bc, causal)
            expect(io.total == total, f"{where}：反向读写总数 {io.total} ≠ 按 docstring 的账算出的 {total}"
                                      f"（跳过整块看不见的块；dQ 每个活块读一次、写一次）")
            expect(io.flops == flops, f"{where}：FLOPs 应为每个活块 5 次矩阵乘 2·br·bc·(3d + 2dv)，共 {flops}，"
                                      f"账上是 {io.flops}")
    expect_no_calls(fl.flash_bwd, ["standard_attention_bwd", "standard_attention", "naive_attention", "flash_fwd",
                                   "_fwd_fa2", "_fwd_fa1", "reference_lse", "softmax_3pass"],
                    why="重算 P 的分块反向要自己写")


# =============================================================================
# 练习 11.5：split-KV（flash-decoding）
# =============================================================================
def _decode_ref(q, K, V, scale=None):
    """单遍的注意力：(o, lse)。"""
    O, L, _ = _attention_ref(q, K, V, False, scale)
    return O, L


def _even_segments(S, n):
    sizes = [S // n + (1 if s < S % n else 0) for s in range(n)]
    edges = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


@exercise("11.5")
def test_split_decode_every_split_count():
    rng = np.random.default_rng(1151)
    for R, S, d, dv in ((3, 37, 6, 5), (1, 1, 4, 2), (4, 16, 3, 3)):
        q, K, V = _qkv(rng, R, S, d, dv, spread=2.0)
        o_ref, lse_ref = _decode_ref(q, K, V)
        for n in range(1, S + 4):                             # 含不整除 S 的段数、多于 key 数的段数（空段）
            o, lse, _ = fl.split_kv_decode(q, K, V, n)
            close(o, o_ref, atol=1e-12, rtol=1e-10, message=f"R={R}、S={S}、切成 {n} 段：合并后的输出不等于单遍注意力")
            close(lse, lse_ref, atol=1e-12, rtol=1e-12, message=f"R={R}、S={S}、切成 {n} 段：合并后的 lse 不对")


@exercise("11.5")
def test_split_decode_parts_are_even_segments():
    rng = np.random.default_rng(1152)
    R, S, d, dv = 3, 37, 5, 4
    q, K, V = _qkv(rng, R, S, d, dv, spread=2.0)
    for n in (1, 4, 5, 10, 36, 37, 40):
        parts = fl.split_kv_decode(q, K, V, n)[2]
        segs = _even_segments(S, n)
        expect(len(parts) == len(segs), f"切成 {n} 段（S = {S}）应有 {len(segs)} 个非空段，parts 里有 {len(parts)} 个"
                                        f"（不整除时前 S % n 段各多 1 个 key，最后一段也不能丢）")
        for k, ((o_s, lse_s), (a, b)) in enumerate(zip(parts, segs)):
            o_w, l_w = _decode_ref(q, K[a:b], V[a:b])
            close(o_s, o_w, atol=1e-12, rtol=1e-10,
                  message=f"切成 {n} 段：parts[{k}] 的 o_s 应是 key [{a}, {b}) 这一段自己归一化的输出")
            close(lse_s, l_w, atol=1e-12, rtol=1e-12, message=f"切成 {n} 段：parts[{k}] 的 lse_s 应是 key [{a}, {b}) 的 log-sum-exp")


@exercise("11.5")
def test_split_decode_huge_logits():
    rng = np.random.default_rng(1153)
    R, S, d, dv = 4, 50, 4, 3
    q, K, V = _qkv(rng, R, S, d, dv, spread=30.0)
    K[40:] *= 3.0                                             # 最后几段的分数大得多：段间的最大值差上千
    o_ref, lse_ref = _decode_ref(q, K, V)
    for n in (2, 3, 7, 50):
        with np.errstate(over="ignore", invalid="ignore"):
            o, lse, _ = fl.split_kv_decode(q, K, V, n)
        expect(np.isfinite(o).all(), f"分数上千、切成 {n} 段：合并结果有 NaN/inf——合并各段时要先减去最大的 lse")
        close(o, o_ref, atol=1e-12, rtol=1e-10, message=f"分数上千、切成 {n} 段：合并后的输出不等于单遍注意力")
        close(lse, lse_ref, atol=1e-9, rtol=1e-12, message=f"分数上千、切成 {n} 段：合并后的 lse 不对")
    expect_no_calls(fl.split_kv_decode, ["standard_attention", "naive_attention", "reference_lse", "flash_fwd",
                                         "_fwd_fa2", "_fwd_fa1", "softmax_3pass", "softmax_online"],
                    why="切段和合并要自己写")
