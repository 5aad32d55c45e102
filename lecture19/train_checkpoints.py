"""
第 19 讲：训练演示要用的全部检查点（make checkpoints 调用它）。

每个模型的配置在 long_lab.CHECKPOINTS 里（演示读缓存时用同一份配置）；已经训练好、配置相符、SHA-256 与 seal
对得上的模型直接跳过。训练完的模型在 checkpoints/<名字>.pt（纯 state_dict），配置、训练曲线、秒数、tokens/s、
种子和 SHA-256 记在 checkpoints/manifest.json，NIAH 表记在 checkpoints/grids.json（键 = 权重摘要 + 设置 +
评测参数）。格式与核对见 lecture04/checkpoint_store.py。训练中途存续训文件（<名字>.resume.pt，不入库）；
Ctrl-C 在两步之间停下、一行话退出，再运行就接着训（tokens/s 只算这一次跑的步数）。

运行：python3 lecture19/train_checkpoints.py [--only base,ext_256] [--threads N] [--force]
      （--only 的名字：base、ext_256、ext_512、nope、sparse_window、sparse_strided、sparse_dilated）
      --force：先删掉这些检查点（连同续训文件）再训；manifest 缺失时文件只能单独核对、没有训练记录，用它补全。
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
    ap.add_argument("--force", action="store_true", help="删掉这些检查点再重训")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(L.CHECKPOINTS)
    bad = [n for n in names if n not in L.CHECKPOINTS]
    if bad:
        ap.error(f"--only 里没有这些检查点：{', '.join(bad)}；可选：{', '.join(L.CHECKPOINTS)}")
    task = L.NeedleTask()
    t0 = time.time()
    if args.force:
        for name in names:
            for suffix in (".pt", ".resume.pt"):
                path = os.path.join(L.CKPT, name + suffix)
                if os.path.exists(path):
                    os.remove(path)
    man = L.read_manifest()
    for name in names:
        print(f"== {name}：{L.CHECKPOINTS[name]}", flush=True)
        if os.path.exists(os.path.join(L.CKPT, f"{name}.pt")) and name not in man:
            print(f"  manifest 里没有 {name}：文件只能单独核对、没有训练记录（要补全：--force --only {name}）")
        L.get_checkpoint(task, name, log=lambda s: print(s, flush=True))
    print(f"全部完成，用时 {time.time() - t0:.0f} s；torch {torch.__version__}")


if __name__ == "__main__":
    main()
