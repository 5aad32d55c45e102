"""
第 1 讲 · 演示 3：roofline —— prefill 在算，decode 在搬

你会看到：
    1. 一次前向的算术强度（FLOP/byte）：decode 一步 ≈ 批大小（BF16 权重、短上下文），prefill ≈ 提示长度。
       上下文一长，每个序列都要读自己的 KV，decode 的强度就从"≈ 批大小"往下掉，批处理的收益变小。
    2. 芯片的屋脊点 = 峰值 / 带宽，今天在 160–560 FLOP/byte 之间；所以 batch 1 的 decode 在任何芯片上都只能用
       不到 1% 的算力，而几千个 token 的 prefill 在任何芯片上都是算力受限。
    3. 一张 log-log 的 roofline 图：每块芯片一条"屋顶"，操作点画在上面。

运行：python3 lecture01/03_roofline.py [--quick]
图：lecture01/figures/03_roofline_roofline.png
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import hw_specs as HW  # noqa: E402
import llm_math as M  # noqa: E402
from course_utils import fmt_bytes, fmt_si, fmt_time, format_table, pyplot, save_figure  # noqa: E402

MODEL = M.LLAMA31_8B
CHIPS = (HW.H100_SXM, HW.H200, HW.B200, HW.MI300X, HW.TPU_V6E, HW.RTX_4090)


def operating_points(quick):
    """[(标签, batch, n_new, ctx)]：decode（n_new = 1）和 prefill（batch = 1、ctx = 0）。"""
    dec_b = (1, 8, 64) if quick else (1, 8, 64, 256)
    pre_t = (128, 2048, 8192) if quick else (128, 512, 2048, 8192)
    pts = [(f"decode B={b}", b, 1, 0) for b in dec_b]
    pts += [(f"decode B={b} ctx=4K", b, 1, 4096) for b in dec_b[1:]]
    pts += [(f"prefill T={t}", 1, t, 0) for t in pre_t]
    return pts


def points_table(pts):
    rows = []
    for label, b, n, ctx in pts:
        f, by = MODEL.step_flops(b, n, ctx), MODEL.step_bytes(b, n, ctx)
        rows.append([label, fmt_si(f, "FLOP"), fmt_bytes(by), f"{f / by:,.1f}"])
    return format_table([f"{MODEL.name} 一次前向", "FLOPs", "字节", "强度 FLOP/B"], rows)


def chips_table(pts, chips):
    rows = []
    for chip in chips:
        for label, b, n, ctx in pts:
            r = M.step_time(MODEL, chip, b, n, ctx)
            frac = chip.attainable_flops(r["intensity"]) / chip.peak_flops()
            first = label == pts[0][0]
            f = r["fit"]
            fits = "是" if r["fits"] else f"否（要 {f.need / 1e9:.0f} GB > {f.usable / 1e9:.0f} GB）"
            rows.append([chip.name if first else "", f"{chip.ridge_point():.0f}" if first else "", label,
                         "算力" if r["bound"] == "compute" else "带宽", fmt_time(r["time"]), f"{frac:.1%}",
                         fmt_time(r["time"] / (b * n)), fits])
    return format_table(["芯片", "屋脊点", "操作点", "受限于", "roofline 时间", "算力利用上限", "每 token",
                           "一张卡放得下（llm_math.fit）"], rows)


def plot(pts, chips, quick=False):
    import numpy as np
    plt = pyplot()

    x = np.logspace(-1, 4.3, 300)
    fig, (ax, strip) = plt.subplots(2, 1, figsize=(12, 8.5), sharex=True, gridspec_kw={"height_ratios": [3, 1.6]})
    for chip in chips:
        y = np.minimum(chip.peak_flops(), x * chip.mem_bw) / 1e12
        line, = ax.loglog(x, y, lw=1.5, label=f"{chip.name} (ridge {chip.ridge_point():.0f})")
        ax.plot([chip.ridge_point()], [chip.peak_flops() / 1e12], "o", color=line.get_color(), ms=5)
    # 操作点：上图画在 H100 的屋顶上（只画标记）；标签放在下面的条带里，一类一行（decode / 长上下文 decode / prefill），
    # 同一行里相邻的标签上下错开——6 条屋顶挤在斜坡上，标签放进主图一定会压线、互相重叠。
    ref = HW.H100_SXM
    kinds = {"decode": (3, "o", "#c44e52", "decode, ctx 0"), "ctx": (1.5, "^", "#8c2d04", "decode, ctx 4K"),
             "prefill": (0, "s", "#2a7a3b", "prefill, T tokens")}
    seen = {k: 0 for k in kinds}
    for label, b, n, ctx in pts:
        k = "prefill" if label.startswith("prefill") else ("ctx" if "ctx" in label else "decode")
        row, marker, color, _ = kinds[k]
        ai = MODEL.arithmetic_intensity(b, n, ctx)
        ax.plot([ai], [ref.attainable_flops(ai) / 1e12], marker, color=color, ms=9, zorder=5)
        strip.plot([ai], [row], marker, color=color, ms=9)
        up = seen[k] % 2 == 0
        seen[k] += 1
        strip.annotate(f"T={n}" if k == "prefill" else f"B={b}", (ai, row), xytext=(0, 9 if up else -9),
                       textcoords="offset points", ha="center", va="bottom" if up else "top", color=color)
    for _k, (_row, marker, color, text) in kinds.items():
        ax.plot([], [], marker, color=color, ms=9, label=f"{text} (on H100 roof)")
    strip.set_yticks([kinds[k][0] for k in kinds], [kinds[k][3] for k in kinds])
    strip.set_ylim(-0.9, 3.9)
    strip.grid(True, axis="x", which="both", alpha=0.3)
    strip.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.annotate("decode ≈ batch FLOP/byte:\nfar left of every ridge (164–560)", xy=(1.0, ref.mem_bw / 1e12),
                xytext=(0.12, 400), arrowprops=dict(arrowstyle="->"))
    ax.set_ylabel("attainable TFLOP/s (bf16, dense)")
    ax.set_title(f"Roofline: {MODEL.name} decode vs prefill")
    ax.set_ylim(0.1, 6000)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, __file__, "roofline", quick=quick)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="小规模版本：少几个操作点")
    ap.add_argument("--no-fig", action="store_true", help="不画图")
    args = ap.parse_args()
    pts = operating_points(args.quick)

    print("== 1. 芯片：峰值、带宽和屋脊点（bf16，稠密）==")
    print(format_table(HW.CHIP_HEADERS, HW.chip_rows(CHIPS)))
    print(f"\n== 2. {MODEL.name} 的操作点：算术强度 = FLOPs / 字节（BF16 权重和 KV）==")
    print(points_table(pts))
    print("\n== 3. 在每块芯片上：受什么限制、roofline 时间（理想下界）==")
    print("   （最后一列：权重 + 这一步的 KV 放不放得进一张卡的 90% 可分配显存；放不下的行时间照算，只为看强度——"
          "真要跑得用几张卡，见演示 05 的 chips_needed）")
    print(chips_table(pts, CHIPS))

    # ---- 关键结论：断言 ----
    for b in (1, 8, 64, 256):
        ai = MODEL.arithmetic_intensity(b, 1, 0)
        assert abs(ai - b) / b < 0.01, (b, ai)                                   # decode 强度 ≈ 批大小
    assert MODEL.arithmetic_intensity(64, 1, 4096) < 0.7 * 64                    # 长上下文：KV 拖低了强度
    pre = [MODEL.arithmetic_intensity(1, t, 0) for t in (128, 512, 2048, 8192)]
    assert all(a < b for a, b in zip(pre, pre[1:]))                              # prefill 强度随提示长度增长
    for chip in CHIPS:
        r1 = M.step_time(MODEL, chip, 1, 1, 0)
        assert r1["bound"] == "memory" and chip.attainable_flops(r1["intensity"]) / chip.peak_flops() < 0.01
        assert M.step_time(MODEL, chip, 1, 8192, 0)["bound"] == "compute"
        assert r1["time"] == chip.roofline_time(r1["flops"], r1["bytes"])
    # batch 1 decode 的时间 ≈ 权重字节 / 带宽（H100：16 GB / 3.35 TB/s ≈ 4.5 ms）
    t1 = M.decode_time_per_token(MODEL, HW.H100_SXM)
    assert abs(t1 - MODEL.matmul_params() * 2 / HW.H100_SXM.mem_bw) / t1 < 0.001

    print(f"\n结论：decode 强度 ≈ 批大小（B=1 时 {MODEL.arithmetic_intensity(1, 1):.2f} FLOP/B），"
          f"远低于屋脊点（{min(c.ridge_point() for c in CHIPS):.0f}–{max(c.ridge_point() for c in CHIPS):.0f}），"
          f"所以受带宽限制：H100 上 batch 1 每步 {fmt_time(t1)}；"
          f"prefill 8K 强度 {pre[-1]:,.0f}，在所有芯片上都受算力限制。")
    if not args.no_fig:
        path = plot(pts, CHIPS, quick=args.quick)
        print(f"图已保存：{os.path.relpath(path)}")


if __name__ == "__main__":
    main()
