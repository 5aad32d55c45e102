"""
第 19 讲 · 演示 06：在几块真的 GPU 上跑环形注意力（NCCL）——结果和单卡一样吗？通信能藏在计算后面多少？

你会看到……
  1. 已提交的实测（lecture19/results/ring_multi_gpu.json：2×H200、NCCL，一个进程一块 GPU；文件里记着日期、
     GPU、驱动、torch / NCCL 版本和 `nvidia-smi topo -m`）。
  2. 正确性：long_lab.ring_attention_dist 在 P 块 GPU 上（contiguous / striped，causal / 非 causal，bf16）
     拼出的输出，和整条序列的 float64 注意力比；判据是 flash-attn 的规则：误差 ≤ 2 × PyTorch 自己 bf16 SDPA 的误差。
  3. 每块 GPU 4k … 64k token（16 头，d = 128，bf16，causal，striped 布局）：每轮只算的时间、只传的时间、
     两者重叠后的真实一轮时间、通信被藏住的比例、tokens/s。每块用 PyTorch 的 FlashAttention-2 内核
     （aten._scaled_dot_product_flash_attention，它返回每行的 logsumexp），状态按第 18 讲的 (m, ℓ, o) 合并。
  4. 模型：一轮计算 = 这一轮的 FLOPs / 实测的单块吞吐；一轮通信 = α + 字节 × β（prereq5/06 的 NCCL 拟合）；
     重叠后 = max(计算, 通信)。P = 4 / 8 用同一个模型外推（**是模型，没有在 4 / 8 卡上测过**）。
  5. 图：lecture19/figures/06_ring_multi_gpu_overlap.png

在 P 块 GPU 上重新测（写 lecture19/results/ring_multi_gpu.json，约 2 分钟）：
    torchrun --nproc_per_node=2 lecture19/06_ring_multi_gpu.py --measure
只读结果、画图（没有 GPU 也行；check-all 跑的就是这个）：
    python3 lecture19/06_ring_multi_gpu.py [--quick]
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))
sys.path.insert(0, os.path.join(HERE, "..", "prereq5"))

SKIP = 77
RESULTS = os.path.join(HERE, "results", "ring_multi_gpu.json")
NCCL_RESULTS = os.path.join(HERE, "..", "prereq5", "results", "nccl_measure.json")
HEADS, D = 16, 128
LOCAL_LENS = (4096, 8192, 16384, 32768, 65536)      # 每块 GPU 上的 token 数
CHECK_LENS = (1024, 4096)                            # 正确性检查用的每块长度（float64 参考放得下）


# =============================================================================
# 一块注意力：FlashAttention-2 内核 + 它返回的 logsumexp → (m, ℓ, o) 状态
# =============================================================================
def flash_block(q, k, v, qpos, kpos, causal, scale):
    """
    ring_attention_dist 的 block 钩子（GPU）：q [B, H, n, d]，k、v [B, H, m, d]（bf16），qpos / kpos 是 CPU 上的
    全局位置。返回 ((m, ℓ, o) 或 None, 算了多少对)。

    一个已归一化的块输出 O 和它的 lse 就是一个合法的状态：m = lse、ℓ = 1、o = O（合并时 exp(m − m') 的换算一样成立）。
    因果掩码只会出现三种块：整块可见（键都在查询之前）、整块在未来（跳过）、和自己那段（对角块，is_causal）；
    striped 布局里"上一块设备"的那段是错开一位的对角块：第 i 个查询看得见第 j < i 个键——去掉第 0 个查询和
    最后一个键，就又是普通的对角块，第 0 行什么也看不见（状态 (−∞, 0, 0)）。
    """
    import torch
    n, m = q.shape[-2], k.shape[-2]
    mode = _block_mode(qpos, kpos, causal)
    if mode == "skip":
        return None, 0
    if mode == "shifted":
        (m1, l1, o1), _ = _flash_state(q[..., 1:, :], k[..., :-1, :], v[..., :-1, :], True, scale)
        pad_m = torch.full_like(m1[..., :1], float("-inf"))
        state = (torch.cat([pad_m, m1], -1), torch.cat([torch.zeros_like(l1[..., :1]), l1], -1),
                 torch.cat([torch.zeros_like(o1[..., :1, :]), o1], -2))
        return state, (n - 1) * n // 2
    state, _ = _flash_state(q, k, v, mode == "diag", scale)
    return state, (n * (n + 1) // 2 if mode == "diag" else n * m)


def _flash_state(q, k, v, is_causal, scale):
    import torch
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, False, scale=scale)[:2]
    return (lse, torch.ones_like(lse), out.float()), None       # lse: [B, H, n] float32


def _block_mode(qpos, kpos, causal):
    """块的种类（只看 CPU 上的位置，不碰 GPU）：full / skip / diag / shifted；别的形状这个钩子不处理。"""
    if not causal or int(kpos.max()) <= int(qpos.min()):
        return "full"
    if int(kpos.min()) > int(qpos.max()):
        return "skip"
    delta = kpos - qpos                                   # 同一段：0；striped 的别的段：一个常数，|delta| < 步长
    stride = int(qpos[1] - qpos[0]) if qpos.numel() > 1 else 1
    even = bool((qpos.diff() == stride).all()) and bool((kpos.diff() == stride).all())
    if even and bool(((delta <= 0) & (delta > -stride)).all()):
        return "diag"                                     # 键 j 可见 ⟺ j ≤ i
    if even and bool(((delta > 0) & (delta < stride)).all()):
        return "shifted"                                  # 键 j 可见 ⟺ j < i
    raise ValueError("flash_block 只处理 contiguous / striped 布局产生的块")


# =============================================================================
# 测量（torchrun，一个进程一块 GPU）
# =============================================================================
def _cuda_time(fn, reps):
    """course_utils.cuda_time：预热一次，7 组、每组连着 reps 次取平均，取最快的一组（秒）。"""
    from course_utils import cuda_time
    return cuda_time(fn, reps, trials=7)


def _paired_gap(fa, fb, pairs):
    """
    交替各跑一次 fa、fb（奇数对先 fb），共 pairs 对；返回每对 t(fb) − t(fa) 的中位数（秒）。
    为什么成对：GPU 的频率、温度、别的进程造成的慢漂移对一对里的两次几乎一样，差值里抵消——
    要量的"被藏住的通信"只有整个环的 1–5%，分开测两个平均值再相减，漂移就比它还大。
    """
    import torch
    gaps = []
    for i in range(pairs):
        t = {}
        for name, f in ((("a", fa), ("b", fb)) if i % 2 == 0 else (("b", fb), ("a", fa))):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            f()
            e1.record()
            e1.synchronize()
            t[name] = e0.elapsed_time(e1) / 1e3
        gaps.append(t["b"] - t["a"])
    return float(np.median(gaps))


def _max_over_ranks(x, device):
    import torch
    import torch.distributed as dist
    t = torch.tensor([x], device=device, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0])


def _check_correctness(ll, rank, world, device, seed):
    """每个 rank 按同一种子造出整条序列，拿自己那段跑环；rank 0 收齐后和 float64 参考比。"""
    import torch
    import torch.distributed as dist
    rows = []
    for n in CHECK_LENS:
        N = n * world
        g = torch.Generator(device=device).manual_seed(seed + n)
        Q, K, V = (torch.randn(1, HEADS, N, D, generator=g, device=device, dtype=torch.bfloat16) for _ in range(3))
        for layout in ll.LAYOUTS:
            for causal in (False, True):
                idx = ll.shard_index(N, world, layout)
                mine = idx[rank].to(device)
                o = ll.ring_attention_dist(Q[..., mine, :], K[..., mine, :], V[..., mine, :], causal, layout,
                                           block=flash_block)
                o = o.to(torch.bfloat16).contiguous()
                parts = [torch.empty_like(o) for _ in range(world)]
                dist.all_gather(parts, o)
                if rank == 0:
                    O = torch.empty_like(Q)
                    for r in range(world):
                        O[..., idx[r].to(device), :] = parts[r]
                    ref = _attention_fp64(Q, K, V, causal)
                    sdpa = torch.nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=causal)
                    err = float((O.double() - ref).abs().max())
                    base = float((sdpa.double() - ref).abs().max())
                    rows.append({"n_local": n, "N": N, "layout": layout, "causal": causal, "ring_err": err,
                                 "sdpa_err": base, "ok": err <= 2 * base + 1e-5})
    return rows


def _attention_fp64(Q, K, V, causal):
    """float64 参考，按头分块（整张 N×N 的 float64 分数 16 个头一起放不下）。"""
    import torch
    out = torch.empty(Q.shape, dtype=torch.float64, device=Q.device)
    for h in range(Q.shape[1]):
        q, k, v = (t[:, h].double() for t in (Q, K, V))
        out[:, h] = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return out


def _timing(ll, rank, world, device, n, seed):
    """每块 n 个 token：重叠的环、只算、只传的时间（各进程里最慢的）。"""
    import torch
    import torch.distributed as dist
    g = torch.Generator(device=device).manual_seed(seed + rank)
    q, k, v = (torch.randn(1, HEADS, n, D, generator=g, device=device, dtype=torch.bfloat16) for _ in range(3))
    idx = ll.shard_index(n * world, world, "striped")
    reps = 5 if n >= 32768 else 10
    ring = _cuda_time(lambda: ll.ring_attention_dist(q, k, v, True, "striped", block=flash_block), reps)
    serial = _cuda_time(lambda: ll.ring_attention_dist(q, k, v, True, "striped", block=flash_block,
                                                         overlap=False), reps)
    overlapped = lambda: ll.ring_attention_dist(q, k, v, True, "striped", block=flash_block)  # noqa: E731
    serial_fn = lambda: ll.ring_attention_dist(q, k, v, True, "striped", block=flash_block, overlap=False)  # noqa: E731
    gap = _paired_gap(overlapped, serial_fn, 21 if n >= 32768 else 41)
    scale = D ** -0.5

    def compute_only():                                   # 同样的 P 块计算，K/V 不动（只换"它来自谁"的位置）
        acc = None
        for rnd in range(world):
            st, _ = flash_block(q, k, v, idx[rank], idx[(rank - rnd) % world], True, scale)
            if st is not None:
                acc = st if acc is None else ll.merge_states(acc, st)
        return ll.finalize(acc)

    kv = torch.stack([k, v]).contiguous()
    buf = torch.empty_like(kv)

    def comm_only():                                      # P − 1 次 K/V 交换，没有计算
        for _ in range(world - 1):
            ops = [dist.P2POp(dist.isend, kv, (rank + 1) % world), dist.P2POp(dist.irecv, buf, (rank - 1) % world)]
            for r in dist.batch_isend_irecv(ops):
                r.wait()

    comp = _cuda_time(compute_only, reps)
    comm = _cuda_time(comm_only, reps)
    flops_full = 4.0 * n * n * D * HEADS                 # 一块不掩码的 n×n：QKᵀ 和 PV 各 2·n·n·d，每个头
    full_block = _cuda_time(lambda: _flash_state(q, k, v, False, scale), reps)
    return {"n_local": n, "world": world, "ring_s": _max_over_ranks(ring, device),
            "serial_s": _max_over_ranks(serial, device),
            "serial_minus_ring_paired_s": -_max_over_ranks(-gap, device),     # 各进程里最小的（最保守）
            "compute_s": _max_over_ranks(comp, device), "comm_s": _max_over_ranks(comm, device),
            "kv_bytes_per_round": kv.numel() * kv.element_size(),
            "full_block_tflops": flops_full / _max_over_ranks(full_block, device) / 1e12}


def measure(out_path, seed):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import torch
    if not torch.cuda.is_available():
        print("SKIP: --measure 需要 CUDA GPU（每个进程一块），用 torchrun --nproc_per_node=P 启动")
        sys.exit(SKIP)
    import comm_sim as cs
    import long_lab as ll
    rank, world, device = ll.init_distributed()
    import torch.distributed as dist
    checks = _check_correctness(ll, rank, world, device, seed)
    times = []
    for n in LOCAL_LENS:
        times.append(_timing(ll, rank, world, device, n, seed))
        if rank == 0:
            print(f"n = {n}: {times[-1]}", flush=True)
    if rank == 0:
        res = {"meta": {**cs.nccl_environment(torch), "heads": HEADS, "d": D, "dtype": "bfloat16", "world": world,
                        "seed": seed, "layout_timed": "striped", "causal_timed": True,
                        "timing": "CUDA events, warm-up then fastest of 7 groups of reps; max over ranks"},
               "checks": checks, "times": times}
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)
        print(f"结果写入 {out_path}；正确性 {sum(c['ok'] for c in checks)}/{len(checks)}")
    dist.destroy_process_group()


# =============================================================================
# 分析（不需要 GPU）
# =============================================================================
def p2p_model():
    """一次 K/V 交换的 α-β 模型：P = 2 时 all-gather 的 ring 一步正是"发 X 字节、收 X 字节"，借它的拟合。"""
    import comm_sim as cs
    if not os.path.exists(NCCL_RESULTS):
        return None
    with open(NCCL_RESULTS) as f:
        rows = [r for r in json.load(f)["rows"] if r["collective"] == "allgather"]
    n = np.array([r["bytes"] for r in rows], dtype=np.float64)
    t = np.array([r["seconds"] for r in rows])
    fit = cs.fit_alpha_beta(n, t, p=2, collective="allgather", algo="ring")
    return fit.alpha, fit.beta


def report(res):
    from course_utils import fmt_time, format_table
    meta = res["meta"]
    print(f"实测：{meta['gpu']} × {meta['world']}，驱动 {meta.get('driver')}，torch {meta['torch']}，"
          f"NCCL {meta['nccl']}，{meta['date']}；{meta['heads']} 头，d = {meta['d']}，{meta['dtype']}")
    print("拓扑（nvidia-smi topo -m）：\n  " + meta.get("topology", "?").replace("\n", "\n  "))
    rows = [[c["n_local"], c["N"], c["layout"], "是" if c["causal"] else "否", f"{c['ring_err']:.2e}",
             f"{c['sdpa_err']:.2e}", "✓" if c["ok"] else "✗"] for c in res["checks"]]
    print("\n== 正确性：环形注意力 vs 整条序列的 float64 注意力（判据：≤ 2 × bf16 SDPA 自己的误差）")
    print(format_table(["每块 n", "全长 N", "布局", "因果", "环的最大误差", "SDPA 的最大误差", "通过"], rows))
    assert all(c["ok"] for c in res["checks"]), "环形注意力必须和单卡注意力一样（在 bf16 的误差内）"

    model = p2p_model()
    rows, out = [], []
    for t in res["times"]:
        P, n = t["world"], t["n_local"]
        exposed = max(0.0, t["ring_s"] - t["compute_s"])          # 重叠的环比"只算"多出来的时间
        # 被藏住的通信 = 不重叠的环 − 重叠的环：两者走同一段代码（拼 K/V、分配缓冲、合并状态），固定开销相互抵消
        gap = t.get("serial_minus_ring_paired_s", t["serial_s"] - t["ring_s"])   # 成对测的差（见 _paired_gap）
        hidden = min(1.0, max(0.0, gap / t["comm_s"]))
        m_comp = _causal_striped_flops(n, P) / P / P / (t["full_block_tflops"] * 1e12)   # 每块 GPU、每一轮
        m_comm = model[0] + t["kv_bytes_per_round"] * model[1] if model else float("nan")
        m_ring = P * m_comp + (P - 1) * max(0.0, m_comm - m_comp)
        out.append((n, hidden, t["ring_s"], m_ring, exposed / t["ring_s"]))
        rows.append([f"{n // 1024}k", fmt_time(t["compute_s"] / P), fmt_time(m_comp), fmt_time(t["comm_s"] / (P - 1)),
                     fmt_time(m_comm), fmt_time(t["serial_s"]), fmt_time(t["ring_s"]), fmt_time(m_ring),
                     f"{hidden:.0%}", f"{exposed / t['ring_s']:.1%}", f"{P * n / t['ring_s'] / 1e6:.2f}"])
    print(f"\n== 每块 GPU n 个 token，P = {res['meta']['world']}，causal + striped（每轮的实测 / 模型；整个环）")
    print(format_table(["每块 n", "一轮计算", "模型", "一轮通信", "模型(α-β)", "不重叠的环", "重叠的环", "模型",
                        "通信被藏住", "露在外面/总时间", "M tokens/s"], rows))
    print("  通信被藏住 = (不重叠的环 − 重叠的环，两者交替成对地测、取差的中位数) / 只传；\n"
          "  露在外面 = 重叠的环 − 只算（同样几块、不传、也不拼 K/V），\n"
          "  所以它还含着环自己的固定开销（拼 K/V、分配接收缓冲），是通信代价的上界。\n"
          "  模型：一轮计算 = 这一轮的 FLOPs / 单块实测吞吐，"
          "一轮通信 = α + K/V 字节 × β（prereq5/06 的 NCCL 拟合），重叠后每轮取两者的大者。\n"
          "  两种读法不一致（见 lecture19/results/NOTES.md）：按\"露在外面\"，每块 ≥ 16k 时重叠的环只比只算多 1–3%，\n"
          "  通信像是几乎全藏住了；按成对测的\"不重叠 − 重叠\"，只藏住了 10–45%。两者的差别来自单次调用与连续调用\n"
          "  的计时方式，还没查清；可靠的结论只是\"不论藏没藏住，通信都只占总时间的几个百分点\"。")
    return out


def _causal_striped_flops(n, P):
    """causal 整条序列（N = nP）的注意力 FLOPs：N(N+1)/2 个可见的 (查询, 键) 对，每对每头 4d（QKᵀ 和 PV 各 2d）。"""
    N = n * P
    return 4.0 * D * HEADS * N * (N + 1) / 2


def plot(out, quick, world):
    sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))
    from course_utils import save_figure
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = [o[0] for o in out]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5.4))
    a1.semilogx(n, [100 * o[1] for o in out], "o-", lw=2, base=2, label="comm hidden (paired serial - overlapped)")
    a1.semilogx(n, [100 * o[4] for o in out], "s--", lw=2, base=2, label="ring minus compute-only, share of ring time")
    a1.axhline(80, color="gray", ls=":")
    a1.text(n[0], 82, "target: 80% hidden", fontsize=12)
    a1.set_xlabel("tokens per GPU", fontsize=13)
    a1.set_ylabel("percent", fontsize=13)
    a1.legend(fontsize=12, loc="upper center", bbox_to_anchor=(0.5, -0.16))   # 图下方：不压数据
    a1.set_ylim(0, 105)
    a1.set_title(f"Ring attention on {world} GPUs (causal, striped)", fontsize=13)
    a2.loglog(n, [o[2] * 1e3 for o in out], "o", ms=8, label="measured")
    a2.loglog(n, [o[3] * 1e3 for o in out], "-", lw=2, label="model: max(compute, alpha-beta comm) per round")
    a2.set_xscale("log", base=2)
    a2.set_xlabel("tokens per GPU", fontsize=13)
    a2.set_ylabel("time of the whole ring (ms)", fontsize=13)
    a2.legend(fontsize=12, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    for a in (a1, a2):
        a.tick_params(labelsize=12)
        a.grid(True, alpha=0.3)
    print(f"\n图已保存：{save_figure(fig, __file__, 'overlap', quick=quick)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--measure", action="store_true", help="在 GPU 上测量并写结果（torchrun 启动）")
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="同完整版：只读已提交的结果")
    args = ap.parse_args()
    print(f"随机种子 seed = {args.seed}")
    if args.measure:
        return measure(args.results, args.seed)
    if not os.path.exists(args.results):
        print(f"SKIP: 没有实测结果 {args.results}；在多块 GPU 的机器上用 torchrun 加 --measure 生成")
        sys.exit(SKIP)
    with open(args.results) as f:
        res = json.load(f)
    out = report(res)
    plot(out, args.quick, res["meta"]["world"])


if __name__ == "__main__":
    main()
