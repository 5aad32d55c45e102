"""
第 5 讲 · 演示 1：服务指标，以及"一步前向"的 roofline —— prefill 受算力限制，decode 受带宽限制

你会看到：
  1. 一个小轨迹上的服务指标：排队、TTFT（首 token 延迟）、TPOT / ITL（每个输出 token 的间隔）、端到端延迟，
     它们各自由哪几段时间组成；
  2. prefill 一步：输入越长强度越高，几百个 token 就越过拐点，变成算力受限；
  3. decode 一步：每个序列只算 1 个 token 却要读全部权重——批大小 B 就是它的算术强度（BF16），
     所以 B 小于"有效 ridge point"（峰值·mfu ÷ 带宽·mbu）时受带宽限制，批越大越"白赚"吞吐；
     上下文变长后 KV 的字节随 B 一起涨，拐点推后甚至永远到不了。
  图：figures/01_step_roofline_decode.png、figures/01_step_roofline_prefill.png

运行：python3 lecture05/01_step_roofline.py [--quick] [--seed 0]
"""
import argparse
import os
import sys

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serving_sim as ss  # noqa: E402
from course_utils import pyplot  # noqa: E402

plt = pyplot()
from hw_specs import B200, H100_SXM, H200  # noqa: E402
from course_utils import format_table, save_figure  # noqa: E402


def part_metrics(step, seed):
    print("\n=== 1. 指标的定义：一个 5 个请求的小轨迹（静态批处理，max_batch = 2）===")
    reqs = ss.make_requests(5, 20.0, ("uniform", 200, 2000), ("uniform", 2, 40), seed=seed)
    rs, info = ss.simulate_static(reqs, step, 2)
    rows = []
    for r in rs:
        rows.append([r.rid, f"{r.arrival * 1e3:.0f}", r.prompt, r.output, f"{r.queue_delay * 1e3:.0f}",
                     f"{r.ttft * 1e3:.0f}", f"{r.tpot * 1e3:.1f}" if r.output > 1 else "-", f"{r.e2e * 1e3:.0f}",
                     f"{(r.t_finish - r.t_last) * 1e3:.0f}"])
    heads = ["请求 id", "到达 ms", "输入 token", "输出 token", "排队 ms", "TTFT ms", "TPOT ms", "端到端 ms",
             "等整批 ms"]
    print(format_table(heads, rows))
    print("  TTFT = 排队 + 这一批的 prefill（补齐到批里最长的输入）；")
    print("  TPOT = (最后一个 − 第一个 token) ÷ (输出 − 1)，也就是相邻 token 间隔（ITL）的平均；")
    print("  端到端 = 离开系统 − 到达。静态批处理里短请求要陪长请求跑完（最后一列）。")
    for r in rs:
        pre = [b for b in info["batches"] if b[0] == r.t_start][0]
        members = [x for x in rs if x.t_start == r.t_start]
        assert abs(r.ttft - (r.queue_delay + step.prefill_time([max(x.prompt for x in members)] * pre[2]))) < 1e-12
        if r.output > 1:
            assert abs(np.mean(np.diff(r.token_times)) - r.tpot) < 1e-12     # TPOT = ITL 的平均
    s = ss.summarize(rs)
    print(f"  汇总：吞吐 {s['req_per_s']:.1f} req/s、{s['tok_per_s']:.0f} 输出 token/s；"
          f"TTFT p50 {s['ttft_p50'] * 1e3:.0f} ms")


def part_prefill(step, quick):
    print(f"\n=== 2. prefill 一步（{step.model.name} @ {step.chip.name}，单个请求）===")
    lens = [16, 64, 256, 1024, 4096] if quick else [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    rows, tps = [], []
    for L in lens:
        c = step.prefill_cost([L])
        t = float(c.total)
        tps.append(L / t)
        rows.append([L, f"{t * 1e3:.2f}", f"{L / t:,.0f}", f"{c.flops / c.bytes:.0f}", str(c.bound)])
    print(format_table(["输入 token", "时间 ms", "token/s", "强度 FLOP/B", "受限于"], rows))
    ridge = step.effective_ridge()
    for L in lens:
        c = step.prefill_cost([L])
        # 强度 ≈ L（每个权重字节被 L 个 token 复用）：L 明显超过有效 ridge 就一定是算力受限
        if L >= 2 * ridge:
            assert c.bound == "compute", L
        if L <= ridge / 2:
            assert c.bound == "memory", L
    print(f"  有效 ridge = {step.effective_ridge():.0f} FLOP/B：输入比它长得多的 prefill 都是算力受限。")
    return lens, tps


def decode_sweep(step, batches, ctx):
    """每个 batch 的 decode 一步：(总时间, t_compute, t_memory)。KV 放不下的批（b × ctx > KV 容量）记 NaN：
    decode_cost 对它们报 CapacityError，表里写"放不下"，图上不画。"""
    tot, tc, tm = [], [], []
    for b in batches:
        if int(b) * ctx > step.kv_capacity_tokens():
            tot.append(np.nan)
            tc.append(np.nan)
            tm.append(np.nan)
            continue
        c = step.decode_cost(int(b), int(b) * ctx)
        tot.append(float(c.total))
        tc.append(float(c.t_compute))
        tm.append(float(c.t_memory))
    return np.array(tot), np.array(tc), np.array(tm)


def part_decode(step, quick):
    print(f"\n=== 3. decode 一步（{step.model.name} @ {step.chip.name}）：批大小就是算术强度 ===")
    batches = np.array([1, 4, 16, 64, 256, 1024]) if quick else 2 ** np.arange(0, 12)
    rows = []
    sweeps = {}
    for ctx in (1, 2048):
        tot, tc, tm = decode_sweep(step, batches, ctx)
        sweeps[ctx] = (tot, tc, tm)
        for b, t, a, m in zip(batches, tot, tc, tm):
            if np.isnan(t):
                need = f"{int(b) * ctx:,} > {step.kv_capacity_tokens():,} token"
                rows.append([ctx, int(b), "KV 放不下", "-", "-", "-", need])
                continue
            rows.append([ctx, int(b), f"{t * 1e3:.2f}", f"{a * 1e3:.2f}", f"{m * 1e3:.2f}", f"{b / t:,.0f}",
                         "compute" if a >= m else "memory"])
    print(format_table(["每序列上下文 token", "批大小", "一步 ms", "算力 ms", "带宽 ms", "输出 token/s", "受限于"],
                          rows))
    # 批 1：带宽受限；上下文很短时，批 1 → 64 一步的时间几乎不变（读权重的时间被 64 个序列分摊）
    assert sweeps[1][1][0] < sweeps[1][2][0]
    t1, t64 = step.decode_time(1, 1), step.decode_time(64, 64)
    assert t64 < 1.5 * t1, (t1, t64)
    print(f"  上下文 1：批 64 一步 {t64 * 1e3:.2f} ms ≈ 批 1 的 {t64 / t1:.2f} 倍，吞吐却是 {64 * t1 / t64:.0f} 倍。")
    return batches, sweeps


def part_crossover(model, chips):
    print("\n=== 4. 拐点批大小 vs 芯片的 ridge point ===")
    rows = []
    for chip in chips:
        st = ss.StepModel(model, chip)
        b1, b2k = ss.crossover_batch(st, 1), ss.crossover_batch(st, 2048)
        rows.append([chip.name, f"{chip.ridge_point('bf16'):.0f}", f"{st.effective_ridge():.0f}", b1,
                     "永远到不了" if b2k is None else b2k, f"{st.kv_capacity_tokens() // 2048}"])
        # 只看权重时强度 = B，所以拐点 ≈ 有效 ridge（KV 读写和注意力让它偏一点点）
        assert abs(b1 - st.effective_ridge()) / st.effective_ridge() < 0.05
        assert b2k is None or b2k > b1                                  # 长上下文：KV 字节让拐点推后
        # 批无穷大时的强度上限 = 每序列 FLOPs ÷ 每序列 KV 字节（权重被摊没了）；它低于有效 ridge ⇔ 永远到不了
        m = st.model
        lim = (m.linear_flops_per_token() + m.attn_flops_per_token(2048)) / (2049 * st.kv_bytes_per_token)
        assert (b2k is None) == (lim < st.effective_ridge()), (lim, b2k)
        rows[-1].insert(5, f"{lim:.0f}")
    print(format_table(["芯片", "ridge FLOP/B", "有效 ridge FLOP/B（×mfu/mbu）", "拐点批大小（上下文 1）",
                           "拐点批大小（上下文 2048）", "强度上限 FLOP/B（上下文 2048）", "KV 放得下几个 2048 序列"],
                          rows))
    print("  上下文 2048 时每个序列要读 2048 个 token 的 KV：批再大，强度也封顶在 每序列 FLOPs ÷ 每序列 KV 字节，")
    print("  低于有效 ridge 就永远是带宽受限；而且显存（最后一列）早就满了——长上下文的 decode 基本都受带宽限制。")


def plot(step, batches, sweeps, lens, tps, quick=False):
    fig, ax = plt.subplots(1, 2, figsize=(14, 5.5))
    for ctx, ls in ((1, "-"), (2048, "--")):
        tot, tc, tm = sweeps[ctx]
        ax[0].loglog(batches, tc * 1e3, "C0" + ls, label=f"compute (ctx {ctx})")
        ax[0].loglog(batches, tm * 1e3, "C1" + ls, label=f"memory (ctx {ctx})")
        ax[1].loglog(batches, batches / tot, "C2" + ls, label=f"ctx {ctx}")
    for a in ax:
        a.axvline(step.effective_ridge(), color="gray", lw=1, ls=":")
        a.set_xlabel("batch size")
        a.grid(alpha=0.3)
    ax[0].set_ylabel("time per decode step (ms)")
    ax[0].set_title(f"decode step, {step.model.name} on {step.chip.name}")
    ax[1].set_ylabel("output tokens / s")
    ax[1].set_title("decode throughput (dotted: effective ridge)")
    ax[0].legend(loc="upper left")
    ax[1].legend(loc="lower right")
    ax[1].annotate("ctx 2048 stops where the\nKV cache fills memory", xy=(batches[~np.isnan(sweeps[2048][0])][-1],
                   (batches / sweeps[2048][0])[~np.isnan(sweeps[2048][0])][-1]), xytext=(1.5, 1.5e4),
                   arrowprops=dict(arrowstyle="->"))
    p1 = save_figure(fig, __file__, "decode", quick=quick)
    fig, a = plt.subplots(figsize=(7.5, 5))
    a.semilogx(lens, np.array(tps) / 1e3, "o-")
    a.set_xlabel("prompt length (tokens)")
    a.set_ylabel("prefill throughput (k tokens/s)")
    a.set_title("prefill: saturates once compute-bound")
    a.grid(alpha=0.3)
    p2 = save_figure(fig, __file__, "prefill", quick=quick)
    print(f"\n图：{p1}\n    {p2}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--quick", action="store_true", help="少一些点（check-all 用）")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"seed = {args.seed}；时间模型的假设：mfu {ss.MFU}、mbu {ss.MBU}、每步开销 {ss.STEP_OVERHEAD_S * 1e3:g} ms、"
          f"BF16、可用显存 {ss.GPU_MEM_UTIL:.0%}")
    step = ss.StepModel(ss.LLAMA31_8B, H100_SXM)
    part_metrics(step, args.seed)
    lens, tps = part_prefill(step, args.quick)
    batches, sweeps = part_decode(step, args.quick)
    part_crossover(ss.LLAMA31_8B, [H100_SXM, H200, B200])
    plot(step, batches, sweeps, lens, tps, quick=args.quick)


if __name__ == "__main__":
    main()
