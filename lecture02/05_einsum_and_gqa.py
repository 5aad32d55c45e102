"""
第 2 讲 · 演示 5：einsum 记号与 FLOPs 规则；MHA / GQA / MQA 省下了什么

你会看到：
    1. 一层 Transformer 的每个矩阵乘都写成 einsum（How to Scale Your Model 第 4 章的记号）：
       字母 = 维度；两个输入都有、输出没有的字母被求和（收缩维）；两个输入和输出都有的是批维。
       FLOPs 规则：收缩的 FLOPs = 2 × 所有出现过的维度长度之积。用 np.einsum 逐个算出来，
       与模块里的 linear / attention_core 结果相同，按规则算的 FLOPs 与 Counter 的账相同。
    2. GQA：H 个 query 头共用 G 组 K/V。Llama-3.1-8B / 70B 的 MHA（G=H）、GQA（G=8）、MQA（G=1）对比：
       KV cache 每 token 的字节按 G 线性缩小，注意力 FLOPs 一点不变——省的是显存和 decode 时读的字节。
    3. 在 TINY 上实测三个变体的一步 decode：Counter 记下的 KV 字节 = 2·L·B·S·G·dh·字节，注意力 FLOPs 相同。

运行：python3 lecture02/05_einsum_and_gqa.py [--quick] [--seed 0]
图：lecture02/figures/05_einsum_and_gqa_kv_bytes.png
"""
import argparse
import os
import sys
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import transformer_lab as tl  # noqa: E402
from hw_specs import H100_SXM  # noqa: E402
from llm_math import LLAMA31_8B, LLAMA31_70B, max_batch, scaled  # noqa: E402
from course_utils import fmt_count, fmt_si, format_table, save_figure  # noqa: E402

BPE = 2.0


def layer_einsums(cfg, lp, x):
    """
    第 0 层（cache 为空、双向，为了与 Counter 的"整块都算"一致）的每个矩阵乘写成 einsum。
    返回 [(运算名, spec, 操作数列表, einsum 的结果, 模块函数的结果)]。
    字母：b 批、t/s 查询/键位置、d 模型维、h 头、g K/V 组、r 组内头、k 每头维、f MLP 宽度。
    """
    B, T, d = x.shape
    H, G, dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    R = H // G
    wq = lp["wq"].reshape(d, H, dh)                                   # [d, H, dh]
    wk, wv = lp["wk"].reshape(d, G, dh), lp["wv"].reshape(d, G, dh)   # [d, G, dh]
    wo = lp["wo"].reshape(H, dh, d)                                    # [H, dh, d]
    q = np.einsum("btd,dhk->bthk", x, wq)
    k = np.einsum("btd,dgk->btgk", x, wk)
    v = np.einsum("btd,dgk->btgk", x, wv)
    qg = q.reshape(B, T, G, R, dh)                                     # [B, T, G, R, dh]
    s = np.einsum("btgrk,bsgk->bgrts", qg, k) / np.sqrt(dh)            # [B, G, R, T, S]
    p = tl.softmax(s)
    a = np.einsum("bgrts,bsgk->btgrk", p, v)                           # [B, T, G, R, dh]
    o = np.einsum("bthk,hkd->btd", a.reshape(B, T, H, dh), wo)
    gate = np.einsum("btd,df->btf", x, lp["w_gate"])
    up = np.einsum("btd,df->btf", x, lp["w_up"])
    m = tl.silu(gate) * up
    down = np.einsum("btf,fd->btd", m, lp["w_down"])
    attn = tl.attention_core(q, k, v, 0, causal=False)
    return [
        ("q_proj", "btd,dhk->bthk", (x, wq), q, tl.linear(x, lp["wq"], "q").reshape(q.shape)),
        ("k_proj", "btd,dgk->btgk", (x, wk), k, tl.linear(x, lp["wk"], "k").reshape(k.shape)),
        ("v_proj", "btd,dgk->btgk", (x, wv), v, tl.linear(x, lp["wv"], "v").reshape(v.shape)),
        ("QKᵀ", "btgrk,bsgk->bgrts", (qg, k), None, None),
        ("PV", "bgrts,bsgk->btgrk", (p, v), a.reshape(B, T, H * dh), attn),
        ("o_proj", "bthk,hkd->btd", (a.reshape(B, T, H, dh), wo), o, tl.linear(attn, lp["wo"], "o")),
        ("mlp_gate", "btd,df->btf", (x, lp["w_gate"]), gate, tl.linear(x, lp["w_gate"], "g")),
        ("mlp_up", "btd,df->btf", (x, lp["w_up"]), up, tl.linear(x, lp["w_up"], "u")),
        ("SiLU(g)⊙u", "btf,btf->btf", (gate, up), None, None),
        ("mlp_down", "btf,fd->btd", (m, lp["w_down"]), down, tl.linear(m, lp["w_down"], "d")),
    ]


def part_einsum(rng, B, T):
    print("== 1. einsum 记号与 FLOPs 规则（TINY 第 0 层，形状故意取不整齐的）==")
    cfg = tl.TINY
    params = tl.init_params(cfg, seed=0)
    lp = params["layers"][0]
    x = rng.standard_normal((B, T, cfg.d_model))
    rows, flops, worst = [], {}, 0.0
    for name, spec, ops, mine, ref in layer_einsums(cfg, lp, x):
        f = tl.einsum_flops(spec, *ops)
        flops[name] = f
        lhs, out = spec.split("->")
        summed = "".join(sorted(set(lhs.replace(",", "")) - set(out))) or "—"
        batch = "".join(sorted(set.intersection(*map(set, lhs.split(","))) & set(out))) or "—"
        err = "—" if mine is None else f"{np.max(np.abs(mine - ref)):.0e}"
        worst = max(worst, 0.0 if mine is None else float(np.max(np.abs(mine - ref))))
        rows.append([name, spec, " × ".join(str(o.shape) for o in ops), summed, batch, fmt_si(f), err])
    heads = ["运算", "einsum", "操作数形状", "求和维", "批维（两边都有）", "FLOPs（规则）", "与模块的差"]
    print(format_table(heads, rows))
    assert worst < 1e-12, worst

    # 规则 × 层数 + lm_head = Counter 记的矩阵乘与注意力核心（双向：整块 T×S 都算）
    c = tl.Counter()
    tl.forward(params, cfg, rng.integers(0, cfg.vocab, size=(B, T)), counter=c, causal=False)
    per_layer = sum(f for n, f in flops.items() if n != "SiLU(g)⊙u")
    head = tl.einsum_flops("btd,dv->btv", (B, T, cfg.d_model), (cfg.d_model, cfg.vocab))
    counted = c.total("flops", tl.MATMUL_OPS + tl.ATTN_CORE_OPS)
    total = cfg.n_layers * per_layer + head
    print(f"\n规则：{cfg.n_layers} 层 × {fmt_si(per_layer)} + lm_head {fmt_si(head)} = {fmt_si(total)}；"
          f"Counter（矩阵乘 + 注意力核心）= {fmt_si(counted)}")
    assert total == counted
    assert flops["QKᵀ"] == flops["PV"] == 2 * B * T * T * cfg.n_heads * cfg.d_head
    assert flops["SiLU(g)⊙u"] == B * T * cfg.d_ff                    # 没有求和维：不乘 2
    print("→ 规则只看字母：QKᵀ 与 PV 各 2·B·T·S·H·dh（合起来就是 Counter 的 4·B·T·S·H·dh）；")
    print("  没有求和维的逐元素乘只记 1 次/元素。GQA 的 g、r 两个字母之积是 H，FLOPs 与 MHA 完全一样。")


def variants(model):
    """同一个模型的 MHA / GQA / MQA 三个版本（只改 n_kv_heads）。"""
    H = model.n_heads
    return [scaled(model, f"{model.name} {tag}", n_kv_heads=G)
            for tag, G in (("MHA", H), ("GQA", model.n_kv_heads), ("MQA", 1))]


def part_models(batch, ctx):
    print(f"\n== 2. 真模型：MHA / GQA / MQA（BF16；decode 一步：batch {batch}、上下文 {ctx:,}）==")
    rows = []
    for model in (LLAMA31_8B, LLAMA31_70B):
        vs = variants(model)
        steps = [tl.phase_costs(m, batch, 1, ctx, BPE, last_only=True) for m in vs]
        attn = [tl.sum_rows(tl.analytic_ops(m, batch, 1, ctx, BPE), "flops", tl.ATTN_CORE_OPS) for m in vs]
        assert len(set(attn)) == 1                                    # 注意力 FLOPs 与 G 无关
        base = steps[0]["bytes"]
        for m, s in zip(vs, steps):
            kv_seq = m.kv_cache_bytes(1, ctx, BPE)
            # 装几条：和第 1 讲演示 02 同一个函数（可分配显存的 90% 先放权重，剩下的才给 KV）
            fit1 = max_batch(m, H100_SXM, ctx, w_bytes=BPE, kv_bytes=BPE)
            fits = fit1 or f"0（权重 {m.weight_bytes(BPE) / 1e9:.0f} GB 就放不下）"
            rows.append([m.name, f"{m.n_heads}/{m.n_kv_heads}", fmt_count(m.n_params()),
                         fmt_si(m.kv_bytes_per_token(BPE), "B"), fmt_si(kv_seq, "B"),
                         fits,
                         fmt_si(s["bytes"], "B"), f"{s['bytes'] / base:.2f}", f"{s['intensity']:.1f}"])
        kv = [m.kv_bytes_per_token(BPE) for m in vs]
        assert kv[0] / kv[1] == model.n_heads / model.n_kv_heads and kv[1] / kv[2] == model.n_kv_heads
        assert steps[0]["bytes"] > steps[1]["bytes"] > steps[2]["bytes"]
    cap = f"一张 {H100_SXM.name} 放下权重后装几条（max_batch）"
    print(format_table(["模型", "H/G", "参数", "KV/token", f"KV/序列（{ctx:,}）", cap,
                        "decode 一步读写", "相对 MHA", "FLOP/字节"], rows))
    print("→ KV 字节与 G 成正比：8B 从 MHA 到 GQA-8 省 4 倍，70B 省 8 倍；参数几乎不变（Wk、Wv 只占一小部分）。")
    print("  decode 一步要读的字节随之下降，强度升高——同样的显存能放更多序列（更大的 batch，第 5、6 讲）。")


def part_tiny(rng, pos0):
    print(f"\n== 3. TINY 上实测：一步 decode（已有 {pos0} 个位置，batch 3）==")
    rows, attn_flops = [], set()
    B = 3
    for G in (8, 2, 1):
        cfg = tl.config_like(tl.TINY, n_kv_heads=G, name=f"tiny G={G}")
        params = tl.init_params(cfg, seed=1)
        cache = tl.KVCache(cfg, B)
        tl.forward(params, cfg, rng.integers(0, cfg.vocab, size=(B, pos0)), cache=cache)
        c = tl.Counter(BPE)
        tl.forward(params, cfg, rng.integers(0, cfg.vocab, size=(B, 1)), cache=cache, counter=c)
        kv_read = c.rows["attn_core"]["kv"]
        want = 2 * cfg.n_layers * B * (pos0 + 1) * G * cfg.d_head * BPE
        assert kv_read == want, (kv_read, want)
        attn_flops.add(c.rows["attn_core"]["flops"])
        rows.append([f"H/G = 8/{G}", cfg.group, fmt_count(tl.count_params(params)), fmt_si(kv_read, "B"),
                     fmt_si(want, "B"), fmt_si(c.rows["attn_core"]["flops"]), fmt_si(cache.nbytes(BPE), "B")])
    print(format_table(["变体", "组大小", "参数", "读 KV（Counter）", "2·L·B·S·G·dh·2", "注意力 FLOPs",
                        "cache 占用"], rows))
    assert len(attn_flops) == 1
    print("→ 数出来的 KV 字节与公式一致、随 G 线性变化；注意力 FLOPs 三者完全相同。")


def plot(batch, ctxs, path_script, quick=False):
    from course_utils import pyplot
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(10, 6))
    for m, style in zip(variants(LLAMA31_8B), ("-", "--", ":")):
        total = np.array([tl.phase_costs(m, batch, 1, int(c), BPE, last_only=True)["bytes"] for c in ctxs]) / 1e9
        ok = np.array([max_batch(m, H100_SXM, int(c), w_bytes=BPE, kv_bytes=BPE) >= batch for c in ctxs])
        line, = ax.loglog(ctxs, total, style, lw=2.5, label=f"{m.name.split()[-1]} (G={m.n_kv_heads})")
        if not ok.all():                       # 从这里起 batch 个序列的 KV 放不进一张 H100（llm_math.max_batch）
            i = int(np.argmin(ok))
            ax.plot(ctxs[i], total[i], "X", ms=12, color=line.get_color())
    ax.plot([], [], "X", ms=12, color="gray",
            label=f"from here: {batch} sequences' KV\nno longer fit one {H100_SXM.name}")
    ax.axhline(LLAMA31_8B.matmul_params() * BPE / 1e9, color="gray", lw=1.5, label="weights alone")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("GB moved per decode step")
    ax.set_title(f"{LLAMA31_8B.name}, batch {batch}, BF16: KV traffic vs context")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left")
    return save_figure(fig, path_script, "kv_bytes", quick=quick)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="更小的形状、曲线少取几个点")
    ap.add_argument("--seed", type=int, default=0, help="随机种子")
    ap.add_argument("--no-fig", action="store_true", help="不画图")
    a = ap.parse_args()
    print(f"随机种子 {a.seed}")
    rng = np.random.default_rng(a.seed)
    part_einsum(rng, B=2, T=7 if a.quick else 13)
    part_models(batch=16, ctx=8192)
    part_tiny(rng, pos0=17 if a.quick else 61)
    if not a.no_fig:
        ctxs = np.unique(np.round(np.logspace(10, 17, 8 if a.quick else 29, base=2)).astype(int))
        print(f"\n图：{plot(16, ctxs, __file__, quick=a.quick)}")


if __name__ == "__main__":
    main()
