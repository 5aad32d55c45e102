"""
第 4 讲 · 演示 2：RoPE——两种配对、只看相对位置、频率谱、过了训练长度会怎样

你会看到：
    1. "前半与后半配对"（Hugging Face Llama）和"相邻两个数一对"（RoFormer [S93]、第 2 讲）只差一个固定的维度排列：
       排列后两者相同到 0 误差；第 2 讲 TINY 的权重按这个排列重排 Wq、Wk 的行，装进我们的模型，logits 一致。
    2. 相对位置性质：q 在位置 m、k 在位置 n，旋转后的点积只取决于 m − n——把两者一起平移任意步，分数不变；
       换成"加上学出来的绝对位置向量"，分数就随平移变了。
    3. 频率谱（图）：第 i 对分量每个位置转 base^(−2i/d) 弧度，波长 2π·base^(2i/d)：从 2π 个位置（i = 0）
       到最后一对 i = d/2 − 1 的 2π·base^((d−2)/d)（d = 16、base = 10⁴ 时约 19,869，不是 base·2π ≈ 62,832）。
       波长超过训练长度的那些对，训练时从没转满一圈——这就是外推时它们给出"没见过的角度"的原因。
    4. 在 modern 检查点（训练长度 64）上，按位置看损失：64 以内、64–128、128–256 三段。

运行：python3 lecture04/02_rope.py [--quick] [--seed 0]
图：lecture04/figures/02_rope_spectrum.png
"""
import argparse
import math
import os
import sys

import matplotlib
import numpy as np
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lecture02"))

import modern_lm as ml  # noqa: E402
import transformer_lab as tl  # noqa: E402
from course_utils import format_table, save_figure  # noqa: E402


def part_pairing(gen, dh):
    print("== 1. 两种配对：只差一个排列 ==")
    perm = ml.half_to_interleaved(dh)
    print(f"dh = {dh}：交错配对的第 i 对是分量 (2i, 2i+1)；半对半配对的第 i 对是 (i, i + {dh // 2})。")
    print(f"排列 perm = {perm.tolist()}：x_half = x_inter[..., perm]")
    x = torch.randn(3, 4, 9, dh, dtype=torch.float64, generator=gen)   # [B, H, T, dh]
    cos, sin = ml.rope_angles(torch.arange(9, dtype=torch.float64), dh)
    err = (ml.apply_rope_half(x[..., perm], cos, sin) - ml.apply_rope_interleaved(x, cos, sin)[..., perm]).abs().max()
    naive = (ml.apply_rope_half(x, cos, sin) - ml.apply_rope_interleaved(x, cos, sin)).abs().max()
    params = tl.init_params(tl.TINY, seed=0)
    ids = np.random.default_rng(1).integers(0, tl.TINY.vocab, size=(2, 11))
    ours = ml.from_lecture02(params, tl.TINY)
    err02 = (ours(torch.from_numpy(ids)) - torch.from_numpy(tl.forward(params, tl.TINY, ids))).abs().max().item()
    print(format_table(["比较", "最大差"], [
        ["半对半(x[perm]) vs 交错(x)[perm]", f"{err:.1e}"],
        ["不排列、直接混用两种写法", f"{naive:.1e}"],
        ["第 2 讲 TINY（numpy、交错）vs 我们的模型（重排 Wq/Wk）的 logits", f"{err02:.1e}"]]))
    print("所以从 Meta 原始权重（交错）转成 Hugging Face 格式（半对半）时，要对 Wq、Wk 的行做这个排列——"
          "漏了不会报错，只会悄悄变差。")
    assert err < 1e-12 and err02 < 1e-10 and naive > 0.1


def part_relative(gen, dh, shifts):
    print("\n== 2. 相对位置性质：一起平移，分数不变 ==")
    q, k = torch.randn(dh, dtype=torch.float64, generator=gen), torch.randn(dh, dtype=torch.float64, generator=gen)
    table = torch.randn(max(shifts) + 20, dh, dtype=torch.float64, generator=gen) * 0.5   # "学出来的"绝对位置表

    def rope_score(m, n):
        pos = torch.tensor([float(m), float(n)], dtype=torch.float64)
        cos, sin = ml.rope_angles(pos, dh)
        rq = ml.apply_rope_half(q[None], cos[:1], sin[:1])[0]
        rk = ml.apply_rope_half(k[None], cos[1:], sin[1:])[0]
        return float(rq @ rk)

    def absolute_score(m, n):
        return float((q + table[m]) @ (k + table[n]))

    m, n = 7, 3
    rows = []
    for s in shifts:
        rows.append([f"({m + s}, {n + s})", m - n, f"{rope_score(m + s, n + s):+.6f}",
                     f"{absolute_score(m + s, n + s):+.4f}"])
    print(format_table(["(查询位置, 键位置)", "相对距离", "RoPE 分数", "绝对位置分数"], rows))
    spread = max(abs(rope_score(m + s, n + s) - rope_score(m, n)) for s in shifts)
    spread_abs = max(abs(absolute_score(m + s, n + s) - absolute_score(m, n)) for s in shifts)
    print(f"RoPE 分数随平移的最大变化 {spread:.1e}（舍入误差）；绝对位置 {spread_abs:.2f}")
    assert spread < 1e-10 and spread_abs > 0.1


def part_spectrum(script, quick, train_len):
    print("\n== 3. 频率谱：每一对分量的波长 ==")
    rows = []
    for i in range(0, 8):
        inv = 10000.0 ** (-2 * i / 16)
        wl = 2 * math.pi / inv
        rows.append([i, f"{inv:.4f}", f"{wl:,.1f}", f"{train_len * inv / (2 * math.pi):.2f}",
                     f"{4 * train_len * inv / (2 * math.pi):.2f}"])
    longest = 2 * math.pi * 10000.0 ** ((16 - 2) / 16)        # 最后一对 i = d/2 − 1：2π·base^((d−2)/d)
    assert abs(float(rows[-1][2].replace(",", "")) - longest) < 0.1
    assert longest < 2 * math.pi * 10000.0 / 3                  # 比 "base·2π" 小 base^(2/d) ≈ 3.2 倍
    print(f"我们的模型：d_head = 16、base = 10000、训练长度 {train_len}；"
          f"最长波长 = 2π·base^((d−2)/d) = {longest:,.0f} 个位置"
          f"（base·2π = {2 * math.pi * 10000:,.0f} 多算了 base^(2/d) = {10000 ** (2 / 16):.2f} 倍；"
          "d 越大这个倍数越接近 1）")
    heads = ["对 i", "弧度 / 位置", "波长（位置）", f"到 {train_len} 转了几圈", f"到 {4 * train_len} 转了几圈"]
    print(format_table(heads, rows))
    print("后几对在训练长度内转不满一圈：它们的角度可以当作'绝对位置'用，外推时就出现训练中没见过的角度。")
    print("图里另画了 d_head = 128 的两种 base：10000（Llama 2 [S99]）与 500000"
          "（Llama 3.1，预训练长度 8192 [S44,S45]）。"
          "base 调大，后面各对的波长变长（曲线更陡），更多的对在预训练长度内转不满一圈。")
    fig, ax = plt.subplots(figsize=(9, 5))
    # d_head = 16 与 d_head = 128（同一 base）落在同一条曲线上：16 画成空心大圆点、放在最上层，才看得见
    styles = ((128, 1e4, dict(ls="-", lw=2.5, color="tab:blue", zorder=2)),
              (128, 5e5, dict(ls="--", lw=2.5, color="tab:red", zorder=2)),
              (16, 1e4, dict(ls="none", marker="o", ms=9, mfc="none", mew=2, color="black", zorder=3)))
    for dh, base, kw in styles:
        i = np.arange(dh // 2)
        ax.semilogy(i / (dh // 2), 2 * np.pi * base ** (2 * i / dh), label=f"d_head={dh}, base={base:g}", **kw)
    for L, name in ((train_len, f"our train length {train_len}"), (8192, "Llama 3.1 pretrain length 8192")):
        ax.axhline(L, color="gray", lw=1.5, ls=":")
        ax.text(0.01, L * 1.15, name, fontsize=12, color="dimgray", transform=ax.get_yaxis_transform())
    ax.set_xlabel("pair index i / (d_head/2)   (0 = fastest pair)", fontsize=12)
    ax.set_ylabel("wavelength 2π·base^(2i/d) (positions)", fontsize=12)
    ax.set_title("Larger base → slow pairs never complete a turn\n"
                 "(d_head only changes how densely the curve is sampled)", fontsize=13)
    ax.tick_params(labelsize=12)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=12, loc="upper left")
    return save_figure(fig, script, "spectrum", quick=quick)


def part_past_length(quick, train_len):
    print(f"\n== 4. 过了训练长度：modern 检查点按位置的损失（训练长度 {train_len}）==")
    model, _ = ml.load_or_train("modern", quick=quick)
    lang = ml.language()
    nll, opt = ml.loss_by_position(model, lang, 4 * train_len, batch=16 if quick else 128)
    rows = []
    for lo, hi in ((0, train_len), (train_len, 2 * train_len), (2 * train_len, 4 * train_len)):
        rows.append([f"{lo}–{hi}", f"{nll[lo:hi].mean():.3f}", f"{opt[lo:hi].mean():.3f}"])
    print(format_table(["目标位置", "模型损失", "最优损失"], rows))
    print("语言在最前面几块之后是平稳的（最优损失只在开头略高：第一块总是新块），模型在没见过的位置上比最优多出来的部分"
          "就是外推的代价；演示 5 把它和学出来的位置、ALiBi、不用位置编码放在一起比。")


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="小形状；检查点不可用时只训几十步")
    ap.add_argument("--seed", type=int, default=0, help="随机种子")
    a = ap.parse_args()
    print(f"随机种子 {a.seed}")
    gen = torch.Generator().manual_seed(a.seed)
    part_pairing(gen, 10)
    part_relative(gen, 16, [0, 1, 5, 40, 300] if a.quick else [0, 1, 5, 40, 300, 5000, 100000])
    print(f"\n图：{part_spectrum(__file__, a.quick, ml.TRAIN.seq)}")
    part_past_length(a.quick, ml.TRAIN.seq)


if __name__ == "__main__":
    main()
