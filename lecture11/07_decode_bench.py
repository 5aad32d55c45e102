"""
07 · flash-decoding 上 GPU：split-KV 内核读 K/V 能到拷贝带宽的几成？第 4 节的时间模型离真机多远？

你会看到（数字来自已提交的 lecture11/results/decode_bench.json，H200、bf16；没有 GPU 也能看）
  1. 一次 decode 注意力（每个序列 1 个新 token）：B ∈ {1, 8, 64} × S ∈ {1k, 8k, 32k, 128k}，Hq / Hk = 32 / 8，
     d = 128。三种实现：我们的 triton_flash.flash_decode（v3，split-KV + GQA 打包）、SDPA（enable_gqa=True）、
     我们的 flash_attn_func 的单 query 路径（FlashAttention-2 的并行方式：每个 (序列, query 头) 一个程序）。
     时间是 CUDA 图里重放的 GPU 时间；带宽 = K/V 字节数 / 时间，和同一次运行里实测的拷贝带宽比。
  2. 主机开销：小形状上连续调用的每次墙钟时间 − GPU 时间（µs），以及 CUDA 图能否捕获、结果是否逐位一致。
  3. 启动间隙：一个空内核在 stream 里和在 CUDA 图里每个多少 µs（第 5 节时间线模型的 launch 参数）。
  4. 校准：flash_lab.decode_attention_time 用假设的 sm_bw_cap、launch 预测的时间 vs 实测，拟合这两个参数，
     拟合前后每个点的误差（见 flash_lab.H200_DEC_MEASURED 的文档）。
  5. 图：lecture11/figures/07_decode_bench_*.png

单位：时间 µs，带宽 TB/s（10^12 字节/秒），K/V 字节 = B·S·Hk·d·2（K 和 V）·2（bf16）。

在 GPU 上重新测（写 lecture11/results/decode_bench.json，约 3 分钟）：
    python3 lecture11/07_decode_bench.py --measure [--sweep]
只读结果、打印、画图（没有 GPU 也行；check-all 跑的就是这个）：
    python3 lecture11/07_decode_bench.py [--quick]
"""
import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))
from course_utils import format_table  # noqa: E402

SKIP = 77
RESULTS = os.path.join(HERE, "results", "decode_bench.json")
HQ, HK, D = 32, 8, 128
BATCHES = (1, 8, 64)
SEQLENS = (1024, 8192, 32768, 131072)
IMPLS = ("ours", "sdpa", "fa2")
OVERHEAD_S = (1024, 8192)                        # 主机开销：B = 1 的小形状
SWEEP_SHAPES = ((1, 1024), (1, 8192), (1, 32768), (1, 131072), (8, 1024), (8, 8192), (8, 32768), (64, 1024),
                (64, 8192))
SWEEP_CONFIGS = [(128, 4, 3), (64, 4, 3), (64, 4, 4)]
SWEEP_SPLITS = (1, 2, 4, 8, 16, 32, 33)


# =============================================================================
# GPU 上的计时工具
# =============================================================================
def graph_time(torch, fn, target_s=2e-3, trials=5):
    """
    fn() 一次的 GPU 时间（秒）：把 reps 次调用捕获进一张 CUDA 图，重放 trials 次取最快。图里没有主机开销，
    所以这是内核（含内核之间的空档）的时间。reps 让一次重放大约 target_s 秒。
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                 # 捕获前在旁路 stream 上热身（编译、快速路径的记录都在图外）
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    reps = max(3, min(200, int(target_s / max(time.perf_counter() - t0, 1e-6))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    best = float("inf")
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / reps)
    del graph
    return best


def wall_per_call(torch, fn, calls):
    """连续调用 calls 次的墙钟时间 / calls（秒）：主机比 GPU 慢时，这就是每次调用的主机时间。"""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls


def gpu_meta(torch, triton):
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        driver = "unknown"
    return dict(gpu=torch.cuda.get_device_name(), driver=driver, torch=torch.__version__, triton=triton.__version__,
                cuda=torch.version.cuda, n_sm=torch.cuda.get_device_properties(0).multi_processor_count,
                date=datetime.date.today().isoformat(), dtype="bfloat16", Hq=HQ, Hk=HK, d=D)


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
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            sleep(0)
    graph.replay()
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / n)
    res["graph_s"] = best
    res["host_launch_s"] = wall_per_call(torch, lambda: sleep(0), 5 * n)
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
    """三种实现，输出都是 [B, Hq, d]。SDPA 和 fa2 直接看整个缓存（这里 L = S_max，缓存是满的）。"""
    F = torch.nn.functional
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)                     # [B, Hk, S, d] 的视图，不拷贝
    q4 = q.unsqueeze(2)                                               # [B, Hq, 1, d]
    return {
        "ours": lambda: tf.flash_decode(q, k, v, lens),
        "sdpa": lambda: F.scaled_dot_product_attention(q4, kt, vt, enable_gqa=True).squeeze(2),
        "fa2": lambda: tf.flash_attn_func(q.unsqueeze(1), k, v).squeeze(1),
    }


def rel_err(torch, x, ref):
    x, ref = x.double(), ref.double()
    err = float((x - ref).norm() / ref.norm())
    return err if math.isfinite(err) else float("inf")


def measure_table(torch, tf):
    rows = []
    for B in BATCHES:
        for S in SEQLENS:
            q, k, v, lens = make_inputs(torch, B, S)
            kv_bytes = 2 * B * S * HK * D * 2
            fns = impl_fns(torch, tf, q, k, v, lens)
            ref = fns["sdpa"]()
            for name, fn in fns.items():
                try:
                    err = rel_err(torch, fn(), ref)
                    t = graph_time(torch, fn)
                    eager = wall_per_call(torch, fn, 50)
                except torch.OutOfMemoryError as e:
                    print(f"  B={B} S={S} {name}: 显存不够（{str(e).splitlines()[0][:80]}）", flush=True)
                    rows.append(dict(B=B, S=S, impl=name, error="oom"))
                    torch.cuda.empty_cache()
                    continue
                rows.append(dict(B=B, S=S, impl=name, gpu_s=t, eager_s=eager, kv_bytes=kv_bytes, err_vs_sdpa=err,
                                 splits=tf.decode_splits(B, HK, S, tf._sm_count(q.device)) if name == "ours" else None))
                print(f"  B={B:<3d}S={S:<7d}{name:<5s} GPU {t * 1e6:9.1f} µs  {kv_bytes / t / 1e12:5.2f} TB/s  "
                      f"连续调用 {eager * 1e6:9.1f} µs/次  和 SDPA 的相对差 {err:.1e}", flush=True)
            del q, k, v, lens, fns, ref
            torch.cuda.empty_cache()
    return rows


def measure_overhead(torch, tf, calls=3000):
    """B = 1 的小形状：每次调用的墙钟时间（主机）− GPU 时间；CUDA 图捕获后换输入重放 = 直接调用（逐位）。"""
    rows = []
    for S in OVERHEAD_S:
        q, k, v, lens = make_inputs(torch, 1, S)
        fns = impl_fns(torch, tf, q, k, v, lens)
        for name in ("ours", "sdpa"):
            fn = fns[name]
            gpu = graph_time(torch, fn)
            wall = wall_per_call(torch, fn, calls)
            rows.append(dict(S=S, impl=name, wall_s=wall, gpu_s=gpu, over_s=wall - gpu,
                             graph_ok=graph_matches_eager(torch, fn, (q, k, v))))
            print(f"  主机开销 S={S:<6d}{name:<5s} 每次调用 {wall * 1e6:6.1f} µs  GPU {gpu * 1e6:6.1f} µs  "
                  f"多出 {(wall - gpu) * 1e6:6.1f} µs  CUDA 图逐位一致：{rows[-1]['graph_ok']}", flush=True)
    q, k, v, lens = make_inputs(torch, 1, 1024)
    parts = {"key": lambda: tf._decode_key(q, k, v, lens, None, None),
             "empty_like": lambda: torch.empty_like(q),
             "flash_decode": lambda: tf.flash_decode(q, k, v, lens)}
    host = {name: wall_per_call(torch, fn, calls) for name, fn in parts.items()}
    for name, t in host.items():
        print(f"  主机时间的一块：{name:<14s}{t * 1e6:6.2f} µs", flush=True)
    return dict(rows=rows, parts=host, plan_launches=tf._Plan.launches)


def graph_matches_eager(torch, fn, inputs):
    """把 fn() 捕获进 CUDA 图；原地换一组输入后重放，和直接调用逐位比较。"""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    for t in inputs:
        t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    return bool(torch.equal(out, fn()))


def sweep(torch, tf):
    """调参：几个形状上，每个 (BLOCK_N, warps, stages) × 段数 的 GPU 时间（直接调 tf._decode，绕开启发式）。"""
    rows = []
    for B, S in SWEEP_SHAPES:
        q, k, v, lens = make_inputs(torch, B, S)
        kv_bytes = 2 * B * S * HK * D * 2
        for cfg in SWEEP_CONFIGS:
            for splits in SWEEP_SPLITS:
                if splits * cfg[0] > S:
                    continue
                try:
                    t = graph_time(torch, lambda q=q, k=k, v=v, lens=lens, s=splits, c=cfg:
                                   tf._decode(q, k, v, lens, s, None, c), target_s=1e-3, trials=3)
                except Exception as e:                 # 编译失败（共享内存不够等）：记下原因，接着测
                    rows.append(dict(B=B, S=S, config=cfg, splits=splits, error=str(e).splitlines()[0][:160]))
                    continue
                rows.append(dict(B=B, S=S, config=cfg, splits=splits, gpu_s=t, tbps=kv_bytes / t / 1e12))
        best = min((r for r in rows if r["B"] == B and r["S"] == S and "gpu_s" in r), key=lambda r: r["gpu_s"])
        print(f"  sweep B={B} S={S}: 最快 {best['config']} × {best['splits']} 段 = "
              f"{best['gpu_s'] * 1e6:.1f} µs（{best['tbps']:.2f} TB/s）", flush=True)
        torch.cuda.empty_cache()
    return rows


def stress(torch, tf, calls=500):
    """
    草稿区在调用之间复用：如果哪一次读到了上一次留下的段，结果会偶尔不一样。
    同一输入连着算 calls 次，和第一次逐位比较，数不一致的次数。
    """
    res = {}
    for B, S, splits in ((1, 32768, 32), (1, 4096, 64), (8, 8192, 16)):
        q, k, v, lens = make_inputs(torch, B, S)
        first = tf.flash_decode(q, k, v, lens, num_splits=splits)
        outs = [tf.flash_decode(q, k, v, lens, num_splits=splits) for _ in range(calls)]
        bad = sum(not torch.equal(o, first) for o in outs)
        res[f"B={B} S={S} splits={splits}"] = bad
        print(f"  压力测试 B={B} S={S} {splits} 段：{calls} 次里和第一次不逐位相同的 {bad} 次", flush=True)
    return res


def measure(args):
    import torch
    import triton
    import triton_flash as tf
    if not torch.cuda.is_available():
        print("SKIP: --measure 需要 CUDA GPU")
        return SKIP
    t0 = time.time()
    res = dict(meta=gpu_meta(torch, triton))
    res["meta"]["decode_config"] = list(tf.DECODE_CONFIG)
    res["copy"] = copy_bandwidth(torch)
    res["copy_Bps"] = res["copy"]["best"]
    print("拷贝带宽（读 + 写）：" + "  ".join(f"{k} {v / 1e12:.2f} TB/s" for k, v in res["copy"].items()), flush=True)
    res["launch"] = launch_gap(torch)
    print("启动间隙：" + "  ".join(f"{k} {v * 1e6:.2f} µs" for k, v in res["launch"].items()), flush=True)
    if args.sweep:
        res["sweep"] = sweep(torch, tf)
    res["stress"] = stress(torch, tf)
    res["rows"] = measure_table(torch, tf)
    res["overhead"] = measure_overhead(torch, tf)
    res["meta"]["seconds"] = time.time() - t0
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"写好 {args.out}（{time.time() - t0:.0f} s）")
    return 0


# =============================================================================
# 读结果、打印（没有 GPU 也行）
# =============================================================================
def load(path):
    if not os.path.isfile(path):
        return None
    with open(path) as fh:
        return json.load(fh)


def print_table(res):
    meta = res["meta"]
    copy = res["copy_Bps"]
    print(f"GPU：{meta['gpu']}  driver {meta['driver']}  torch {meta['torch']}  triton {meta['triton']}  "
          f"（{meta['date']}）；拷贝带宽 {copy / 1e12:.2f} TB/s")
    by = {(r["B"], r["S"], r["impl"]): r for r in res["rows"] if "gpu_s" in r}
    table = []
    for B in BATCHES:
        for S in SEQLENS:
            cells = [B, S]
            for impl in IMPLS:
                r = by.get((B, S, impl))
                cells += ["—", "—"] if r is None else [f"{r['gpu_s'] * 1e6:.1f}",
                                                       f"{r['kv_bytes'] / r['gpu_s'] / copy:.0%}"]
            o, s = by.get((B, S, "ours")), by.get((B, S, "sdpa"))
            cells.append("—" if o is None or s is None else f"{s['gpu_s'] / o['gpu_s']:.2f}")
            table.append(cells)
    print(format_table(["B", "S", "ours µs", "ours/copy", "sdpa µs", "sdpa/copy", "fa2 µs", "fa2/copy",
                        "speedup vs sdpa"], table))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--measure", action="store_true", help="在 GPU 上测量并写 JSON")
    ap.add_argument("--sweep", action="store_true", help="--measure 时先扫一遍内核配置 × 段数")
    ap.add_argument("--out", default=RESULTS, help="--measure 写到哪里")
    ap.add_argument("--quick", action="store_true", help="只打印、画小图（check-all 用）")
    args = ap.parse_args(argv)
    if args.measure:
        return measure(args)
    res = load(RESULTS)
    if res is None:
        print(f"SKIP: 还没有 {os.path.relpath(RESULTS)}（在 GPU 上运行 --measure 生成）")
        return SKIP
    print_table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
