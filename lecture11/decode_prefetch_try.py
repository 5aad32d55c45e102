"""
flash_decode 的两个试验（GPU 上一次跑完，H200 上 < 90 s）：
  1. prefetch=True：第一块 K/V 不等 cache_seqlens（triton_flash._decode_kernel 的 PREFETCH，默认关）；
  2. 段数：B = 1 时 Hk·段数 个程序对 132 个 SM（12、16、17、20、24 段；17 段 = 136 个程序，没有整数段数正好 132）。
形状：Hq / Hk = 32 / 8，d = 128，bf16，缓存是满的（L = S_max）；B = 1 × S ∈ {8k, 32k, 128k}，S = 32k × B ∈ {8, 64}。
对照：默认的 flash_decode、SDPA（enable_gqa）。时间 = CUDA 图里重放的 GPU 时间，各实现轮流测 3 轮取最快
（07_decode_bench.py 的 graph_time）；拷贝带宽同 07（torch.neg 逐元素内核，读 + 写）。
每个输出和默认 flash_decode 的输出比：最大绝对差、相对差（上限 = 07 的 DECODE_TOL）。另外先在不满的缓存上
（L_b < S_max，缓存里 L_b 之后是 NaN；有的段猜中、有的没猜中）查 prefetch=True 对 float64 参考的误差
（triton_flash.decode_limit：< 2 × 同 dtype 的 SDPA 的误差）。

用法（仓库根目录）：python3 lecture11/decode_prefetch_try.py OUT_DIR   → 打印表格，写 $OUT/decode_try.json；
没有 CUDA 时打印原因，退出码 77（和 07 的 SKIP 相同）；有输出超过上限时退出码 1。
"""
import importlib.util
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = 77
B1_SHAPES = ((1, 8192), (1, 32768), (1, 131072))
BATCH_SHAPES = ((8, 32768), (64, 32768))
SPLITS_B1 = (12, 16, 17, 20, 24)
FORCED_CONFIG = (64, 4, 4)          # S = 8k 时规则选 (128, 4, 3)，那个块太大不预取：另外强制 (64, 4, 4) 对照
ROUNDS = 3
# 预取的正确性（GPU 上编译出来的内核）：(名字, lengths, S_max, Hq, Hk, d, n, 段数, 配置)，都是真的会预取的块
PREFETCH_CASES = [
    ("n=1 GQA4 L<S_max (64,4,4)", [4091, 2051, 100], 4096, 32, 8, 128, 1, 16, (64, 4, 4)),
    ("n=3 GQA4 (64,4,4)", [4096, 1000], 4096, 32, 8, 128, 3, 16, (64, 4, 4)),
    ("n=1 MHA d=64 (128,4,3)", [777, 3000], 3000, 8, 8, 64, 1, 5, (128, 4, 3)),
]
TARGET_FRAC = 0.90                  # 目标：≥ 90% 拷贝带宽


def load_bench():
    """07_decode_bench.py（文件名以数字开头，不能直接 import）：它把 lecture11、lecture01 加进 sys.path。"""
    path = os.path.join(ROOT, "lecture11", "07_decode_bench.py")
    spec = importlib.util.spec_from_file_location("decode_bench_07", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_prefetch(torch, tf):
    """PREFETCH_CASES 逐个：prefetch=True 的输出对 float64 参考的误差 < decode_limit。返回 [(名字, 误差, 上限)]。"""
    gen = torch.Generator().manual_seed(0)
    res = []
    for name, lengths, s_max, hq, hk, d, n, splits, cfg in PREFETCH_CASES:
        assert tf.decode_prefetch_used(True, cfg[0], d), name
        q, k, v, lens = tf.make_decode_case(gen, len(lengths), lengths, s_max, hq, hk, d, n, torch.bfloat16, "cuda")
        ref = tf.reference_decode(q, k, v, lens)
        err = tf._rel_err(tf._decode(q, k, v, lens, splits, None, cfg, prefetch=True), ref)
        limit = tf.decode_limit(q, k, v, lens, ref)
        res.append((name, err, limit))
        mark = "" if err < limit else " ✗"
        print(f"  预取的正确性 {name:<28s} 对 float64 参考 {err:.1e}（上限 {limit:.1e}）{mark}", flush=True)
    return res


def variants(tf, bench, torch, B, S, q, k, v, lens):
    """(名字, fn, 段数, 配置, 要不要预取)：fn() 返回 [B, Hq, d]。"""
    n_sm = tf._sm_count(q.device)
    plan = tf.decode_plan(B, bench.HK, S, n_sm)
    out = [("default", lambda: tf.flash_decode(q, k, v, lens), plan, False),
           ("prefetch", lambda: tf.flash_decode(q, k, v, lens, prefetch=True), plan, True)]
    if B == 1:
        for s in SPLITS_B1:
            p = tf.decode_plan(B, bench.HK, S, n_sm, s)
            out.append((f"splits={s}", lambda s=s: tf.flash_decode(q, k, v, lens, num_splits=s), p, False))
            out.append((f"splits={s}+prefetch", lambda s=s: tf.flash_decode(q, k, v, lens, num_splits=s,
                                                                              prefetch=True), p, True))
        if plan[0] != FORCED_CONFIG:
            p = tf.decode_plan(B, bench.HK, S, n_sm, config=FORCED_CONFIG)
            for pre in (False, True):
                out.append((f"cfg{'x'.join(map(str, FORCED_CONFIG))}" + ("+prefetch" if pre else ""),
                            lambda pre=pre: tf._decode(q, k, v, lens, None, None, FORCED_CONFIG, prefetch=pre), p, pre))
    sdpa = bench.impl_fns(torch, tf, q, k, v, lens)["sdpa"]
    out.append(("sdpa", sdpa, None, False))
    return out


def measure_shape(torch, tf, bench, B, S, copy_bps):
    q, k, v, lens = bench.make_inputs(torch, B, S)
    kv_bytes = 2 * B * S * bench.HK * bench.D * 2
    fns = variants(tf, bench, torch, B, S, q, k, v, lens)
    ref = fns[0][1]().float()
    outs = {name: fn().float() for name, fn, _, _ in fns}
    times = {name: [] for name, *_ in fns}
    for _ in range(ROUNDS):                    # 轮流测（同 07 的 measure_table）：频率、温度对各实现一样
        for name, fn, _, _ in fns:
            times[name].append(bench.graph_time(torch, fn, target_s=1e-3, trials=3))
    rows = []
    for name, _, plan, pre in fns:
        t = min(times[name])
        diff = outs[name] - ref
        rel = tf._rel_err(outs[name].double(), ref.double())
        row = dict(B=B, S=S, variant=name, gpu_s=t, gpu_rounds_s=times[name], tbps=kv_bytes / t / 1e12,
                   copy_frac=kv_bytes / t / copy_bps, max_abs_diff=float(diff.abs().max()), rel_err=rel,
                   ok=bool(rel < bench.DECODE_TOL))
        if plan is not None:
            (block_n, warps, stages), splits = plan
            row.update(config=[block_n, warps, stages], splits=splits, programs=B * bench.HK * splits,
                       prefetch=pre, prefetch_used=tf.decode_prefetch_used(pre, block_n, bench.D))
        rows.append(row)
    del q, k, v, lens, fns, outs, ref
    torch.cuda.empty_cache()
    return rows


def print_rows(bench, rows):
    base = {(r["B"], r["S"]): r["gpu_s"] for r in rows if r["variant"] == "default"}
    table = []
    for r in rows:
        cfg = "" if "config" not in r else "(" + ",".join(map(str, r["config"])) + ")"
        table.append([r["B"], r["S"], r["variant"], cfg, r.get("splits", ""), r.get("programs", ""),
                      {True: "yes", False: "no"}.get(r.get("prefetch_used"), ""),
                      f"{r['gpu_s'] * 1e6:.2f}", f"{(r['gpu_s'] - base[r['B'], r['S']]) * 1e6:+.2f}",
                      f"{r['tbps']:.2f}", f"{r['copy_frac'] * 100:.1f}%",
                      f"{r['max_abs_diff']:.1e}", f"{r['rel_err']:.1e}" + ("" if r["ok"] else " ✗")])
    print(bench.format_table(["B", "S", "变体", "配置", "段数", "程序数", "预取", "GPU µs", "Δ默认 µs", "TB/s",
                              "占拷贝带宽", "max|Δ|", "相对差"], table,
                             align=["<", ">", "<", "<", ">", ">", "<", ">", ">", ">", ">", ">", ">"]))


def main(argv):
    out_dir = argv[1] if len(argv) > 1 else os.environ.get("OUT")
    if not out_dir:
        print("用法：python3 lecture11/decode_prefetch_try.py OUT目录（或设环境变量 OUT）")
        return 2
    try:
        import torch
    except ImportError:
        print("SKIP: decode_try 需要 torch（和 CUDA GPU）")
        return SKIP
    if not torch.cuda.is_available():
        print("SKIP: decode_try 需要 CUDA GPU（torch.cuda.is_available() 为假）：在 GPU 机器上从仓库根目录运行 "
              "python3 .gpu/decode_try.py $OUT")
        return SKIP
    t0 = time.time()
    bench = load_bench()
    import triton_flash as tf                  # 07 已把 lecture11 加进 sys.path
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count
    meta = bench.gpu_meta(torch, n_sm=n_sm, dtype="bfloat16", Hq=bench.HQ, Hk=bench.HK, d=bench.D,
                          decode_pdl=tf.DECODE_PDL, decode_prefetch_default=tf.DECODE_PREFETCH,
                          prefetch_max_elems=tf.DECODE_PREFETCH_MAX_ELEMS, rounds=ROUNDS)
    copy = bench.copy_bandwidth(torch)
    print(f"{meta['gpu']}，{n_sm} 个 SM；拷贝带宽：" + "  ".join(f"{k} {v / 1e12:.2f} TB/s" for k, v in copy.items())
          + f"（{time.time() - t0:.0f} s）", flush=True)
    checks = check_prefetch(torch, tf)
    rows = []
    for B, S in B1_SHAPES + BATCH_SHAPES:
        rows += measure_shape(torch, tf, bench, B, S, copy["best"])
        print(f"  B={B} S={S} 测完（{time.time() - t0:.0f} s）", flush=True)
    print_rows(bench, rows)
    key = [r for r in rows if (r["B"], r["S"]) == (1, 32768) and r["variant"] != "sdpa"]
    best = min(key, key=lambda r: r["gpu_s"])
    need = 2 * 32768 * bench.HK * bench.D * 2 / (TARGET_FRAC * copy["best"])
    print(f"B = 1、S = 32k：90% 拷贝带宽要 ≤ {need * 1e6:.2f} µs；默认 "
          f"{next(r['gpu_s'] for r in key if r['variant'] == 'default') * 1e6:.2f} µs，最快的变体 {best['variant']} "
          f"{best['gpu_s'] * 1e6:.2f} µs（{best['copy_frac'] * 100:.1f}%）" + (" ✓" if best["gpu_s"] <= need else " ✗"))
    bad = [f"B={r['B']} S={r['S']} {r['variant']}" for r in rows if not r["ok"]]
    bad += [name for name, err, limit in checks if not err < limit]
    res = dict(meta=dict(meta, seconds=time.time() - t0), copy=copy, copy_Bps=copy["best"], rows=rows,
               prefetch_checks=[dict(name=n, err=e, limit=lim) for n, e, lim in checks])
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "decode_try.json")
    with open(path, "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"写好 {path}（{time.time() - t0:.0f} s）")
    if bad:
        print(f"✗ 不过关（和默认输出的相对差超过 {bench.DECODE_TOL:.1e}，或预取的误差超过上限）：{bad}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
