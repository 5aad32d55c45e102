"""
第 1 讲 · 演示 1：参数都去哪儿了？一个 token 要算多少次？

你会看到：
    1. 十个真实模型（GPT-2 到 Llama-3.1-405B）的参数按组拆开：词嵌入 / 注意力 / MLP / 归一化 / lm_head，
       总数和官方公布的数字对得上（1% 以内）；唯一的例外 GPT-3-13B 差 1.1%：论文表 2.1 同一行把 d_model
       印成 5140，而 40 个头 × 128 = 5120。按印出来的 5140 算正好得到官方的 13.0B，差距来自这个印刷值。
    2. 模型越大，MLP 占的比例越高、词嵌入占的比例越低：1B 模型有 1/5 的参数是词嵌入，405B 只有 1%。
    3. 每个 token 的前向 FLOPs ≈ 2 × 参数量（每个权重一次乘加）；上下文变长后注意力再加一项 4·L·H·dh·ctx，
       8B 模型要到约 2.9 万个 token，注意力的运算才追上矩阵乘法。

运行：python3 lecture01/01_params_flops.py [--quick]
图：lecture01/figures/01_params_flops_groups.png
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import llm_math as M  # noqa: E402
from course_utils import fmt_count, fmt_si, format_table, pyplot, save_figure  # noqa: E402

GROUPS = ("embeddings", "attention", "mlp", "norms", "lm_head", "other")
GROUP_ZH = {"embeddings": "词嵌入", "attention": "注意力", "mlp": "MLP", "norms": "归一化", "lm_head": "lm_head",
            "other": "偏置等"}
CTXS = (0, 8192, 32768, 131072)


def structure_table(models):
    rows = []
    for m in models:
        rows.append([m.name, m.n_layers, m.d_model, f"{m.n_heads}/{m.n_kv_heads}", m.d_head, m.d_ff,
                     f"{m.vocab:,}", "是" if m.tied else "否"])
    return format_table(["模型", "L", "d", "H/G", "dh", "d_ff", "V", "共享"], rows)


def params_row(m, pub_name):
    """一行：m 的各组参数、合计，和 PUBLISHED_PARAMS[pub_name] 的官方数字比较（差、容差）。"""
    g = m.param_groups()
    n = m.n_params()
    pub, exact = M.published_count(pub_name)          # 有精确计数就和精确计数比（不和四舍五入的 1.23B 比）
    tol, _why = M.param_tolerance(pub_name)
    return ([m.name] + [fmt_count(g[k]) if g[k] else "0" for k in GROUPS]
            + [f"{n:,}", f"{pub:,.0f}" + ("（精确）" if exact else "（公布，四舍五入）"), f"{(n - pub) / pub:+.2%}",
               f"{tol:.1%}"])


def params_table(models):
    rows = [params_row(m, m.name) for m in models]
    # 对照行：GPT-3 13B 按论文表 2.1 印的 d_model = 5140（不是预设，只为说明官方 13.0B 的来历）
    rows.append(params_row(M.GPT3_13B_AS_PRINTED, M.GPT3_13B.name))
    return format_table(["模型"] + [GROUP_ZH[k] for k in GROUPS] + ["合计", "官方", "差", "容差"], rows)


def share_table(models):
    rows = []
    for m in models:
        g = m.param_groups()
        n = m.n_params()
        rows.append([m.name] + [f"{100 * g[k] / n:.1f}%" for k in GROUPS])
    return format_table(["模型"] + [GROUP_ZH[k] for k in GROUPS], rows)


def flops_table(models, ctxs):
    rows = []
    for m in models:
        row = [m.name, fmt_count(m.matmul_params()), f"{m.linear_flops_per_token() / (2 * m.n_params()):.3f}"]
        for c in ctxs:
            f = m.flops_per_token(c)
            row.append(f"{fmt_si(f, 'FLOP')} ({100 * m.attn_flops_per_token(c) / f:.0f}%)")
        row.append(f"{m.attn_crossover_ctx():,.0f}")
        rows.append(row)
    heads = ["模型", "乘法参数", "FLOPs/2N"] + [f"ctx={c:,}（注意力占比）" for c in ctxs] + ["注意力=矩阵乘法的 ctx"]
    return format_table(heads, rows)


def plot_groups(models, quick=False):
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(16, 6.5), gridspec_kw={"width_ratios": [1.1, 1]})
    colors = {"embeddings": "#4c72b0", "attention": "#dd8452", "mlp": "#55a868", "norms": "#c44e52",
              "lm_head": "#8172b3", "other": "#937860"}
    names = [m.name for m in models]
    left = [0.0] * len(models)
    for k in GROUPS:
        frac = [m.param_groups()[k] / m.n_params() for m in models]
        ax1.barh(names, frac, left=left, color=colors[k], label=k)
        left = [a + b for a, b in zip(left, frac)]
    ax1.set_xlabel("fraction of parameters")
    ax1.set_xlim(0, 1)
    ax1.invert_yaxis()
    ax1.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
    ax1.set_title("Where the parameters are: MLP grows, embeddings shrink")

    ctx = [2 ** i for i in range(8, 18)]
    for m in models:
        if m.name.startswith(("Llama-3.1", "GPT-3")):
            ax2.loglog(ctx, [m.flops_per_token(c) for c in ctx], lw=2, label=m.name)
    m8 = M.LLAMA31_8B
    x8 = m8.attn_crossover_ctx()
    ax2.annotate(f"8B: attention = matmuls\nat {x8 / 1000:.0f}K tokens", xy=(x8, m8.flops_per_token(x8)),
                 xytext=(300, 5e9), arrowprops=dict(arrowstyle="->"))
    ax2.set_ylim(3e9, None)
    ax2.set_xlabel("context length (tokens)")
    ax2.set_ylabel("forward FLOPs per token")
    ax2.set_title("FLOPs/token = 2·N_matmul + 4·L·H·dh·ctx")
    ax2.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax2.grid(True, which="both", alpha=0.3)
    return save_figure(fig, __file__, "groups", quick=quick)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="小规模版本（本脚本本来就快：只少画几个上下文长度）")
    ap.add_argument("--no-fig", action="store_true", help="不画图")
    args = ap.parse_args()
    models = list(M.PRESETS.values())
    ctxs = CTXS[:3] if args.quick else CTXS

    print("== 1. 结构（出处见 SOURCES.md 第 2 节；GPT-2/3 的 d_ff 是等效 SwiGLU 宽度 8d/3）==")
    print(structure_table(models))
    print("\n== 2. 参数按组拆开，和官方总数比较 ==")
    print(params_table(models))
    for m in models:
        print(f"   {m.name:15s} 出处：{M.PUBLISHED_PARAMS[m.name][1]}")
    for name, (tol, why) in M.PARAM_TOL_EXCEPTIONS.items():
        print(f"   注意 {name} 的容差放宽到 {tol:.1%}（其余 {M.PARAM_TOL:.0%}）：{why}")
    print("\n== 3. 各组占比：模型越大，MLP 越占大头，词嵌入越不重要 ==")
    print(share_table(models))
    print("\n== 4. 每个 token 的前向 FLOPs：≈ 2 × 参数量；注意力项随上下文线性增长 ==")
    print(flops_table(models, ctxs))

    # ---- 关键结论：断言 ----
    for m in models:
        g = m.param_groups()
        assert sum(g.values()) == m.n_params()
        pub, exact = M.published_count(m.name)
        assert not exact or m.n_params() == pub, m.name               # 有精确计数的：逐个相等
        tol, why = M.param_tolerance(m.name)
        assert abs(m.n_params() - pub) / pub < tol, m.name
        assert tol == M.PARAM_TOL or why, m.name                      # 放宽容差必须写明原因
        assert m.linear_flops_per_token() == 2 * m.matmul_params()
        shares = [m.attn_flops_per_token(c) / m.flops_per_token(c) for c in ctxs]
        assert all(a < b for a, b in zip(shares, shares[1:]))          # 上下文越长，注意力占比越大
        crossover = m.attn_crossover_ctx()
        assert abs(m.attn_flops_per_token(crossover) - m.linear_flops_per_token()) < 1e-6 * m.linear_flops_per_token()
    # GPT-3 13B：官方 13.0B；印出来的 d=5140 在 1% 内复现它，我们的 d=5120 预设差 1% 以上（已知差距）
    pub13 = M.PUBLISHED_PARAMS[M.GPT3_13B.name][0]
    gap_printed = abs(M.GPT3_13B_AS_PRINTED.n_params() - pub13) / pub13
    gap_ours = abs(M.GPT3_13B.n_params() - pub13) / pub13
    assert gap_printed < M.PARAM_TOL < gap_ours < M.param_tolerance(M.GPT3_13B.name)[0]
    llama = [M.LLAMA32_1B, M.LLAMA32_3B, M.LLAMA31_8B, M.LLAMA31_70B, M.LLAMA31_405B]
    emb = [(m.param_groups()["embeddings"] + m.param_groups()["lm_head"]) / m.n_params() for m in llama]
    assert emb[0] > 0.2 and emb[-1] < 0.02 and emb[2] > emb[3] > emb[4]     # 8B/70B/405B 都不共享，可以直接比
    # "2N 规则"：前向 FLOPs/token 和 2·n_params 相差不到词嵌入那一块
    for m in (M.LLAMA31_8B, M.LLAMA31_70B, M.LLAMA31_405B):
        assert abs(m.linear_flops_per_token() / (2 * m.n_params()) - 1) < 0.07

    print(f"\n结论：前向 FLOPs/token ≈ 2N（8B：{fmt_si(M.LLAMA31_8B.linear_flops_per_token(), 'FLOP')}）；"
          f"词嵌入 + lm_head 占比从 1B 的 {emb[0]:.0%} 降到 405B 的 {emb[-1]:.1%}；"
          f"注意力在 8B 模型约 {M.LLAMA31_8B.attn_crossover_ctx():,.0f} 个 token 时追上矩阵乘法。"
          f"GPT-3-13B 官方 {pub13 / 1e9:.1f}B（论文表 2.1）：按论文印的 d=5140 差 {gap_printed:.2%}，"
          f"按 40×128 = 5120 差 {gap_ours:.2%}。")
    if not args.no_fig:
        path = plot_groups(models, quick=args.quick)
        print(f"图已保存：{os.path.relpath(path)}")


if __name__ == "__main__":
    main()
