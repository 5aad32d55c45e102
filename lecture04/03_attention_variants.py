"""
第 4 讲 · 演示 3：注意力的变体——MHA / GQA / MQA，滑动窗口

你会看到：
    1. 每个 token 的 KV cache 字节：MHA（每个查询头一份 K/V）、GQA（G 组）、MQA（1 组）。我们的小模型和
       Llama-3.1-8B 的结构各算一遍（公式来自第 1 讲 llm_math）。注意力的 FLOPs 不变，省的是显存与 decode 时读的字节。
    2. 质量：在合成语言上训练好的 MHA（4 组）、GQA（2 组）、MQA（1 组）三个检查点，按 token 类别拆开的损失——
       复制 token（要靠注意力精确地找到 k 块之前的位置）最能看出 K/V 组数的差别。
    3. 滑动窗口的掩码，以及它在层与层之间的"接力"：一层只看最近 W 个位置，L 层叠起来最远能看到 L·(W−1) 个位置之前。
       用自动求导量出来：最后一个位置的 logits 对哪些位置的输入有非零梯度。窗口模型的 KV cache 不随长度增长。
    4. 窗口 16 的检查点：按复制距离（8、16、24、32 个位置之前）拆开的损失，和完整注意力的 modern 比。

运行：python3 lecture04/03_attention_variants.py [--quick] [--seed 0]
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import modern_lm as ml  # noqa: E402
from course_utils import fmt_bytes, format_table  # noqa: E402
from llm_math import LLAMA31_8B, MISTRAL_7B, scaled  # noqa: E402

VARIANTS = (("modern_mha", "MHA"), ("modern", "GQA"), ("modern_mqa", "MQA"))
SEED_ROWS = (("modern_seed1", "GQA，种子 1"), ("modern_seed2", "GQA，种子 2"))   # 同一 GQA 配置换种子


def part_bytes():
    print("== 1. 每个 token 的 KV cache（BF16）==")
    rows = []
    for name, kind in VARIANTS:
        mc = ml.CHECKPOINTS[name].to_model_config()
        big = scaled(LLAMA31_8B, n_kv_heads={"MHA": 32, "GQA": 8, "MQA": 1}[kind])
        rows.append([kind, mc.n_kv_heads, fmt_bytes(mc.kv_bytes_per_token(2.0)), big.n_kv_heads,
                     fmt_bytes(big.kv_bytes_per_token(2.0)), fmt_bytes(big.kv_cache_bytes(1, 128 * 1024, 2.0))])
    print(format_table(["变体", "我们：G", "我们：每 token", "8B 结构：G", "8B：每 token", "8B：128K 上下文"], rows))
    print("公式：2（K 和 V）· 层数 · G · d_head · 2 字节。G 从 32 降到 8，同样的显存装 4 倍长的上下文或 4 倍大的批。")


def part_quality(quick):
    print("\n== 2. 质量：按 token 类别拆开的 eval 损失（nats / token）==")
    lang = ml.language()
    rows, copies = [], {}
    for name, kind in VARIANTS + SEED_ROWS:
        model, info = ml.load_or_train(name, quick=quick)
        br = ml.loss_breakdown(model, lang, ml.TRAIN.seq, batch=32 if quick else 256)
        copy = [br[k][0] for k in br if k.startswith("copy")]
        copies[kind] = copy
        rows.append([kind, ml.CHECKPOINTS[name].n_kv_heads, info["steps"], f"{br['all'][0]:.3f}",
                     f"{br['all'][0] - br['all'][1]:+.3f}", f"{br['marker'][0]:.3f}", f"{br['fresh'][0]:.3f}"] +
                    [f"{c:.3f}" for c in copy])
    rows.append(["最优", "", "", f"{br['all'][1]:.3f}", "+0.000", f"{br['marker'][1]:.3f}", f"{br['fresh'][1]:.3f}"] +
                ["0.000"] * len(copy))
    print(format_table(["变体", "G", "步数", "全部", "比最优多", "块标记", "新块字母"] +
                       [f"复制 {k} 块前" for k in range(1, len(copy) + 1)], rows))
    worst = {k: max(v) for k, v in copies.items()}
    print("复制的字母在知道规则时是确定的（最优 0），多出来的损失几乎都在这里：它要求注意力精确地对准 k 块之前。"
          f"各行最差的一列：{', '.join(f'{k} {v:.3f}' for k, v in worst.items())}。")
    print("同一个 GQA 配置换种子，有时某个距离的复制还没学会、有时全学会了：在这个小任务上 G = 4 / 2 / 1 的差别"
          "不比种子之间的差别大。GQA / MQA 真正买到的是第 1 部分的 KV 字节——质量的代价要在大模型、难任务上量。")


def mask_picture(T, W):
    bias = ml.attn_bias(torch.arange(T), torch.arange(T), window=W)
    return ["".join("■" if v == 0 else "·" for v in row.tolist()) for row in bias]


def reach(n_layers, W, T, seed):
    """最后一个位置的 logits 对输入嵌入的梯度：最早的非零位置。"""
    torch.manual_seed(seed)
    cfg = ml.LMConfig(vocab=11, d_model=16, n_layers=n_layers, n_heads=2, n_kv_heads=1, d_head=8, d_ff=24, window=W)
    model = ml.ModernLM(cfg).double()
    emb = model.tok(torch.randint(0, 11, (1, T))).detach().requires_grad_(True)   # [1, T, d]
    x = emb
    for li, blk in enumerate(model.blocks):
        x = blk(x, 0, None, li)
    model.head(model.norm(x))[0, -1].sum().backward()
    touched = (emb.grad[0].abs().sum(-1) > 0).nonzero().flatten()
    return int(touched.min())


def part_window(seed, quick):
    print("\n== 3. 滑动窗口：掩码与跨层的接力 ==")
    T, W = 10, 4
    print(f"T = {T}、W = {W} 的掩码（行 = 查询，列 = 键，■ = 能看）：")
    for i, line in enumerate(mask_picture(T, W)):
        print(f"  {i:2d} {line}")
    rows = []
    T_long = 40
    for L in (1, 2, 3) if quick else (1, 2, 3, 4):
        first = reach(L, W, T_long, seed)
        rows.append([L, W, T_long - 1 - first, L * (W - 1)])
        assert T_long - 1 - first == L * (W - 1)
    print(format_table(["层数 L", "窗口 W", "实测最远能看多远", "L·(W−1)"], rows))
    print(f"Mistral-7B 用 W = 4096、{MISTRAL_7B.n_layers} 层 [S47]：理论上能接力到 "
          f"{MISTRAL_7B.n_layers * 4095:,} 个位置之前——但每经过一层信息都要被压缩进一个向量，"
          "远处只能'传话'、不能精确复制。")
    cfg = ml.config_like(ml.MODERN, vocab=ml.MODERN.vocab, window=16)
    model = ml.ModernLM(cfg)
    cache, full = ml.KVCache(cfg), ml.KVCache(ml.MODERN)
    model_full = ml.ModernLM(ml.MODERN)
    ids = torch.randint(0, cfg.vocab, (1, 100))
    with torch.no_grad():
        model(ids, cache)
        model_full(ids, full)
    print(f"读完 100 个 token 后 KV cache：完整注意力 {fmt_bytes(full.nbytes())}，窗口 16 只留最近 15 个键 "
          f"{fmt_bytes(cache.nbytes())}（float32）——滚动缓冲区，长度再长也不变。")
    assert cache.nbytes() * 100 == full.nbytes() * 15


def part_window_quality(quick):
    print("\n== 4. 窗口 16 的代价：按复制距离拆开的损失 ==")
    lang = ml.language()
    rows, brs = [], {}
    for name in ("modern", "modern_window16"):
        model, _ = ml.load_or_train(name, quick=quick)
        brs[name] = ml.loss_breakdown(model, lang, ml.TRAIN.seq, batch=32 if quick else 256)
    for k in range(1, lang.max_back + 1):
        key = f"copy{k}"
        rows.append([f"{k} 块之前（{k * lang.chunk} 个位置）", f"{brs['modern'][key][0]:.3f}",
                     f"{brs['modern_window16'][key][0]:.3f}", "0.000"])
    rows.append(["新块字母", f"{brs['modern']['fresh'][0]:.3f}", f"{brs['modern_window16']['fresh'][0]:.3f}",
                 f"{brs['modern']['fresh'][1]:.3f}"])
    print(format_table(["复制来源", "完整注意力", "窗口 16", "最优"], rows))
    far = [brs["modern_window16"][f"copy{k}"][0] - brs["modern"][f"copy{k}"][0] for k in range(1, lang.max_back + 1)]
    W, L = ml.CHECKPOINTS["modern_window16"].window, ml.CHECKPOINTS["modern_window16"].n_layers
    reach = L * (W - 1)
    print(f"窗口 16 比完整注意力多出的复制损失：{', '.join(f'{d:+.3f}' for d in far)}（8 / 16 / 24 / 32 个位置之前）。")
    print(f"一层只够得着 {W - 1} 个位置之前；{L} 层接力最远 L·(W−1) = {reach}。"
          f"距离 ≤ {reach} 的复制靠两层接力仍学得会，距离 32 > {reach} 的根本够不着——损失停在'只能猜'的水平。"
          "新块字母只看前一个字母，不受窗口影响。")
    if not quick:
        assert far[3] > 0.3 and far[3] > max(far[:3]), far      # 够不着的那个距离损失最大


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="评估用更少的序列；检查点不可用时只训几十步")
    ap.add_argument("--seed", type=int, default=0, help="随机种子")
    a = ap.parse_args()
    print(f"随机种子 {a.seed}")
    torch.manual_seed(a.seed)
    part_bytes()
    part_quality(a.quick)
    part_window(a.seed, a.quick)
    part_window_quality(a.quick)


if __name__ == "__main__":
    main()
