# ruff: noqa: E501, B007
"""（试验记录：在 GPU 上跑的是 .gpu/alloc_try.py，只有文件名不同；用法 python3 lecture11/results/decode_order_try.py $OUT）
同一个形状（B = 1、S = 32k）在几块不同的显存上：flash_decode 读 K/V 的时间差多少？换一种块的读取顺序能不能不受影响？
变体：base = triton_flash.flash_decode；o0 / o1 / o2 = 试验内核（合并 m:32:1）的三种顺序：连续 / 各段错开相位 / 交错；sdpa。"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_merge_try as it  # noqa: E402

torch, tf, bench = it.torch, it.tf, it.bench
NALLOC = 5
ROUNDS = 3


def fns_for(q, k, v, lens):
    f = {"base": lambda: tf.flash_decode(q, k, v, lens)}
    for order in (0, 1, 2):
        f[f"o{order}"] = it.Variant(q, k, v, lens, "m:32:1", order=order)
    f["sdpa"] = bench.impl_fns(torch, tf, q, k, v, lens)["sdpa"]
    return f


def main(out_dir):
    t0 = time.time()
    copy = bench.copy_bandwidth(torch)["best"]
    res = dict(copy_Bps=copy, meta=bench.gpu_meta(torch), rows=[])
    for B, S, nalloc in ((1, 32768, NALLOC), (1, 131072, 2), (8, 32768, 2), (1, 8192, 2)):
        allocs = [bench.make_inputs(torch, B, S, seed=a) for a in range(nalloc)]
        kv = 2 * B * S * bench.HK * bench.D * 2
        fns = [fns_for(*x) for x in allocs]
        errs = []
        for a, f in enumerate(fns):
            ref = f["base"]().double()
            errs.append({n: tf._rel_err(g().double(), ref) for n, g in f.items()})
        times = [{n: [] for n in f} for f in fns]
        for _ in range(ROUNDS):
            for a, f in enumerate(fns):
                for n, g in f.items():
                    times[a][n].append(bench.graph_time(torch, g, target_s=2e-3, trials=3))
        for a in range(nalloc):
            line = f"B={B} S={S:<6d} alloc {a} k.data_ptr {allocs[a][1].data_ptr():#x}: "
            for n in fns[a]:
                t = min(times[a][n])
                res["rows"].append(dict(B=B, S=S, alloc=a, variant=n, gpu_s=t, rounds=times[a][n], err=errs[a][n],
                                        copy_frac=kv / t / copy))
                line += f" {n} {t * 1e6:7.2f}({100 * kv / t / copy:4.1f}%)"
            print(line + f"  maxerr {max(e for n, e in errs[a].items() if n != 'sdpa'):.1e}", flush=True)
        del allocs, fns
        torch.cuda.empty_cache()
    need = 2 * 32768 * bench.HK * bench.D * 2 / (0.9 * copy)
    print(f"copy {copy / 1e12:.2f} TB/s; 90% at B=1 S=32k needs <= {need * 1e6:.2f} µs ({time.time() - t0:.0f} s)")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "decode_order_try.json"), "w") as fh:
        json.dump(res, fh)


if __name__ == "__main__":
    main(sys.argv[1])
