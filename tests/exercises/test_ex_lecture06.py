"""第 6 讲练习的评分检查：adjust（6.1）、residual（6.2）、expected_tokens（6.3）。

每个检查用固定种子、不规则的形状，参考值在这里独立写出（float64），不调用实验模块自己的参考实现。
6.2 的蒙特卡洛检查直接调用验证步 _verify（它调用 residual），不经过 adjust：练习 6.1 没做完也能评 6.2。
"""
import math
from fractions import Fraction

import numpy as np

from grading import close, exercise, expect, expect_no_calls, module

dl = module("lecture06", "decode_lab")


# ---- 练习 6.1：adjust ----
def _softmax_ref(z):
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@exercise("6.1")
def test_adjust_temperature_scales_logits():
    rng = np.random.default_rng(61001)
    for shape in ((37,), (3, 11), (2, 5, 23)):
        z = rng.normal(0.0, 3.0, size=shape)
        for T in (0.37, 1.0, 2.9):
            got = dl.adjust(z, temperature=T)
            expect(np.shape(got) == shape, f"adjust 的输出形状应与 logits 相同 {shape}，得到 {np.shape(got)}")
            close(np.sum(got, axis=-1), np.ones(shape[:-1]), 1e-12, 0.0, "每一行的概率之和应为 1")
            close(got, _softmax_ref(z / T), 1e-13, 1e-12,
                  f"温度 T={T} 时应是 softmax(logits / T)（温度除的是 logits，不是概率）")


@exercise("6.1")
def test_adjust_top_k_renormalises():
    rng = np.random.default_rng(61002)
    for V, k, T in ((29, 1, 1.0), (29, 5, 0.7), (64, 17, 1.6), (13, 13, 1.0)):
        z = rng.normal(0.0, 2.0, size=(4, V))
        got = np.asarray(dl.adjust(z, temperature=T, top_k=k))
        kth = np.sort(z, axis=-1)[:, V - k][:, None]            # 第 k 大（连续随机数，没有并列）
        masked = np.where(z >= kth, z / T, -np.inf)
        want = _softmax_ref(masked)
        expect(bool(np.all((got > 0).sum(axis=-1) == k)),
               f"top_k={k}：每行应恰好有 {k} 个 token 的概率 > 0，得到 {(got > 0).sum(axis=-1).tolist()}")
        close(got.sum(axis=-1), np.ones(4), 1e-12, 0.0, f"top_k={k}：截掉其余 token 后要重新归一化（每行和为 1）")
        close(got, want, 1e-13, 1e-12, f"top_k={k}、T={T}：应是只在最大的 {k} 个 logits 上做 softmax(logits / T)")


@exercise("6.1")
def test_adjust_greedy_and_extreme_logits():
    rng = np.random.default_rng(61003)
    z = rng.normal(0.0, 1.0, size=(5, 19))
    hot = np.asarray(dl.adjust(z, temperature=0.0))
    want = np.zeros_like(z)
    want[np.arange(5), np.argmax(z, axis=-1)] = 1.0
    close(hot, want, 0.0, 0.0, "temperature=0（贪心）应是 argmax 处的 one-hot")
    big = np.array([[900.0, 899.0, -5.0, 0.0], [1e4, -1e4, 1e4 - 3.0, 2.0]])
    for T in (1.0, 1e-3, 1e-300):
        got = np.asarray(dl.adjust(big, temperature=T))
        expect(bool(np.all(np.isfinite(got))), f"logits 很大或温度很小（T={T}）时结果里出现了 NaN/inf："
               "先减去每行的最大值再除以温度")
        close(got, _softmax_ref(big / T), 1e-12, 1e-12, f"logits 很大、T={T} 时的分布不对")
    masked = np.array([[1.0, -np.inf, 0.5, -np.inf, 2.0]])
    got = np.asarray(dl.adjust(masked, temperature=0.8))
    close(got, _softmax_ref(masked / 0.8), 1e-14, 1e-12, "logits 里的 −inf（被屏蔽的 token）概率应为 0")


@exercise("6.1")
def test_adjust_writes_its_own_maths():
    close(dl.adjust(np.zeros(3)), np.full(3, 1 / 3), 1e-15, 0, "logits 全为 0 时应是均匀分布")
    expect_no_calls(dl.adjust, ["exact_continuation_dist", "spec_output_dist", "variant_output_dist", "sample"])


# ---- 练习 6.2：residual ----
def _random_pq(rng, shape, zero_frac=0.3):
    """随机的 (p, q)：一部分位置是 0（词表里永远不会出现的 token），每行和为 1。"""
    out = []
    for _ in range(2):
        x = rng.gamma(0.6, size=shape)
        x[rng.random(shape) < zero_frac] = 0.0
        x[..., 0] += 1e-3                                      # 每行至少一个正数
        out.append(x / x.sum(axis=-1, keepdims=True))
    return out


@exercise("6.2")
def test_residual_is_renormalised_positive_part():
    rng = np.random.default_rng(62001)
    for shape in ((41,), (3, 17), (2, 4, 9)):
        p, q = _random_pq(rng, shape)
        got = np.asarray(dl.residual(p, q))
        pos = np.maximum(p - q, 0.0)                            # 草稿"给少了"的部分
        want = pos / pos.sum(axis=-1, keepdims=True)
        expect(np.shape(got) == shape, f"residual 的输出形状应为 {shape}，得到 {np.shape(got)}")
        expect(bool(np.all(got >= 0)), "残差分布里出现了负概率：应取 max(p − q, 0)")
        close(got.sum(axis=-1), np.ones(shape[:-1]), 1e-12, 0.0, "残差分布没有重新归一化（每行和应为 1）")
        close(got, want, 1e-14, 1e-12, "残差应为 max(p − q, 0) 除以它的和（是 p − q，不是 q − p）")


@exercise("6.2")
def test_residual_edge_rows():
    rng = np.random.default_rng(62002)
    p, q = _random_pq(rng, (4, 12))
    q[1] = p[1]                                                 # p == q：分子全为 0
    q[3] = 0.0                                                  # 没有草稿：residual(p, 0) = p
    got = np.asarray(dl.residual(p, q))
    expect(bool(np.all(np.isfinite(got))), "p == q 的一行出现了 NaN（0/0）：这时应返回 p")
    close(got[1], p[1], 1e-15, 0.0, "p == q 时应返回 p（分子全为 0，仍要给出一个分布）")
    close(got[3], p[3], 1e-15, 1e-15, "q 整行为 0（没有草稿）时应返回 p")
    pos = np.maximum(p[[0, 2]] - q[[0, 2]], 0.0)
    close(got[[0, 2]], pos / pos.sum(axis=-1, keepdims=True), 1e-14, 1e-12, "特殊行之外的行也要正确")


@exercise("6.2")
def test_spec_output_dist_is_exactly_p():
    rng = np.random.default_rng(62003)
    for shape in ((7,), (5, 33), (3, 2, 101)):
        p, q = _random_pq(rng, shape)
        out, beta = dl.spec_output_dist(p, q)
        close(out, p, 1e-14, 1e-12, "投机采样一步的输出分布应精确等于目标分布 p（残差补上了草稿给少的部分）")
        close(beta, np.minimum(p, q).sum(axis=-1), 1e-14, 1e-12, "接受概率 β 应为 Σ min(p, q)")


@exercise("6.2")
def test_speculative_sampling_monte_carlo():
    """验证步跑很多次：第一个输出 token ~ p₁；第一个草稿被接受之后，第二个 token ~ p₂（卡方检验，固定种子）。"""
    rng = np.random.default_rng(62004)
    V, gamma, M = 6, 2, 40_000
    p, q = _random_pq(rng, (gamma + 1, V), zero_frac=0.2)
    q = q[:gamma]
    P = np.broadcast_to(p, (M, gamma + 1, V)).copy()          # 目标分布与上下文无关：每个位置一个固定的 p_i
    Q = np.broadcast_to(q, (M, gamma, V)).copy()
    D = np.stack([dl.sample_rows(Q[:, i], rng) for i in range(gamma)], axis=1)   # 草稿 token ~ q_i
    n_acc, nxt = dl._verify(P, Q, D, rng)
    first = np.where(n_acc >= 1, D[:, 0], nxt)
    _, _, pv = dl.chi_square_gof(first[:, None], p[0])
    expect(pv > 1e-3, f"第一个输出 token 的频率与 p₁ 不符（卡方检验 p 值 {pv:.2g}）：被拒之后的重采样分布不对")
    ok = n_acc >= 1
    second = np.where(n_acc[ok] >= 2, D[ok, 1], nxt[ok])
    _, _, pv = dl.chi_square_gof(second[:, None], p[1])
    expect(pv > 1e-3, f"接受第一个草稿之后，第二个 token 的频率与 p₂ 不符（卡方检验 p 值 {pv:.2g}）")
    allin = n_acc == gamma
    _, _, pv = dl.chi_square_gof(nxt[allin][:, None], p[gamma])
    expect(pv > 1e-3, f"全部草稿被接受后补上的 token 应 ~ p_(γ+1)（卡方检验 p 值 {pv:.2g}）：q 整行为 0 时残差应为 p")


@exercise("6.2")
def test_residual_writes_its_own_maths():
    close(dl.residual(np.array([0.5, 0.5]), np.array([1.0, 0.0])), np.array([0.0, 1.0]), 1e-15, 0,
          "p = (½, ½)、q = (1, 0) 时残差应是 (0, 1)")
    expect_no_calls(dl.residual, ["spec_output_dist", "variant_output_dist", "_verify", "spec_sample_batch"])


# ---- 练习 6.3：expected_tokens ----
def _expected_exact(alpha, gamma):
    """有理数 α 的精确和 1 + α + … + α^γ。"""
    return float(sum(alpha ** i for i in range(gamma + 1)))


@exercise("6.3")
def test_expected_tokens_matches_series():
    for a in (Fraction(0), Fraction(1, 7), Fraction(3, 7), Fraction(5, 6), Fraction(99, 100), Fraction(1)):
        for g in (0, 1, 2, 5, 13):
            got = dl.expected_tokens(float(a), g)
            expect(isinstance(got, float), f"标量 alpha 应返回 float，得到 {type(got).__name__}")
            close(got, _expected_exact(a, g), 1e-12, 1e-12,
                  f"α={float(a):.4g}、γ={g}：一轮的期望产出应为 1 + α + … + α^γ（γ 个草稿 + 补上的 1 个）")
    near = 1.0 - 1e-9
    close(dl.expected_tokens(near, 7), 8.0 - 28e-9, 0.0, 1e-6, "α 非常接近 1 时精度丢失了（闭式是 0/0 型）")


@exercise("6.3")
def test_expected_tokens_arrays():
    rng = np.random.default_rng(63001)
    a = rng.uniform(0.0, 1.0, size=(3, 4))
    a[0, 0], a[2, 3] = 0.0, 1.0
    got = np.asarray(dl.expected_tokens(a, 4))
    expect(got.shape == (3, 4), f"数组 alpha（形状 (3, 4)）应返回同形状的数组，得到 {got.shape}")
    want = sum(a ** i for i in range(5))
    close(got, want, 1e-12, 1e-12, "数组 alpha 的逐元素结果不对（α = 0 时是 1，α = 1 时是 γ + 1）")


@exercise("6.3")
def test_expected_tokens_monte_carlo():
    """Leviathan 的模型：每个草稿独立地以概率 α 被接受；一轮产出 = 从头连续接受的个数 + 1。"""
    rng = np.random.default_rng(63002)
    N = 200_000
    for a, g in ((0.6, 3), (0.85, 6)):
        acc = rng.random((N, g)) < a
        produced = np.cumprod(acc, axis=1).sum(axis=1) + 1
        mean, se = produced.mean(), produced.std() / math.sqrt(N)
        got = dl.expected_tokens(a, g)
        expect(abs(got - mean) < 5 * se, f"α={a}、γ={g}：模拟的一轮平均产出 {mean:.4f} ± {se:.4f}，"
               f"公式给 {got:.4f}")


@exercise("6.3")
def test_expected_tokens_writes_its_own_maths():
    close(dl.expected_tokens(0.5, 2), 1.75, 1e-15, 0, "α = ½、γ = 2 时应为 1 + ½ + ¼")
    expect_no_calls(dl.expected_tokens, ["walltime_speedup", "ops_factor", "best_gamma", "spec_round"])
