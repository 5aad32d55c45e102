"""第 19 讲练习的评分检查：19.1 单进程模拟的环形注意力，19.2 位置插值（在入库的基座模型上大海捞针）。

19.1 的参考是这里按定义写的 float64 全注意力；19.2 的参考是这里写的 float64 RoPE（小数位置），
大海捞针用入库的 checkpoints/base.pt（不训练、不改检查点），题目是新抽的（固定种子，和训练、演示的题都不重叠）。
"""
import math

import numpy as np
import torch

from grading import close, exercise, expect, expect_no_calls, module

ll = module("lecture19", "long_lab")

# ---------------------------------------------------------------------------
# 19.1 环形注意力
# ---------------------------------------------------------------------------
RING_CASES = ((30, (1, 2, 3, 5, 6)), (21, (7,)), (12, (4,)))   # (N, 能整除 N 的各种 P)


def ref_full_attention(Q, K, V, causal):
    S = (Q @ np.swapaxes(K, -1, -2)) / math.sqrt(Q.shape[-1])
    if causal:
        N = S.shape[-1]
        S = np.where(np.tril(np.ones((N, N), dtype=bool)), S, -np.inf)
    S = S - S.max(-1, keepdims=True)
    P = np.exp(S)
    return (P / P.sum(-1, keepdims=True)) @ V


def _ring_inputs(rng, lead, N, d):
    return [torch.from_numpy(rng.standard_normal((*lead, N, d))) for _ in range(3)]


@exercise("19.1")
def test_ring_equals_full_attention():
    """对每个 P、两种切法（contiguous / striped）、causal 与否，环形注意力 = 整段注意力（float64，到 1e-12）。"""
    rng = np.random.default_rng(1901)
    for (N, Ps), lead, d in zip(RING_CASES, ((2,), (), (2, 3)), (5, 3, 4)):
        Q, K, V = _ring_inputs(rng, lead, N, d)
        for causal in (True, False):
            want = ref_full_attention(Q.numpy(), K.numpy(), V.numpy(), causal)
            for P in Ps:
                for layout in ll.LAYOUTS:
                    O, _ = ll.ring_attention(Q, K, V, P, causal=causal, layout=layout)
                    close(O.numpy(), want, atol=1e-12, rtol=1e-12,
                          message=f"N={N}、P={P}、layout={layout}、causal={causal}：环形注意力和整段注意力不一致"
                                  "（转过来的 K/V 块要按它自己的全局位置做因果掩码；输出要写回自己那些 token 的位置）")


def _pairs(N, P, layout, r, src, causal):
    """设备 r 的查询对设备 src 的键要算的 (q, k) 对数（按位置数，前面的维度不乘进去）。"""
    own = (lambda i: np.arange(i * N // P, (i + 1) * N // P)) if layout == "contiguous" else (lambda i: np.arange(i, N, P))
    q, k = own(r), own(src)
    per_row = (k[None, :] <= q[:, None]).sum() if causal else q.size * k.size
    return int(per_row)


@exercise("19.1")
def test_ring_visits_every_block_once():
    """账本：P 轮；每个 (q, k) 对恰好算一次（总对数 = N² 或 N(N+1)/2）；每块设备发 P − 1 次 K、V 块。"""
    rng = np.random.default_rng(1902)
    for N, P, layout in ((30, 5, "contiguous"), (30, 6, "striped"), (21, 7, "striped"), (16, 1, "contiguous")):
        Q, K, V = _ring_inputs(rng, (2,), N, 3)
        for causal in (True, False):
            _, led = ll.ring_attention(Q, K, V, P, causal=causal, layout=layout)
            what = f"N={N}、P={P}、layout={layout}、causal={causal}"
            expect(len(led.work) == P and all(len(w) == P for w in led.work),
                   f"{what}：应有 P = {P} 轮、每轮 P 块设备各算一块，账本里是 {[len(w) for w in led.work]}")
            pairs = N * (N + 1) // 2 if causal else N * N
            expect(led.total_work() == pairs,
                   f"{what}：一共算了 {led.total_work()} 个 (q, k) 对，应为 {pairs}（每个对恰好一次：少了说明漏了一轮）")
            want_rounds = [[_pairs(N, P, layout, r, (r - t) % P, causal) for r in range(P)] for t in range(P)]
            expect(led.work == want_rounds,
                   f"{what}：第 t 轮设备 r 应算自己的查询和设备 (r − t) mod P 的 K/V 块（块交给下一块设备 r + 1、"
                   f"从上一块 r − 1 收），账本每轮是 {led.work}，应为 {want_rounds}")
            per_block = 2 * 2 * (N // P) * 3         # K、V 两块，每块 [2, N/P, 3]
            expect(led.sent == [(P - 1) * per_block] * P,
                   f"{what}：每块设备应发 P − 1 = {P - 1} 次 K、V 块（{(P - 1) * per_block} 个元素），账本是 {led.sent}"
                   "（最后一轮算完就不用再传）")


@exercise("19.1")
def test_ring_writes_its_own_loop():
    expect_no_calls(ll.ring_attention, ["full_attention", "scaled_dot_product_attention", "softmax", "vanilla_attention",
                                        "sdpa_attention", "blockwise_attention", "kv_split_states", "merge_tree"],
                    why="环形的 P 轮要自己写（每轮用 _block 算一块、merge_states 合并）")


# ---------------------------------------------------------------------------
# 19.2 位置插值
# ---------------------------------------------------------------------------
def ref_rope(x, pos, base):
    """float64 的"前半与后半配对" RoPE：分量 i 与 i + dk/2 一对，转 pos · base^(−2i/dk)。x [..., T, dk]。"""
    dk = x.shape[-1]
    ang = np.outer(pos, base ** (-np.arange(dk // 2) * 2.0 / dk))        # [T, dk/2]
    c, s = np.cos(ang), np.sin(ang)
    a, b = x[..., :dk // 2], x[..., dk // 2:]
    return np.concatenate((a * c - b * s, a * s + b * c), axis=-1)


@exercise("19.2")
def test_positions_and_rotation():
    """positions = m / scale；rotate 给 q 和 k 都按插值后的位置转（与 float64 的 RoPE 比，到 float32 的舍入）。"""
    rng = np.random.default_rng(1921)
    for scale, base, T, dk in ((1.0, 10000.0, 13, 8), (2.5, 10000.0, 37, 16), (4.0, 500.0, 29, 6)):
        att = ll.LongAttention(d_model=2 * dk, n_heads=2, base=base)
        att.scale = scale
        pos = att.positions(T)
        want = np.arange(T) / scale
        expect(isinstance(pos, torch.Tensor) and tuple(pos.shape) == (T,),
               f"positions({T}) 应返回形状 [{T}] 的张量")
        close(pos.double().numpy(), want, atol=1e-5, rtol=1e-6,
              message=f"scale = {scale}：位置插值后第 m 个位置应是 m / scale（m · L_训练 / L_目标）")
        q = rng.standard_normal((2, 2, T, dk)).astype(np.float32)
        k = rng.standard_normal((2, 2, T, dk)).astype(np.float32)
        rq, rk = att.rotate(torch.from_numpy(q), torch.from_numpy(k))
        close(rq.double().numpy(), ref_rope(q.astype(np.float64), want, base), atol=2e-5, rtol=1e-4,
              message=f"scale = {scale}：q 的旋转角度应为 (m / scale) · base^(−2i/dk)（插值缩的是位置，不是 base）")
        close(rk.double().numpy(), ref_rope(k.astype(np.float64), want, base), atol=2e-5, rtol=1e-4,
              message=f"scale = {scale}：k 也要按插值后的位置旋转（只给 q 插值，q·k 就不再只依赖相对位置）")


NIAH_SEED = 7_300_000          # 新题：和训练数据（种子 ≤ 3.1e6）、演示的测试题（12345 + 1000·T + …）都不重叠
NIAH_DEPTHS = (0.0,)           # 针在草堆最前面（离问题最远）：不插值时这里掉得最厉害
NIAH_N = 16                    # 每个深度的题数（每个长度、每种设置一次前向）
# 这个种子下实测：512 不插值 0.50 → 插值 1.00，1024 不插值 0.31 → 插值 1.00；换 8 个种子，512 上的差 0.12–0.56、
# 1024 上 0.50–0.81（插值后都 = 1.00）。门槛取一半左右：对的解答留 4 题的余量，错的（见 wrong_lecture19）差得远
NIAH_MARGIN = 0.25             # 插值要把准确率至少提高这么多
NIAH_FLOOR = 0.8               # 插值后的准确率下限


def _niah_accuracy(model, task, T, scale):
    model.set_rope(scale=scale)
    ids, ans = [], []
    for k, depth in enumerate(NIAH_DEPTHS):
        x, a, _ = task.needle_batch(NIAH_SEED + 1000 * T + 17 * k, NIAH_N, T, depth)
        ids.append(x)
        ans.append(a)
    with torch.no_grad():
        hits = model(torch.cat(ids), last_only=True).argmax(-1) == torch.cat(ans)
    return float(hits.double().mean())


@exercise("19.2")
def test_interpolation_finds_needles_in_long_haystacks():
    """入库的基座（只在 128 个 token 上训练过）：在 512、1024 上用 scale = T / 128 插值，准确率明显高于不插值。"""
    ll.LongAttention(d_model=4, n_heads=1).positions(2)       # 先走一次练习的代码（学生树里在这里报"练习 19.2 未完成"）
    task = ll.NeedleTask()
    cfg = ll.read_manifest()["base"]["config"]
    model, _ = ll.load_model(task, "base", cfg)
    expect(model is not None, "读不出入库的 lecture19/checkpoints/base.pt（被改过或缺失？）：这道题不需要、也不要重新训练")
    train_T = cfg["T"]
    model.eval()
    for T in (512, 1024):
        plain = _niah_accuracy(model, task, T, 1.0)
        pi = _niah_accuracy(model, task, T, T / train_T)
        expect(pi >= NIAH_FLOOR and pi >= plain + NIAH_MARGIN,
               f"T = {T}：插值 scale = {T / train_T:g} 后的大海捞针准确率 {pi:.2f}，不插值 {plain:.2f}；"
               f"插值应把准确率提高到 ≥ {NIAH_FLOOR}、且至少高出 {NIAH_MARGIN}"
               "（位置要乘 L_训练 / L_目标，把长序列压回训练时见过的范围；q 和 k 都要）")


@exercise("19.2")
def test_interpolation_needs_no_training():
    for fn in (ll.LongAttention.positions, ll.LongAttention.rotate):
        expect_no_calls(fn, ["set_rope", "niah_grid", "cached_grid", "get_checkpoint", "train_needle", "get_model",
                             "apply_rope_interleaved", "scaled_dot_product_attention"],
                        why="位置插值只改位置：不训练、不读缓存的结果")
