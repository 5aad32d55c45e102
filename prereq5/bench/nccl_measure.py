"""
预备课 5 · 工作台 nccl_measure.py：两块 H200 上的 NCCL 实测——all-reduce / all-gather / reduce-scatter 的 α、β

你会看到……
  1. 已提交的实测（prereq5/bench/results/nccl_measure.json：2×H200、NVLink，一个进程一块 GPU；文件里记着日期、
     GPU、驱动、torch / NCCL 版本和 `nvidia-smi topo -m`）：三种集合通信、消息 1 KiB … 1 GiB（float32），
     每个大小的时间、algbw 和 busbw（nccl-tests 的约定 [S68]：busbw = algbw × 系数，all-reduce 2(P−1)/P）。
  2. 用 comm_sim.fit_alpha_beta 按 ring 的系数拟合每种集合通信的 α、β；逐点列出 模型 / 实测。
  3. 拟合出的 α 和 NCCL 自己调优模型里的常数比（comm_sim.nccl_ring_latency，[S71]），
     大消息的 busbw 和 NVLink 4 的单向线速 450 GB/s、维护者说的 ≈ 370 GB/s 有效值比 [S40]。
  4. 用 P = 2 拟合出的 α、β 外推 P = 4 / 8（ring 模型；**是模型，不是测量**）。
  5. 图：busbw vs 消息大小，实测点 + α-β 曲线。存进 prereq5/bench/figures/；
     --replot 才重画已提交的 results/nccl_measure.png。

在有 ≥ 2 块 GPU 的机器上重新测（写 bench/results/nccl_measure.json，约 1 分钟），然后重画已提交的图（不用 GPU）：
    torchrun --nproc_per_node=2 prereq5/bench/nccl_measure.py --measure
    python3 prereq5/bench/nccl_measure.py --replot
只读结果、画图（没有 GPU 也行；check-all 跑 --replot：重画已提交的图）：
    python3 prereq5/bench/nccl_measure.py [--quick | --replot]
"""
import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))          # prereq5/bench
LESSON = os.path.dirname(HERE)                              # prereq5：工作台导入课，课从不导入工作台
sys.path.insert(0, LESSON)
sys.path.insert(0, os.path.join(LESSON, "..", "lecture01"))
import comm_sim as cs  # noqa: E402
sys.path.insert(0, os.path.join(LESSON, "..", "lecture01", "bench"))
from course_utils import committed_figure, fmt_bytes, format_table, load_json, pyplot, save_figure  # noqa: E402
from gpu_timing import cuda_time, nccl_environment  # noqa: E402

SKIP = 77
RESULTS = os.path.join(HERE, "results", "nccl_measure.json")
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter")
SIZES = [2 ** k for k in range(10, 31, 2)]        # 1 KiB … 1 GiB，每步 ×4
NVLINK4_LINE_RATE = 450e9                          # 字节/秒，H100/H200 NVLink 4 单向线速 [S40]
NVLINK4_EFFECTIVE = 370e9                          # 维护者给的有效 busbw（约 20% 协议开销）[S40]


# =============================================================================
# 测量（每个进程一块 GPU；torchrun 启动）
# =============================================================================
def _ops(dist, torch, n_bytes, world, device):
    """三种集合通信各自的缓冲区和调用；n_bytes 按 comm_sim 的约定（all-gather：拼起来之后的总大小）。"""
    n = n_bytes // 4
    full = torch.ones(n, dtype=torch.float32, device=device)
    shard = torch.ones(n // world, dtype=torch.float32, device=device)
    return {"allreduce": lambda: dist.all_reduce(full),
            "allgather": lambda: dist.all_gather_into_tensor(full, shard),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full)}


def _check_correct(dist, torch, world, rank, device):
    """正确性：rank r 的数据 = r + 1 + 位置；三种集合通信的结果和手算的和 / 拼接比。"""
    n = 1000 * world
    x = torch.arange(n, dtype=torch.float64, device=device) + rank + 1
    ar = x.clone()
    dist.all_reduce(ar)
    expect = world * torch.arange(n, dtype=torch.float64, device=device) + world * (world + 1) / 2
    shard = x[: n // world].clone()
    ag = torch.empty(n, dtype=torch.float64, device=device)
    dist.all_gather_into_tensor(ag, shard)
    ag_ref = torch.cat([torch.arange(n // world, dtype=torch.float64, device=device) + r + 1 for r in range(world)])
    rs = torch.empty(n // world, dtype=torch.float64, device=device)
    dist.reduce_scatter_tensor(rs, x.clone())
    rs_ref = expect[rank * (n // world):(rank + 1) * (n // world)]
    return max(float((ar - expect).abs().max()), float((ag - ag_ref).abs().max()), float((rs - rs_ref).abs().max()))


def measure(out_path):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")      # NVLink multicast 保持关闭（共享机器的要求）
    import torch
    import torch.distributed as dist
    if not torch.cuda.is_available():
        print("SKIP: --measure 需要 CUDA GPU（每个进程一块），用 torchrun --nproc_per_node=P 启动")
        sys.exit(SKIP)
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    err = _check_correct(dist, torch, world, rank, device)
    rows = []
    for n_bytes in SIZES:
        ops = _ops(dist, torch, n_bytes, world, device)
        iters = int(min(200, max(5, 4e9 / n_bytes)))   # 小消息多测几次，大消息 5 次就够（每次几 ms）
        for name in COLLECTIVES:
            dist.barrier()
            t = torch.tensor([cuda_time(ops[name], iters, trials=5, warmup=5)], device=device)   # 预热：建通道、选协议
            dist.all_reduce(t, op=dist.ReduceOp.MAX)     # 最慢的那个进程决定集合通信的时间
            rows.append({"collective": name, "bytes": n_bytes, "seconds": float(t[0]), "iters": iters})
        del ops
    if rank == 0:
        result = {"meta": {**nccl_environment(torch), "world": world, "dtype": "float32", "max_abs_error": err,
                           "timing": "CUDA events around `iters` back-to-back calls after 5 warm-ups; "
                                     "fastest of 5 such groups; max over ranks of the per-call mean"},
                  "rows": rows}
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)
        print(f"P = {world}，正确性误差 {err:.1e}；结果写入 {out_path}")
    dist.destroy_process_group()


# =============================================================================
# 分析（不需要 GPU）
# =============================================================================
def load(path):
    """结果 JSON → (meta, {集合通信: (字节数组, 秒数组)})；文件不存在时 None（演示打印 SKIP）。"""
    res = load_json(path)
    if res is None:
        return None
    by = {c: ([], []) for c in COLLECTIVES}
    for r in res["rows"]:
        by[r["collective"]][0].append(r["bytes"])
        by[r["collective"]][1].append(r["seconds"])
    return res["meta"], {c: (np.array(n, dtype=np.float64), np.array(t)) for c, (n, t) in by.items()}


def report(meta, data):
    p = meta["world"]
    print(f"实测：{meta['gpu']} × {p}，驱动 {meta.get('driver')}，torch {meta['torch']}，NCCL {meta['nccl']}，"
          f"{meta['date']}；NCCL_NVLS_ENABLE={meta.get('NCCL_NVLS_ENABLE')}")
    print("拓扑（nvidia-smi topo -m）：\n  " + meta.get("topology", "?").replace("\n", "\n  "))
    assert meta["max_abs_error"] == 0.0, "整数值的 float64 求和 / 拼接必须完全正确"
    print(f"正确性：三种集合通信和手算结果的最大误差 = {meta['max_abs_error']}\n")
    fits = {}
    for c in COLLECTIVES:
        n, t = data[c]
        fit = cs.fit_alpha_beta(n, t, p=p, collective=c, algo="ring")
        fits[c] = fit
        model = cs.cost_terms(c, n, p, "ring").time(fit.alpha, fit.beta)
        rows = [[fmt_bytes(ni), f"{ti * 1e6:.1f}", f"{mi * 1e6:.1f}", f"{mi / ti:.2f}",
                 f"{cs.algbw(ni, ti) / 1e9:.1f}", f"{cs.busbw(c, ni, ti, p) / 1e9:.1f}"]
                for ni, ti, mi in zip(n, t, model)]
        print(f"== {c}（P = {p}）")
        print(format_table(["消息", "实测 µs", "模型 µs", "模型/实测", "algbw GB/s", "busbw GB/s"], rows))
        print(f"拟合（ring）：α = {fit.alpha * 1e6:.2f} µs/步，β = 1/({1 / fit.beta / 1e9:.0f} GB/s)，"
              f"最大相对误差 {fit.max_rel_err:.0%}\n")
    return fits


def compare(meta, data, fits):
    p = meta["world"]
    rows = []
    for c in COLLECTIVES:
        n, t = data[c]
        big = cs.busbw(c, n[-1], t[-1], p)
        nccl_ll = cs.nccl_ring_latency(p, "LL", c)
        nccl_simple = cs.nccl_ring_latency(p, "Simple", c)
        steps = cs.cost_terms(c, 1.0, p, "ring").steps
        rows.append([c, f"{fits[c].intercept * 1e6:.1f}", f"{nccl_ll * 1e6:.1f} / {nccl_simple * 1e6:.1f}",
                     f"{fits[c].alpha * 1e6:.1f}", f"{big / 1e9:.0f}", f"{big / NVLINK4_LINE_RATE:.0%}",
                     f"{steps:g}"])
    print("== 和 NCCL 的延迟常数、NVLink 线速比")
    print(format_table(["集合通信", "拟合的固定延迟 µs", "NCCL 模型 LL / Simple µs", "α µs/步",
                        "1 GiB busbw GB/s", "占 450 GB/s", "步数"], rows))
    print("  NCCL 的常数是它选协议用的估计（[S71]，ring：baseLat + 步数 × NVLink hopLat），不是保证；"
          "实测的固定延迟还包括 PyTorch 发起一次调用的主机开销。\n"
          f"  NVLink 4 单向线速 450 GB/s，维护者说扣掉协议开销后 ≈ {NVLINK4_EFFECTIVE / 1e9:.0f} GB/s [S40]。")

    print("\n== 外推：用 P = 2 拟合的 α、β 算 P = 4 / 8（ring 模型，假设每块 GPU 的 NVLink 带宽不变——NVSwitch 机器上"
          "如此；**这是模型，没有在 4 / 8 卡上测过**）")
    rows = []
    for c in COLLECTIVES:
        f = fits[c]
        for q in (2, 4, 8):
            for n_bytes in (2 ** 20, 2 ** 30):
                tq = cs.cost_terms(c, n_bytes, q, "ring").time(f.alpha, f.beta)
                rows.append([c, q, fmt_bytes(n_bytes), f"{tq * 1e6:.1f}", f"{cs.busbw(c, n_bytes, tq, q) / 1e9:.0f}",
                             "测量拟合" if q == p else "模型外推"])
    print(format_table(["集合通信", "P", "消息", "时间 µs", "busbw GB/s", "来源"], rows))
    print("  ring 模型里大消息的 busbw 和 P 无关（每条链路都满载），小消息的时间随 P 线性变长（步数 2(P−1)）——"
          "这就是 NCCL 在多卡小消息时改用 tree / NVLS 的原因。")


def plot(meta, data, fits, quick, replot=False):
    """图默认存进 prereq5/bench/figures/（--quick：figures/quick/）；只有 replot 才重画已提交的
    results/nccl_measure.png。"""
    plt = pyplot()
    p = meta["world"]
    fig, ax = plt.subplots(figsize=(10, 5.6))
    fine = np.geomspace(SIZES[0], SIZES[-1], 200)
    for c, marker in zip(COLLECTIVES, "os^"):
        n, t = data[c]
        line, = ax.semilogx(n, cs.busbw(c, n, t, p) / 1e9, marker, ms=7, label=f"{c} measured")
        model = cs.cost_terms(c, fine, p, "ring").time(fits[c].alpha, fits[c].beta)
        ax.semilogx(fine, cs.busbw(c, fine, model, p) / 1e9, "-", color=line.get_color(),
                    label=f"{c} alpha-beta fit (alpha={fits[c].alpha * 1e6:.1f} µs/step)")
    ax.axhline(NVLINK4_LINE_RATE / 1e9, color="gray", ls="--")
    ax.text(SIZES[0], NVLINK4_LINE_RATE / 1e9 * 1.02, "NVLink 4 line rate 450 GB/s (per direction)")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth busbw (GB/s)")
    ax.set_title(f"NCCL on {p}x {meta['gpu']}: small messages pay latency, large ones reach the link")
    ax.set_ylim(0, NVLINK4_LINE_RATE / 1e9 * 1.15)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)   # 图下方：不压数据
    ax.grid(True, alpha=0.3)
    path = save_figure(fig, __file__, "busbw", quick=quick,
                       path=committed_figure(__file__, "nccl_measure.png", replot))
    print(f"\n图已保存：{path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--measure", action="store_true", help="在 GPU 上测量并写结果（用 torchrun 启动）")
    ap.add_argument("--results", default=RESULTS, help="结果 JSON 的路径（读或写）")
    ap.add_argument("--quick", action="store_true", help="同完整版：只读已提交的结果（check-all 用）")
    ap.add_argument("--replot", action="store_true", help="图写进 results/nccl_measure.png（重测之后用）")
    args = ap.parse_args()
    if args.measure:
        return measure(args.results)
    t0 = time.perf_counter()
    loaded = load(args.results)
    if loaded is None:
        print(f"SKIP: 没有实测结果 {args.results}；在 ≥ 2 块 GPU 的机器上用 torchrun 加 --measure 生成")
        sys.exit(SKIP)
    meta, data = loaded
    fits = report(meta, data)
    compare(meta, data, fits)
    plot(meta, data, fits, args.quick, args.replot)
    # 结论：大消息达到 NVLink 带宽的可观比例；α-β 直线在 4 个数量级上大体贴合
    n, t = data["allreduce"]
    big = cs.busbw("allreduce", n[-1], t[-1], meta["world"])
    assert big > 0.3 * NVLINK4_LINE_RATE, "1 GiB all-reduce 的 busbw 应达到 NVLink 线速的可观比例"
    print(f"（分析用时 {time.perf_counter() - t0:.1f} s）")


if __name__ == "__main__":
    main()
