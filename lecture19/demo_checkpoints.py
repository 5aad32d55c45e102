"""
第 19 讲：演示怎么取检查点（01–03 共用）。

demo_checkpoint(task, name, quick)：完整版和 --quick 都先读入库的 checkpoints/<name>.pt（long_lab.CHECKPOINTS 的配置、
manifest 里的 SHA-256 都对得上才用），所以 --quick 从不比完整版慢，只缩小评测。读不到时：完整版训练并存盘
（long_lab.get_checkpoint），--quick 只在内存里训 20 步、不写任何文件。
（文件名不叫 train_checkpoints：lecture04 也有一个 train_checkpoints.py，long_lab 把 lecture04 放在 sys.path 前面。）
"""
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import long_lab as L  # noqa: E402


class _NotCommitted(Exception):
    """demo_checkpoint 的 --quick 路径里 get_checkpoint 想要训练：说明入库的检查点用不了。"""


def demo_checkpoint(task, name, quick, log=print):
    """
    演示取检查点。完整版 = L.get_checkpoint（缺失、损坏或配置不符时训练并存盘）。
    --quick 也先读入库的检查点（只读，不到一秒），只缩小评测，所以从不比完整版慢；
    读不到时才退回 L.get_checkpoint(quick=True)：只在内存里训 20 步，不写任何文件。返回 (model, curve)。
    """
    if not quick:
        return L.get_checkpoint(task, name, log=log)
    real_train = L.train_needle

    def refuse(*args, **kwargs):                         # 走到训练这一步 = 缓存用不了：不训练、不存盘
        raise _NotCommitted

    L.train_needle = refuse
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, curve = L.get_checkpoint(task, name, log=None)
        if log:
            log(f"  （--quick：读取入库的 checkpoints/{name}.pt，只缩小评测）")
        return model, curve
    except _NotCommitted:
        if log:
            log(f"  （--quick：checkpoints/{name}.pt 用不了，只在内存里训 20 步）")
    finally:
        L.train_needle = real_train
    return L.get_checkpoint(task, name, quick=True, log=log)
