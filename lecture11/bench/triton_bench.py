"""
工作台 triton_bench · Triton FlashAttention-2 和 PyTorch SDPA 的三个后端比速度（H200，bf16）

你会看到：
  - 同一组输入上，我们的 Triton 内核（triton_flash.py）、SDPA 的 FLASH（FlashAttention-2）、CUDNN、EFFICIENT
    三个后端的前向、反向 TFLOP/s；形状：d ∈ {64, 128}，N ∈ {1k, 4k, 16k}，B·N = 32k 个 token，H·d = 2048，
    causal 与否。
  - 我们的反向有两条路径，同一次运行里都测："ours" = 默认（split：dK/dV、dQ 两个内核，每对块 7 次矩阵乘，
    逐位可复现），"ours-atomic" = Launch(bwd="atomic")（FA2 的 dQ 原子加，5 次矩阵乘；只测反向，前向和 ours
    是同一个内核）。默认选 split 是因为 H200 上实测它更快。
  - "gluon" = gluon_flash.attention（FA3 式的 Hopper 内核，手写 TMA / mbarrier / wgmma / warp 专门化，
    variant="best" = 持久内核；前向和反向都测，它的输出和梯度同样和 ours 对照）。前向目标按 ours、
    gluon 里快的那个算。
  - FLOP 的算法：前向 4·B·H·N²·d（QKᵀ 和 PV 各 2·N²·d），causal 时减半；反向按前向的 2.5 倍算
    （5 次矩阵乘 / 2 次，flash-attn 的惯例；split 路径实际做 7 次，多出来的重算不算 FLOP）。
  - 每个形状先跑一遍前向 + 反向，SDPA 的三个后端的输出和梯度都和我们的内核对照（bf16 对 bf16，
    相对误差 < 2e-2，NaN 算不一致）；不一致的逐个打印、记进 JSON 的 failures。测量结束时、--quick 读已提交的
    JSON 时都查它：有不一致就列出来，退出码 1。
  - 我们的内核先正常跑一遍（autotune 在这一遍选好配置），再用 Launch(poison=True) 跑一遍拿来对照：
    输出和梯度先填 NaN，选中的配置漏写任何元素都会变成 NaN 被抓到；调优那一遍的结果也和它对照
    （ours-atomic 的调优要在每次试跑前把 dQ 累加器清零，没清零时这一遍的 dQ 会是几倍大）。
  - --quick 打印时 TFLOP/s 由 JSON 里的毫秒数和上面的 FLOP 公式现算，并核对和测量时记下的一致。
  - 目标行的 ✓ / ✗ 是速度目标（性能），不是正确性：正确性不过关时脚本直接报错退出。

运行：
  python3 lecture11/bench/triton_bench.py            有 GPU：测量，写 lecture11/bench/results/triton_bench.json 和 .png
  python3 lecture11/bench/triton_bench.py --quick    （或没有 GPU 时）打印已提交的结果表；--quick 还由 JSON 画同一张图
                                                 到 bench/figures/quick/，不动已提交的 results/triton_bench.png
  python3 lecture11/bench/triton_bench.py --replot   不用 GPU：由已提交的 JSON 重画 results/triton_bench.png
  python3 lecture11/bench/triton_bench.py --compare --providers ours sdpa-flash --seqlens 1024 4096 --out /tmp/tb
                                                 短跑：只测这几列，打印和已提交的 JSON 的比（--overhead 也收 --compare）
"""
import argparse
import json
import os
import math
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))       # lecture11/bench
LESSON = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(LESSON, "..", "lecture01"))
sys.path.insert(0, os.path.join(LESSON, "..", "lecture01", "bench"))
from course_utils import committed_figure, format_table, load_json, pyplot, save_figure  # noqa: E402
from gpu_timing import gpu_meta, graph_matches_eager, wall_per_call_many  # noqa: E402

sys.path.insert(0, LESSON)
sys.path.insert(0, HERE)
# 形状、FLOP 算法和 gluon_flash、ncu_profile 共用一份（flash_lab.py，只依赖 numpy：没有 triton 也能打印结果）
from flash_lab import BENCH_HIDDEN as HIDDEN, BENCH_TOKENS as TOKENS, attention_flops as flops  # noqa: E402
import ncu_profile  # noqa: E402  （在这里导入：它的 `import flash_lab` 和上一行是同一份）

RESULTS = os.path.join(HERE, "results")
JSON_NAME = "triton_bench.json"
PNG_NAME = "triton_bench.png"
PROVIDERS = ("ours", "ours-atomic", "gluon", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient")
BWD_ONLY = ("ours-atomic",)           # 前向和 ours 是同一个内核：只测反向
OURS_FWD = ("ours", "gluon")          # 前向目标按"我们的 Triton 和 Gluon 内核里快的那个"算
SEQLENS = (1024, 4096, 16384)         # B·N = TOKENS、H·d = HIDDEN 固定（flash_lab.py）
HEAD_DIMS = (64, 128)


# ---------------------------------------------------------------- 打印表格（有没有 GPU 都能用）
def tflops_of(r):
    """一行测量结果的 TFLOP/s：由毫秒数和 flops() 现算（不信 JSON 里存的那个数）。"""
    return flops(r["B"], r["H"], r["N"], r["d"], r["causal"], r["mode"]) / (r["ms"] * 1e-3) / 1e12


def print_table(res):
    meta = res["meta"]
    print(f"GPU: {meta['gpu']}  driver {meta['driver']}  torch {meta['torch']}  triton {meta['triton']}  "
          f"({meta['date']})")
    print("（ours 的反向 = 默认的 split（dK/dV + dQ 两个内核）；"
          "ours-atomic = Launch(bwd=\"atomic\")，dQ 原子加，只测反向）")
    if meta.get("note"):
        print(f"（{meta['note']}）")
    rows = res["rows"]
    for r in rows:       # 存下的 TFLOP/s 必须就是 flops()/ms：表里的数和文件开头写的 FLOP 算法一致
        assert abs(tflops_of(r) / r["tflops"] - 1) < 1e-9, r
    keys = sorted({(r["mode"], r["causal"], r["d"], r["N"]) for r in rows},
                  key=lambda t: (t[0] != "fwd", t[1], t[2], t[3]))
    table = []
    for mode, causal, d, n in keys:
        sel = {r["provider"]: r for r in rows if (r["mode"], r["causal"], r["d"], r["N"]) == (mode, causal, d, n)}
        any_r = next(iter(sel.values()))
        tfl = {p: tflops_of(sel[p]) for p in PROVIDERS if p in sel}
        ratios = [f"{tfl['ours'] / tfl[p]:.2f}" if "ours" in tfl and p in tfl else "—"
                  for p in ("sdpa-flash", "sdpa-cudnn", "ours-atomic")]
        best = best_ratio(rows, mode, causal, d, n, "sdpa-cudnn", BWD_ANY)     # 我们的内核里最快的 / cuDNN
        ratios.append("—" if best is None else f"{best:.2f}")
        table.append([mode, str(causal), d, n, any_r["B"], any_r["H"]]
                     + [f"{tfl[p]:.1f}" if p in tfl else "—" for p in PROVIDERS] + ratios)
    print(format_table(["mode", "causal", "d", "N", "B", "H", *PROVIDERS, "ours/flash", "ours/cudnn", "ours/atomic",
                        "best/cudnn"], table, align="<<" + ">" * (len(table[0]) - 2)))
    print("（单位 TFLOP/s；目标见下面几行；ours/atomic = 默认的 split 比原子 dQ 快多少，只在反向；"
          "best/cudnn = 我们的内核（ours、ours-atomic、gluon）里最快的 / cuDNN）")
    report = target_report(rows)
    for line in report:
        print(line)
    text = miss_explained(rows)
    if text:
        print(text)
    if any("没测到" in line for line in report):
        print("  ? / 没测到：这个形状上 SDPA 的后端或我们的内核测量时不可用（测量时打印了原因），JSON 里没有这一行；"
              "没测到的形状不算达到")


def report_failures(res):
    """
    结果里的 failures（测量时对照不一致的：某个后端和 ours 不一致，或 autotune 那一遍和填 NaN 的一遍不一致）：
    逐个打印，返回个数（非 0 时调用者以退出码 1 结束）。没有这个键也算问题（返回 -1）："退出码 0 = 全部算对"
    要有记录撑着。
    """
    failures = res.get("failures")
    if failures is None:
        print("✗ 结果里没有 failures 记录：无法确认测量时每个形状都对照过")
        return -1
    for provider, d, n, causal, errs in failures:           # errs：相对误差的列表，或一句说明（没法对照时）
        what = f"相对误差 {errs}" if str(errs).startswith("[") else errs
        print(f"  ✗ {provider} d={d} N={n} causal={causal}：{what}")
    if failures:
        print(f"✗ 有 {len(failures)} 处对照不一致（上面逐个列出）：这份结果里的速度数字不能当真")
    else:
        print("正确性：每个形状的输出和梯度都对照过，没有不一致（failures 为空）")
    return len(failures)


def _span(xs, fmt="{:.2f}"):
    """几个数 → "a–b"（只有一个数或都相同时就是它）。"""
    lo, hi = fmt.format(min(xs)), fmt.format(max(xs))
    return lo if lo == hi else f"{lo}–{hi}"


BWD_ANY = ("ours", "ours-atomic", "gluon")  # 反向目标按"我们的反向里快的那个"算
# 目标：(名字, 方向, 对照, 要到的比值, 我们的哪些内核取快的, 哪些形状, 解释属于哪一段)
TARGETS = (
    ("前向 ≥ 1.0× SDPA-FLASH（Triton 内核）", "fwd", "sdpa-flash", 1.0, ("ours",), lambda c, d, n: True, "flash"),
    ("反向 ≥ 1.0× SDPA-FLASH（Triton 内核）", "bwd", "sdpa-flash", 1.0, ("ours",), lambda c, d, n: True, "flash"),
    ("前向 ≥ 0.8× cuDNN（d = 128，N ≥ 4k，Triton 内核）", "fwd", "sdpa-cudnn", 0.8, ("ours",),
     lambda c, d, n: d == 128 and n >= 4096, "fwd"),
    ("目标：前向 ≥ 0.9× cuDNN（N ≥ 4k，Triton / Gluon 取快的）", "fwd", "sdpa-cudnn", 0.9, OURS_FWD,
     lambda c, d, n: n >= 4096, "fwd"),
    ("目标：前向 ≥ 0.8× cuDNN（N = 1k，Triton / Gluon 取快的）", "fwd", "sdpa-cudnn", 0.8, OURS_FWD,
     lambda c, d, n: n == 1024, "fwd1k"),
    ("目标：反向 ≥ 0.85× cuDNN（N ≥ 4k，我们的反向取快的）", "bwd", "sdpa-cudnn", 0.85, BWD_ANY,
     lambda c, d, n: n >= 4096, "bwd"),
)


def best_ratio(rows, mode, causal, d, n, other, mine):
    """这个形状上 mine 里最快的那个 / other 的 TFLOP/s（mine 里一个都没测到、或 other 没测到时 None）。"""
    key = (mode, causal, d, n)
    sel = {r["provider"]: tflops_of(r) for r in rows if (r["mode"], r["causal"], r["d"], r["N"]) == key}
    best = max((sel[p] for p in mine if p in sel), default=None)
    return best / sel[other] if best is not None and other in sel else None


def target_results(rows):
    """逐条目标：[(名字, 段, 对照的 provider, 查了的形状, 没达到的 [(形状, 比值)], 没测到的形状)]。"""
    shapes = sorted({(r["causal"], r["d"], r["N"]) for r in rows})
    out = []
    for name, mode, other, want, mine, pick, topic in TARGETS:
        checked = [(c, d, n, best_ratio(rows, mode, c, d, n, other, mine)) for c, d, n in shapes if pick(c, d, n)]
        miss = [((c, d, n), x) for c, d, n, x in checked if x is not None and x < want]
        absent = [(c, d, n) for c, d, n, x in checked if x is None]     # 缺一边的测量：不算达到
        out.append((name, topic, other, checked, miss, absent))
    return out


def _label(c, d, n):
    return f"{'causal' if c else 'full'} d={d} N={n}"


def target_report(rows):
    """逐条对照目标，返回几行文字（没达到的形状逐个列出，不藏起来）。行首：✓ = 每个形状都测到且达到；
    ✗ = 有形状没达到；? = 没有没达到的，但有形状缺测量（某个 provider 不可用）——没测到的不算达到。"""
    out = []
    for name, _, other, checked, miss, absent in target_results(rows):
        hit = len(checked) - len(miss) - len(absent)
        status = "✗" if miss else "?" if absent or not checked else "✓"
        out.append(f"  {status} {name}：{hit}/{len(checked)} 个形状达到" +
                   (f"；没达到：{'; '.join(f'{_label(*k)}: {x:.3f}' for k, x in miss)}" if miss else "") +
                   (f"；没测到（{other} 或我们的内核缺这一行）：{'; '.join(_label(*k) for k in absent)}"
                    if absent else ""))
    return out


def ncu_summary(ncu_dir=None):
    """已提交的 ncu CSV（ncu_profile.kernels）→ {目标: {"tensor": 主内核（最长的那个）Tensor Core 忙的 %,
    "us": 每个内核的 µs 列表, "names": 内核名}}。解释对照的是不 causal 的那组剖析：目录里的 CSV 量的是 causal 时
    （ncu_shape.json）不用它们，说明原因，返回 {}（解释里的数写成 ?）。"""
    ncu_dir = ncu_dir or ncu_profile.RESULTS
    if ncu_profile.measured_shape(ncu_dir)["causal"]:
        print(f"  （{os.path.relpath(ncu_dir)} 的 ncu CSV 量的是 causal 的形状，"
              "下面的解释要的是不 causal 的那组：不用）")
        return {}
    out = {}
    for name, ks in ncu_profile.kernels(ncu_dir).items():
        main = max(ks, key=lambda k: k["us"])
        out[name] = dict(tensor=main["tensor"], us=[k["us"] for k in ks], names=[k["kernel"] for k in ks])
    return out


def miss_explained(rows, ncu=None):
    """没达到的目标的解释：只写没达到的那几条所属的段（前向、N = 1k、反向、对 FLASH）。比值由这份结果的 rows 算，
    Tensor Core 的忙碌比例、内核时间由已提交的 ncu CSV 算。没有没达到的目标时返回空串。"""
    topics = {topic for _, topic, _, _, miss, _ in target_results(rows) if miss}
    if not topics:
        return ""
    ncu = ncu_summary() if ncu is None else ncu
    tc = {k: "?" if math.isnan(v["tensor"]) else f"{v['tensor']:.0f}%" for k, v in ncu.items()}
    parts = ["  ✗ 是什么意思：没达到的是速度目标，不是结果出错（每个形状的输出和梯度都和 SDPA 的三个后端对照过，\n"
             "    不一致时脚本会报错退出，所以退出码 0 = 全部算对）。"]
    if "fwd" in topics or "flash" in topics:
        parts.append("前向：Triton 编译出来的内核里 QKᵀ → softmax → PV\n"
                     "    是串行的，cuDNN 和 gluon_flash（FA3 的做法：生产者 warp + 两个计算 warpgroup）"
                     "让一组的 softmax 和\n"
                     f"    另一组的 wgmma 同时跑——ncu 里 Tensor Core 忙的比例 ours {tc.get('ours-fwd', '?')}、"
                     f"gluon 的 ws2（步骤 C）{tc.get('gluon-fwd', '?')}、cuDNN {tc.get('cudnn-fwd', '?')}\n"
                     "    （lecture11/bench/ncu_profile.py 量的是 ws2，不是表里的持久内核）。")
    if "fwd1k" in topics:
        parts.append("\n    N = 1k：每个程序只走几块 K/V，开头结尾摊不开；"
                     "gluon 的持久内核（步骤 E）把它们藏到前一个 Q 块后面。")
    if "bwd" in topics or "flash" in topics:
        parts.append("\n    " + _bwd_text(rows, ncu, tc))
    parts.append("\n    数字和剖析见 lecture11/bench/README.md。")
    return "".join(parts)


def _bwd_text(rows, ncu, tc):
    """反向那一段：ours 的 dK/dV 内核对 cuDNN 整个反向的时间（ncu），gluon 对 ours、对 cuDNN 的比值（rows）。"""
    text = "反向：ours 每对块 7 次矩阵乘（dQ 另开内核）"
    ours, cudnn = ncu.get("ours-bwd"), ncu.get("cudnn-bwd")
    dkdv = [us for us, k in zip(ours["us"], ours["names"]) if "dkdv" in k] if ours else []
    if dkdv and cudnn:
        text += f"，ncu 里它的 dK/dV 内核一个就是 cuDNN 整个反向的 {dkdv[0] / sum(cudnn['us']):.2f}×"
    big = sorted({(r["causal"], r["N"]) for r in rows if r["mode"] == "bwd" and r["N"] >= 4096})

    def ratios(d, other, mine):                  # N ≥ 4k 的每个形状上的比值（缺测量的形状跳过）
        xs = [best_ratio(rows, "bwd", c, d, n, other, mine) for c, n in big]
        return [x for x in xs if x is not None]
    g_ours, g_cudnn = ratios(128, "ours", ("gluon",)), ratios(128, "sdpa-cudnn", ("gluon",))
    b64 = ratios(64, "sdpa-cudnn", BWD_ANY)
    if g_ours and g_cudnn and b64:
        text += ("。\n    gluon 的反向（FA3 的做法：5 次矩阵乘，两个计算组合算一份 dQ，"
                 "经共享内存用 TMA 归约加回全局；\n"
                 f"    LSE、D 由生产者用 TMA 读进共享内存）在 d = 128、N ≥ 4k 上是 ours 的 {_span(g_ours)}×、"
                 f"cuDNN 的 {_span(g_cudnn)}×；\n"
                 f"    d = 64 我们最快的反向是 cuDNN 的 {_span(b64)}×。ncu：gluon 反向的主内核 Tensor Core 忙 "
                 f"{tc.get('gluon-bwd', '?')}（cuDNN {tc.get('cudnn-bwd', '?')}）")
    return text + "。"


# ---------------------------------------------------------------- 测量（只在 GPU 上）
def _outputs(out, qq, kk, vv):
    return [out.detach().float(), qq.grad.float(), kk.grad.float(), vv.grad.float()]


def bench_one(fn, q, k, v, do, causal, args, do_bench, check_fn=None, time_fwd=True):
    """
    跑一次前向 + 反向（拿输出和梯度做对照），再分别计时前向和反向。返回 (got, ms_fwd, ms_bwd, first)。
    check_fn：先用 fn 跑一遍（autotune 选配置，结果记为 first），对照用的结果 got 由 check_fn（同一内核、
    输出先填 NaN）算；没有 check_fn 时 first 是 None。time_fwd=False：不计时前向（ms_fwd 是 None）。
    """
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    if fn(qq, kk, vv, causal).grad_fn is None:                  # 只有前向的实现（没有 autograd）：只测前向
        out = fn(qq, kk, vv, causal)
        return [out.detach().float()], do_bench(lambda: fn(qq, kk, vv, causal), warmup=args.warmup,
                                                 rep=args.rep), None, None
    first = None
    if check_fn is not None:
        out = fn(qq, kk, vv, causal)
        out.backward(do)
        first = _outputs(out, qq, kk, vv)
        qq.grad = kk.grad = vv.grad = None
    out = (check_fn or fn)(qq, kk, vv, causal)
    out.backward(do, retain_graph=True)
    got = _outputs(out, qq, kk, vv)
    out = fn(qq, kk, vv, causal)                               # 计时用正常启动（不填 NaN）的计算图
    ms_fwd = do_bench(lambda: fn(qq, kk, vv, causal), warmup=args.warmup, rep=args.rep) if time_fwd else None
    ms_bwd = do_bench(lambda: out.backward(do, retain_graph=True), warmup=args.warmup, rep=args.rep,
                      grad_to_none=[qq, kk, vv])
    return got, ms_fwd, ms_bwd, first


def check_provider(p, got, first, ref, shape, failures, rel_err):
    """
    一个 provider 在一个形状上的对照（got / first 见 bench_one；shape = (d, N, causal)）：不一致的记进 failures
    并打印，返回之后的对照基准 ref。
      - first 不是 None：autotune 那一遍 vs 选定配置、输出先填 NaN 的一遍。
      - ref 是 None：got 成为基准（第一个测到的是我们的内核，其余后端和它对照）。它只有输出（反向出错、退回只测
        前向）时其余后端的梯度就没有东西可对照：这也记进 failures，不能报"输出和梯度都对照过"。
      - 否则 got 和 ref 逐项比（两边有 NaN 时误差是 NaN / inf：也算不一致）。
    """
    d, n, causal = shape
    if first is not None:
        errs = [rel_err(a, b) for a, b in zip(first, got)]
        if not max(errs) < 2e-2:
            failures.append((f"{p}（autotune 那一遍）", d, n, causal, errs))
            print(f"  ✗ {p} d={d} N={n} causal={causal} autotune 那一遍和填 NaN 的一遍不一致：{errs}")
    if ref is None:
        if len(got) == 1:
            failures.append((f"{p}（反向出错，只测了前向）", d, n, causal, "其余后端的梯度没有和它对照"))
            print(f"  ✗ {p} d={d} N={n} causal={causal} 是对照的基准，但只有前向：其余后端的梯度没有对照")
        return got
    errs = [rel_err(a, b) for a, b in zip(got, ref)]
    if not max(errs) < 2e-2:
        failures.append((p, d, n, causal, errs))
        print(f"  ✗ {p} d={d} N={n} causal={causal} 和 {PROVIDERS[0]} 不一致：{errs}")
    return ref


def measure(args):
    import time

    import torch
    import triton
    import triton_flash as tf

    torch.manual_seed(0)
    t_start = time.time()
    meta = gpu_meta(torch, dtype="bfloat16")
    meta["ours_bwd"] = "split"                                # "ours" 的反向 = 默认路径（split）
    rows, failures = [], []
    fns, checks = {}, {}
    for p, bwd in (("ours", "split"), ("ours-atomic", "atomic")):
        normal, poison = tf.Launch(bwd=bwd, gluon=False), tf.Launch(bwd=bwd, poison=True, gluon=False)
        fns[p] = lambda q, k, v, c, la=normal: tf.flash_attn_func(q, k, v, causal=c, launch=la)
        checks[p] = lambda q, k, v, c, la=poison: tf.flash_attn_func(q, k, v, causal=c, launch=la)
    import gluon_flash as gf
    fns["gluon"] = lambda q, k, v, c: gf.attention(q, k, v, causal=c)      # variant="best"：按形状选
    meta["gluon_variant"] = {f"d={d} N={n}": gf.best_variant(d, n) for d in args.head_dims for n in args.seqlens}
    for p in PROVIDERS[3:]:
        fns[p] = tf.sdpa_fn(p)
    providers = [p for p in PROVIDERS if p in args.providers]
    for d in args.head_dims:
        for n in args.seqlens:
            batch, heads = TOKENS // n, HIDDEN // d
            for causal in (False, True):
                q, k, v, do = (torch.randn(batch, n, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                ref = None
                for p in providers:
                    try:
                        got, ms_fwd, ms_bwd, first = bench_one(fns[p], q, k, v, do, causal, args,
                                                               triton.testing.do_bench, checks.get(p),
                                                               time_fwd=p not in BWD_ONLY)
                    except Exception as e:                     # 不支持该形状或编译失败：记下来，不计时
                        print(f"  {p} d={d} N={n} causal={causal}: 不可用（{str(e).splitlines()[0][:80]}）")
                        if p in BWD_ONLY:
                            continue
                        try:                                   # 可能只是反向出错：前向照样测（no_grad：只走前向）
                            got, ms_fwd, ms_bwd, first = bench_one(torch.no_grad()(fns[p]), q, k, v, do, causal,
                                                                   args, triton.testing.do_bench)
                        except Exception as e2:
                            print(f"  {p} 的前向也不可用（{str(e2).splitlines()[0][:80]}）")
                            continue
                    ref = check_provider(p, got, first, ref, (d, n, causal), failures, tf._rel_err)
                    for mode, ms in (("fwd", ms_fwd), ("bwd", ms_bwd)):
                        if ms is None:
                            continue
                        tfl = flops(batch, heads, n, d, causal, mode) / (ms * 1e-3) / 1e12
                        rows.append(dict(provider=p, mode=mode, causal=causal, d=d, N=n, B=batch, H=heads,
                                         ms=ms, tflops=tfl))
                        print(f"  {p:<15s}{mode} d={d:<4d}N={n:<6d}causal={causal!s:<6s}{ms:8.3f} ms "
                              f"{tfl:7.1f} TFLOP/s", flush=True)
                torch.cuda.empty_cache()
    meta["autotune"] = {kind: {str(key): str(cfg) for key, cfg in kern.cache.items()}
                        for kind, kern in tf._TUNED.items()}
    meta["wall_s"] = round(time.time() - t_start, 1)
    print(f"  测量用时 {meta['wall_s']:.0f} s（含编译和 autotune）")
    return dict(meta=meta, rows=rows, failures=[list(map(str, f)) for f in failures])


EXPLORE_CONFIGS = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 128, 8, 3),
                   (64, 64, 4, 3), (128, 32, 4, 3)]


def explore(args):
    """调优实验（只测前向）：固定配置 × 有无 TMA，打印每个版本的 TFLOP/s。"""
    import torch
    import triton
    import triton_flash as tf

    F = torch.nn.functional
    out_rows = []
    for d in HEAD_DIMS:
        for n in (4096, 16384):
            batch, heads = TOKENS // n, HIDDEN // d
            for causal in (False, True):
                q, k, v = (torch.randn(batch, n, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     is_causal=causal).transpose(1, 2).float()
                for tma in (False, True):
                    for cfg in EXPLORE_CONFIGS:
                        launch = tf.Launch(autotune=False, tma=tma, blocks={"fwd": cfg}, gluon=False)
                        try:
                            out = tf.flash_attn_func(q, k, v, causal=causal, launch=launch)
                            err = tf._rel_err(out.float(), ref)
                            ms = triton.testing.do_bench(
                                lambda q=q, k=k, v=v, c=causal, la=launch: tf.flash_attn_func(q, k, v, causal=c,
                                                                                              launch=la),
                                warmup=args.warmup, rep=args.rep)
                        except Exception as e:                 # 资源不够之类：记下，继续
                            print(f"  d={d} N={n} causal={causal} tma={tma} cfg={cfg}: 失败 {str(e)[:100]}")
                            continue
                        tfl = flops(batch, heads, n, d, causal, "fwd") / (ms * 1e-3) / 1e12
                        out_rows.append(dict(d=d, N=n, causal=causal, tma=tma, cfg=list(cfg), ms=ms, tflops=tfl,
                                             err=err))
                        print(f"  d={d:<4d}N={n:<6d}causal={causal!s:<6s}tma={tma!s:<6s}cfg={cfg}  "
                              f"{tfl:7.1f} TFLOP/s  err {err:.1e}", flush=True)
    return out_rows


OVERHEAD_NS = (1, 16, 128, 512)


OVERHEAD_TARGET_US = 15.0      # 目标：B = 1、N ≤ 512 时每次调用比内核多出的主机时间


OVERHEAD_ROUNDS = 5            # --overhead 每个形状的 calls 次分几轮（wall_per_call_many 的 rounds）
OVERHEAD_TIMING = f"wall_per_call_many：calls 次分 {OVERHEAD_ROUNDS} 轮，所有形状、实现轮流量，取最快的一轮"


def print_host_overhead(path):
    """已提交的 host_overhead.json：每次 --overhead 测量（键 = --label）里 ours、SDPA 在各个 N 上多出的主机时间
    （每次调用 − CUDA 图里的 GPU 时间），ours 达到目标的点数，和那次的测法（没记的是旧测法：一个调用连续量一组
    取平均）。SDPA 每一行都是同一个调用：它在各行之间的差别就是主机快慢的差别。没有这个文件时什么都不打印。"""
    res = load_json(path)
    if not res:
        return
    labels = [k for k in res if k != "meta"]      # 顶层的 "meta" 是以前每次 --overhead 都盖写的（不是一次测量）
    head = (["测量（--label）"] + [f"N={n} ours / sdpa" for n in OVERHEAD_NS] + [f"ours ≤ {OVERHEAD_TARGET_US:.0f} µs"]
            + ["测法"])
    rows, sdpa = [], {n: [] for n in OVERHEAD_NS}
    for label in labels:
        over = {(r["impl"], r["N"]): r["over_us"] for r in res[label]["rows"]}
        ours = [over.get(("ours", n)) for n in OVERHEAD_NS]
        cells = [f"{_us(over.get(('ours', n)))} / {_us(over.get(('sdpa', n)))}" for n in OVERHEAD_NS]
        met = sum(o is not None and o <= OVERHEAD_TARGET_US for o in ours)
        new = "timing" in res[label]
        rows.append([label] + cells + [f"{met}/{len(OVERHEAD_NS)}", "轮流、取最快" if new else "单组平均（旧）"])
        for n in OVERHEAD_NS:
            if new and over.get(("sdpa", n)) is not None:
                sdpa[n].append(over[("sdpa", n)])
    print(f"主机开销（{os.path.relpath(path)}；B = 1、H = 16、d = 128、causal；µs，每次调用 − GPU 时间，"
          "按测量的先后）：")
    print(format_table(head, rows))
    spread = [max(v) / min(v) for v in sdpa.values() if len(v) > 1 and min(v) > 0]
    if spread:
        print(f"  这台共用主机的快慢在变：同样用新测法，SDPA（同一个调用）多出的时间在各行之间差 "
              f"{_span(spread, '{:.1f}')} 倍（按 N 分别比）。")


def _us(x):
    return "—" if x is None else f"{x:.1f}"


def _ratio_summary(ratios):
    for name, xs in sorted(ratios.items()):
        xs = sorted(xs)
        print(f"  {name}：提交的 / 这次的 = {xs[0]:.2f}–{xs[-1]:.2f}（中位数 {xs[len(xs) // 2]:.2f}，{len(xs)} 个点）")


def compare_rows(res, committed):
    """
    这次测的每一行和提交的 JSON 里同一 (实现, 方向, causal, d, N) 比毫秒数：提交的 / 这次的（> 1 = 这次更快）。
    同一次运行里 SDPA 的比值是机器本身的起伏（共用的主机、GPU 时钟）：ours 的比值要和它放在一起看。
    返回 {(实现, 方向): [比值, …]}。
    """
    old = {(r["provider"], r["mode"], r["causal"], r["d"], r["N"]): r["ms"] for r in committed["rows"]}
    ratios, table = {}, []
    for r in res["rows"]:
        key = (r["provider"], r["mode"], r["causal"], r["d"], r["N"])
        if key not in old:
            continue
        x = old[key] / r["ms"]
        ratios.setdefault(f"{key[0]} {key[1]}", []).append(x)
        table.append([key[0], key[1], str(key[2]), key[3], key[4], f"{old[key]:.3f}", f"{r['ms']:.3f}", f"{x:.2f}"])
    print(format_table(["实现", "方向", "causal", "d", "N", "提交的 ms", "这次 ms", "提交的 / 这次的"], table))
    _ratio_summary(ratios)
    return ratios


def compare_overhead(new, committed):
    """--overhead --compare：每个 (实现, N) 多出的主机时间 over_us，这次的对 host_overhead.json 里最后一次测量。"""
    labels = [k for k in committed if k != "meta" and "rows" in committed[k]]
    last = committed[labels[-1]]
    old = {(r["impl"], r["N"]): r["over_us"] for r in last["rows"]}
    table = [[r["impl"], r["N"], _us(old.get((r["impl"], r["N"]))), _us(r["over_us"])] for r in new["rows"]]
    print(f"主机开销（µs，每次调用 − GPU 时间），对照提交的最后一次测量 {labels[-1]!r}：")
    print(format_table(["实现", "N", "提交的", "这次"], table))


def _load_module(path):
    """按路径加载一份 triton_flash（--overhead 的"改之前"用旧文件）；None → 课本身的 triton_flash（同一份模块，
    flash_decode、fast_launch 用的也是它，不另载一份）。"""
    import importlib.util
    if path is None:
        import triton_flash
        return triton_flash
    spec = importlib.util.spec_from_file_location("triton_flash_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def overhead(args):
    """
    主机开销：B = 1、H = 16、d = 128、bf16、causal 的小形状上，每次调用的墙钟时间（calls 次分 OVERHEAD_ROUNDS 轮、
    所有形状和实现轮流量、取最快的一轮：wall_per_call_many；主机比 GPU 慢时这就是主机时间）减去同一调用在 CUDA 图里
    重放的 GPU 时间。再确认 CUDA 图能捕获、结果和直接调用一致，并用 cProfile 看 N = 128 时主机时间花在哪里。
    """
    import cProfile
    import io
    import pstats

    import torch
    import triton
    tf = _load_module(args.module)
    F = torch.nn.functional
    cases = {}                                          # (N, 实现) → (fn, 输入)
    for n in OVERHEAD_NS:
        q, k, v = (torch.randn(1, n, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cases[(n, "ours")] = (lambda q=q, k=k, v=v: tf.flash_attn_func(q, k, v, causal=True), (q, k, v))
        cases[(n, "sdpa")] = (lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2), (q, k, v))
    walls = wall_per_call_many({key: fn for key, (fn, _) in cases.items()}, args.calls,    # 所有形状轮流量
                               rounds=OVERHEAD_ROUNDS)
    rows = []
    for (n, name), (fn, inputs) in cases.items():
        wall = walls[(n, name)] * 1e6
        try:
            gpu = triton.testing.do_bench_cudagraph(fn, rep=50) * 1e3
            graph = "ok" if graph_matches_eager(fn, inputs) else "结果和直接调用不一致"
        except Exception as e:                              # 记下为什么不能捕获，不中断测量
            gpu, graph = None, f"失败：{str(e).splitlines()[0][:120]}"
        rows.append(dict(impl=name, N=n, wall_us=wall, gpu_us=gpu,
                         over_us=None if gpu is None else wall - gpu, graph=graph))
        print(f"  {args.label:<7s}{name:<6s}N={n:<5d}每次调用 {wall:8.1f} µs  GPU {gpu or float('nan'):7.1f} µs  "
              f"CUDA 图：{graph}", flush=True)
    prof = cProfile.Profile()                           # N = 128 时主机时间花在哪
    fn = cases[(128, "ours")][0]
    prof.enable()
    for _ in range(1000):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
    profile = _relative_paths(buf.getvalue())
    print(profile)
    parts = host_parts(torch, tf) if hasattr(tf, "_check_dense") else None
    return dict(label=args.label, module=args.module or "lecture11/triton_flash.py", timing=OVERHEAD_TIMING,
                meta=gpu_meta(torch, dtype="bfloat16"), rows=rows, profile=profile,
                parts=parts, fastpath=fastpath_checks(torch, tf) if hasattr(tf, "_PLANS") else None)


def _relative_paths(text):
    """剖析结果里的路径改成相对的（仓库文件从仓库根算起，第三方包从 site-packages/ 算起）：JSON 里没有本机路径。"""
    root = os.path.dirname(LESSON) + os.sep
    return re.sub(r"\S*/site-packages/", "site-packages/", text.replace(root, ""))


def host_parts(torch, tf, n=128, calls=5000):
    """N = 128 时主机时间的几块（每次调用的 µs，各自连续调用 calls 次）：参数检查、分配输出、整次调用。"""
    q, k, v = (torch.randn(1, n, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    pieces = {
        "检查参数 _check_dense": lambda: tf._check_dense(q, k, v, 0.0, None, True, None, None, (-1, -1), False, None,
                                                    False, False, None),
        "分配 o、lse（torch.empty ×2）": lambda: (torch.empty_like(q), torch.empty((16, n), device="cuda")),
        "reshape ×3": lambda: (q.reshape(n, 16, 128), k.reshape(n, 16, 128), v.reshape(n, 16, 128)),
        "整次调用 flash_attn_func": lambda: tf.flash_attn_func(q, k, v, causal=True),
    }
    out = {name: t * 1e6 for name, t in wall_per_call_many(pieces, calls, warmup=1).items()}
    for name in pieces:
        print(f"  主机时间的一块：{name:<32s}{out[name]:7.1f} µs", flush=True)
    return out


def fastpath_checks(torch, tf):
    """快速路径（_Plan）和正常启动逐位一致：几种形状，包括不按 16 字节对齐的输入（Triton 按对齐特化）。"""
    out = []
    cases = [dict(b=2, n=1000, hq=16, hk=16, d=128, causal=True, window=(-1, -1)),
             dict(b=3, n=77, hq=8, hk=2, d=64, causal=False, window=(32, 0)),
             dict(b=1, n=1, hq=32, hk=8, d=128, causal=True, window=(-1, -1)),
             dict(b=1, n=300, hq=4, hk=4, d=80, causal=True, window=(-1, -1), offset=1)]
    for c in cases:
        def make(hh, c=c):
            base = torch.randn(c["b"] * c["n"] * hh * c["d"] + c.get("offset", 0), device="cuda", dtype=torch.bfloat16)
            return base[c.get("offset", 0):].view(c["b"], c["n"], hh, c["d"])      # offset = 1：地址不按 16 字节对齐
        q, k, v = make(c["hq"]), make(c["hk"]), make(c["hk"])
        call = lambda q=q, k=k, v=v, c=c: tf.flash_attn_func(q, k, v, causal=c["causal"], window_size=c["window"])  # noqa: E731
        tf._PLANS.clear()
        tf._SEEN.clear()
        slow = call()                   # 正常启动（第一次见到这个形状）
        call()                          # 第二次：正常启动并记下 _Plan
        before = tf._Plan.launches
        fast = call()                   # 快速路径
        used = tf._Plan.launches == before + 1
        ref, ref_lse = tf.reference_attention(q, k, v, causal=c["causal"], window_size=c["window"])
        err = tf._rel_err(fast.double(), ref)
        # 同一组形状换参数（return_lse、causal 反过来）：键必须分得开，结果仍然对
        for _ in range(3):
            o2, lse2 = tf.flash_attn_func(q, k, v, causal=c["causal"], window_size=c["window"], return_lse=True)
        flipped = [tf.flash_attn_func(q, k, v, causal=not c["causal"]) for _ in range(3)][-1]
        ref_flip, _ = tf.reference_attention(q, k, v, causal=not c["causal"])
        err = max(err, tf._rel_err(o2.double(), ref), tf._lse_err(lse2.double(), ref_lse),
                  tf._rel_err(flipped.double(), ref_flip))
        ok = bool(torch.equal(slow, fast)) and used and err < 1e-2
        out.append(dict(case=str(c), plan_used=used, bitwise_equal=bool(torch.equal(slow, fast)), err=err, ok=ok))
        print(f"  快速路径 {c}: 用上了 {used}，和正常启动逐位相同 {bool(torch.equal(slow, fast))}，"
              f"对 float64 参考误差 {err:.1e}", flush=True)
    assert all(r["ok"] for r in out), out
    return out


def plot(res, path, quick=False):
    """2 × 4 个面板（前向 / 反向 × d、causal），每个面板按 N 分组画各实现的 TFLOP/s（ours-atomic 只在反向）；
    图例放在图外，不挡柱子。完整图存到 path（和 JSON 放在一起）；quick=True 时进 lecture11/bench/figures/quick/，
    不动已提交的图。返回路径。"""
    plt = pyplot()
    rows = res["rows"]
    ns = sorted({x["N"] for x in rows})
    colors = {p: f"C{i}" for i, p in enumerate(PROVIDERS)}          # 同一个实现在每个面板里颜色相同
    names = {"ours": "ours (split bwd, default)", "ours-atomic": "ours-atomic (atomic dQ)",
             "gluon": "gluon (FA3-style, Hopper)"}
    fig, axes = plt.subplots(2, 4, figsize=(17, 8.5), sharey="row")
    panels = [(d, c) for d in HEAD_DIMS for c in (False, True)]
    legend = {}
    for r, mode in enumerate(("fwd", "bwd")):
        provs = [p for p in PROVIDERS if any(x["provider"] == p and x["mode"] == mode for x in rows)]
        width = 0.8 / len(provs)
        for c, (d, causal) in enumerate(panels):
            ax = axes[r][c]
            for i, p in enumerate(provs):
                ys = []
                for n in ns:
                    hit = [tflops_of(x) for x in rows if (x["provider"], x["mode"], x["d"], x["causal"], x["N"])
                           == (p, mode, d, causal, n)]
                    ys.append(hit[0] if hit else 0.0)
                legend[p] = ax.bar([j + i * width for j in range(len(ns))], ys, width, color=colors[p],
                                   label=names.get(p, p))
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ns))], [f"{n // 1024}k" for n in ns])
            ax.set_title(f"{mode}  d={d}  {'causal' if causal else 'full'}")
            ax.set_xlabel("sequence length N (B*N = 32k tokens)")
            ax.grid(axis="y", alpha=0.3)
            if c == 0:
                ax.set_ylabel("TFLOP/s (bf16)")
    handles = [legend[p] for p in PROVIDERS if p in legend]
    labels = [names.get(p, p) for p in PROVIDERS if p in legend]
    meta = res["meta"]
    fig.suptitle(f"Our Triton (FA2) and Gluon (FA3-style) kernels vs PyTorch SDPA  ({meta['gpu']}, "
                 f"torch {meta['torch']}, triton {meta['triton']}, {meta['date']})", y=0.995)
    fig.legend(handles, labels, loc="upper center", ncol=len(PROVIDERS), bbox_to_anchor=(0.5, 0.955),
               frameon=False)
    fig.set_layout_engine("tight", rect=(0, 0, 1, 0.92))      # 上面留给标题和图例（save_figure 用这个排版）
    return save_figure(fig, __file__, "tflops", dpi=110, quick=quick, path=path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--quick", action="store_true", help="不测量，只打印已提交的结果")
    ap.add_argument("--out", default=RESULTS, help="测量结果写到哪个文件夹")
    ap.add_argument("--seqlens", type=int, nargs="+", default=list(SEQLENS))
    ap.add_argument("--warmup", type=int, default=25)
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--explore", action="store_true", help="调优实验：前向的固定配置 × 有无 TMA")
    ap.add_argument("--overhead", action="store_true", help="主机开销：小形状上每次调用的时间、CUDA 图捕获")
    ap.add_argument("--module", default=None, help="--overhead 测哪一份 triton_flash.py（默认本文件夹的）")
    ap.add_argument("--label", default="after", help="--overhead 的结果记在 host_overhead.json 的哪个键下")
    ap.add_argument("--calls", type=int, default=2000, help="--overhead 每个形状连续调用的次数")
    ap.add_argument("--replot", action="store_true", help="不测量：由已提交的 JSON 重画 results/triton_bench.png")
    ap.add_argument("--providers", nargs="+", choices=PROVIDERS, default=list(PROVIDERS), help="只测这几列")
    ap.add_argument("--head-dims", type=int, nargs="+", choices=HEAD_DIMS, default=list(HEAD_DIMS))
    ap.add_argument("--compare", action="store_true",
                    help="测完打印和已提交的 JSON（triton_bench.json / host_overhead.json）的比；不画图")
    args = ap.parse_args()
    committed = os.path.join(RESULTS, JSON_NAME)
    if args.replot:
        res = load_json(committed)
        if res is None:
            print(f"SKIP: {os.path.relpath(committed)} 不存在，先在 GPU 上测量")
            sys.exit(77)
        out = plot(res, committed_figure(__file__, PNG_NAME, True), quick=args.quick)
        print(f"由 {os.path.relpath(committed)} 重画了 {os.path.relpath(out)}")
        return
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if args.quick or not has_gpu:
        res = load_json(committed)
        why = "--quick" if args.quick else "没有 GPU"
        if res is None:
            print(f"{why}：还没有提交的测量结果（{os.path.relpath(committed)} 不存在），在 H200 上运行本脚本生成。")
            return
        print(f"{why}：打印已提交的测量结果 {os.path.relpath(committed)}")
        print_table(res)
        print_host_overhead(os.path.join(RESULTS, "host_overhead.json"))
        if args.quick:                                   # 同一张图进 figures/quick/：检查画图代码还能用，不动已提交的图
            print(f"图（由已提交的 JSON 画）：{os.path.relpath(plot(res, None, quick=True))}")
        if report_failures(res):
            sys.exit(1)
        return
    os.makedirs(args.out, exist_ok=True)
    if args.overhead:
        path = os.path.join(args.out, "host_overhead.json")
        res = load_json(path) or {}
        res[args.label] = overhead(args)             # 这次的 GPU、版本记在它自己的 meta 里
        with open(path, "w") as fh:
            json.dump(res, fh, indent=1)
        if args.compare:
            compare_overhead(res[args.label], load_json(os.path.join(RESULTS, "host_overhead.json")))
        return
    if args.explore:
        rows = explore(args)
        with open(os.path.join(args.out, "triton_explore.json"), "w") as fh:
            json.dump(rows, fh, indent=1)
        return
    res = measure(args)
    with open(os.path.join(args.out, JSON_NAME), "w") as fh:
        json.dump(res, fh, indent=1)
    if args.compare:                                  # 短跑只有几列：不画图、不打印目标表
        compare_rows(res, load_json(committed))
    else:
        plot(res, os.path.join(args.out, PNG_NAME))
        print_table(res)
    if report_failures(res):
        sys.exit(1)


if __name__ == "__main__":
    main()
