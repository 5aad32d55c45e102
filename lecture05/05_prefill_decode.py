"""
第 5 讲 · 演示 5：prefill 与 decode 的相互干扰——为什么有分块 prefill（Sarathi）和 prefill/decode 分离（DistServe）

你会看到：
  1. 一个批里 32 个序列正在 decode（每步几毫秒，受带宽限制），这时来了一个 4096 token 的输入。
     把它整段塞进同一次迭代（Orca 式），这一步变成算力受限的 prefill，32 个用户的下一个 token 都被卡住——
     相邻 token 间隔（ITL）出现一个尖峰；
  2. 分块 prefill：每次迭代的 token 预算 C（含 decode），长输入切成几块搭着 decode 跑——尖峰变矮，
     代价是新请求的 TTFT 变长（多跑几步：每步都要重读权重、付固定开销）；
  3. prefill/decode 分离：prefill 在另一块卡上做，decode 的 ITL 完全不受影响；代价是把 KV 传过去
     （NVLink 上很快，跨机网卡慢一个数量级），以及两池卡各自的利用率问题；
  4. 泊松负载下的迭代级模拟：整段 prefill vs 分块 prefill 的 ITL 尾巴、TTFT；
  5. 论文里报告的数字（只引用 SOURCES.md 里有出处的）。
  图：figures/05_prefill_decode_itl.png、figures/05_prefill_decode_load.png

运行：python3 lecture05/05_prefill_decode.py [--quick] [--seed 0]
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
from hw_specs import H100_SXM  # noqa: E402
from course_utils import format_table, save_figure  # noqa: E402

N_DEC, CTX, PROMPT = 32, 2048, 4096     # 正在 decode 的序列数、每个的上下文、新来的输入长度
ARRIVE_AT = 3                          # 新请求在第几次迭代之前到达
IB_BW = 46e9                           # 跨机：一块 NDR 400 Gb/s 网卡实测 busbw 约 46–48 GB/s[S69]


def timeline(step, chunk, n_steps=24):
    """
    N_DEC 个序列一直在 decode；第 ARRIVE_AT 次迭代起新请求的 PROMPT 个 token 加入。
    chunk = None：整段一次做完；chunk = C：每次迭代 token 总数 ≤ C。
    返回 (每次迭代的时长数组, 新请求的 TTFT)。decode 序列的上下文每步 +1。
    """
    a1 = step.model.attn_flops_per_token(1)
    dts, done, ttft_t, t = [], 0, None, 0.0
    for k in range(n_steps):
        ctx = N_DEC * (CTX + k)
        c = 0
        if k >= ARRIVE_AT and done < PROMPT:
            c = PROMPT - done if chunk is None else min(PROMPT - done, max(chunk - N_DEC, 0))
        if c:
            dt = step.mixed_time(N_DEC, ctx, c, a1 * (c * done + c * (c + 1) / 2), done)
        else:
            dt = step.decode_time(N_DEC, ctx)
        t += dt
        dts.append(dt)
        done += c
        if c and done == PROMPT:
            ttft_t = t - sum(dts[:ARRIVE_AT])      # 从到达（第 ARRIVE_AT 次迭代开始）算起
    return np.array(dts), ttft_t


def part_single(step, quick):
    print(f"=== 1–3. {N_DEC} 个序列在 decode（上下文 {CTX}），来了一个 {PROMPT} token 的输入 "
          f"（{step.model.name} @ {step.chip.name}）===")
    base = step.decode_time(N_DEC, N_DEC * CTX)
    chunks = [None, 2048, 1024, 512] if quick else [None, 4096, 2048, 1024, 512, 256]
    rows, lines = [], {}
    for ch in chunks:
        dts, ttft = timeline(step, ch)
        lines["whole prompt" if ch is None else f"chunk {ch}"] = dts
        slow = int(np.sum(dts > 1.5 * base))
        rows.append(["整段（Orca 式）" if ch is None else f"分块 C = {ch}", f"{dts.max() * 1e3:.1f}", slow,
                     f"{ttft * 1e3:.1f}"])
    # 分离：prefill 在另一块卡上；decode 卡只多一次"接收 KV"，这里不算进 decode 的 ITL
    kv = PROMPT * step.kv_bytes_per_token
    pre = step.prefill_time([PROMPT])
    rows.append(["分离（NVLink 传 KV）", f"{base * 1e3:.1f}", 0, f"{(pre + kv / H100_SXM.link_bw) * 1e3:.1f}"])
    rows.append(["分离（跨机网卡传 KV）", f"{base * 1e3:.1f}", 0, f"{(pre + kv / IB_BW) * 1e3:.1f}"])
    print(f"  只有 decode 时每步 {base * 1e3:.2f} ms（{step.decode_cost(N_DEC, N_DEC * CTX).bound} 受限）")
    print(format_table(["做法", "最大 ITL ms", "被拖慢的步数", "新请求 TTFT ms"], rows))
    print(f"  KV 大小：{PROMPT} token × {step.kv_bytes_per_token / 1e3:.0f} KB = {kv / 1e6:.0f} MB；"
          f"NVLink {kv / H100_SXM.link_bw * 1e3:.1f} ms，网卡 {kv / IB_BW * 1e3:.1f} ms"
          f"（prefill 本身 {pre * 1e3:.0f} ms）")

    # ---- 关键结论（由 roofline 推出）----
    whole, _ = timeline(step, None)
    assert whole.max() > 2 * base, "整段 prefill 的那一步远比 decode 步长：ITL 尖峰"
    assert whole.max() >= step.prefill_cost([PROMPT]).t_compute, "尖峰至少是整段 prefill 的计算时间"
    maxes = [timeline(step, ch)[0].max() for ch in chunks[1:]]
    assert all(b < a for a, b in zip(maxes, maxes[1:])) and maxes[0] <= whole.max(), "块越小，尖峰越矮"
    ttfts = [timeline(step, ch)[1] for ch in chunks]
    assert all(t >= ttfts[0] for t in ttfts[1:]), "分块让新请求自己的 TTFT 变长（多付几次读权重和固定开销）"
    assert kv / H100_SXM.link_bw < 0.1 * pre, "GQA 模型的 KV 在 NVLink 上传得比 prefill 快得多"
    return lines, base


def part_load(step, n, seed):
    rate = 12.0
    print(f"\n=== 4. 泊松负载 {rate:g} req/s，输入 ~ 对数正态（中位数 1024、σ 0.8、≤ 8192），输出 ~ U(32, 256)，"
          f"迭代级调度 max_batch 128，{n} 个请求 ===")
    reqs = ss.make_requests(n, rate, ("lognormal", 1024, 0.8, 8192), ("uniform", 32, 256), seed=seed)
    rows, res = [], {}
    for ch in (None, 2048, 512):
        rs, info = ss.simulate_continuous(reqs, step, 128, chunk=ch)
        s = ss.summarize(rs, warmup=0.1)
        res[ch] = s
        rows.append(["整段" if ch is None else f"C = {ch}", f"{s['req_per_s']:.2f}", f"{s['ttft_p50'] * 1e3:.0f}",
                     f"{s['ttft_p99'] * 1e3:.0f}", f"{s['tpot_p50'] * 1e3:.1f}", f"{s['tpot_p99'] * 1e3:.1f}",
                     f"{s['itl_p99'] * 1e3:.1f}", f"{info['mean_batch']:.1f}"])
        assert ss.littles_law(rs)["rel_err"] < 1e-9
    print(format_table(["prefill", "吞吐 req/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms",
                           "ITL p99 ms", "平均每步请求数"], rows))
    assert res[512]["itl_p99"] < 0.5 * res[None]["itl_p99"], "分块 prefill 把 ITL 的尾巴压下去"
    assert res[512]["tpot_p99"] < res[None]["tpot_p99"]
    print(f"  分块（C = 512）后 decode 不再被整段 prefill 卡住：ITL p99 {res[None]['itl_p99'] * 1e3:.0f} → "
          f"{res[512]['itl_p99'] * 1e3:.0f} ms；TTFT 中位数 {res[None]['ttft_p50'] * 1e3:.0f} → "
          f"{res[512]['ttft_p50'] * 1e3:.0f} ms（新请求自己的 prefill 被切成几步）。")
    return res


def part_papers():
    print("\n=== 5. 论文里的数字（出处见最后一列的键，在 SOURCES.md 里查；本模块没有复现它们，只是对照）===")
    rows = [
        ["Sarathi（分块 prefill + decode 搭车）", "decode 吞吐最高 10×，端到端最高 1.33×（LLaMA-13B，A6000）", "[S64]"],
        ["Sarathi", "1.25× 端到端 / 4.25× decode（LLaMA-33B，A100）", "[S64]"],
        ["Sarathi-Serve（OSDI'24）", "尾延迟 SLO 下的服务能力 vs vLLM：Mistral-7B 2.6×、Yi-34B 最高 3.7×", "[S65]"],
        ["DistServe（OSDI'24，分离）", "比 SOTA 多服务 7.4× 请求，或 SLO 收紧 12.6×（>90% 请求达标）", "[S66]"],
        ["DistServe 例子（13B，A100，90% SLO）",
         "同卡 1.6 rps；只做 prefill 5.6、只做 decode 10；2P+1D → 每卡 3.3 rps = 2.1×", "[S67]"],
    ]
    print(format_table(["系统", "报告的结果", "出处"], rows))


def plot(lines, base, res, quick=False):
    fig, a = plt.subplots(figsize=(12, 6))
    # chunk = 4096 和整段 prompt 是同一条曲线：合成一条（course_utils.merge_identical），图例不列看不见的线
    series = [(name, np.cumsum(dts) * 1e3, dts * 1e3) for name, dts in lines.items()]
    for name, t, y in ss.merge_identical(series):
        whole = name.startswith("whole")      # 整段 prompt 和 chunk 4096 几乎重合：整段画成黑色虚线、压在上面
        a.step(t, y, where="pre", lw=2.5 if whole else 2, ls="--" if whole else "-",
               color="black" if whole else None, zorder=3 if whole else 2, label=name)
    a.axhline(base * 1e3, color="gray", ls=":", lw=1.5, label="decode-only step")
    a.set_yscale("log")
    a.set_xlabel("time (ms)")
    a.set_ylabel("inter-token latency (ms)")
    a.set_title(f"{N_DEC} decoding sequences + one {PROMPT}-token prompt (Llama-3.1-8B / H100)")
    a.annotate("smaller chunks: shorter stalls,\nbut the prompt finishes later", xy=(150, base * 1e3 * 1.5),
               xytext=(170, 40), arrowprops=dict(arrowstyle="->"))
    a.annotate("chunk 256: barely above\nthe decode-only step", xy=(200, base * 1e3 * 1.02), xytext=(230, 13),
               arrowprops=dict(arrowstyle="->"))
    a.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    a.grid(alpha=0.3)
    p1 = save_figure(fig, __file__, "itl", quick=quick)

    names = ["whole" if k is None else f"C={k}" for k in res]
    keys = [("ttft_p50", "TTFT p50"), ("ttft_p99", "TTFT p99"), ("tpot_p99", "TPOT p99"), ("itl_p99", "ITL p99")]
    fig, a = plt.subplots(figsize=(12, 6))
    w = 0.8 / len(res)
    x = np.arange(len(keys))
    for i, (k, nm) in enumerate(zip(res, names)):
        a.bar(x + i * w, [res[k][key] * 1e3 for key, _ in keys], w, label=nm)
    a.set_xticks(x + w * (len(res) - 1) / 2, [lab for _, lab in keys])
    a.set_yscale("log")
    a.set_ylabel("latency (ms)")
    a.set_title("Poisson load, iteration-level scheduling: chunked prefill")
    a.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), title="prefill chunk")
    a.grid(alpha=0.3, axis="y")
    p2 = save_figure(fig, __file__, "load", quick=quick)
    print(f"\n图：{p1}\n    {p2}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--quick", action="store_true", help="少一些请求和块大小（check-all 用）")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"seed = {args.seed}\n")
    step = ss.StepModel(ss.LLAMA31_8B, H100_SXM)
    lines, base = part_single(step, args.quick)
    res = part_load(step, 400 if args.quick else 2000, args.seed)
    part_papers()
    plot(lines, base, res, quick=args.quick)


if __name__ == "__main__":
    main()
