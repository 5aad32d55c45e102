"""
第 4 讲 · 演示 4：消融——2015 年式的 baseline 对现代栈，每块积木买到了什么

你会看到：
    1. 入库检查点的一张表：baseline（LayerNorm、GELU MLP、学出来的绝对位置、MHA）、modern（RMSNorm、SwiGLU、RoPE、
       GQA），以及"modern 只换回一块"的四个变体。每个都训练同样的步数、看同样多的 token，在同一个评估集上比：
       全部 token 的损失、比最优损失多多少、复制 token 和新块字母各自的损失、参数、每 token 的 KV 字节。
    2. "每块积木买到了什么"：换回一块之后损失变化多少（正数 = 这块现代积木有用）。
    3. 训练曲线（图）：从检查点旁的 CSV 读出来，横线是合成语言的最优损失（熵率）。

运行：python3 lecture04/04_ablation.py [--quick]
图：lecture04/figures/04_ablation_curves.png
"""
import argparse
import os
import sys

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import modern_lm as ml  # noqa: E402
from course_utils import fmt_bytes, fmt_count, format_table, save_figure  # noqa: E402

# 检查点名 → (图例名, 和 modern 比改了什么)
ROWS = {
    "baseline": ("baseline", "LayerNorm + GELU + learned pos + MHA"),
    "modern": ("modern", "RMSNorm + SwiGLU + RoPE + GQA"),
    "modern_layernorm": ("modern, LayerNorm", "RMSNorm → LayerNorm"),
    "modern_gelu": ("modern, GELU MLP", "SwiGLU → GELU（等参数）"),
    "modern_learned": ("modern, learned pos", "RoPE → 学出来的绝对位置"),
    "modern_mha": ("modern, MHA", "GQA（2 组）→ MHA（4 组）"),
}


def evaluate_all(quick):
    lang = ml.language()
    out = {}
    for name in ROWS:
        model, info = ml.load_or_train(name, quick=quick)
        br = ml.loss_breakdown(model, lang, ml.TRAIN.seq, batch=32 if quick else 512, seed=2024)
        curve = info["curve"] if info["source"] == "quick" else ml.read_curve(name)
        out[name] = dict(model=model, info=info, br=br, curve=curve)
    return out


def copy_loss(br):
    keys = [k for k in br if k.startswith("copy")]
    return sum(br[k][0] * br[k][2] for k in keys) / sum(br[k][2] for k in keys)


def part_table(res):
    print("== 1. 同样的步数、同样的数据：eval 损失（nats / token，越低越好）==")
    rows = []
    for name, (_, what) in ROWS.items():
        r = res[name]
        br, cfg = r["br"], ml.CHECKPOINTS[name]
        kv = fmt_bytes(cfg.to_model_config().kv_bytes_per_token())
        rows.append([name, what, fmt_count(r["model"].n_params()), kv,
                     f"{br['all'][0]:.3f}", f"{br['all'][0] - br['all'][1]:+.3f}", f"{copy_loss(br):.3f}",
                     f"{br['fresh'][0]:.3f}", f"{r['info'].get('seconds', float('nan')):.0f}"])
        assert br["all"][0] > br["all"][1] - 0.03, (name, br["all"])    # 交叉熵不会低于熵率（留一点抽样误差）
    opt = res["modern"]["br"]
    print(format_table(["检查点", "和 modern 比", "参数", "KV/token", "全部", "比最优多", "复制字母", "新块字母",
                        "训练秒"], rows))
    print(f"最优（知道生成规则）：全部 {opt['all'][1]:.3f}，复制字母 0，新块字母 {opt['fresh'][1]:.3f}。"
          f"每个模型训练 {ml.TRAIN.steps} 步 × {ml.TRAIN.batch * ml.TRAIN.seq} token。")


def part_delta(res, quick):
    print("\n== 2. 每块积木买到了什么：换回旧积木后损失的变化 ==")
    base = res["modern"]["br"]["all"][0]
    rows = []
    for name, (_, what) in ROWS.items():
        if name == "modern":
            continue
        d = res[name]["br"]["all"][0] - base
        dc = copy_loss(res[name]["br"]) - copy_loss(res["modern"]["br"])
        rows.append([what, f"{d:+.3f}", f"{dc:+.3f}"])
    print(format_table(["改动（modern → …）", "全部损失变化", "复制字母损失变化"], rows))
    ranked = sorted(((res[n]["br"]["all"][0] - base, ROWS[n][1]) for n in ROWS if n not in ("modern", "baseline")),
                    reverse=True)
    print(f"单独换回一块时伤害最大的是：{ranked[0][1]}（{ranked[0][0]:+.3f}）；最小的是：{ranked[-1][1]}（{ranked[-1][0]:+.3f}）。")
    print("解读：差别几乎都落在复制字母上——那是唯一需要精确位置的部分，位置编码决定了模型能多快学会'往回数 k 块'。"
          "归一化和 MLP 的选择在这么小、这么短的训练里只差几个千分点（可能小于种子带来的波动）；它们在大模型上的价值"
          "是训练稳定性和每 FLOP 的一点点改进，而不是换来一个新能力。GQA 少一半 KV，质量只差一点。")
    if not quick:
        assert res["baseline"]["br"]["all"][0] > base + 0.02, "baseline 应明显比 modern 差"


def plot(res, script, quick):
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    opt = res["modern"]["br"]["all"][1]
    for name, (label, _) in ROWS.items():
        curve = res[name]["curve"]
        steps = np.array([c[0] for c in curve])
        train = np.array([c[1] for c in curve])
        k = min(25, len(train))
        smooth = np.convolve(train, np.ones(k) / k, mode="valid")      # 25 步的滑动平均
        ax.plot(steps[k - 1:], smooth, lw=2 if name in ("modern", "baseline") else 1.3, label=label)
    ax.axhline(opt, color="black", ls="--", lw=1)
    ax.text(steps[-1], opt - 0.02, "optimal (entropy rate)", ha="right", va="top", fontsize=12)
    ax.set_ylim(opt - 0.1, min(2.0, ax.get_ylim()[1]))
    ax.set_xlabel("training step", fontsize=12)
    ax.set_ylabel("train loss (nats/token, 25-step mean)", fontsize=12)
    ax.set_title("Loss curves, same data and steps", fontsize=13)
    ax.legend(fontsize=11)
    ax.grid(alpha=0.3)
    names = list(ROWS)
    gaps = [res[n]["br"]["all"][0] - res[n]["br"]["all"][1] for n in names]
    bx.barh(range(len(names)), gaps, color=["tab:red" if n == "baseline" else "tab:blue" for n in names])
    bx.set_yticks(range(len(names)), [ROWS[n][0] for n in names], fontsize=12)
    bx.invert_yaxis()
    bx.set_xlabel("eval loss above optimal (nats/token)", fontsize=12)
    bx.set_title("Gap to optimal", fontsize=13)
    bx.tick_params(labelsize=11)
    bx.grid(axis="x", alpha=0.3)
    return save_figure(fig, script, "curves", quick=quick)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="评估用更少的序列；检查点不可用时只训几十步")
    a = ap.parse_args()
    print(f"检查点训练种子 {ml.TRAIN.seed}；评估集种子 2024")
    res = evaluate_all(a.quick)
    part_table(res)
    part_delta(res, a.quick)
    print(f"\n图：{plot(res, __file__, a.quick)}")


if __name__ == "__main__":
    main()
