"""
第 2 讲 · 演示 4：KV cache —— 结果不变，运算量从平方降到线性；以及最常见的位置编号 bug

你会看到：
    1. 带 / 不带 KV cache 的贪心生成逐 token 相同，logits 差 ~1e-15。
    2. 生成 N 个 token 的总 FLOPs：不带 cache 每步把整段重算一遍（≈ N·(P + N/2) 个 token 的计算），
       带 cache 每步只算 1 个新 token（≈ P + N 个）。省下的倍数随 N 线性增长（图）。
       公式和 Counter 实测的账逐项相等。
    3. 真实墙钟时间的加速比，和 FLOPs 比并排：numpy 上的小模型每次前向有固定开销，实测加速比小于 FLOPs 比。
    4. position ids 写错（rope_pos0）：解码时每步都从 0 编号、或差一位，程序不报错，logits 的量级看起来也正常，
       只是悄悄变了、贪心选出的 token 也变了；而"整体一致地平移"所有位置则完全无害（RoPE 只看相对位置）。

运行：python3 lecture02/04_kv_cache.py [--quick] [--seed 0]
图：lecture02/figures/04_kv_cache_flops.png
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import transformer_lab as tl  # noqa: E402
from llm_math import LLAMA31_8B  # noqa: E402
from course_utils import fmt_si, format_table, save_figure  # noqa: E402


def part_equivalence(params, cfg, prompt, n_new):
    print("== 1. 带 / 不带 KV cache：结果相同 ==")
    c_pre, c_dec, r_pre, r_dec = tl.Counter(), tl.Counter(), tl.Counter(), tl.Counter()
    toks, logits = tl.generate(params, cfg, prompt, n_new, True, c_pre, c_dec)
    toks_r, logits_r = tl.generate(params, cfg, prompt, n_new, False, r_pre, r_dec)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(logits, logits_r))
    print(f"批 {prompt.shape[0]}、提示 {prompt.shape[1]}、生成 {n_new}：token 相同 = {np.array_equal(toks, toks_r)}，"
          f"logits 最大差 {diff:.1e}")
    assert np.array_equal(toks, toks_r) and diff < 1e-9
    return (c_pre, c_dec), (r_pre, r_dec)


def step_flops(model, batch, prompt, n_new):
    """每一步前向的 FLOPs（公式）：返回 (带 cache, 不带 cache) 两个长度为 n_new 的数组。"""
    cached = [tl.sum_rows(tl.analytic_ops(model, batch, prompt, 0, last_only=True), "flops")]
    cached += [tl.sum_rows(tl.analytic_ops(model, batch, 1, prompt + i, last_only=True), "flops")
               for i in range(n_new - 1)]
    fresh = [tl.sum_rows(tl.analytic_ops(model, batch, prompt + i, 0, last_only=True, with_cache=False), "flops")
             for i in range(n_new)]
    return np.array(cached, dtype=float), np.array(fresh, dtype=float)


def part_flops(cfg, counters, prompt, n_new, n_long):
    print("\n== 2. 运算量：线性 vs 平方 ==")
    (c_pre, c_dec), (r_pre, r_dec) = counters
    B, P = prompt.shape
    cached, fresh = step_flops(cfg, B, P, n_new)
    measured = (c_pre.total("flops") + c_dec.total("flops"), r_pre.total("flops") + r_dec.total("flops"))
    assert measured == (cached.sum(), fresh.sum()), (measured, cached.sum(), fresh.sum())
    print(f"TINY 实测（Counter）= 公式：带 cache {fmt_si(measured[0], 'FLOP')}，不带 {fmt_si(measured[1], 'FLOP')}，"
          f"比 {measured[1] / measured[0]:.1f}×")
    m, P8 = LLAMA31_8B, 512
    cached8, fresh8 = step_flops(m, 1, P8, n_long)
    rows = []
    for N in (16, 128, n_long):
        a, b = cached8[:N].sum(), fresh8[:N].sum()
        rows.append([N, fmt_si(a, "FLOP"), fmt_si(b, "FLOP"), f"{b / a:.1f}×", f"{N * (P8 + N / 2) / (P8 + N):.1f}×"])
    print(f"\n{m.name}，提示 {P8} 个 token，生成 N 个（公式）")
    print(format_table(["N", "带 cache", "不带 cache", "倍数", "粗估 N(P+N/2)/(P+N)"], rows))
    ratio = fresh8.cumsum() / cached8.cumsum()
    assert np.all(np.diff(ratio) > 0) and ratio[-1] > 0.5 * n_long * (P8 + n_long / 2) / (P8 + n_long)
    print("→ 省下的倍数随 N 近似线性增长：生成越长，KV cache 越不可或缺（代价是显存，05 演示算它有多大）。")
    return cached8, fresh8, P8


def best_time(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def part_wallclock(params, cfg, rng, n_new, repeats):
    print("\n== 3. 墙钟时间（numpy、本机 CPU）==")
    prompt = rng.integers(0, cfg.vocab, size=(1, 16))
    t_cache = best_time(lambda: tl.generate(params, cfg, prompt, n_new, use_cache=True), repeats)
    t_fresh = best_time(lambda: tl.generate(params, cfg, prompt, n_new, use_cache=False), repeats)
    c1, c2, r1, r2 = tl.Counter(), tl.Counter(), tl.Counter(), tl.Counter()
    tl.generate(params, cfg, prompt, n_new, True, c1, c2)
    tl.generate(params, cfg, prompt, n_new, False, r1, r2)
    flops_ratio = (r1.total("flops") + r2.total("flops")) / (c1.total("flops") + c2.total("flops"))
    print(format_table(["", "带 cache", "不带 cache", "加速比", "FLOPs 比"],
                       [[f"提示 16、生成 {n_new}（{repeats} 次取最快）", f"{1e3 * t_cache:.1f} ms",
                         f"{1e3 * t_fresh:.1f} ms", f"{t_fresh / t_cache:.1f}×", f"{flops_ratio:.1f}×"]]))
    if t_fresh / t_cache < flops_ratio:
        print("→ 实测加速比小于 FLOPs 比：每次前向都有几十个 numpy 调用的固定开销（与 token 数无关），")
        print("  1 个 token 的小矩阵也跑不满 CPU。GPU 上同样如此——decode 一步的时间主要花在读权重和启动内核上"
              "（第 6、11 讲）。")
    else:
        print("→ 这次实测加速比超过了 FLOPs 比：长序列的重算在本机 BLAS 上效率更低（多线程争用、缓存），")
        print("  而机器忙时计时噪声很大。不加 --quick 会多跑几次取最快；通常实测加速比小于 FLOPs 比（固定开销）。")
    assert flops_ratio > 2


def decode_with_positions(params, cfg, seq, n_prompt, prefill_pos0, decode_pos0):
    """
    用给定的 token 序列 seq [1, n] 做 teacher forcing：prefill 前 n_prompt 个，之后逐个 decode。
    prefill 的 RoPE 起点是 prefill_pos0；decode 时 rope_pos0 = decode_pos0(cache.length)。
    返回每一步（预测下一个 token 时）的 logits，形状 [步数, vocab]。
    """
    cache = tl.KVCache(cfg, 1)
    out = [tl.forward(params, cfg, seq[:, :n_prompt], cache=cache, last_only=True, rope_pos0=prefill_pos0)[0, -1]]
    for t in range(n_prompt, seq.shape[1] - 1):
        logits = tl.forward(params, cfg, seq[:, t:t + 1], cache=cache, rope_pos0=decode_pos0(cache.length))
        out.append(logits[0, -1])
    return np.array(out)


def part_position_bug(params, cfg, rng, n_prompt, n_new):
    print("\n== 4. position ids 的 bug：rope_pos0 ==")
    prompt = rng.integers(0, cfg.vocab, size=(1, n_prompt))
    seq, _ = tl.generate(params, cfg, prompt, n_new)
    ref = decode_with_positions(params, cfg, seq, n_prompt, None, lambda n: None)
    variants = [
        ("正确：rope_pos0 = cache.length", None, lambda n: n),
        ("bug：decode 每步都从 0 编号", None, lambda n: 0),
        ("bug：差一位（cache.length + 1）", None, lambda n: n + 1),
        ("无害：所有位置一致地 +1000", 1000, lambda n: 1000 + n),
    ]
    rows, diffs = [], {}
    for name, pre0, rule in variants:
        got = decode_with_positions(params, cfg, seq, n_prompt, pre0, rule)
        d = np.max(np.abs(got - ref), axis=-1)                     # 每一步的最大差
        agree = np.mean(np.argmax(got, -1) == np.argmax(ref, -1))
        diffs[name] = float(d.max())
        rows.append([name, f"{d[1]:.1e}" if len(d) > 1 else "—", f"{d.max():.1e}", f"{got.std():.2f}",
                     f"{100 * agree:.0f}%"])
    print(f"提示 {n_prompt} 个 token，之后逐个解码 {n_new - 1} 步"
          f"（输入相同，只改位置编号；参考 logits 标准差 {ref.std():.2f}）")
    print(format_table(["位置编号", "第 1 步 decode 最大差", "全程最大差", "logits 标准差", "贪心 token 一致"], rows))
    names = [v[0] for v in variants]
    assert diffs[names[0]] < 1e-9 and diffs[names[3]] < 1e-9
    assert diffs[names[1]] > 1e-3 and diffs[names[2]] > 1e-3
    print("→ bug 不会报错，logits 的量级也和正确的一样（标准差几乎相同）——只有和参考实现逐位比较才看得出来。")
    print("  真实引擎（vLLM 等）显式传 position ids；批里每个请求的位置不同（第 6 讲 ragged batching），更容易写错。")


def plot(cached8, fresh8, P8, path_script, quick=False):
    from course_utils import pyplot
    plt = pyplot()

    N = np.arange(1, len(cached8) + 1)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.5))
    ax1.loglog(N, cached8.cumsum(), lw=2, label="with KV cache")
    ax1.loglog(N, fresh8.cumsum(), lw=2, label="recompute every step")
    ax1.set_xlabel("generated tokens N")
    ax1.set_ylabel("total FLOPs")
    ax1.set_title(f"{LLAMA31_8B.name}, prompt {P8} tokens")
    ax1.legend()
    ratio = fresh8.cumsum() / cached8.cumsum()
    ax2.loglog(N, ratio, lw=3, label="FLOPs ratio (counted)")
    ax2.loglog(N, N * (P8 + N / 2) / (P8 + N), "--", lw=2, label="N(P+N/2)/(P+N)")
    ax2.annotate(f"{N[-1]:,} tokens: {ratio[-1]:,.0f}× fewer FLOPs", xy=(N[-1], ratio[-1]),
                 xytext=(N[0] * 3, ratio[-1] / 3), arrowprops=dict(arrowstyle="->"))
    ax2.set_xlabel("generated tokens N")
    ax2.set_ylabel("recompute / cached (FLOPs)")
    ax2.set_title("FLOPs saved by the KV cache")
    ax2.legend(loc="lower right")
    for ax in (ax1, ax2):
        ax.grid(True, which="both", alpha=0.3)
    return save_figure(fig, path_script, "flops", quick=quick)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="少生成几个 token、计时只跑一次")
    ap.add_argument("--seed", type=int, default=0, help="参数与提示的随机种子")
    ap.add_argument("--no-fig", action="store_true", help="不画图")
    a = ap.parse_args()
    print(f"随机种子 {a.seed}")
    rng = np.random.default_rng(a.seed)
    cfg = tl.TINY
    params = tl.init_params(cfg, seed=a.seed)
    n_new, n_long, repeats = (8, 1024, 1) if a.quick else (24, 8192, 5)

    prompt = rng.integers(0, cfg.vocab, size=(2, 16))
    counters = part_equivalence(params, cfg, prompt, n_new)
    cached8, fresh8, P8 = part_flops(cfg, counters, prompt, n_new, n_long)
    part_wallclock(params, cfg, rng, n_new if a.quick else 2 * n_new, repeats)
    part_position_bug(params, cfg, rng, 12, n_new)
    if not a.no_fig:
        print(f"\n图：{plot(cached8, fresh8, P8, __file__, quick=a.quick)}")


if __name__ == "__main__":
    main()
