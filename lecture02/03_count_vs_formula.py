"""
第 2 讲 · 演示 3：数出来的 = 公式算的？再把公式用到 Llama-3.1-8B / 70B 上

你会看到：
    1. 在 TINY 上，同一次前向的三本账：Counter（运行时逐次记下的）、analytic_ops（本讲的公式）、
       llm_math（第 1 讲的粗公式）。前两者逐项相等；和 llm_math 的差别也能逐项说清：
       llm_math 不计嵌入查表、激活读写、刚写进 cache 的 K/V 再读一遍，也不计被掩码挡掉的那一半注意力。
    2. 公式在跑不动的真模型上照样能算：Llama-3.1-8B / 70B 的 prefill 与 decode，
       每个 token 的 FLOPs、字节和算术强度（FLOPs/字节）。
    3. 与芯片屋脊点（峰值 FLOP/s ÷ 带宽，H100 约 295）比较：prefill 远高于屋脊点（受算力限制），
       batch=1 的 decode 只有 ~1（受带宽限制）；加大 batch 能把 decode 推上去——但上下文一长，
       KV cache 的字节跟着 batch 一起涨，强度就卡在 ~H/G 附近再也上不去（见图）。

运行：python3 lecture02/03_count_vs_formula.py [--quick] [--seed 0]
图：lecture02/figures/03_count_vs_formula_intensity.png
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import transformer_lab as tl  # noqa: E402
from hw_specs import B200, H100_SXM, H200, MI300X  # noqa: E402
from llm_math import LLAMA31_8B, LLAMA31_70B, max_batch  # noqa: E402
from course_utils import fmt_si, format_table, save_figure  # noqa: E402

CHIPS = (H100_SXM, H200, B200, MI300X)
BOUND_ZH = {"compute": "算力", "memory": "带宽"}     # Chip.bound 的返回值 → 中文（同第 1 讲的演示）
MODELS = (LLAMA31_8B, LLAMA31_70B)
BPE = 2.0     # BF16
NODE_CHIP, NODE_CHIPS = H200, 8     # 图里"放不放得下"按一台 8 × H200 的服务器（llm_math.fit 的 tp 规则）算


def node_max_batch(model, ctx):
    """一台 NODE_CHIPS × NODE_CHIP 放下权重后，最多能放几个 ctx-token 序列的 KV（llm_math.max_batch，tp 规则）。"""
    return max_batch(model, NODE_CHIP, ctx, w_bytes=BPE, kv_bytes=BPE, n_chips=NODE_CHIPS)


def three_ledgers(cfg, params, B, T, pos0, rng):
    """跑一次前向（记账）并和两套公式并排；返回表格的行，同时断言每一条恒等式。"""
    cache = tl.KVCache(cfg, B)
    if pos0:
        tl.forward(params, cfg, rng.integers(0, cfg.vocab, size=(B, pos0)), cache=cache)
    c = tl.Counter(BPE)
    tl.forward(params, cfg, rng.integers(0, cfg.vocab, size=(B, T)), cache=cache, counter=c)
    rows = tl.analytic_ops(cfg, B, T, pos0, BPE)
    mc = cfg.to_model_config()

    def both(key, ops=None):
        got, want = c.total(key, ops), tl.sum_rows(rows, key, ops)
        assert abs(got - want) <= 1e-9 * max(1.0, want), (key, got, want)
        return got

    mm = both("flops", tl.MATMUL_OPS)
    useful = both("useful", tl.MATMUL_OPS + tl.ATTN_CORE_OPS)
    flops = both("flops")
    w, kv, act = both("w"), both("kv"), both("act")
    embed_rows = B * T * cfg.d_model * BPE
    kv_write = mc.kv_cache_bytes(B, T, BPE)
    lm_w = mc.matmul_params() * BPE
    lm_kv = mc.kv_cache_bytes(B, pos0 + T, BPE)
    assert mm == B * T * mc.linear_flops_per_token()
    assert useful == mc.step_flops(B, T, pos0)
    assert w == lm_w + embed_rows and kv == lm_kv + kv_write
    assert abs(lm_w + lm_kv - mc.step_bytes(B, T, pos0, BPE, BPE)) < 1e-6
    return [
        ["矩阵乘 FLOPs", fmt_si(mm), fmt_si(mm), fmt_si(B * T * mc.linear_flops_per_token()), "= B·T·2·matmul_params"],
        ["有用 FLOPs（矩阵乘+注意力）", fmt_si(useful), fmt_si(useful), fmt_si(mc.step_flops(B, T, pos0)),
         "注意力只算掩码允许的 (q, k) 对"],
        ["实际执行 FLOPs", fmt_si(flops), fmt_si(flops), "—", "+ 被掩掉的分数 + 逐元素运算"],
        ["权重字节", fmt_si(w, "B"), fmt_si(w, "B"), fmt_si(lm_w, "B"), f"差 = 嵌入查表的 {B * T} 行"],
        ["KV 字节", fmt_si(kv, "B"), fmt_si(kv, "B"), fmt_si(lm_kv, "B"), "差 = 本次写入（写一次、再读一次）"],
        ["激活字节", fmt_si(act, "B"), fmt_si(act, "B"), "—", "未融合的内核：每个运算读写一遍"],
        ["FLOPs/字节", f"{flops / (w + kv + act):.1f}", f"{flops / (w + kv + act):.1f}",
         f"{mc.arithmetic_intensity(B, T, pos0, BPE, BPE):.1f}", "llm_math 只除以权重+KV"],
    ]


def part_tiny(rng, T):
    print("== 1. TINY 上的三本账（BF16 字节）==")
    cfg = tl.TINY
    params = tl.init_params(cfg, seed=0)
    heads = ["量", "Counter（数的）", "analytic_ops", "llm_math", "说明"]
    for B, n_new, pos0, name in ((1, T, 0, f"prefill：B=1，{T} 个 token"), (4, 1, T, f"decode：B=4，已有 {T} 个位置")):
        print(f"\n{name}")
        print(format_table(heads, three_ledgers(cfg, params, B, n_new, pos0, rng)))
    print("→ Counter 与 analytic_ops 的每一列都相等（每个运算逐项核对过）；与 llm_math 的差别全部对得上。")


def phase_rows(model, prompt, ctx, batches):
    """一个模型：prefill（prompt 个 token）和若干 batch 的 decode 一步。"""
    out = []
    pre = tl.phase_costs(model, 1, prompt, 0, BPE, last_only=True)
    out.append((f"prefill T={prompt}", pre))
    for B in batches:
        out.append((f"decode B={B} ctx={ctx}", tl.phase_costs(model, B, 1, ctx, BPE, last_only=True)))
    return out


def part_models(prompt, ctx, batches):
    print("\n== 2. 真模型：Llama-3.1-8B / 70B（公式，BF16）==")
    print(format_table(["芯片", "BF16 峰值", "带宽", "屋脊点 FLOP/字节"],
                       [[c.name, fmt_si(c.peak_flops("bf16"), "FLOP/s"), fmt_si(c.mem_bw, "B/s"),
                         f"{c.ridge_point('bf16'):.0f}"] for c in CHIPS]))
    rows, results = [], {}
    for m in MODELS:
        for name, s in phase_rows(m, prompt, ctx, batches):
            t = H100_SXM.roofline_time(s["flops"], s["bytes"])
            rows.append([m.name, name, fmt_si(s["flops"] / s["tokens"], "FLOP"), fmt_si(s["bytes"] / s["tokens"], "B"),
                         f"{100 * s['w'] / s['bytes']:.0f}/{100 * s['kv'] / s['bytes']:.0f}/"
                         f"{100 * s['act'] / s['bytes']:.0f}",
                         f"{s['intensity']:.1f}", BOUND_ZH[H100_SXM.bound(s["flops"], s["bytes"])],
                         f"{s['tokens'] / t:,.0f}"])
            results[m.name, name] = s
    print()
    print(format_table(["模型", "阶段", "FLOPs/token", "字节/token", "权重/KV/激活 %", "FLOP/字节",
                        "H100 受限于", "H100 上限 token/s"], rows))
    for m in MODELS:
        pre = results[m.name, f"prefill T={prompt}"]
        dec1 = results[m.name, f"decode B=1 ctx={ctx}"]
        assert pre["intensity"] > max(c.ridge_point() for c in CHIPS)
        assert dec1["intensity"] < 2 and dec1["w"] / dec1["bytes"] > 0.9
    print("→ 每个 token 的 FLOPs 两个阶段差不多（≈ 2 × 参数量）；decode B=1 的每个 token 却要读完整份权重，")
    print("  强度 ≈ 1，比任何芯片的屋脊点低两个数量级：decode 的速度由带宽决定（tokens/s ≈ 带宽 / 权重字节）。")
    print("  prefill 的'激活'一栏不小：这是按'每个运算一个内核'记的；第 11 讲的融合内核把它们留在片上。")


def decode_intensity_curve(model, ctx, batches):
    return [tl.phase_costs(model, int(B), 1, ctx, BPE, last_only=True)["intensity"] for B in batches]


def plot(prompt_lens, batches, ctxs, path_script, quick=False):
    from course_utils import pyplot
    plt = pyplot()

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 6.5), sharey=True)
    colors = ("tab:blue", "tab:orange")
    for m, style in zip(MODELS, ("-", "--")):
        for ctx, color in zip(ctxs, colors):
            # 整条曲线淡色（公式对任何 batch 都算得出）；放得下的部分实线：batch < cap 的网格点，再接上 cap 本身
            # （真正的极限，不是网格上它下面的那一点；cap 超出网格时实线延长到 cap），圆点标出 cap
            cap = node_max_batch(m, ctx)
            assert cap >= 1, (m.name, ctx)          # 一台 NODE_CHIPS 卡的机器放得下这两个模型
            ax1.loglog(batches, decode_intensity_curve(m, ctx, batches), style, color=color, alpha=0.35)
            xs = np.append(batches[batches < cap], cap)
            ys = decode_intensity_curve(m, ctx, xs)
            ax1.loglog(xs, ys, style, color=color, label=f"{m.name}, ctx {ctx:,}")
            ax1.plot(cap, ys[-1], "o", color=color, ms=6)
        pre = [tl.phase_costs(m, 1, int(T), 0, BPE, last_only=True)["intensity"] for T in prompt_lens]
        ax2.loglog(prompt_lens, pre, style, color="tab:green", label=m.name)
    ridges = [c.ridge_point() for c in CHIPS]
    for ax in (ax1, ax2):
        ax.axhspan(min(ridges), max(ridges), color="gray", alpha=0.25, lw=0)
        ax.text(0.02, max(ridges) * 1.15, f"chip ridge points {min(ridges):.0f}–{max(ridges):.0f} FLOP/B "
                f"({', '.join(c.name for c in CHIPS)})" if ax is ax1 else "ridge band",
                transform=ax.get_yaxis_transform())
        ax.grid(True, which="both", alpha=0.3)
    ax1.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)    # 图例放在图下：不挡 ctx 32K 的低曲线
    ax2.legend(loc="lower right")
    ax1.set_xlabel("decode batch size")
    ax1.set_ylabel("arithmetic intensity (FLOP / byte, BF16)")
    ax1.set_title("Decode: batching helps until the KV cache dominates")
    ax1.text(0.98, 0.02, f"faded: weights + KV exceed {NODE_CHIPS}x {NODE_CHIP.name}\n(dot = largest batch that fits)",
             transform=ax1.transAxes, ha="right", va="bottom", fontsize=12)
    ax2.set_xlabel("prompt length T (prefill, batch 1)")
    ax2.set_title("Prefill: intensity grows with T")
    return save_figure(fig, path_script, "intensity", quick=quick)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="TINY 上用更短的序列；曲线少取几个点")
    ap.add_argument("--seed", type=int, default=0, help="TINY 输入 token 的随机种子")
    ap.add_argument("--no-fig", action="store_true", help="不画图")
    a = ap.parse_args()
    print(f"随机种子 {a.seed}")
    rng = np.random.default_rng(a.seed)
    part_tiny(rng, 24 if a.quick else 96)
    part_models(prompt=2048, ctx=2048, batches=(1, 16, 256))
    if not a.no_fig:
        n = 12 if a.quick else 40
        batches = np.unique(np.round(np.logspace(0, 11, n, base=2)).astype(int))
        prompt_lens = np.unique(np.round(np.logspace(4, 15, n, base=2)).astype(int))
        print(f"\n图：{plot(prompt_lens, batches, (2048, 32768), __file__, quick=a.quick)}")
        print(f"  图里淡色的部分：权重 + KV 超出一台 {NODE_CHIPS} × {NODE_CHIP.name}（llm_math.max_batch，"
              "圆点就是它）。放下权重后还剩：")
        for m in MODELS:
            print(f"    {m.name:<14s} {node_max_batch(m, 1):>12,} 个 token 的 KV = 最多 "
                  + "、".join(f"{node_max_batch(m, ctx):,} 个 {ctx:,}-token 序列" for ctx in (2048, 32768)))
    ctx, mc = 32768, LLAMA31_8B
    long_ctx = decode_intensity_curve(mc, ctx, [1024, 2048])
    one = tl.phase_costs(mc, 1, 1, ctx, BPE, last_only=True)
    ceiling = one["flops"] / (one["kv"] + one["act"])     # batch → ∞：权重的读取被摊薄，只剩每序列的 KV 与激活
    cap = node_max_batch(mc, ctx)
    note = "（放不下，只看公式的极限）" if cap < 1024 else ("（2048 放不下，只看公式的极限）" if cap < 2048 else "")
    print(f"\n→ 8B、ctx={ctx} 的 decode：batch 1024 → 2048{note}，"
          f"强度只从 {long_ctx[0]:.2f} 变到 {long_ctx[1]:.2f}，")
    print(f"  上限 = 每 token FLOPs / 每序列的 KV 与激活字节 = {ceiling:.2f}（远低于屋脊点）；ctx 越长越接近")
    print(f"  注意力本身的 2·H/(G·字节) = {2 * mc.n_heads / (mc.n_kv_heads * BPE):.0f}。"
          "想抬高它只能减少 KV 字节（GQA/MQA、量化，05 演示）。")
    assert long_ctx[1] < 1.05 * long_ctx[0] and 0.9 * ceiling < long_ctx[1] < ceiling

if __name__ == "__main__":
    main()
