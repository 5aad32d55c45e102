#!/usr/bin/env python3
"""GPU 上给第 11 讲的 Triton 练习打分（11.7 v1 前向内核、11.8 v1 反向内核）：先对，再快。

1. 正确性（flash-attn 的判据）：不规则尺寸、causal 与否，误差 ≤ 2 × PyTorch 自己低精度注意力的误差
   （都对 float64 参考）。
2. 速度：和课程自己的 v1 内核在同一次运行里比（交替计时），t_课程 / t_学生 ≥ 1/1.2 满分、以下线性给分
   （Stanford CS149 的规则）；也报成 lecture01 roofline 下界（hw_specs 这块 GPU 的峰值、带宽）的几成。
   每次计时都是新输入、先冲掉 L2；计时后把留下的几次输出再查一遍（缓存结果的作弊过不了）；
   比 roofline 下界还快的结果记为"可疑"、不给分。
学生树里没有课程的内核：用 v2 内核（flash_attn_func）在同一次运行里的时间 × 已提交的校准系数
（lecture11/bench/results/grade_gpu/grade_gpu_h200.json 里 v1 ÷ v2 的时间比）当作"课程的时间"。

用法：
  python3 tools/grade_gpu.py [--ex 11.7|11.8] [--variant 名字 | --from 文件.py] [--out grade_gpu.json]
  python3 tools/grade_gpu.py --dry-run        # 没有 GPU：解释器、极小尺寸，只走一遍流程（分数无意义）
--variant 取错误答案语料（tests/exercises/wrong_lecture11_triton.py 的 GPU_VARIANTS）；--from 文件里定义了
_mini_fwd_kernel / _mini_dkdv_kernel / _mini_dq_kernel / _mini_fwd 中的哪些，就换掉哪些。没有 GPU 时 SKIP（77）。
"""
import argparse
import contextlib
import hashlib
import importlib.util
import inspect
import json
import math
import os
import platform
import random
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
for sub in ("tests", os.path.join("tests", "exercises"), "lecture01"):
    sys.path.insert(0, os.path.join(ROOT, sub))

SPEED_FULL = 1.2                  # t_课程 / t_学生 ≥ 1/1.2 满分
MAX_SCORE = 10.0                  # 每个练习 GPU 部分的分值
CALIBRATION = os.path.join(ROOT, "lecture11", "bench", "results", "grade_gpu", "grade_gpu_h200.json")
KERNELS = ("_mini_visible", "_mini_fwd_kernel", "_mini_dkdv_kernel", "_mini_dq_kernel")
PATCHABLE = ("_mini_fwd_kernel", "_mini_dkdv_kernel", "_mini_dq_kernel", "_mini_fwd")
# (B, N, H, d, causal)：正确性用不规则尺寸；计时用基准的形状（B·N = 32768、H·d = 2048，见 flash_lab.BENCH_*）
GPU_CASES = dict(correct=[(2, 1000, 3, 64, True), (1, 777, 2, 128, False), (3, 129, 4, 32, True),
                          (1, 1531, 2, 16, False)],
                 timing=[(8, 4096, 32, 64, True), (16, 2048, 16, 128, False)], warmup=3, iters=15, recheck=3)
DRY_CASES = dict(correct=[(1, 37, 2, 16, True), (1, 45, 1, 32, False)],
                 timing=[(1, 64, 2, 16, True)], warmup=0, iters=2, recheck=2)


def _load(dry_run, variant):
    """按模式加载 triton_flash（dry-run：解释器）、flash_lab 和（要时）错误答案语料。"""
    if dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
        os.environ["GRADE_GPU_VARIANTS"] = "1"
    from labload import load_lab
    tf = load_lab("lecture11", "triton_flash")
    fl = load_lab("lecture11", "flash_lab")
    wrong = None
    if variant:
        import wrong_lecture11_triton as wrong
    return tf, fl, wrong


def _replacements(args, tf, wrong):
    """被测的替换：{属性: 对象}（空 = 学生树里 triton_flash 自己的内核）。"""
    if args.variant:
        if args.variant not in wrong.GPU_VARIANTS:
            raise SystemExit(f"--variant 只能是 {sorted(wrong.GPU_VARIANTS)}，收到 {args.variant!r}")
        ex, attr, fn, label, _ = wrong.GPU_VARIANTS[args.variant]
        return {attr: fn}, label, ex
    if args.from_file:
        spec = importlib.util.spec_from_file_location("student_kernels", args.from_file)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        reps = {a: getattr(mod, a) for a in PATCHABLE if hasattr(mod, a)}
        if not reps:
            raise SystemExit(f"{args.from_file} 里没有 {PATCHABLE} 中的任何一个名字")
        return reps, f"{os.path.basename(args.from_file)}：{sorted(reps)}", None
    return {}, "triton_flash 里的内核", None


@contextlib.contextmanager
def _patched(tf, reps):
    old = {a: getattr(tf, a) for a in reps}
    for a, v in reps.items():
        setattr(tf, a, v)
    try:
        yield
    finally:
        for a, v in old.items():
            setattr(tf, a, v)


def course_sha(tf):
    """课程 v1 内核源码的 SHA-256（判断手里的 triton_flash 是不是课程自己的解答）。"""
    h = hashlib.sha256()
    for name in KERNELS:
        h.update(inspect.getsource(getattr(tf, name).fn).encode())
    return h.hexdigest()


# ------------------------------------------------------------------ 参考与判据
def _ref(q, k, v, causal):
    """float64 逐行 softmax：q、k、v [B, N, H, d] → out [B, N, H, d]、lse [B, H, N]。"""
    import torch
    Q, K, V = (t.double().transpose(1, 2) for t in (q, k, v))
    s = Q @ K.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return (torch.exp(s - lse[..., None]) @ V).transpose(1, 2), lse


def _sdpa(q, k, v, causal, dtype=None):
    """PyTorch 自己的注意力（F.scaled_dot_product_attention），dtype 给了就先转过去。"""
    import torch.nn.functional as F
    q, k, v = (t if dtype is None else t.to(dtype) for t in (q, k, v))
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=causal).transpose(1, 2)


def _maxerr(a, b):
    return float((a.double() - b.double()).abs().max())


def _grads(fn, qkv, do):
    import torch
    x = [t.detach().clone().requires_grad_(True) for t in qkv]
    return torch.autograd.grad(fn(*x), x, do)


def _fa_criterion(got, ref, torch_out, what):
    """flash-attn 的判据：max|got − ref| ≤ 2·max|torch − ref| + 1e-5。返回 (通过?, 说明)。"""
    ours, theirs = _maxerr(got, ref), _maxerr(torch_out, ref)
    ok = math.isfinite(ours) and ours <= 2 * theirs + 1e-5
    return ok, f"{what} 误差 {ours:.2e}，PyTorch {theirs:.2e}（上限 2×）"


def check_outputs(ex, tf, inputs, outputs, causal, ref_dtype):
    """一组输入上的输出合格吗（正确性阶段和计时后的复查都用它）。ref_dtype：float64 或（大尺寸）float32。"""
    import torch
    if ex == "11.7":
        q, k, v = inputs
        out, lse = outputs
        if ref_dtype == torch.float64:
            ref, ref_lse = _ref(q, k, v, causal)
        else:
            ref, ref_lse = _sdpa(q, k, v, causal, torch.float32), None
        ok, msg = _fa_criterion(out, ref, _sdpa(q, k, v, causal), "O")
        if ok and ref_lse is not None:
            lerr = _maxerr(lse, ref_lse)
            ok, msg = lerr <= 1e-3, msg + f"；LSE 误差 {lerr:.2e}（上限 1e-3）"
        return ok, msg
    q, k, v, o, lse, do = inputs
    ref_fn = (lambda a, b, c: _ref(a, b, c, causal)[0]) if ref_dtype == torch.float64 else \
        (lambda a, b, c: _sdpa(a, b, c, causal, torch.float32))
    want = _grads(ref_fn, [t.to(ref_dtype) for t in (q, k, v)], do.to(ref_dtype))
    low = _grads(lambda a, b, c: _sdpa(a, b, c, causal), (q, k, v), do)
    msgs = []
    for name, g, w, t in zip(("dQ", "dK", "dV"), outputs, want, low):
        ok, msg = _fa_criterion(g, w, t, name)
        msgs.append(msg)
        if not ok:
            return False, "；".join(msgs)
    return True, "；".join(msgs)


# ------------------------------------------------------------------ 输入、运行、计时
def make_inputs(ex, tf, case, dtype, device, gen):
    import torch
    B, N, H, d, causal = case
    q, k, v = (torch.randn(B, N, H, d, device=device, dtype=torch.float32, generator=gen).to(dtype)
               for _ in range(3))
    if ex == "11.7":
        return (q, k, v)
    o, lse = tf.flash_attn_func(q, k, v, causal=causal, return_lse=True, launch=_v2_launch(tf))  # 11.8 不依赖 11.7
    do = torch.randn(B, N, H, d, device=device, dtype=torch.float32, generator=gen).to(dtype)
    return (q, k, v, o, lse, do)


def runner(ex, tf, reps, causal):
    """被测的一次调用：替换好 reps（空 = 原样）再调 mini_attention / mini_attention_backward。"""
    def run(inputs):
        with _patched(tf, reps):
            if ex == "11.7":
                return tf.mini_attention(*inputs, causal=causal)
            return tf.mini_attention_backward(*inputs, causal=causal)
    return run


def _v2_launch(tf):
    """v2 用固定配置、不走 gluon：编译快、每次一样（"课程的 Triton 内核"）。"""
    return tf.Launch(autotune=False, gluon=False)


def v2_runner(ex, tf, causal):
    import torch
    launch = _v2_launch(tf)

    def run(inputs):
        if ex == "11.7":
            return tf.flash_attn_func(*inputs, causal=causal, return_lse=True, launch=launch)
        q, k, v, o, lse, do = inputs
        x = [t.detach().requires_grad_(True) for t in (q, k, v)]
        with torch.enable_grad():
            out = tf.flash_attn_func(*x, causal=causal, launch=launch)
        return torch.autograd.grad(out, x, do)                 # 含一次 v2 前向：校准系数里同样含着
    return run


class Timer:
    """每次：新输入 → 冲 L2 → 计时一次调用。GPU 用 CUDA 事件；dry-run（CPU）用 perf_counter。"""

    def __init__(self, device):
        import torch
        self.cuda = device == "cuda"
        if self.cuda:
            l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
            self.flush_buf = torch.empty(max(256 << 20, 4 * l2), dtype=torch.uint8, device="cuda")

    def once(self, fn, inputs):
        import torch
        if not self.cuda:
            t0 = time.perf_counter()
            out = fn(inputs)
            return time.perf_counter() - t0, out
        self.flush_buf.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        out = fn(inputs)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3, out


def time_interleaved(fns, make, cfg, timer, rng):
    """fns {名字: 调用}：每轮每个名字各一次（轮流先后），每次新输入。
    返回 {名字: 中位数秒}、留给复查的 [(输入, 输出)]。"""
    total = cfg["warmup"] + cfg["iters"]
    keep_at = set(rng.sample(range(cfg["warmup"], total), min(cfg["recheck"], cfg["iters"]))) | {total - 1}
    times, kept = {n: [] for n in fns}, []
    names = list(fns)
    for it in range(total):
        order = names if it % 2 == 0 else names[::-1]
        for name in order:
            inputs = make()
            t, out = timer.once(fns[name], inputs)
            if it >= cfg["warmup"]:
                times[name].append(t)
            if name == "student" and it in keep_at:
                kept.append((inputs, out))
    return {n: sorted(ts)[len(ts) // 2] for n, ts in times.items()}, kept


# ------------------------------------------------------------------ roofline 与评分
def chip_for(name):
    """torch.cuda.get_device_name() → lecture01 hw_specs 的芯片（认不出时 None：不报 roofline）。"""
    import hw_specs
    n = name.upper()
    for key, chip in (("H200", hw_specs.H200), ("B200", hw_specs.B200), ("H100 PCIE", hw_specs.H100_PCIE),
                      ("H100", hw_specs.H100_SXM), ("4090", hw_specs.RTX_4090), ("MI300", hw_specs.MI300X)):
        if key in n:
            return chip
    return None


def roofline_bound(ex, fl, chip, case, esize, prec):
    """lecture01 的 roofline 下界：max(FLOP / 峰值, 必须搬的字节 / 带宽)。字节只数每个张量读写一遍（真下界）。"""
    B, N, H, d, causal = case
    if ex == "11.7":
        flops = fl.attention_flops(B, H, N, d, causal, "fwd")
        nbytes = B * N * H * d * esize * 4 + B * H * N * 4                  # 读 Q、K、V，写 O；写 LSE
    else:
        flops = fl.attention_flops(B, H, N, d, causal, "bwd")
        nbytes = B * N * H * d * esize * 8 + B * H * N * 4 * 2               # 读 Q、K、V、O、dO，写 dQ、dK、dV；LSE、D
    return chip.roofline_time(flops, nbytes, prec)


def speed_score(ratios):
    """ratios：每个计时形状上的 t_课程 / t_学生。每个形状各得 min(1, 1.2·r)（CS149 式：每个形状单独给分），
    练习得 MAX_SCORE × 各形状的平均；返回 (最慢形状的 r, 分数)。"""
    per = [min(1.0, SPEED_FULL * r) for r in ratios]
    return min(ratios), MAX_SCORE * sum(per) / len(per)


def load_calibration():
    try:
        with open(CALIBRATION, encoding="utf-8") as f:
            calib = json.load(f)
    except (OSError, ValueError):
        return None
    return None if calib.get("dry_run") else calib


def grade(ex, tf, fl, reps, args, cfg, device, dtype, baseline, calib):
    import torch
    rng = random.Random(args.seed)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    res = dict(ex=ex, correctness=[], timing=[], status="passed", message="")
    # 1) 正确性
    for case in cfg["correct"]:
        inputs = make_inputs(ex, tf, case, dtype, device, gen)
        try:
            out = runner(ex, tf, reps, case[4])(inputs)
        except NotImplementedError as e:
            res.update(status="not_done", message=str(e), score=0.0, max_score=MAX_SCORE)
            return res
        ok, msg = check_outputs(ex, tf, inputs, out, case[4], torch.float64)
        res["correctness"].append(dict(case=list(case), ok=ok, detail=msg))
        if not ok:
            res.update(status="refused", message=f"结果不对（B, N, H, d, causal = {case}）：{msg}",
                       score=0.0, max_score=MAX_SCORE)
            return res
    # 2) 计时（交替）+ 复查
    chip = chip_for(torch.cuda.get_device_name()) if device == "cuda" else None
    esize = torch.finfo(dtype).bits // 8
    timer, ratios = Timer(device), []
    for case in cfg["timing"]:
        fns = {"student": runner(ex, tf, reps, case[4])}
        if baseline == "mini":
            fns["course"] = runner(ex, tf, {}, case[4])
        fns["v2"] = v2_runner(ex, tf, case[4])
        def fresh(case=case):
            return make_inputs(ex, tf, case, dtype, device, gen)
        meds, kept = time_interleaved(fns, fresh, cfg, timer, rng)
        key = f"{ex}:{','.join(map(str, case))}"
        if baseline == "mini":
            t_course, how = meds["course"], "课程 v1 内核（同一次运行）"
        else:
            factor = ((calib or {}).get("calibration") or {}).get(key)
            t_course = meds["v2"] * (factor or 1.0)
            how = f"v2 × 校准 {factor:.3f}" if factor else "v2（没有校准系数：按 1.0 算）"
        row = dict(case=list(case), t_student=meds["student"], t_course=t_course, t_v2=meds["v2"], baseline=how,
                   mini_over_v2=(meds["course"] / meds["v2"]) if "course" in meds else None)
        for inputs, out in kept:
            ok, msg = check_outputs(ex, tf, inputs, out, case[4], torch.float32)
            if not ok:
                res["timing"].append(row)
                res.update(status="refused", message="计时后复查不通过（输出和这次的输入对不上：缓存了结果？）："
                           + msg, score=0.0, max_score=MAX_SCORE)
                return res
        if chip is not None:
            prec = "bf16" if dtype == torch.bfloat16 else "fp16"
            bound = roofline_bound(ex, fl, chip, case, esize, prec)
            row.update(roofline_s=bound, roofline_fraction=bound / meds["student"], chip=chip.name)
            if meds["student"] < bound:
                res["timing"].append(row)
                res.update(status="suspect", message=f"比 {chip.name} 的 roofline 下界 {bound:.3g} s 还快"
                           f"（{meds['student']:.3g} s）：计时不可信", score=0.0, max_score=MAX_SCORE)
                return res
        row["ratio"] = t_course / meds["student"]
        ratios.append(row["ratio"])
        res["timing"].append(row)
    r, score = speed_score(ratios)
    res.update(speed_ratio=r, score=round(score, 2), max_score=MAX_SCORE,
               message=f"对；最慢的形状上速度是课程内核的 {r:.2f} 倍（每个形状 ≥ {1 / SPEED_FULL:.2f} 倍得满分）")
    return res


def _table(results):
    from course_utils import format_table
    rows = []
    for r in results:
        for t in r.get("timing") or [{}]:
            rows.append([r["ex"], r["variant"], r["status"], ",".join(map(str, t.get("case", []))) or "-",
                         f"{t['t_student'] * 1e3:.3f}" if "t_student" in t else "-",
                         f"{t['t_course'] * 1e3:.3f}" if "t_course" in t else "-",
                         f"{t['ratio']:.2f}" if "ratio" in t else "-",
                         f"{t['roofline_fraction']:.0%}" if "roofline_fraction" in t else "-",
                         f"{r.get('score', 0):.1f}/{r.get('max_score', MAX_SCORE):.0f}"])
    return format_table(["ex", "variant", "status", "B,N,H,d,causal", "student ms", "course ms", "course/student",
                         "of roofline", "score"], rows)


# 检查脚本（lecture11/bench/grade_gpu_check.sh）跑出的每个 JSON 应得的结果
EXPECT = {"solution": "full", "no_tile_skip": "partial", "cache": "refused", "diag_unmasked": "refused",
          "dq_unmasked": "refused"}


def summarize(folder):
    """读检查脚本写的 JSON：核对每一项的结果是否如 EXPECT 所说，写校准文件 grade_gpu_h200.json。返回退出码。"""
    from course_utils import format_table
    rows, bad, calib, meta = [], 0, {}, None
    for name, want in EXPECT.items():
        path = os.path.join(folder, name + ".json")
        if not os.path.isfile(path):
            rows.append([name, want, "缺 JSON", "FAIL"])
            bad += 1
            continue
        with open(path, encoding="utf-8") as f:
            rep = json.load(f)
        meta = meta or rep
        for r in rep["results"]:
            score, status = r.get("score", 0.0), r["status"]
            if want == "full":
                ok = status == "passed" and score >= MAX_SCORE
                for t in r["timing"]:
                    if t.get("mini_over_v2"):
                        calib[f"{r['ex']}:{','.join(map(str, t['case']))}"] = t["mini_over_v2"]
            elif want == "partial":       # 对、但慢：分数必须正好是规则给的（speed_score）
                rule = speed_score([t["ratio"] for t in r["timing"]])[1] if r["timing"] else -1
                ok = status == "passed" and 0 < score < MAX_SCORE and abs(score - round(rule, 2)) < 1e-6
            else:
                ok = status == "refused" and score == 0
            bad += not ok
            rows.append([f"{name} ({r['ex']})", want, f"{status} {score:.2f}/{MAX_SCORE:g}", "ok" if ok else "FAIL"])
    print(format_table(["run", "expected", "got", "check"], rows))
    if meta is not None:
        out = dict(gpu=meta["gpu"], torch=meta["torch"], triton=meta["triton"], dtype=meta["dtype"],
                   dry_run=meta["dry_run"], course_kernel_sha256=meta["course_kernel_sha256"],
                   calibration=calib, note="t_course ≈ t_v2 × calibration[ex:B,N,H,d,causal]（学生树里用）")
        path = os.path.join(folder, "grade_gpu_h200.json" if not meta["dry_run"] else "calibration_dry_run.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
        print(f"校准系数写到 {path}")
    print("GPU 评分检查：" + ("全部符合预期" if not bad else f"{bad} 项不符合预期"))
    return 1 if bad else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ex", choices=("11.7", "11.8"), help="只评一个练习（默认两个都评）")
    ap.add_argument("--variant", help="错误答案语料里 GPU_VARIANTS 的名字（如 cache、no_tile_skip）")
    ap.add_argument("--from", dest="from_file", help="从这个 .py 文件取被测内核")
    ap.add_argument("--baseline", choices=("auto", "mini", "v2"), default="auto",
                    help="课程的时间：mini = 课程 v1 内核（要有课程的解答），v2 = v2 内核 × 校准系数；"
                         "auto：手里的 v1 内核（没被替换的那一份）是课程的解答就用 mini")
    ap.add_argument("--out", default=os.path.join(ROOT, "grade_gpu.json"))
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument("--dry-run", action="store_true", help="没有 GPU：解释器里的极小尺寸，只走一遍流程")
    ap.add_argument("--summarize", metavar="DIR", help="核对 grade_gpu_check.sh 写在 DIR 里的结果、写校准文件")
    args = ap.parse_args(argv)
    if args.summarize:
        return summarize(args.summarize)
    if args.variant and args.from_file:
        ap.error("--variant 和 --from 只能给一个")
    try:
        import torch
    except ImportError:
        print("SKIP: 没有安装 torch")
        return 77
    if not args.dry_run and not torch.cuda.is_available():
        print("SKIP: 没有 CUDA GPU（没有 GPU 时可以用 --dry-run 走一遍流程，或 make grade 做 CPU 评分）")
        return 77
    if importlib.util.find_spec("triton") is None:
        print("SKIP: 没有安装 triton")
        return 77
    tf, fl, wrong = _load(args.dry_run, args.variant)
    import triton
    reps, label, variant_ex = _replacements(args, tf, wrong)
    exes = [args.ex] if args.ex else ([variant_ex] if variant_ex else ["11.7", "11.8"])
    device = "cpu" if args.dry_run else "cuda"
    dtype = torch.float16 if args.dry_run else torch.bfloat16          # 解释器里 bf16 算不对（见 triton_flash）
    cfg = DRY_CASES if args.dry_run else GPU_CASES
    sha = course_sha(tf)
    calib = load_calibration()
    baseline = args.baseline
    if baseline == "auto":                   # 没被替换的内核就是课程的解答 ⇔ 源码和校准文件里记的一样（或有语料）
        known = (calib or {}).get("course_kernel_sha256")
        baseline = "mini" if (known == sha or os.path.isfile(os.path.join(ROOT, "tests", "exercises",
                                                                           "wrong_lecture11_triton.py"))) else "v2"
    results = []
    for ex in exes:
        t0 = time.perf_counter()
        r = grade(ex, tf, fl, reps, args, cfg, device, dtype, baseline, calib)
        r.update(variant=args.variant or ("from" if args.from_file else "student"), label=label,
                 seconds=round(time.perf_counter() - t0, 1))
        results.append(r)
    report = dict(gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter, dry run)",
                  torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
                  dtype=str(dtype).replace("torch.", ""), dry_run=args.dry_run, baseline=baseline,
                  course_kernel_sha256=sha,
                  speed_rule=(f"score = {MAX_SCORE:g} × mean over timed shapes of "
                              f"min(1, {SPEED_FULL} × t_course/t_student)"),
                  cases=cfg, results=results)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, ensure_ascii=False, indent=1)
    print(f"{report['gpu']}，torch {report['torch']}，triton {report['triton']}，{report['dtype']}，基准：{baseline}")
    print(_table(results))
    for r in results:
        score = r.get('score', 0)
        print(f"练习 {r['ex']}（{r['label']}）：{r['status']}，{score:.1f}/{MAX_SCORE:g} 分——{r['message']}")
    print(f"写到 {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
