"""
第 4 讲 · 演示 1：积木——RMSNorm 对 LayerNorm，SwiGLU 对 GELU MLP

你会看到：
    1. 两种归一化各自"归一"了什么：LayerNorm 减均值、除标准差，所以对每行加一个常数、乘一个正数都不变；
       RMSNorm 只除均方根，只对乘正数不变——行均值为 0 时两者完全相同。参数：LayerNorm 2d（增益 + 偏置），RMSNorm d。
    2. 代价：同样按"逐个 torch 运算"写，LayerNorm 要两次规约（均值、方差），RMSNorm 一次；实测每次调用的时间
       （也列出 torch 自带的融合版本：CPU 上融合与否的差别比两种归一化之间的差别大）。
    3. SwiGLU 与 GELU MLP 等参数比较：SwiGLU 有三个矩阵，所以中间宽度取 GELU 的 2/3；参数和 FLOPs 相同。
       在合成语言上训练好的两个检查点（modern 与 modern_gelu，只差 MLP）的 eval 损失与最优损失并排。

运行：python3 lecture04/01_building_blocks.py [--quick] [--seed 0]
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import modern_lm as ml  # noqa: E402
from course_utils import fmt_count, format_table  # noqa: E402


def layer_norm_by_hand(x, eps=1e-5):
    """逐个运算写的 LayerNorm（不含增益 / 偏置）：两次规约（均值、方差）。"""
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).pow(2).mean(-1, keepdim=True)
    return (x - mu) * torch.rsqrt(var + eps)


def rms_norm_by_hand(x, eps=1e-5):
    """逐个运算写的 RMSNorm（不含增益）：一次规约。"""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def part_what(gen):
    print("== 1. 各自归一化了什么 ==")
    x = torch.randn(5, 48, dtype=torch.float64, generator=gen)
    a, b = 3.7, 2.5                                        # 每行乘 a、加 b
    rows = []
    eps = 1e-12                                            # eps 很小：否则缩放不变性只近似成立（差 ~eps/方差）
    for name, f in (("LayerNorm", layer_norm_by_hand), ("RMSNorm", rms_norm_by_hand)):
        scale = (f(a * x, eps) - f(x, eps)).abs().max().item()
        shift = (f(x + b, eps) - f(x, eps)).abs().max().item()
        rows.append([name, f"{scale:.1e}", f"{shift:.1e}"])
    print(format_table(["归一化（eps = 1e-12）", "x → 3.7·x 的变化", "x → x + 2.5 的变化"], rows))
    zero_mean = x - x.mean(-1, keepdim=True)
    same = (layer_norm_by_hand(zero_mean) - rms_norm_by_hand(zero_mean)).abs().max().item()
    print(f"行均值为 0 时两者的差：{same:.1e}（LayerNorm = 先减均值、再做 RMSNorm）")
    assert float(rows[0][1]) < 1e-9 and float(rows[0][2]) < 1e-9 and float(rows[1][1]) < 1e-9
    assert float(rows[1][2]) > 0.1 and same < 1e-12


def time_call(f, x, reps):
    f(x)                                                     # 预热
    t0 = time.perf_counter()
    for _ in range(reps):
        f(x)
    return (time.perf_counter() - t0) / reps


def part_cost(rows_n, d, reps):
    print(f"\n== 2. 代价：[{rows_n}, {d}] 的 float32，每次调用的时间（5 轮 × {reps} 次取最快一轮）==")
    x = torch.randn(rows_n, d)
    d_ones = torch.ones(d)
    cands = [("LayerNorm（逐个运算）", layer_norm_by_hand, 2, 2 * d),
             ("RMSNorm（逐个运算）", rms_norm_by_hand, 1, d),
             ("LayerNorm（torch 融合 F.layer_norm）", lambda t: F.layer_norm(t, (d,)), 2, 2 * d)]
    if hasattr(F, "rms_norm"):
        cands.append(("RMSNorm（torch 的 F.rms_norm）", lambda t: F.rms_norm(t, (d,), d_ones, 1e-5), 1, d))
    rows, times = [], []
    with torch.no_grad():
        for name, f, n_red, n_par in cands:
            t = min(time_call(f, x, reps) for _ in range(5))   # 最快一轮：别的进程抢 CPU 只会让时间变长
            rows.append([name, n_red, n_par, f"{t * 1e6:.0f} µs", f"{x.numel() * 4 * 2 / t / 1e9:.1f} GB/s"])
            times.append(t)
    print(format_table(["实现", "规约次数", "参数", "每次", "读 + 写带宽"], rows))
    print(f"本机：逐个运算时 RMSNorm 比 LayerNorm 快 {times[0] / times[1]:.1f}×（少一次规约、少几个中间张量）；"
          f"torch 融合的 LayerNorm 比逐个运算的快 {times[0] / times[2]:.1f}×。")
    print("这类运算受内存带宽限制（每个数只做几次运算），省下的主要是读写次数——融合成一个内核（第 11 讲）比换归一化"
          "省得多。大模型里归一化只占很小的时间，选 RMSNorm 主要因为它更简单、训练同样稳定。")


def part_mlp(d, d_ff_swiglu, quick):
    print("\n== 3. SwiGLU 对 GELU MLP：等参数 ==")
    d_ff_gelu = ml.mlp_width(d_ff_swiglu, "gelu")
    sw, ge = ml.SwiGLU(d, d_ff_swiglu), ml.GeluMLP(d, d_ff_gelu)
    n_sw, n_ge = (sum(p.numel() for p in m.parameters()) for m in (sw, ge))
    rows = [["SwiGLU：w_down(SiLU(w_gate x) ⊙ w_up x)", 3, d_ff_swiglu, fmt_count(n_sw), fmt_count(2 * n_sw)],
            ["GELU：w_down(GELU(w_up x))", 2, d_ff_gelu, fmt_count(n_ge), fmt_count(2 * n_ge)]]
    print(format_table(["MLP", "矩阵", "中间宽度", "参数", "FLOPs / token"], rows))
    assert abs(n_sw - n_ge) <= d, (n_sw, n_ge)                 # 1.5 倍取整最多差一列
    print(f"（d_model = {d}；SwiGLU 的中间宽度取 GELU 的 2/3，Llama 的 d_ff ≈ 8/3·d 就是这么来的。）")
    rows = []
    for name in ("modern", "modern_gelu"):
        model, info = ml.load_or_train(name, quick=quick)
        br = ml.loss_breakdown(model, ml.language(), ml.TRAIN.seq, batch=32 if quick else 128)
        rows.append([name, ml.CHECKPOINTS[name].mlp, fmt_count(model.n_params()), info["steps"],
                     f"{br['all'][0]:.3f}", f"{br['all'][1]:.3f}", f"{br['fresh'][0]:.3f}", f"{br['fresh'][1]:.3f}"])
    print(format_table(["检查点", "MLP", "参数", "训练步数", "eval 损失", "最优", "新块字母损失", "其最优"], rows))
    print("两者只差 MLP。新块的字母只靠前一个字母预测（马尔可夫链），这部分正是 MLP 要记住的统计；"
          "在这么小的任务上两者差别很小；门控 MLP 的好处在大模型上是困惑度上小而稳定的改进，不是数量级的差别。")


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="小形状；检查点不可用时只训几十步")
    ap.add_argument("--seed", type=int, default=0, help="随机种子")
    a = ap.parse_args()
    print(f"随机种子 {a.seed}")
    gen = torch.Generator().manual_seed(a.seed)
    torch.manual_seed(a.seed)
    part_what(gen)
    # 张量 ≤ 8 MB：更大的张量每次都向系统要新的内存页，时间会被缺页中断主导
    part_cost(512 if a.quick else 2048, 1024, 5 if a.quick else 30)
    part_mlp(ml.MODERN.d_model, ml.MODERN.d_ff, a.quick)


if __name__ == "__main__":
    main()
