"""
第 4 讲 · 演示 1：积木——RMSNorm 对 LayerNorm，SwiGLU 对 GELU MLP

你会看到：
    1. 两种归一化各自"归一"了什么：LayerNorm 减均值、除标准差，所以对每行加一个常数、乘一个正数都不变；
       RMSNorm 只除均方根，只对乘正数不变——行均值为 0 时两者完全相同。参数：LayerNorm 2d（增益 + 偏置），RMSNorm d。
    2. 代价：每种写法实际派发了哪些 aten 运算、扫过整块张量几遍（每次运行都一样，断言），再在几种形状上
       交错计时取中位数（手写 LayerNorm / RMSNorm、F.layer_norm、F.rms_norm）。CPU 上时间跟着"扫几遍"走：
       逐个运算的 LayerNorm 约是 RMSNorm 的 2 倍，融合的 F.layer_norm 最快，F.rms_norm 在 CPU 上是逐个运算拼的；
       更大、每次都不同的比值来自缺页（临时张量向系统要新内存页），所以计时不断言。
    3. SwiGLU 与 GELU MLP 等参数比较：SwiGLU 有三个矩阵，所以中间宽度取 GELU 的 2/3；参数和 FLOPs 相同。
       在合成语言上训练好的两个检查点（modern 与 modern_gelu，只差 MLP）的 eval 损失与最优损失并排。

运行：python3 lecture04/01_building_blocks.py [--quick] [--seed 0]
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import modern_lm as ml  # noqa: E402
from course_utils import fmt_bytes, fmt_count, format_table  # noqa: E402


def layer_norm_by_hand(x, eps=1e-5):
    """逐个运算写的 LayerNorm（不含增益 / 偏置）：两次规约（均值、方差）。"""
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).pow(2).mean(-1, keepdim=True)
    return (x - mu) * torch.rsqrt(var + eps)


def rms_norm_by_hand(x, eps=1e-5):
    """逐个运算写的 RMSNorm（不含增益）：一次规约。"""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def part_what(gen):
    print("== 1. 各自归一化了什么 ==")
    x = torch.randn(5, 48, dtype=torch.float64, generator=gen)
    a, b = 3.7, 2.5                                        # 每行乘 a、加 b
    rows = []
    eps = 1e-12                                            # eps 很小：否则缩放不变性只近似成立（差 ~eps/方差）
    for name, f in (("LayerNorm", layer_norm_by_hand), ("RMSNorm", rms_norm_by_hand)):
        scale = (f(a * x, eps) - f(x, eps)).abs().max().item()
        shift = (f(x + b, eps) - f(x, eps)).abs().max().item()
        rows.append([name, f"{scale:.1e}", f"{shift:.1e}"])
    print(format_table(["归一化（eps = 1e-12）", "x → 3.7·x 的变化", "x → x + 2.5 的变化"], rows))
    zero_mean = x - x.mean(-1, keepdim=True)
    same = (layer_norm_by_hand(zero_mean) - rms_norm_by_hand(zero_mean)).abs().max().item()
    print(f"行均值为 0 时两者的差：{same:.1e}（LayerNorm = 先减均值、再做 RMSNorm）")
    assert float(rows[0][1]) < 1e-9 and float(rows[0][2]) < 1e-9 and float(rows[1][1]) < 1e-9
    assert float(rows[1][2]) > 0.1 and same < 1e-12


class _OpLog(TorchDispatchMode):
    """记下一次调用实际派发到了哪些 aten 运算（以及每个运算读写了多少个数）。"""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [a for a in args if isinstance(a, torch.Tensor)]
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]
        self.ops.append((func.overloadpacket.__name__, sum(t.numel() for t in ins + outs)))
        return out


def dispatched(f, x):
    """f(x) 派发的 aten 运算名字，和"读 + 写的数 / x 的元素数"（= 扫过整块张量几遍；融合内核内部多读的看不到）。"""
    with torch.no_grad(), _OpLog() as log:
        f(x)
    return [name for name, _ in log.ops], sum(n for _, n in log.ops) / x.numel()


def minor_faults():
    """本进程到现在的缺页中断次数（向系统要新内存页的次数）；没有 resource 模块（Windows）时返回 None。"""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def median_times(cands, x, reps, rounds):
    """
    每个实现每次调用的时间：rounds 轮，每轮里各实现轮流跑 reps 次（交错：别的进程抢 CPU 时各实现受的影响差不多），
    取各轮的中位数；同时数每次调用的缺页中断。单线程计时：2 个线程在忙的机器上会互相等，时间乱跳。
    返回 {名字: (秒, 缺页 / 次 或 None)}。
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        per = {name: [] for name, _ in cands}
        faults = {name: 0 for name, _ in cands}
        with torch.no_grad():
            for _, f in cands:
                f(x)                                         # 预热
            for _ in range(rounds):
                for name, f in cands:
                    pf0 = minor_faults()
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        f(x)
                    per[name].append((time.perf_counter() - t0) / reps)
                    if pf0 is not None:
                        faults[name] += minor_faults() - pf0
    finally:
        torch.set_num_threads(threads)
    has_pf = minor_faults() is not None
    return {name: (statistics.median(ts), faults[name] / (reps * rounds) if has_pf else None)
            for name, ts in per.items()}


def norm_candidates(d):
    g = torch.ones(d)
    cands = [("LayerNorm 逐个运算", layer_norm_by_hand),
             ("RMSNorm 逐个运算", rms_norm_by_hand),
             ("F.layer_norm", lambda t: F.layer_norm(t, (d,)))]
    if hasattr(F, "rms_norm"):
        cands.append(("F.rms_norm（带增益）", lambda t: F.rms_norm(t, (d,), g, 1e-5)))
    return cands


def part_cost(shapes, reps, rounds):
    print("\n== 2. 代价：派发了哪些运算、扫过张量几遍、实测每次调用的时间 ==")
    d0 = shapes[0][1]
    x0 = torch.randn(shapes[0])
    cands = norm_candidates(d0)
    ref = F.layer_norm(x0, (d0,))
    rows, passes = [], {}
    for name, f in cands:
        ops, p = dispatched(f, x0)
        passes[name] = p
        err = (f(x0) - (ref if "Layer" in name or "layer" in name else rms_norm_by_hand(x0))).abs().max().item()
        rows.append([name, len(ops), " ".join(ops), f"{p:.1f}", f"{err:.0e}"])
    print(f"torch {torch.__version__}，CPU：")
    print(format_table(["实现", "运算数", "派发的 aten 运算", "读 + 写 / 元素数", "与参考的最大差"], rows))
    # 这些只取决于 torch 怎么派发，每次运行都一样；计时不断言（随机器和负载变化）
    assert passes["RMSNorm 逐个运算"] < passes["LayerNorm 逐个运算"]
    assert len(dispatched(cands[2][1], x0)[0]) == 1           # F.layer_norm：一个融合内核
    if len(cands) == 4:
        rms_ops = dispatched(cands[3][1], x0)[0]
        print(f"F.rms_norm 在这个 torch 的 CPU 上不是融合内核：派发 {len(rms_ops)} 个运算 = 手写的那几个 + 乘增益，"
              f"所以比不带增益的手写版多扫一遍张量。")
    rows = []
    for n, d in shapes:
        x = torch.randn(n, d)
        t = median_times(norm_candidates(d), x, reps, rounds)
        names = list(t)
        cell = [f"{t[k][0] * 1e6:,.0f} µs" + ("" if t[k][1] is None else f"（{t[k][1]:,.0f}）") for k in names]
        rows.append([f"[{n}, {d}]", fmt_bytes(4 * n * d)] + cell + [f"{t[names[0]][0] / t[names[1]][0]:.1f}×"])
    print(f"\n每次调用的时间（float32，单线程，{rounds} 轮 × {reps} 次交错运行，取各轮中位数；"
          "括号里是每次调用的缺页中断数）：")
    print(format_table(["形状", "张量"] + names + ["LN / RMS（逐个运算）"], rows))
    ln, rms = passes["LayerNorm 逐个运算"], passes["RMSNorm 逐个运算"]
    print(f"没有缺页时，逐个运算的 LayerNorm 约是 RMSNorm 的 {ln / rms:.0f} 倍——正是上表读 + 写遍数之比"
          f"（{ln:.0f} 对 {rms:.0f}）：\n"
          "每个运算把整块张量读一遍、写一遍，时间跟着遍数走；规约次数（2 对 1）只是其中一部分，"
          "减均值、平方、再减一次各是一遍。\n"
          "融合成一个内核的 F.layer_norm 只扫一两遍，在上表里最快；"
          "F.rms_norm 在这个 torch 的 CPU 上是逐个运算拼的（多乘一次增益），不比手写的快。\n"
          "比 2 倍大出来的部分都伴着大量缺页（表里括号；同一形状在别的运行里可以到几十倍）：\n"
          "临时张量大（几百 kB 以上）时，分配器可能每次调用都向系统要新页、用完又还回去，时间被缺页中断主导；\n"
          "哪个实现、哪次运行碰上取决于分配器和机器负载，所以比值每次都不同，这里不断言计时。\n"
          "CPU 上这里的差别由 torch 派发了哪些内核、分配了多少临时张量决定，不是归一化本身；"
          "大模型里归一化只占很小的时间，\n选 RMSNorm 主要因为它更简单、训练同样稳定。")


def part_mlp(d, d_ff_swiglu, quick):
    print("\n== 3. SwiGLU 对 GELU MLP：等参数 ==")
    d_ff_gelu = ml.mlp_width(d_ff_swiglu, "gelu")
    sw, ge = ml.SwiGLU(d, d_ff_swiglu), ml.GeluMLP(d, d_ff_gelu)
    n_sw, n_ge = (sum(p.numel() for p in m.parameters()) for m in (sw, ge))
    rows = [["SwiGLU：w_down(SiLU(w_gate x) ⊙ w_up x)", 3, d_ff_swiglu, fmt_count(n_sw), fmt_count(2 * n_sw)],
            ["GELU：w_down(GELU(w_up x))", 2, d_ff_gelu, fmt_count(n_ge), fmt_count(2 * n_ge)]]
    print(format_table(["MLP", "矩阵", "中间宽度", "参数", "FLOPs / token"], rows))
    assert abs(n_sw - n_ge) <= d, (n_sw, n_ge)                 # 1.5 倍取整最多差一列
    print(f"（d_model = {d}；SwiGLU 的中间宽度取 GELU 的 2/3，Llama 的 d_ff ≈ 8/3·d 就是这么来的。）")
    rows = []
    for name in ("modern", "modern_gelu"):
        model, info = ml.load_or_train(name, quick=quick)
        br = ml.loss_breakdown(model, ml.language(), ml.TRAIN.seq, batch=32 if quick else 128)
        rows.append([name, ml.CHECKPOINTS[name].mlp, fmt_count(model.n_params()), info["steps"],
                     f"{br['all'][0]:.3f}", f"{br['all'][1]:.3f}", f"{br['fresh'][0]:.3f}", f"{br['fresh'][1]:.3f}"])
    print(format_table(["检查点", "MLP", "参数", "训练步数", "eval 损失", "最优", "新块字母损失", "其最优"], rows))
    print("两者只差 MLP。新块的字母只靠前一个字母预测（马尔可夫链），这部分正是 MLP 要记住的统计；"
          "在这么小的任务上两者差别很小；门控 MLP 的好处在大模型上是困惑度上小而稳定的改进，不是数量级的差别。")


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="小形状；检查点不可用时只训几十步")
    ap.add_argument("--seed", type=int, default=0, help="随机种子")
    a = ap.parse_args()
    print(f"随机种子 {a.seed}")
    gen = torch.Generator().manual_seed(a.seed)
    torch.manual_seed(a.seed)
    part_what(gen)
    # 张量 ≤ 8 MB：更大的张量每次都向系统要新的内存页，时间会被缺页中断主导
    shapes = ((64, 256), (512, 1024)) if a.quick else ((64, 256), (512, 1024), (2048, 1024), (4096, 512), (256, 4096))
    part_cost(shapes, reps=5 if a.quick else 20, rounds=5 if a.quick else 9)
    part_mlp(ml.MODERN.d_model, ml.MODERN.d_ff, a.quick)


if __name__ == "__main__":
    main()
