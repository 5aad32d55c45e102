"""
第 1 讲 · 演示 5：一个序列最快能 decode 多快？批处理能换来什么？

你会看到：
    1. batch 1 的 decode 每一步都要把全部权重从显存读一遍，所以速度上限 = 带宽 ÷ 权重字节：
       H100 上 Llama-3.1-8B（BF16，16 GB）最多约 220 token/s，70B 约 24 token/s —— 和算力几乎无关。
       权重换成 FP8 / INT8（1 字节），上限翻倍；放不下一张卡的模型，要几张卡一起读（这里不计通信）。
    2. 对照一个公开的测量：Hazy Research 的 megakernel 在 H100 上跑 Llama-3.2-1B（batch 1）达到带宽的 78%，
       前向 < 1 ms；我们的上限 0.74 ms ÷ 78% ≈ 0.95 ms，对得上。vLLM / SGLang 只用到 ≤ 50% 的带宽。
    3. 批处理：一次读权重，给 B 个序列用。批小时总吞吐随 B 几乎线性增长、每个序列的速度几乎不变。
       但每个序列还要读自己的 KV：上下文短（128）时，批大到几百就碰到屋脊点、变成算力受限；
       上下文 2048 时，KV 的读取先超过权重，总吞吐趋于"带宽 ÷ 每序列 KV 字节"，强度停在 60 以下，
       永远碰不到屋脊点 —— 而显存在那之前就被 KV 装满了。长上下文的 decode 是 KV 带宽的问题。

运行：python3 lecture01/05_decode_speed.py [--quick]
图：lecture01/figures/05_decode_speed_batch.png
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import hw_specs as HW  # noqa: E402
import llm_math as M  # noqa: E402
from course_utils import fmt_bytes, fmt_time, format_table, pyplot, save_figure  # noqa: E402

MODELS = (M.LLAMA32_1B, M.LLAMA31_8B, M.QWEN25_7B, M.LLAMA31_70B, M.LLAMA31_405B)
CHIPS = (HW.H100_SXM, HW.H200, HW.B200, HW.MI300X, HW.TPU_V6E, HW.RTX_4090)
MEM_UTIL = M.MEM_UTIL     # 可分配显存只用 90%（vLLM gpu_memory_utilization 的老默认值 [S61]）
CTX = 2048          # 批处理那一节的主要上下文长度
SHORT_CTX = 128     # 对照：短上下文
ARROW_BATCH = 16    # 图上"批处理几乎免费"的箭头指向这个批大小（完整版和 --quick 的批大小里都有它）


def cards(m, chip, w_bytes):
    """只放权重（+ 1 个 token 的 KV）至少要几张卡：全课程同一个函数 llm_math.chips_needed（规则 "tp"）。"""
    return M.chips_needed(m, chip, batch=1, ctx=1, w_bytes=w_bytes, mem_util=MEM_UTIL).n_chips


def card_counts(m, chips, w_bytes):
    """"405B：H100 SXM 16 张、H200 / B200 8 张" 这样的一句（卡数由 cards 算出，同样卡数的芯片并在一起）。"""
    groups = {}
    for chip in chips:
        groups.setdefault(cards(m, chip, w_bytes), []).append(chip.name)
    return m.name + "：" + "、".join(f"{' / '.join(names)} {k} 张" for k, names in groups.items())


def single_stream_table(models, chips, w_bytes):
    rows = []
    for m in models:
        row = [m.name, fmt_bytes(m.weight_bytes(w_bytes))]
        for chip in chips:
            k = cards(m, chip, w_bytes)
            # k 张卡按张量并行各读 1/k 的权重：带宽合计 k 倍（忽略通信；通信见 prereq5/04、第 5 讲演示 04）
            r = M.step_time(m, chip, 1, 1, 0, w_bytes=w_bytes, n_chips=k, mem_util=MEM_UTIL)
            assert r["fits"]
            row.append(f"{1 / r['time']:,.0f}" + ("" if k == 1 else f" ({k}卡)"))
        rows.append(row)
    return format_table(["模型", "权重"] + [c.name for c in chips], rows)


def rule_table(m, chips, w_bytes):
    """同一个模型按两条规则要几张卡（llm_math.FIT_RULES）：只按字节是下限，张量并行还要整除头数。"""
    fits = []
    for chip in chips:
        for rule in ("bytes", "tp"):
            fits.append((f"{m.name} @ {chip.name}", M.chips_needed(m, chip, 1, 1, w_bytes, mem_util=MEM_UTIL,
                                                                    rule=rule)))
    return format_table(M.FIT_HEADERS, M.fit_rows(fits))


def equal_cards_table(models, chips, counts, w_bytes):
    """同样 n 张卡时的 batch 1 速度上限（token/s）：跨芯片比较必须在卡数相同的时候比。"""
    rows = []
    for m in models:
        for n in counts:
            row = [m.name, n]
            for chip in chips:
                r = M.step_time(m, chip, 1, 1, 0, w_bytes=w_bytes, n_chips=n, mem_util=MEM_UTIL)
                row.append(f"{1 / r['time']:,.0f}" if r["fits"] else "放不下")
            rows.append(row)
    return format_table(["模型", "卡数"] + [c.name for c in chips], rows)


def batch_sweep(m, chip, batches, ctx):
    rows, curve = [], []
    # 这一步每个序列存 ctx + 1 个 token 的 KV（已有的 ctx 个 + 新写的 1 个）：放不放得下看 step_time 的 fits；
    # max_batch 按同样的 ctx + 1 算出最多几个序列（画竖线、打印用），两者必须一致
    cap = M.max_batch(m, chip, ctx + 1, mem_util=MEM_UTIL)
    for b in batches:
        r = M.step_time(m, chip, b, 1, ctx, mem_util=MEM_UTIL)
        assert r["fits"] == (b <= cap), (chip.name, ctx, b, cap)
        total = b / r["time"]
        curve.append((b, total, 1 / r["time"], r["fits"]))
        rows.append([b, f"{r['intensity']:.1f}", "算力" if r["bound"] == "compute" else "带宽", fmt_time(r["time"]),
                     f"{1 / r['time']:,.0f}", f"{total:,.0f}", fmt_bytes(m.kv_cache_bytes(b, ctx + 1)),
                     "是" if r["fits"] else "否"])
    heads = ["batch", "强度", "受限于", "每步时间", "每序列 token/s", "总 token/s", "KV", f"{chip.name} 放得下"]
    return format_table(heads, rows), curve, cap


def plot(curves, quick=False):
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 6))
    for (name, ctx), (curve, cap) in curves.items():
        label = f"{name}, ctx {ctx}"
        ok = [c for c in curve if c[3]]                              # 放得下的点：实线
        over = [c for c in curve if not c[3]]                        # KV 放不下的点：虚线、空心，只看趋势
        if over and ok:
            over = [ok[-1]] + over
        line, = ax1.loglog([c[0] for c in ok], [c[1] for c in ok], "o-", ms=5, lw=2, label=label)
        color = line.get_color()
        ax2.semilogx([c[0] for c in ok], [c[2] for c in ok], "o-", ms=5, lw=2, color=color, label=label)
        if over:
            ax1.loglog([c[0] for c in over], [c[1] for c in over], "o--", ms=5, lw=1, color=color, mfc="white")
            ax2.semilogx([c[0] for c in over], [c[2] for c in over], "o--", ms=5, lw=1, color=color, mfc="white")
        if cap:
            ax1.axvline(cap, color=color, ls=":", lw=1.5)
    ax2.plot([], [], "o--", color="gray", mfc="white", lw=1, label="KV does not fit (trend only)")
    ax1.set_xlabel("batch size")
    ax1.set_ylabel("total decode tokens/s (roofline bound)")
    ax1.set_title("Llama-3.1-8B throughput (dotted: KV fills memory)")
    first = curves[next(iter(curves))][0]
    b16 = next(c for c in first if c[0] == ARROW_BATCH)           # 箭头指向第一条曲线上 batch 16 的点（按值找）
    ax1.annotate("batching is nearly free\nuntil the ridge or the KV wall", xy=(b16[0], b16[1]),
                 xytext=(1.2, 2e4), arrowprops=dict(arrowstyle="->"))
    ax2.set_xlabel("batch size")
    ax2.set_ylabel("tokens/s per sequence")
    ax2.set_title("per-sequence speed")
    for ax in (ax1, ax2):
        ax.grid(True, which="both", alpha=0.3)
    ax2.legend(loc="upper right")
    return save_figure(fig, __file__, "batch", quick=quick)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="小规模版本：批大小少扫几个点")
    ap.add_argument("--no-fig", action="store_true", help="不画图")
    args = ap.parse_args()
    batches = [1, 4, 16, 64, 256, 1024] if args.quick else [2 ** i for i in range(0, 11)]

    print("== 1. batch 1 的 decode 速度上限（token/s）= 带宽 ÷ 每步读取的字节（ctx≈0）==")
    print("   BF16 权重：")
    print(single_stream_table(MODELS, CHIPS, 2.0))
    print("   FP8 / INT8 权重（1 字节）：")
    print(single_stream_table(MODELS, CHIPS, 1.0))
    print("   （\"(k卡)\"：一张卡放不下，k 张卡各读 1/k 的权重；通信时间没算，见 prereq5/04 和第 5 讲演示 04。）")
    print(f"   卡数怎么定（llm_math.chips_needed，第 5 讲演示 04 也用它）：{M.FIT_RULES['tp']}。")
    print("   两条规则的对照（BF16，只放权重 + 1 个 token 的 KV）：")
    big = (HW.H100_SXM, HW.H200, HW.B200)
    print(rule_table(M.LLAMA31_405B, big, 2.0))
    print(f"   注意：上面大表（BF16）同一行里不同的列卡数不同（例如 {card_counts(M.LLAMA31_405B, CHIPS, 2.0)}），"
          "token/s 不能直接横着比。同样的卡数再比一次：")
    print(equal_cards_table((M.LLAMA31_70B, M.LLAMA31_405B), big, (8, 16), 2.0))

    m1, h100 = M.LLAMA32_1B, HW.H100_SXM
    t_bound = M.decode_time_per_token(m1, h100)
    print("\n== 2. 对照：Llama-3.2-1B、H100、batch 1、BF16 ==")
    print(f"   roofline 下界 {fmt_time(t_bound)}（读 {fmt_bytes(m1.step_bytes(1, 1))}）；"
          f"按 78% 带宽 {fmt_time(t_bound / 0.78)}；按 50% 带宽 {fmt_time(t_bound / 0.5)}")
    print("   公开数字：megakernel 达到 H100 带宽的 78%、前向 < 1 ms；vLLM / SGLang ≤ 50% [S74,S75,S76]")

    m = M.LLAMA31_8B
    print(f"\n== 3. 批处理：{m.name}，BF16，上下文 {SHORT_CTX} 和 {CTX} ==")
    curves = {}
    for chip, ctx in ((HW.H100_SXM, SHORT_CTX), (HW.H100_SXM, CTX), (HW.H200, CTX), (HW.B200, CTX)):
        table, curve, cap = batch_sweep(m, chip, batches, ctx)
        curves[(chip.name, ctx)] = (curve, cap)
        print(f"-- {chip.name}，上下文 {ctx}（屋脊点 {chip.ridge_point():.0f}，KV 最多放 {cap} 个序列；"
              f"KV 读取的吞吐上限 {chip.mem_bw / m.kv_cache_bytes(1, ctx + 1):,.0f} token/s）")
        print(table)

    # ---- 关键结论：断言 ----
    for mm in MODELS:
        for chip in CHIPS:
            k = cards(mm, chip, 2.0)
            tps = 1 / M.decode_time_per_token(mm, chip, n_chips=k)
            assert tps <= k * chip.mem_bw / (mm.matmul_params() * 2) * 1.0001           # 上限 = k × 带宽 / 权重字节
            t8 = M.decode_time_per_token(mm, chip, w_bytes=1.0, n_chips=k)
            assert 1.99 < M.decode_time_per_token(mm, chip, n_chips=k) / t8 < 2.01       # FP8 权重：快一倍
            if k > 1:                                                                   # 一张卡放不下：报错，不给数
                try:
                    M.decode_time_per_token(mm, chip)
                    raise AssertionError(f"{mm.name} 放不进一张 {chip.name}")
                except M.CapacityError:
                    pass
    # 同样的卡数：带宽高的芯片更快（405B、16 张：H200 > H100）
    t16 = {c.name: M.decode_tokens_per_s(M.LLAMA31_405B, c, n_chips=16) for c in (HW.H100_SXM, HW.H200)}
    assert t16[HW.H200.name] / t16[HW.H100_SXM.name] == HW.H200.mem_bw / HW.H100_SXM.mem_bw
    assert 200 < 1 / M.decode_time_per_token(m, h100) < 240
    assert t_bound < 0.75e-3 and t_bound / 0.78 < 1e-3                                   # 和 "< 1 ms" 对得上
    for (name, ctx), (curve, _cap) in curves.items():
        totals, per_seq = [c[1] for c in curve], [c[2] for c in curve]
        assert all(a <= b * 1.0001 for a, b in zip(totals, totals[1:])), name             # 总吞吐不降
        assert all(a >= b for a, b in zip(per_seq, per_seq[1:])), name                    # 每序列速度不升
        chip = HW.CHIPS[name]
        assert totals[-1] <= chip.peak_flops() / m.flops_per_token(ctx) * 1.0001          # 不超过算力屋顶
        assert totals[-1] <= chip.mem_bw / m.kv_cache_bytes(1, ctx + 1) * 1.0001           # 不超过 KV 带宽上限
        t1, t4 = (M.decode_time_per_token(m, chip, b, ctx) for b in (1, 4))
        assert t4 / t1 < 1.1                                                               # 小批时几乎"免费"
        bound_last = M.step_time(m, chip, batches[-1], 1, ctx)["bound"]
        assert bound_last == ("compute" if ctx == SHORT_CTX else "memory"), (name, ctx)    # 短上下文才碰得到屋脊点
    print(f"\n结论：batch 1 的 decode 只受带宽限制"
          f"（H100 上 8B 最多 {1 / M.decode_time_per_token(m, h100):.0f} token/s，"
          f"FP8 权重翻倍）；批处理几乎免费地放大总吞吐，直到碰到屋脊点或 KV 占满显存"
          f"（H100、上下文 {CTX}：最多 {curves[(h100.name, CTX)][1]} 个序列）；上下文长了，"
          f"KV 读取才是 decode 吞吐的天花板。")
    if not args.no_fig:
        path = plot(curves, quick=args.quick)
        print(f"图已保存：{os.path.relpath(path)}")


if __name__ == "__main__":
    main()
