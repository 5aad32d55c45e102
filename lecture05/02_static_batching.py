"""
第 5 讲 · 演示 2：静态批处理——批越大吞吐越高、每个 token 越慢，直到撞上 KV cache 的墙

你会看到：
  1. 离线负载（所有请求 t = 0 到达）下扫 max_batch：吞吐（输出 token/s）和 TPOT、端到端延迟一起涨——
     吞吐与延迟的交换；
  2. KV 的墙：批大小被"显存里放得下几个序列的 KV"截断，再调大 max_batch 也没用；
     FasterTransformer 按最大长度 2048 给每个请求预留 KV，GPT-3 13B 在 A100 40GB 上只能放 7 个
     （Orca 论文：批到 8 就 OOM）；
  3. 补齐和陪跑的浪费：输入补齐到批里最长的，输出跑到批里最长的——长度参差不齐时有效计算只占一部分。
  图：figures/02_static_batching_tradeoff.png

运行：python3 lecture05/02_static_batching.py [--quick] [--seed 0]
"""
import argparse
import os
import sys


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serving_sim as ss  # noqa: E402
from course_utils import pyplot  # noqa: E402

plt = pyplot()
from hw_specs import H100_SXM  # noqa: E402
from course_utils import format_table, save_figure  # noqa: E402


def part_orca(seed, quick):
    step = ss.StepModel(ss.GPT3_13B, ss.A100_40G)
    cap = step.kv_capacity_tokens()
    print(f"=== 1. {step.model.name} @ {step.chip.name}（Orca 的实验设置），输入 ~ U(32, 512)、输出 ~ U(1, 128) ===")
    print(f"  KV 容量 {cap} 个 token（可用显存 {ss.GPU_MEM_UTIL:.0%} − 权重 {step.weight_bytes_per_chip / 1e9:.1f} GB，"
          f"每 token {step.kv_bytes_per_token / 1e6:.2f} MB）")
    n, spec = (96 if quick else 384), dict(prompt=("uniform", 32, 512), output=("uniform", 1, 128), seed=seed)
    Bs = [1, 2, 4, 8, 16, 32, 64]
    need = ss.offline_sweep(step, Bs, n, **spec)
    ft = ss.offline_sweep(step, Bs, n, kv_reserve=2048, **spec)
    table = [[a["max_batch"], a["largest_batch"], f"{a['tok_per_s']:.0f}", f"{a['tpot_p50'] * 1e3:.1f}",
              f"{a['e2e_mean']:.2f}", f"{a['useful_frac']:.0%}", f["largest_batch"], f"{f['tok_per_s']:.0f}"]
             for a, f in zip(need, ft)]
    print(format_table(["max_batch", "实际批（按需）", "输出 token/s", "TPOT p50 ms", "平均端到端 s", "有效计算占比",
                           "实际批（FT 预留 2048）", "输出 token/s（FT）"], table))
    ft_limit = cap // 2048
    ftc = ss.ft_batch_cap(step.model, step.chip)          # 同一个上限由写明的假设推出（权重、KV、FT 工作区）
    assert ft_limit == ftc["cap"] == 7 < 8
    assert all(f["largest_batch"] == min(f["max_batch"], ft_limit) for f in ft), \
        "FT 式预留：批大小 = min(max_batch, 容量 // 2048)"
    assert all(a["largest_batch"] >= f["largest_batch"] for a, f in zip(need, ft))
    assert max(a["tok_per_s"] for a in need) > max(f["tok_per_s"] for f in ft), "按需分配 KV 能放更大的批，吞吐更高"
    # KV 的墙：一批最多 cap // 最短可能的 (L_max + O_max − 1)；max_batch 再大，实际批也超不过容量
    worst = cap // (512 + 128 - 1)                      # 最长输入 + 最长输出时一批能放几个
    assert all(a["largest_batch"] >= min(a["max_batch"], worst) for a in need)
    assert need[-1]["largest_batch"] < need[-1]["max_batch"]
    assert all(a["useful_frac"] < 1 for a in need[1:]), "长度参差不齐：补齐 + 陪跑一定有浪费"
    print(f"  FT 式预留：每个请求 2048 个 token → 最多 {ft_limit} 个（可用 = 90% × 可分配 "
          f"{step.chip.alloc_bytes / 1e9:.1f} GB，推出的）；按 FT 自己的账（可分配 − 1 GB 运行时 − 权重，"
          f"每序列 KV {ftc['kv_per_seq'] / 1e9:.2f} GB + 工作区 {ftc['work_per_seq'] / 1e9:.2f} GB）"
          f"也是 {ftc['cap']} 个"
          "（Orca 论文：FT 的 13B 批 ≥ 8 就显存不够 [S56]；原课程第 6 讲模块按 90% × 40 GB 得 6）；")
    print("  按需分配能放更多，但静态批处理仍要补齐输入、陪最长的输出跑完，'有效计算占比'一列就是浪费的反面。")
    return need


def part_llama(seed, quick):
    step = ss.StepModel(ss.LLAMA31_8B, H100_SXM)
    P, O = 1024, 256
    wall = step.kv_capacity_tokens() // (P + O - 1)
    print(f"\n=== 2. {step.model.name} @ {step.chip.name}，固定输入 {P}、输出 {O}：KV 的墙在批 {wall} ===")
    Bs = [1, 8, 64, 256, 1024] if quick else [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    rows = ss.offline_sweep(step, Bs, 1024 if quick else 2048, ("fixed", P), ("fixed", O), seed=seed)
    print(format_table(["max_batch", "实际批", "输出 token/s", "TPOT p50 ms", "平均端到端 s", "有效计算占比"],
                          [[r["max_batch"], r["largest_batch"], f"{r['tok_per_s']:,.0f}", f"{r['tpot_p50'] * 1e3:.1f}",
                            f"{r['e2e_mean']:.1f}", f"{r['useful_frac']:.0%}"] for r in rows]))
    assert all(r["useful_frac"] == 1.0 for r in rows), "长度全相同时没有补齐和陪跑的浪费"
    assert all(r["largest_batch"] == min(r["max_batch"], wall) for r in rows)
    tpots = [r["tpot_p50"] for r in rows]
    assert all(b >= a for a, b in zip(tpots, tpots[1:])), "批越大，每一步越久（TPOT 不减）"
    below = [r for r in rows if r["max_batch"] <= wall]
    assert all(b["tok_per_s"] > a["tok_per_s"] for a, b in zip(below, below[1:])), "撞墙之前，批越大吞吐越高"
    above = [r for r in rows if r["max_batch"] >= wall]
    assert len({round(r["tok_per_s"], 6) for r in above}) <= 1, "撞墙之后，max_batch 再大也是同样的批"
    print(f"  批 > {wall} 之后实际批被 KV 截断，吞吐不再变化；批变大时 TPOT 变长——吞吐是拿每个用户的延迟换来的。")
    return rows, wall


def plot(orca, llama, wall, quick=False):
    fig, ax = plt.subplots(1, 2, figsize=(15, 6))
    for rows, name in ((orca, "GPT-3 13B / A100-40GB, U(32,512)/U(1,128)"), (llama, "Llama-3.1-8B / H100, 1024/256")):
        x = [r["tpot_p50"] * 1e3 for r in rows]
        y = [r["tok_per_s"] for r in rows]
        ax[0].plot(x, y, "o-", label=name)
        seen = set()
        for r, xi, yi in zip(rows, x, y):
            if (round(xi, 3), round(yi, 1)) in seen:        # 撞墙后的点重合：只标第一个
                continue
            seen.add((round(xi, 3), round(yi, 1)))
            ax[0].annotate(str(r["max_batch"]), (xi, yi), xytext=(7, 0), textcoords="offset points", va="center")
    ax[0].set_xlabel("median TPOT (ms)")
    ax[0].set_ylabel("throughput (output tokens/s)")
    ax[0].set_yscale("log")
    ax[0].set_title("throughput vs latency (labels: max_batch)")
    ax[0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.14))      # 图下：不挡 13B 的 1、2 两点
    Bs = [r["max_batch"] for r in llama]
    ax[1].loglog(Bs, [r["tok_per_s"] for r in llama], "o-", label="throughput")
    ax[1].loglog(Bs, [r["largest_batch"] for r in llama], "s--", label="actual batch")
    ax[1].axvline(wall, color="red", lw=1, ls=":", label=f"KV wall ({wall})")
    ax[1].set_xlabel("max_batch")
    ax[1].set_ylabel("tokens/s (circles)  or  sequences (squares)")
    ax[1].set_title("Llama-3.1-8B / H100: the KV-capacity wall")
    ax[1].legend(loc="upper left")
    for a in ax:
        a.grid(alpha=0.3)
    path = save_figure(fig, __file__, "tradeoff", quick=quick)
    print(f"\n图：{path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--quick", action="store_true", help="少一些请求和批大小（check-all 用）")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"seed = {args.seed}；静态批处理：一批跑完才接下一批（FasterTransformer 式）\n")
    orca = part_orca(args.seed, args.quick)
    llama, wall = part_llama(args.seed, args.quick)
    plot(orca, llama, wall, quick=args.quick)


if __name__ == "__main__":
    main()
