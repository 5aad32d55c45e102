"""
第 4 讲 · 演示 5：长度外推——学出来的绝对位置、RoPE、ALiBi、不用位置编码（NoPE）

你会看到：
    1. 四个只差位置方案的检查点（都在长度 64 上训练），在 1×、2×、4× 训练长度的序列上的损失。
       合成语言除开头几块外是平稳的（最优损失逐行打印），所以"比最优多出来的部分"就是外推的代价。
    2. 按位置看（图右）：损失从哪个位置开始上涨——学出来的位置表在 64 之后的行从没被训练过；
       RoPE 在 64 之后遇到训练中没见过的相对距离；ALiBi [S94] 只按距离线性扣分，没有"没见过的情况"；
       NoPE 没有显式位置，只能靠因果掩码间接推断位置。
    3. 学出来的位置表有硬上限：比 max_seq 更长的序列直接报错（而不是悄悄算错）。

运行：python3 lecture04/05_length_generalisation.py [--quick]
图：lecture04/figures/05_length_generalisation_lengths.png
"""
import argparse
import os
import sys

import matplotlib
import numpy as np
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import modern_lm as ml  # noqa: E402
from course_utils import format_table, save_figure  # noqa: E402

SCHEMES = {"modern_learned": "learned absolute", "modern": "RoPE", "modern_alibi": "ALiBi", "modern_nope": "NoPE"}
FACTORS = (1, 2, 4)


def measure(quick):
    lang, T = ml.language(), ml.TRAIN.seq
    batch = 8 if quick else 128
    res = {}
    for name in SCHEMES:
        model, _ = ml.load_or_train(name, quick=quick)
        nll, opt = ml.loss_by_position(model, lang, max(FACTORS) * T, batch=batch, seed=5)
        per_len = {}
        for f in FACTORS:
            tokens, logp = lang.sample(batch, f * T, seed=100 + f)
            with torch.no_grad():
                loss = float(ml.lm_loss(model, tokens))
            per_len[f] = (loss, float(-logp.mean()))
        res[name] = dict(model=model, nll=nll.numpy(), opt=opt.numpy(), per_len=per_len)
    return res


def part_table(res):
    T = ml.TRAIN.seq
    print(f"== 1. 在 1×、2×、4× 训练长度（{T}）上的损失（nats / token）==")
    rows = []
    for name, label in SCHEMES.items():
        pl = res[name]["per_len"]
        rows.append([label] + [f"{pl[f][0]:.3f} ({pl[f][0] - pl[f][1]:+.3f})" for f in FACTORS])
    opt_row = ["最优"] + [f"{res['modern']['per_len'][f][1]:.3f}" for f in FACTORS]
    print(format_table(["位置方案"] + [f"长度 {f * T}（比最优）" for f in FACTORS], rows + [opt_row]))
    growth = {SCHEMES[n]: (res[n]["per_len"][4][0] - res[n]["per_len"][4][1]) -
              (res[n]["per_len"][1][0] - res[n]["per_len"][1][1]) for n in SCHEMES}
    order = sorted(growth, key=growth.get)
    print("从 1× 到 4×，比最优多出的部分增加了：" + "，".join(f"{k} {growth[k]:+.3f}" for k in order) + "。")
    print(f"外推最稳的是 {order[0]}，最差的是 {order[-1]}。")
    return growth


def part_where(res):
    T, c = ml.TRAIN.seq, ml.language().chunk
    print(f"\n== 2. 损失从哪儿开始上涨（按 {c} 个 token 一块平均，第一次比最优高出 0.3 nats 的位置）==")
    rows = []
    for name, label in SCHEMES.items():
        nll, opt = res[name]["nll"], res[name]["opt"]
        n = len(nll) // c * c
        gap = (nll[:n] - opt[:n]).reshape(-1, c).mean(1)                # 每块比最优多多少
        bad = np.nonzero(gap > 0.3)[0]
        first = f"{bad[0] * c}–{bad[0] * c + c - 1}" if len(bad) else "没有"
        rows.append([label, first, f"{gap[: T // c].mean():+.3f}", f"{gap[T // c:].mean():+.3f}"])
    print(format_table(["位置方案", "第一次高出 0.3 的位置", f"< {T} 平均比最优", f"≥ {T} 平均比最优"], rows))
    print(f"学出来的位置：{T} 之后的行从没被训练过（梯度只到过前 {T} 行），一过训练长度就坏。RoPE 只看相对距离，"
          f"但位置 ≥ {T} 的查询会遇到距离 > {T - 1} 的键——训练中没见过的相对距离（慢速分量转到没见过的角度），"
          "这些键的分数没有被训练'压下去'，注意力被它们搅乱。ALiBi 的偏置随距离线性变小，远处的键本来就被压低，"
          "没有'没见过的情况'。NoPE 从一开始就没学会精确复制，随长度慢慢变差。")


def part_limit():
    print("\n== 3. 学出来的位置表有硬上限 ==")
    cfg = ml.CHECKPOINTS["modern_learned"]
    model = ml.ModernLM(cfg)
    try:
        model(torch.zeros(1, cfg.max_seq + 1, dtype=torch.long))
    except ValueError as e:
        print(f"长度 {cfg.max_seq + 1} → ValueError：{e}")
    else:
        raise AssertionError("超过 max_seq 应报错")


# 每种位置方案一种颜色 + 一种标记，两块面板共用；外推最好的 ALiBi 用最粗的线（颜色与演示 4 一致：RoPE = modern 的蓝）
STYLE = {"modern_learned": dict(color="tab:purple", marker="s", ms=9, lw=2),
         "modern": dict(color="tab:blue", marker="D", ms=7, lw=2),
         "modern_alibi": dict(color="tab:green", marker="o", ms=11, lw=3.2),
         "modern_nope": dict(color="tab:orange", marker="^", ms=9, lw=2)}


def plot(res, script, quick):
    T = ml.TRAIN.seq
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 5.5))
    for i, (name, label) in enumerate(SCHEMES.items()):
        pl = res[name]["per_len"]
        # 在 1× 处前三种的损失只差 0.01（屏幕上不到 2 像素）：每种方案的点横向错开一点（对数轴上 ±4–13 %），
        # 刻度仍在真实长度上；空心、形状不同的标记让每一个都看得见
        dodge = 2 ** (0.085 * (i - (len(SCHEMES) - 1) / 2))
        ax.plot([f * T * dodge for f in FACTORS], [pl[f][0] for f in FACTORS], mfc="none", mew=2, label=label,
                **STYLE[name])
    ax.plot([f * T for f in FACTORS], [res["modern"]["per_len"][f][1] for f in FACTORS], "k--", lw=1.5,
            label="optimal")
    ax.set_xscale("log", base=2)
    ax.set_xticks([f * T for f in FACTORS], [f"{f * T}\n({f}x)" for f in FACTORS])
    ax.set_xlabel("evaluation length (tokens; points dodged sideways to stay visible)", fontsize=12)
    ax.set_ylabel("eval loss (nats/token)", fontsize=12)
    ax.set_title(f"Trained at length {T}: only ALiBi stays\nnear optimal at 2x and 4x", fontsize=13)
    ax.legend(fontsize=12, loc="upper left")
    ax.grid(alpha=0.3)
    c = ml.language().chunk
    for name, label in SCHEMES.items():
        nll = res[name]["nll"]
        blocks = nll[: len(nll) // c * c].reshape(-1, c).mean(1)        # 每块（8 个 token）平均，去掉块内的锯齿
        st = {k: v for k, v in STYLE[name].items() if k in ("color", "lw")}
        bx.plot(np.arange(len(blocks)) * c + c / 2, blocks, label=label, **st)
    opt = res["modern"]["opt"]
    bx.plot(np.arange(len(opt) // c) * c + c / 2, opt[: len(opt) // c * c].reshape(-1, c).mean(1), "k--", lw=1.5,
            label="optimal")
    bx.axvline(T, color="gray", ls=":", lw=1.5)
    bx.text(T * 1.03, 0.55, "train length", fontsize=12, color="dimgray", va="bottom",
            transform=bx.get_xaxis_transform())
    bx.set_xlabel("target position (tokens)", fontsize=12)
    bx.set_ylabel("eval loss (nats/token, 8-token chunk mean)", fontsize=12)
    bx.set_title("Learned pos breaks right at the train length,\nRoPE a few chunks later", fontsize=13)
    bx.set_ylim(top=bx.get_ylim()[1] * 1.25)                           # 给图例留出顶上的一条
    bx.legend(fontsize=12, loc="upper center", ncol=3)
    bx.grid(alpha=0.3)
    for a in (ax, bx):
        a.tick_params(labelsize=12)
    return save_figure(fig, script, "lengths", quick=quick)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="评估用更少的序列；检查点不可用时只训几十步")
    a = ap.parse_args()
    print(f"检查点训练种子 {ml.TRAIN.seed}；评估集种子 101 / 102 / 104（长度）与 5（按位置）")
    res = measure(a.quick)
    growth = part_table(res)
    part_where(res)
    print(f"\n图：{plot(res, __file__, a.quick)}")
    part_limit()
    if not a.quick:
        assert growth["learned absolute"] > 0.3, growth    # 没训练过的位置行 → 损失明显上涨
        assert growth["ALiBi"] < growth["RoPE"], growth   # ALiBi 的外推比 RoPE 稳（Press et al. [S94] 的主要结论）


if __name__ == "__main__":
    main()
