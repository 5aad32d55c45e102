"""
预备课 5 · 演示 04：张量并行（TP）里一层 Llama 的 all-reduce 要多久？和这一层的计算比呢？

Megatron 式张量并行：注意力按头切、MLP 按 d_ff 切，每层前向有 2 次 all-reduce（注意力输出投影之后、MLP 下投影之后），
每次的消息是整个激活 B·T·d 个 bf16 数 = B·T·d·2 字节。计算被 TP 块卡平分：每卡 2·(每层矩阵参数)·B·T / TP FLOPs。

你会看到……
  1. Llama-3.1-70B、8×H100（TP 8）：token 数（B·T）从 1（decode 一个序列）到 32K（长 prefill），
     每层 2 次 all-reduce 的时间（α 项、β 项）vs 这一层的矩阵乘法时间（FLOPs / (TP·峰值)）和 roofline 时间
     （还要把每卡 1/TP 的权重从显存读一遍）。都是峰值 / 线速下的理想值，通信和计算不重叠。
     decode：通信几乎全是延迟 α，占了这一层不小的一块；prefill：通信和计算都 ∝ token 数，比值趋于常数
         R∞ = [2 · 2(TP−1)/TP · d · 2 / B_link] / [2 · 每层参数 / (TP · 峰值)] = 4(TP−1)·d·峰值 / (每层参数·B_link)。
  2. TP = 2、4、8 时的 R∞：∝ (TP − 1)——TP 越大，通信占比越高（这就是 TP 一般不出一台机器的原因）。
  3. 换芯片（H100、H200、B200）：比值取决于"峰值 FLOP/s ÷ 链路带宽"。
  4. 图：prereq5/figures/04_tp_allreduce_llama_ratio.png

运行：python3 prereq5/04_tp_allreduce_llama.py [--quick] [--model Llama-3.1-70B]
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))
import comm_sim as cs  # noqa: E402
from hw_specs import B200, H100_SXM, H200  # noqa: E402
from course_utils import fmt_bytes, fmt_count, fmt_time, format_table, save_figure  # noqa: E402
from llm_math import PRESETS  # noqa: E402

ACT_BYTES = 2          # bf16 激活
W_BYTES = 2            # bf16 权重
ALLREDUCES_PER_LAYER = 2


def layer_matmul_params(cfg):
    """一层的矩阵参数（注意力 4 个投影 + MLP 3 个矩阵）= (matmul_params − lm_head) / 层数。"""
    per_layer = (cfg.matmul_params() - cfg.d_model * cfg.vocab) / cfg.n_layers
    lp = cfg.layer_params()
    assert per_layer == lp["attention"] + lp["mlp"] - (cfg.q_dim + 2 * cfg.kv_dim if cfg.qkv_bias else 0)
    return per_layer


def layer_costs(cfg, chip, tp, tokens, alpha=cs.DEFAULT_ALPHA):
    """每层：通信（α 项、β 项、合计）、矩阵乘法时间、roofline 时间（秒）。tokens 可以是数组。"""
    tokens = np.asarray(tokens, dtype=np.float64)
    msg = tokens * cfg.d_model * ACT_BYTES                         # 一次 all-reduce 的消息（字节）
    terms = cs.allreduce_terms(msg, tp)
    t_alpha = ALLREDUCES_PER_LAYER * terms.steps * alpha * np.ones_like(tokens)
    t_beta = ALLREDUCES_PER_LAYER * terms.bytes / chip.link_bw
    comm = ALLREDUCES_PER_LAYER * np.array([cs.tp_allreduce_time(m, tp, chip.link_bw, alpha)
                                            for m in np.atleast_1d(msg)])      # 第 5 讲用的接口，逐个算
    assert np.allclose(comm, np.atleast_1d(t_alpha + t_beta), rtol=1e-12)
    p_layer = layer_matmul_params(cfg)
    flops = 2 * p_layer * tokens / tp                              # 每卡
    t_compute = flops / chip.peak_flops("bf16")
    w_read = p_layer * W_BYTES / tp                                # 每卡读 1/TP 的权重
    t_roof = np.maximum(t_compute, w_read / chip.mem_bw)
    return {"alpha": t_alpha, "beta": t_beta, "comm": t_alpha + t_beta, "compute": t_compute, "roofline": t_roof}


def r_inf(cfg, chip, tp):
    """token 数 → ∞ 时 通信 / 矩阵乘法 的极限（α 项可忽略）。"""
    comm_per_token = ALLREDUCES_PER_LAYER * 2 * (tp - 1) / tp * cfg.d_model * ACT_BYTES / chip.link_bw
    compute_per_token = 2 * layer_matmul_params(cfg) / (tp * chip.peak_flops("bf16"))
    return comm_per_token / compute_per_token


def token_table(cfg, chip, tp, tokens):
    c = layer_costs(cfg, chip, tp, tokens)
    rows = []
    for i, t in enumerate(tokens):
        rows.append([int(t), fmt_time(c["alpha"][i]), fmt_time(c["beta"][i]), fmt_time(c["compute"][i]),
                     fmt_time(c["roofline"][i]), f"{c['comm'][i] / c['compute'][i]:.2f}",
                     f"{c['comm'][i] / (c['comm'][i] + c['roofline'][i]):.0%}"])
    print(format_table(["tokens B·T", "通信 α 项", "通信 β 项", "矩阵乘法", "roofline", "通信/矩阵乘法",
                           "通信占一层"], rows, [">"] * 7))
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--quick", action="store_true", help="少几行（check-all 用）")
    ap.add_argument("--model", default="Llama-3.1-70B", choices=sorted(PRESETS), help="模型预设（lecture01 llm_math）")
    args = ap.parse_args()
    cfg, chip, tp = PRESETS[args.model], H100_SXM, 8
    p_layer = layer_matmul_params(cfg)
    print(f"{cfg.name}：{cfg.n_layers} 层，d = {cfg.d_model}，每层矩阵参数 {fmt_count(p_layer)} 个；"
          f"{chip.name}：bf16 峰值 {chip.peak_flops('bf16') / 1e12:g} TFLOP/s，显存 {chip.mem_bw / 1e12:g} TB/s，"
          f"NVLink 单向 {chip.link_bw / 1e9:g} GB/s；TP = {tp}，α = {cs.DEFAULT_ALPHA * 1e6:g} µs")

    print(f"\n== 1. 每层：2 次 all-reduce vs 矩阵乘法（TP = {tp}）==")
    tokens = np.array([1, 64, 4096, 32768] if args.quick else [1, 8, 64, 512, 4096, 16384, 32768, 131072])
    c = token_table(cfg, chip, tp, tokens)
    rinf = r_inf(cfg, chip, tp)
    ratio = c["comm"] / c["compute"]
    print(f"\n极限比值 R∞ = {rinf:.3f}；token 数最大时实际比值 {ratio[-1]:.3f}")
    assert c["alpha"][0] > 0.99 * c["comm"][0], "decode 一个 token：通信几乎全是延迟"
    assert np.all(np.diff(ratio) < 0) and abs(ratio[-1] / rinf - 1) < 0.05, "比值随 token 数下降并趋于 R∞"
    n_star = cs.crossover_bytes("allreduce", tp, cs.DEFAULT_ALPHA, 1 / chip.link_bw)
    tok_star = n_star / (cfg.d_model * ACT_BYTES)
    print(f"α 项 = β 项的消息 n* = {fmt_bytes(n_star)}，即 {tok_star:.0f} 个 token："
          "一步的 token 比它少时通信以延迟为主（decode 每个序列只有 1 个 token，一批几个到几十个序列，都在这一边）。")
    assert tokens[0] < tok_star < tokens[-1]
    dec = c["comm"][0] / (c["comm"][0] + c["roofline"][0])
    print(f"decode 一个 token：每层通信 {fmt_time(c['comm'][0])}，读权重 {fmt_time(c['roofline'][0])}，"
          f"通信占 {dec:.0%}；整个模型 {cfg.n_layers} 层 × 2 次 = 每个 token 多 "
          f"{fmt_time(cfg.n_layers * c['comm'][0])}。")

    print("\n== 2. 不同 TP 的极限比值 R∞（大 prefill）==")
    tps = (2, 4, 8)
    rinfs = [r_inf(cfg, chip, t) for t in tps]
    rows = [[t, f"{r:.3f}", f"{r / (t - 1):.4f}"] for t, r in zip(tps, rinfs)]
    print(format_table(["TP", "R∞", "R∞ / (TP−1)"], rows, [">"] * 3))
    assert np.allclose(np.array(rinfs) / (np.array(tps) - 1), rinfs[0] / (tps[0] - 1)), "R∞ ∝ TP − 1"
    closed = [4 * (t - 1) * cfg.d_model * chip.peak_flops("bf16") / (p_layer * chip.link_bw) for t in tps]
    assert np.allclose(rinfs, closed, rtol=1e-12)
    print("R∞ = 2 次 × 2(TP−1)/TP · d · 2 字节 / 链路带宽 ÷ (2 · 每层参数 / (TP · 峰值))"
          " = 4(TP−1) · d · 峰值 / (每层参数 · 链路带宽) ∝ TP − 1：每多切一份，计算变少，通信却不少。")

    print("\n== 3. 换芯片（TP = 8）==")
    chips = (H100_SXM, H200, B200)
    rows = []
    for ch in chips:
        cc = layer_costs(cfg, ch, tp, np.array([1, 32768]))
        rows.append([ch.name, f"{ch.peak_flops('bf16') / ch.link_bw:.0f}", f"{r_inf(cfg, ch, tp):.3f}",
                     f"{cc['comm'][0] / (cc['comm'][0] + cc['roofline'][0]):.0%}"])
    print(format_table(["芯片", "峰值/链路 FLOP/B", "R∞（prefill）", "decode 通信占一层"], rows))
    assert np.isclose(r_inf(cfg, H200, tp), r_inf(cfg, H100_SXM, tp)), "H200 与 H100 算力、NVLink 相同：R∞ 相同"
    print("H200 的显存更快：decode 读权重更快，通信的占比反而更高。真实系统用计算-通信重叠、"
          "自定义 all-reduce（小消息一步完成）、NVLS 来压这一块。")

    from course_utils import pyplot
    plt = pyplot()
    fine = np.unique(np.logspace(0, 17.5, 60, base=2).astype(int))
    fig, ax = plt.subplots(figsize=(10, 6))
    for t in tps:
        cc = layer_costs(cfg, chip, t, fine)
        ax.semilogx(fine, cc["comm"] / cc["compute"], label=f"TP={t}")
        ax.axhline(r_inf(cfg, chip, t), ls=":", color=ax.lines[-1].get_color(), lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per step (B·T)")
    ax.set_ylabel("all-reduce time / matmul time (per layer)")
    ax.set_title(f"{cfg.name} on {chip.name}: TP all-reduce vs compute")
    ax.plot([], [], ":", color="gray", label="dotted: large-batch limit")
    ax.legend(loc="upper right")
    ax.grid(True, alpha=0.3)
    print(f"图已保存：{save_figure(fig, __file__, 'ratio', dpi=110, quick=args.quick)}")


if __name__ == "__main__":
    main()
