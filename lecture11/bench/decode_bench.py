"""
工作台 decode_bench · flash-decoding 上 GPU：split-KV 内核读 K/V 能到拷贝带宽的几成？第 4 节的时间模型离真机多远？

你会看到（数字来自已提交的 lecture11/bench/results/decode_bench.json，H200、bf16；没有 GPU 也能看）
  1. 一次 decode 注意力（每个序列 1 个新 token）：B ∈ {1, 8, 64} × S ∈ {1k, 8k, 32k, 128k}，Hq / Hk = 32 / 8，
     d = 128。三种实现：我们的 flash_decode.flash_decode（v3，split-KV + GQA 打包）、SDPA（enable_gqa=True）、
     我们的 flash_attn_func 的单 query 路径（FlashAttention-2 的并行方式：每个 (序列, query 头) 一个程序）。
     时间是 CUDA 图里重放的 GPU 时间；带宽 = K/V 字节数 / 时间，和同一次运行里实测的拷贝带宽比。
  2. 正确性：每个实现的输出和 SDPA 的相对差（上限 DECODE_TOL，由来见它的注释），草稿区压力测试里不逐位相同的
     次数（要是 0）。不过关时逐条列出，退出码 1。
  3. 目标：速度目标（长序列的带宽、对 SDPA 的倍数）和主机开销、CUDA 图逐位一致，逐条 ✓ / ✗。
  4. 主机开销（B = 1）：小形状上连续调用的每次墙钟时间 − GPU 时间（µs），CUDA 图能否捕获、结果是否逐位一致；
     主机时间拆成几块；主机发一个空内核要多久。
  5. 校准第 4 节的 decode_attention_time：用假设的 sm_bw_cap、launch 预测的时间 vs 实测，拟合这两个参数，
     拟合前后每个点的误差（见 flash_lab.H200_DEC_MEASURED 的文档）。
  6. 校准第 5 节的时间线模型：Llama-3.2-1B 批 1 的真实一步（lecture05/bench/results/step_measure.json）vs 模型；
     CUDA 图里的 launch = 实测的空内核间隙（一个空内核在 stream 里、在 CUDA 图里各占多少 µs），再拟合 small
     和 eager 时的 launch。
  7. 一次调用的时间都花在哪：B = 1、S = 32k 时每个程序在内核里读 %globaltimer（入口、放行、完成——第一步是
     读完 K/V，合并是写完），拆成读 K/V、最慢的程序、交接、合并、下一次放行几段（flash_decode._decode 的 stamps）。
  图：bench/figures/decode_bench_{bandwidth,models,timeline}.png（--quick：figures/quick/）；
     已提交的 results/ 里的图只在 --replot 时重画。

单位：时间 µs，带宽 TB/s（10^12 字节/秒），K/V 字节 = B·S·Hk·d·2（K 和 V）·2（bf16）。

在 GPU 上重新测（写 lecture11/bench/results/decode_bench.json，H200 上约 1 分钟：提交的那次 48 s），再重画已提交的图：
    python3 lecture11/bench/decode_bench.py --measure [--sweep] [--compare --out /tmp/db]
        --compare：测完打印每个点的 GPU 时间、主机开销和已提交的 decode_bench.json 的比
    python3 lecture11/bench/decode_bench.py --replot
只读结果、打印、画图（没有 GPU 也行；check-all 跑 --quick，make figures 跑不带参数的；都不动 results/ 里的图）：
    python3 lecture11/bench/decode_bench.py [--quick]
"""
import argparse
import dataclasses
import itertools
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))       # lecture11/bench
LESSON = os.path.dirname(HERE)                          # lecture11：课本身
sys.path.insert(0, LESSON)
sys.path.insert(0, os.path.join(LESSON, "..", "lecture01"))
sys.path.insert(0, os.path.join(LESSON, "..", "lecture01", "bench"))
from dataclasses import replace  # noqa: E402

import flash_lab as fl  # noqa: E402
from course_utils import committed_figure, format_table, load_json, pyplot, ratio_errors, save_figure  # noqa: E402
from gpu_timing import (capture_graph, cuda_time, gpu_meta, graph_matches_eager, wall_per_call,  # noqa: E402
                        wall_per_call_many)
from hw_specs import H200  # noqa: E402

SKIP = 77
RESULTS = os.path.join(HERE, "results", "decode_bench.json")
STEP_RESULTS = os.path.join(LESSON, "..", "lecture05", "bench", "results", "step_measure.json")   # 第 5 讲测的真实一步
HQ, HK, D = 32, 8, 128
BATCHES = (1, 8, 64)
SEQLENS = (1024, 8192, 32768, 131072)
IMPLS = ("ours", "sdpa", "fa2")
OVERHEAD_S = (1024, 8192)                        # 主机开销：B = 1 的小形状
SWEEP_SHAPES = ((1, 1024), (1, 8192), (1, 32768), (1, 131072), (8, 1024), (8, 8192), (8, 32768), (64, 1024),
                (64, 8192))
SWEEP_CONFIGS = [(128, 4, 3), (128, 4, 2), (64, 4, 2), (64, 4, 3), (64, 4, 4)]
SWEEP_SPLITS = (1, 2, 4, 8, 16, 32, 33)
SWEEP_SPLITS_B1 = (8, 16, 24, 32, 33, 48, 66)      # B = 1：8 个 (序列, 头)，段数决定能不能铺满 132 个 SM（2 个 / SM）
SWEEP_PDL = (False, "merge", True)                 # B = 1 时还扫 PDL：不用 / 只给合并内核 / 两个内核都用
STRESS_SHAPES = ((1, 32768, 32), (1, 4096, 64), (8, 8192, 16))    # 压力测试：(B, S, 段数)
STRESS_ORDER = (0, 0, 1, 0, 1, 1)    # 两组输入的调用顺序（循环）：A→A、A→B、B→A、B→B 四种前后关系都有
STRESS_CALLS = 500
PROBE_SHAPE = (1, 32768)          # 计时探针（第 7 部分）：B = 1、S = 32k，最难的那一点
PROBE_CALLS = 6                   # 一张图里连着几次调用（最后一次不算：它没有"下一次调用的放行"）
# 正确性的上限（第 2 部分）。JSON 里每个点记的是和 SDPA（同为 bf16）的相对差 ‖x − sdpa‖ / ‖sdpa‖。
# flash_decode.decode_limit（check_decode 和测试用的判据，flash-attn 的）要求：对 float64 参考的误差 < 2e，
# e = 同 dtype 的 SDPA 对 float64 参考的误差。三角不等式：满足它的实现和 SDPA 相差 < 2e + e = 3e。
# 测量时没有记 e（B = 64、S = 128k 的 K、V 换成 float64 要 137 GB，放不下）；bf16 输出的 e 主要是最后舍入到 bf16：
# 每个元素的相对误差 ≤ u = 2⁻⁸（bf16 的有效位是 8 个二进制位），GPU 自检里 bf16 SDPA 的 e 实测 ≤ 2.4e-3 < u
# （results/gpu_selftest_decode.log：上限 2e 最大 4.8e-3）。所以上限取 3u ≈ 1.2e-2。真出错时差得远比这大：
# 随机输入下漏掉（或重复）32 段里的 1 段，输出约变 √(1/32) ≈ 18%。
DECODE_TOL = 3 * 2.0 ** -8


def kv_bytes(B, S):
    """一次 decode 读的 K/V 字节：B·S·Hk·d 个元素 × 2（K 和 V）× 2 字节（bf16）。"""
    return 2 * B * S * HK * D * 2


# =============================================================================
# GPU 上的计时工具
# =============================================================================
def graph_time(torch, fn, target_s=2e-3, trials=5):
    """
    fn() 一次的 GPU 时间（秒）：把 reps 次调用录进一张 CUDA 图（gpu_timing.capture_graph），重放 trials 次取最快。
    图里没有主机开销，所以这是内核（含内核之间的空档）的时间。先录一次、重放量出单次的时间，
    再定 reps，让一次重放大约 target_s 秒。
    """
    one = replay_time(torch, capture_graph(fn, calls=1, warmup=3)[0], 1, trials=1)
    reps = max(3, min(200, int(target_s / max(one, 1e-6))))
    return replay_time(torch, capture_graph(fn, calls=reps, warmup=0)[0], reps, trials)


def replay_time(torch, graph, calls, trials=5):
    """一张装了 calls 次调用的 CUDA 图：预热重放一次，再重放 trials 次取最快一次的时间 / calls（秒）。"""
    return cuda_time(graph.replay, 1, trials=trials, warmup=1) / calls


def copy_bandwidth(torch, gib=2):
    """
    设备内拷贝 gib GiB，字节数按读 + 写算（2 × 大小，nvbandwidth / STREAM copy 的习惯）。两种拷法：
    memcpy（x.copy_(y)，cudaMemcpyAsync）和逐元素内核（torch.neg(x, out=y)，在 SM 上跑）；取快的那个当"拷贝带宽"。
    """
    n = gib << 30
    src = torch.randn(n // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ways = {"memcpy": lambda: dst.copy_(src), "kernel": lambda: torch.neg(src, out=dst)}
    res = {name: 2 * n / graph_time(torch, fn, target_s=20e-3) for name, fn in ways.items()}
    res["best"] = max(res.values())
    return res


def launch_gap(torch, n=500):
    """
    一个几乎什么都不做的内核（torch.cuda._sleep(0)）每个占 GPU 多少时间：
      stream：先放一个长的 _sleep 让 GPU 忙着，主机趁机把 n 个空内核排好队，再用事件量这 n 个 → GPU 端的启动间隙；
      graph：同样 n 个空内核捕获进 CUDA 图重放。
    另外记主机端发一个空内核要多久（连续发 n 个的墙钟时间 / n）。
    """
    sleep = torch.cuda._sleep
    res = {}
    for _ in range(3):
        sleep(0)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        sleep(200_000_000)                                   # 约 0.1 s：够主机把 n 个空内核排进队列
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            sleep(0)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / n)
    res["stream_s"] = best
    res["graph_s"] = replay_time(torch, capture_graph(lambda: sleep(0), calls=n, warmup=0)[0], n)
    res["host_launch_s"] = wall_per_call(lambda: sleep(0), 5 * n)
    return res


# =============================================================================
# 测量
# =============================================================================
def make_inputs(torch, B, S, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, HQ, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(B, S, HK, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(B, S, HK, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    lens = torch.full((B,), S, device="cuda", dtype=torch.int32)
    return q, k, v, lens


def impl_fns(torch, tf, q, k, v, lens):
    """三种实现，输出都是 [B, Hq, d]。SDPA 和 fa2 直接看整个缓存（L = S_max，缓存是满的）。tf = flash_decode。"""
    from triton_flash import flash_attn_func
    F = torch.nn.functional
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)                     # [B, Hk, S, d] 的视图，不拷贝
    q4 = q.unsqueeze(2)                                               # [B, Hq, 1, d]
    return {
        "ours": lambda: tf.flash_decode(q, k, v, lens),
        "sdpa": lambda: F.scaled_dot_product_attention(q4, kt, vt, enable_gqa=True).squeeze(2),
        "fa2": lambda: flash_attn_func(q.unsqueeze(1), k, v).squeeze(1),
    }


def measure_table(torch, tf, rounds=3):
    """
    每个形状上三种实现轮流测 rounds 轮（每轮都重新捕获 CUDA 图），每种实现取各轮中最快的一次：
    轮流测，是为了不让 GPU 的频率、温度在测某一个实现时恰好处在不同的状态。
    """
    rows = []
    for B in BATCHES:
        for S in SEQLENS:
            q, k, v, lens = make_inputs(torch, B, S)
            kv = kv_bytes(B, S)
            fns = impl_fns(torch, tf, q, k, v, lens)
            ref = fns["sdpa"]()
            times = {name: [] for name in fns}
            errs = {name: tf._rel_err(fn().double(), ref.double()) for name, fn in fns.items()}
            for _ in range(rounds):
                for name, fn in fns.items():
                    times[name].append(graph_time(torch, fn))
            for name, fn in fns.items():
                t = min(times[name])
                eager = wall_per_call(fn, 50)
                rows.append(dict(B=B, S=S, impl=name, gpu_s=t, gpu_rounds_s=times[name], eager_s=eager,
                                 kv_bytes=kv, err_vs_sdpa=errs[name],
                                 **(decode_choice(tf, B, S, q.device) if name == "ours" else {"splits": None})))
                print(f"  B={B:<3d}S={S:<7d}{name:<5s} GPU {t * 1e6:9.1f} µs（各轮 "
                      + "/".join(f"{x * 1e6:.1f}" for x in times[name]) + f"）  {kv / t / 1e12:5.2f} TB/s  "
                      f"连续调用 {eager * 1e6:9.1f} µs/次  和 SDPA 的相对差 {errs[name]:.1e}", flush=True)
            del q, k, v, lens, fns, ref
            torch.cuda.empty_cache()
    return rows


def decode_choice(tf, B, S, device):
    """flash_decode 在这个形状上选的配置和段数（flash_decode.decode_plan，和内核启动时同一条规则）。"""
    config, splits = tf.decode_plan(B, HK, S, tf._sm_count(device), rows=HQ // HK, d=D, dtype_bytes=2)   # bf16
    merge = None
    if splits > 1:                                 # 合并内核的 (BLOCK_S, D_CHUNK, warps)：和 _decode 里同一个函数
        merge = list(tf.decode_merge_config(B * HQ, D, splits, tf._sm_count(device)))
    return {"config": list(config), "splits": splits, "merge": merge}


def measure_overhead(torch, tf, calls=3000):
    """
    B = 1 的小形状：每次调用的墙钟时间（主机）− GPU 时间；CUDA 图捕获后换输入重放 = 直接调用（逐位）。
    墙钟时间用 wall_per_call_many：所有形状、实现轮流量 5 轮，各取最快的一轮（共用主机上的慢段不偏向哪一个）。
    """
    cases = {}                                          # (S, 实现) → (fn, 输入)
    for S in OVERHEAD_S:
        q, k, v, lens = make_inputs(torch, 1, S)
        fns = impl_fns(torch, tf, q, k, v, lens)
        out = torch.empty_like(q)
        fns["ours-out"] = lambda q=q, k=k, v=v, lens=lens, out=out: tf.flash_decode(q, k, v, lens, out=out)
        for name in ("ours", "ours-out", "sdpa"):
            cases[(S, name)] = (fns[name], (q, k, v))
    walls = wall_per_call_many({key: fn for key, (fn, _) in cases.items()}, calls)
    rows = []
    for (S, name), (fn, inputs) in cases.items():
        gpu, wall = graph_time(torch, fn), walls[(S, name)]
        rows.append(dict(S=S, impl=name, wall_s=wall, gpu_s=gpu, over_s=wall - gpu,
                         graph_ok=graph_matches_eager(fn, inputs)))
        print(f"  主机开销 S={S:<6d}{name:<5s} 每次调用 {wall * 1e6:6.1f} µs  GPU {gpu * 1e6:6.1f} µs  "
              f"多出 {(wall - gpu) * 1e6:6.1f} µs  CUDA 图逐位一致：{rows[-1]['graph_ok']}", flush=True)
    q, k, v, lens = make_inputs(torch, 1, 1024)
    out = torch.empty_like(q)
    parts = {"key": lambda: tf._decode_key(q, k, v, lens, None, None),   # 返回 (键, 地址)
             "empty_like": lambda: torch.empty_like(q),
             "flash_decode": lambda: tf.flash_decode(q, k, v, lens),
             "flash_decode(out=)": lambda: tf.flash_decode(q, k, v, lens, out=out)}
    host = wall_per_call_many(parts, calls)
    for name, t in host.items():
        print(f"  主机时间的一块：{name:<14s}{t * 1e6:6.2f} µs", flush=True)
    return dict(rows=rows, parts=host, plan_launches=tf._Plan.launches)


def merge_overhead(*passes):
    """
    几遍 measure_overhead → 一份：每点取墙钟时间最快的那一遍（连同那一遍的 GPU 时间），每块主机时间取最快的；
    CUDA 图的核对要每一遍都过；各遍的墙钟时间留在 passes_wall_s 里。几遍的点（S、实现）和主机时间的块必须一样。
    """
    if not passes:
        raise ValueError("merge_overhead：至少要一遍 measure_overhead 的结果")
    if len({len(p["rows"]) for p in passes}) != 1 or len({tuple(p["parts"]) for p in passes}) != 1:
        raise ValueError("merge_overhead：几遍的点数或主机时间的块不一样，不能逐点合并")
    rows = []
    for same in zip(*(p["rows"] for p in passes)):
        if len({(r["S"], r["impl"]) for r in same}) != 1:
            raise ValueError("merge_overhead：几遍的点（S、实现）顺序不同，不能逐点合并")
        best = min(same, key=lambda r: r["wall_s"])
        rows.append(dict(best, over_s=best["wall_s"] - best["gpu_s"], graph_ok=all(r["graph_ok"] for r in same),
                         passes_wall_s=[r["wall_s"] for r in same]))
    parts = {name: min(p["parts"][name] for p in passes) for name in passes[0]["parts"]}
    return dict(rows=rows, parts=parts, plan_launches=passes[-1]["plan_launches"], passes=len(passes))


def sweep(torch, tf):
    """调参：几个形状上，每个 (BLOCK_N, warps, stages) × 段数（B = 1 时再 × PDL）的 GPU 时间
    （直接调 tf._decode，绕开启发式）。"""
    rows = []
    for B, S in SWEEP_SHAPES:
        q, k, v, lens = make_inputs(torch, B, S)
        kv = kv_bytes(B, S)
        grid = itertools.product(SWEEP_CONFIGS, SWEEP_SPLITS_B1 if B == 1 else SWEEP_SPLITS,
                                 SWEEP_PDL if B == 1 else (None,))
        for cfg, splits, pdl in grid:
            if splits * cfg[0] > S:
                continue
            point = dict(B=B, S=S, config=cfg, splits=splits, pdl=tf.DECODE_PDL if pdl is None else pdl)
            try:
                t = graph_time(torch, lambda q=q, k=k, v=v, lens=lens, s=splits, c=cfg, p=pdl:
                               tf._decode(q, k, v, lens, s, None, c, pdl=p), target_s=1e-3, trials=3)
            except Exception as e:                 # 编译失败（共享内存不够等）：记下原因，接着测
                rows.append(dict(point, error=str(e).splitlines()[0][:160]))
                continue
            rows.append(dict(point, gpu_s=t, tbps=kv / t / 1e12))
        best = min((r for r in rows if r["B"] == B and r["S"] == S and "gpu_s" in r), key=lambda r: r["gpu_s"])
        print(f"  sweep B={B} S={S}: 最快 {best['config']} × {best['splits']} 段、PDL {best['pdl']} = "
              f"{best['gpu_s'] * 1e6:.1f} µs（{best['tbps']:.2f} TB/s）", flush=True)
        torch.cuda.empty_cache()
    return rows


def stress(torch, tf, calls=STRESS_CALLS):
    """
    草稿区（各段的部分结果）在调用之间复用：如果哪一次读到了上一次留下的段，结果就不对。
    只用一组输入连着算查不出来——上一次留下的段和这一次该写的逐位相同。所以用两组输入：A = (q, 满长 S)，
    B = (另一个 q, 有效长度 3S/4 − 5：尾部的段是空的，最后一块不满)，k、v、段数相同（同一个快速路径、同一块草稿区），
    按 STRESS_ORDER 交替算 calls 次，每次和同一组输入第一次的结果逐位比较，数不一致的次数（两组合计）：
    同一组的前一次调用有时是自己、有时是另一组，结果只要依赖上一次调用就会对不上。
    "每次都错得一样"（例如 B 的空段从不写、总读到 A 留下的段）逐位比较查不出，所以两组的第一次结果还和
    SDPA（triton_flash.sdpa_decode，只看有效前缀，同为 bf16）比，记下最大相对差。
    返回 ({"B=.. S=.. splits=..": 不一致次数}, {同样的键: 和 SDPA 的最大相对差})。
    """
    counts, errs = {}, {}
    for B, S, splits in STRESS_SHAPES:
        q, k, v, lens = make_inputs(torch, B, S)
        gen = torch.Generator(device=q.device).manual_seed(1)
        q2 = torch.randn(q.shape, device=q.device, dtype=q.dtype, generator=gen)
        inputs = [(q, lens), (q2, torch.full_like(lens, 3 * S // 4 - 5))]
        first = [tf.flash_decode(qi, k, v, li, num_splits=splits) for qi, li in inputs]
        assert not torch.equal(first[0], first[1]), "两组输入的结果相同：压力测试分不出读的是哪一组的段"
        bad = 0
        for i in range(calls):
            j = STRESS_ORDER[i % len(STRESS_ORDER)]
            qi, li = inputs[j]
            bad += not torch.equal(tf.flash_decode(qi, k, v, li, num_splits=splits), first[j])
        key = f"B={B} S={S} splits={splits}"
        counts[key] = bad
        errs[key] = max(tf._rel_err(f.double(), tf.sdpa_decode(qi, k, v, li).double())
                        for f, (qi, li) in zip(first, inputs))
        print(f"  压力测试 B={B} S={S} {splits} 段：两组输入交替 {calls} 次，和同组第一次不逐位相同的 {bad} 次；"
              f"第一次结果和 SDPA 的相对差 {errs[key]:.1e}", flush=True)
    return counts, errs


def measure_probe(torch, tf, calls=PROBE_CALLS):
    """
    计时探针（flash_decode._decode 的 stamps）：PROBE_SHAPE 上 calls 次调用录进一张 CUDA 图（每次写自己那一份
    时间戳）、重放两次，取第二次。每个程序一行 [入口, gdc_wait 之后, 完成, SM 号]
    （%globaltimer，ns；"完成"的含义见 flash_decode._probe）；
    存的时间相对第一次调用里最早的入口。另外量带探针和不带探针的 GPU 时间（探针本身的代价）。
    """
    B, S = PROBE_SHAPE
    q, k, v, lens = make_inputs(torch, B, S)
    (block_n, warps, stages), splits = tf.decode_plan(B, HK, S, tf._sm_count(q.device), rows=HQ // HK, d=D,
                                                      dtype_bytes=q.element_size())
    shape1, shape2 = tf.decode_probe_shape(B, HK, HQ // HK, D, splits, tf._sm_count(q.device))
    st1 = torch.zeros((calls, *shape1), device="cuda", dtype=torch.int64)
    st2 = torch.zeros((calls, *shape2), device="cuda", dtype=torch.int64)
    out = torch.empty_like(q)

    def call(i):
        return tf._decode(q, k, v, lens, None, None, None, out=out, stamps=(st1[i], st2[i]))
    graph, _ = capture_graph(lambda: [call(i) for i in range(calls)], warmup=2)
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    a, m = st1.cpu(), st2.cpu()
    t0 = int(a[..., 0].min())
    a[..., :3] -= t0
    m[..., :3] -= t0
    times = {"probe": [], "plain": []}
    for _ in range(3):                          # 带 / 不带探针轮流量（同 measure_table）：两者落在同样的 GPU 状态里
        times["probe"].append(graph_time(torch, lambda: call(0)))
        times["plain"].append(graph_time(torch, lambda: tf.flash_decode(q, k, v, lens)))
    gpu_probe, gpu_plain = min(times["probe"]), min(times["plain"])
    print(f"  计时探针 B={B} S={S}：{splits} 段、{shape2[0]} 个合并程序；带探针 {gpu_probe * 1e6:.2f} µs，"
          f"不带 {gpu_plain * 1e6:.2f} µs（各轮 " + "，".join(
              f"{k} " + "/".join(f"{x * 1e6:.1f}" for x in v) for k, v in times.items()) + "）", flush=True)
    return dict(B=B, S=S, splits=splits, config=[block_n, warps, stages], gpu_s_probe=gpu_probe, gpu_s=gpu_plain,
                rounds_s=times, fields=["entry", "after_wait", "done", "sm"], k1=a.tolist(), merge=m.tolist())


def measure(args):
    import torch
    import flash_decode as tf
    if not torch.cuda.is_available():
        print("SKIP: --measure 需要 CUDA GPU")
        return SKIP
    t0 = time.time()
    res = dict(meta=gpu_meta(torch, n_sm=torch.cuda.get_device_properties(0).multi_processor_count,
                             dtype="bfloat16", Hq=HQ, Hk=HK, d=D))
    res["meta"]["decode_config"] = {"long": list(tf.DECODE_CONFIG), "short": list(tf.DECODE_CONFIG_SHORT),
                                    "short_if_keys_per_split_le": tf.SHORT_SPLIT_KEYS, "pdl": tf.DECODE_PDL}
    res["copy"] = copy_bandwidth(torch)
    res["copy_Bps"] = res["copy"]["best"]
    print("拷贝带宽（读 + 写）：" + "  ".join(f"{k} {v / 1e12:.2f} TB/s" for k, v in res["copy"].items()), flush=True)
    res["launch"] = launch_gap(torch)
    early = measure_overhead(torch, tf)
    print("启动间隙：" + "  ".join(f"{k} {v * 1e6:.2f} µs" for k, v in res["launch"].items()), flush=True)
    if args.sweep:
        res["sweep"] = sweep(torch, tf)
    res["stress"], stress_err = stress(torch, tf)
    # 压力测试的做法记进 meta（第 2 部分据此分辨新旧两种测法；旧的 JSON 没有这一项）
    res["meta"]["stress"] = dict(calls=STRESS_CALLS, order=list(STRESS_ORDER),
                                 inputs="A: q, L = S; B: q', L = 3S/4 - 5", err_vs_sdpa=stress_err)
    res["probe"] = measure_probe(torch, tf)
    res["rows"] = measure_table(torch, tf)
    # 主机开销量两遍（开头一遍、最后一遍，隔着整张表几十秒），每点取快的：共用主机的慢段能持续好几秒
    res["overhead"] = merge_overhead(early, measure_overhead(torch, tf))
    res["meta"]["seconds"] = time.time() - t0
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, os.path.basename(RESULTS))
    with open(path, "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"写好 {os.path.relpath(path)}（{time.time() - t0:.0f} s）；打印、检查、重画 results/ 里的图："
          "python3 lecture11/bench/decode_bench.py --replot")
    if args.compare:
        compare_to_committed(res, load_json(RESULTS))
    return 0


def compare_to_committed(res, committed):
    """
    --measure --compare：每个 (B, S, 实现) 的 GPU 时间、每个 (S, 实现) 的主机开销，提交的 / 这次的（> 1 = 这次更快）。
    同一次运行里 SDPA、fa2 的比值是机器本身的起伏：ours 的比值要和它们放在一起看。返回 {名字: [比值, …]}。
    """
    ratios, table = {}, []
    old = {(r["B"], r["S"], r["impl"]): r["gpu_s"] for r in committed["rows"]}
    for r in res["rows"]:
        key = (r["B"], r["S"], r["impl"])
        if old.get(key) and r.get("gpu_s"):
            x = old[key] / r["gpu_s"]
            ratios.setdefault(f"GPU 时间 {key[2]}", []).append(x)
            table.append([*key, f"{old[key] * 1e6:.1f}", f"{r['gpu_s'] * 1e6:.1f}", f"{x:.2f}"])
    print(format_table(["B", "S", "实现", "提交的 µs", "这次 µs", "提交的 / 这次的"], table))
    old = {(r["S"], r["impl"]): r["over_s"] for r in committed["overhead"]["rows"]}
    table = []
    for r in res["overhead"]["rows"]:
        key = (r["S"], r["impl"])
        if old.get(key) is not None and r.get("over_s") is not None:
            table.append([*key, f"{old[key] * 1e6:.1f}", f"{r['over_s'] * 1e6:.1f}"])
    print("主机开销（µs，每次调用 − GPU 时间）：")
    print(format_table(["S", "实现", "提交的", "这次"], table))
    for name, xs in sorted(ratios.items()):
        xs = sorted(xs)
        print(f"  {name}：提交的 / 这次的 = {xs[0]:.2f}–{xs[-1]:.2f}（中位数 {xs[len(xs) // 2]:.2f}，{len(xs)} 个点）")
    return ratios


# =============================================================================
# 读结果、打印（没有 GPU 也行）
# =============================================================================
def ratio_text(x):
    return f"{x:.2f}"


def by_point(res):
    """rows → {(B, S, 实现): 那一行}。测量时每个 B × S × 实现都测（measure_table），下面的代码直接按键取：
    缺点就报错（说明 JSON 不是 --measure 完整写出来的），而不是在某一处悄悄跳过。"""
    by = {(r["B"], r["S"], r["impl"]): r for r in res["rows"]}
    missing = [key for key in itertools.product(BATCHES, SEQLENS, IMPLS) if key not in by]
    if missing:
        raise ValueError(f"decode_bench.json 的 rows 缺 {len(missing)} 个点（如 B, S, 实现 = {missing[0]}）："
                         "--measure 每个点都测，重新测量")
    return by


def print_table(res):
    meta = res["meta"]
    copy = res["copy_Bps"]
    print(f"GPU：{meta['gpu']}  driver {meta['driver']}  torch {meta['torch']}  triton {meta['triton']}  "
          f"（{meta['date']}）")
    print(f"拷贝带宽（读 + 写，同一次运行）：逐元素内核 {res['copy']['kernel'] / 1e12:.2f} TB/s，"
          f"cudaMemcpy {res['copy']['memcpy'] / 1e12:.2f} TB/s → 取 {copy / 1e12:.2f} TB/s；"
          f"HBM 规格 {H200.mem_bw / 1e12:.1f} TB/s")
    by = by_point(res)
    table = []
    for B in BATCHES:
        for S in SEQLENS:
            ours = by[(B, S, "ours")]
            merge = ours.get("merge")          # (BLOCK_S, D_CHUNK, warps)；旧的 JSON 没有这一项
            cells = [B, S, ours["splits"],
                     "–" if not merge else f"{B * HQ * (D // merge[1])} 个 × {merge[2]} warp"]
            for impl in IMPLS:
                r = by[(B, S, impl)]
                cells += [f"{r['gpu_s'] * 1e6:.1f}", f"{r['kv_bytes'] / r['gpu_s'] / copy:.0%}"]
            cells.append(ratio_text(by[(B, S, "sdpa")]["gpu_s"] / by[(B, S, "ours")]["gpu_s"]))
            table.append(cells)
    print(format_table(["B", "S", "段数", "合并内核", "ours µs", "ours/拷贝", "sdpa µs", "sdpa/拷贝", "fa2 µs",
                        "fa2/拷贝", "sdpa / ours"], table))
    rounds = "/".join(str(n) for n in sorted({len(r["gpu_rounds_s"]) for r in res["rows"]}))
    print(f"（时间 = CUDA 图里重放的 GPU 时间，三种实现轮流测 {rounds} 轮取最快；"
          "带宽 = K/V 字节 / 时间，和拷贝带宽比；合并内核 = 程序数（行 × 段列）× 每个程序的 warp 数，"
          "flash_decode.decode_merge_config）")
    top = max(by.values(), key=lambda r: r["kv_bytes"] / r["gpu_s"])
    bw = top["kv_bytes"] / top["gpu_s"]
    print(f"  最高的一格：{top['impl']} B={top['B']} S={top['S']}，{bw / 1e12:.2f} TB/s = {bw / copy:.0%} 拷贝带宽、"
          f"{bw / H200.mem_bw:.0%} HBM 规格。超过 100% 拷贝不是算错：拷贝一半是写，HBM 在读写之间切换要付代价，"
          "只读的内核（解码注意力只读 K/V）能比拷贝更接近规格")


def _err_key(x):
    """误差排序用：NaN 当作最大（不让它在 max 里被悄悄排到后面）。"""
    return math.inf if math.isnan(x) else x


def check_correctness(res):
    """
    第 2 部分：测量时记下的正确性数据逐条对照，打印 ✓ / ✗，返回出问题的条数（main 据此以退出码 1 结束，
    和 triton_bench 的 report_failures 一样：退出码 0 = 测量时都算对了）。
      - rows[*].err_vs_sdpa：每个实现的输出和 SDPA 的相对差，要 < DECODE_TOL（sdpa 那一行是它第二次调用对第一次）；
      - stress：草稿区压力测试里不逐位相同的次数，要是 0，和 SDPA 的相对差（meta.stress）同样要 < DECODE_TOL。
        缺这些记录、或者是旧测法（没有 meta.stress）也算问题：没有记录撑着，就说不上"测量时都算对了"。
    NaN 不满足 "<"，算不合格。
    """
    problems = 0
    print(f"  上限：和 SDPA（同为 bf16）的相对差 ‖x − sdpa‖/‖sdpa‖ < {DECODE_TOL:.1e} = 3 × 2⁻⁸\n"
          "    （flash_decode.decode_limit 的判据 \"对 float64 的误差 < 2 × SDPA 自己的误差\" 加三角不等式，"
          "SDPA 的误差按 bf16 的舍入上界 2⁻⁸ 算；详见本文件 DECODE_TOL 的注释）")
    for impl in IMPLS:
        rows = [r for r in res["rows"] if r["impl"] == impl]
        over = [r for r in rows if not r["err_vs_sdpa"] < DECODE_TOL]
        worst = max(rows, key=lambda r: _err_key(r["err_vs_sdpa"]))
        what = "（第二次调用对第一次）" if impl == "sdpa" else ""
        listed = "; ".join(f"B={r['B']} S={r['S']}: {r['err_vs_sdpa']:.1e}" for r in over)
        print(f"  {'✗' if over else '✓'} {impl}{what}：{len(rows)} 个点，最大相对差 {worst['err_vs_sdpa']:.1e}"
              f"（B={worst['B']} S={worst['S']}）" + (f"；超过上限：{listed}" if over else ""))
        problems += len(over)
    counts, info = res.get("stress"), res["meta"].get("stress")
    if not counts:
        print("  ✗ 结果里没有压力测试（stress）的记录：无法确认草稿区在调用之间复用时结果不变")
        return problems + 1
    if info is None:          # 旧测法（同一组输入连算）：读到上一次留下的段也和该写的逐位相同，0 次证明不了什么
        print("  ✗ 压力测试是旧的测法（同一组输入连算 500 次：读到上一次留下的段也和该写的逐位相同，查不出来），"
              "算作没有记录；用 --measure 重测就是新测法（两组输入交替，见 stress() 的文档）")
        return problems + 1
    print(f"  压力测试（草稿区在调用之间复用；num_splits 固定）：两组输入（{info['inputs']}）按 {info['order']} "
          f"交替算 {info['calls']} 次，每次和同组第一次的结果逐位比较；第一次的结果再和 SDPA 比")
    for key, bad in counts.items():
        err = info["err_vs_sdpa"].get(key)
        ok = bad == 0 and err is not None and err < DECODE_TOL
        print(f"  {'✓' if ok else '✗'} {key}：不逐位相同 {bad} 次，和 SDPA 的相对差 "
              + ("没有记录" if err is None else f"{err:.1e}"))
        problems += not ok
    if problems:
        print(f"  ✗ 有 {problems} 处正确性问题（上面逐条列出）：这份结果里的速度数字不能当真")
    return problems


def target_report(res):
    """速度目标，逐条 ✓ / ✗（数都由 JSON 现算）。"""
    by, copy = by_point(res), res["copy_Bps"]
    lines = []

    def check(name, items, fmt="{:.2f}"):
        bad = [f"{k}: {fmt.format(v)}" for k, v, ok in items if not ok]
        mark = "✓" if not bad else "✗"
        lines.append(f"  {mark} {name}：{len(items) - len(bad)}/{len(items)}" + (f"；没达到：{'; '.join(bad)}" if bad
                                                                               else ""))
    check("S ≥ 32k 时 ≥ 90% 拷贝带宽",
          [(f"B={B} S={S}", by[(B, S, "ours")]["kv_bytes"] / by[(B, S, "ours")]["gpu_s"] / copy,
            by[(B, S, "ours")]["kv_bytes"] / by[(B, S, "ours")]["gpu_s"] >= 0.9 * copy)
           for B in BATCHES for S in SEQLENS if S >= 32768], fmt="{:.0%}")
    one = by[(1, 32768, "ours")]
    if one["kv_bytes"] / one["gpu_s"] < 0.9 * copy:
        lines.append(f"    B = 1、S = 32k：90% 拷贝带宽要 {one['kv_bytes'] / (0.9 * copy) * 1e6:.1f} µs，实测 "
                     f"{one['gpu_s'] * 1e6:.1f} µs（两个内核的发射、爬坡、合并是固定的几 µs，S 越短占得越多；"
                     "）")
    r = by[(1, 32768, "sdpa")]["gpu_s"] / one["gpu_s"]
    check("B = 1、S = 32k 时 ≥ 1.3× SDPA", [("B=1 S=32768", r, r >= 1.3)])
    if r < 1.3:
        lines += miss_1_3x(res, by, copy)
    check("其余各点 ≥ 0.95× SDPA",
          [(f"B={B} S={S}", by[(B, S, "sdpa")]["gpu_s"] / by[(B, S, "ours")]["gpu_s"],
            by[(B, S, "sdpa")]["gpu_s"] >= 0.95 * by[(B, S, "ours")]["gpu_s"])
           for B in BATCHES for S in SEQLENS if (B, S) != (1, 32768)])
    over = [r for r in res["overhead"]["rows"] if r["impl"].startswith("ours")]
    check("主机开销（每次调用 − GPU 时间）≤ 15 µs",
          [(f"{r['impl']} S={r['S']}（µs）", r["over_s"] * 1e6, r["over_s"] <= 15e-6) for r in over])
    check("CUDA 图捕获、换输入重放 = 直接调用（逐位）", [(f"{r['impl']} S={r['S']}", 1.0, r["graph_ok"]) for r in over])
    print("\n".join(lines))
    return lines


def miss_1_3x(res, by, copy):
    """
    没达到 1.3× SDPA 时的解释（由 JSON 现算）：1.3× 要多少拷贝带宽；和这次测到的最高流速比；再用第 7 部分的探针
    说明差在哪：按最高流速读完 K/V 之后，留给其余部分（最慢的程序、交接、合并、下一次放行）的时间有多少，现在用了多少。
    """
    sdpa = by[(1, 32768, "sdpa")]
    share = sdpa["kv_bytes"] / sdpa["gpu_s"] / copy
    (bb, bs, bi), top = max(((key, x["kv_bytes"] / x["gpu_s"] / copy) for key, x in by.items()), key=lambda kv: kv[1])
    need_s = sdpa["gpu_s"] / 1.3
    lines = [f"    SDPA 在这一点是 {share:.0%} 拷贝带宽，1.3× 它要 {1.3 * share:.0%}（{need_s * 1e6:.1f} µs）；"
             f"这次所有实现、所有形状里测到的最高流速是 {top:.0%}（{bi} B={bb} S={bs}）"]
    if 1.3 * share > top:
        lines.append("    ——比测到的最高流速还高：按这次的测量，这个目标任何实现都达不到")
        return lines
    if res.get("probe") is None:
        return lines
    top_row = by[(bb, bs, bi)]
    if top_row.get("splits"):
        per = top_row["kv_bytes"] / (bb * HK * top_row["splits"])
        lines.append(f"    最高的那格是长的读流：每个程序读 {per / 2**20:.0f} MiB；B = 1、S = 32k 每个程序只读 "
                     f"{by[(1, 32768, 'ours')]['kv_bytes'] / (HK * by[(1, 32768, 'ours')]['splits']) / 2**20:.0f} MiB")
    c = median_call(probe_breakdown(res["probe"]))          # 和第 7 部分的表同一次调用（µs）
    rest_us = c["period"] - c["stream"]
    read_us = sdpa["kv_bytes"] / (top * copy) * 1e6
    budget_us = need_s * 1e6 - read_us
    verdict = ("现在的两内核结构下到不了 1.3×" if rest_us > budget_us else "按这个算法够得着 1.3×：差在读 K/V 的流速上")
    lines.append(f"    按 {top:.0%} 的流速读完 K/V 要 {read_us:.1f} µs，1.3× 只给其余部分留 {budget_us:.1f} µs；"
                 f"探针量到中位的程序读完之后还有 {rest_us:.1f} µs（第 7 部分：最慢的程序、交接、合并、下一次放行）："
                 f"{verdict}")
    return lines


def print_overhead(res):
    rows = res["overhead"]["rows"]
    print(format_table(["S", "实现", "每次调用 µs", "GPU µs", "多出来的 µs", "CUDA 图逐位一致"],
                       [[r["S"], r["impl"], f"{r['wall_s'] * 1e6:.1f}", f"{r['gpu_s'] * 1e6:.1f}",
                         f"{r['over_s'] * 1e6:.1f}", "是" if r["graph_ok"] else "否"] for r in rows]))
    parts = res["overhead"]["parts"]
    passes = res["overhead"].get("passes", 1)         # 旧的 JSON 只量过一遍
    if passes > 1:
        print(f"  每次调用的时间量了 {passes} 遍（第一遍在表之前、最后一遍在表之后），每点取快的一遍；"
              "各遍：" + "，".join(
            f"{r['S']} {r['impl']} " + "/".join(f"{w * 1e6:.1f}" for w in r["passes_wall_s"]) for r in rows) + " µs")
    print("  主机时间拆开（B = 1、S = 1k；几个调用轮流量 5 轮取最快的一轮，几遍里再取快的）：" +
          "，".join(f"{k} {v * 1e6:.1f} µs" for k, v in parts.items()))
    gap = res["launch"]
    print(f"  同一台主机上发一个空内核（torch.cuda._sleep(0)）要 {gap['host_launch_s'] * 1e6:.1f} µs："
          f"每次调用发两个内核（split-KV + 合并），主机时间的下限就有两倍这么多")



PROBE_PHASES = (("stream", "读 K/V：放行 → 一半的程序读完"),
                ("tail", "最慢的程序：一半读完 → 全部读完"),
                ("to_merge", "第一步收尾（写部分结果）→ 合并内核放行"),
                ("merge", "合并：放行 → 最后一个合并程序写完"),
                ("to_next", "合并写完 → 下一次调用的第一步放行"))


def probe_breakdown(probe):
    """
    探针的时间戳 → 每次调用分成 PROBE_PHASES 几段（µs）。第 i 次调用从它的第一步放行（最早的 gdc_wait 之后）
    算到第 i + 1 次的第一步放行，所以各段加起来正好是一次调用的周期；只算有后一次的调用。返回
    {"calls": [{段: µs, "period": µs}, ...], "median": {段: 中位数}}。
    """
    import statistics
    k1, merge = probe["k1"], probe["merge"]
    if len(k1) < 2 or not merge or not merge[0]:
        raise ValueError("probe_breakdown：至少要 2 次调用、并且有合并内核（段数 > 1）的时间戳")
    calls = []
    for i in range(len(k1) - 1):
        wait = min(r[1] for r in k1[i])
        done = sorted(r[2] for r in k1[i])
        m_wait = min(r[1] for r in merge[i])
        m_done = max(r[2] for r in merge[i])
        nxt = min(r[1] for r in k1[i + 1])
        marks = [wait, statistics.median(done), done[-1], m_wait, m_done, nxt]
        row = {name: (b - a) / 1e3 for (name, _), a, b in zip(PROBE_PHASES, marks, marks[1:])}
        row["period"] = (nxt - wait) / 1e3
        calls.append(row)
    median = {name: statistics.median(c[name] for c in calls) for name, _ in PROBE_PHASES + (("period", ""),)}
    return {"calls": calls, "median": median}


def median_call(br):
    """周期是中位数的那次调用（偶数次时取较慢的那次）：它的各段加起来正好是它的周期。"""
    calls = sorted(br["calls"], key=lambda c: c["period"])
    return calls[len(calls) // 2]


def print_probe(res):
    """第 7 部分：一次调用的时间线（探针）。旧的 JSON 没有这一项：打印一句、返回 None。"""
    probe = res.get("probe")
    if probe is None:
        print("  （这份 JSON 没有计时探针的测量：用 --measure 重新测）")
        return None
    br = probe_breakdown(probe)
    c = median_call(br)
    copy = res["copy_Bps"]
    kv = kv_bytes(probe["B"], probe["S"])
    n = len(probe["k1"][0])
    print(f"B = {probe['B']}、S = {probe['S']}：{probe['splits']} 段 × {probe['B'] * HK} 个 (序列, K/V 头) = "
          f"{n} 个第一步程序，{len(probe['merge'][0])} 个合并程序；量了 {len(br['calls'])} 次调用，"
          "下表是周期为中位数的那一次（µs）")
    rows = [[label, f"{c[name]:.2f}", f"{100 * c[name] / c['period']:.0f}%",
             f"{min(x[name] for x in br['calls']):.2f}–{max(x[name] for x in br['calls']):.2f}"]
            for name, label in PROBE_PHASES]
    rows.append(["一次调用（各段之和）", f"{c['period']:.2f}", "100%",
                 f"{min(x['period'] for x in br['calls']):.2f}–{max(x['period'] for x in br['calls']):.2f}"])
    print(format_table(["阶段", "µs", "占比", f"{len(br['calls'])} 次里的范围"], rows, align=["<", ">", ">", ">"]))
    print(f"  CUDA 图计时：带探针 {probe['gpu_s_probe'] * 1e6:.2f} µs / 次，不带 {probe['gpu_s'] * 1e6:.2f} µs / 次"
          f"（探针每个程序多写 4 个数）")
    stream_bw = kv / (c["stream"] * 1e-6)
    print(f"  每个程序读自己那 1/{n} 的 K/V；中位的程序用了 {c['stream']:.2f} µs → {n} 个合起来 ≈ "
          f"{stream_bw / 1e12:.2f} TB/s = {100 * stream_bw / copy:.0f}% 拷贝带宽。其余 "
          f"{c['period'] - c['stream']:.2f} µs "
          "在中位的程序读完之后：一部分是还在读的慢程序，其余是交接、合并和下一次调用的放行")
    arrive = probe_arrivals(probe, br["calls"].index(c))
    gap = arrive["next_after_merge"]
    nxt = (f"下一次调用的第一步在合并写完后 {gap:.2f} µs 才上 SM——发射本身比合并还慢，合并里提前放行省不出时间"
           if gap > 0 else f"下一次调用的第一步在合并写完前 {-gap:.2f} µs 就上了 SM（合并里提前放行起了作用）")
    print(f"  程序什么时候上 SM（入口时间戳，同一次调用）：合并的程序比自己放行早 {arrive['merge_early']:.1f} µs "
          f"就在 SM 上等着（PDL）；{nxt}；第一步的 {n} 个程序落在 {arrive['k1_sms']} 个不同的 SM 上")
    return br


def probe_arrivals(probe, i):
    """第 i 次调用的入口时间戳（µs）：合并程序最早的入口比它们的放行早多少；第 i + 1 次调用的第一步最早的入口比
    第 i 次的合并写完晚多少；第 i 次第一步的程序用了几个不同的 SM。"""
    k1, merge, nxt = probe["k1"][i], probe["merge"][i], probe["k1"][i + 1]
    return dict(merge_early=(min(r[1] for r in merge) - min(r[0] for r in merge)) / 1e3,
                next_after_merge=(min(r[0] for r in nxt) - max(r[2] for r in merge)) / 1e3,
                k1_sms=len({r[3] for r in k1}))

# =============================================================================
# 校准：第 4 节的 decode 注意力模型、第 5 节的时间线模型
# =============================================================================
FA2_BLOCK_M = 128     # d = 128 时 flash_attn_func 的前向配置（triton_flash._prune_fwd 留下的 8 warp 配置）都是 128 行


def decode_points(res):
    """实测 → fit_decode_gpu 的点。ours = "fd"：一组 R = Hq/Hk 行补到 ≥ 16 的 2 的幂（和 flash_decode._decode 一样）；
    fa2 = "fa2"：FA2_BLOCK_M 行。SDPA 的内部划分不知道，不放进拟合。"""
    fd_rows = max(16, 1 << math.ceil(math.log2(HQ // HK)))
    pts = []
    for r in res["rows"]:
        if r["impl"] in ("ours", "fa2"):
            fd = r["impl"] == "ours"
            pts.append(dict(B=r["B"], Hq=HQ, Hkv=HK, S=r["S"], d=D, method="fd" if fd else "fa2",
                            splits=r["splits"] if fd else 1, block_m=fd_rows if fd else FA2_BLOCK_M, t=r["gpu_s"]))
    return pts


def calibrate_decode(res):
    fitted, rows = fl.fit_decode_gpu(decode_points(res), fl.H200_DEC)
    return fitted, rows


def step_points(step_res, n_kernels):
    """lecture05 的实测里 Llama-3.2-1B、批 1 的 decode 步 → (上下文, 执行方式, 补到实测内核数的算子表, 秒)。"""
    out = []
    for p in step_res["points"]:
        if (p.get("model"), p.get("kind"), p.get("batch"), p.get("status")) == ("Llama-3.2-1B", "decode", 1, "ok"):
            ops = fl.pad_ops(fl.llama_1b_ops(p["context"], kernels="12"), n_kernels)
            out.append((p["context"], p["mode"], ops, p["seconds"]))
    return sorted(out, key=lambda x: (x[1], x[0]))


def calibrate_timeline(res, step_res):
    """
    时间线模型（第 5 节）对 Llama-3.2-1B 批 1 的真实一步：算子表补到 profiler 数出的内核个数；hbm 换成 H200；
    launch（CUDA 图）= 本文件实测的空内核间隙；再拟合 small（CUDA 图的点）和 eager 的 launch（主机发内核的间隔）。
    """
    n_k = step_res["meta"]["kernels"]["Llama-3.2-1B"]["decode"]["n_kernels"]
    pts = step_points(step_res, n_k)
    start = replace(fl.TimelineParams(), hbm=H200.mem_bw, launch=res["launch"]["graph_s"])
    graph = [(ops, t) for _, mode, ops, t in pts if mode == "graph"]
    eager = [(ops, t) for _, mode, ops, t in pts if mode == "eager"]
    p_graph, rows_g = fl.fit_timeline(graph, start, "small")
    p_eager, rows_e = fl.fit_timeline(eager, p_graph, "launch")
    default = fl.TimelineParams()
    table = []
    for (ctx, mode, _ops, t), row in zip([x for x in pts if x[1] == "graph"] + [x for x in pts if x[1] == "eager"],
                                        rows_g + rows_e):
        lecture = fl.timeline(fl.llama_1b_ops(ctx, kernels="12"), "kernels", default)["t"]   # 讲义里的默认
        table.append(dict(context=ctx, mode=mode, t=t, lecture=lecture, after=row["after"]))
    return p_graph, p_eager, n_k, table


def median_err(rows, model_key):
    """表的行（r[model_key] = 模型，r["t"] = 实测）→ (中位 |模型/实测 − 1|, |log 比值| 最大的那一行)
    （course_utils.ratio_errors，各讲的校准表共用）。"""
    median, worst = ratio_errors([r[model_key] / r["t"] for r in rows])
    return median, rows[worst]


CONST_DIGITS = 3                             # flash_lab 里的拟合常数只留 3 位有效数字
CONST_TOL = 0.5 * 10.0 ** (1 - CONST_DIGITS)  # 舍入最多差这么多（相对）：和重新拟合的值比，以内算同一组


def same_params(a, b, rel_tol=CONST_TOL):
    """两组参数（同一个 dataclass）的每个数值字段都相等（rel_tol 的相对误差内）：差一个字段都算不等。
    名字这类文字字段不比（常数的名字带 "(measured)" 的标签，拟合出来的没有）。"""
    def eq(x, y):
        if isinstance(x, str):
            return True
        if isinstance(x, float) or isinstance(y, float):
            return math.isclose(x, y, rel_tol=rel_tol, abs_tol=1e-15)
        return x == y
    return type(a) is type(b) and all(eq(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))


def print_decode_fit(res):
    fitted, rows = calibrate_decode(res)
    print(format_table(
        ["方法", "B", "S", "段数", "实测 µs", "模型(假设) µs", "比值", "模型(拟合) µs", "比值"],
        [[r["method"], r["B"], r["S"], r["splits"], f"{r['t'] * 1e6:.1f}", f"{r['before'] * 1e6:.1f}",
          ratio_text(r["before"] / r["t"]), f"{r['after'] * 1e6:.1f}", ratio_text(r["after"] / r["t"])]
         for r in rows]))
    worst = median_err(rows, "after")[1]
    print(f"  假设：sm_bw_cap {fl.H200_DEC.sm_bw_cap / 1e9:.0f} GB/s、launch {fl.H200_DEC.launch * 1e6:.1f} µs → "
          f"拟合：sm_bw_cap {fitted.sm_bw_cap / 1e9:.1f} GB/s、launch {fitted.launch * 1e6:.2f} µs")
    print(f"  中位 |模型/实测 − 1|：{median_err(rows, 'before')[0]:.0%} → "
          f"{median_err(rows, 'after')[0]:.0%}（{len(rows)} 个点）")
    print(f"  拟合后最差的点：{worst['method']} B={worst['B']} S={worst['S']}，模型/实测 = "
          f"{worst['after'] / worst['t']:.2f}")
    if worst["method"] == "fa2":
        print(f"    fa2 的模型按每个 query 头各读一遍它那组 K/V 计字节（B·Hq 份）；同组的 {HQ // HK} 个程序差不多同时"
              f"在跑，后 {HQ // HK - 1} 份多半打在 L2 上，实际的显存流量更少——S 短、每组 K/V 只有几百 KB 时最明显"
              "（这是推断，没有用 ncu 量 L2 命中率）")
    same = same_params(fitted, fl.H200_DEC_MEASURED)
    print(f"  flash_lab.H200_DEC_MEASURED {'就是' if same else '不等于（要更新！）'}这次的拟合")
    assert same, f"flash_lab.H200_DEC_MEASURED 和已提交 JSON 的拟合不一致：拟合 = {fitted}"
    return fitted, rows


def ours_bw(res, B, s_min):
    """批 B、S ≥ s_min 时我们读 K/V 的带宽范围（文字，TB/s）。"""
    bws = [r["kv_bytes"] / r["gpu_s"] / 1e12 for r in res["rows"]
           if r["impl"] == "ours" and r["B"] == B and r["S"] >= s_min]
    return f"{min(bws):.1f}–{max(bws):.1f} TB/s"


def print_timeline_fit(res, step_res):
    p_graph, p_eager, n_k, table = calibrate_timeline(res, step_res)
    print(f"Llama-3.2-1B 批 1 的一次 decode（lecture05/bench/results/step_measure.json）：profiler 数出 {n_k} 个内核；"
          f"讲义的 \"12\" 划分是 {len(fl.llama_1b_ops(160, kernels='12'))} 个")
    print(format_table(["上下文", "执行", "实测 µs", "讲义默认 µs", "比值", "校准后 µs", "比值"],
                       [[r["context"], r["mode"], f"{r['t'] * 1e6:.0f}", f"{r['lecture'] * 1e6:.0f}",
                         ratio_text(r["lecture"] / r["t"]), f"{r['after'] * 1e6:.0f}", ratio_text(r["after"] / r["t"])]
                        for r in table]))
    gap = res["launch"]
    print(f"  实测空内核的间隙：stream {gap['stream_s'] * 1e6:.2f} µs、CUDA 图 {gap['graph_s'] * 1e6:.2f} µs"
          f"（讲义默认 {fl.TimelineParams().launch * 1e6:.1f} µs，Hazy 在 H100 上测到 2.1 / 1.3 µs）")
    print(f"  拟合：小内核 small = {p_graph.small * 1e6:.2f} µs（讲义假设 {fl.TimelineParams().small * 1e6:.1f} µs）；"
          f"eager 时相邻内核的间隔 launch = {p_eager.launch * 1e6:.1f} µs"
          "（主机发一个 PyTorch 算子的时间：eager 受主机限制）")
    print(f"  中位 |模型/实测 − 1|：讲义默认 {median_err(table, 'lecture')[0]:.0%} → "
          f"校准后 {median_err(table, 'after')[0]:.0%}（{len(table)} 个点）")
    worst = median_err(table, "after")[1]
    print(f"  最差的点：上下文 {worst['context']}、{worst['mode']}，模型/实测 = {worst['after'] / worst['t']:.2f}。")
    g = {r["context"]: r["t"] for r in table if r["mode"] == "graph"}
    if 2048 in g and 8192 in g:
        kv = 2 * (8192 - 2048) * fl.LLAMA_1B.kv_dim * fl.LLAMA_1B_ELEM * fl.LLAMA_1B.n_layers
        print(f"    上下文 2048 → 8192 多读 {kv / 1e6:.0f} MB 的 KV，实测多花 {(g[8192] - g[2048]) * 1e6:.0f} µs："
              f"这一步的注意力读 KV 只有 {kv / (g[8192] - g[2048]) / 1e9:.0f} GB/s。lecture05 的 step_bench 把一组 "
              f"{fl.LLAMA_1B.n_heads // fl.LLAMA_1B.n_kv_heads} 个 query 头当作几个 query 位置交给 SDPA（cuDNN 内核），"
              f"批 1 时只有 {fl.LLAMA_1B.n_kv_heads} 个程序在读 KV——正是 flash-decoding 要解决的问题；"
              "时间线模型按每个 query 头一个程序算，快了几倍。"
              f"换成本讲的 flash_decode（B = 1、S ≥ 8k 时 {ours_bw(res, 1, 8192)}，见第 1 部分的表）就没有这个差距")
    for name, p in (("H200_TIMELINE_GRAPH", p_graph), ("H200_TIMELINE_EAGER", p_eager)):
        const = getattr(fl, name)
        same = same_params(p, const)
        print(f"  flash_lab.{name} {'就是' if same else '不等于（要更新！）'}这次的校准")
        assert same, f"flash_lab.{name} 和已提交 JSON 的校准不一致：校准 = {p}"
    return p_graph, p_eager, table


# =============================================================================
# 图（英文）
# =============================================================================
def committed_png(what, replot):
    """已提交的 results/decode_bench_<what>.png（replot 时）或 None：course_utils.committed_figure 的规则。"""
    return committed_figure(__file__, f"decode_bench_{what}.png", replot)


def plot(res, decode_rows, timeline_table, quick, replot=False):
    """两张图。默认存到 lecture11/bench/figures/，quick=True 时 figures/quick/（同样的图、同样大）；
    只有 replot=True（且不是 quick）才重画已提交的 results/decode_bench_*.png。返回两个路径。"""
    plt = pyplot()
    copy = res["copy_Bps"]
    by = by_point(res)
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.6), sharey=True)
    styles = {"ours": ("o-", "ours (flash_decode, split-KV)"), "sdpa": ("s--", "SDPA (enable_gqa)"),
              "fa2": ("^:", "flash_attn_func, one query")}
    for ax, B in zip(axes, BATCHES):
        for impl, (st, label) in styles.items():
            ys = [100 * by[(B, S, impl)]["kv_bytes"] / by[(B, S, impl)]["gpu_s"] / copy for S in SEQLENS]
            ax.semilogx(SEQLENS, ys, st, lw=2, ms=7, base=2, label=label)
        ax.axhline(90, color="gray", ls=":", label="90% of copy (target)")   # 标注进图例：面板里写字会压着线
        ax.set_title(f"batch {B}, Hq/Hk = {HQ}/{HK}, d = {D}")
        ax.set_xlabel("KV cache length S (tokens)")
        ax.set_xticks(SEQLENS, [f"{s // 1024}k" for s in SEQLENS])
        ax.set_ylim(0, 115)
    axes[0].set_ylabel(f"K/V read bandwidth (% of copy, {copy / 1e12:.2f} TB/s)")
    fig.suptitle(f"Decode attention on {res['meta']['gpu']} (bf16, {res['meta']['date']})", y=0.995)
    # 一个图例放在三个面板上面（和 triton_bench 一样）：放在面板里会挡住某个批的点
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper center", ncol=len(styles) + 1,
               bbox_to_anchor=(0.5, 0.955), frameon=False)
    fig.set_layout_engine("tight", rect=(0, 0, 1, 0.92))      # 上面留给标题和图例（save_figure 用这个排版）
    bw_path = save_figure(fig, __file__, "bandwidth", quick=quick, path=committed_png("bandwidth", replot))

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(15, 6))
    # 模型 / 实测（线性轴）：对数-对数的"模型 vs 实测"图上 3–20% 的差别看不出来；同一个方法同一种颜色，
    # 空心 = 假设的参数、实心 = 拟合的参数
    for method, marker, color in (("fd", "o", "tab:blue"), ("fa2", "^", "tab:red")):
        sel = [r for r in decode_rows if r["method"] == method]
        x = [r["t"] * 1e6 for r in sel]
        a1.semilogx(x, [r["before"] / r["t"] for r in sel], marker, color=color, mfc="none", ms=9, mew=1.5,
                    label=f"{method}: assumed sm_bw_cap, launch")
        a1.semilogx(x, [r["after"] / r["t"] for r in sel], marker, color=color, ms=7, label=f"{method}: fitted")
    a1.axhline(1.0, color="k", ls="--", lw=1)
    a1.axhspan(0.85, 1.15, color="gray", alpha=0.15, lw=0, label="within 15%")
    a1.set_xlabel("measured (µs)")
    a1.set_ylabel("model / measured")
    a1.set_title("decode_attention_time / measured")
    a1.legend(loc="upper right")
    for mode, marker in (("graph", "s"), ("eager", "^")):
        sel = [r for r in timeline_table if r["mode"] == mode]
        a2.plot([r["context"] for r in sel], [r["t"] * 1e3 for r in sel], marker + "-", ms=8, lw=2,
                label=f"measured, {mode}")
        a2.plot([r["context"] for r in sel], [r["after"] * 1e3 for r in sel], marker + "--", mfc="none", ms=8,
                label=f"timeline, calibrated ({mode})")
    sel = [r for r in timeline_table if r["mode"] == "graph"]
    a2.plot([r["context"] for r in sel], [r["lecture"] * 1e3 for r in sel], "x:", ms=8, color="gray",
            label="timeline, lecture defaults (12 kernels/layer)")
    a2.set_xscale("log", base=2)
    a2.set_yscale("log")
    contexts = sorted({r["context"] for r in timeline_table})
    a2.set_xticks(contexts, [str(c) for c in contexts])
    a2.set_yticks([1, 2, 3, 5, 10], ["1", "2", "3", "5", "10"])
    a2.minorticks_off()
    a2.set_xlabel("context (tokens)")
    a2.set_ylabel("one decode step (ms)")
    a2.set_title("Llama-3.2-1B, batch 1: timeline model vs measured")
    a2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    model_path = save_figure(fig, __file__, "models", quick=quick, path=committed_png("models", replot))
    paths = [bw_path, model_path]
    if res.get("probe") is not None:
        paths.append(plot_probe(res["probe"], quick, replot))
    return paths


def plot_probe(probe, quick, replot=False):
    """
    一次调用（周期是中位数的那次）的时间线：每个程序一条横线，从 gdc_wait 放行到完成（蓝 = 第一步，读完 K/V；
    橙 = 合并，写完）。
    左：整次调用；右：放大最后几 µs（PROBE_PHASES 里读 K/V 之后的几段，底色标出各段）。
    """
    plt = pyplot()
    br = probe_breakdown(probe)
    c = median_call(br)
    i = br["calls"].index(c)
    t0 = min(r[1] for r in probe["k1"][i])
    k1 = sorted(probe["k1"][i], key=lambda r: r[2])
    merge = sorted(probe["merge"][i], key=lambda r: r[2])
    base = len(k1) + 10
    fig, axes = plt.subplots(1, 2, figsize=(16, 7), sharey=True, gridspec_kw=dict(width_ratios=[1.4, 1]))
    for ax in axes:
        for y, r in enumerate(k1):
            ax.plot([(r[1] - t0) / 1e3, (r[2] - t0) / 1e3], [y, y], color="tab:blue", lw=1.5)
        for y, r in enumerate(merge):
            ax.plot([(r[1] - t0) / 1e3, (r[2] - t0) / 1e3], [base + y, base + y], color="tab:orange", lw=1.5)
        ax.axvline(c["period"], color="k", ls="--", lw=1.2)
    a1, a2 = axes
    a1.text(0.5, base + len(merge) / 2, f"split-KV kernel: {len(k1)} programs (blue),\n"
            f"each reads 1/{len(k1)} of K/V\nmerge kernel: {len(merge)} programs (orange)", va="center")
    a1.set_xlim(-0.5, c["period"] + 1)
    a1.set_xlabel("µs since the split-KV kernel was released")
    a1.set_title(f"whole call: {c['period']:.1f} µs")
    # 右图：读 K/V 之后的几段
    x = c["stream"]
    colors = ("#9fc5e8", "#d9d9d9", "#f9cb9c", "#b7b7b7")
    labels = {"tail": "slowest\nprograms", "to_merge": "hand-off", "merge": "merge", "to_next": "next\nlaunch"}
    for j, ((name, _), color) in enumerate(zip(PROBE_PHASES[1:], colors)):
        a2.axvspan(x, x + c[name], color=color, alpha=0.5, lw=0)
        # 相邻两段的标签一高一低：某一段很短时（< 0.3 µs）两段的字也不会挤在一起
        a2.text(x + c[name] / 2, 0.99 if j % 2 == 0 else 0.87, f"{labels[name]}\n{c[name]:.2f} µs",
                transform=a2.get_xaxis_transform(), ha="center", va="top")
        x += c[name]
    a2.set_xlim(c["stream"] - 0.6, c["period"] + 0.9)
    a2.set_xlabel("µs (zoom into the end of the call)")
    a2.set_title(f"after the median program: {c['period'] - c['stream']:.1f} µs")
    a2.text(c["period"], base / 2, " next call\n released", ha="left", va="center")
    a1.set_yticks([])
    a1.set_ylim(-2, base + len(merge) + 110)            # 上面留给右图各段的标签（两排）
    fig.suptitle(f"One flash_decode call (B = {probe['B']}, S = {probe['S'] // 1024}k, bf16), "
                 "per-program %globaltimer probes", y=0.995)
    return save_figure(fig, __file__, "timeline", quick=quick, path=committed_png("timeline", replot))

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--measure", action="store_true", help="在 GPU 上测量并写 JSON")
    ap.add_argument("--sweep", action="store_true", help="--measure 时先扫一遍内核配置 × 段数")
    ap.add_argument("--out", default=os.path.dirname(RESULTS),
                    help="--measure 把 decode_bench.json 写进哪个目录（和 triton_bench、ncu_profile 的一样是目录）")
    ap.add_argument("--quick", action="store_true",
                    help="只读已提交的结果；图进 figures/quick/（同样的图、同样大；不带参数时进 figures/）")
    ap.add_argument("--compare", action="store_true",
                    help="--measure 测完打印和已提交的 decode_bench.json 的比（GPU 时间、主机开销）")
    ap.add_argument("--replot", action="store_true",
                    help="只读已提交的结果，并重画已提交的 results/decode_bench_bandwidth.png、decode_bench_models.png")
    args = ap.parse_args(argv)
    if args.measure:
        return measure(args)
    res = load_json(RESULTS)
    if res is None:
        print(f"SKIP: 还没有 {os.path.relpath(RESULTS)}（在 GPU 上运行 --measure 生成）")
        return SKIP
    print("=== 1. 一次 decode 注意力：三种实现 ===")
    print_table(res)
    print("\n=== 2. 正确性 ===")
    problems = check_correctness(res)
    print("\n=== 3. 目标 ===")
    target_report(res)
    print("\n=== 4. 主机开销（B = 1）===")
    print_overhead(res)
    print("\n=== 5. 校准第 4 节的 decode_attention_time（DecodeGPU 的 sm_bw_cap、launch）===")
    _, decode_rows = print_decode_fit(res)
    step_res = load_json(STEP_RESULTS)
    timeline_table = []
    print("\n=== 6. 校准第 5 节的时间线模型 ===")
    if step_res is None:
        print(f"  （没有 {os.path.relpath(STEP_RESULTS)}：跳过；"
              "在 GPU 上运行 lecture05/bench/step_calibration.py --measure）")
    else:
        _, _, timeline_table = print_timeline_fit(res, step_res)
    print("\n=== 7. 一次调用的时间线（内核里的计时探针，读 %globaltimer）===")
    print_probe(res)
    for path in plot(res, decode_rows, timeline_table, args.quick, replot=args.replot):
        print(f"图：{os.path.relpath(path)}")
    if problems:
        print(f"✗ 第 2 部分有 {problems} 处正确性问题：退出码 1")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
