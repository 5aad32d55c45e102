"""
第 4 讲 · 训练入库的检查点（make checkpoints 调用它）

训练 modern_lm.CHECKPOINTS 里的每个小模型（现代栈、2015 式 baseline、每次只换一块积木的变体），
写到 lecture04/checkpoints/：<名字>.pt（纯 state_dict，torch.load(weights_only=True) 可读）、
<名字>_curve.csv（损失曲线）、manifest.json（配置、步数、最终 train / eval 损失、最优损失、秒数、
tokens/s、种子、torch 版本、每个文件的 SHA-256）。已经核对通过的检查点默认跳过（--force 重训）。
训练中途每次评估都存一个续训文件（<名字>.resume.pt，不入库）；Ctrl-C 在两步之间停下、存好续训文件、
一行话退出，再运行就从那里接着训（tokens/s 只算这一次跑的步数）。格式与核对见 checkpoint_store.py。

运行：python3 lecture04/train_checkpoints.py [--only modern baseline] [--force] [--threads N] [--quick] [--bench]
      --quick：每个模型只训几十步，写到临时文件夹并核对一遍（检查流程用，从不写 checkpoints/）。
      --bench：只量每个配置一步训练的 tokens/s（预热 5 步、计 20 步），不训练、不写文件。
时间：12 个模型，每个 1500 步 × 2048 token = 3.1M token。空闲的 2 核课程机器上 --bench --threads 1 实测
      44–67k tokens/s（一个模型 46–69 s，12 个合计约 11 分钟，不含评估）；两个进程各 1 线程并行约一半。
      入库的这套是在 6 个进程抢 2 个核的机器上这样训的，用了 36 分钟（每个模型的秒数见 manifest.json）。
      机器忙时别让 torch 开 2 个线程：线程互相等待，实测慢 3–5 倍（--threads 1）。
"""
import argparse
import dataclasses
import os
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import modern_lm as ml  # noqa: E402
from course_utils import fmt_time, format_table  # noqa: E402


def bench(names, n_warm=5, n_steps=20):
    """一步训练（前向 + 反向 + AdamW）的 tokens/s：和 train_model 同样的批、长度与优化器，只是不存任何东西。"""
    lang, tc = ml.language(), ml.TRAIN
    rows = []
    for name in names:
        torch.manual_seed(tc.seed)
        model = ml.ModernLM(ml.CHECKPOINTS[name])
        opt = ml.make_optimizer(model, tc)
        batches = [lang.sample(tc.batch, tc.seq, s)[0] for s in range(n_warm + n_steps)]
        for i, tokens in enumerate(batches):
            if i == n_warm:
                t0 = time.perf_counter()
            loss = ml.lm_loss(model, tokens)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        dt = (time.perf_counter() - t0) / n_steps
        rows.append([name, f"{dt * 1e3:.0f} ms", f"{tc.batch * tc.seq / dt:,.0f}",
                     fmt_time(dt * tc.steps)])
    print(format_table(["配置", "每步", "tokens/s", f"{tc.steps} 步约"], rows))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--only", nargs="+", choices=sorted(ml.CHECKPOINTS), help="只训练这几个")
    ap.add_argument("--force", action="store_true", help="核对通过的也重训")
    ap.add_argument("--threads", type=int, default=0, help="torch 线程数（0 = 交给 torch 决定）")
    ap.add_argument("--quick", action="store_true", help="几十步、写临时文件夹，不动 checkpoints/")
    ap.add_argument("--bench", action="store_true", help="只量 tokens/s，不训练")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.only or list(ml.CHECKPOINTS)
    if args.bench:
        print(f"torch {torch.__version__}，{torch.get_num_threads()} 个线程；批 {ml.TRAIN.batch} × 长度 {ml.TRAIN.seq}")
        return bench(names)
    tc = ml.QUICK_TRAIN if args.quick else ml.TRAIN
    print(f"torch {torch.__version__}，{torch.get_num_threads()} 个线程；语言 {ml.LANG}")
    print(f"训练设置：{tc.to_dict()}（每步 {tc.batch * tc.seq} 个 token，共 {tc.steps} 步；"
          f"{', '.join(ml.SEED_REPEATS)} 只换种子）")
    tmp = tempfile.TemporaryDirectory() if args.quick else None
    ckpt_dir = tmp.name if args.quick else ml.CKPT_DIR
    rows, t_all = [], time.perf_counter()
    for name in names:
        tc = ml.train_config(name)
        if args.quick:                     # 几十步的小设置，种子照旧
            tc = dataclasses.replace(ml.QUICK_TRAIN, seed=tc.seed)
        model, why, entry = ml.checkpoint_record(name, ckpt_dir, tc)
        if entry is not None and not args.force:        # 只有核对通过、带着完整训练记录的才跳过
            print(f"{name}: 检查点已核对通过，跳过（--force 重训）")
        else:
            print(f"{name}: 训练（{why}）；初始化种子 {tc.seed}，数据种子 {tc.seed}·10⁶ + 步数")
            model, entry = ml.train_and_save(name, ckpt_dir, tc, progress=not args.quick)
            assert ml.verify_checkpoint(name, ckpt_dir, tc)[1] == "ok"
        rows.append([name, f"{entry['n_params']:,}", entry["steps"], f"{entry['final_train_loss']:.3f}",
                     f"{entry['final_eval_loss']:.3f}", f"{entry['optimal_loss']:.3f}", fmt_time(entry["seconds"]),
                     f"{entry['tokens_per_s']:,}"])
    print(format_table(["检查点", "参数", "步数", "train 损失", "eval 损失", "最优损失", "用时", "tokens/s"], rows))
    print(f"共 {fmt_time(time.perf_counter() - t_all)}；写在 {ckpt_dir}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
