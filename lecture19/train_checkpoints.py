"""
第 19 讲：训练演示要用的全部检查点（make checkpoints 调用它）。

每个模型的配置在 long_lab.CHECKPOINTS 里（演示读缓存时用同一份配置）；已经训练好、配置相符、SHA-256 对得上的
模型直接跳过。训练完的模型在 checkpoints/<名字>.pt，配置、训练曲线、NIAH 表、秒数、种子、torch 版本和
SHA-256 记在 checkpoints/manifest.json。演示用 long_lab.get_checkpoint 取模型（--quick 也先读入库的检查点）。

运行：python3 lecture19/train_checkpoints.py [--only base,ext_256] [--threads N]
      （--only 的名字：base、ext_256、ext_512、nope、sparse_window、sparse_strided、sparse_dilated）
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import long_lab as L  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--only", default="", help="逗号分隔的检查点名字（默认全部）")
    ap.add_argument("--threads", type=int, default=0, help="torch 线程数（0 = 默认）")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(L.CHECKPOINTS)
    bad = [n for n in names if n not in L.CHECKPOINTS]
    if bad:
        ap.error(f"--only 里没有这些检查点：{', '.join(bad)}；可选：{', '.join(L.CHECKPOINTS)}")
    task = L.NeedleTask()
    t0 = time.time()
    for name in names:
        print(f"== {name}：{L.CHECKPOINTS[name]}", flush=True)
        L.get_checkpoint(task, name, log=lambda s: print(s, flush=True))
    print(f"全部完成，用时 {time.time() - t0:.0f} s；torch {torch.__version__}")


if __name__ == "__main__":
    main()
