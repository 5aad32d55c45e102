"""lecture11/triton_flash.py 的测试：v1 最小内核和 v2 完整内核，Triton 解释器（CPU，fp32，小尺寸）对照 float64 参考；
GPU 用例在有 CUDA 时跑。

解释器必须在定义内核之前打开，启动内核时 Triton 还会再读一次：怎么做见 tests/triton_interp.py（和
test_lecture11_decode.py 共用）。
"""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

from labload import ROOT, load_lab
from triton_interp import load_triton_flash

tf = load_triton_flash()
fast = load_lab("lecture11", "fast_launch")    # triton_flash 导入时已加载（同一份）
fd = load_lab("lecture11", "flash_decode")     # 同上
pytestmark = pytest.mark.usefixtures("triton_interpret")   # 每个测试运行期间打开解释器（conftest.py）

F32 = torch.float32
TOL = tf.CPU_TOL     # fp32 解释器对 float64 参考的误差上限（和模块自检同一个）


# 解释器的分块大小（BLOCK_M, BLOCK_N, warps, stages）。模块默认是 fwd/dQ 的 query 块比 key 块小、dK/dV 反过来；
# 另外两组把大小关系反过来、或者取相等，三段循环的边界落在别的位置上。这些测试走默认反向（split）。
BLOCKS = {
    "q<k": None,
    "q>k": {"fwd": (32, 16, 4, 1), "dkdv": (16, 32, 4, 1), "dq": (32, 16, 4, 1)},
    "q=k": {"fwd": (16, 16, 4, 1), "dkdv": (16, 16, 4, 1), "dq": (16, 16, 4, 1)},
}


@pytest.fixture(params=list(BLOCKS))
def blocks(request):
    """另一组块大小，作为 Launch(blocks=...) 传给内核（解释器里 _launch 总是走固定配置）。"""
    cfg = BLOCKS[request.param]
    if cfg is None:
        assert tf._fixed_config("fwd", 16, F32)[:2] == (16, 32) and tf._fixed_config("dkdv", 16, F32)[:2] == (32, 16)
        return tf.Launch()
    return tf.Launch(blocks=cfg)


def _case(name, gen, batch=1, nq=20, nk=20, hq=2, hk=1, d=16, dtype=F32, **features):
    """make_case 的简写：CPU、默认 fp32，其余用关键字。"""
    return tf.make_case(name, batch=batch, nq=nq, nk=nk, hq=hq, hk=hk, d=d, dtype=dtype, device="cpu", gen=gen,
                        **features)


ATOMIC = tf.Launch(bwd="atomic")     # 原子 dQ 的反向（默认是 split）


def _assert_close(case, launch=None, kernel="full"):
    """默认反向（split：dK/dV + dQ 两个内核）；launch=ATOMIC 走原子 dQ。"""
    ours = tf.run_ours(case, kernel, launch)
    ref = tf.run_reference(case)
    errs = tf.field_errors(ours, ref)
    print(case["name"], errs)                     # 先打印误差再断言
    bad = {f: e for f, e in errs.items() if not e < TOL}
    assert not bad, f"{case['name']}: 误差 {bad}"
    return ours, ref


@pytest.mark.parametrize("shape", [
    dict(nq=29, nk=29, hq=2, hk=2, d=64),                 # 等长、GQA 1
    dict(nq=13, nk=50, hq=4, hk=2, d=40, causal=True),    # Nq < Nk、GQA 2、d 非 2 的幂
    dict(nq=47, nk=18, hq=4, hk=1, d=16, causal=True),    # Nq > Nk（前 29 行没有 key）、MQA
    dict(nq=33, nk=41, hq=4, hk=1, d=80),                 # GQA 4、d = 80
])
def test_matches_float64(gen, blocks, shape):
    _assert_close(_case("shape", gen, batch=2, **shape), blocks)


@pytest.mark.parametrize("kw", [
    dict(window=(6, 3)),
    dict(window=(5, -1), causal=True),
    dict(window=(-1, 4)),
    dict(alibi=True, causal=True),
    dict(alibi=True, window=(9, 9)),
    dict(bias=True),
])
def test_features_match_float64(gen, blocks, kw):
    _assert_close(_case(str(kw), gen, nq=37, nk=44, d=40, **kw), blocks)


# 三段循环的边界（_tile_range 里的 ±1；反向的 dK/dV 交换 q/k 调用同一个函数）只在 Nk − Nq 落在特定余数上时才起作用：
# Nq = 17，Nk = 8…74（Nk − Nq = −9…57，超过一个 key 块宽 32）打包成一次 varlen 调用，每段都有自己的 Nk − Nq。
SWEEP_NK = list(range(8, 75))


@pytest.mark.parametrize("causal,window", [
    (True, (-1, -1)),      # causal（右侧窗口 0）
    (False, (40, -1)),     # 只有左侧窗口（足够宽，才有不带掩码的整块）
    (False, (-1, 8)),      # 只有右侧窗口
    (False, (20, 20)),     # 两侧窗口
])
def test_block_boundary_sweep(gen, blocks, causal, window):
    case = _case(f"sweep {causal} {window}", gen, batch=0, nq=0, nk=0, hq=1, hk=1, causal=causal, window=window,
                 varlen_q=[17] * len(SWEEP_NK), varlen_k=SWEEP_NK)
    _assert_close(case, blocks)


def test_block_boundary_sweep_atomic_backward(gen):
    """
    同一个扫描走 Launch(bwd="atomic")（dQ 在 dK/dV 内核的 Q 块循环里原子加，行掩码在这里）：causal + 左侧窗口，
    两侧边界都在。只用默认块大小：它的块范围和 split 的 dK/dV 是同一个 _tile_range 调用，由上面的扫描覆盖。
    """
    case = _case("sweep atomic", gen, batch=0, nq=0, nk=0, hq=1, hk=1, causal=True, window=(20, -1),
                 varlen_q=[17] * len(SWEEP_NK), varlen_k=SWEEP_NK)
    _assert_close(case, ATOMIC)


# ---------------------------------------------------------------- 两条反向路径：split（默认）、原子 dQ
BWD_FEATURES = [
    dict(causal=True, hq=4),                 # GQA / MQA（hk 随机取 1、2、4）、causal、Nq ≠ Nk
    dict(window=(7, 3)),
    dict(alibi=True, causal=True),
    dict(bias=True),
    dict(dropout_p=0.2, causal=True),
    dict(varlen=True, causal=True),
]


@pytest.mark.parametrize("bwd", tf.BWD_PATHS)
@pytest.mark.parametrize("kw", BWD_FEATURES, ids=lambda kw: "+".join(kw))
def test_both_backward_paths_random_sizes(gen, kw, bwd):
    """每次运行新抽的不规则尺寸（Nq、Nk、d 不是 2 的幂、GQA 组数、varlen 段长含 0），两条反向路径都对 float64 参考。"""
    def draw(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=gen))
    kw = dict(kw)
    hq = kw.pop("hq", 2)
    groups = [g for g in (1, 2, 4) if hq % g == 0]
    hk = hq // groups[draw(0, len(groups))]
    nq, nk, d = draw(3, 60), draw(3, 60), 8 * draw(1, 10)
    if kw.pop("varlen", False):
        lens_q = [draw(0, 30) for _ in range(3)]
        lens_k = [draw(0, 30) if lq else draw(1, 30) for lq in lens_q]
        kw.update(varlen_q=lens_q, varlen_k=lens_k, batch=0)
    sizes = dict(nq=nq, nk=nk, hq=hq, hk=hk, d=d, **{k: v for k, v in kw.items() if k.startswith("varlen")})
    print("sizes", sizes)
    _assert_close(_case(f"{kw} {sizes}", gen, **dict(dict(batch=2, nq=nq, nk=nk, hq=hq, hk=hk, d=d), **kw)),
                  tf.Launch(bwd=bwd))


def test_atomic_autotune_zeroes_dq_between_trials(gen, monkeypatch):
    """
    GPU 上原子 dQ 的内核经过 autotune：每个配置试跑几次，都加进同一个 dQ 累加器。模块的 Autotuner 带
    reset_to_zero=["DQ"]（每次试跑前、选定后正式跑之前清零）；这里在解释器里用同一个 Autotuner、假的计时函数
    （每个配置跑两次）走一遍调优路径（fp16、没有附加特性），dQ 仍然对（没有清零时误差是几倍）。
    """
    tuned = tf._tuned_kernels()["dkdv_atomic"]
    if not hasattr(tuned, "_do_bench"):
        pytest.skip("这个 triton 版本的 Autotuner 没有 _do_bench，换不掉计时函数")

    def two_runs(kernel_call, quantiles):
        kernel_call()
        kernel_call()
        return [1.0, 1.0, 1.0]

    monkeypatch.setattr(tuned, "_do_bench", two_runs)
    monkeypatch.setitem(tf._TUNED, "dkdv_atomic", tuned)
    case = _case("autotune", gen, batch=1, nq=45, nk=37, hq=2, hk=1, d=32, dtype=torch.float16, causal=True)
    ref = tf.run_reference(case)
    errs = tf.field_errors(tf.run_ours(case, launch=ATOMIC), ref)
    torch_errs = tf.field_errors(tf.run_reference(case, dtype=torch.float16), ref)
    assert len(tuned.cache) == 1                                     # 真的走了调优路径
    for field in ("dq", "dk", "dv"):
        assert tf.within_torch_bound(field, errs[field], torch_errs)[0], (field, errs[field], torch_errs[field])


def test_default_backward_is_split(gen, monkeypatch):
    """
    默认反向是 split（dK/dV 内核 + dQ 内核，没有原子加：逐位可复现），deterministic=True 也走它；
    Launch(bwd="atomic") 走带原子 dQ 的 dK/dV 内核、没有 dQ 内核。解释器里每条路径都是确定的（两次反向逐位相同
    说明不了什么），所以这里记下 _launch 启动了哪些内核。两条路径的 dK、dV 是同一个机制（逐位相同），dQ 只差舍入。
    """
    launched = []
    real_launch = tf._launch

    def spy(kind, *args, **kwargs):
        launched.append(kind)
        return real_launch(kind, *args, **kwargs)

    monkeypatch.setattr(tf, "_launch", spy)
    q, k, v = (torch.randn(1, n, h, 24, generator=gen) for n, h in ((37, 4), (45, 2), (45, 2)))
    do = torch.randn(1, 37, 4, 24, generator=gen)

    def grads(**kw):
        launched.clear()
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        tf.flash_attn_func(qq, kk, vv, causal=True, window_size=(9, -1), **kw).backward(do)
        return (qq.grad, kk.grad, vv.grad), list(launched)

    split, kinds = grads()
    assert kinds == ["fwd", "dkdv", "dq"]
    assert grads(deterministic=True)[1] == ["fwd", "dkdv", "dq"]
    atomic, kinds = grads(launch=ATOMIC)
    assert kinds == ["fwd", "dkdv_atomic"]
    assert torch.equal(split[1], atomic[1]) and torch.equal(split[2], atomic[2])
    assert tf._rel_err(atomic[0].double(), split[0].double()) < TOL
    launched.clear()
    cu = torch.tensor([0, 20, 37], dtype=torch.int32)
    qq = q[0].clone().requires_grad_(True)
    tf.flash_attn_varlen_func(qq, k[0, :37], v[0, :37], cu, cu, 20, 20, causal=True,
                              deterministic=True).backward(do[0])
    assert launched == ["fwd", "dkdv", "dq"]


def test_alibi_slopes_per_batch(gen):
    """[B, Hq] 的斜率：每个 batch 用自己的一行（斜率差别大，读错 batch 的行误差 ≫ 容差）。"""
    case = _case("alibi [B, Hq]", gen, batch=2, nq=21, nk=30, causal=True, alibi=True)
    case["slopes"] = torch.rand(2, 2, generator=gen) * 2.0
    _assert_close(case)


@pytest.mark.parametrize("shape", [(2, 2), (1, 1), (2, 1), (1, 2)])
def test_bias_shapes(gen, shape):
    """bias [B 或 1, Hq 或 1, Nq, Nk]：逐 batch、逐头和广播都和参考一致（前向 + 反向）。"""
    case = _case(f"bias {shape}", gen, batch=2, nq=19, nk=26)
    case["bias"] = torch.randn(*shape, 19, 26, generator=gen) * 2.0
    _assert_close(case)


def test_varlen_with_empty_and_single_sequences(gen):
    lens_q, lens_k = [0, 1, 21, 1, 34], [4, 1, 30, 0, 34]
    case = _case("varlen", gen, batch=0, nq=0, nk=0, hq=4, hk=2, d=24, causal=True, varlen_q=lens_q, varlen_k=lens_k)
    ours, _ = _assert_close(case)
    # 第 4 段 Nk = 0：这一行输出 0、LSE = −inf、dQ = 0
    row = sum(lens_q[:3])
    assert torch.equal(ours[0][row], torch.zeros_like(ours[0][row]))
    assert bool(torch.isneginf(ours[1][:, row]).all())
    assert torch.equal(ours[2][row], torch.zeros_like(ours[2][row]))


def test_varlen_equals_dense_per_sequence(gen):
    """varlen 的每一段和单独用 flash_attn_func 算的结果逐位一致（同一套内核、同样的块划分）。"""
    lens = [7, 19, 3]
    tot = sum(lens)
    q, k, v = (torch.randn(tot, 2, 32, generator=gen) for _ in range(3))
    cu = torch.tensor([0, 7, 26, 29], dtype=torch.int32)
    out = tf.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    for b in range(3):
        a, e = int(cu[b]), int(cu[b + 1])
        dense = tf.flash_attn_func(q[None, a:e], k[None, a:e], v[None, a:e], causal=True)[0]
        assert torch.equal(out[a:e], dense)


def test_empty_rows_are_zero_not_nan(gen):
    """causal 且 Nq > Nk：前 Nq − Nk 行看不到任何 key，输出 0、LSE −inf，梯度有限。"""
    nq, nk = 40, 16
    case = _case("empty rows", gen, nq=nq, nk=nk, hq=2, hk=2, causal=True)
    out, lse, dq, dk, dv = tf.run_ours(case)
    e = nq - nk                                                  # 空行数
    assert torch.equal(out[0, :e], torch.zeros_like(out[0, :e]))
    assert bool(torch.isneginf(lse[0, :, :e]).all()) and bool(torch.isfinite(lse[0, :, e:]).all())
    assert all(bool(torch.isfinite(g).all()) for g in (dq, dk, dv))
    assert torch.equal(dq[0, :e], torch.zeros_like(dq[0, :e]))


def test_cross_check_sdpa_bottom_right(gen):
    """独立的第二参考：F.scaled_dot_product_attention + 显式的右下角掩码；并确认 SDPA 的 is_causal 是左上角。"""
    nq, nk, d = 21, 53, 32
    q, k, v = (torch.randn(2, n, 3, d, generator=gen) for n in (nq, nk, nk))
    ours = tf.flash_attn_func(q, k, v, causal=True)
    mask = torch.ones(nq, nk, dtype=torch.bool).tril(diagonal=nk - nq)          # query i 看 j ≤ Nk − Nq + i
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask).transpose(1, 2)
    assert torch.allclose(ours, sdpa, atol=1e-5, rtol=1e-4)
    top_left = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    assert (ours - top_left).abs().max() > 1e-2                                  # 约定确实不同


def test_reference_agrees_with_flash_lab(gen):
    """本文件的 float64 参考和 flash_lab.standard_attention（numpy）在右下角 causal 上一致。"""
    fl = load_lab("lecture11", "flash_lab")
    q, k, v = (torch.randn(1, n, 1, 16, generator=gen, dtype=torch.float64) for n in (9, 14, 14))
    ref, _ = tf.reference_attention(q, k, v, causal=True)
    O, _, _ = fl.standard_attention(q[0, :, 0].numpy(), k[0, :, 0].numpy(), v[0, :, 0].numpy(), causal=True)
    assert torch.allclose(ref[0, :, 0], torch.from_numpy(O), atol=1e-12)


def test_lse_is_natural_log(gen):
    q, k, v = (torch.randn(1, 17, 2, 16, generator=gen) for _ in range(3))
    _, lse = tf.flash_attn_func(q, k, v, return_lse=True)
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) / math.sqrt(q.shape[-1])
    assert torch.allclose(lse.double(), torch.logsumexp(s, -1), atol=1e-5)


def test_dropout_statistics_and_reproducibility(gen):
    p = 0.3
    keep = tf.dropout_mask(1234, p, 2, 3, 40, 50, "cpu")
    frac = keep.float().mean().item()
    sigma = math.sqrt(p * (1 - p) / keep.numel())
    assert abs(frac - (1 - p)) < 5 * sigma, frac
    assert not torch.equal(keep[0, 0], keep[0, 1]) and not torch.equal(keep[0, 0], keep[1, 0])   # 各头各自独立
    q, k, v = (torch.randn(1, 24, 2, 16, generator=gen) for _ in range(3))
    a = tf.flash_attn_func(q, k, v, dropout_p=p, seed=7)
    b = tf.flash_attn_func(q, k, v, dropout_p=p, seed=7)
    c = tf.flash_attn_func(q, k, v, dropout_p=p, seed=8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    # V = 1 时输出 = Σ_j P_ij·keep_ij/(1−p)：期望为 1，这里逐行和掩码核对
    ones = torch.ones(1, 24, 2, 16)
    out = tf.flash_attn_func(q, k, ones, dropout_p=p, seed=7)
    m = tf.dropout_mask(7, p, 1, 2, 24, 24, "cpu")
    P = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1]), -1)
    expect = (P * m / (1 - p)).sum(-1)                                           # [1, 2, 24]
    assert torch.allclose(out[0, :, :, 0].T, expect[0], atol=1e-5)


@pytest.mark.parametrize("bwd", tf.BWD_PATHS)
def test_dropout_backward_matches_reference(gen, bwd):
    _assert_close(_case("dropout", gen, batch=2, nq=23, nk=31, hq=4, hk=2, causal=True, dropout_p=0.25),
                  tf.Launch(bwd=bwd))


def test_noncontiguous_inputs(gen):
    """[B, H, N, d] 转置来的 q（步长不是 [B, N, H, d] 的）和最后一维不连续的 k 都能用。"""
    q = torch.randn(1, 2, 19, 16, generator=gen).transpose(1, 2)
    k = torch.randn(1, 19, 2, 32, generator=gen)[..., ::2]
    v = torch.randn(1, 19, 2, 16, generator=gen)
    ref, _ = tf.reference_attention(q, k, v, causal=True)
    assert tf._rel_err(tf.flash_attn_func(q, k, v, causal=True).double(), ref) < TOL


def _qkv(b=1, nq=8, nk=8, hq=2, hk=2, d=16, dtype=F32):
    return (torch.randn(b, nq, hq, d, dtype=dtype), torch.randn(b, nk, hk, d, dtype=dtype),
            torch.randn(b, nk, hk, d, dtype=dtype))


@pytest.mark.parametrize("make,exc,word", [
    (lambda: tf.flash_attn_func(*_qkv()[:2], _qkv()[2].half()), TypeError, "dtype"),
    (lambda: tf.flash_attn_func(*_qkv(dtype=torch.float64)), TypeError, "dtype"),
    (lambda: tf.flash_attn_func(*_qkv(dtype=torch.bfloat16)), TypeError, "bfloat16"),
    (lambda: tf.flash_attn_func(*_qkv(hq=3, hk=2)), ValueError, "Hq"),
    (lambda: tf.flash_attn_func(*_qkv(d=272)), ValueError, "head dim"),
    (lambda: tf.flash_attn_func(_qkv()[0], _qkv(b=2)[1], _qkv(b=2)[2]), ValueError, "batch"),
    (lambda: tf.flash_attn_func(_qkv()[0], _qkv()[1], _qkv(nk=9)[2]), ValueError, "形状"),
    (lambda: tf.flash_attn_func(_qkv()[0][0], *_qkv()[1:]), ValueError, "q"),
    (lambda: tf.flash_attn_func(*_qkv(), dropout_p=1.0), ValueError, "dropout_p"),
    (lambda: tf.flash_attn_func(*_qkv(), dropout_p=-0.1), ValueError, "dropout_p"),
    (lambda: tf.flash_attn_func(*_qkv(), window_size=(3,)), ValueError, "window_size"),
    (lambda: tf.flash_attn_func(*_qkv(), softmax_scale=-1.0), ValueError, "softmax_scale"),
    (lambda: tf.flash_attn_func(*_qkv(), alibi_slopes=torch.ones(3)), ValueError, "alibi_slopes"),
    (lambda: tf.flash_attn_func(*_qkv(), bias=torch.zeros(1, 2, 8, 7)), ValueError, "bias"),
    (lambda: tf.flash_attn_func(*_qkv(), bias=torch.zeros(1, 2, 8, 8, requires_grad=True)), ValueError, "bias"),
    (lambda: tf.flash_attn_func(*_qkv(), alibi_slopes=torch.ones(2, requires_grad=True)), ValueError, "alibi_slopes"),
    (lambda: tf.flash_attn_func(*_qkv(), alibi_slopes=torch.tensor([0.5, float("nan")])), ValueError, "NaN"),
    (lambda: tf.flash_attn_func(*_qkv(), seed="x"), ValueError, "seed"),
    (lambda: tf.flash_attn_func(*_qkv(), seed=True), ValueError, "seed"),
    (lambda: tf.flash_attn_func(*_qkv(), softmax_scale=0), ValueError, "0 不表示默认值"),
    (lambda: tf.flash_attn_func(*_qkv(), dropout_p=True), ValueError, "dropout_p"),
    (lambda: tf.flash_attn_func(*_qkv(), dropout_p="0.1"), ValueError, "dropout_p"),
    (lambda: tf.flash_attn_func(*_qkv(), window_size=(True, 0)), ValueError, "window_size"),
    (lambda: tf.flash_attn_func(*_qkv(), window_size=(2.0, 0)), ValueError, "window_size"),
    (lambda: tf.flash_attn_func(*_qkv(), return_encoded_softmax=True), NotImplementedError, "dropout_mask"),
    (lambda: tf.flash_attn_func(*_qkv(), no_such_option=1), TypeError, "no_such_option"),
])
def test_bad_inputs_raise(make, exc, word):
    with pytest.raises(exc, match=word):
        make()


@pytest.mark.parametrize("cu,exc,word", [
    (torch.tensor([0, 5, 8], dtype=torch.int64), TypeError, "int32"),
    (torch.tensor([0, 6, 5, 8], dtype=torch.int32), ValueError, "单调"),
    (torch.tensor([1, 5, 8], dtype=torch.int32), ValueError, "从 0 开始"),
    (torch.tensor([0, 5, 7], dtype=torch.int32), ValueError, "总长度"),
    (torch.tensor([[0, 5, 8]], dtype=torch.int32), ValueError, "一维"),
])
def test_bad_cu_seqlens(cu, exc, word):
    q = torch.randn(8, 2, 16)
    good = torch.tensor([0, 5, 8], dtype=torch.int32)
    with pytest.raises(exc, match=word):
        tf.flash_attn_varlen_func(q, q, q, cu, good, 8, 8)
    with pytest.raises(ValueError, match="max_seqlen"):
        tf.flash_attn_varlen_func(q, q, q, good, good, 4, 8)
    with pytest.raises(ValueError, match="长度必须相同"):
        tf.flash_attn_varlen_func(q, q, q, good, torch.tensor([0, 8], dtype=torch.int32), 5, 8)


def test_float16_on_interpreter(gen):
    """fp16 在解释器里和 float64 参考的误差不超过 PyTorch 自己 fp16 注意力误差的 2 倍（GPU 检查的同一判据）；
    两条反向路径都查（check_gpu 用的同一个 both_backward_errors）。"""
    case = _case("fp16", gen, nq=29, nk=37, d=40, dtype=torch.float16, causal=True)
    ref = tf.run_reference(case)
    errs = tf.both_backward_errors(case, "full", ref)
    torch_errs = tf.field_errors(tf.run_reference(case, dtype=torch.float16), ref)
    assert set(errs) == {*tf.FIELDS, "dq:atomic", "dk:atomic", "dv:atomic"}
    for field, e in errs.items():
        ok, t = tf.within_torch_bound(field, e, torch_errs)
        assert ok, (field, e, t)


# ---------------------------------------------------------------- softcap（Gemma-2 的 logit soft-capping）
SOFTCAP = dict(softcap=5.0, q_gain=4.0)      # q 放大 4 倍：logit ~ N(0, 16)，c = 5 真的截得到


_tanh = tf._tanh


def test_tanh_helper_accurate_over_the_whole_range():
    """内核里的 _tanh（泰勒级数 + 1 − 2/(e^{2y} + 1) 两段）在 fp32 里的相对误差 ≤ 4e-7：两段的交界 0.5 附近、
    很小的参数（softcap 很大时 tanh 的参数就这么小）、很大的参数（= ±1，不是 NaN）、±0。"""
    @triton.jit            # 在测试里定义：这时 TRITON_INTERPRET=1（triton.jit 在定义时决定是否解释执行）
    def _tanh_kernel(X, Y, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(Y + offs, _tanh(tl.load(X + offs, mask=offs < N, other=0.0)), mask=offs < N)

    grid = torch.linspace(-20, 20, 40001, dtype=torch.float64)
    tiny = torch.logspace(-30, math.log10(0.6), 4000, dtype=torch.float64)
    edge = torch.linspace(0.49, 0.51, 2001, dtype=torch.float64)
    x = torch.cat([grid, tiny, -tiny, edge, -edge, torch.tensor([0.0, -0.0, 1e30, -1e30, 3e38, -3e38])]).float()
    y = torch.empty_like(x)
    _tanh_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    ref = torch.tanh(x.double())
    rel = ((y.double() - ref).abs() / ref.abs().clamp_min(1e-300)).nan_to_num(0.0)       # ±0：0/tiny = 0
    print("max rel err", float(rel.max()), "at", float(x[rel.argmax()]))
    assert bool(torch.isfinite(y).all()) and float(rel.max()) <= 4e-7
    assert bool((y[x.abs() >= 10] == torch.sign(x[x.abs() >= 10])).all())
    assert torch.equal(y[x == 0], torch.zeros_like(y[x == 0]))


def _max_abs_errors(ours, ref):
    """每一项的最大绝对误差 / max(1, 参考的最大绝对值)；两边的 ±inf（LSE 的空行）必须在同样的位置。"""
    errs = {}
    for f, a, b in zip(tf.FIELDS, ours, ref):
        fin = torch.isfinite(b)
        assert torch.equal(fin, torch.isfinite(a)), f
        errs[f] = float((a[fin] - b[fin]).abs().max() / b[fin].abs().max().clamp_min(1.0)) if bool(fin.any()) else 0.0
    return errs


SOFTCAP_FEATURES = [
    dict(causal=True),                        # causal、Nq < Nk、GQA 2
    dict(alibi=True, window=(9, 5)),          # 先截、再加 ALiBi、再做窗口掩码
    dict(bias=True, causal=True),
    dict(dropout_p=0.2, causal=True),
    dict(varlen=True, causal=True),           # 段长含 0、Nq > Nk 的段（前几行没有 key）
]


@pytest.mark.parametrize("bwd", tf.BWD_PATHS)
@pytest.mark.parametrize("kw", SOFTCAP_FEATURES, ids=lambda kw: "+".join(kw))
def test_softcap_matches_float64(gen, kw, bwd):
    """softcap = 5 的 out、LSE、dQ、dK、dV（两条反向路径）对 float64 参考：相对误差和最大绝对误差都 < TOL；
    同样的输入不截时结果差得远（≫ TOL：这组输入上 softcap 真的起作用）。"""
    kw = dict(kw)
    if kw.pop("varlen", False):
        kw.update(batch=0, varlen_q=[0, 23, 9, 14], varlen_k=[5, 41, 12, 3])
    case = _case(f"softcap {kw}", gen, **dict(dict(batch=1, nq=23, nk=41, hq=4, hk=2, d=40), **kw, **SOFTCAP))
    ours, ref = _assert_close(case, tf.Launch(bwd=bwd))
    abs_errs = _max_abs_errors(ours, ref)
    print("max abs", abs_errs)
    assert max(abs_errs.values()) < TOL, abs_errs
    uncapped = tf.field_errors(tf.run_reference(dict(case, softcap=0.0)), ref)
    print("uncapped vs capped", uncapped)
    assert min(uncapped[f] for f in ("out", "dq", "dk", "dv")) > 1e3 * TOL, uncapped


def test_softcap_float16_on_interpreter(gen):
    """fp16：误差不超过 PyTorch 自己 fp16（同样先截再 softmax）误差的 2 倍（GPU 检查的判据），两条反向路径。"""
    case = _case("softcap fp16", gen, nq=23, nk=41, hq=4, hk=2, d=40, dtype=torch.float16, causal=True, **SOFTCAP)
    ref = tf.run_reference(case)
    errs = tf.both_backward_errors(case, "full", ref)
    torch_errs = tf.field_errors(tf.run_reference(case, dtype=torch.float16), ref)
    print(errs, torch_errs)
    for field, e in errs.items():
        ok, t = tf.within_torch_bound(field, e, torch_errs)
        assert ok, (field, e, t)


def test_softcap_zero_is_bitwise_off(gen, monkeypatch):
    """softcap = 0（各种写法）和不传逐位相同（前向 + 反向、dense 和 varlen），内核拿到 HAS_SOFTCAP = False、走常用
    （可调优）路径；softcap > 0 时 HAS_SOFTCAP = True、不走调优路径（和 ALiBi 一样）。"""
    seen = []
    real_launch = tf._launch

    def spy(kind, n_blocks_of, args, meta, use_tune, *rest, **kwargs):
        seen.append((kind, meta["HAS_SOFTCAP"], use_tune))
        return real_launch(kind, n_blocks_of, args, meta, use_tune, *rest, **kwargs)

    monkeypatch.setattr(tf, "_launch", spy)
    q, k, v = (torch.randn(1, n, h, 24, generator=gen) for n, h in ((19, 2), (27, 1), (27, 1)))
    do = torch.randn(1, 19, 2, 24, generator=gen)

    def run(**kw):
        seen.clear()
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        out, lse = tf.flash_attn_func(qq, kk, vv, causal=True, return_lse=True, **kw)
        out.backward(do)
        return (out, lse, qq.grad, kk.grad, vv.grad), set(seen)

    base, kinds = run()
    assert kinds == {("fwd", False, True), ("dkdv", False, True), ("dq", False, True)}
    for off in (0.0, 0, -0.0, np.float32(0.0), torch.tensor(0.0)):
        got, kinds = run(softcap=off)
        assert all(torch.equal(a, b) for a, b in zip(base, got)), off
        assert {s for _, s, _ in kinds} == {False}
    capped, kinds = run(softcap=1.5)
    assert kinds == {("fwd", True, False), ("dkdv", True, False), ("dq", True, False)}
    assert not torch.equal(capped[0], base[0])
    cu = torch.tensor([0, 19], dtype=torch.int32)
    cu_k = torch.tensor([0, 27], dtype=torch.int32)
    plain = tf.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu_k, 19, 27, causal=True)
    assert torch.equal(plain, tf.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu_k, 19, 27, causal=True, softcap=0.0))
    assert torch.equal(plain, base[0][0].detach())


def test_large_softcap_approaches_uncapped(gen):
    """c·tanh(x/c) = x − x³/(3c²) + …：c 很大时就是不截（c = 1e4、1e6 时和不截的内核结果差 < TOL）；c = 100 时差得
    出来（> 10·TOL），而且和 float64 参考一致。只有小参数上也准的 tanh 才过得了：1 − 2/(e^{2y} + 1) 的相减抵消会让
    c·tanh(x/c) 差 ~c·1e-7（c = 1e4 时 1e-3）。"""
    case = _case("large softcap", gen, batch=1, nq=23, nk=41, hq=2, hk=1, d=40, causal=True)
    uncapped = tf.run_ours(case)
    for cap in (1e4, 1e6):
        errs = tf.field_errors(tf.run_ours(dict(case, softcap=cap)), uncapped)
        print(cap, errs)
        assert max(errs.values()) < TOL, (cap, errs)
    mild = dict(case, softcap=100.0)
    ours, ref = _assert_close(mild)
    diff = tf.field_errors(ours, uncapped)
    print("c = 100 vs uncapped", diff)
    assert diff["out"] > 10 * TOL and diff["dq"] > 10 * TOL


def test_reference_softcap_matches_hand_written_backward(gen):
    """float64 参考（torch autograd）对照一份独立的 numpy：显式的 c·tanh(x/c) + ALiBi + 右下角 causal 掩码 + softmax，
    反向按公式手写（dS = P∘(dP − rowsum(dP∘P))，dX = dS∘(1 − t²)，dQ = scale·dX K，dK = scale·dXᵀ Q 按组求和，
    dV = Pᵀ dO）。"""
    nq, nk, hq, hk, d, cap = 5, 7, 4, 2, 8, 2.0
    q = torch.randn(1, nq, hq, d, generator=gen, dtype=torch.float64) * 3.0
    k, v = (torch.randn(1, nk, hk, d, generator=gen, dtype=torch.float64) for _ in range(2))
    do = torch.randn(1, nq, hq, d, generator=gen, dtype=torch.float64)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float32)
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    out, lse = tf.reference_attention(qq, kk, vv, causal=True, alibi_slopes=slopes, softcap=cap)
    out.backward(do)
    scale = 1.0 / math.sqrt(d)
    Q, K, V, dO = (t[0].numpy() for t in (q, k, v, do))                      # [N, H, d]
    pos = np.arange(nq)[:, None] + (nk - nq)
    j = np.arange(nk)[None, :]
    dQ, dK, dV = np.zeros_like(Q), np.zeros_like(K), np.zeros_like(V)
    for h in range(hq):
        g = h // (hq // hk)
        x = Q[:, h] @ K[:, g].T * scale                                         # [Nq, Nk]
        t = np.tanh(x / cap)
        s = np.where(j <= pos, cap * t - float(slopes[h]) * np.abs(pos - j), -np.inf)
        m = s.max(1, keepdims=True)
        P = np.exp(s - m) / np.exp(s - m).sum(1, keepdims=True)
        assert np.allclose(out[0, :, h].detach().numpy(), P @ V[:, g], atol=1e-12)
        assert np.allclose(lse[0, h].detach().numpy(), (m + np.log(np.exp(s - m).sum(1, keepdims=True)))[:, 0],
                           atol=1e-12)
        dP = dO[:, h] @ V[:, g].T
        dX = P * (dP - (dP * P).sum(1, keepdims=True)) * (1.0 - t * t)
        dQ[:, h] = scale * dX @ K[:, g]
        dK[:, g] += scale * dX.T @ Q[:, h]
        dV[:, g] += P.T @ dO[:, h]
    for name, auto, hand in (("dq", qq.grad, dQ), ("dk", kk.grad, dK), ("dv", vv.grad, dV)):
        assert np.allclose(auto[0].numpy(), hand, atol=1e-12), name


@pytest.mark.parametrize("bad", [-1.0, -1e-9, float("nan"), float("inf"), -float("inf"), "1.0", True, False, None,
                                 [1.0], complex(1.0, 0.0), torch.tensor([1.0, 2.0]), 1e-300, 1e300])
def test_bad_softcap_raises(bad):
    """负数、NaN、±inf、字符串、bool、None、list、复数、多元素张量，以及 fp32 里算不了的 1e-300 / 1e300：
    两个入口都报 ValueError，消息里有 softcap。"""
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="softcap"):
        tf.flash_attn_func(*_qkv(), softcap=bad)
    with pytest.raises(ValueError, match="softcap"):
        tf.flash_attn_varlen_func(*(t[0] for t in _qkv()), cu, cu, 8, 8, softcap=bad)


def test_softcap_scalar_types_accepted(gen):
    """int、numpy 标量、0 维张量的 softcap 和 Python float 逐位相同；v1（mini_attention）没有 softcap：
    run_ours 拿带 softcap 的用例跑 v1 报错，而不是悄悄不截。"""
    q, k, v = _qkv(nq=11, nk=13)
    base = tf.flash_attn_func(q * 4, k, v, causal=True, softcap=3.0)
    for same in (3, np.float32(3.0), np.int64(3), torch.tensor(3.0)):
        assert torch.equal(base, tf.flash_attn_func(q * 4, k, v, causal=True, softcap=same)), same
    case = _case("v1 softcap", gen, nq=16, nk=16, hq=1, hk=1, softcap=3.0)
    with pytest.raises(ValueError, match="softcap"):
        tf.run_ours(case, "minimal")


class _FakeGpuTensor:
    """快速路径的键只读这几个属性：CPU 上也能看 _dense_key / _plan_key 怎样构造键。"""
    is_cuda, requires_grad, dtype, shape = True, False, torch.float16, torch.Size([1, 8, 2, 16])
    device = torch.device("cuda", 0)

    def get_device(self):
        return 0

    def stride(self):
        return (256, 32, 16, 1)

    def data_ptr(self):
        return 0


def test_softcap_is_part_of_fast_path_keys(monkeypatch):
    """GPU 快速路径的两种键（_dense_key：原始参数；_plan_key：检查后的参数）都含 softcap：softcap = 0 记下的
    _Plan / _DenseFast 绝不会拿去跑 softcap = 1.5（反过来也一样）；不传 softcap 和 softcap=0.0 是同一个键。"""
    monkeypatch.setattr(tf, "INTERPRET", False)
    t = _FakeGpuTensor()
    args = (None, False, None, None, (-1, -1), False, None, False, False, None, False)
    keys = [tf._dense_key(t, t, t, 0.0, *args, cap) for cap in (0.0, 1.5, 30.0, 0)]
    assert None not in keys and len(set(keys)) == 4                          # int 0 和 0.0 也分开（类型进键）
    assert tf._dense_key(t, t, t, 0.0, *args) == keys[0]
    opts = tf._Options(scale=0.25, window=(-1, 0), dropout_p=0.0, seed=0, slopes=None, bias=None, return_lse=False,
                       launch=tf.DEFAULT_LAUNCH)
    plan_keys = [tf._plan_key(t, t, t, tf.dataclasses.replace(opts, softcap=cap), 1, 8, 8) for cap in (0.0, 1.5, 30.0)]
    assert None not in plan_keys and len(set(plan_keys)) == 3
    assert tf._plan_key(t, t, t, opts, 1, 8, 8) == plan_keys[0]


def test_plan_key_separates_batches_that_pack_to_the_same_shape(monkeypatch):
    """[B·N, H, d] 一样的 B = 1、N = 2048 和 B = 2、N = 1024：网格和 max_q 不同，记下的 _Plan 不能共用。"""
    monkeypatch.setattr(tf, "INTERPRET", False)
    t = _FakeGpuTensor()
    opts = tf._Options(scale=0.25, window=(-1, 0), dropout_p=0.0, seed=0, slopes=None, bias=None, return_lse=False,
                       launch=tf.DEFAULT_LAUNCH)
    keys = {tf._plan_key(t, t, t, opts, b, n, n) for b, n in ((1, 2048), (2, 1024), (4, 512))}
    assert None not in keys and len(keys) == 3
    assert tf._plan_key(t, t, t, opts, 2, 1024, 512) != tf._plan_key(t, t, t, opts, 2, 1024, 1024)


@settings(max_examples=10, deadline=None)
@given(log_gain=st.integers(0, 3), cap=st.sampled_from([0.5, 5.0, 50.0]), causal=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_softcap_bounds_logits_whatever_the_q_scale(log_gain, cap, causal, seed):
    """|c·tanh(x/c)| < c：q 放大 10^k 倍（k ≤ 3）时 logit 仍在 (−c, c) 里，所以输出有限、是 V 行的凸组合
    （逐维落在看得见的 V 行的最小、最大值之间），LSE ∈ [log n − c, log n + c]（n = 这一行看得见的 key 数；数学上
    是开区间，fp32 里 tanh 会饱和成 ±1，所以取闭区间加舍入），且和 float64 参考一致（LSE 按自己的大小 ~c 取误差）。"""
    gen = torch.Generator().manual_seed(seed)
    nq, nk = 9, 13
    q = torch.randn(1, nq, 2, 16, generator=gen) * 10.0 ** log_gain
    k, v = (torch.randn(1, nk, 1, 16, generator=gen) for _ in range(2))
    out, lse = tf.flash_attn_func(q, k, v, causal=causal, softcap=cap, return_lse=True)
    ref, ref_lse = tf.reference_attention(q, k, v, causal=causal, softcap=cap)
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse).all())
    ok = tf.allowed_mask(nq, nk, causal)                                          # [Nq, Nk]
    n_vis = ok.sum(1).double()
    room = (lse[0].double() - n_vis.log()).abs() - cap                           # ≤ 0（加上舍入）
    assert float(room.max()) <= TOL * max(1.0, cap), float(room.max())
    vals = v[0, :, 0]                                                             # [Nk, d]
    lo = torch.where(ok[:, :, None], vals[None], float("inf")).amin(1)           # [Nq, d]
    hi = torch.where(ok[:, :, None], vals[None], float("-inf")).amax(1)
    slack = 1e-6 * vals.abs().max()
    assert bool((out[0, :, 0] >= lo - slack).all() and (out[0, :, 0] <= hi + slack).all())
    assert tf._rel_err(out.double(), ref) < TOL
    assert float((lse.double() - ref_lse).abs().max()) < TOL * max(1.0, cap)


def test_seed_keywords_accepted(gen):
    """种子的调用方式：return_encoded_softmax=False、enable_profiling 可以传，结果不变。"""
    q, k, v = (torch.randn(1, 12, 2, 16, generator=gen) for _ in range(3))
    base = tf.flash_attn_func(q, k, v, causal=True)
    same = tf.flash_attn_func(q, k, v, causal=True, return_encoded_softmax=False, enable_profiling=True)
    assert torch.equal(base, same)
    cu = torch.tensor([0, 12], dtype=torch.int32)
    out = tf.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 12, 12, causal=True, enable_profiling=False,
                                    return_encoded_softmax=False)
    assert torch.equal(out, base[0])
    with pytest.raises(NotImplementedError, match="N×N"):
        tf.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 12, 12, return_encoded_softmax=True)


def test_numpy_and_tensor_scalars_accepted(gen):
    """np.int64 / np.float32 / 0 维张量和 Python 的 int / float 等价。"""
    q, k, v = (torch.randn(1, 12, 2, 16, generator=gen) for _ in range(3))
    base = tf.flash_attn_func(q, k, v, dropout_p=0.1, softmax_scale=0.25, window_size=(2, 0), seed=5)
    got = tf.flash_attn_func(q, k, v, dropout_p=np.float32(0.1), softmax_scale=np.float32(0.25),
                             window_size=(np.int64(2), 0), seed=np.int64(5))
    assert torch.equal(base, got)
    got = tf.flash_attn_func(q, k, v, dropout_p=torch.tensor(0.1), softmax_scale=torch.tensor(0.25),
                             window_size=(torch.tensor(2), 0), seed=torch.tensor(5))
    assert torch.equal(base, got)
    cu = torch.tensor([0, 12], dtype=torch.int32)
    ref = tf.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 12, 12)
    for m in (np.int64(12), torch.tensor(12), np.int32(12)):
        assert torch.equal(tf.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, m, m), ref)
    for bad in (True, 12.0, torch.tensor(12.0), torch.tensor([12])):
        with pytest.raises(ValueError, match="max_seqlen"):
            tf.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, bad, 12)


@pytest.mark.parametrize("which", ["max_seqlen_q", "max_seqlen_k"])
@pytest.mark.parametrize("too_big", [9, 10**9])
def test_varlen_max_seqlen_beyond_total_rows_is_refused(which, too_big):
    """max_seqlen 大于打包后的总行数（这里 8）：ValueError 点名那个参数，不启动内核（10**9 曾让解释器卡住）。
    等于总行数的照常跑。"""
    q = torch.randn(8, 2, 16)
    cu = torch.tensor([0, 5, 8], dtype=torch.int32)
    kw = dict(max_seqlen_q=5, max_seqlen_k=5)
    kw[which] = too_big
    with pytest.raises(ValueError, match=which):
        tf.flash_attn_varlen_func(q, q, q, cu, cu, **kw)
    kw[which] = 8
    out = tf.flash_attn_varlen_func(q, q, q, cu, cu, **kw)
    assert torch.allclose(out, tf.flash_attn_varlen_func(q, q, q, cu, cu, 5, 5), atol=1e-6)


def test_script_without_triton_skips():
    """没有 triton（非 Linux）：当脚本运行打印一行 SKIP、退出码 77；当模块导入照常抛 ImportError。"""
    block = "import sys, runpy; sys.modules['triton'] = None\n"
    run = "runpy.run_path('lecture11/triton_flash.py', run_name='__main__')"
    out = subprocess.run([sys.executable, "-c", block + run], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 77 and out.stdout.startswith("SKIP: 没有安装 triton"), out.stdout + out.stderr
    imp = "runpy.run_path('lecture11/triton_flash.py', run_name='triton_flash')"
    out = subprocess.run([sys.executable, "-c", block + imp], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode not in (0, 77) and "import triton" in out.stderr, out.stdout + out.stderr


def test_cpu_without_interpreter_gives_clear_error():
    code = ("import sys; sys.path.insert(0, 'lecture11'); import torch, triton_flash as tf\n"
            "q = torch.randn(1, 4, 1, 16)\n"
            "try:\n    tf.flash_attn_func(q, q, q)\nexcept RuntimeError as e:\n    print('ERR', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert "ERR" in out.stdout and "TRITON_INTERPRET=1" in out.stdout, out.stdout + out.stderr


# ---------------------------------------------------------------- v1：最小内核
@pytest.mark.parametrize("shape", [
    dict(batch=2, n=37, heads=2, d=64, causal=False),
    dict(batch=1, n=45, heads=3, d=16, causal=True),
    dict(batch=2, n=70, heads=1, d=32, causal=True),     # 跨好几个 Q 块和 key 块，最后一块不满
    dict(batch=1, n=5, heads=2, d=128, causal=False),    # 比一个块还短
])
def test_minimal_matches_float64(gen, shape):
    n, heads = shape["n"], shape["heads"]
    case = _case("v1", gen, batch=shape["batch"], nq=n, nk=n, hq=heads, hk=heads, d=shape["d"],
                 causal=shape["causal"])
    _assert_close(case, kernel="minimal")


def test_minimal_matches_flash_lab_naive(gen):
    """v1 和 flash_lab.naive_attention（numpy 逐行参考）一致：同一个参考链的起点。"""
    fl = load_lab("lecture11", "flash_lab")
    q, k, v = (torch.randn(1, 33, 1, 32, generator=gen) for _ in range(3))
    out, lse = tf.mini_attention(q, k, v, causal=True)
    O, L = fl.naive_attention(q[0, :, 0].double().numpy(), k[0, :, 0].double().numpy(), v[0, :, 0].double().numpy(),
                              causal=True)
    print("max |Δout|", (out[0, :, 0].double() - torch.from_numpy(O)).abs().max().item())
    assert torch.allclose(out[0, :, 0].double(), torch.from_numpy(O), atol=1e-5)
    assert torch.allclose(lse[0, 0].double(), torch.from_numpy(L), atol=1e-5)


def test_minimal_equals_full_kernel(gen):
    """两版算的是同一个函数：同样的输入，v1 和 v2 的输出在 fp32 舍入误差内一致。"""
    q, k, v = (torch.randn(2, 29, 2, 16, generator=gen) for _ in range(3))
    for causal in (False, True):
        mini, lse_mini = tf.mini_attention(q, k, v, causal=causal)
        full, lse_full = tf.flash_attn_func(q, k, v, causal=causal, return_lse=True)
        assert torch.allclose(mini, full, atol=1e-6) and torch.allclose(lse_mini, lse_full, atol=1e-5)


@pytest.mark.parametrize("make,exc,word", [
    (lambda: tf.mini_attention(*_qkv(nk=9)), ValueError, "形状相同"),
    (lambda: tf.mini_attention(*_qkv(hk=1)), ValueError, "形状相同"),
    (lambda: tf.mini_attention(*_qkv(d=40)), ValueError, "head dim"),
    (lambda: tf.mini_attention(*_qkv(nq=0, nk=0)), ValueError, "N"),
    (lambda: tf.mini_attention(*_qkv(), causal="yes"), TypeError, "causal"),
    (lambda: tf.mini_attention(*_qkv(), softmax_scale=0), ValueError, "softmax_scale"),
])
def test_minimal_bad_inputs_raise(make, exc, word):
    with pytest.raises(exc, match=word):
        make()


# ---------------------------------------------------------------- 开关、检查函数、脚本入口
@pytest.mark.parametrize("flag", ["causal", "return_lse", "enable_profiling", "return_encoded_softmax",
                                  "deterministic"])
@pytest.mark.parametrize("value", ["yes", "False", 1, None])
def test_flags_must_be_bool(flag, value):
    """`causal='yes'` 以前被当成 True（字符串是真值）：每个开关只收 True / False。"""
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(TypeError, match=flag):
        tf.flash_attn_func(*_qkv(), **{flag: value})
    with pytest.raises(TypeError, match=flag):
        tf.flash_attn_varlen_func(*(t[0] for t in _qkv()), cu, cu, 8, 8, **{flag: value})


@pytest.mark.parametrize("bwd", tf.BWD_PATHS)
def test_poison_launch_finds_every_output_written(gen, bwd):
    """Launch(poison=True)：输出和梯度先填 NaN；结果和正常启动逐位相同，说明内核写满了每个元素。"""
    case = _case("poison", gen, batch=2, nq=23, nk=37, hq=4, hk=2, d=40, causal=True)
    plain = tf.run_ours(case, launch=tf.Launch(bwd=bwd))
    poisoned = tf.run_ours(case, launch=tf.Launch(poison=True, bwd=bwd))
    assert all(torch.equal(a, b) for a, b in zip(plain, poisoned))
    with pytest.raises(TypeError, match="launch"):
        tf.flash_attn_func(*_qkv(), launch={"poison": True})


def test_bwd_choice_is_checked():
    """Launch.bwd 只能是 "split" / "atomic"；原子 dQ 不能逐位复现，和 deterministic=True 一起传报错
    （两个名字都在消息里）。"""
    for bad in ("fast", "Split", True, None):
        with pytest.raises(ValueError, match="bwd"):
            tf.Launch(bwd=bad)
    assert tf.Launch().bwd == "split" == tf.BWD_PATHS[0]
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="deterministic=True.*bwd='atomic'"):
        tf.flash_attn_func(*_qkv(), deterministic=True, launch=ATOMIC)
    with pytest.raises(ValueError, match="deterministic=True.*bwd='atomic'"):
        tf.flash_attn_varlen_func(*(t[0] for t in _qkv()), cu, cu, 8, 8, deterministic=True, launch=ATOMIC)
    tf.flash_attn_func(*_qkv(), deterministic=False, launch=ATOMIC)          # 允许不可复现：可以


def test_check_cpu_prints_seed_and_replays(capsys):
    """check_cpu 打印种子；同一个种子造出同一组输入（失败可以复现）。"""
    tf.check_cpu("minimal", seed=12345, verbose=False)
    assert "种子 12345" in capsys.readouterr().out
    a = tf.cpu_cases(torch.Generator().manual_seed(7), "minimal")
    b = tf.cpu_cases(torch.Generator().manual_seed(7), "minimal")
    assert all(torch.equal(x["q"], y["q"]) and torch.equal(x["do"], y["do"]) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="kernel"):
        tf.check_cpu("fast")


def test_script_without_torch_skips():
    """没有 torch：当脚本运行打印一行 SKIP（说怎么安装）、退出码 77。"""
    code = ("import sys, runpy; sys.modules['torch'] = None\n"
            "runpy.run_path('lecture11/triton_flash.py', run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 77, out.stdout + out.stderr
    assert out.stdout.startswith("SKIP: 没有安装 torch") and "make setup" in out.stdout, out.stdout
    assert len(out.stdout.strip().splitlines()) == 1 and not out.stderr


def test_dense_cu_seqlens_cached():
    """等长 batch 的 cu_seqlens 每个 (B, N, 设备) 只建一次（热路径上不再每次 arange）；值是 [0, N, 2N, …]。"""
    a = tf._cu_dense(3, 7, torch.device("cpu"))
    assert a is tf._cu_dense(3, 7, torch.device("cpu"))
    assert a.tolist() == [0, 7, 14, 21] and a.dtype == torch.int32
    assert tf._cu_dense(3, 8, torch.device("cpu")).tolist() == [0, 8, 16, 24]


def test_plan_recorded_on_second_sighting(monkeypatch):
    """一个形状第二次出现才记 _Plan；缓存满了整体清空（形状一直在变时不无限增长）。"""
    monkeypatch.setattr(fast, "_SEEN", set())
    monkeypatch.setattr(fast, "_PLANS", {})
    monkeypatch.setattr(fast, "_MAX_PLANS", 3)
    assert not fast._should_record(None)
    assert not fast._should_record("a") and fast._should_record("a")
    fast._PLANS["a"] = False                      # 记过（哪怕失败）就不再记
    assert not fast._should_record("a")
    for key in "bcd":
        fast._should_record(key)
    assert len(fast._SEEN) <= 3 and "a" not in fast._PLANS


def test_no_fast_path_in_interpreter(gen):
    """解释器里没有编译好的内核：_plan_key 返回 None，调用照常走 Triton 的启动路径。"""
    q, k, v = (torch.randn(1, 12, 2, 16, generator=gen) for _ in range(3))
    opts = tf._check_dense(q, k, v, 0.0, None, True, None, None, (-1, -1), False, None, False, False, None)
    assert tf._plan_key(q, k, v, opts, 1, 12, 12) is None


GPU_FAST_PATH = """
import sys, torch; sys.path.insert(0, 'lecture11'); import triton_flash as tf
q, k, v = (torch.randn(2, 300, 8, 64, device='cuda', dtype=torch.bfloat16) for _ in range(3))
slow = tf.flash_attn_func(q, k, v, causal=True)
tf.flash_attn_func(q, k, v, causal=True)          # 第二次见到这个形状：记下 _Plan
n = tf._Plan.launches
fast = tf.flash_attn_func(q, k, v, causal=True)
assert tf._Plan.launches == n + 1, 'fast path not used'
assert torch.equal(slow, fast), (slow - fast).abs().max()
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="需要 CUDA GPU（快速路径只在编译好的内核上有）")
def test_gpu_fast_path_is_bitwise_equal():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", GPU_FAST_PATH], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="需要 CUDA GPU（bf16/fp16 真实尺寸的检查）")
@pytest.mark.parametrize("kernel", tf.KERNELS)
def test_gpu_checks(kernel):
    code = ("import sys; sys.path.insert(0, 'lecture11'); import triton_flash as tf; "
            f"tf.check_gpu({kernel!r}, verbose=False)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_lse_scratch_grows_and_is_shared(monkeypatch):
    """不要 lse 的快速路径共用一块 fp32 草稿区：够大就原样返回同一块，不够时至少长到两倍，超过上限返回 None。"""
    monkeypatch.setattr(tf, "_LSE_SCRATCH", {})
    monkeypatch.setattr(tf, "_LSE_RETIRED", [])
    cpu = torch.device("cpu")
    a = tf._lse_scratch(cpu, 10)
    assert a.dtype == torch.float32 and a.numel() >= 10
    assert tf._lse_scratch(cpu, a.numel()) is a
    b = tf._lse_scratch(cpu, a.numel() + 1)
    assert b is not a and b.numel() >= 2 * a.numel()
    assert tf._LSE_RETIRED == [a]                 # 换下来的那块留着：别的 stream 上的内核可能还在写它
    assert tf._lse_scratch(cpu, tf.LSE_SCRATCH_MAX).numel() == tf.LSE_SCRATCH_MAX
    assert tf._lse_scratch(cpu, tf.LSE_SCRATCH_MAX + 1) is None


def test_byte_range_matches_the_strided_formula(gen):
    """_byte_range 的连续张量捷径和一般公式（起点 + (1 + Σ (size − 1)·stride)·元素字节）一致；视图、切片、转置、
    空张量走一般公式。out 的别名检查（flash_decode）靠它。"""
    base = torch.randn(6, 5, 4, generator=gen)
    cases = [base, base[1:4], base[:, 2], base.transpose(0, 2), base[::2], base[2:2], base.reshape(-1)[3:17],
             torch.empty(0, 3), base[:, :, 1:2]]
    for t in cases:
        start = t.data_ptr()
        extent = 0 if t.numel() == 0 else 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
        assert fd._byte_range(t) == (start, start + extent * t.element_size()), (t.shape, t.stride())


def test_launch_hooks_active_sees_installed_hooks(monkeypatch):
    """快速路径只在没有启动钩子（proton 等 profiler）时走：装了钩子 → True，空的 HookChain、None → False。"""
    import triton

    class Chain:
        def __init__(self, calls):
            self.calls = calls

    rt = triton.knobs.runtime
    monkeypatch.setattr(rt, "launch_enter_hook", Chain([]))
    monkeypatch.setattr(rt, "launch_exit_hook", None)
    assert fast._launch_hooks_active() is False
    monkeypatch.setattr(rt, "launch_exit_hook", Chain([print]))
    assert fast._launch_hooks_active() is True
    monkeypatch.setattr(rt, "launch_exit_hook", Chain([]))
    monkeypatch.setattr(rt, "launch_enter_hook", print)           # 不是 HookChain 的钩子（旧接口）：按"有"处理
    assert fast._launch_hooks_active() is True


class _FakeLauncher:
    """Triton 3.6 的 CudaLauncher 的样子：C 写的 launch 挂在 .launch 上，草稿区大小、协作网格、PDL 是属性，
    __call__ 的参数是 (gridX, gridY, gridZ, stream, function, *args)。"""
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self, scratch=0):
        self.global_scratch_size, self.profile_scratch_size = scratch, 0
        self.calls = []
        self.launch = lambda *a: self.calls.append(("direct", a))

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        self.calls.append(("python", (gridX, gridY, gridZ, stream, function, *args)))


class _FakeLauncher39(_FakeLauncher):
    """Triton 3.9 的样子：__call__ 多了几个具名参数，.launch 是参数不同的通用 C 函数——不能直接调。"""

    def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata, launch_enter_hook,
                 launch_exit_hook, *args):
        self.calls.append(("python", (gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata,
                                      launch_enter_hook, launch_exit_hook, *args)))


@pytest.mark.parametrize("cls,scratch,way", [(_FakeLauncher, 0, "direct"), (_FakeLauncher, 256, "python"),
                                              (_FakeLauncher39, 0, "python")])
def test_plan_calls_the_c_launcher_directly_when_no_scratch(cls, scratch, way):
    """_Plan 在内核不要草稿区、启动器是 Triton 3.6 的样子时跳过 CudaLauncher 那层 Python，直接调 C 的 launch（参数按它
    的顺序补齐）；要草稿区、或是别的版本的启动器时照常经过 CudaLauncher。两种方式传给启动器的张量地址、标量一样。"""
    launcher = cls(scratch)
    plan = fast._Plan()
    plan.vals, plan.slots, plan.grid, plan.keep = [None, 7, None], [(0, 0), (2, 1)], (3, 2, 1), []
    plan.run, plan.function, plan.head = launcher, "fn", ("packed", None, None, None)
    plan._direct(launcher)
    q, k = torch.zeros(2), torch.zeros(3)
    plan.launch((q, k), "stream")
    plan.launch_ptrs((q.data_ptr(), k.data_ptr()), "stream")
    assert [c[0] for c in launcher.calls] == [way, way]
    a = launcher.calls[0][1]
    assert a == launcher.calls[1][1]
    assert a[:5] == (3, 2, 1, "stream", "fn") and a[-3:] == (q.data_ptr(), 7, k.data_ptr())
    extra = (False, True, None, None) if way == "direct" else ()
    assert a[5:-3] == extra + ("packed", None, None, None)


def test_direct_launch_gate_matches_the_installed_triton():
    """装着的 Triton 的 CudaLauncher：只有 __call__ 是 3.6 的参数时 _direct_launch_ok 才放行（3.9 的 .launch 是参数
    不同的通用 C 函数，直接调会在每次快速路径启动时报 TypeError）。不编译内核：只用这个类的签名和几个属性。"""
    driver = pytest.importorskip("triton.backends.nvidia.driver")
    launcher = object.__new__(driver.CudaLauncher)
    launcher.launch, launcher.global_scratch_size, launcher.profile_scratch_size = print, 0, 0
    launcher.launch_cooperative_grid, launcher.launch_pdl = False, False
    import triton
    assert fast._direct_launch_ok(launcher) == triton.__version__.startswith("3.6.")   # 只在验证过的 3.6 上放行
    launcher.global_scratch_size = 64                  # 要草稿区：无论哪个版本都不直接调
    assert not fast._direct_launch_ok(launcher)


def test_one_stride_set_per_layout(gen):
    """内核对 Q、O、dO、dQ 只收一组步长，对 K、V、dK、dV 也只收一组：参数表里没有第二组；入口的 _rows_layout
    让它成立——连续的输入原样用（同一块内存），不连续的拷成连续的，步长和新分配的输出、梯度相同。"""
    for kernel in (tf._fwd_kernel, tf._dkdv_kernel, tf._dq_kernel):
        strides = [n for n in kernel.arg_names if n.startswith("stride_")]
        assert strides[:5] == ["stride_qn", "stride_qh", "stride_kn", "stride_kh", "stride_lh"], strides
        assert len(strides) == 11, strides                   # 再加 bias 的 4 个、ALiBi 的 2 个
    x = torch.randn(2, 7, 3, 16, generator=gen)
    assert tf._rows_layout(x) is x
    for view in (x.transpose(1, 2), x[..., ::2], x[:, ::2]):
        y = tf._rows_layout(view)
        assert y.is_contiguous() and torch.equal(y, view) and y.stride() == torch.empty_like(y).stride()
