"""
第 5 讲 · 演示 4：张量并行（TP）——放得下、更快，但不是线性地快

你会看到：
  1. 哪些模型一块卡放不下：Llama-3.1-70B 的 BF16 权重约 141 GB，一块 H100（80 GB，可用 90%）放不下，
     至少要 TP 2；一块 B200 就放得下。405B 要 TP 16（两台 8 卡机，跨机的链路慢得多，这里只看放不放得下）。
  2. TP 1/2/4/8 时每一步 decode 的账单：权重和 KV 平分到每块卡，读权重的时间按 1/tp 缩短；
     但每层 2 次 all-reduce 的时间和每步 1 ms 的固定开销**不缩短**——所以加速比小于 tp，
     每块卡的吞吐随 tp 下降；all-reduce 的占比随 tp 上升。
  3. KV 容量：每块卡分到的权重少了，剩下给 KV 的显存多了，整个 TP 组能放的 token 数增长得比 tp 还快。
  图：figures/04_tensor_parallel_breakdown.png

运行：python3 lecture05/04_tensor_parallel.py [--quick] [--seed 0]
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
import llm_math as lm  # noqa: E402
from llm_math import LLAMA31_405B  # noqa: E402
from course_utils import format_table, save_figure  # noqa: E402

TPS = (1, 2, 4, 8)
CTX = 2048                     # 每个序列的上下文（token）


def part_fit():
    print("=== 1. 最少要几块卡才放得下（权重 + 至少 1 个 token 的 KV；可分配显存的 90%）===")
    print(f"  规则（llm_math.chips_needed，第 1 讲演示 05 用的是同一个函数）：{lm.FIT_RULES['tp']}")
    models = [ss.LLAMA31_8B, ss.LLAMA31_70B, LLAMA31_405B]
    chips = (H100_SXM, H200, B200)
    rows = []
    for m in models:
        row = [m.name, f"{m.weight_bytes() / 1e9:.0f}"]
        for chip in chips:
            n = lm.chips_needed(m, chip, batch=1, ctx=1).n_chips
            assert n == ss.min_tp(m, chip)                   # 第 5 讲的 min_tp 和第 1 讲的 chips_needed 同一个答案
            row.append(f"{n}（按字节 {lm.chips_needed(m, chip, 1, 1, rule='bytes').n_chips}）")
        rows.append(row)
    print(format_table(["模型", "BF16 权重 GB"] + [f"最少卡数 {c.name}（可分配 {c.alloc_bytes / 1e9:.0f} GB）"
                                                     for c in chips], rows))
    print("  括号里是只按字节的下限（rule='bytes'）：405B 在 H100 上 11 张就装得下字节，但 128 个头要均分，"
          "张量并行只能取 16。")
    try:
        ss.StepModel(ss.LLAMA31_70B, H100_SXM)
        raise AssertionError("70B 不该放得进一块 H100")
    except ss.CapacityError as e:
        print(f"  StepModel(70B, H100, tp=1) → CapacityError：{e}")
    assert ss.min_tp(ss.LLAMA31_70B, H100_SXM) == 2 and ss.min_tp(ss.LLAMA31_70B, B200) == 1
    # 405B 在 H100 上要的 tp 超过了它的 KV 头数：KV 头不够分，每块卡复制一个
    tp405 = lm.chips_needed(LLAMA31_405B, H100_SXM, 1, 1).n_chips
    s405 = ss.StepModel(LLAMA31_405B, H100_SXM, tp=tp405)
    G = LLAMA31_405B.n_kv_heads
    print(f"  405B @ H100 × {tp405}：KV 头只有 {G} 个 < {tp405} 块卡，每 {tp405 // G} 块卡复制同一个头，"
          f"每卡 {s405.kv_heads_per_chip} 个；每 token 每卡 KV {s405.kv_bytes_per_token / 1e3:.1f} KB"
          f"（不是平分时的 {LLAMA31_405B.kv_bytes_per_token() / tp405 / 1e3:.1f} KB），"
          f"整组 KV 容量 {s405.kv_capacity_tokens():,} token")
    assert tp405 > G and s405.kv_heads_per_chip == 1
    assert s405.kv_bytes_per_token == LLAMA31_405B.kv_bytes_per_token() / G      # 1/G 而不是 1/tp
    for m, r in zip(models, rows):              # 最小 tp 一定满足 权重 / tp ≤ 可用显存
        for chip, cell in zip(chips, r[2:]):
            tp = int(cell.split("（")[0])
            assert m.weight_bytes() / tp <= ss.GPU_MEM_UTIL * chip.alloc_bytes
            assert tp == 1 or m.weight_bytes() / (tp // 2) > ss.GPU_MEM_UTIL * chip.alloc_bytes


def tp_rows(model, chip, batch):
    out = []
    for tp in TPS:
        try:
            st = ss.StepModel(model, chip, tp=tp)
        except ss.CapacityError:                   # 只有"放不下"算作这一格空着；别的错误照常抛出
            out.append(None)
            continue
        if batch * CTX > st.kv_capacity_tokens():     # 权重放下了，这批的 KV 放不下：表里写出来，不给时间
            out.append({"tp": tp, "st": st, "kv_full": True})
            continue
        c = st.decode_cost(batch, batch * CTX)
        t = float(c.total)
        out.append({"tp": tp, "st": st, "t": t, "roof": float(max(c.t_compute, c.t_memory)), "comm": c.t_comm,
                    "ovh": c.overhead, "bound": str(c.bound), "per_gpu": batch / t / tp})
    return out


def part_breakdown(model, chip, batches, section):
    print(f"\n=== {section}. {model.name} @ {chip.name}：decode 一步的账单（每序列上下文 {CTX}）===")
    results, rows = {}, []
    for b in batches:
        rs = tp_rows(model, chip, b)
        results[b] = rs
        for tp, r in zip(TPS, rs):
            if r is None:
                rows.append([b, tp, "权重放不下", "-", "-", "-", "-", "-", "-", "-"])
                continue
            if r.get("kv_full"):
                rows.append([b, tp, f"{r['st'].weight_bytes_per_chip / 1e9:.1f}",
                             f"{r['st'].kv_capacity_tokens() / 1e3:,.0f}", f"KV 放不下（要 {b * CTX / 1e3:,.0f}k）",
                             "-", "-", "-", "-", "-"])
                continue
            st = r["st"]
            rows.append([b, tp, f"{st.weight_bytes_per_chip / 1e9:.1f}", f"{st.kv_capacity_tokens() / 1e3:,.0f}",
                         f"{r['t'] * 1e3:.2f}", f"{r['roof'] * 1e3:.2f}", f"{r['comm'] * 1e3:.2f}",
                         f"{r['comm'] / r['t']:.0%}", f"{1 / r['t']:.0f}", f"{r['per_gpu']:,.0f}"])
        ok = [r for r in rs if r is not None and not r.get("kv_full")]
        # 关键结论（由模型结构推出，不是抄数字）：
        for a, c in zip(ok, ok[1:]):
            assert c["t"] < a["t"], "tp 越大，每一步越快"
            assert c["comm"] / c["t"] > a["comm"] / a["t"], "all-reduce 的占比随 tp 上升"
            assert c["per_gpu"] < a["per_gpu"], "固定开销和通信不随 tp 缩短：每卡吞吐下降"
            assert c["st"].kv_capacity_tokens() > a["st"].kv_capacity_tokens() * c["tp"] / a["tp"], \
                "每卡权重变少，KV 容量增长得比 tp 还快"
            assert a["t"] / c["t"] < c["tp"] / a["tp"], "加速比小于卡数之比"
    print(format_table(["批", "TP", "每卡权重 GB", "KV 容量 k token", "一步 ms", "roofline ms", "all-reduce ms",
                           "通信占比", "每用户 token/s", "每卡 token/s"], rows))
    return results


def plot(results, model, chip, quick=False):
    bs = sorted(results)
    fig, ax = plt.subplots(1, len(bs), figsize=(7 * len(bs), 6), squeeze=False)
    for a, b in zip(ax[0], bs):
        ok = [r for r in results[b] if r is not None and not r.get("kv_full")]
        x = np.arange(len(ok))
        roof = np.array([r["roof"] for r in ok]) * 1e3
        comm = np.array([r["comm"] for r in ok]) * 1e3
        ovh = np.array([r["ovh"] for r in ok]) * 1e3
        a.bar(x, roof, label="roofline (max of compute, memory)")
        a.bar(x, comm, bottom=roof, label="all-reduce (2 per layer)")
        a.bar(x, ovh, bottom=roof + comm, label="fixed overhead")
        for xi, r, top in zip(x, ok, roof + comm + ovh):      # 通信 + 开销的占比：随 tp 上升（不缩短的那两块）
            a.text(xi, top * 1.02, f"{(r['comm'] + r['ovh']) / r['t']:.0%} not shrinking", ha="center")
        a.set_xticks(x, [f"TP{r['tp']}" for r in ok])
        a.set_ylim(0, 1.15 * (roof + comm + ovh).max())
        a.set_ylabel("time per decode step (ms)")
        skipped = [f"TP{r['tp']}" for r in results[b] if r is not None and r.get("kv_full")]
        skipped += [f"TP{tp}" for tp, r in zip(TPS, results[b]) if r is None]
        a.set_title(f"batch {b}, ctx {CTX}" + (f" ({', '.join(sorted(skipped))}: does not fit)" if skipped else ""))
        a.grid(alpha=0.3, axis="y")
    fig.suptitle(f"{model.name} on {chip.name}: TP shortens the roofline part only")
    handles, labels = ax[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, bbox_to_anchor=(0.5, -0.06))
    path = save_figure(fig, __file__, "breakdown", quick=quick)
    print(f"\n图：{path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--quick", action="store_true", help="（这个演示本来就快；接受 --quick 保持一致）")
    ap.add_argument("--seed", type=int, default=0, help="（没有随机数；保持接口一致）")
    args = ap.parse_args()
    print(f"seed = {args.seed}（本演示没有随机性）；all-reduce 用 prereq5/comm_sim 的 ring 模型，"
          f"H100 NVLink 每方向 {H100_SXM.link_bw / 1e9:.0f} GB/s\n")
    part_fit()
    res = part_breakdown(ss.LLAMA31_70B, H100_SXM, [1, 32], 2)
    part_breakdown(ss.LLAMA31_8B, H100_SXM, [1, 32], 3)
    r8 = [r for r in res[1] if r is not None and r["tp"] == 8 and not r.get("kv_full")][0]
    print(f"\n结论：70B、批 1 时 TP8 一步 {r8['t'] * 1e3:.1f} ms，其中 all-reduce 占 {r8['comm'] / r8['t']:.0%}、"
          f"固定开销占 {r8['ovh'] / r8['t']:.0%}——这两项不随 tp 缩短，所以 TP 买的是延迟和显存，不是每卡效率。")
    plot(res, ss.LLAMA31_70B, H100_SXM, quick=args.quick)


if __name__ == "__main__":
    main()
