"""
坏输入：lecture11/gluon_flash.py 的每个公开入口（attention、attention_backward、best_variant、tile_config、
bwd_tile_config、persistent_grid、persistent_schedule、schedule_balance）和 gluon_kernels.py（没有公开名字）。

内核只在 Hopper 上跑，参数检查先于设备检查：这里全在 CPU 上。每个坏输入抛期望的异常，消息写出调用者传的参数名
（tests/bad_input_cases.py 的 check_case）；合法的 CPU 张量 → RuntimeError，写出张量名和要 Hopper GPU。
纯 Python 的合法输入照常算：持久内核的发块表每个 Q 块恰好一次（hypothesis 性质）、每个头维都有合法的块配置。
"""
import ast
import math
import os

import numpy as np
import pytest
import torch
from bad_input_cases import Case, check_case, params
from hypothesis import given, settings
from hypothesis import strategies as st
from labload import ROOT, load_lab

gf = load_lab("lecture11", "gluon_flash")
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
NAN, INF = math.nan, math.inf
HUGE = 10**9
NO_GPU = not torch.cuda.is_available()


def _t(*shape, dtype=BF16):
    return torch.zeros(*shape, dtype=dtype)


def _qkv(b=1, n=8, h=2, hk=2, d=64, dtype=BF16):
    return _t(b, n, h, d, dtype=dtype), _t(b, n, hk, d, dtype=dtype), _t(b, n, hk, d, dtype=dtype)


def _att(**over):
    q, k, v = _qkv()
    args = dict(q=q, k=k, v=v)
    args.update(over)
    return lambda: gf.attention(**args)


def _bwd(**over):
    q, k, v = _qkv()
    args = dict(q=q, k=k, v=v, out=torch.zeros_like(q), lse=_t(1, 2, 8, dtype=F32), do=torch.zeros_like(q))
    args.update(over)
    return lambda: gf.attention_backward(**args)


A, B = "attention", "attention_backward"
CASES = [
    # ---- attention：开关、选项 ----
    Case(f"{A} causal='no'", _att(causal="no"), TypeError, "causal"),
    Case(f"{A} causal=1", _att(causal=1), TypeError, "causal"),
    Case(f"{A} causal=None", _att(causal=None), TypeError, "causal"),
    Case(f"{A} return_lse=1", _att(return_lse=1), TypeError, "return_lse"),
    Case(f"{A} return_lse='yes'", _att(return_lse="yes"), TypeError, "return_lse"),
    Case(f"{A} return_lse=None", _att(return_lse=None), TypeError, "return_lse"),
    Case(f"{A} variant='fast'", _att(variant="fast"), ValueError, "variant"),
    Case(f"{A} variant='PERSIST'", _att(variant="PERSIST"), ValueError, "variant"),
    Case(f"{A} variant=3", _att(variant=3), ValueError, "variant"),
    Case(f"{A} variant=None", _att(variant=None), ValueError, "variant"),
    Case(f"{A} softmax_scale=-1", _att(softmax_scale=-1.0), ValueError, "softmax_scale"),
    Case(f"{A} softmax_scale=0", _att(softmax_scale=0.0), ValueError, "softmax_scale"),
    Case(f"{A} softmax_scale=nan", _att(softmax_scale=NAN), ValueError, "softmax_scale"),
    Case(f"{A} softmax_scale=inf", _att(softmax_scale=INF), ValueError, "softmax_scale"),
    Case(f"{A} softmax_scale='0.1'", _att(softmax_scale="0.1"), ValueError, "softmax_scale"),
    Case(f"{A} softmax_scale=True", _att(softmax_scale=True), ValueError, "softmax_scale"),
    # ---- attention：张量的类型、维数、dtype ----
    Case(f"{A} q list", _att(q=[[0.0]]), TypeError, "q"),
    Case(f"{A} q numpy", _att(q=np.zeros((1, 8, 2, 64), np.float16)), TypeError, "q"),
    Case(f"{A} k None", _att(k=None), TypeError, "k"),
    Case(f"{A} v float", _att(v=1.0), TypeError, "v"),
    Case(f"{A} q 3-D", _att(q=_t(8, 2, 64)), ValueError, "q"),
    Case(f"{A} k 5-D", _att(k=_t(1, 8, 2, 64, 1)), ValueError, "k"),
    Case(f"{A} v 2-D", _att(v=_t(8, 64)), ValueError, "v"),
    Case(f"{A} q float32", _att(q=_t(1, 8, 2, 64, dtype=F32)), TypeError, "q"),
    Case(f"{A} k float64", _att(k=_t(1, 8, 2, 64, dtype=torch.float64)), TypeError, "k"),
    Case(f"{A} v int32", _att(v=_t(1, 8, 2, 64, dtype=torch.int32)), TypeError, "v"),
    Case(f"{A} q bool", _att(q=_t(1, 8, 2, 64, dtype=torch.bool)), TypeError, "q"),
    Case(f"{A} k fp16 with q bf16", _att(k=_t(1, 8, 2, 64, dtype=F16), v=_t(1, 8, 2, 64, dtype=F16)),
         TypeError, "k"),
    Case(f"{A} v fp16 with q k bf16", _att(v=_t(1, 8, 2, 64, dtype=F16)), TypeError, "v"),
    Case(f"{A} q all fp32", lambda: gf.attention(*_qkv(dtype=F32)), TypeError, "q"),
    # ---- attention：形状 ----
    Case(f"{A} head dim 96", lambda: gf.attention(*_qkv(d=96)), ValueError, "q"),
    Case(f"{A} head dim 32", lambda: gf.attention(*_qkv(d=32)), ValueError, "q"),
    Case(f"{A} head dim 256", lambda: gf.attention(*_qkv(d=256)), ValueError, "q"),
    Case(f"{A} head dim 0", lambda: gf.attention(*_qkv(d=0)), ValueError, "q"),
    Case(f"{A} k head dim differs", _att(k=_t(1, 8, 2, 128), v=_t(1, 8, 2, 128)), ValueError, "k"),
    Case(f"{A} k N differs", _att(k=_t(1, 9, 2, 64), v=_t(1, 9, 2, 64)), ValueError, "k"),
    Case(f"{A} k B differs", _att(k=_t(2, 8, 2, 64), v=_t(2, 8, 2, 64)), ValueError, "k"),
    Case(f"{A} v shape differs from k", _att(v=_t(1, 8, 1, 64)), ValueError, "v"),
    Case(f"{A} GQA 3 / 2", lambda: gf.attention(*_qkv(h=3, hk=2)), ValueError, "k"),
    Case(f"{A} k zero heads", lambda: gf.attention(*_qkv(hk=0)), ValueError, "k"),
    Case(f"{A} q zero heads", lambda: gf.attention(*_qkv(h=0)), ValueError, "q"),
    Case(f"{A} N = 0", lambda: gf.attention(*_qkv(n=0)), ValueError, "q"),
    Case(f"{A} B = 0", lambda: gf.attention(*_qkv(b=0)), ValueError, "q"),
    # ---- attention：合法参数、CPU 张量 → 要 Hopper GPU（写出张量名）----
    Case(f"{A} CPU tensors", _att(), RuntimeError, "q"),
    Case(f"{A} CPU tensors causal", _att(causal=True, return_lse=True), RuntimeError, "q"),
    Case(f"{A} CPU tensors d128 GQA", lambda: gf.attention(*_qkv(h=4, hk=2, d=128)), RuntimeError, "q"),
    Case(f"{A} CPU tensors requires_grad",
         lambda: gf.attention(*(t.requires_grad_(True) for t in _qkv())), RuntimeError, "q"),
    # ---- attention_backward ----
    Case(f"{B} causal='yes'", _bwd(causal="yes"), TypeError, "causal"),
    Case(f"{B} causal=1", _bwd(causal=1), TypeError, "causal"),
    Case(f"{B} softmax_scale=-1", _bwd(softmax_scale=-1.0), ValueError, "softmax_scale"),
    Case(f"{B} softmax_scale=nan", _bwd(softmax_scale=NAN), ValueError, "softmax_scale"),
    Case(f"{B} softmax_scale='x'", _bwd(softmax_scale="x"), ValueError, "softmax_scale"),
    Case(f"{B} q list", _bwd(q=[[0.0]]), TypeError, "q"),
    Case(f"{B} q float32", _bwd(q=_t(1, 8, 2, 64, dtype=F32)), TypeError, "q"),
    Case(f"{B} k 3-D", _bwd(k=_t(8, 2, 64)), ValueError, "k"),
    Case(f"{B} v dtype differs", _bwd(v=_t(1, 8, 2, 64, dtype=F16)), TypeError, "v"),
    Case(f"{B} head dim 96", _bwd(**dict(zip("qkv", _qkv(d=96))), out=_t(1, 8, 2, 96), do=_t(1, 8, 2, 96)),
         ValueError, "q"),
    Case(f"{B} out None", _bwd(out=None), TypeError, "out"),
    Case(f"{B} out numpy", _bwd(out=np.zeros((1, 8, 2, 64))), TypeError, "out"),
    Case(f"{B} out shape", _bwd(out=_t(1, 8, 2, 32)), ValueError, "out"),
    Case(f"{B} out dtype", _bwd(out=_t(1, 8, 2, 64, dtype=F16)), TypeError, "out"),
    Case(f"{B} do list", _bwd(do=[[0.0]]), TypeError, "do"),
    Case(f"{B} do shape", _bwd(do=_t(1, 9, 2, 64)), ValueError, "do"),
    Case(f"{B} do dtype", _bwd(do=_t(1, 8, 2, 64, dtype=F32)), TypeError, "do"),
    Case(f"{B} lse None", _bwd(lse=None), TypeError, "lse"),
    Case(f"{B} lse bf16", _bwd(lse=_t(1, 2, 8)), ValueError, "lse"),
    Case(f"{B} lse [B, N, H]", _bwd(lse=_t(1, 8, 2, dtype=F32)), ValueError, "lse"),
    Case(f"{B} lse 2-D", _bwd(lse=_t(2, 8, dtype=F32)), ValueError, "lse"),
    Case(f"{B} N = 0", _bwd(**dict(zip("qkv", _qkv(n=0))), out=_t(1, 0, 2, 64), do=_t(1, 0, 2, 64),
                            lse=_t(1, 2, 0, dtype=F32)), ValueError, "q"),
    Case(f"{B} CPU tensors", _bwd(), RuntimeError, "q"),
    Case(f"{B} CPU tensors causal", _bwd(causal=True, softmax_scale=0.5), RuntimeError, "q"),
    # ---- best_variant ----
    Case("best_variant d=96", lambda: gf.best_variant(96, 1024), ValueError, "d"),
    Case("best_variant d='64'", lambda: gf.best_variant("64", 1024), ValueError, "d"),
    Case("best_variant d=None", lambda: gf.best_variant(None, 1024), ValueError, "d"),
    Case("best_variant n=0", lambda: gf.best_variant(64, 0), ValueError, "n"),
    Case("best_variant n=-1", lambda: gf.best_variant(64, -1), ValueError, "n"),
    Case("best_variant n=1.5", lambda: gf.best_variant(64, 1.5), TypeError, "n"),
    Case("best_variant n='1k'", lambda: gf.best_variant(64, "1k"), TypeError, "n"),
    Case("best_variant n=True", lambda: gf.best_variant(64, True), TypeError, "n"),
    # ---- tile_config ----
    Case("tile_config variant='fast'", lambda: gf.tile_config("fast", 64), ValueError, "variant"),
    Case("tile_config variant='best'", lambda: gf.tile_config("best", 64), ValueError, "variant"),
    Case("tile_config variant=None", lambda: gf.tile_config(None, 64), ValueError, "variant"),
    Case("tile_config variant=['ws']", lambda: gf.tile_config(["ws"], 64), ValueError, "variant"),
    Case("tile_config d=96", lambda: gf.tile_config("ws2", 96), ValueError, "d"),
    Case("tile_config d=0", lambda: gf.tile_config("pipelined", 0), ValueError, "d"),
    Case("tile_config d='128'", lambda: gf.tile_config("persist", "128"), ValueError, "d"),
    Case("tile_config d=True", lambda: gf.tile_config("ws", True), ValueError, "d"),
    # ---- bwd_tile_config ----
    Case("bwd_tile_config d=96", lambda: gf.bwd_tile_config(96), ValueError, "d"),
    Case("bwd_tile_config d=None", lambda: gf.bwd_tile_config(None), ValueError, "d"),
    Case("bwd_tile_config d='64'", lambda: gf.bwd_tile_config("64"), ValueError, "d"),
    Case("bwd_tile_config d=-64", lambda: gf.bwd_tile_config(-64), ValueError, "d"),
    # ---- persistent_grid ----
    Case("persistent_grid n_m=0", lambda: gf.persistent_grid(0, 4, 132), ValueError, "n_m"),
    Case("persistent_grid n_m=-3", lambda: gf.persistent_grid(-3, 4, 132), ValueError, "n_m"),
    Case("persistent_grid n_m=2.5", lambda: gf.persistent_grid(2.5, 4, 132), TypeError, "n_m"),
    Case("persistent_grid n_m='4'", lambda: gf.persistent_grid("4", 4, 132), TypeError, "n_m"),
    Case("persistent_grid bh=0", lambda: gf.persistent_grid(4, 0, 132), ValueError, "bh"),
    Case("persistent_grid bh=None", lambda: gf.persistent_grid(4, None, 132), TypeError, "bh"),
    Case("persistent_grid n_sm=0", lambda: gf.persistent_grid(4, 4, 0), ValueError, "n_sm"),
    Case("persistent_grid n_sm=True", lambda: gf.persistent_grid(4, 4, True), TypeError, "n_sm"),
    # ---- persistent_schedule（发块表的大小 = n_m·bh 项）----
    Case("persistent_schedule n_m=0", lambda: gf.persistent_schedule(0, 4, 132), ValueError, "n_m"),
    Case("persistent_schedule n_m=1.0", lambda: gf.persistent_schedule(1.0, 4, 132), TypeError, "n_m"),
    Case("persistent_schedule bh=-1", lambda: gf.persistent_schedule(4, -1, 132), ValueError, "bh"),
    Case("persistent_schedule bh='8'", lambda: gf.persistent_schedule(4, "8", 132), TypeError, "bh"),
    Case("persistent_schedule n_sm=0", lambda: gf.persistent_schedule(4, 4, 0), ValueError, "n_sm"),
    Case("persistent_schedule n_sm=None", lambda: gf.persistent_schedule(4, 4, None), TypeError, "n_sm"),
    Case("persistent_schedule huge n_m", lambda: gf.persistent_schedule(HUGE, HUGE, 132), ValueError, "n_m"),
    Case("persistent_schedule huge bh", lambda: gf.persistent_schedule(8, HUGE**2, 132), ValueError, "bh"),
    # ---- schedule_balance ----
    Case("schedule_balance n=0", lambda: gf.schedule_balance(0, 4, 132, False), ValueError, "n"),
    Case("schedule_balance n='1k'", lambda: gf.schedule_balance("1k", 4, 132, False), TypeError, "n"),
    Case("schedule_balance n=1024.0", lambda: gf.schedule_balance(1024.0, 4, 132, False), TypeError, "n"),
    Case("schedule_balance bh=0", lambda: gf.schedule_balance(1024, 0, 132, False), ValueError, "bh"),
    Case("schedule_balance bh=2.5", lambda: gf.schedule_balance(1024, 2.5, 132, False), TypeError, "bh"),
    Case("schedule_balance n_sm=0", lambda: gf.schedule_balance(1024, 4, 0, False), ValueError, "n_sm"),
    Case("schedule_balance n_sm='132'", lambda: gf.schedule_balance(1024, 4, "132", False), TypeError, "n_sm"),
    Case("schedule_balance causal='yes'", lambda: gf.schedule_balance(1024, 4, 132, "yes"), TypeError, "causal"),
    Case("schedule_balance causal=1", lambda: gf.schedule_balance(1024, 4, 132, 1), TypeError, "causal"),
    Case("schedule_balance causal=None", lambda: gf.schedule_balance(1024, 4, 132, None), TypeError, "causal"),
    Case("schedule_balance d=96", lambda: gf.schedule_balance(1024, 4, 132, False, d=96), ValueError, "d"),
    Case("schedule_balance d='64'", lambda: gf.schedule_balance(1024, 4, 132, False, d="64"), ValueError, "d"),
    Case("schedule_balance huge n", lambda: gf.schedule_balance(HUGE**2, 8, 132, True), ValueError, "n"),
    Case("schedule_balance huge bh", lambda: gf.schedule_balance(1024, HUGE**2, 132, True), ValueError, "bh"),
]


@params(CASES)
def test_bad_input(case):
    check_case(case)


@pytest.mark.skipif(not NO_GPU, reason="只在没有 GPU 的机器上查这条报错")
@pytest.mark.parametrize("fn", ["attention", "attention_backward"])
def test_cpu_tensors_say_hopper_gpu(fn):
    """合法的参数、CPU 上的张量：RuntimeError，说要 Hopper GPU（不是 Triton 深处的错）。"""
    call = _att() if fn == "attention" else _bwd()
    with pytest.raises(RuntimeError, match="Hopper") as info:
        call()
    assert str(info.value).startswith(fn), str(info.value)


def test_public_names():
    """公开的就是这几个（别处有用户的）；gluon_kernels.py 只有内核，全是 _ 开头。"""
    public = {n for n, obj in vars(gf).items() if callable(obj) and not n.startswith("_")
              and getattr(obj, "__module__", None) == gf.__name__}
    assert public == {"attention", "attention_backward", "best_variant", "bwd_tile_config", "tile_config",
                      "persistent_grid", "persistent_schedule", "schedule_balance"}, public
    with open(os.path.join(ROOT, "lecture11", "gluon_kernels.py"), encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    defs = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert defs and all(n.startswith("_") for n in defs), defs


@pytest.mark.parametrize("variant", gf.VARIANTS)
@pytest.mark.parametrize("d", gf.HEAD_DIMS)
def test_tile_config_valid(variant, d):
    bm, bn, stages, warps, maxnreg, regs = gf.tile_config(variant, d)
    f = gf.FLAGS[variant]
    assert bm in (64, 128) and bn in (64, 128) and warps == 4
    assert stages >= (2 if f["WS"] else 3)
    assert f["CONSUMERS"] * bm * d * 2 + stages * 2 * bn * d * 2 <= 227 * 1024
    assert (maxnreg is None) == (not f["WS"]) and len(regs) == (f["CONSUMERS"] if f["WS"] else 0)
    assert gf.tile_config(variant, np.int64(d)) == gf.tile_config(variant, d)
    assert gf.best_variant(d, 1) in gf.VARIANTS


@pytest.mark.parametrize("d", gf.HEAD_DIMS)
def test_bwd_tile_config_valid(d):
    bm, bn, cons, stages, warps, maxnreg, regs = gf.bwd_tile_config(d)
    assert cons == 2 and cons * bn == 128 and stages >= 2 and len(regs) == cons and maxnreg == 168
    assert bm % 64 == 0 and d % 2 == 0


@settings(deadline=None, max_examples=60)
@given(n_m=st.integers(1, 40), bh=st.integers(1, 40), n_sm=st.integers(1, 200))
def test_persistent_schedule_covers_every_tile_once(n_m, bh, n_sm):
    sched = gf.persistent_schedule(n_m, bh, n_sm)
    (g,), chunk = gf.persistent_grid(n_m, bh, n_sm)
    assert len(sched) == g == min(n_m * bh, n_sm) and 1 <= chunk <= bh
    tiles = [t for prog in sched for t in prog]
    assert sorted(tiles) == [(m, h) for m in range(n_m) for h in range(bh)]
    sizes = [len(p) for p in sched]
    assert max(sizes) - min(sizes) <= 1                       # 静态分配：每个程序的 Q 块数最多差 1


@settings(deadline=None, max_examples=30)
@given(n=st.integers(1, 5000), bh=st.integers(1, 20), n_sm=st.integers(1, 140), causal=st.booleans(),
       d=st.sampled_from(gf.HEAD_DIMS))
def test_schedule_balance_law(n, bh, n_sm, causal, d):
    most, mean = gf.schedule_balance(n, bh, n_sm, causal, d=d)
    block_m, block_n = gf.tile_config("persist", d)[:2]
    n_m = -(-n // (2 * block_m))
    full = n_m * bh * -(-n // block_n)                        # 不 causal 时每个 Q 块走满全部 K/V 块
    g = min(n_m * bh, n_sm)
    assert most >= mean > 0 and mean * g <= full + 1e-9
    if not causal:
        assert mean * g == pytest.approx(full)
