"""
第 19 讲 · 演示 5：长上下文的代价——FLOPs 里注意力占多少，激活显存怎样随长度涨

你会看到：
    1. flops_per_token 把训练每个 token 的 FLOPs 拆成"参数部分 6N"和"注意力部分 6·L·T·d"：
       参数部分和长度无关，注意力部分随 T 线性涨；两者相等的长度 T* = N / (L·d)。
       7B 模型的 T* ≈ 5 万；我们 42 万参数的 LongLM 只要 ≈ 1600——所以它在 2048 上已经是"注意力为主"。
    2. activation_bytes（Ring Attention 论文表 1 [S83]）：一层里最大的激活，vanilla 随 s² 涨，
       flash / BPT [S98] 随 s 线性涨，ring 只和每块设备的块长 c 有关（s = P·c，设备数随 s 增加；图，对数坐标）。
    3. 给定每层激活的显存预算，各方法能放下的最长上下文；ring 的上限随设备数 P 线性增长。

运行：python3 lecture19/05_costs.py [--quick]
图：lecture19/figures/05_costs_flops.png、05_costs_activations.png
"""
import argparse
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import long_lab as L  # noqa: E402
from course_utils import fmt_bytes, fmt_count, pyplot, save_figure  # noqa: E402

# 7B 级模型（Llama-2-7B 的形状 [S99]：32 层、4096、32 头、d_ff 11,008、词表 32,000 → 6.74e9 个参数）
BIG = dict(name="7B (Llama-2 shape)", n_params=6.74e9, n_layers=32, d_model=4096, n_heads=32)


def toy_shape():
    task = L.NeedleTask()
    model = L.build_model(task, {"seed": 1})
    return dict(name="LongLM (this lecture)", n_params=sum(p.numel() for p in model.parameters()), n_layers=2,
                d_model=128, n_heads=2)


def flops_split(shapes, lengths, show=True):
    rows, series = [], {}
    for m in shapes:
        t_star = m["n_params"] / (m["n_layers"] * m["d_model"])
        fr = []
        for T in lengths:
            par, att = L.flops_per_token(m["n_params"], m["n_layers"], m["d_model"], T)
            fr.append(att / (par + att))
            rows.append([m["name"], fmt_count(T), f"{par:.3g}", f"{att:.3g}", f"{att / (par + att):.0%}"])
        series[m["name"]] = (fr, t_star)
        # 交叉点：注意力部分 = 参数部分
        par, att = L.flops_per_token(m["n_params"], m["n_layers"], m["d_model"], t_star)
        assert math.isclose(par, att)
        if show:
            print(f"{m['name']}：参数 {fmt_count(m['n_params'])}，"
                  f"注意力部分 = 参数部分的长度 T* = N/(L·d) ≈ {t_star:,.0f}")
    if show:
        print(L.format_table(["模型", "T", "6N（FLOPs/token）", "注意力（FLOPs/token）", "注意力占比"], rows))
    return series


def activations(lengths, m, c):
    rows = []
    for s in lengths:
        rows.append([fmt_count(s)] + [fmt_bytes(L.activation_bytes(k, s, m["d_model"], m["n_heads"], c=c))
                                      for k in L.ACT_KINDS])
    print(f"\n{m['name']} 一层里最大的激活（BF16，b = 1，ring 的块长 c = {c}）：")
    print(L.format_table(["s"] + list(L.ACT_KINDS), rows))
    v = [L.activation_bytes("vanilla", s, m["d_model"], m["n_heads"]) for s in lengths[:2]]
    f = [L.activation_bytes("flash", s, m["d_model"], m["n_heads"]) for s in lengths[:2]]
    assert v[1] / v[0] == (lengths[1] / lengths[0]) ** 2 and f[1] / f[0] == lengths[1] / lengths[0]


def longest_context(m, budget, devices):
    """每层激活预算 budget 字节时各方法能放下的最长 s（第 18 讲的 max_seq_len；ring 切给 P 块设备，c = s/P）。"""
    h, n = m["d_model"], m["n_heads"]
    rows = []
    for kind, why in (("vanilla", "分数矩阵 2·n·s²"), ("flash", "前馈中间层 8·s·h"), ("bpt", "2·s·h")):
        s = L.max_seq_len(kind, budget, h, n)
        assert L.activation_bytes(kind, s, h, n) <= budget < L.activation_bytes(kind, s + 1, h, n)
        rows.append([kind, fmt_count(s), why])
    single = L.max_seq_len("ring", budget, h, n, devices=1)
    for P in devices:
        s = L.max_seq_len("ring", budget, h, n, devices=P)
        assert s >= P * single                              # 设备数翻倍，能放下的长度也（至少）翻倍
        rows.append([f"ring, P = {P}", fmt_count(s), f"每块设备 c = s/P = {fmt_count(s // P)}，6·c·h"])
    print(f"\n每层激活预算 {fmt_bytes(budget)}（{m['name']}）时能放下的最长上下文：")
    print(L.format_table(["方法", "最长 s", "瓶颈"], rows))
    print("ring 的上限 = 设备数 × 单设备块长：论文表 3 说的\"最长上下文随设备数线性增长\" [S84]。")


def plot(series, lengths, m, c, quick):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, (fr, t_star) in series.items():
        line, = ax.plot(lengths, fr, marker="o", label=name)
        ax.axvline(t_star, color=line.get_color(), ls=":", lw=1.5)
    ax.axhline(0.5, color="gray", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("sequence length T (tokens)")
    ax.set_ylabel("attention share of training FLOPs/token")
    ax.set_title("Attention vs parameter FLOPs (dotted: T* = N/(L d))")
    ax.legend(loc="upper left")
    paths = [save_figure(fig, __file__, "flops", quick=quick)]
    fig, ax = plt.subplots(figsize=(8, 5))
    act_lengths = [s for s in lengths if s >= c]                    # ring：s = P·c，至少一块设备放满一块
    for kind in L.ACT_KINDS:
        ax.plot(act_lengths, [L.activation_bytes(kind, s, m["d_model"], m["n_heads"], c=c) / 2 ** 30
                              for s in act_lengths], marker="o", label=kind)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("sequence length s (tokens)")
    ax.set_ylabel("largest activation per layer (GiB, bf16)")
    ax.set_title(f"{m['name']}: activations (ring: c = {c}, P = s/c)")
    ax.legend(loc="upper left")
    paths.append(save_figure(fig, __file__, "activations", quick=quick))
    return paths


def main():
    ap = argparse.ArgumentParser(description="长上下文的 FLOPs 与激活显存")
    ap.add_argument("--quick", action="store_true", help="少几个长度")
    ap.add_argument("--budget-gib", type=float, default=8.0, help="每层激活的显存预算（GiB）")
    args = ap.parse_args()
    shapes = [BIG, toy_shape()]
    flops_split(shapes, [128, 2048, 32768] if args.quick else [128, 512, 2048, 8192, 32768, 131072])
    lengths = [2 ** k for k in range(12, 21, 2 if args.quick else 1)]        # s ≥ 块长 c = 4096
    activations(lengths, BIG, 4096)
    longest_context(BIG, args.budget_gib * 2 ** 30, (8, 32, 256))
    flop_lengths = [2 ** k for k in range(7, 21)]
    series = flops_split(shapes, flop_lengths, show=False)
    for p in plot(series, flop_lengths, BIG, 4096, args.quick):
        print(f"图：{os.path.relpath(p)}")


if __name__ == "__main__":
    main()
