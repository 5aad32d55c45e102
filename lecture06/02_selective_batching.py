"""
第 6 讲 · 演示 2：选择性批处理（selective batching）—— 长短不一、阶段不同的请求怎么放进同一步

你会看到：
    1. 一次迭代里有的请求在读整段输入（initiation / prefill），有的只生成 1 个 token（increment / decode），
       长度全都不同。ragged_forward 把所有新 token 拼成 [1, ΣT_i, d]：线性层、RMSNorm、SwiGLU 一起算，
       只有注意力按请求拆开。结果和"每个请求单独算"逐位一致（误差 ~1e-15）。
    2. 一个迷你的迭代级引擎：请求在不同的迭代到达、生成不同的长度、做完就走；每一步都是一次 ragged_forward。
       每个请求得到的 token 和它独自贪心生成的完全相同——调度方式不改变结果。
    3. 用第 2 讲的 Counter 记账：拼起来算和分开算，FLOPs、KV 字节、激活字节一模一样；
       **唯一**的差别是权重：拼起来读一遍，分开算读 k 遍。注意力没有权重，所以把它拆开不损失什么。
       对照：如果像 FasterTransformer 那样补齐成 [B, L_max]，要多算多少个 token 位置。

运行：python3 lecture06/02_selective_batching.py [--quick] [--seed 0]
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import decode_lab as dl  # noqa: E402
from course_utils import fmt_bytes, fmt_si, format_table  # noqa: E402
from transformer_lab import MATMUL_OPS, OP_GROUPS, Config, Counter, KVCache, forward, init_params  # noqa: E402


def make_model(quick, seed):
    cfg = Config(vocab=97, d_model=48 if quick else 96, n_layers=2 if quick else 4, n_heads=6, n_kv_heads=2,
                 d_head=8 if quick else 16, d_ff=128 if quick else 256, max_seq=128, name="demo")
    return cfg, init_params(cfg, seed=seed)


def prepare(cfg, params, plan, rng):
    """按 plan [(已有上下文, 新 token 数)] 造每个请求的两份相同 cache（ragged 用、单独算用）和新 token。"""
    caches, refs, chunks = [], [], []
    for ctx, new in plan:
        c, rc = KVCache(cfg, 1), KVCache(cfg, 1)
        if ctx:
            hist = rng.integers(0, cfg.vocab, (1, ctx))
            forward(params, cfg, hist, cache=c)
            forward(params, cfg, hist, cache=rc)
        caches.append(c)
        refs.append(rc)
        chunks.append(rng.integers(0, cfg.vocab, new))
    return caches, refs, chunks


def part1_one_step(cfg, params, rng):
    print("== 1. 一次迭代：5 个请求，阶段和长度各不相同 ==")
    # (已有上下文长度, 这一步的新 token 数)：上下文 0 = 刚到的请求（initiation），新 token 1 = 生成中（increment）
    plan = [(0, 9), (13, 1), (0, 4), (29, 1), (6, 1)]
    caches, refs, chunks = prepare(cfg, params, plan, rng)
    outs = dl.ragged_forward(params, cfg, chunks, caches)
    rows = []
    for i, ((ctx, new), o, rc, ch) in enumerate(zip(plan, outs, refs, chunks)):
        ref = forward(params, cfg, ch[None], cache=rc)[0]
        err = float(np.max(np.abs(o - ref)))
        rows.append([f"R{i}", "initiation" if ctx == 0 else "increment", ctx, new, f"{ctx}…{ctx + new - 1}",
                     f"{err:.1e}"])
        assert err < 1e-12, (i, err)
    print(format_table(["请求", "阶段", "已有上下文", "新 token", "RoPE 位置", "max|ragged − 单独|"], rows))
    print(f"   拼起来的张量：[1, {sum(len(c) for c in chunks)}, {cfg.d_model}]——没有批这一维，也没有补齐。\n")
    return plan, chunks


def part2_engine(cfg, params, rng, n_req):
    print(f"== 2. 迷你迭代级引擎：{n_req} 个请求在不同迭代到达，做完就走，每步一次 ragged_forward ==")
    lm = dl.TransformerLM(params, cfg)
    reqs = [{"rid": i, "arrive": int(2 * i + rng.integers(0, 2)),
             "prompt": rng.integers(0, cfg.vocab, rng.integers(2, 12)), "n_out": int(rng.integers(1, 10)),
             "out": [], "cache": KVCache(cfg, 1)} for i in range(n_req)]
    it, done, sizes = 0, 0, []
    while done < n_req:
        batch = [r for r in reqs if r["arrive"] <= it and len(r["out"]) < r["n_out"]]
        if batch:
            # initiation 送整段输入；increment 送上一步生成的那个 token
            chunks = [r["prompt"] if not r["out"] else np.array(r["out"][-1:]) for r in batch]
            logits = dl.ragged_forward(params, cfg, chunks, [r["cache"] for r in batch])
            for r, lg in zip(batch, logits):
                r["out"].append(int(np.argmax(lg[-1])))
                done += len(r["out"]) == r["n_out"]
            sizes.append((len(batch), sum(len(c) for c in chunks)))
        it += 1
    rows = []
    for r in reqs:
        alone, _ = dl.autoregressive_generate(lm, r["prompt"], r["n_out"], 0.0, rng)
        assert alone == r["out"], r["rid"]
        rows.append([r["rid"], r["arrive"], len(r["prompt"]), r["n_out"], " ".join(map(str, r["out"])), "相同"])
    print(format_table(["请求", "到达迭代", "输入长", "输出长", "引擎里生成的 token", "vs 独自贪心生成"], rows))
    print(f"   共 {len(sizes)} 次迭代；每步的请求数 {min(s[0] for s in sizes)}–{max(s[0] for s in sizes)}，"
          f"token 数 {min(s[1] for s in sizes)}–{max(s[1] for s in sizes)}。\n")


def part3_counters(cfg, params, plan, rng):
    print("== 3. 记账：拼起来算（1 次 ragged_forward）vs 分开算（每个请求 1 次 forward）==")
    caches, sep_caches, chunks = prepare(cfg, params, plan, rng)
    together, apart = Counter(), Counter()
    dl.ragged_forward(params, cfg, chunks, caches, counter=together)
    for ch, sc in zip(chunks, sep_caches):
        forward(params, cfg, ch[None], cache=sc, counter=apart)
    k = len(plan)
    rows = []
    mt, ma = together.merged(OP_GROUPS), apart.merged(OP_GROUPS)
    for g in OP_GROUPS:
        t, a = mt[g], ma[g]
        rows.append([g, fmt_si(t["flops"]), fmt_si(a["flops"]), fmt_bytes(t["w"]), fmt_bytes(a["w"]),
                     fmt_bytes(t["kv"]), fmt_bytes(a["kv"]), "共享" if t["w"] < a["w"] else "不共享"])
    print(format_table(["运算组", "FLOPs 拼", "FLOPs 分", "权重字节 拼", "权重字节 分", "KV 字节 拼", "KV 字节 分",
                        "权重"], rows))
    for op in set(together.rows) | set(apart.rows):
        for key in ("flops", "useful", "kv", "act"):
            assert np.isclose(together.rows[op][key], apart.rows[op][key]), (op, key)
    w_t, w_a = together.total("w", MATMUL_OPS), apart.total("w", MATMUL_OPS)
    assert np.isclose(w_a, k * w_t), (w_a, w_t)
    assert together.total("w", ["attn_core"]) == 0 == apart.total("w", ["attn_core"])
    n_tok = sum(len(c) for c in chunks)
    L_max = max(len(c) for c in chunks)
    print(f"   矩阵乘法读的权重：拼起来 {fmt_bytes(w_t)}，分开 {fmt_bytes(w_a)} = {k} 倍；其余各列完全相同。")
    print("   注意力核心没有权重：按请求拆开做，一个字节的权重都不多读——这就是 Orca 只对它\"不批处理\"的原因。")
    print(f"   对照补齐：{k} 个请求补成 [{k}, {L_max}] 要算 {k * L_max} 个 token 位置，真正需要的只有 {n_tok} 个"
          f"（多 {k * L_max / n_tok - 1:.0%}），而且已有上下文长度不同的请求还没法共用一个 KV cache。\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="小规模版本：小模型、少几个请求")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"seed = {args.seed}\n")
    rng = np.random.default_rng(args.seed)
    cfg, params = make_model(args.quick, args.seed)
    plan, _ = part1_one_step(cfg, params, rng)
    part2_engine(cfg, params, rng, 6 if args.quick else 12)
    part3_counters(cfg, params, plan, rng)
    print("结论：选择性批处理 = 逐 token 的运算一起做（权重读一遍），注意力按请求各做各的；结果与单独计算逐位相同。")


if __name__ == "__main__":
    main()
