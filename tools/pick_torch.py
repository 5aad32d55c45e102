#!/usr/bin/env python3
"""给 `make setup` 挑 torch：打印要先装的 torch 规格（可能为空）。

为什么：在没有 GPU 的 Linux 上，`pip install torch` 默认拿到几 GB 的 CUDA 构建。
课程机器（和 CI）的 pip 配置里有 find-links 目录放着 CPU 构建的 wheel（`torch-X+cpu-...whl`）；
找到和当前 Python、当前 CPU 架构匹配的那个，就打印 `torch==X`，让 pip 用本地文件（约 0.2 GB 下载、0.75 GB 安装）。
有 GPU（nvidia-smi 在 PATH 上）或找不到本地 CPU wheel 时什么都不打印：由 requirements.txt 正常解析。
别的机器上想要 CPU 版：`make setup TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu"`。
"""
import glob
import os
import platform
import re
import shutil
import subprocess
import sys


def find_links_dirs(python):
    dirs = [d for d in os.environ.get("PIP_FIND_LINKS", "").split() if d]
    try:
        out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for m in re.finditer(r"find-links='([^']*)'", out):
        dirs += m.group(1).split()
    return [d.removeprefix("file://") for d in dirs if os.path.isdir(d.removeprefix("file://"))]


def main():
    python = sys.argv[1] if len(sys.argv) > 1 else sys.executable
    if shutil.which("nvidia-smi") or platform.system() != "Linux":
        return
    tag = subprocess.run([python, "-c", "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"],
                         capture_output=True, text=True).stdout.strip()
    best = None
    for d in find_links_dirs(python):
        for path in glob.glob(os.path.join(d, f"torch-*+cpu-{tag}-{tag}-*{platform.machine()}.whl")):
            ver = os.path.basename(path).split("-")[1].split("+")[0]
            key = tuple(int(x) for x in re.findall(r"\d+", ver)[:3])
            if best is None or key > best[0]:
                best = (key, ver)
    if best:
        print(f"torch=={best[1]}")


if __name__ == "__main__":
    main()
