"""
分数溢出：q、k 都有限，q·kᵀ·scale 却超出计算用的 dtype 的范围。课程的约定（每条注意力路径一样）：

  · 可见的分数成了 +∞ 或 NaN，或者一行看得见 key、可见的分数却全成了 −∞ = 溢出。主机上的参考 / 教学实现
    （lecture11 的 numpy：naive、standard、fa1 / fa2 前向与反向、split-KV；lecture18 的 torch：vanilla、SDPA、
    分块前向 / 重算反向 / autograd、K/V 切给多块设备、flash_attention 在 CPU 上的退路）报 ValueError，消息说
    "注意力分数溢出"、点名 Q / K；Triton 内核（解释器里跑）不能不同步主机就报错：那些行的 O、LSE（和 dQ）是 NaN；
  · 溢出成 −∞ 的分数旁边还有有限的分数：权重正好是 0（exp(−∞ − m) = 0 就是精确答案），每条路径 = float64 参考；
  · 被掩码（看不见）的位置不是分数：那里乘出来溢出不算；整行没有可见 key 的行照旧 O = 0、LSE = −∞。
大但不溢出的输入仍然和 float64 参考一致（max-abs 和相对误差）。numpy / torch 部分几秒；解释器部分 < 1 分钟。
"""

import numpy as np
import pytest
import torch
from labload import load_lab

fl11 = load_lab("lecture11", "flash_lab")
fl18 = load_lab("lecture18", "flash_lab")
SEED = 20261204
print(f"test_attention_overflow 的随机种子 {SEED}")
RNG = np.random.default_rng(SEED)


def _rel(x, ref):
    return np.abs(x - ref).max() / max(np.abs(ref).max(), 1e-300)


# ================================================================================================ lecture11（numpy）
N, NK, D, DV = 7, 9, 5, 3
Q0, K0, V0, dO0 = (RNG.standard_normal(s) for s in ((N, D), (NK, D), (NK, DV), (N, DV)))
BIG = 1e160                                    # Q·BIG 和 K·BIG 都有限；它们的点积 ~1e320 超出 float64


def _numpy_paths(Q, K, V, causal=False, scale=None):
    """lecture11 的每条 numpy 注意力路径：名字 → 调用。"""
    L = np.zeros(Q.shape[0])
    O = np.zeros((Q.shape[0], V.shape[1]))
    P = np.zeros((Q.shape[0], K.shape[0]))
    return {
        "naive_attention": lambda: fl11.naive_attention(Q, K, V, causal, scale),
        "reference_lse": lambda: fl11.reference_lse(Q, K, causal, scale),
        "standard_attention": lambda: fl11.standard_attention(Q, K, V, causal, scale),
        "flash_fwd fa2": lambda: fl11.flash_fwd(Q, K, V, 3, 4, causal, scale),
        "flash_fwd fa1": lambda: fl11.flash_fwd(Q, K, V, 3, 4, causal, scale, order="fa1"),
        "flash_bwd": lambda: fl11.flash_bwd(Q, K, V, O, np.ones_like(O), L, 3, 4, causal, scale),
        "split_kv_decode": lambda: fl11.split_kv_decode(Q, K, V, 3, scale),
        "standard_attention_bwd": lambda: fl11.standard_attention_bwd(Q, K, V, P, O, scale),
    }


OVERFLOWING = [("Q·1e160, K·1e160", Q0 * BIG, K0 * BIG, None), ("scale=1e300", Q0 * 1e10, K0 * 1e10, 1e300),
               ("one row, one key", np.vstack([Q0[:3], np.full((1, D), BIG), Q0[4:]]),
                np.vstack([K0[:1], np.full((1, D), BIG), K0[2:]]), None)]


@pytest.mark.parametrize("label, Q, K, scale", OVERFLOWING, ids=[o[0] for o in OVERFLOWING])
@pytest.mark.parametrize("path", [p for p in _numpy_paths(Q0, K0, V0) if p != "standard_attention_bwd"])
def test_numpy_overflow_raises(path, label, Q, K, scale):
    with pytest.raises(ValueError, match="注意力分数溢出") as info:
        _numpy_paths(Q, K, V0, scale=scale)[path]()
    assert "Q" in str(info.value) and "K" in str(info.value)


def test_numpy_standard_bwd_takes_p_not_scores():
    """standard_attention_bwd 不算分数（用前向存下的 P）：Q、K 很大也照常算（只乘 P）。"""
    fl11.standard_attention_bwd(Q0 * BIG, K0 * BIG, V0, np.zeros((N, NK)), dO0)


@pytest.mark.parametrize("path", [p for p in _numpy_paths(Q0, K0, V0)
                                  if p not in ("split_kv_decode", "standard_attention_bwd")])
def test_numpy_overflow_only_in_masked_positions_is_not_an_error(path):
    """causal：第 0 行 query 很大、最后一个 key 很大，它们的乘积溢出，但第 0 行看不见最后一个 key（N = Nk）。"""
    Q, K = Q0[:6].copy(), K0[:6].copy()
    Q[0], K[5] = BIG, BIG
    Q[0] /= np.sqrt(D) * 1e10                                  # 第 0 行对其他 key：~1e150，有限
    _numpy_paths(Q, K, V0[:6], causal=True)[path]()


def test_numpy_masked_overflow_matches_reference():
    Q, K = Q0[:6].copy(), K0[:6].copy()
    Q[0], K[5] = BIG / 1e10, BIG
    O_ref, L_ref = fl11.naive_attention(Q, K, V0[:6], True)
    for order in fl11.ORDERS:
        O, L, _ = fl11.flash_fwd(Q, K, V0[:6], 2, 4, True, order=order)
        assert np.abs(O - O_ref).max() < 1e-12 and _rel(L, L_ref) < 1e-12


def test_numpy_large_but_safe_matches_reference():
    """Q·1e100、K·1e100：分数 ~1e200，在 float64 里有限。每条路径都 = 逐行按定义的 naive（max-abs 和相对误差）。"""
    Q, K = Q0 * 1e100, K0 * 1e100
    for causal in (False, True):
        O_ref, L_ref = fl11.naive_attention(Q, K, V0, causal)
        assert np.isfinite(O_ref).all() and np.isfinite(L_ref).all()
        outs = [fl11.standard_attention(Q, K, V0, causal)[0]]
        for order in fl11.ORDERS:
            O, L, _ = fl11.flash_fwd(Q, K, V0, 3, 4, causal, order=order)
            outs.append(O)
            assert _rel(L, L_ref) < 1e-14
        for O in outs:
            assert np.abs(O - O_ref).max() < 1e-12 and _rel(O, O_ref) < 1e-12
    o, lse, _ = fl11.split_kv_decode(Q, K, V0, 4)
    O_ref, L_ref = fl11.naive_attention(Q, K, V0)
    assert np.abs(o - O_ref).max() < 1e-12 and _rel(lse, L_ref) < 1e-14
    x = RNG.standard_normal((3, 40)) * 1e300                   # 在线 softmax：减去最大值，1e300 的分数也不溢出
    assert np.abs(fl11.softmax_online(x, block=7)[0] - fl11.softmax_3pass(x)[0]).max() < 1e-15


def test_numpy_rows_without_keys_keep_convention():
    """causal 且 N > Nk：前 N − Nk 行没有可见 key，O = 0、L = −∞、dQ = 0；分数很大（但有限）也一样。"""
    Q, K, V = Q0 * 1e100, K0[:4] * 1e100, V0[:4]
    for order in fl11.ORDERS:
        O, L, _ = fl11.flash_fwd(Q, K, V, 2, 3, True, order=order)
        assert (O[:3] == 0).all() and np.isneginf(L[:3]).all() and np.isfinite(L[3:]).all()
    dQ = fl11.flash_bwd(Q, K, V, O, dO0, L, 2, 3, True)[0]
    assert (dQ[:3] == 0).all()


def _neg_case(rows=(2,), keys=(3,)):
    """第 0 列只留 Q[rows, 0] = 1e160、K[keys, 0] = −1e160：这些 (q, k) 的分数 −1e320 溢出成 −∞，别的分数量级 1。"""
    Q, K = Q0.copy(), K0.copy()
    Q[:, 0], K[:, 0] = 0.0, 0.0
    Q[list(rows), 0], K[list(keys), 0] = BIG, -BIG
    return Q, K


def _exact(Q, K, V, dO, causal, neg):
    """float64 的独立参考（按定义）：分数用第 1 列起算（第 0 列只在 neg 的位置非零），neg 的位置是 −∞，权重 0。
    返回 O、L 和按公式的 dQ、dK、dV（dS 在 −∞ 的位置是 0：k₃ 的第 0 列再大也乘 0）。"""
    S = (Q[:, 1:] @ K[:, 1:].T) / np.sqrt(D)
    S[neg] = -np.inf
    if causal:
        S = np.where(np.arange(len(K))[None] <= len(K) - len(Q) + np.arange(len(Q))[:, None], S, -np.inf)
    m = S.max(axis=1, keepdims=True)
    P = np.exp(S - m) / np.exp(S - m).sum(axis=1, keepdims=True)
    dP = dO @ V.T
    dS = P * (dP - (P * dP).sum(axis=1, keepdims=True))
    return P @ V, m[:, 0] + np.log(np.exp(S - m).sum(axis=1)), dS @ K / np.sqrt(D), dS.T @ Q / np.sqrt(D), P.T @ dO


def _close(got, ref, tol=1e-12):
    """max-abs 和相对误差，逐列（dQ、dK 的第 0 列 ~1e160，别的列 ~1：按列各自的量级比）。"""
    scale = np.maximum(np.abs(ref).max(axis=0), 1e-300)
    assert np.isfinite(got).all() and (np.abs(got - ref) / scale).max() < tol, np.abs(got - ref).max()


@pytest.mark.parametrize("causal", [False, True])
def test_numpy_negative_overflow_among_finite_is_exact(causal):
    """q₂·k₃ 溢出成 −∞，第 2 行别的分数有限：每条 numpy 路径给出精确的行（权重 0），不报错。"""
    Q, K = _neg_case()
    O_ref, L_ref, *g_ref = _exact(Q, K, V0, dO0, causal, (2, 3))
    O, L = fl11.naive_attention(Q, K, V0, causal)
    outs = [O, fl11.standard_attention(Q, K, V0, causal)[0]]
    for L_got in (L, fl11.reference_lse(Q, K, causal)):
        _close(L_got[:, None], L_ref[:, None])
    for order in fl11.ORDERS:
        O, L, _ = fl11.flash_fwd(Q, K, V0, 3, 4, causal, order=order)
        outs.append(O)
        _close(L[:, None], L_ref[:, None])
    if not causal:
        o, lse, _ = fl11.split_kv_decode(Q, K, V0, 3)           # 第 3 个 key 单独一段时那一段对第 2 行是空的
        outs.append(o)
        _close(lse[:, None], L_ref[:, None])
        o, lse, _ = fl11.split_kv_decode(Q, K, V0, NK)
        outs.append(o)
        _close(lse[:, None], L_ref[:, None])
    for got in outs:
        _close(got, O_ref)
    for got, ref in zip(fl11.flash_bwd(Q, K, V0, O, dO0, L, 3, 4, causal)[:3], g_ref):
        _close(got, ref, 1e-10)


@pytest.mark.parametrize("path, causal", [(p, c) for p in _numpy_paths(Q0, K0, V0) for c in (False, True)
                                          if p != "standard_attention_bwd" and not (c and p == "split_kv_decode")])
def test_numpy_row_all_negative_overflow_raises(path, causal):
    """一行看得见 key、可见的分数却全溢出成 −∞：这是溢出，不是"没有可见 key"——报错，点名那一行。
    causal（N = Nk）：第 0 行只看得见第 0 个 key；非 causal：第 2 行对所有 key 都是 −∞
    （split_kv_decode 没有 causal）。"""
    Q, K = _neg_case((0,), (0,)) if causal else _neg_case((2,), range(NK))
    n = 6 if causal else N
    with pytest.raises(ValueError, match="注意力分数溢出") as info:
        _numpy_paths(Q[:n], K[:n] if causal else K, V0[:n] if causal else V0, causal)[path]()
    assert "−∞" in str(info.value) and ("[0]" if causal else "[2]") in str(info.value)


def test_numpy_rows_without_keys_not_mistaken_for_overflow():
    """causal 且 N > Nk：没有可见 key 的前 N − Nk 行照旧 (0, −∞)；
    第 N − Nk 行只看得见第 0 个 key，它溢出成 −∞ → 报错。"""
    Q, K = _neg_case((3,), (0,))
    Q[:3, 0] = BIG                                             # 前 3 行没有可见 key：它们对 k₀ 的分数也溢出，但不算
    for order in fl11.ORDERS:
        with pytest.raises(ValueError, match=r"注意力分数溢出.*\[3\]"):
            fl11.flash_fwd(Q, K[:4], V0[:4], 2, 3, True, order=order)
    O, L, _ = fl11.flash_fwd(Q[:3], K[1:4], V0[1:4], 2, 3, True)   # 去掉第 0 个 key：N = Nk = 3 照常
    assert np.isfinite(L).all()


# ================================================================================================ lecture18（torch）
def _t(a, dtype):
    return torch.tensor(a, dtype=dtype)[None]                 # [1, N, d]


def _torch_paths(q, k, v, causal=False, scale=None):
    O, lse = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype), torch.zeros(q.shape[:-1], dtype=q.dtype)
    return {
        "vanilla_attention": lambda: fl18.vanilla_attention(q, k, v, causal, scale),
        "sdpa_attention": lambda: fl18.sdpa_attention(q, k, v, causal, scale),
        "blockwise_attention_fwd": lambda: fl18.blockwise_attention_fwd(q, k, v, 3, 4, causal, scale),
        "blockwise_attention_bwd": lambda: fl18.blockwise_attention_bwd(q, k, v, O, lse, O, 3, 4, causal, scale),
        "blockwise_attention": lambda: fl18.blockwise_attention(q, k, v, 3, 4, causal, scale),
        "flash_attention (CPU)": lambda: fl18.flash_attention(q, k, v, causal, scale),
        "kv_split_states": lambda: fl18.kv_split_states(q, k, v, 3, causal, scale),
    }


TORCH_OVERFLOWING = [(torch.float64, BIG), (torch.float32, 1e20), (torch.float16, 300.0), (torch.bfloat16, 1e20)]


@pytest.mark.parametrize("dtype, big", TORCH_OVERFLOWING, ids=[str(t[0]) for t in TORCH_OVERFLOWING])
@pytest.mark.parametrize("path", list(_torch_paths(*(torch.zeros(1, 1, 1),) * 3)))
@pytest.mark.parametrize("causal", [False, True])
def test_torch_overflow_raises(path, dtype, big, causal):
    q, k, v = _t(Q0 * big, dtype), _t(K0 * big, dtype), _t(V0, dtype)
    assert torch.isfinite(q).all() and torch.isfinite(k).all()
    with pytest.raises(ValueError, match="注意力分数溢出") as info:
        _torch_paths(q, k, v, causal)[path]()
    assert "q" in str(info.value) and "k" in str(info.value)


@pytest.mark.parametrize("mode", fl18.MODES)
def test_torch_layer_overflow_raises(mode):
    """一层 Transformer（fp16）：x 很大，q·kᵀ 在 fp16 里溢出——三种算法都报错，不给 NaN。"""
    layer = fl18.TransformerLayer(8, 2, seed=1, dtype=torch.float16)
    x = torch.full((1, 6, 8), 300.0, dtype=torch.float16)     # q、k ~500：q·kᵀ ~1e5 > 65504
    with pytest.raises(ValueError, match="注意力分数溢出"):
        layer(x, mode, 4, True)


@pytest.mark.parametrize("path", [p for p in _torch_paths(*(torch.zeros(1, 1, 1),) * 3)
                                  if p not in ("kv_split_states",)])
def test_torch_overflow_only_in_masked_positions_is_not_an_error(path):
    Q, K = Q0[:6].copy(), K0[:6].copy()
    Q[0], K[5] = BIG / 1e10, BIG
    q, k, v = _t(Q, torch.float64), _t(K, torch.float64), _t(V0[:6], torch.float64)
    _torch_paths(q, k, v, causal=True)[path]()


@pytest.mark.parametrize("dtype, big", [(torch.float64, 1e100), (torch.float32, 1e10)])
def test_torch_large_but_safe_matches_float64(dtype, big):
    """大但有限的分数：分块前向、重算反向、SDPA、K/V 切段 = float64 的 vanilla（max-abs 和相对误差）。"""
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for causal in (False, True):
        q, k, v = _t(Q0 * big, dtype), _t(K0 * big, dtype), _t(V0, dtype)
        q64, k64, v64 = (t.double().requires_grad_(True) for t in (q, k, v))
        O_ref, lse_ref = fl18.vanilla_attention(q64, k64, v64, causal, return_lse=True)
        dO = torch.ones_like(O_ref)
        g_ref = torch.autograd.grad(O_ref, (q64, k64, v64), dO)
        O, lse = fl18.blockwise_attention_fwd(q, k, v, 3, 4, causal)
        O_ref, lse_ref = O_ref.detach(), lse_ref.detach()
        for got in (O, fl18.sdpa_attention(q, k, v, causal), fl18.finalize(fl18.merge_tree(
                fl18.kv_split_states(q, k, v, 3, causal)[0]))[0]):
            err = (got.double() - O_ref).abs().max().item()
            assert err < tol and err / O_ref.abs().max().item() < tol
        assert ((lse.double() - lse_ref).abs().max() / lse_ref.abs().max()).item() < tol
        grads = fl18.blockwise_attention_bwd(q, k, v, O, lse, dO.to(dtype), 3, 4, causal)
        for g, r in zip(grads[2:], g_ref[2:]):                 # dV：和量级无关（dQ、dK 乘了 1e100 的 k、q）
            assert (g.double() - r).abs().max().item() < tol * max(1.0, r.abs().max().item())


NEG_CASES = [(torch.float64, BIG, 1e-12), (torch.float32, 1e20, 1e-5), (torch.float16, 300.0, 2e-2),
             (torch.bfloat16, 1e20, 2e-2)]


def _torch_neg(dtype, big, rows, keys, n=N):
    Q, K = _neg_case(rows, keys)
    Q[list(rows), 0], K[list(keys), 0] = big, -big             # dtype 里 q·k 溢出成 −∞（fp16：9e4 > 65504）
    return _t(Q[:n], dtype), _t(K[:n] if n < N else K, dtype), _t(V0[:n] if n < N else V0, dtype)


@pytest.mark.parametrize("dtype, big, tol", NEG_CASES, ids=[str(t[0]) for t in NEG_CASES])
@pytest.mark.parametrize("causal", [False, True])
def test_torch_negative_overflow_among_finite_is_exact(dtype, big, tol, causal):
    """q₂·k₃ 在 dtype 里溢出成 −∞：vanilla、SDPA、分块前向 / autograd、flash_attention（CPU）、K/V 切段
    都 = float64 参考（O、lse、dV）。"""
    q, k, v = _torch_neg(dtype, big, (2,), (3,))
    assert torch.isneginf((q @ k.transpose(-2, -1))[0, 2, 3])
    O_ref, L_ref, _, _, dV_ref = _exact(q[0].double().numpy(), k[0].double().numpy(), v[0].double().numpy(),
                                        dO0, causal, (2, 3))
    vv = v.clone().requires_grad_(True)
    O_auto, lse = fl18.blockwise_attention(q, k, vv, 3, 4, causal, return_lse=True)
    O_auto.backward(torch.tensor(dO0, dtype=dtype)[None])
    outs = [fl18.vanilla_attention(q, k, v, causal), fl18.sdpa_attention(q, k, v, causal), O_auto,
            fl18.blockwise_attention_fwd(q, k, v, 3, 4, causal)[0], fl18.flash_attention(q, k, v, causal),
            fl18.finalize(fl18.merge_tree(fl18.kv_split_states(q, k, v, 3, causal)[0]))[0]]
    for got in outs:
        _close(got[0].detach().double().numpy(), O_ref, tol)
    _close(lse[0].detach().double().numpy()[:, None], L_ref[:, None], tol)
    _close(vv.grad[0].double().numpy(), dV_ref, tol)


@pytest.mark.parametrize("dtype, big", [(torch.float64, BIG), (torch.float32, 1e20), (torch.float16, 300.0)])
@pytest.mark.parametrize("path", list(_torch_paths(*(torch.zeros(1, 1, 1),) * 3)))
@pytest.mark.parametrize("causal", [False, True])
def test_torch_row_all_negative_overflow_raises(path, dtype, big, causal):
    """causal（N = Nk = 6）：第 0 行只看得见 k₀，q₀·k₀ = −∞；非 causal：第 2 行对所有 key 都是 −∞。报错，点名那一行。"""
    q, k, v = _torch_neg(dtype, big, (0,), (0,), n=6) if causal else _torch_neg(dtype, big, (2,), range(NK))
    with pytest.raises(ValueError, match="注意力分数溢出") as info:
        _torch_paths(q, k, v, causal)[path]()
    assert "−∞" in str(info.value) and ("[0]" if causal else "[2]") in str(info.value)


def test_torch_rows_without_keys_not_mistaken_for_overflow():
    q, k, v = _torch_neg(torch.float64, BIG, (3,), (0,))
    q[0, :3, 0] = BIG
    for run in (lambda: fl18.blockwise_attention_fwd(q, k[:, :4], v[:, :4], 2, 3, True),
                lambda: fl18.vanilla_attention(q, k[:, :4], v[:, :4], True)):
        with pytest.raises(ValueError, match=r"注意力分数溢出.*\[3\]"):
            run()
    O, lse = fl18.blockwise_attention_fwd(q[:, :3], k[:, 1:4], v[:, 1:4], 2, 3, True)
    assert torch.isfinite(lse).all()


def test_torch_rows_without_keys_keep_convention():
    q, k, v = _t(Q0 * 1e100, torch.float64), _t(K0[:4] * 1e100, torch.float64), _t(V0[:4], torch.float64)
    O, lse = fl18.blockwise_attention_fwd(q, k, v, 2, 3, True)
    assert (O[0, :3] == 0).all() and torch.isneginf(lse[0, :3]).all() and torch.isfinite(lse[0, 3:]).all()


# ================================================================================================ Triton 内核（解释器）
@pytest.fixture(scope="module")
def tf():
    from triton_interp import load_triton_flash
    return load_triton_flash()


def _kernel_case(dtype, row=2, key=3, sign=1.0):
    """[1, 5, 1, 16]：只有第 row 个 query 对第 key 个 key 的分数溢出（fp32：q、k 各 ~1e20）。"""
    g = torch.Generator().manual_seed(SEED)
    q, k, v = (torch.randn(1, n, 1, 16, generator=g) for n in (5, 7, 7))
    q[0, row], k[0, key] = 1e20, sign * 1e20
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _kernel_neg(nq, nk, rows, keys):
    """fp32 [1, nq, 1, 16]：第 0 维只留 q[rows] = 1e20、k[keys] = −1e20，这些分数 −1e40 溢出成 −∞，别的量级 1。"""
    g = torch.Generator().manual_seed(SEED + 3)
    q, k, v = (torch.randn(1, n, 1, 16, generator=g) for n in (nq, nk, nk))
    q[..., 0], k[..., 0] = 0.0, 0.0
    q[0, list(rows), 0, 0], k[0, list(keys), 0, 0] = 1e20, -1e20
    return q, k, v


def _check_rows(tf, q, k, v, rows, causal, scale=None, window=(-1, -1), empty=()):
    """rows 的 O、LSE 全是 NaN、dQ 的这些行有 NaN；empty 的行 O = 0、LSE = −∞、dQ = 0；别的行 = float64 参考。"""
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    o, lse = tf.flash_attn_func(qq, kk, vv, causal=causal, softmax_scale=scale, window_size=window, return_lse=True)
    bad = torch.zeros(q.shape[1], dtype=torch.bool)
    bad[list(rows)] = True
    none = torch.zeros_like(bad)
    none[list(empty)] = True
    assert torch.equal(torch.isnan(o[0, :, 0]).all(-1), bad) and torch.equal(torch.isnan(o[0, :, 0]).any(-1), bad)
    assert torch.equal(torch.isnan(lse[0, 0]), bad)
    assert (o[0, none] == 0).all() and torch.isneginf(lse[0, 0, none]).all()
    ref, lse_ref = tf.reference_attention(q, k, v, causal, scale, window_size=window)      # float64
    good = ~bad & ~none
    err = (o[0, good].double() - ref[0, good]).abs().max().item()
    tol = 1e-5 if q.dtype == torch.float32 else 2e-2
    assert err < tol and err / ref[0, good].abs().max().item() < tol
    lerr = (lse[0, 0, good].double() - lse_ref[0, 0, good]).abs().max().item()
    assert lerr < tol * max(1.0, lse_ref[0, 0, good].abs().max().item())
    o.backward(torch.ones_like(o))
    assert torch.equal(torch.isnan(qq.grad[0, :, 0]).any(-1), bad)              # dQ：只有那些行
    assert (qq.grad[0, none] == 0).all()
    return qq.grad, kk.grad, vv.grad


@pytest.mark.usefixtures("triton_interpret")
@pytest.mark.parametrize("causal", [False, True])
def test_triton_fp32_overflow_gives_nan_rows(tf, causal):
    q, k, v = _kernel_case(torch.float32)
    _check_rows(tf, q, k, v, [2], causal)


@pytest.mark.usefixtures("triton_interpret")
def test_triton_fp16_overflow_gives_nan_rows(tf):
    """fp16 的 q、k 再大（≤ 65504）点积也进不了 fp32 的上限：用很大的 softmax_scale 让第 2 行溢出。"""
    g = torch.Generator().manual_seed(SEED + 1)
    q, k, v = (torch.randn(1, n, 1, 16, generator=g).half() for n in (5, 7, 7))
    q[0, 2], k[0, 3] = 200.0, 200.0                            # q₂·k₃ = 6.4e5；别的分数 < 1e4
    _check_rows(tf, q, k, v, [2], False, scale=1e34)


@pytest.mark.usefixtures("triton_interpret")
def test_triton_large_but_safe_and_empty_rows(tf):
    """fp32 里大但有限的分数 = float64 参考；causal 且 N > Nk 的前几行照旧 O = 0、LSE = −∞。"""
    g = torch.Generator().manual_seed(SEED + 2)
    q, k, v = (torch.randn(1, n, 1, 16, generator=g) for n in (9, 6, 6))
    q, k = q * 1e15, k * 1e15
    o, lse = tf.flash_attn_func(q, k, v, causal=True, return_lse=True)
    ref, lse_ref = tf.reference_attention(q, k, v, True)
    assert (o[0, :3] == 0).all() and torch.isneginf(lse[0, 0, :3]).all()
    err = (o.double() - ref).abs().max().item()
    assert err < 1e-5 and err / ref.abs().max().item() < 1e-5
    fin = torch.isfinite(lse_ref)
    assert ((lse.double()[fin] - lse_ref[fin]).abs().max() / lse_ref[fin].abs().max()).item() < 1e-5


@pytest.mark.usefixtures("triton_interpret")
@pytest.mark.parametrize("causal", [False, True])
def test_triton_fp32_negative_overflow_among_finite_is_exact(tf, causal):
    """q₂·k₃ = −1e40 → −∞，第 2 行别的分数有限：权重 0，整行有限、= float64 参考（O、LSE、dV，max-abs 和相对误差）。"""
    q, k, v = _kernel_neg(5, 7, (2,), (3,))
    _, _, dv = _check_rows(tf, q, k, v, [], causal)
    v64 = v.double().requires_grad_(True)
    ref = tf.reference_attention(q, k, v64, causal)[0]
    ref.backward(torch.ones_like(ref))
    err = (dv.double() - v64.grad).abs().max().item()
    assert err < 1e-5 and err / v64.grad.abs().max().item() < 1e-5


@pytest.mark.usefixtures("triton_interpret")
def test_triton_fp16_negative_overflow_among_finite_is_exact(tf):
    """fp16：softmax_scale = 1e34 时只有 q₂·k₃ = −3.2e5 乘出 −∞；其余分数取 0（q 的别的行、k 的别的行正交），
    所以第 2 行 = 除 v₃ 外 v 的平均，别的行 = 全部 v 的平均。"""
    g = torch.Generator().manual_seed(SEED + 4)
    q, k = torch.zeros(1, 5, 1, 16), torch.randn(1, 7, 1, 16, generator=g)
    v = torch.randn(1, 7, 1, 16, generator=g)
    k[..., :8] = 0.0
    q[0, 2, 0, :8], k[0, 3, 0, :8] = 200.0, -200.0
    q, k, v = q.half(), k.half(), v.half()
    _check_rows(tf, q, k, v, [], False, scale=1e34)
    o = tf.flash_attn_func(q, k, v, softmax_scale=1e34)
    keep = torch.arange(7) != 3
    assert (o[0, 2].float() - v[0, keep].float().mean(0)).abs().max() < 2e-3
    assert (o[0, 0].float() - v[0].float().mean(0)).abs().max() < 2e-3


ALL_NEG = [("causal: row 0 sees k0..k2", 5, 7, (0,), (0, 1, 2), True, (-1, -1), (0,), ()),
           ("full: row 1 sees all", 5, 7, (1,), range(7), False, (-1, -1), (1,), ()),
           ("window (1, 1): row 0 sees k1..k3", 5, 7, (0,), (1, 2, 3), False, (1, 1), (0,), ()),
           ("causal Nq > Nk: rows 0-2 see nothing, row 3 sees k0", 9, 6, (0, 1, 2, 3), (0,), True, (-1, -1),
            (3,), (0, 1, 2))]


@pytest.mark.usefixtures("triton_interpret")
@pytest.mark.parametrize("label, nq, nk, qrows, keys, causal, window, nan_rows, empty", ALL_NEG,
                         ids=[c[0] for c in ALL_NEG])
def test_triton_row_all_negative_overflow_gives_nan_rows(tf, label, nq, nk, qrows, keys, causal, window, nan_rows,
                                                         empty):
    """一行看得见 key、可见的分数却全溢出成 −∞：NaN 行（不冒充"没有可见 key"的 O = 0、LSE = −∞）；
    真正没有可见 key 的行（causal 且 Nq > Nk）照旧 O = 0、LSE = −∞、dQ = 0，哪怕它们对看不见的 key 也溢出。"""
    q, k, v = _kernel_neg(nq, nk, qrows, keys)
    _check_rows(tf, q, k, v, nan_rows, causal, window=window, empty=empty)


@pytest.mark.usefixtures("triton_interpret")
def test_triton_bias_negative_infinity_is_a_mask(tf):
    """bias 的 −∞ 是用户给的掩码：第 1 行整行被 bias 掩掉 → O = 0、LSE = −∞（不是 NaN），别的行 = float64 参考。"""
    g = torch.Generator().manual_seed(SEED + 5)
    q, k, v = (torch.randn(1, n, 1, 16, generator=g) for n in (5, 7, 7))
    bias = torch.randn(1, 1, 5, 7, generator=g)
    bias[0, 0, 1] = -torch.inf
    o, lse = tf.flash_attn_func(q, k, v, bias=bias, return_lse=True)
    assert (o[0, 1] == 0).all() and torch.isneginf(lse[0, 0, 1])
    ref = tf.reference_attention(q, k, v, bias=bias)[0]
    rows = torch.arange(5) != 1
    err = (o[0, rows].double() - ref[0, rows]).abs().max().item()
    assert err < 1e-5 and err / ref[0, rows].abs().max().item() < 1e-5


@pytest.mark.usefixtures("triton_interpret")
def test_triton_whole_unmasked_tile_of_negative_overflow_is_exact(tf):
    """第 2 行对前 64 个 key（一整块，不带掩码）都溢出成 −∞，对后 36 个有限：精确答案是只在后 36 个上做 softmax。"""
    q, k, v = _kernel_neg(5, 100, (2,), range(64))
    _check_rows(tf, q, k, v, [], False)
