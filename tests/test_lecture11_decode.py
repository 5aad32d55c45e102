"""lecture11/triton_flash.py 的 v3 flash_decode（split-KV）测试：Triton 解释器（CPU，fp32 / fp16，小尺寸）
对照 float64 参考 reference_decode 和 torch 的 F.scaled_dot_product_attention（只取有效前缀）。

解释器的打开方式见 tests/triton_interp.py（和 test_lecture11_triton.py 共用）。
缓存里有效前缀之外填 NaN：内核读到一个就会让结果变成 NaN。
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from triton_interp import load_triton_flash

tf = load_triton_flash()
pytestmark = pytest.mark.usefixtures("triton_interpret")   # 每个测试运行期间打开解释器（conftest.py）

F32, F16 = torch.float32, torch.float16
TOL = tf.CPU_TOL


def _check(case, splits, dtype):
    """ours 对 float64 参考：fp32 < TOL；fp16 ≤ 2 × 同 dtype SDPA 的误差。fp32 时再和 SDPA（fp32）直接比。"""
    q, k, v, lens = case
    ref = tf.reference_decode(q, k, v, lens)
    ours = tf.flash_decode(q, k, v, lens, num_splits=splits)
    assert ours.shape == q.shape and ours.dtype == q.dtype
    err = tf._rel_err(ours, ref)
    sdpa_err = tf._rel_err(tf.sdpa_decode(q, k, v, lens), ref)
    print(f"err {err:.2e}  sdpa {sdpa_err:.2e}")
    if dtype == F32:
        assert err < TOL
        assert tf._rel_err(ours, tf.sdpa_decode(q, k, v, lens).double()) < TOL
    else:
        assert err <= 2 * sdpa_err + 1e-6
    return ours


# (lengths, S_max, Hq, Hk, d, n)：不规则的 B，长度含 1（n = 1 时）、n（n = 3 时）和 S_max
SHAPES = [
    ([1, 37, 50], 50, 2, 2, 32, 1),          # GQA 1
    ([29, 64], 64, 4, 2, 64, 1),             # GQA 2
    ([45], 45, 8, 2, 16, 1),                 # GQA 4，B = 1
    ([3, 33, 17, 40], 40, 4, 1, 16, 3),      # n = 3、GQA 4（MQA），长度 = n
    ([19, 3], 27, 2, 2, 128, 3),             # n = 3、GQA 1、d = 128
    ([8, 30], 30, 4, 2, 32, 3),              # n = 3、GQA 2
    ([20, 33], 40, 8, 1, 16, 3),             # n = 3、GQA 8：24 行 > 16，合并走不展开的循环
]


@pytest.mark.parametrize("splits", [1, 3, None, 16], ids=["1split", "3splits", "auto", "16splits"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"L{s[0]}-R{s[2] // s[3]}-n{s[5]}" for s in SHAPES])
def test_matches_references_fp32(gen, shape, splits):
    lengths, s_max, hq, hk, d, n = shape
    _check(tf.make_decode_case(gen, len(lengths), lengths, s_max, hq, hk, d, n, F32), splits, F32)


@pytest.mark.parametrize("shape", SHAPES[1::2], ids=[f"L{s[0]}-R{s[2] // s[3]}-n{s[5]}" for s in SHAPES[1::2]])
@pytest.mark.parametrize("splits", [1, 5])
def test_matches_references_fp16(gen, shape, splits):
    lengths, s_max, hq, hk, d, n = shape
    _check(tf.make_decode_case(gen, len(lengths), lengths, s_max, hq, hk, d, n, F16), splits, F16)


@settings(max_examples=12, deadline=None)
@given(lengths=st.lists(st.integers(3, 70), min_size=1, max_size=3), group=st.sampled_from([1, 2, 4]),
       n=st.sampled_from([1, 2, 3]), splits=st.integers(1, 12), seed=st.integers(0, 2**31 - 1))
def test_splitting_does_not_change_the_result(lengths, group, n, splits, seed):
    """LSE 合并是精确的：任意段数（含多于块数、空段）和 1 段的结果相同，也都等于 float64 参考。"""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, lens = tf.make_decode_case(gen, len(lengths), lengths, max(lengths) + 2, 2 * group, 2, 16, n, F32)
    one = tf.flash_decode(q, k, v, lens, num_splits=1)
    many = tf.flash_decode(q, k, v, lens, num_splits=splits)
    assert tf._rel_err(many, one.double()) < TOL
    assert tf._rel_err(many, tf.reference_decode(q, k, v, lens)) < TOL


def test_n_tokens_equal_n_single_token_steps(gen):
    """n 个新 token 一起算 = 一个一个地 decode（第 i 个只看到 L − n + i + 1 个 key）：causal、右下角对齐。"""
    lengths, n = [5, 31, 18], 3
    q, k, v, lens = tf.make_decode_case(gen, 3, lengths, 31, 4, 2, 32, n, F32)
    together = tf.flash_decode(q, k, v, lens, num_splits=2)                 # [B, n, Hq, d]
    for i in range(n):
        step_lens = lens - (n - 1 - i)
        alone = tf.flash_decode(q[:, i].contiguous(), k, v, step_lens, num_splits=2)
        assert tf._rel_err(together[:, i], alone.double()) < TOL


def test_softmax_scale_and_strided_inputs(gen):
    """自定义 softmax_scale；q 和缓存是更大张量的切片（只有最后一维连续）。"""
    q, k, v, lens = tf.make_decode_case(gen, 2, [13, 26], 26, 4, 1, 32, 1, F32)
    big_k = torch.randn(2, 30, 3, 32, generator=gen)
    big_k[:, :26, 1] = k[:, :, 0]
    ks = big_k[:, :26, 1:2]                                        # [B, 26, 1, d]，步长不是连续张量的步长
    ref = tf.reference_decode(q, ks, v, lens, softmax_scale=0.3)
    assert tf._rel_err(tf.flash_decode(q, ks, v, lens, num_splits=3, softmax_scale=0.3), ref) < TOL


def test_lengths_beyond_cache_are_clamped_by_the_kernel(gen, monkeypatch):
    """GPU 上不检查 L > S_max（要同步）：内核把长度截到 S_max。跳过主机端检查，直接看内核的行为。"""
    q, k, v, lens = tf.make_decode_case(gen, 2, [20, 20], 20, 2, 1, 16, 1, F32)
    check = tf._check_decode
    monkeypatch.setattr(tf, "_check_decode", lambda q_, *a, **kw: (True, 1 / math.sqrt(16), 4))
    too_long = torch.tensor([20 + 9, 10**6], dtype=torch.int32)
    ours = tf.flash_decode(q, k, v, too_long)
    monkeypatch.setattr(tf, "_check_decode", check)
    assert tf._rel_err(ours, tf.reference_decode(q, k, v, lens)) < TOL


def _wave_efficiency(programs, n_sm=132):
    return programs / (math.ceil(programs / n_sm) * n_sm)


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 300), hk=st.integers(1, 16), S=st.integers(1, 300_000), block_n=st.sampled_from([16, 64, 128]))
def test_decode_splits_fill_waves(B, hk, S, block_n):
    """段数 s：每段至少一个块；波效率不比最好的差 5% 以上；比 s 少的段数都达不到这个标准。"""
    s = tf.decode_splits(B, hk, S, n_sm=132, block_n=block_n)
    cap = max(1, min(tf.MAX_SPLITS, S // block_n))
    assert 1 <= s <= cap
    best = max(_wave_efficiency(B * hk * c) for c in range(1, cap + 1))
    assert _wave_efficiency(B * hk * s) >= 0.95 * best
    assert all(_wave_efficiency(B * hk * c) < 0.95 * best for c in range(1, s))


def test_decode_splits_measured_optimum():
    """H200 上实测最快的段数（results/decode_bench.json 的 sweep）：Hk = 8、BLOCK_N = 128 时 B = 1 / 8 / 64
    → 16 / 2 / 1。"""
    assert [tf.decode_splits(B, 8, 32768, block_n=128) for B in (1, 8, 64)] == [16, 2, 1]
    assert tf.decode_splits(1, 8, 1024, block_n=128) == 8                        # 短缓存：每段至少一个块
    for bad in [dict(B=0, Hk=1, S=1), dict(B=1, Hk=1, S=0), dict(B=1, Hk=1, S=8, n_sm=0)]:
        with pytest.raises(ValueError):
            tf.decode_splits(**bad)


def _good(gen):
    return tf.make_decode_case(gen, 2, [5, 9], 12, 4, 2, 16, 1, F32)


@pytest.mark.parametrize("mutate,exc,word", [
    (lambda q, k, v, L: (q.double(), k, v, L), TypeError, "q.dtype"),
    (lambda q, k, v, L: (q, k.half(), v, L), TypeError, "dtype"),
    (lambda q, k, v, L: (q.numpy(), k, v, L), TypeError, "q"),
    (lambda q, k, v, L: (q[0], k, v, L), ValueError, "q"),
    (lambda q, k, v, L: (q, k, v[:, :5], L), ValueError, "v_cache"),
    (lambda q, k, v, L: (q[:, :3], k, v, L), ValueError, "Hq"),
    (lambda q, k, v, L: (q[1:], k, v, L[1:]), ValueError, "batch"),
    (lambda q, k, v, L: (q[..., :8], k[..., :8], v[..., :8], L), ValueError, "head dim"),
    (lambda q, k, v, L: (q, k, v, L.long()), TypeError, "cache_seqlens"),
    (lambda q, k, v, L: (q, k, v, [5, 9]), TypeError, "cache_seqlens"),
    (lambda q, k, v, L: (q, k, v, L[:1]), ValueError, "cache_seqlens"),
    (lambda q, k, v, L: (q, k, v, L + 4), ValueError, "cache_seqlens"),      # 9 + 4 > S_max = 12
    (lambda q, k, v, L: (q, k, v, L * 0), ValueError, "cache_seqlens"),      # 长度 0 < n = 1
    (lambda q, k, v, L: (q.unsqueeze(1).expand(2, 6, 4, 16), k, v, L), ValueError, "cache_seqlens"),  # 5 < n = 6
    (lambda q, k, v, L: (torch.zeros(2, 33, 4, 16), torch.zeros(2, 40, 1, 16), torch.zeros(2, 40, 1, 16),
                         L + 30), ValueError, "Hq/Hk"),                    # 4 × 33 行 > MAX_DECODE_ROWS
])
def test_bad_inputs(gen, mutate, exc, word):
    args = mutate(*_good(gen))
    with pytest.raises(exc, match=word):
        tf.flash_decode(*args)


@pytest.mark.parametrize("kw,exc,word", [
    (dict(num_splits=0), ValueError, "num_splits"),
    (dict(num_splits=2.5), ValueError, "num_splits"),
    (dict(num_splits=tf.MAX_SPLITS + 1), ValueError, "num_splits"),
    (dict(softmax_scale=0), ValueError, "softmax_scale"),
    (dict(softmax_scale=float("nan")), ValueError, "softmax_scale"),
])
def test_bad_options(gen, kw, exc, word):
    with pytest.raises(exc, match=word):
        tf.flash_decode(*_good(gen), **kw)


def test_bf16_rejected_in_interpreter(gen):
    q, k, v, lens = _good(gen)
    with pytest.raises(TypeError, match="bfloat16"):
        tf.flash_decode(q.bfloat16(), k.bfloat16(), v.bfloat16(), lens)



def test_scratch_grows_in_both_buffers(gen):
    """草稿区按行数和 d 两个量增长：先用大 d、少行，再用小 d、多行，lse 区也必须够长（曾经只查了 o 区）。"""
    tf._Scratch._cache.clear()
    big_d = tf.make_decode_case(gen, 1, [40], 40, 2, 2, 128, 1, F32)
    tf.flash_decode(*big_d, num_splits=2)
    many_rows = tf.make_decode_case(gen, 4, [33, 40, 12, 25], 40, 8, 2, 16, 3, F32)
    ours = tf.flash_decode(*many_rows, num_splits=3)
    o_part, lse_part = next(iter(tf._Scratch._cache.values()))
    rows = 4 * 2 * 3 * (8 // 2) * 3
    assert lse_part.numel() >= rows and o_part.numel() >= rows * 16
    assert tf._rel_err(ours, tf.reference_decode(*many_rows)) < TOL


def test_out_argument(gen):
    """out=：结果写进给定的张量并返回它本身；步长不连续的 out（最后一维连续）也行。"""
    q, k, v, lens = tf.make_decode_case(gen, 3, [40, 7, 33], 41, 8, 2, 32, 2, F32)
    ref = tf.reference_decode(q, k, v, lens)
    out = torch.full_like(q, float("nan"))
    assert tf.flash_decode(q, k, v, lens, num_splits=3, out=out) is out
    assert tf._rel_err(out, ref) < TOL
    wide = torch.full((3, 2, 8, 48), float("nan"))[..., :32]                 # [B, n, Hq, d] 的一个切片视图
    tf.flash_decode(q, k, v, lens, out=wide)
    assert tf._rel_err(wide, ref) < TOL


@pytest.mark.parametrize("bad,exc", [
    (lambda q: q.double(), TypeError), (lambda q: q[:1], ValueError), (lambda q: q.transpose(1, 2), ValueError),
    (lambda q: q, ValueError), ("nope", TypeError)])
def test_bad_out(gen, bad, exc):
    q, k, v, lens = _good(gen)
    out = bad if isinstance(bad, str) else bad(q.clone() if bad(q) is not q else q)
    with pytest.raises(exc, match="out"):
        tf.flash_decode(q, k, v, lens, out=out)


@pytest.mark.parametrize("B,S,given", [(1, 32768, None), (8, 1024, None), (64, 8192, None), (2, 4096, 7)])
def test_decode_plan(B, S, given):
    """配置和段数的规则只有一份（decode_plan）：段数和配置的块大小对得上，给了 num_splits 就用它。"""
    config, splits = tf.decode_plan(B, 8, S, 132, given)
    assert config in (tf.DECODE_CONFIG, tf.DECODE_CONFIG_SHORT)
    assert splits == (given or tf.decode_splits(B, 8, S, 132, config[0]))


def test_bad_pdl_option(gen):
    """PDL 的开关只收 True / False / 'merge'；解释器（和 Hopper 之前的 GPU）上开了也只是不用，结果不变。"""
    q, k, v, lens = tf.make_decode_case(gen, 2, [5, 9], 12, 4, 2, 16, 1, F32)
    with pytest.raises(ValueError, match="pdl"):
        tf._decode(q, k, v, lens, 3, None, None, pdl="both")
    assert tf._pdl_modes(q.device, True) == (dict(PDL=False), dict(PDL=False))
    on = tf._decode(q, k, v, lens, 3, None, None, pdl=True)
    assert tf._rel_err(on, tf.reference_decode(q, k, v, lens)) < TOL


@pytest.mark.parametrize("length,splits,block", [(37, 5, 4), (4096, 33, 64), (100, 7, 16), (3, 8, 16)])
def test_splits_share_blocks_evenly(length, splits, block):
    """内核的段边界（⌈L / BLOCK_N⌉ 个块平均分）：各段首尾相接、盖住 [0, L)，相邻两段最多差一个块。"""
    n_blocks = -(-length // block)
    bounds = [(s * n_blocks // splits * block, min((s + 1) * n_blocks // splits * block, length))
              for s in range(splits)]
    assert bounds[0][0] == 0 and bounds[-1][1] == length
    assert all(a[1] == b[0] or a[1] == length for a, b in zip(bounds, bounds[1:]))
    sizes = [-(-(hi - lo) // block) for lo, hi in bounds if hi > lo]
    assert max(sizes) - min(sizes) <= 1
