"""
第 18 讲 · 演示 2：分块前向——torch 分块版、F.scaled_dot_product_attention、第 11 讲的 numpy flash_fwd

你会看到：
    1. 同样的数：不整除的形状、N ≠ Nk、causal 右下角对齐（含 N > Nk 时没有可见 key 的行）下，
       torch 分块版（float64 / float32）、SDPA、第 11 讲的 numpy flash_fwd 和显式的 float64 参考一致，
       lse 也一致。
    2. 各自把中间结果放在哪：标准写法把 [b, n, N, Nk] 的 S、P 落在内存里；分块版同一时刻只有一块 [b, n, br, bc]
       的分数和每个 query 块的状态 (m, ℓ, o)；SDPA 和 GPU 内核把它们放在内核内部（片上）。用 MemoryMeter 量出来。
    3. 速度（CPU 上）：Python 循环的分块版比 SDPA 慢得多——分块省的是内存，快要靠把循环写进一个内核
       （第 11 讲的 Triton 版；有 CUDA 时这里也比一比）。

第 11 讲也有一个叫 flash_lab 的模块（numpy）。本脚本以 flash_lab 导入第 18 讲的模块，
再按文件路径把第 11 讲的那个加载成另一个名字（lecture11_flash_lab），两者互不覆盖。

运行：python3 lecture18/02_blockwise_forward.py [--quick] [--seed 0]
"""
import argparse
import importlib.util
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import flash_lab as fl  # noqa: E402


def load_lecture11_flash_lab():
    """按路径加载 ../lecture11/flash_lab.py，登记成 "lecture11_flash_lab"（不占用裸名字 flash_lab）。"""
    name = "lecture11_flash_lab"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "..", "lecture11", "flash_lab.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


CASES = (  # (b, n, N, Nk, d, dv, br, bc, causal)
    (2, 3, 100, 100, 16, 16, 16, 24, False),
    (1, 2, 37, 91, 8, 5, 10, 7, True),
    (2, 2, 64, 40, 12, 12, 9, 13, True),
)


def same_numbers(gen, fa11):
    """第 1 部分：四种写法 vs 显式的 float64 参考。"""
    rows = []
    for b, n, N, Nk, d, dv, br, bc, causal in CASES:
        q = torch.randn(b, n, N, d, generator=gen, dtype=torch.float64)
        k = torch.randn(b, n, Nk, d, generator=gen, dtype=torch.float64)
        v = torch.randn(b, n, Nk, dv, generator=gen, dtype=torch.float64)
        O_ref, lse_ref = fl.vanilla_attention(q, k, v, causal, return_lse=True)
        fin = torch.isfinite(lse_ref)
        O64, lse64 = fl.blockwise_attention_fwd(q, k, v, br, bc, causal)
        O32, lse32 = fl.blockwise_attention_fwd(q.float(), k.float(), v.float(), br, bc, causal)
        O_sdpa = fl.sdpa_attention(q.float(), k.float(), v.float(), causal)
        O_np = torch.zeros_like(O_ref)
        L_np = torch.zeros_like(lse_ref)
        for i in range(b):                                    # 第 11 讲的 flash_fwd 一次算一个头 [N, d]
            for h in range(n):
                o, L, _ = fa11.flash_fwd(q[i, h].numpy(), k[i, h].numpy(), v[i, h].numpy(), br, bc, causal)
                O_np[i, h], L_np[i, h] = torch.from_numpy(o), torch.from_numpy(L)
        errs = {}
        for name, O, lse in (("blockwise fp64", O64, lse64), ("blockwise fp32", O32, lse32),
                             ("SDPA fp32", O_sdpa, None), ("lecture11 numpy", O_np, L_np)):
            e_o = (O.double() - O_ref).abs().max().item()
            e_l = "—" if lse is None else f"{(lse.double()[fin] - lse_ref[fin]).abs().max().item():.1e}"
            same_empty = lse is None or torch.equal(torch.isneginf(lse), torch.isneginf(lse_ref))
            errs[name] = e_o
            assert same_empty
            rows.append([f"{b}×{n}×{N}×{Nk}, d={d}, dv={dv}", f"{br}×{bc}", causal, name, f"{e_o:.1e}", e_l])
        assert errs["blockwise fp64"] < 1e-12 and errs["lecture11 numpy"] < 1e-12
        assert errs["blockwise fp32"] < 1e-5 and errs["SDPA fp32"] < 1e-5
    print(fl.format_table(["b×n×N×Nk", "块 br×bc", "causal", "写法", "O 的最大差", "lse 的最大差"], rows))
    print("N = 64 > Nk = 40 且 causal：前 24 行一个 key 也看不见，四种写法都给 O = 0、lse = −∞"
          "（SDPA 给 NaN，sdpa_attention 按约定换成 0）。")


def where_intermediates_live(gen, N, br, bc):
    """第 2 部分：前向（不求导）时各写法最大的单个中间张量。"""
    b, n, d = 1, 4, 64
    q, k, v = (torch.randn(b, n, N, d, generator=gen) for _ in range(3))
    runs = {"vanilla": lambda: fl.vanilla_attention(q, k, v, True),
            "blockwise": lambda: fl.blockwise_attention_fwd(q, k, v, br, bc, True),
            "SDPA": lambda: fl.sdpa_attention(q, k, v, True)}
    where = {"vanilla": f"S, P: [b, n, N, Nk] = {b}×{n}×{N}×{N}，整块在内存里",
             "blockwise": f"一块分数 [b, n, br, bc] = {b}×{n}×{br}×{bc}；每个 query 块的 (m, ℓ, o)；输出 O",
             "SDPA": "内核内部（CPU 上是 C++ 的分块循环，GPU 上在片上）：这里只看得见输出 O"}
    rows = []
    largest = {}
    for name, run in runs.items():
        with torch.no_grad(), fl.MemoryMeter() as mm:
            run()
        largest[name] = mm.largest
        rows.append([name, fl.fmt_bytes(mm.largest), fl.fmt_bytes(mm.peak), where[name]])
    print(fl.format_table(["写法", "最大的单个张量", "峰值", "中间结果在哪"], rows))
    print(f"（FP32、causal、N = Nk = {N}、{n} 个头、d = {d}；MemoryMeter 只数算子产出的张量）")
    assert largest["vanilla"] == b * n * N * N * 4
    assert largest["blockwise"] == b * n * N * d * 4                  # 最大的是输出 O 本身
    print("第 11 讲的 numpy 版和 torch 分块版是同一个循环（外层 Q 块、内层 K/V 块）；"
          "它另外数出了每块数据读写显存的次数（IO）。")


def timing(gen, N, br, bc):
    """第 3 部分：CPU 上的时间（和 GPU 上的 Triton 版，如果有的话）。"""
    b, n, d = 1, 4, 64
    rows = []
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:
        qkv = [torch.randn(b, n, N, d, generator=gen).to(dev) for _ in range(3)]
        runs = {"vanilla": lambda t: fl.vanilla_attention(*t, True),
                "SDPA": lambda t: fl.sdpa_attention(*t, True),
                "blockwise (Python loop)": lambda t: fl.blockwise_attention_fwd(*t, br, bc, True)}
        if dev == "cuda" and fl.triton_available(qkv[0]):
            runs["flash_attention (Triton)"] = lambda t: fl.flash_attention(*t, True)
        for name, run in runs.items():
            rows.append([dev, name, f"{best_time(run, qkv, dev) * 1e3:.2f} ms"])
    print(fl.format_table(["设备", "写法", "一次前向"], rows))
    print(f"（FP32、causal、N = Nk = {N}、{n} 个头、d = {d}、块 {br}×{bc}；取 3 次中最快的一次）")


def best_time(fn, args, dev, reps=3):
    """fn(args) 的最快一次（秒）。"""
    fn(args)                                                  # 预热（Triton 第一次要编译）
    best = float("inf")
    for _ in range(reps):
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            fn(args)
        if dev == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description="分块前向：torch 分块版 vs SDPA vs 第 11 讲的 numpy flash_fwd")
    ap.add_argument("--quick", action="store_true", help="小规模：N = 256")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)          # 分块算法是许多小矩阵乘法：单线程反而快；计时也更稳
    print(f"随机种子 seed = {args.seed}")
    gen = torch.Generator().manual_seed(args.seed)
    fa11 = load_lecture11_flash_lab()
    N = 256 if args.quick else 1024

    print("\n== 1. 同样的数：和显式的 float64 参考比 ==")
    same_numbers(gen, fa11)
    print("\n== 2. 中间结果放在哪（前向，不求导）==")
    where_intermediates_live(gen, N, 64, 64)
    print("\n== 3. 速度 ==")
    timing(gen, N, 64, 64)

    print("\n结论：分块只是换了计算顺序，数一个不差；它把 N×Nk 的中间结果换成一块 br×bc 加每行三个数的状态。"
          "用 Python 循环写它省内存不省时间，快要靠把整个循环放进一个内核。")


if __name__ == "__main__":
    main()
