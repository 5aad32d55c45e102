"""
第 1 讲 · 演示 2：KV cache 有多大？MHA、GQA、MQA 省的是什么

你会看到：
    1. 每个 token 的 KV = 2·L·G·dh·字节：只和 KV 头数 G 有关。把 Llama-3.1-8B 改成 MHA（G = 32）、
       保持 GQA（G = 8）、改成 MQA（G = 1），KV 按 32 : 8 : 1 变化，而注意力的 FLOPs 一点没变。
    2. KV cache 随上下文长度和批大小线性增长：8B 模型（GQA）在 128K 上下文时，一个序列的 KV 就和权重一样大。
    3. 一块 H100 在 8K 上下文下能同时服务多少个序列（可分配显存的 90% 减去权重）：MHA 版本、GQA 版本差 4 倍。
    4. 真实模型每个 token 的 KV：GPT-3 175B（MHA）每个 token 4.7 MB，Llama-3.1-405B（GQA-8）只要 0.5 MB。

运行：python3 lecture01/02_kv_cache.py [--quick]
图：lecture01/figures/02_kv_cache_vs_context.png
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import hw_specs as HW  # noqa: E402
import llm_math as M  # noqa: E402
from course_utils import fmt_bytes, fmt_count, fmt_si, format_table, pyplot, save_figure  # noqa: E402

BASE = M.LLAMA31_8B
VARIANTS = {
    "MHA (G=32)": M.scaled(BASE, "8B-MHA", n_kv_heads=32),
    "GQA (G=8)": BASE,
    "MQA (G=1)": M.scaled(BASE, "8B-MQA", n_kv_heads=1),
}
MEM_UTIL = M.MEM_UTIL   # 像 vLLM 的 gpu_memory_utilization 默认值那样留 10% 余量 [S61]


def variants_table():
    rows = []
    for label, m in VARIANTS.items():
        rows.append([label, m.n_kv_heads, m.group, fmt_bytes(m.kv_bytes_per_token()),
                     fmt_si(m.attn_flops_per_token(8192), "FLOP"), fmt_count(m.n_params())])
    return format_table(["变体", "G", "H/G", "KV/token", "注意力 FLOPs/token@8K", "参数量"], rows)


def grid_table(m, ctxs, batches):
    rows = []
    for b in batches:
        rows.append([f"batch={b}"] + [fmt_bytes(m.kv_cache_bytes(b, c)) for c in ctxs])
    return format_table([f"{m.name} KV"] + [f"ctx={c:,}" for c in ctxs], rows)


def capacity_table(chips, ctxs):
    rows = []
    for label, m in VARIANTS.items():
        for chip in chips:
            rows.append([label, chip.name] + [M.max_batch(m, chip, c, mem_util=MEM_UTIL) for c in ctxs])
    return format_table(["变体", "芯片"] + [f"ctx={c:,}" for c in ctxs], rows)


def presets_table():
    rows = []
    for m in M.PRESETS.values():
        kind = "MHA" if m.n_kv_heads == m.n_heads else ("MQA" if m.n_kv_heads == 1 else f"GQA-{m.n_kv_heads}")
        per = m.kv_bytes_per_token()
        rows.append([m.name, kind, fmt_bytes(per), fmt_bytes(m.kv_cache_bytes(1, 32768)),
                     fmt_bytes(m.weight_bytes()), f"{m.weight_bytes() / per:,.0f}"])
    return format_table(["模型", "注意力", "KV/token", "KV@32K×1", "权重(BF16)", "KV = 权重时的 token 数"], rows)


def plot(batches=(1, 32), quick=False):
    plt = pyplot()
    ctx = [2 ** i for i in range(8, 18)]
    fig, ax = plt.subplots(figsize=(10, 6))
    styles = {1: "-", 32: "--"}
    # 曲线完全重合时只画一条、图例写成 "A = B"：MQA × batch 32 和 MHA × batch 1 的字节数一模一样
    # （32 个序列 × 1/32 的 KV），分开画的话图例里有一条谁也看不见的线。
    curves = {}
    for (label, m), color in zip(VARIANTS.items(), ("#c44e52", "#4c72b0", "#55a868")):
        for b in batches:
            ys = tuple(m.kv_cache_bytes(b, c) / 1e9 for c in ctx)
            curves.setdefault(ys, []).append((f"{label.split()[0]} × batch {b}", color, styles.get(b, ":")))
    for ys, same in curves.items():
        name = " = ".join(lbl for lbl, _, _ in same)
        _, color, style = same[0]
        ax.loglog(ctx, ys, style, color=color, lw=2, label=name)
    w = BASE.weight_bytes() / 1e9
    ax.axhline(w, color="gray", lw=2, label="8B weights (BF16)")
    for chip, ls in ((HW.H100_SXM, ":"), (HW.H200, "-.")):
        use = MEM_UTIL * chip.alloc_bytes / 1e9
        ax.axhline(use, color="black", lw=1.2, ls=ls,
                   label=f"{chip.name}: {MEM_UTIL:.0%} of {chip.alloc_bytes / 1e9:.0f} GB allocatable")
    cross = next(c for c in ctx if BASE.kv_cache_bytes(1, c) > BASE.weight_bytes())
    ax.annotate(f"GQA, 1 sequence: KV > weights at {cross // 1024}K tokens",
                xy=(cross, BASE.kv_cache_bytes(1, cross) / 1e9), xytext=(900, 0.002),
                arrowprops=dict(arrowstyle="->", color="#4c72b0"), color="#4c72b0")
    ax.set_ylim(1e-3, None)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("KV cache (GB, BF16)")
    ax.set_title("Llama-3.1-8B KV cache = 2·L·G·dh·2 bytes per token")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, __file__, "vs_context", quick=quick)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="小规模版本：少几个上下文长度和批大小")
    ap.add_argument("--no-fig", action="store_true", help="不画图")
    args = ap.parse_args()
    ctxs = (1024, 8192, 131072) if args.quick else (1024, 4096, 8192, 32768, 131072)
    batches = (1, 32) if args.quick else (1, 8, 32, 128)

    print("== 1. 同一个 8B 模型的三种注意力：KV 只看 G ==")
    print(variants_table())
    print("\n== 2. KV cache 随上下文和批大小线性增长（GQA-8，BF16）==")
    print(grid_table(BASE, ctxs, batches))
    print(f"\n== 3. 一块卡装下 BF16 权重后（只用可分配显存的 {MEM_UTIL:.0%}），能同时放几个序列的 KV ==")
    print("   （可分配显存：H200 实测 torch total_memory，H100 按同一比例推出；手册的 80 / 141 GB 只是显示用。"
          "同一个 llm_math.max_batch，第 2 讲演示 05 也用它）")
    print(capacity_table((HW.H100_SXM, HW.H200), ctxs))
    print("\n== 4. 真实模型每个 token 的 KV（BF16）==")
    print(presets_table())

    # ---- 关键结论：断言 ----
    mha, gqa, mqa = VARIANTS.values()
    assert mha.kv_bytes_per_token() == 4 * gqa.kv_bytes_per_token() == 32 * mqa.kv_bytes_per_token()
    assert mha.attn_flops_per_token(8192) == gqa.attn_flops_per_token(8192) == mqa.attn_flops_per_token(8192)
    assert mha.n_params() > gqa.n_params() > mqa.n_params()                      # 参数也少了（Wk、Wv 变窄）
    for c in ctxs:
        assert gqa.kv_cache_bytes(8, c) == 8 * gqa.kv_cache_bytes(1, c) == 8 * c * gqa.kv_bytes_per_token()
    assert gqa.kv_bytes_per_token() == 128 * 1024                                  # 8B：每 token 128 KiB
    # 128K 上下文：一个序列的 KV（17 GB）超过权重（16 GB）
    assert gqa.kv_cache_bytes(1, 131072) > gqa.weight_bytes()
    # 8K 上下文在 H100 上：GQA 能放的序列数约是 MHA 的 4 倍
    b_mha, b_gqa = M.max_batch(mha, HW.H100_SXM, 8192), M.max_batch(gqa, HW.H100_SXM, 8192)
    assert 3.5 * b_mha <= b_gqa <= 4.5 * b_mha + 4, (b_mha, b_gqa)
    assert M.GPT3_175B.kv_bytes_per_token() > 9 * M.LLAMA31_405B.kv_bytes_per_token()

    print(f"\n结论：KV/token 只和 G 有关（MHA:GQA:MQA = 32:8:1），注意力 FLOPs 不变；"
          f"H100 上 8K 上下文能放 MHA {b_mha} 个序列、GQA {b_gqa} 个；"
          f"GPT-3 175B 每 token {fmt_bytes(M.GPT3_175B.kv_bytes_per_token())}，"
          f"Llama-3.1-405B 只要 {fmt_bytes(M.LLAMA31_405B.kv_bytes_per_token())}。")
    if not args.no_fig:
        path = plot(quick=args.quick)
        print(f"图已保存：{os.path.relpath(path)}")


if __name__ == "__main__":
    main()
