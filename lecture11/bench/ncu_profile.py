"""
ncu_profile · 我们的注意力内核比 cuDNN 慢，慢在哪？用 Nsight Compute（ncu）的硬件计数器回答。

bench/triton_bench.py 只给时间；时间说不出原因。这里在 H200 上对同一个形状（bf16，B = 8，N = 4096，H = 16，d = 128，
不 causal：和 cuDNN 差距最大的一组）各跑一次，每个内核量这些计数器：
  - 时间（gpu__time_duration）
  - Tensor Core 忙的比例（sm__pipe_tensor_op_*：矩阵乘单元有多少个周期在干活——注意力的上限就是它）
  - 发射槽忙的比例（每个周期有没有 warp 发出指令）、占用率（每个 SM 上同时活着的 warp）
  - 寄存器 / 线程、共享内存 / 块（决定一个 SM 放几个块）
  - warp 停顿的原因（每条发出的指令平均等了几个周期、在等什么：long_scoreboard = 等全局内存，
    barrier = 等 __syncthreads，wait = 等固定延迟，math_pipe_throttle = 运算单元忙，…）
被测的 6 个（"目标"）：
  ours-fwd / ours-bwd     triton_flash.flash_attn_func 的前向 / 反向（默认：split，dK/dV 内核 + dQ 内核 + 预处理）
  gluon-fwd / gluon-bwd   gluon_flash.attention(variant="ws2")（FA3 式的前向，步骤 C；反向 = 默认的那个：5 次矩阵乘，
                          dQ 经共享内存用 TMA 归约加回全局，LSE、D 由生产者用 TMA 读；提交的反向 CSV 量的就是它）
  cudnn-fwd / cudnn-bwd   SDPA 的 cuDNN 后端

运行：
  python3 lecture11/bench/ncu_profile.py [--out DIR]    读 DIR（默认已提交的 results/ncu/）的 ncu_*.csv，打印对照表
                                                        （没有 GPU 也行）
  python3 lecture11/bench/ncu_profile.py --measure --out DIR  GPU + ncu：每个目标一次，写 DIR/ncu_<目标>.csv
                                                        再打印 DIR 的对照表；有目标 ncu 失败时退出码 1
  python3 lecture11/bench/ncu_profile.py --measure --causal [--out DIR]
                                                        同样的形状但 causal（和不 causal 的比停顿）；不给 --out 时
                                                        写 results/ncu/causal/（不盖掉不 causal 的 CSV），读的时候
                                                        --causal 也默认读它。形状记在 DIR/ncu_shape.json，之后读这个
                                                        目录时按它打印；DIR 里已有另一种 causal 的 CSV 时拒绝量。
                                                        提交的一份就在 results/ncu/causal/（只有两个反向）
  python3 lecture11/bench/ncu_profile.py --target ours-fwd    ncu 里面跑的那一段（内部用：热身在计数范围外）
"""
import argparse
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))       # lecture11/bench
LESSON = os.path.dirname(HERE)
sys.path.insert(0, LESSON)
sys.path.insert(0, os.path.join(LESSON, "..", "lecture01"))
from course_utils import format_table, load_json  # noqa: E402
import flash_lab as fl  # noqa: E402  （基准的形状：B·N、H·d 和 triton_bench、gluon_sweep 相同）

SKIP = 77
RESULTS = os.path.join(HERE, "results", "ncu")
CAUSAL_RESULTS = os.path.join(RESULTS, "causal")    # --causal 不给 --out 时的目录：不和不 causal 的 CSV 混在一起
TARGETS = ("ours-fwd", "gluon-fwd", "cudnn-fwd", "ours-bwd", "gluon-bwd", "cudnn-bwd")
SHAPE = dict(B=fl.BENCH_TOKENS // 4096, N=4096, H=fl.BENCH_HIDDEN // 128, d=128, causal=False)   # 同 triton_bench
# （--causal 只改 causal；SHAPE 本身不改）
SHAPE_FILE = "ncu_shape.json"     # --measure 写在 CSV 旁边；没有它的目录（已提交的 results/ncu/）= SHAPE 的默认值
SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "Occupancy", "LaunchStats", "WarpStateStats",
            "SchedulerStats")


# =============================================================================
# ncu 里面跑的那一段
# =============================================================================
def run_target(name, causal=False):
    import torch
    import triton_flash as tf
    B, N, H, d = SHAPE["B"], SHAPE["N"], SHAPE["H"], SHAPE["d"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, N, H, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    if name.startswith("ours"):
        def fwd(q, k, v):
            return tf.flash_attn_func(q, k, v, causal=causal, launch=tf.Launch(gluon=False))
    elif name.startswith("gluon"):
        import gluon_flash as gf

        def fwd(q, k, v):     # 步骤 C（ws2）：提交的 CSV 量的是它；E 只是把它做成持久内核
            return gf.attention(q, k, v, causal=causal, variant="ws2")
    else:
        cudnn = tf.sdpa_fn("sdpa-cudnn")                # 和 bench/triton_bench.py 的 sdpa-cudnn 同一个调用

        def fwd(q, k, v):
            return cudnn(q, k, v, causal)
    backward = name.endswith("bwd")
    qq, kk, vv = (t.clone().requires_grad_(backward) for t in (q, k, v))
    for _ in range(3):                                  # 热身：编译、autotune 都在计数范围之外
        out = fwd(qq, kk, vv)
        if backward:
            out.backward(do)
    out = fwd(qq, kk, vv)
    # 热身的反向把梯度留在了 .grad 里：不清掉的话，计数的那次反向要把新梯度加上去（q、k、v 各一个 grad += 的
    # 逐元素内核，每个 ~90 µs），量到的就不只是注意力的反向。清成 None：新梯度直接放进 .grad
    qq.grad = kk.grad = vv.grad = None
    torch.cuda.synchronize()
    torch.cuda.profiler.start()                         # ncu --profile-from-start off：只数这之后的内核
    if backward:
        out.backward(do)
    else:
        fwd(qq, kk, vv)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def measure(out_dir, targets=TARGETS, causal=False):
    """每个目标一次 ncu，写 out_dir/ncu_<目标>.csv（形状写进 ncu_shape.json），再打印 out_dir 的对照表。
    有目标 ncu 失败时返回 1（表照样打印）。"""
    ncu = shutil.which("ncu") or ("/usr/local/cuda/bin/ncu" if os.path.exists("/usr/local/cuda/bin/ncu") else None)
    if ncu is None:
        print("SKIP: 没有 ncu（Nsight Compute）")
        return SKIP
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, SHAPE_FILE), "w") as fh:      # 这个目录的 CSV 量的是哪个形状
        json.dump(dict(SHAPE, causal=causal), fh)
    failed = []
    for name in targets:
        cmd = [ncu, "--profile-from-start", "off", "--csv", "--page", "raw", "--print-summary", "none"]
        for s in SECTIONS:
            cmd += ["--section", s]
        flag = ["--causal"] if causal else []
        cmd += [sys.executable, os.path.abspath(__file__)] + flag + ["--target", name]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired as exc:          # 一个目标卡住：记下，其余照量，表照样打印
            res = subprocess.CompletedProcess(cmd, returncode=124, stdout=exc.stdout or "",
                                              stderr=f"ncu 超过 {exc.timeout:.0f} s，被停下")
            if isinstance(res.stdout, bytes):
                res.stdout = res.stdout.decode(errors="replace")
        path = os.path.join(out_dir, f"ncu_{name}.csv")
        with open(path, "w") as fh:
            fh.write(res.stdout)
        print(f"  {name}: ncu 退出码 {res.returncode}，{len(res.stdout)} 字节 → {path}", flush=True)
        if res.returncode != 0:
            failed.append(name)
            print(res.stderr[-2000:])
    rc = report(out_dir)
    if failed:
        print(f"✗ ncu 失败的目标：{'、'.join(failed)}（输出见上；它们的 CSV 不完整）")
        return 1
    return rc


# =============================================================================
# 读 CSV、打印（没有 GPU 也行）
# =============================================================================
def measured_shape(res_dir):
    """res_dir 的 CSV 量的是哪个形状：有 ncu_shape.json 就按它，否则是默认的 SHAPE（不 causal）。"""
    path = os.path.join(res_dir, SHAPE_FILE)
    shape = load_json(path)
    if shape is None:
        return SHAPE
    if set(shape) != set(SHAPE):
        raise ValueError(f"{path} 的键应是 {sorted(SHAPE)}，收到 {sorted(shape)}")
    return shape


def read_csv(path):
    """ncu --page raw --csv 的输出 → [{列名: 值}]（每个内核一行）。前面的 ==PROF== 行、第二行的单位跳过。"""
    with open(path) as fh:
        text = fh.read()
    start = text.find('"ID"')
    if start < 0:
        return []
    rows = list(csv.reader(io.StringIO(text[start:])))
    header, body = rows[0], rows[2:]                    # rows[1] 是单位
    return [dict(zip(header, r)) for r in body if len(r) == len(header)]


def num(row, key):
    try:
        return float(row[key].replace(",", ""))
    except (KeyError, ValueError):
        return float("nan")


def first_col(row, pattern):
    """第一个匹配 pattern 的列的数值（不同 ncu 版本的计数器名字略有不同）。"""
    for key in row:
        if re.fullmatch(pattern, key):
            return num(row, key)
    return float("nan")


STALL = re.compile(r"smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)_per_issue_active\.ratio")
IGNORED_STALLS = {"selected", "not_selected"}       # "被选中发射"不是停顿


def summarise(row):
    """一个内核的一行：名字、时间、各项比例、最大的三个停顿原因。"""
    stalls = {}
    for key in row:
        m = STALL.fullmatch(key)
        if m and m.group(1) not in IGNORED_STALLS:
            stalls[m.group(1)] = num(row, key)
    top = sorted(((v, k) for k, v in stalls.items() if v == v), reverse=True)[:3]
    return dict(
        kernel=row.get("Kernel Name", "?"),
        us=num(row, "gpu__time_duration.sum") / 1e3,                 # ns → µs
        sm=num(row, "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
        tensor=first_col(row, r"sm__pipe_tensor_op_(?:gmma|hmma)_cycles_active\.avg\.pct_of_peak_sustained_active"),
        issue=first_col(row, r"(?:sm__inst_issued|smsp__issue_active)\.avg\.pct_of_peak_sustained_active"),
        occupancy=num(row, "sm__warps_active.avg.pct_of_peak_sustained_active"),
        regs=num(row, "launch__registers_per_thread"),
        smem_kb=(num(row, "launch__shared_mem_per_block_dynamic") + num(row, "launch__shared_mem_per_block_static"))
        / 1024,
        cycles_per_issue=sum(stalls.values()) if stalls else float("nan"),
        stalls=top)


def short_name(name, width=34):
    name = name.split("(")[0]
    return name if len(name) <= width else name[:width - 1] + "…"


def kernels(res_dir=RESULTS):
    """res_dir 里每个目标的 CSV → {目标: [每个内核的 summarise]}（按 TARGETS 的顺序，只含有 CSV 的目标）。"""
    out = {}
    for name in TARGETS:
        path = os.path.join(res_dir, f"ncu_{name}.csv")
        if os.path.isfile(path):
            out[name] = [summarise(r) for r in read_csv(path)]
    return out


def totals(res_dir=RESULTS):
    """每个目标一次调用里内核的时间之和（µs）：{目标: (内核数, 合计 µs)}，只含有 CSV 的目标。"""
    return {name: (len(rows), sum(r["us"] for r in rows)) for name, rows in kernels(res_dir).items()}


def vs_cudnn(name, tot):
    """目标的合计时间 / 同方向（fwd / bwd）cuDNN 的合计时间；没有 cuDNN 的 CSV 时 None。"""
    ref = tot.get("cudnn-" + name.rsplit("-", 1)[1])
    return tot[name][1] / ref[1] if ref and ref[1] > 0 else None


def report(res_dir=RESULTS):
    headers = ["目标", "内核", "µs", "SM %", "张量核 %", "发射 %", "占用 %", "寄存器", "共享 KB", "停顿（周期/指令）"]
    rows = []
    found = kernels(res_dir)
    for name, summaries in found.items():
        for s in summaries:
            stall = "  ".join(f"{k} {v:.1f}" for v, k in s["stalls"])
            rows.append([name, short_name(s["kernel"]), f"{s['us']:.0f}", f"{s['sm']:.0f}", f"{s['tensor']:.0f}",
                         f"{s['issue']:.0f}", f"{s['occupancy']:.0f}", f"{s['regs']:.0f}", f"{s['smem_kb']:.0f}",
                         stall])
    if not found:
        print(f"SKIP: 还没有 {os.path.relpath(res_dir, LESSON)}/ncu_*.csv（先在 GPU 上 --measure）")
        return SKIP
    shape = measured_shape(res_dir)
    print(f"形状：bf16，B = {shape['B']}，N = {shape['N']}，H = {shape['H']}，d = {shape['d']}，"
          f"causal = {shape['causal']}；每个目标一次调用里的每个内核")
    print(format_table(headers, rows))
    print("  列：SM % = SM 吞吐占峰值；张量核 % = Tensor Core 在干活的周期比例；发射 % = 有 warp 发出指令的周期比例；\n"
          "  占用 % = 同时活着的 warp 占上限的比例；停顿 = 每条发出的指令平均等了几个周期，最大的三项")
    tot = totals(res_dir)
    table = []
    for name, (count, us) in tot.items():
        ratio = vs_cudnn(name, tot)
        table.append([name, count, f"{us:.0f}", "—" if ratio is None else f"{ratio:.2f}×"])
    print("每个目标一次调用的合计（内核的时间相加；× cuDNN = 合计 / 同方向 cuDNN 的合计）：")
    print(format_table(["目标", "内核数", "合计 µs", "× cuDNN"], table))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description="ncu 计数器：我们的注意力内核 vs cuDNN")
    ap.add_argument("--measure", action="store_true", help="在 GPU 上用 ncu 量（每个目标一次）")
    ap.add_argument("--out", default=None, help="--measure 写 CSV 的目录；不 --measure 时读哪个目录的 CSV"
                    "（默认 results/ncu/，--causal 时 results/ncu/causal/）")
    ap.add_argument("--target", choices=TARGETS, help="（内部用）ncu 里面跑的那一段")
    ap.add_argument("--only", nargs="+", choices=TARGETS, default=TARGETS, help="--measure 只量这几个目标")
    ap.add_argument("--causal", action="store_true", help="量 causal 的同一个形状（默认写 results/ncu/causal/）")
    ap.add_argument("--replot", action="store_true", help="不用 GPU：没有图，只由已提交的 CSV 重印对照表")
    args = ap.parse_args(argv)
    if args.replot and (args.measure or args.target):
        ap.error("--replot 不和 --measure、--target 一起用")
    if args.target:
        run_target(args.target, args.causal)
        return 0
    out = args.out or (CAUSAL_RESULTS if args.causal else RESULTS)
    if args.measure:
        if kernels(out) and measured_shape(out)["causal"] != args.causal:     # 不把两种形状的 CSV 混进一个目录
            print(f"✗ {os.path.relpath(out)} 里已有 causal = {measured_shape(out)['causal']} 的 CSV，"
                  f"这次量的是 causal = {args.causal}：换一个 --out")
            return 2
        return measure(out, args.only, args.causal)
    return report(out)


if __name__ == "__main__":
    sys.exit(main())
