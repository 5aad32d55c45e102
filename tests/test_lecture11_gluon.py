"""lecture11/gluon_flash.py 的 CPU 测试：内核只在 Hopper 上跑，这里查"没有 GPU 时的行为"和参数检查。
  - 没有 GPU 也能 import（Gluon / torch 的导入有保护）；
  - 当脚本运行：一行 SKIP、退出码 77（check-all 显示为 skip）；
  - attention() 先查参数（坏参数 → ValueError / TypeError，消息里有参数名），再查设备（没有 CUDA → RuntimeError）。
GPU 上的数值检查是模块自己的 _selftest（python3 lecture11/gluon_flash.py）。
"""
import os
import subprocess
import sys

import pytest
import torch

from labload import ROOT, load_lab

gf = load_lab("lecture11", "gluon_flash")
NO_GPU = not torch.cuda.is_available()
BF16 = torch.bfloat16


def _qkv(b=1, n=8, h=2, hk=2, d=64, dtype=BF16):
    q = torch.zeros(b, n, h, d, dtype=dtype)
    k = torch.zeros(b, n, hk, d, dtype=dtype)
    return q, k, k.clone()


def test_import_and_table():
    assert gf.BEST in gf.VARIANTS and set(gf.FLAGS) == set(gf.VARIANTS)
    for variant in gf.VARIANTS:
        for d in gf.HEAD_DIMS:
            bm, bn, stages, warps, maxnreg, regs = gf.tile_config(variant, d)
            consumers = gf.FLAGS[variant]["CONSUMERS"]
            smem = consumers * bm * d * 2 + stages * 2 * bn * d * 2
            assert smem <= 227 * 1024, (variant, d, smem)          # H200：每块 ≤ 227 KiB 共享内存
            assert stages >= (2 if gf.FLAGS[variant]["WS"] else 3)


@pytest.mark.skipif(not NO_GPU, reason="有 GPU 时脚本跑真正的自检")
def test_script_skips_without_gpu():
    script = os.path.join(ROOT, "lecture11", "gluon_flash.py")
    r = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 77, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("SKIP: "), r.stdout


@pytest.mark.skipif(not NO_GPU, reason="只在没有 GPU 的机器上查这条报错")
def test_attention_needs_gpu():
    with pytest.raises(RuntimeError, match="CUDA|Gluon"):
        gf.attention(*_qkv())


@pytest.mark.parametrize("kwargs, exc, word", [
    (dict(variant="fast"), ValueError, "variant"),
    (dict(causal="False"), TypeError, "causal"),
    (dict(return_lse=1), TypeError, "return_lse"),
    (dict(softmax_scale=-1.0), ValueError, "softmax_scale"),
    (dict(softmax_scale=float("nan")), ValueError, "softmax_scale"),
])
def test_bad_options(kwargs, exc, word):
    with pytest.raises(exc, match=word):
        gf.attention(*_qkv(), **kwargs)


@pytest.mark.parametrize("make, exc, word", [
    (lambda: _qkv(d=96), ValueError, "d"),
    (lambda: _qkv(dtype=torch.float32), TypeError, "dtype"),
    (lambda: _qkv(h=3, hk=2), ValueError, "GQA"),
    (lambda: (torch.zeros(8, 2, 64, dtype=BF16),) * 3, ValueError, "4 维"),
    (lambda: ([[0.0]],) * 3, TypeError, "torch.Tensor"),
    (lambda: (_qkv()[0], *_qkv(n=9)[1:]), ValueError, "k、v"),
])
def test_bad_tensors(make, exc, word):
    with pytest.raises(exc, match=word):
        gf.attention(*make())
