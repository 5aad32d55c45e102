"""
第 19 讲 · 演示 4：环形注意力——先在一个进程里模拟记账，再用 torch.distributed 真的跑一圈

你会看到：
    1. 模拟（ring_attention + RingLedger）：N 个 token 分给 P 块设备，P 轮里每块设备每轮算多少 (q, k) 对。
       因果掩码下 contiguous 切法很不均衡：第 0 块设备只有第 1 轮有活，最后一块每轮都满；每轮要等最慢的
       那块，总时间 ∝ Σ_轮 max。striped [S97]（token t 给设备 t mod P）让每块设备每轮的工作量几乎一样。
    2. 通信量：每块设备每轮把手上的 K、V 块（2·(N/P)·d 个数）发给下一块，共 P − 1 轮——和 P 无关地
       每块设备总共发 ≈ 2·N·d 个数；按 BF16 换成字节。
    3. 真的跑：P 个进程（torch.multiprocessing + gloo，CPU；有 GPU 时同一个函数走 NCCL）各持一段 Q/K/V，
       K/V 用 batch_isend_irecv 沿环传递、同时算当前块；拼起来的输出和整条序列的注意力一致（打印最大误差）；
       最慢的进程花在"计算""等通信"和其他上的时间（同一进程里拆，三者相加 = 它的总时间）；
       实际发送的元素数 = RingLedger 的记账。

运行：python3 lecture19/04_ring_attention.py [--quick] [--procs 2]
      多 GPU：torchrun --nproc_per_node=2 lecture19/04_ring_attention.py --torchrun（每个进程一块 GPU，NCCL）
图：lecture19/figures/04_ring_attention_work.png
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import long_lab as L  # noqa: E402
import ring_dist as RD  # noqa: E402
from course_utils import fmt_bytes, fmt_time, pyplot, save_figure  # noqa: E402


def simulate(N, d, P):
    Q, K, V = RD.make_qkv(N, d, seed=0)
    ref = RD.full_attention(Q, K, V, causal=True)
    out = {}
    rows = []
    for layout in L.LAYOUTS:
        O, led = L.ring_attention(Q, K, V, P, causal=True, layout=layout)
        err = (O - ref).abs().max().item()
        assert err < 1e-12
        ideal = led.total_work() / P                       # 完全均衡时的总时间（同样的单位：对数）
        out[layout] = led
        rows.append([layout, f"{err:.1e}", f"{led.total_work():,}", f"{led.round_time():,}",
                     f"{ideal / led.round_time():.0%}", " ".join(str(w) for w in led.work[-1])])
    print(f"因果注意力，N = {N}，d = {d}，P = {P}（整块在未来的跳过不算）：")
    print(L.format_table(["切法", "与全注意力的最大差", "总 (q,k) 对", "Σ_轮 max_设备", "均衡效率",
                          "最后一轮各设备"], rows))
    c, s = out["contiguous"], out["striped"]
    assert s.round_time() < c.round_time() and c.total_work() == s.total_work() == N * (N + 1) // 2
    print(f"striped 把每轮的等待从 Σ max = {c.round_time():,} 降到 {s.round_time():,}"
          f"（{c.round_time() / s.round_time():.2f}×）；总工作量一样。")
    per_dev = 2 * (N // P) * d * (P - 1)
    assert c.sent == s.sent == [per_dev] * P
    print(f"通信：每块设备发 {P - 1} 轮 × 2·(N/P)·d = {per_dev:,} 个数 = {fmt_bytes(2 * per_dev)}（BF16）；"
          f"全序列 K、V 一共 2·N·d = {2 * N * d:,} 个数。")
    return out


def real_run(P, N, d, heads):
    jobs = [dict(N=N, d=d, heads=heads, causal=c, layout=lay, seed=1) for c in (True, False) for lay in L.LAYOUTS]
    t0 = time.time()
    res = RD.run_ring(P, jobs)
    print(f"\n真的跑：{P} 个进程（gloo，CPU），每个 {heads} 个头 × N/P = {N // P} 个 token × d = {d}；"
          f"起进程 + {len(jobs)} 个任务共 {time.time() - t0:.1f} s")
    rows = []
    for job, (O, stats) in zip(jobs, res):
        Q, K, V = RD.make_qkv(N, d, 1, heads)
        err = (O - RD.full_attention(Q, K, V, job["causal"])).abs().max().item()
        assert err < 1e-12, (job, err)
        led = L.ring_attention(Q, K, V, P, job["causal"], job["layout"])[1]
        sent = [sum(r["sent"] for r in st["rounds"]) for st in stats]
        assert sent == led.sent                                 # 真的发送量 = 模拟的记账
        pairs = [[st["rounds"][rnd]["pairs"] for st in stats] for rnd in range(P)]
        assert pairs == led.work                                # 每轮每个进程算的对数也一样
        # 每轮大家一起等最慢的进程：Σ_轮 max_进程，和 RingLedger.round_time 同一种算法
        crit = sum(max(st["rounds"][rnd]["compute_s"] for st in stats) for rnd in range(P))
        # 总时间拆开只能在同一个进程里拆：各轮最慢的计算和最长的等待往往不在同一个进程（一个在算、另一个在等它），
        # 把两者的 Σ_轮 max 相加会把重叠的时间算两遍
        slow = max(stats, key=lambda st: st["total_s"])
        comp = sum(r["compute_s"] for r in slow["rounds"])
        wait = sum(r["wait_s"] for r in slow["rounds"])
        other = slow["total_s"] - comp - wait                   # 发起收发、分配缓冲、最后归一化
        assert other >= 0, (comp, wait, slow["total_s"])        # 同一进程里两段时间不重叠：计算 + 等通信 ≤ 总时间
        rows.append([job["layout"], job["causal"], f"{err:.1e}", f"{sent[0]:,}", fmt_time(crit),
                     f"{fmt_time(comp)} + {fmt_time(wait)} + {fmt_time(other)} = {fmt_time(slow['total_s'])}"])
    print(L.format_table(["切法", "causal", "与全注意力的最大差", "每进程发送（个数）", "Σ_轮 max 计算",
                          "最慢进程：计算 + 等通信 + 其他 = 总时间"], rows))
    print("右边一列是同一个进程、同一次运行的拆分：其他 = 总时间 − 计算 − 等通信（发起收发、缓冲、归一化），"
          "计算和等待是同一进程里不重叠的两段，所以其他 ≥ 0（断言）。"
          "Σ_轮 max 计算是 RingLedger.round_time 的算法（每轮取最慢的进程），\n"
          "各轮可能是不同进程、进程之间也没有每轮的栅栏，所以它不是总时间的一部分，可能比任何一个进程的总时间还略大。")
    stats = res[0][1]                                       # 第一个任务（contiguous、causal）逐轮看
    rows = [[rnd, " / ".join(str(st["rounds"][rnd]["pairs"]) for st in stats),
             " / ".join(fmt_time(st["rounds"][rnd]["compute_s"]) for st in stats),
             " / ".join(fmt_time(st["rounds"][rnd]["wait_s"]) for st in stats)] for rnd in range(P)]
    print(f"\n{jobs[0]['layout']}、causal 逐轮（各进程用 / 隔开）：")
    print(L.format_table(["轮", "(q,k) 对", "计算", "等通信"], rows))
    print("发送量、每轮每个进程算的对数都逐项等于 RingLedger 的记账。\"等通信\" = 算完当前块后还要等下一块到达的时间，"
          "通信被计算盖住时接近 0。\n注意：这里每块按稠密矩阵算（部分被掩的块也算满 n×n），所以 striped 的实际计算"
          "并不比 contiguous 少；\nGPU 上的 FlashAttention 核会跳过被掩的小块，时间才和记账里的对数成正比。"
          "CPU 很忙时这些计时噪声很大。")
    return res


def plot(leds, P, quick, res=None):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 5))
    vmax = max(max(max(r) for r in led.work) for led in leds.values())
    for ax, (layout, led) in zip(axes, leds.items()):
        work = torch.tensor(led.work, dtype=torch.float64).T           # [设备, 轮]
        im = ax.imshow(work.numpy(), cmap="viridis", vmin=0, vmax=vmax, aspect="auto")
        ax.set_xlabel("ring round t")
        ax.set_ylabel("device r (holds Q_r)")
        ax.set_xticks(range(P))
        ax.set_yticks(range(P))
        verdict = "devices idle or overloaded" if layout == "contiguous" else "balanced"
        ax.set_title(f"{layout}: {verdict}\ncritical path {led.round_time():,} pairs")
    fig.colorbar(im, ax=axes[1], label="(q, k) pairs per device per round")
    times = {layout: led.round_time() for layout, led in leds.items()}
    if set(times) >= {"contiguous", "striped"}:
        fig.suptitle(f"Causal ring attention, P = {P}: striping balances the rounds, "
                     f"{times['contiguous'] / times['striped']:.2f}x shorter critical path")
    else:
        fig.suptitle("Causal ring attention: work per device per round")
    path = save_figure(fig, __file__, "work", quick=quick)
    return [path]


def torchrun_main(N, d, heads):
    """torchrun 起的每个进程进这里：NCCL（有 GPU）或 gloo，各算自己那段，rank 0 拼起来核对。"""
    import torch.distributed as dist
    rank, P, device = RD.init_distributed()
    try:
        for causal in (True, False):
            for layout in L.LAYOUTS:
                Q, K, V = RD.make_qkv(N, d, 1, heads, dtype=torch.float32)
                mine = L.shard_index(N, P, layout)[rank]
                q, k, v = (t[..., mine, :].to(device) for t in (Q, K, V))
                stats = {}
                o = RD.ring_attention_dist(q, k, v, causal, layout, stats=stats)
                parts = [torch.empty_like(o) for _ in range(P)]
                dist.all_gather(parts, o.contiguous())
                if rank == 0:
                    O = torch.empty_like(Q)
                    for r, idx in enumerate(L.shard_index(N, P, layout)):
                        O[..., idx, :] = parts[r].cpu()
                    ref = RD.full_attention(*(t.to(device) for t in (Q, K, V)), causal).cpu()   # 参考在同一设备上算
                    err = (O - ref).abs().max().item()
                    comp = sum(r["compute_s"] for r in stats["rounds"])
                    wait = sum(r["wait_s"] for r in stats["rounds"])
                    print(f"{layout:10s} causal={causal!s:5s} 最大差 {err:.1e}  rank 0：计算 {fmt_time(comp)}，"
                          f"等通信 {fmt_time(wait)}（{dist.get_backend()}，{device}）")
                    assert err < 1e-4
    finally:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description="环形注意力：模拟记账与 torch.distributed 实跑")
    ap.add_argument("--quick", action="store_true", help="小规模：2 个进程、短序列")
    ap.add_argument("--procs", type=int, default=0, help="真跑时的进程数（默认 quick 2，否则 4）")
    ap.add_argument("--torchrun", action="store_true", help="由 torchrun 启动（每个进程一块 GPU 时用 NCCL）")
    args = ap.parse_args()
    if args.torchrun:
        big = torch.cuda.is_available()                  # CPU（gloo）上用小一点的序列：块的分数矩阵要放进内存
        return torchrun_main(N=16384 if big else 2048, d=64, heads=8 if big else 2)
    P_sim = 4 if args.quick else 8
    leds = simulate(N=256 if args.quick else 2048, d=16, P=P_sim)
    P = args.procs or (2 if args.quick else 4)
    real_run(P, N=64 * P if args.quick else 512 * P, d=16 if args.quick else 64, heads=2)
    for p in plot(leds, P_sim, args.quick):
        print(f"图：{os.path.relpath(p)}")


if __name__ == "__main__":
    main()
