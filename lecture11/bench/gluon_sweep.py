"""
gluon_sweep · gluon_flash 的基准和块大小的 sweep（H200）：tile_config、bwd_tile_config、best_variant 的出处。

  --bench        每个 variant 的前向和 triton_flash.flash_attn_func、SDPA（cuDNN、FLASH）比：B·N = 32k 个 token，
                 H·d = 2048（flash_lab.BENCH_TOKENS / BENCH_HIDDEN），d ∈ {64, 128}，N ∈ {1k, 4k, 16k}，causal 与否
                 → DIR/gluon_bench.json（反向的对照在 triton_bench.py 里，带 NaN 检查）
  --explore      variant × (BLOCK_N, STAGES) → DIR/gluon_explore[_<N>].json（tile_config、best_variant 的出处）
  --explore-bwd  反向的块（EXPLORE_BWD_TILES）× N × causal 对 cuDNN → DIR/gluon_bwd_explore.json（bwd_tile_config）
  --replot       不用 GPU：没有图，重印提交的 gluon_bench.json 的表
  --compare      和 --bench 一起：再打印这次和提交的 gluon_bench.json 的比（同一格的 TFLOP/s 之比）
计时之前每个实现的输出先和 SDPA（FLASH）的比一次（相对误差和最大绝对误差，OUT_TOL）：算错的不计时，记进 errors。
提交的几份和当时的命令：lecture11/bench/README.md。

运行（要 Hopper GPU 和 triton ≥ 3.6 的 Gluon；没有时 SKIP、退出码 77）：
  python3 lecture11/bench/gluon_sweep.py --bench [--compare] [--out DIR]
  python3 lecture11/bench/gluon_sweep.py --explore --ns 1024 4096 --variants pipelined ws2 persist [--out DIR]
  python3 lecture11/bench/gluon_sweep.py --explore-bwd [--ns N ...] [--out DIR]
"""
import argparse
import functools
import itertools
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))       # lecture11/bench
LESSON = os.path.dirname(HERE)
sys.path.insert(0, LESSON)
sys.path.insert(0, os.path.join(LESSON, "..", "lecture01"))
sys.path.insert(0, os.path.join(LESSON, "..", "lecture01", "bench"))
from course_utils import check_int, load_json  # noqa: E402
from gpu_timing import gpu_meta  # noqa: E402
import flash_lab as fl  # noqa: E402  （基准的形状和 FLOP 算法；只依赖 numpy）
from gluon_flash import (BEST, EXPLORE_BWD_TOL, GLUON_ERROR, HEAD_DIMS, VARIANTS, _launch, _launch_bwd,  # noqa: E402
                         _short, _triton_flash, attention, bwd_tile_config, tile_config, torch)

RESULTS = os.path.join(HERE, "results")


BENCH_NS = (1024, 4096, 16384)
BENCH_COLS = tuple(f"gluon:{v}" for v in VARIANTS) + ("triton_flash", "sdpa:cudnn", "sdpa:flash")


def _tflops(batch, heads, n, d, causal, ms):
    """前向的 flash_lab.attention_flops（4·B·H·N²·d，causal 减半）/ 时间 → TFLOP/s。"""
    return fl.attention_flops(batch, heads, n, d, causal, "fwd") / (ms * 1e-3) / 1e12


def _gluon_impl(variant, q, k, v, causal):
    return attention(q, k, v, causal=causal, variant=variant)


# 基准前的输出检查：bf16 的两份正确的注意力相差几个 bf16 的舍入（相对 ~4e-3）；错一块就远超这两个界
OUT_TOL = dict(rel=2e-2, max_abs=6e-2)


def _wrong(out, ref):
    """out 和参考 ref（SDPA FLASH 的输出）差得太远 → 一句原因；对得上 → None。两个界都查：几行错了藏不进范数。"""
    tf = _triton_flash()
    rel, mx = tf._rel_err(out.float(), ref.float()), tf._max_abs(out.float(), ref.float())
    if rel <= OUT_TOL["rel"] and mx <= OUT_TOL["max_abs"]:
        return None
    return (f"输出不对：相对误差 {rel:.1e}（界 {OUT_TOL['rel']:.0e}），"
            f"最大绝对误差 {mx:.1e}（界 {OUT_TOL['max_abs']:.0e}）")


def bench(out_dir, compare=False):
    """--bench：写 DIR/gluon_bench.json；compare=True 时再打印和提交的那一份的比（compare_rows）。"""
    from triton.testing import do_bench
    tf = _triton_flash()
    quick_launch = tf.Launch(autotune=False, gluon=False)                                 # 固定配置：不花时间调优
    impls = {f"gluon:{var}": functools.partial(_gluon_impl, var) for var in VARIANTS}
    impls["triton_flash"] = lambda q, k, v, c: tf.flash_attn_func(q, k, v, causal=c, launch=quick_launch)
    impls["sdpa:cudnn"] = tf.sdpa_fn("sdpa-cudnn")
    impls["sdpa:flash"] = tf.sdpa_fn("sdpa-flash")
    results, t_start = [], time.time()
    for d in HEAD_DIMS:
        for n in BENCH_NS:
            batch, heads = fl.BENCH_TOKENS // n, fl.BENCH_HIDDEN // d
            q, k, v = (torch.randn(batch, n, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for causal in (False, True):
                row = {"d": d, "N": n, "B": batch, "H": heads, "causal": causal, "tflops": {}, "errors": {}}
                ref = impls["sdpa:flash"](q, k, v, causal)
                for name, fn in impls.items():
                    try:
                        wrong = _wrong(fn(q, k, v, causal), ref)
                        if wrong:
                            row["errors"][name] = wrong
                            continue
                        ms = do_bench(functools.partial(fn, q, k, v, causal), warmup=5, rep=20)
                        row["tflops"][name] = _tflops(batch, heads, n, d, causal, ms)
                    except Exception as exc:
                        row["errors"][name] = _short(exc)
                results.append(row)
                _print_row(row, first=len(results) == 1)
    info = gpu_meta(torch, dtype="bfloat16", tokens=fl.BENCH_TOKENS, hidden=fl.BENCH_HIDDEN,
                    seconds=round(time.time() - t_start, 1),
                    tiles={v: {d: tile_config(v, d)[:5] for d in HEAD_DIMS} for v in VARIANTS}, rows=results)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "gluon_bench.json")
    with open(path, "w") as fh:
        json.dump(info, fh, indent=1, ensure_ascii=False)
    print(f"写好 {path}（{info['seconds']} s）")
    if compare:
        committed = load_json(os.path.join(RESULTS, "gluon_bench.json"))
        if committed is None:
            print("没有提交的 gluon_bench.json，不比")
        else:
            print(f"这次 / 提交的（{committed['date'][:10]}，{committed['gpu']}，triton {committed['triton']}）：")
            compare_rows(results, committed["rows"])


def compare_rows(rows, committed_rows, cols=BENCH_COLS):
    """同一 (d, N, causal) 的每一列：这次的 TFLOP/s / 提交的；两边都有数才比。返回 {(d, N, causal, 列): 比值}。"""
    old = {(r["d"], r["N"], r["causal"]): r["tflops"] for r in committed_rows}
    ratios = {}
    print(f"{'d':>4s}{'N':>7s}{'causal':>7s}" + "".join(f"{c.split(':')[-1]:>13s}" for c in cols))
    for r in rows:
        key = (r["d"], r["N"], r["causal"])
        cells = []
        for c in cols:
            new, ref = r["tflops"].get(c), old.get(key, {}).get(c)
            if new is None or not ref:
                cells.append(f"{'—':>13s}")
                continue
            ratios[key + (c,)] = new / ref
            cells.append(f"{new / ref:13.3f}")
        print(f"{key[0]:>4d}{key[1]:>7d}{str(key[2]):>7s}" + "".join(cells))
    return ratios


EXPLORE_TILES = {64: ((128, 2), (128, 3), (128, 4), (64, 4)), 128: ((64, 4), (128, 2), (128, 3))}
EXPLORE_VARIANTS = ("ws2", "overlap", "pingpong", "persist")


EXPLORE_NS = (4096, 16384)


def explore_name(ns=EXPLORE_NS, stem="gluon_explore"):
    """--explore 写的文件名：默认的 N（4k、16k）→ gluon_explore.json，其余按 N 命名
    （--ns 1024 → gluon_explore_1k.json）。--explore-bwd 用 stem="gluon_bwd_explore"，规则相同。"""
    if tuple(ns) == EXPLORE_NS:
        return f"{stem}.json"
    return f"{stem}_" + "_".join(f"{n // 1024}k" if n % 1024 == 0 else str(n) for n in ns) + ".json"


def explore(out_dir, ns=EXPLORE_NS, variants=EXPLORE_VARIANTS, name=None):
    """调参：variant × (BLOCK_N, STAGES) 在 N ∈ ns 上的 TFLOP/s（BLOCK_M 按 tile_config；EXPLORE_VARIANTS 以外的
    variant 只测 tile_config 的那一组），写 DIR/name（默认 explore_name(ns)）。tile_config 里的选择来自
    gluon_explore.json，best_variant 的来自 gluon_explore_1k_4k.json 和 gluon_explore_16k.json。"""
    from triton.testing import do_bench
    rows, t_start = [], time.time()
    for d in HEAD_DIMS:
        for n in ns:
            batch, heads = fl.BENCH_TOKENS // n, fl.BENCH_HIDDEN // d
            q, k, v = (torch.randn(batch, n, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            refs = {c: _triton_flash().sdpa_fn("sdpa-flash")(q, k, v, c) for c in (False, True)}
            grid = [(v_, t) for v_ in variants for t in (EXPLORE_TILES[d] if v_ in EXPLORE_VARIANTS
                                                          else (tile_config(v_, d)[1:3],))]
            for causal, (variant, tiles) in itertools.product((False, True), grid):
                row = dict(d=d, N=n, causal=causal, variant=variant, block_n=tiles[0], stages=tiles[1])
                try:
                    run = functools.partial(_launch, q, k, v, causal, d ** -0.5, variant, False, tiles)
                    row["error"] = _wrong(run(), refs[causal])
                    if row["error"] is None:
                        del row["error"]
                        row["tflops"] = _tflops(batch, heads, n, d, causal, do_bench(run, warmup=5, rep=20))
                except Exception as exc:
                    row["error"] = _short(exc)
                rows.append(row)
                print(f"  d={d:<4d}N={n:<6d}causal={causal!s:<6s}{variant:<10s}"
                      f"BLOCK_N={tiles[0]:<4d}STAGES={tiles[1]}  "
                      + (f"{row['tflops']:6.1f} TFLOP/s" if "tflops" in row else row["error"]), flush=True)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name or explore_name(ns))
    with open(path, "w") as fh:
        json.dump(gpu_meta(torch, dtype="bfloat16", seconds=round(time.time() - t_start, 1), rows=rows), fh, indent=1)
    print(f"写好 {path}")


# --explore-bwd 比的反向块（bwd_tile_config 的出处；d = 64 再大一格 STAGES 就超出共享内存）
EXPLORE_BWD_TILES = {64: ((64, 64, 2, 4, 4, 168, (240, 24)), (64, 64, 2, 6, 4, 168, (240, 24)),
                          (128, 64, 2, 2, 4, 168, (240, 24))),
                     128: ((64, 64, 2, 2, 4, 168, (240, 24)), (64, 64, 2, 3, 4, 168, (240, 24)))}


def explore_bwd(out_dir, ns=EXPLORE_NS, tiles=EXPLORE_BWD_TILES):
    """
    调参：反向主内核的块（EXPLORE_BWD_TILES）在 N ∈ ns、full / causal 上的时间，和 cuDNN 的整个反向比；每个块的
    梯度和默认块的梯度比（triton_flash._rel_err，三个梯度取最大；> EXPLORE_BWD_TOL 的块记 ok = False、打 ✗，
    不能当选）。写 DIR/gluon_bwd_explore.json（默认的 N；其余按 N 命名，和 --explore 一样）。
    计时的是 _launch_bwd（预处理 + 主内核 + dQ 换 dtype），cuDNN 是 autograd 的 backward（do_bench 每次清梯度）：
    cuDNN 那边多了 autograd 的一点主机时间，在 N ≥ 4k 的毫秒级时间里可以忽略。
    """
    from triton.testing import do_bench
    for n in ns:
        check_int("ns", n, lo=1, where="explore_bwd")
    tf = _triton_flash()
    cudnn = tf.sdpa_fn("sdpa-cudnn")
    rows, t_start = [], time.time()
    for d in HEAD_DIMS:
        for n, causal in itertools.product(ns, (False, True)):
            batch, heads = fl.BENCH_TOKENS // n, fl.BENCH_HIDDEN // d
            q, k, v, do = (torch.randn(batch, n, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            scale = d ** -0.5
            out, lse = _launch(q, k, v, causal, scale, BEST, True)
            ref = _launch_bwd(q, k, v, out, lse, do, causal, scale)
            qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
            o_cudnn = cudnn(qg, kg, vg, causal)
            ms_cudnn = do_bench(functools.partial(o_cudnn.backward, do, retain_graph=True), warmup=5, rep=25,
                                grad_to_none=[qg, kg, vg])
            del o_cudnn, qg, kg, vg
            for tile in tiles[d]:
                row = dict(d=d, N=n, causal=causal, tile=list(tile[:6]), default=tile == bwd_tile_config(d),
                           cudnn_ms=ms_cudnn)
                try:
                    got = _launch_bwd(q, k, v, out, lse, do, causal, scale, tile)
                    row["rel_diff"] = max(tf._rel_err(a.float(), b.float()) for a, b in zip(got, ref))
                    row["ok"] = row["rel_diff"] <= EXPLORE_BWD_TOL
                    row["ms"] = do_bench(functools.partial(_launch_bwd, q, k, v, out, lse, do, causal, scale, tile),
                                         warmup=5, rep=25)
                    row["vs_cudnn"] = ms_cudnn / row["ms"]
                except Exception as exc:
                    row["error"] = _short(exc)
                rows.append(row)
                print(f"  d={d:<4d}N={n:<6d}causal={causal!s:<6s}tile={tile[:4]}{' *' if row['default'] else '  '}  "
                      + (f"{row['ms']:7.3f} ms  cuDNN {ms_cudnn:7.3f} ms  ×{row['vs_cudnn']:.3f}  "
                         f"和默认块的梯度差 {row['rel_diff']:.1e} {'✓' if row['ok'] else '✗ 算错了'}"
                         if "ms" in row else row["error"]), flush=True)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, explore_name(ns, "gluon_bwd_explore"))
    with open(path, "w") as fh:
        json.dump(gpu_meta(torch, dtype="bfloat16", seconds=round(time.time() - t_start, 1), rows=rows), fh, indent=1)
    print(f"写好 {path}（* = bwd_tile_config 现在的选择；× = cuDNN 时间 / 这个块的时间）")



def _print_row(row, first, cols=BENCH_COLS):
    """一行：TFLOP/s（括号里是 / cuDNN 的比值）；失败的写 ERR（原因在表后），没测的（旧文件里没有的列）写 —。"""
    if first:
        print("TFLOP/s（bf16；括号 = / cuDNN）")
        print(f"{'d':>4s}{'N':>7s}{'causal':>7s}" + "".join(f"{c.split(':')[-1]:>16s}" for c in cols))
    ref = row["tflops"].get("sdpa:cudnn")
    cells = []
    for c in cols:
        t = row["tflops"].get(c)
        if t is None:
            cells.append(f"{'ERR' if c in row['errors'] else '—':>16s}")
        else:
            cells.append(f"{t:8.1f} ({t / ref:4.2f})" if ref else f"{t:16.1f}")
    print(f"{row['d']:>4d}{row['N']:>7d}{str(row['causal']):>7s}" + "".join(cells), flush=True)
    for name, err in row["errors"].items():
        print(f"      {name}: {err}")


def _measure(args):
    """--bench / --explore：只在有 Gluon 的 CUDA GPU 上。"""
    if torch is None or not torch.cuda.is_available() or GLUON_ERROR is not None:
        print("SKIP: 基准要 CUDA GPU 和 triton ≥ 3.6 的 Gluon")
        sys.exit(77)
    if args.explore_bwd:
        explore_bwd(args.out, ns=tuple(args.ns))
    elif args.explore:
        explore(args.out, ns=tuple(args.ns), variants=tuple(args.variants))
    else:
        bench(args.out, compare=args.compare)


def replot(out_dir):
    """没有图可画：重印提交的 gluon_bench.json 的表。没有这个文件时 SKIP。"""
    path = os.path.join(out_dir, "gluon_bench.json")
    res = load_json(path)
    if res is None:
        print(f"SKIP: 没有 {os.path.relpath(path)}（先在 GPU 上 --bench）")
        return 77
    for i, row in enumerate(res["rows"]):
        _print_row(row, first=i == 0)
    return 0


def _parse_args(argv=None):
    ap = argparse.ArgumentParser(description="gluon_flash 的基准和 sweep（Hopper）")
    ap.add_argument("--bench", action="store_true", help="前向的每一步 vs triton_flash、cuDNN、FLASH")
    ap.add_argument("--explore", action="store_true", help="扫 variant × (BLOCK_N, STAGES)")
    ap.add_argument("--explore-bwd", action="store_true",
                    help="反向的块（EXPLORE_BWD_TILES）× N × causal，对 cuDNN → DIR/gluon_bwd_explore.json")
    ap.add_argument("--replot", action="store_true", help="不用 GPU：重印提交的 gluon_bench.json")
    ap.add_argument("--compare", action="store_true", help="和 --bench 一起：打印这次和提交的 gluon_bench.json 的比")
    ap.add_argument("--ns", type=int, nargs="+", default=list(EXPLORE_NS),
                    help="--explore 测哪几个 N（默认 4096 16384；文件名跟着变：--ns 1024 → gluon_explore_1k.json）")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(EXPLORE_VARIANTS),
                    help="--explore 测哪几步（默认 EXPLORE_VARIANTS：扫块大小；其余只测 tile_config 的那一组）")
    ap.add_argument("--out", default=RESULTS, help="基准 JSON 写到哪个目录")
    return ap.parse_args(argv)


if __name__ == "__main__":
    _args = _parse_args()
    if _args.replot:
        sys.exit(replot(_args.out))
    if not (_args.bench or _args.explore or _args.explore_bwd):
        print("gluon_sweep：选一个 --bench、--explore、--explore-bwd 或 --replot")
        sys.exit(2)
    _measure(_args)
