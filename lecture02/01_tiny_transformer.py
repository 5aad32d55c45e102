"""
第 2 讲 · 演示 1：一个会记账的小 Transformer —— 参数、生成、每个运算的 FLOPs 与字节

你会看到：
    1. TINY（4 层、d=128、GQA 8/2）的参数按用途拆开，逐个元素数出来的和第 1 讲 llm_math 的公式一模一样；
       MLP 占了大头。
    2. 贪心生成：随机权重的模型也会确定地吐出一串 token；带 / 不带 KV cache 结果相同。
    3. prefill（整段提示一次算完）与 decode（每步 1 个 token）的逐运算账本：FLOPs、权重 / KV / 激活字节。
       每个 token 的 FLOPs 两者差不多，但 decode 每个 token 要把全部权重再读一遍：
       prefill 的算术强度（FLOPs/字节）是 decode 的十几到几十倍——这就是"decode 受带宽限制"的来源。

运行：python3 lecture02/01_tiny_transformer.py [--quick] [--seed 0]
图：lecture02/figures/01_tiny_transformer_breakdown.png
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import transformer_lab as tl  # noqa: E402
from hw_specs import H100_SXM  # noqa: E402
from course_utils import fmt_si, format_table, save_figure  # noqa: E402

# 我们的分组名 → llm_math.ModelConfig.param_groups 的键
GROUP_TO_LLM_MATH = {"词嵌入": "embeddings", "注意力 Wq/Wk/Wv/Wo": "attention", "MLP": "mlp",
                     "RMSNorm 增益": "norms", "lm_head": "lm_head"}
KINDS = (("w", "weights"), ("kv", "KV cache"), ("act", "activations"))


def show_params(cfg, params):
    mine = tl.param_groups(params)
    formula = cfg.to_model_config().param_groups()
    total = tl.count_params(params)
    rows = []
    for name, key in GROUP_TO_LLM_MATH.items():
        assert mine[name] == formula[key], (name, mine[name], formula[key])
        rows.append([name, f"{mine[name]:,}", f"{formula[key]:,}", f"{100 * mine[name] / total:.1f}%"])
    rows.append(["合计", f"{total:,}", f"{cfg.to_model_config().n_params():,}", "100%"])
    print(format_table(["参数组", "逐个数出来", "llm_math 公式", "占比"], rows))
    assert max(mine, key=mine.get) == "MLP"
    print("→ 两列完全相同；MLP 的 3 个矩阵（3·d·d_ff/层）是参数的大头。")


def show_generation(cfg, params, prompt, n_new):
    toks, logits = tl.generate(params, cfg, prompt, n_new, use_cache=True)
    toks_ref, logits_ref = tl.generate(params, cfg, prompt, n_new, use_cache=False)
    assert np.array_equal(toks, toks_ref)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(logits, logits_ref))
    assert diff < 1e-9, diff
    top_p = [float(tl.softmax(step)[0].max()) for step in logits]
    print(f"提示（{prompt.shape[1]} 个 token）：{prompt[0].tolist()}")
    print(f"生成（{n_new} 个，贪心）：      {toks[0, prompt.shape[1]:].tolist()}")
    print(f"每步最大概率：{' '.join(f'{p:.2f}' for p in top_p)}")
    print(f"带 / 不带 KV cache：token 相同，logits 最大差 {diff:.1e}（权重是随机的，所以生成的是'胡话'，"
          f"但计算量与真模型同构）")


def count_phases(cfg, params, prompt):
    """prefill 整段提示，再 decode 一步；两次前向各记一本账，并与解析公式逐项核对。"""
    B, P = prompt.shape
    cache = tl.KVCache(cfg, B)
    c_pre, c_dec = tl.Counter(), tl.Counter()
    logits = tl.forward(params, cfg, prompt, cache=cache, counter=c_pre, last_only=True)
    nxt = np.argmax(logits[:, -1], axis=-1)[:, None]
    tl.forward(params, cfg, nxt, cache=cache, counter=c_dec, last_only=True)
    for counter, (T, pos0) in ((c_pre, (P, 0)), (c_dec, (1, P))):
        want = tl.analytic_ops(cfg, B, T, pos0, last_only=True)
        for op, row in want.items():
            for key, val in row.items():
                assert abs(counter.rows[op][key] - val) <= 1e-9 * max(1.0, val), (op, key)
    return c_pre, c_dec


def group_shares(c_pre, c_dec):
    """按 OP_GROUPS 合并后，两个阶段里每组占 FLOPs、占字节的百分比并排。"""
    rows = []
    shares = []
    for c in (c_pre, c_dec):
        merged, flops = c.merged(tl.OP_GROUPS), c.total("flops")
        nbytes = sum(c.total(k) for k, _ in KINDS)
        shares.append({g: (r["flops"] / flops, (r["w"] + r["kv"] + r["act"]) / nbytes) for g, r in merged.items()})
    for g in tl.OP_GROUPS:
        (fp, bp), (fd, bd) = shares[0][g], shares[1][g]
        rows.append([g, f"{100 * fp:.1f}%", f"{100 * fd:.1f}%", f"{100 * bp:.1f}%", f"{100 * bd:.1f}%"])
    return format_table(["运算组", "prefill FLOPs", "decode FLOPs", "prefill 字节", "decode 字节"], rows)


def summarize(counter, n_tokens):
    flops = counter.total("flops")
    by_kind = {k: counter.total(k) for k, _ in KINDS}
    nbytes = sum(by_kind.values())
    return {"flops_tok": flops / n_tokens, "bytes_tok": nbytes / n_tokens, "intensity": flops / nbytes,
            **{k: v / nbytes for k, v in by_kind.items()}}


def dominant(counter, key):
    merged = counter.merged(tl.OP_GROUPS)
    return max(merged, key=lambda g: merged[g][key])


def plot(c_pre, c_dec, n_prompt, path_script, quick=False):
    from course_utils import pyplot
    plt = pyplot()

    groups = list(tl.OP_GROUPS)
    labels = ["embed", "q/k/v/o proj", "attn core", "KV write", "MLP", "lm_head", "elementwise"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.5))
    y = np.arange(len(groups))
    for off, (c, name) in zip((-0.2, 0.2), ((c_pre, f"prefill ({n_prompt} tokens)"), (c_dec, "decode (1 token)"))):
        merged = c.merged(tl.OP_GROUPS)
        share = [100 * merged[g]["flops"] / c.total("flops") for g in groups]
        ax1.barh(y + off, share, height=0.4, label=name)
    ax1.set_yticks(y, labels)
    ax1.invert_yaxis()
    ax1.set_xlabel("share of FLOPs (%)")
    ax1.set_title("Where the FLOPs go")
    ax1.legend()
    phases = [("prefill", summarize(c_pre, n_prompt)), ("decode", summarize(c_dec, 1))]
    bottom = np.zeros(2)
    for key, name in KINDS:
        vals = np.array([s[key] * s["bytes_tok"] for _, s in phases]) / 1e6
        ax2.bar([p for p, _ in phases], vals, bottom=bottom, label=name)
        bottom += vals
    for i, (_, s) in enumerate(phases):
        ax2.text(i, bottom[i] + 0.02 * bottom.max(), f"{s['intensity']:.0f} FLOP/B", ha="center")
    ax2.set_ylim(0, 1.15 * bottom.max())
    ax2.set_ylabel("MB moved per token (BF16)")
    ax2.set_title("Bytes per token: decode re-reads all weights")
    ax2.legend(loc="center left")
    return save_figure(fig, path_script, "breakdown", quick=quick)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="短提示、少生成几个 token")
    ap.add_argument("--seed", type=int, default=0, help="参数与提示的随机种子")
    ap.add_argument("--no-fig", action="store_true", help="不画图")
    a = ap.parse_args()
    n_prompt, n_new = (32, 8) if a.quick else (128, 24)
    cfg = tl.TINY
    print(f"随机种子 {a.seed}；配置 {cfg}")
    params = tl.init_params(cfg, seed=a.seed)
    prompt = np.random.default_rng(a.seed).integers(0, cfg.vocab, size=(1, n_prompt))

    print("\n== 1. 参数都在哪儿 ==")
    show_params(cfg, params)

    print("\n== 2. 贪心生成 ==")
    show_generation(cfg, params, prompt[:, :8], n_new)

    print("\n== 3. 逐运算的账本（BF16 字节；Counter 已与 analytic_ops 逐项核对）==")
    c_pre, c_dec = count_phases(cfg, params, prompt)
    print(tl.ops_table(c_pre.rows, "ops", f"prefill：1 个序列 × {n_prompt} 个 token（只对最后一个位置算 lm_head）"))
    print()
    print(tl.ops_table(c_dec.rows, "ops", f"decode：已有 {n_prompt} 个位置，再来 1 个 token"))
    print()
    print(group_shares(c_pre, c_dec))
    s_pre, s_dec = summarize(c_pre, n_prompt), summarize(c_dec, 1)
    rows = [[name, fmt_si(s["flops_tok"], "FLOP"), fmt_si(s["bytes_tok"], "B"),
             f"{100 * s['w']:.0f}% / {100 * s['kv']:.0f}% / {100 * s['act']:.0f}%", f"{s['intensity']:.1f}"]
            for name, s in (("prefill", s_pre), ("decode", s_dec))]
    print()
    print(format_table(["阶段", "FLOPs/token", "字节/token", "权重 / KV / 激活", "FLOP/字节"], rows))

    top_pre, top_dec = dominant(c_pre, "flops"), dominant(c_dec, "flops")
    print(f"\n→ FLOPs 的大头：prefill 是「{top_pre}」，decode 也是「{top_dec}」（矩阵乘法 ≈ 2 × 参数量 / token）。")
    print(f"→ 字节：decode 每个 token 要读全部权重（{100 * s_dec['w']:.0f}% 的字节是权重）；"
          f"prefill 把一次权重读取分摊给 {n_prompt} 个 token。")
    print(f"→ 算术强度 prefill {s_pre['intensity']:.0f} vs decode {s_dec['intensity']:.1f} FLOP/字节："
          f"{H100_SXM.name} 的屋脊点 {H100_SXM.ridge_point():.0f}，decode 远在其下 → 受带宽限制"
          f"（03 演示用真实模型再算一遍）。")
    print("→ TINY 的 d 只有 128，激活字节显得不小；真实模型里 d 是几千，权重与 KV 远大于激活。")
    assert top_pre == top_dec == "MLP 三个矩阵"
    assert s_dec["w"] > 0.5 and s_pre["intensity"] > 10 * s_dec["intensity"]
    assert abs(s_pre["flops_tok"] / s_dec["flops_tok"] - 1) < 0.5     # 每 token 的 FLOPs 同一量级

    if not a.no_fig:
        print(f"\n图：{plot(c_pre, c_dec, n_prompt, __file__, quick=a.quick)}")


if __name__ == "__main__":
    main()
