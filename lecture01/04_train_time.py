"""
第 1 讲 · 演示 4：训练一个模型要多久、要多少显存？

你会看到：
    1. 训练 FLOPs ≈ 6·N·D（前向 2ND + 反向 4ND），再加一项注意力（序列 8K 时给 Llama 加 4–7%）。
       Llama-3.1-405B 训练 15.6T token：6ND = 3.8×10²⁵ FLOPs，和 Llama 3 论文的数字一样。
    2. 换算成时间：16,384 张 H100、MFU 40% → 约 70 天、约 2,760 万 GPU·小时；
       Meta 模型卡公布的是 3,084 万 GPU·小时（含故障、长上下文阶段等"有效运算之外"的时间）。
    3. 一张卡训练 8B 模型 15T token 要 60 多年 —— 所以要并行。
    4. 显存：混合精度 Adam 每个参数 16 字节（权重 2 + 梯度 2 + FP32 主权重 4 + Adam 8），
       405B 的权重 + 梯度 + 主权重 + Adam 合计 6.5 TB（其中主权重 + Adam 4.9 TB），只放这些就至少要
       77 张 H100（每张可分配约 85 GB），还没算激活 —— 所以要切分
       （ZeRO / FSDP 在本课程之外；张量并行见 prereq5/04、第 5 讲演示 04）。

运行：python3 lecture01/04_train_time.py [--quick]
"""
import argparse
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import hw_specs as HW  # noqa: E402
import llm_math as M  # noqa: E402
from course_utils import fmt_bytes, fmt_count, format_table  # noqa: E402

T405 = M.LLAMA31_405B_TRAIN
# (模型, 训练 token 数, 序列长度, 公布的 GPU·小时 或 None, token 数的出处)
RUNS = [
    (M.GPT3_13B, 300e9, 2048, None, "GPT-3 论文：所有模型训练 300B token [S46]（当年用的是 V100，这里只按 H100 换算）"),
    (M.GPT3_175B, 300e9, 2048, None, "同上"),
    (M.LLAMA31_8B, 15e12, 8192, 1.46e6, "Llama 3.1 模型卡：~15T token、1.46M H100 GPU·小时"),
    (M.LLAMA31_70B, 15e12, 8192, 7.0e6, "Llama 3.1 模型卡：~15T token、7.0M H100 GPU·小时"),
    (M.LLAMA31_405B, T405["tokens"], T405["seq_len"], T405["gpu_hours"],
     "Llama 3 论文 15.6T token；模型卡 30.84M H100 GPU·小时"),
]


def flops_table(mfu):
    chip = HW.H100_SXM
    rows = []
    for m, D, S, pub_h, _src in RUNS:
        six = 6 * m.n_params() * D
        full = m.train_flops(D, S)
        hours = full / (chip.peak_flops() * mfu) / 3600
        implied = "" if pub_h is None else f"{full / (pub_h * 3600 * chip.peak_flops()):.0%}"
        rows.append([m.name, fmt_count(D), f"{six:.2e}", f"{full:.2e}", f"{full / six - 1:+.1%}",
                     f"{hours / 1e6:.2f}M", "" if pub_h is None else f"{pub_h / 1e6:.2f}M", implied])
    return format_table(["模型", "token D", "6·N·D", "含注意力", "差", f"H100·小时@MFU {mfu:.0%}", "公布",
                           "公布对应的有效利用率"], rows)


def memory_table(models, micro_batch, seq_len):
    rows = []
    for m in models:
        mem = m.train_memory(micro_batch, seq_len)
        mem_rc = m.train_memory(micro_batch, seq_len, recompute=True)
        states = mem["weights"] + mem["grads"] + mem["master"] + mem["adam"]
        rows.append([m.name, fmt_bytes(mem["weights"]), fmt_bytes(mem["grads"]),
                     fmt_bytes(mem["master"] + mem["adam"]), fmt_bytes(mem["activations"]),
                     fmt_bytes(mem_rc["activations"]), fmt_bytes(mem["logits"]), fmt_bytes(mem["total"]),
                     math.ceil(states / HW.H100_SXM.alloc_bytes)])
    heads = ["模型", "权重 BF16", "梯度 BF16", "FP32 主权重+Adam", f"激活 {micro_batch}×{seq_len}", "激活(重计算)",
             "logits FP32", "合计", f"只放前四项要几张 H100（可分配 {HW.H100_SXM.alloc_bytes / 1e9:.0f} GB）"]
    return format_table(heads, rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="小规模版本（本脚本本来就快）")
    ap.add_argument("--mfu", type=float, default=T405["mfu"], help="假设的 MFU（默认 0.40）")
    args = ap.parse_args()

    print("== 1. 训练 FLOPs：6·N·D 和含注意力的精确公式；换算成 H100 GPU·小时 ==")
    print(flops_table(args.mfu))
    for m, _D, _S, _h, src in RUNS:
        print(f"   {m.name:15s} {src}")
    print("   （\"公布对应的有效利用率\" = 公式 FLOPs ÷ (公布 GPU·小时 × 峰值)：公布的小时数包含故障、检查点、"
          "长上下文等阶段，所以低于论文报告的 38–43% MFU。）")

    m = M.LLAMA31_405B
    r = M.train_time(m, T405["tokens"], HW.H100_SXM, T405["gpus"], mfu=args.mfu, seq_len=T405["seq_len"])
    print(f"\n== 2. Llama-3.1-405B：{T405['tokens'] / 1e12:.1f}T token，"
          f"{T405['gpus']:,} 张 H100，MFU {args.mfu:.0%} ==")
    print(f"   总 FLOPs {r['flops']:.2e}（6ND = {6 * m.n_params() * T405['tokens']:.2e}；论文：3.8×10²⁵）")
    print(f"   时间 {r['days']:.0f} 天；{r['chip_hours'] / 1e6:.1f}M GPU·小时 "
          f"vs 模型卡公布 {T405['gpu_hours'] / 1e6:.2f}M"
          f"（比值 {r['chip_hours'] / T405['gpu_hours']:.2f}）")
    one = M.train_time(M.LLAMA31_8B, 15e12, HW.H100_SXM, 1, mfu=args.mfu, seq_len=8192)
    print(f"   对照：一张 H100 训练 Llama-3.1-8B 15T token 要 {one['days'] / 365:.0f} 年")

    print("\n== 3. 训练显存（混合精度 Adam，每个参数 16 字节；不做任何切分）==")
    print(memory_table([M.LLAMA32_1B, M.LLAMA31_8B, M.LLAMA31_70B, M.LLAMA31_405B], 1, 8192))
    print("   激活按每层保存 4d + 2·(H+G)·dh + 3·d_ff 个 BF16 数估算（FlashAttention、无 dropout、不重计算）；"
          "重计算时每层只存输入。")

    # ---- 关键结论：断言 ----
    six = 6 * m.n_params() * T405["tokens"]
    assert abs(six - 3.8e25) / 3.8e25 < 0.01                                  # 和 Llama 3 论文的 3.8e25 一致
    assert 1.0 < r["flops"] / six < 1.05                                      # 注意力项在 8K 序列下只加几个百分点
    assert 0.7 < r["chip_hours"] / T405["gpu_hours"] < 1.0                     # 公式是下界，但同一量级
    assert 60 < r["days"] < 80
    assert one["days"] / 365 > 50
    for mm in (M.LLAMA31_8B, M.LLAMA31_70B, M.LLAMA31_405B):
        mem = mm.train_memory(1, 8192)
        assert mem["weights"] + mem["grads"] + mem["master"] + mem["adam"] == 16 * mm.n_params()
        assert mm.train_memory(1, 8192, recompute=True)["activations"] < mem["activations"] / 10
    states405 = 16 * m.n_params()
    opt405 = m.train_memory(1, 8192)["master"] + m.train_memory(1, 8192)["adam"]
    assert states405 > 6.4e12 and math.ceil(states405 / HW.H100_SXM.alloc_bytes) > 70
    assert opt405 == 12 * m.n_params() < states405                            # "优化器状态"只是其中 12 字节/参数
    # 训练 = 3 × 前向（同样的 token、同样的上下文）
    assert math.isclose(m.train_flops(1, 1), 3 * m.flops_per_token(1))

    print(f"\n结论：405B 按 6ND 是 {six:.1e} FLOPs；16K 张 H100 在 40% MFU 下约 {r['days']:.0f} 天，"
          f"{r['chip_hours'] / 1e6:.1f}M GPU·小时（公布 {T405['gpu_hours'] / 1e6:.2f}M）；"
          f"权重 + 梯度 + FP32 主权重 + Adam 状态合计 {fmt_bytes(states405)}（其中主权重 + Adam "
          f"{fmt_bytes(opt405)}），只放这些就至少要 {math.ceil(states405 / HW.H100_SXM.alloc_bytes)} 张 H100，"
          f"必须切分。")


if __name__ == "__main__":
    main()
