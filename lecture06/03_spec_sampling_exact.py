"""
第 6 讲 · 演示 3：投机采样是**精确**的 —— 输出分布和目标模型自己采样一模一样

你会看到：
    1. 一步投机采样输出 token 的精确分布（按算法的两条路径把概率加起来）：对各种 (p, q)——随机的、q 有 0 的、
       p = q 的、几乎不相交的、两个小 Transformer 给出的——都等于 p，误差在 1e-16 量级；接受率 β = 1 − TV(p, q)。
    2. 蒙特卡洛：spec_sample_batch 一次跑 ≥ 20000 个独立样本（--quick 时 4000），对前两个输出 token 的联合分布
       做卡方检验（自己实现的 χ² 右尾概率，不用 scipy）：正确的规则通过；两个"看起来差不多"的错误规则
       （被拒后从 p 重抽；p ≥ q 就收）被明确拒绝，并且第一个 token 的频率和理论算出的偏差对得上。
    3. 贪心（温度 0）时，投机解码和目标模型自己的贪心生成逐 token 相同，目标模型的前向次数却少得多。

运行：python3 lecture06/03_spec_sampling_exact.py [--quick] [--seed 0]
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import decode_lab as dl  # noqa: E402
from course_utils import format_table  # noqa: E402
from transformer_lab import Config, init_params  # noqa: E402

ALPHA_PASS = 1e-3      # 正确规则：p 值必须 > 这个数（固定种子下的一次检验；误报概率 0.1%）
ALPHA_FAIL = 1e-6      # 错误规则：p 值必须 < 这个数（偏差足够大，样本足够多时远远小于它）


def tiny_pair(seed):
    """
    词表 8 的一对小 Transformer：目标 2 层；草稿是**另一组**随机参数的 1 层模型（所以 p 和 q 差得比较多，
    错误规则的偏差才看得出来）。词表小，前两个 token 只有 64 种组合，卡方检验的每个格子都有足够的样本。
    """
    cfg = Config(vocab=8, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_head=8, d_ff=32, max_seq=32)
    tcfg = Config(vocab=8, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_head=8, d_ff=32, max_seq=32)
    return (dl.TransformerLM(init_params(cfg, seed=seed), cfg, "target"),
            dl.TransformerLM(init_params(tcfg, seed=seed + 100), tcfg, "draft"))


def part1_exact(rng, target, draft, prompt):
    print("== 1. 一步投机采样的精确输出分布：P_out = q·min(1, p/q) + (1 − β)·residual(p, q) ==")
    V = 40
    cases = {"random Dirichlet": (rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V)))}
    q0 = rng.dirichlet(np.full(V, 0.2))
    q0[: V // 2] = 0.0
    cases["q 有一半是 0"] = (rng.dirichlet(np.ones(V)), q0 / q0.sum())
    p_same = rng.dirichlet(np.ones(V))
    cases["p = q（永不拒绝）"] = (p_same, p_same.copy())
    half = np.r_[np.ones(V // 2), np.full(V - V // 2, 1e-9)]
    cases["几乎不相交"] = (half / half.sum(), half[::-1] / half.sum())
    lp = dl.adjust(target.logits(prompt, target.new_cache())[-1], 0.7)
    lq = dl.adjust(draft.logits(prompt, draft.new_cache())[-1], 0.7)
    cases["小 Transformer，T = 0.7"] = (lp, lq)
    rows = []
    for name, (p, q) in cases.items():
        out, beta = dl.spec_output_dist(p, q)
        err = float(np.max(np.abs(out - p)))
        tv = 0.5 * float(np.abs(p - q).sum())
        rows.append([name, len(p), f"{err:.1e}", f"{beta:.6f}", f"{1 - tv:.6f}"])
        assert err < 1e-15, (name, err)
        assert abs(beta - (1 - tv)) < 1e-12, (name, beta, tv)
    print(format_table(["(p, q)", "V", "max|P_out − p|", "β（接受率）", "1 − TV(p, q)"], rows))
    print("   β 就是 Leviathan 的 α 在一个位置上的值：草稿和目标越像，β 越接近 1。\n")


def part2_monte_carlo(target, draft, prompt, n, gamma, temperature, rng):
    print(f"== 2. 蒙特卡洛：{n} 个独立样本，γ = {gamma}，T = {temperature}，检验前两个输出 token 的联合分布 ==")
    exact = dl.exact_continuation_dist(target, prompt, 2, temperature)            # 64 个格子的精确概率
    p1 = exact.reshape(target.vocab, target.vocab).sum(axis=1)                    # 第一个 token 的边缘分布
    q1 = dl.adjust(draft.full_logits(prompt[None])[0, -1], temperature)
    rows, res = [], {}
    for variant in dl.SPEC_VARIANTS:
        t0 = time.perf_counter()
        s = dl.spec_sample_batch(target, draft, prompt, 2, gamma, temperature, n, rng, variant=variant)
        stat, dof, pval = dl.chi_square_gof(s, exact)
        freq1 = np.bincount(s[:, 0], minlength=target.vocab) / n
        theory1 = dl.variant_output_dist(p1, q1, variant)
        tv_theory = 0.5 * float(np.abs(theory1 - p1).sum())
        tv_seen = 0.5 * float(np.abs(freq1 - p1).sum())
        tv_vs_theory = 0.5 * float(np.abs(freq1 - theory1).sum())
        res[variant] = pval
        shown = f"{pval:.2g}" if pval > 0 else "< 1e-300"                     # 下溢成 0 时照实说
        rows.append([variant, f"{stat:.1f}", dof, shown, f"{tv_theory:.4f}", f"{tv_seen:.4f}", f"{tv_vs_theory:.4f}",
                     f"{time.perf_counter() - t0:.1f} s"])
        # 第一个 token 的频率应当贴着"这个规则的理论分布"（不管规则对不对）：TV 的抽样误差约 √(V/n)
        assert tv_vs_theory < 3 * np.sqrt(target.vocab / n), (variant, tv_vs_theory)
    print(format_table(["规则", "χ²", "自由度", "p 值", "第1个token 理论偏差 TV", "实测 TV(频率, p)",
                        "TV(频率, 理论)", "用时"], rows))
    beta1 = float(np.minimum(p1, q1).sum())
    print(f"   第一个位置的接受率 β = {beta1:.3f}；理论偏差 = 该规则的精确分布与 p 的 TV（correct 为 0）。")
    assert res["correct"] > ALPHA_PASS, f"正确的投机采样没通过卡方检验：p = {res['correct']}"
    assert res["resample_p"] < ALPHA_FAIL and res["accept_if_p_ge_q"] < ALPHA_FAIL, res
    print(f"   正确规则 p = {res['correct']:.2f}（> {ALPHA_PASS}：和目标分布一致）；"
          f"两个错误规则 p < {ALPHA_FAIL}（被拒绝）。\n")


def part3_greedy(rng):
    print("== 3. 贪心：投机解码 = 目标模型自己的贪心生成（逐 token 相同）==")
    target, draft = dl.tiny_pair(seed=3)          # 词表 24；草稿 = 目标的第 1 层（和目标像，贪心时常猜中）
    bigram = dl.NGramLM.fit(target.sample(np.array([1, 2]), 128, 20, 1.0, rng), target.vocab)
    rows, never = [], []
    for prompt in (np.array([0]), np.array([3, 1, 4, 1, 5]), rng.integers(0, target.vocab, 9)):
        ref, calls = dl.autoregressive_generate(target, prompt, 16, 0.0, rng)
        total_acc = 0
        for d in (draft, bigram):
            for gamma in (1, 4):
                out, st = dl.speculative_generate(target, d, prompt, 16, gamma, 0.0, rng)
                assert out == ref, (prompt, d.name, gamma)
                assert st["target_calls"] <= calls                 # 最坏（一个都不接受）也不比普通解码多前向
                total_acc += sum(st["accepted"])
                rows.append([len(prompt), d.name, gamma, "相同", f"{st['target_calls']} vs {calls}",
                             f"{np.mean(st['accepted']):.2f}"])
        if total_acc == 0:                                         # 没有一个草稿被接受：说清楚为什么
            full = np.concatenate([prompt, ref])[None]
            guess = {d.name: d.full_logits(full)[0, len(prompt) - 1:-1].argmax(-1) for d in (draft, bigram)}
            hits = sum(int((g == np.array(ref)).sum()) for g in guess.values())
            assert hits == 0, "贪心时接受 ⇔ 草稿的第一名 = 目标的下一个 token；有猜中的位置却一个都没接受是 bug"
            never.append((len(prompt), ref, guess))
    print(format_table(["prompt 长", "草稿", "γ", "输出 vs 贪心", "目标前向次数（投机 vs 普通）", "平均接受数"], rows))
    print("   贪心时 p、q 都是 one-hot：接受 ⇔ 草稿猜中目标的 argmax；被拒时残差就是目标的 argmax。")
    for L, ref, guess in never:
        print(f"   prompt 长 {L} 的几行接受数为 0 不是 bug：目标的贪心续写是 {' '.join(map(str, ref[:6]))} …，"
              + "、".join(f"{n} 沿这条序列的第一名是 {' '.join(map(str, g[:6]))} …" for n, g in guess.items())
              + "——没有一个位置猜中，每轮只产出补上的 1 个 token（最坏情况：和普通解码一样多的前向，不会更多）。")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="小规模版本：4000 个样本")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=None, help="蒙特卡洛样本数（默认 20000；--quick 时 4000）")
    args = ap.parse_args()
    n = args.samples or (4000 if args.quick else 20000)
    print(f"seed = {args.seed}，样本数 = {n}\n")
    rng = np.random.default_rng(args.seed)
    target, draft = tiny_pair(seed=7)
    prompt = np.array([2, 5, 1])
    t0 = time.perf_counter()
    part1_exact(rng, target, draft, prompt)
    part2_monte_carlo(target, draft, prompt, n, gamma=3, temperature=1.0, rng=rng)
    part3_greedy(rng)
    print(f"结论：投机采样不是近似——输出分布精确等于目标分布；省下的是目标模型的前向次数。"
          f"（总用时 {time.perf_counter() - t0:.1f} s）")


if __name__ == "__main__":
    main()
