"""
第 5 讲 · 演示 3：泊松负载下的排队、goodput 与 Little 定律

你会看到：
  1. 请求按泊松过程到达（Orca 的合成负载：输入 ~ U(32, 512)、输出 ~ U(1, 128)，GPT-3 13B @ A100 40GB）。
     先用离线负载量出静态批处理的服务能力（req/s），再让到达率从它的 25% 加到 4 倍：
     低负载时吞吐 = 到达率，延迟几乎只是服务时间；接近能力时排队让 TTFT 的尾巴迅速变长；
     超过能力后队列无限增长，吞吐封顶，而满足 SLO 的 goodput 塌下去。
  2. 同样的负载交给迭代级调度（continuous batching，第 6 讲细讲），能力高得多；
  3. Little 定律 L = λW：在模拟出来的轨迹上，系统中请求数的时间平均 L 与 到达率 × 平均逗留时间 相等
     （整个轨迹上精确相等；稳态的中间一段在统计误差内相等；过载时系统不稳定，中间一段对不上）。
  图：figures/03_poisson_load_latency.png、figures/03_poisson_load_little.png

运行：python3 lecture05/03_poisson_load.py [--quick] [--seed 0]
"""
import argparse
import math
import os
import sys


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serving_sim as ss  # noqa: E402
from course_utils import format_table, pyplot, save_figure  # noqa: E402

plt = pyplot()

PROMPT, OUTPUT = ("uniform", 32, 512), ("uniform", 1, 128)     # Orca §6.2 的合成负载[S56]
SLO_TTFT, SLO_TPOT = 2.0, 0.05                                  # 本演示选的 SLO（秒），不是某篇论文的数字
STATIC_B, CONT_B = 8, 64
LOADS = [0.25, 0.5, 0.75, 0.9, 1.2, 2.0, 4.0]                   # 到达率 = 静态批处理能力 × 这些倍数
STABLE = 0.75                                                   # 不超过这个负载的行当作"稳态"来检查


def capacity(step, n, seed):
    """离线（全部 t = 0 到达）时静态批处理每秒完成多少个请求：服务能力的估计。"""
    reqs = ss.make_requests(n, math.inf, PROMPT, OUTPUT, seed=seed)
    rs, _ = ss.simulate_static(reqs, step, STATIC_B)
    return ss.summarize(rs)["req_per_s"]


def run(step, n, rate, seed):
    reqs = ss.make_requests(n, rate, PROMPT, OUTPUT, seed=seed)
    out = {}
    for name, sim in (("static", lambda r: ss.simulate_static(r, step, STATIC_B)),
                      ("continuous", lambda r: ss.simulate_continuous(r, step, CONT_B))):
        rs, _ = sim(reqs)
        s = ss.summarize(rs, slo_ttft=SLO_TTFT, slo_tpot=SLO_TPOT)
        lo, hi = int(0.2 * n), int(0.8 * n)
        s["little_all"] = ss.littles_law(rs)
        s["little_mid"] = ss.littles_law(rs, rs[lo].arrival, rs[hi].arrival)
        s["trace"] = rs
        out[name] = s
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--quick", action="store_true", help="少一些请求（check-all 用）")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n = 300 if args.quick else 1500
    step = ss.StepModel(ss.GPT3_13B, ss.A100_40G)
    print(f"seed = {args.seed}；{step.model.name} @ {step.chip.name}；每次 {n} 个请求；"
          f"SLO：TTFT ≤ {SLO_TTFT:g} s 且 TPOT ≤ {SLO_TPOT * 1e3:g} ms")
    cap = capacity(step, n, args.seed)
    print(f"静态批处理（max_batch {STATIC_B}）的离线服务能力 ≈ {cap:.2f} req/s\n")
    res = {x: run(step, n, x * cap, args.seed) for x in LOADS}

    rows = []
    for x, r in res.items():
        st, co = r["static"], r["continuous"]
        rows.append([f"{x:.2f}", f"{x * cap:.2f}", f"{st['req_per_s']:.2f}", f"{st['ttft_p50'] * 1e3:,.0f}",
                     f"{st['ttft_p99'] * 1e3:,.0f}", f"{st['goodput']:.2f}", f"{co['req_per_s']:.2f}",
                     f"{co['ttft_p99'] * 1e3:,.0f}", f"{co['goodput']:.2f}"])
    print(format_table(["负载 ρ", "到达 req/s", "静态 吞吐 req/s", "静态 TTFT p50 ms", "静态 TTFT p99 ms",
                           "静态 goodput req/s", "迭代级 吞吐 req/s", "迭代级 TTFT p99 ms", "迭代级 goodput req/s"],
                          rows))

    print("\nLittle 定律 L = λW（静态批处理；整个轨迹 / 中间 60% 的窗口）：")
    rows = []
    for x, r in res.items():
        a, m = r["static"]["little_all"], r["static"]["little_mid"]
        rows.append([f"{x:.2f}", f"{a['L']:.2f}", f"{a['lam_W']:.2f}", f"{a['rel_err']:.1e}", f"{m['L']:.2f}",
                     f"{m['lam_W']:.2f}", f"{m['rel_err']:.1%}", "稳态" if x <= STABLE else "过载/临界"])
    heads = ["负载 ρ", "L 个请求（全程）", "λW 个请求（全程）", "相对误差（全程）", "L 个请求（中段）",
             "λW 个请求（中段）", "相对误差（中段）", "状态"]
    print(format_table(heads, rows))

    # ---- 关键结论 ----
    for x, r in res.items():
        for s in r.values():
            assert s["goodput"] <= s["req_per_s"] + 1e-12
            assert s["little_all"]["rel_err"] < 1e-9                 # 整个轨迹：L·T = Σ 逗留时间，精确
            if x <= STABLE:
                arr = [q.arrival for q in s["trace"]]
                lam_hat = (len(arr) - 1) / (arr[-1] - arr[0])      # 这条轨迹实际的到达率（抽样有涨落）
                assert abs(s["req_per_s"] - lam_hat) / lam_hat < 0.05, "稳态：吞吐 ≈ 到达率"
                assert s["little_mid"]["rel_err"] < 0.1, (x, s["little_mid"])
    st = [res[x]["static"] for x in LOADS]
    assert st[-1]["ttft_p50"] > 10 * st[0]["ttft_p50"], "过载时排队让 TTFT 暴涨"
    assert st[-1]["req_per_s"] < 1.2 * cap, "过载时吞吐封顶在服务能力附近"
    assert st[-1]["goodput"] < max(s["goodput"] for s in st), "过载时 goodput 塌下去"
    assert all(res[x]["continuous"]["goodput"] >= res[x]["static"]["goodput"] for x in LOADS)
    print(f"\n结论：负载 {LOADS[-1]}× 时静态批处理的 TTFT 中位数是 {LOADS[0]}× 时的 "
          f"{st[-1]['ttft_p50'] / st[0]['ttft_p50']:.0f} 倍，吞吐封顶在 {st[-1]['req_per_s']:.2f} req/s，"
          f"goodput 从最高 {max(s['goodput'] for s in st):.2f} 掉到 {st[-1]['goodput']:.2f} req/s；")
    print("      迭代级调度不用等整批、也不补齐，同样的负载下 goodput 不低于静态批处理（第 6 讲看它为什么快）。")
    plot(res, cap, quick=args.quick)


def plot(res, cap, quick=False):
    rates = [x * cap for x in LOADS]
    fig, ax = plt.subplots(1, 2, figsize=(15, 6.5))
    for name, c in (("static", "C0"), ("continuous", "C1")):
        ax[0].semilogy(rates, [res[x][name]["ttft_p50"] for x in LOADS], c + "o-", label=f"{name} p50")
        ax[0].semilogy(rates, [res[x][name]["ttft_p99"] for x in LOADS], c + "s--", label=f"{name} p99")
        ax[1].plot(rates, [res[x][name]["req_per_s"] for x in LOADS], c + "o-", label=f"{name} throughput")
        ax[1].plot(rates, [res[x][name]["goodput"] for x in LOADS], c + "s--", label=f"{name} goodput")
    ax[0].axhline(SLO_TTFT, color="gray", ls=":", label="TTFT SLO")
    ax[0].set_ylabel("TTFT (s)")
    ax[1].plot(rates, rates, "k:", lw=0.8, label="offered load")
    ax[1].set_ylabel("requests / s")
    for a in ax:
        a.axvline(cap, color="red", lw=1.2, ls=":")
        a.set_xlabel("arrival rate (req/s); red: static capacity")
        a.grid(alpha=0.3)
        a.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)     # 图下：不挡曲线和 SLO 线
    ax[1].annotate("static saturates at its capacity;\ngoodput collapses", xy=(cap * 1.6, 2.45),
                   xytext=(cap * 2.3, 0.7), arrowprops=dict(arrowstyle="->"))
    ax[0].set_title("GPT-3 13B / A100-40GB, Poisson arrivals")
    ax[1].set_title("throughput vs goodput (SLO-meeting requests/s)")
    p1 = save_figure(fig, __file__, "latency", quick=quick)

    x = STABLE
    rs = res[x]["static"]["trace"]
    times, counts = ss.occupancy(rs)
    lw = res[x]["static"]["little_all"]
    fig, a = plt.subplots(figsize=(12, 5.5))
    a.step(times, counts, where="post", lw=1, label="N(t): requests in system")
    a.axhline(lw["L"], color="C1", label=f"time average L = {lw['L']:.2f}")
    a.axhline(lw["lam_W"], color="C2", ls="--", label=f"λ·W = {lw['lam_W']:.2f}")
    a.set_xlabel("time (s)")
    a.set_ylabel("requests in system N(t)")
    a.set_title(f"Little's law on the simulated trace (static batching, load {x})")
    a.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    a.grid(alpha=0.3)
    p2 = save_figure(fig, __file__, "little", quick=quick)
    print(f"\n图：{p1}\n    {p2}")


if __name__ == "__main__":
    main()
