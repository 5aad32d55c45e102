"""
坏输入与边界输入（续）：lecture19/long_lab.py 的公开入口（检查点函数、NeedleTask 与 torch.distributed 那一节除外）。

每个坏输入必须抛 ValueError / TypeError，消息里写出调用者传的参数名；放不进本机内存的尺寸（T = 10⁶ 的掩码、
巨大的 d_model / 词表 / 层数、10¹² 个设备的账本）在分配之前就报错并写出要多少字节。合法的边界输入给出对的
答案（和显式公式 / 显式 softmax 的参考比）。hypothesis 检查：窗口 / 跨步掩码每行的键数 = 公式；
last_only=True 的 logits = 完整前向的最后一个位置；环形注意力 = 显式 softmax。整个文件在 2 核 CPU 上 < 30 s。
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from bad_input_cases import Case, generator, randn, check_case, params
from labload import load_lab

L = load_lab("lecture19", "long_lab")

SEED = 20261204
print(f"test_bad_inputs_lecture19 的随机种子 {SEED}")
F64 = torch.float64
BIG = 10 ** 12


def _r(*shape, dtype=F64, seed=SEED):
    return randn(*shape, dtype=dtype, seed=seed)


TASK = L.NeedleTask()
V = TASK.vocab_size
torch.manual_seed(0)
LM = L.LongLM(V, d_model=16, n_layers=1, n_heads=2, d_ff=24)
LMW = L.LongLM(V, d_model=16, n_layers=1, n_heads=2, d_ff=24, mask_kind="window")
ATT = L.LongAttention(8, 2)
ATTW = L.LongAttention(8, 2, mask_kind="window")
BLK = L.LongBlock(8, 2, 12)
IDS = torch.randint(0, V, (2, 12), generator=generator(SEED))
X8 = _r(2, 5, 8, dtype=torch.float32)
FAR = torch.zeros(1, 200_000, 8)                     # 6.4 MB 的输入；[T, T] 的掩码要几 TB
Q, K, V_ = (_r(12, 4, seed=SEED + i) for i in range(3))
GRID = {(64, 0.0): 0.5, (64, 1.0): 1.0}


class _Ax:
    def imshow(self, *a, **k):
        return None

    def text(self, *a, **k):
        return None

    def set_xticks(self, *a, **k):
        return None

    def set_yticks(self, *a, **k):
        return None


def _keep(attn):
    attn.keep_attn = True
    return attn


# (id, 调用, 异常类型, 消息里必须出现的文字：调用者传的参数名)
BAD = [
    # ---- 注意力模式 ----
    ("attention_mask T huge", lambda: L.attention_mask("full", 10 ** 6), ValueError, "T"),
    ("attention_mask T=1e5", lambda: L.attention_mask("window", 100_000), ValueError, "T"),
    ("attention_mask T str", lambda: L.attention_mask("full", "8"), TypeError, "T"),
    ("attention_mask T True", lambda: L.attention_mask("full", True), TypeError, "T"),
    ("attention_mask kind None", lambda: L.attention_mask(None, 8), ValueError, "kind"),
    ("attention_mask window 2.5", lambda: L.attention_mask("window", 8, window=2.5), TypeError, "window"),
    ("attention_mask stride True", lambda: L.attention_mask("strided", 8, stride=True), TypeError, "stride"),
    ("attention_mask segments None", lambda: L.attention_mask("dilated", 8, segments=None), TypeError, "segments"),
    ("attention_mask segment w=0", lambda: L.attention_mask("dilated", 8, segments=((0, 1),)), ValueError, "segments"),
    ("attention_mask segment str", lambda: L.attention_mask("dilated", 8, segments=(("a", 1),)), TypeError, "segments"),
    ("attention_mask segment r=1.5", lambda: L.attention_mask("dilated", 8, segments=[[8, 1.5]]), TypeError,
     "segments"),
    ("attention_mask segments str", lambda: L.attention_mask("dilated", 8, segments="ab"), TypeError, "segments"),
    ("pattern_pairs kw typo", lambda: L.pattern_pairs("strided", 8, strid=4), TypeError, "strid"),
    ("pattern_pairs T huge", lambda: L.pattern_pairs("full", 10 ** 6), ValueError, "T"),
    ("pattern_pairs T=0", lambda: L.pattern_pairs("window", 0), ValueError, "T"),
    # ---- LongAttention ----
    ("LongAttention d_model huge", lambda: L.LongAttention(10 ** 6, 2), ValueError, "d_model"),
    ("LongAttention d_model str", lambda: L.LongAttention("8", 2), TypeError, "d_model"),
    ("LongAttention n_heads=0", lambda: L.LongAttention(8, 0), ValueError, "n_heads"),
    ("LongAttention n_heads=3", lambda: L.LongAttention(8, 3), ValueError, "n_heads"),
    ("LongAttention base inf", lambda: L.LongAttention(8, 2, base=float("inf")), ValueError, "base"),
    ("LongAttention mask_kind None", lambda: L.LongAttention(8, 2, mask_kind=None), ValueError, "mask_kind"),
    ("LongAttention mask_kw list", lambda: L.LongAttention(8, 2, mask_kw=[16]), TypeError, "mask_kw"),
    ("LongAttention mask_kw window str", lambda: L.LongAttention(8, 2, mask_kind="window", mask_kw={"window": "x"}),
     TypeError, "window"),
    ("LongAttention int x", lambda: ATT(torch.ones(2, 5, 8, dtype=torch.long)), TypeError, "x"),
    ("LongAttention 2-D x", lambda: ATT(torch.ones(5, 8)), TypeError, "x"),
    ("LongAttention wrong d", lambda: ATT(torch.ones(2, 5, 6)), TypeError, "x"),
    ("LongAttention empty x", lambda: ATT(torch.ones(2, 0, 8)), ValueError, "x"),
    ("LongAttention list x", lambda: ATT([[1.0] * 8]), TypeError, "x"),
    ("LongAttention window huge T", lambda: ATTW(FAR), ValueError, "x"),
    ("LongAttention keep_attn huge T", lambda: _keep(L.LongAttention(8, 2))(FAR), ValueError, "x"),
    ("rope T=0", lambda: ATT.rope(0, "cpu"), ValueError, "T"),
    ("rope T str", lambda: ATT.rope("4", "cpu"), TypeError, "T"),
    ("rope device typo", lambda: ATT.rope(4, "gpu0"), ValueError, "device"),
    ("allowed T=0", lambda: ATT.allowed(0, "cpu"), ValueError, "T"),
    ("allowed device float", lambda: ATT.allowed(4, 3.5), ValueError, "device"),
    ("allowed T huge", lambda: ATT.allowed(10 ** 6, "cpu"), ValueError, "T"),
    # ---- LongBlock / LongLM ----
    ("LongBlock d_model=0", lambda: L.LongBlock(0, 2, 8), ValueError, "d_model"),
    ("LongBlock d_ff=0", lambda: L.LongBlock(8, 2, 0), ValueError, "d_ff"),
    ("LongBlock d_ff huge", lambda: L.LongBlock(8, 2, BIG), ValueError, "d_ff"),
    ("LongBlock d_model str", lambda: L.LongBlock("8", 2, 8), TypeError, "d_model"),
    ("LongBlock n_heads=0", lambda: L.LongBlock(8, 0, 8), ValueError, "n_heads"),
    ("LongBlock int x", lambda: BLK(torch.ones(2, 5, 8, dtype=torch.int32)), TypeError, "x"),
    ("LongBlock wrong d", lambda: BLK(torch.ones(2, 5, 9)), TypeError, "x"),
    ("LongLM vocab huge", lambda: L.LongLM(10 ** 10), ValueError, "vocab_size"),
    ("LongLM d_model=0", lambda: L.LongLM(V, d_model=0), ValueError, "d_model"),
    ("LongLM d_model str", lambda: L.LongLM(V, d_model="x"), TypeError, "d_model"),
    ("LongLM d_model huge", lambda: L.LongLM(V, d_model=10 ** 6), ValueError, "d_model"),
    ("LongLM n_layers huge", lambda: L.LongLM(V, n_layers=10 ** 9), ValueError, "n_layers"),
    ("LongLM n_heads=3", lambda: L.LongLM(V, n_heads=3), ValueError, "n_heads"),
    ("LongLM vocab_size str", lambda: L.LongLM("40"), TypeError, "vocab_size"),
    ("LongLM n_layers=0", lambda: L.LongLM(V, n_layers=0), ValueError, "n_layers"),
    ("LongLM pos typo", lambda: L.LongLM(V, pos="alibi"), ValueError, "pos"),
    ("LongLM int16 ids", lambda: LM(IDS.short()), TypeError, "ids"),
    ("LongLM bool ids", lambda: LM(IDS.bool()), TypeError, "ids"),
    ("LongLM huge T window", lambda: LMW(torch.zeros(1, 200_000, dtype=torch.long)), ValueError, "ids"),
    ("LongLM last_only None", lambda: LM(IDS, last_only=None), TypeError, "last_only"),
    ("LongLM last_only 'True'", lambda: LM(IDS, last_only="True"), TypeError, "last_only"),
    ("set_rope scale inf", lambda: LM.set_rope(scale=float("inf")), ValueError, "scale"),
    ("set_rope base nan", lambda: LM.set_rope(base=float("nan")), ValueError, "base"),
    ("set_rope base str", lambda: LM.set_rope(base="x"), TypeError, "base"),
    ("set_rope scale True", lambda: LM.set_rope(scale=True), TypeError, "scale"),
    # ---- build_model ----
    ("build_model task None", lambda: L.build_model(None, {}), TypeError, "task"),
    ("build_model seed 2**64", lambda: L.build_model(TASK, {"seed": 2 ** 64}), ValueError, "seed"),
    ("build_model seed 1.5", lambda: L.build_model(TASK, {"seed": 1.5}), TypeError, "seed"),
    ("build_model seed True", lambda: L.build_model(TASK, {"seed": True}), TypeError, "seed"),
    ("build_model d_model huge", lambda: L.build_model(TASK, {"d_model": 10 ** 6}), ValueError, "d_model"),
    ("build_model n_heads=0", lambda: L.build_model(TASK, {"n_heads": 0}), ValueError, "n_heads"),
    ("build_model stride -1", lambda: L.build_model(TASK, {"mask": "strided", "mask_kw": {"stride": -1}}), ValueError,
     "stride"),
    ("build_model scale str", lambda: L.build_model(TASK, {"scale": "2"}), TypeError, "scale"),
    ("build_model base 0.5", lambda: L.build_model(TASK, {"base": 0.5}), ValueError, "base"),
    ("build_model cfg None", lambda: L.build_model(TASK, None), TypeError, "cfg"),
    # ---- 学习率与训练 ----
    ("lr_at step=-1", lambda: L.lr_at(-1, 10, 2, 1e-3), ValueError, "step"),
    ("lr_at step str", lambda: L.lr_at("x", 10, 2, 1e-3), TypeError, "step"),
    ("lr_at step>steps", lambda: L.lr_at(11, 10, 2, 1e-3), ValueError, "step"),
    ("lr_at lr=0", lambda: L.lr_at(1, 10, 2, 0.0), ValueError, "lr"),
    ("lr_at lr nan", lambda: L.lr_at(1, 10, 2, float("nan")), ValueError, "lr"),
    ("lr_at lr str", lambda: L.lr_at(1, 10, 2, "1e-3"), TypeError, "lr"),
    ("lr_at steps=0", lambda: L.lr_at(0, 0, 2, 1e-3), ValueError, "steps"),
    ("lr_at warmup 1.5", lambda: L.lr_at(1, 10, 1.5, 1e-3), TypeError, "warmup"),
    ("lr_at steps True", lambda: L.lr_at(1, True, 1, 1e-3), TypeError, "steps"),
    ("train_needle log int", lambda: L.train_needle(LM, TASK, 1, 64, batch=1, warmup=1, log=3), TypeError, "log"),
    ("train_needle seed 'x'", lambda: L.train_needle(LM, TASK, 1, 64, batch=1, warmup=1, seed="x"), TypeError, "seed"),
    ("train_needle seed 1.5", lambda: L.train_needle(LM, TASK, 1, 64, batch=1, warmup=1, seed=1.5), TypeError, "seed"),
    ("train_needle huge batch×T", lambda: L.train_needle(LM, TASK, 1, 10 ** 6, batch=10 ** 6, warmup=1), ValueError,
     "batch"),
    ("train_needle task None", lambda: L.train_needle(LM, None, 1, 64, warmup=1), TypeError, "task"),
    ("train_needle lr inf", lambda: L.train_needle(LM, TASK, 1, 64, lr=float("inf"), warmup=1), ValueError, "lr"),
    ("train_needle steps 2.0", lambda: L.train_needle(LM, TASK, 2.0, 64, warmup=1), TypeError, "steps"),
    ("train_needle data_offset -1", lambda: L.train_needle(LM, TASK, 1, 64, warmup=1, data_offset=-1), ValueError,
     "data_offset"),
    ("train_needle progress 1", lambda: L.train_needle(LM, TASK, 1, 64, warmup=1, progress=1), TypeError, "progress"),
    ("train_needle warmup None", lambda: L.train_needle(LM, TASK, 1, 64, warmup=None), TypeError, "warmup"),
    ("train_needle curriculum 1.5", lambda: L.train_needle(LM, TASK, 1, 64, warmup=1, curriculum=1.5), TypeError,
     "curriculum"),
    ("train_needle model None", lambda: L.train_needle(None, TASK, 1, 64, warmup=1), TypeError, "model"),
    # ---- 大海捞针的表与图 ----
    ("niah_grid lengths int", lambda: L.niah_grid(LM, TASK, 128, [0.5], n=2), TypeError, "lengths"),
    ("niah_grid lengths empty", lambda: L.niah_grid(LM, TASK, [], [0.5], n=2), ValueError, "lengths"),
    ("niah_grid depths float", lambda: L.niah_grid(LM, TASK, [64], 0.5, n=2), TypeError, "depths"),
    ("niah_grid depths empty", lambda: L.niah_grid(LM, TASK, [64], [], n=2), ValueError, "depths"),
    ("niah_grid lengths huge", lambda: L.niah_grid(LMW, TASK, [10 ** 7], [0.5], n=2), ValueError, "lengths"),
    ("niah_grid seed -1", lambda: L.niah_grid(LM, TASK, [64], [0.5], n=2, seed=-1), ValueError, "seed"),
    ("niah_grid seed 'x'", lambda: L.niah_grid(LM, TASK, [64], [0.5], n=2, seed="x"), TypeError, "seed"),
    ("niah_grid length str", lambda: L.niah_grid(LM, TASK, ["128"], [0.5], n=2), TypeError, "lengths"),
    ("niah_grid depth nan", lambda: L.niah_grid(LM, TASK, [64], [float("nan")], n=2), ValueError, "depths"),
    ("niah_grid n True", lambda: L.niah_grid(LM, TASK, [64], [0.5], n=True), TypeError, "n"),
    ("niah_grid lengths str", lambda: L.niah_grid(LM, TASK, "128", [0.5], n=2), TypeError, "lengths"),
    ("niah_heatmap missing cell", lambda: L.niah_heatmap(_Ax(), GRID, [64, 128], [0.0, 1.0]), ValueError, "grid"),
    ("niah_heatmap grid None", lambda: L.niah_heatmap(_Ax(), None, [64], [0.0]), TypeError, "grid"),
    ("niah_heatmap ax None", lambda: L.niah_heatmap(None, GRID, [64], [0.0, 1.0]), TypeError, "ax"),
    ("niah_heatmap value 1.5", lambda: L.niah_heatmap(_Ax(), {(64, 0.0): 1.5}, [64], [0.0]), ValueError, "grid"),
    ("niah_heatmap lengths int", lambda: L.niah_heatmap(_Ax(), GRID, 64, [0.0]), TypeError, "lengths"),
    ("demo_start description None", lambda: L.demo_start(None, "小规模"), TypeError, "description"),
    ("demo_start quick_help int", lambda: L.demo_start("演示", 3), TypeError, "quick_help"),
    # ---- 环形注意力（模拟）----
    ("RingLedger P huge", lambda: L.RingLedger(BIG), ValueError, "P"),
    ("RingLedger P str", lambda: L.RingLedger("4"), TypeError, "P"),
    ("shard_index N huge", lambda: L.shard_index(BIG, 1, "contiguous"), ValueError, "N"),
    ("shard_index N str", lambda: L.shard_index("8", 2, "striped"), TypeError, "N"),
    ("shard_index P 1.5", lambda: L.shard_index(8, 1.5, "striped"), TypeError, "P"),
    ("ring N=0", lambda: L.ring_attention(*(torch.zeros(0, 4, dtype=F64),) * 3, 1), ValueError, "Q"),
    ("ring d=0", lambda: L.ring_attention(*(torch.zeros(4, 0, dtype=F64),) * 3, 2), ValueError, "Q"),
    ("ring P True", lambda: L.ring_attention(Q, K, V_, True), TypeError, "P"),
    ("ring layout None", lambda: L.ring_attention(Q, K, V_, 2, layout=None), ValueError, "layout"),
    ("ring ledger str", lambda: L.ring_attention(Q, K, V_, 2, ledger="x"), TypeError, "ledger"),
    ("ring causal None", lambda: L.ring_attention(Q, K, V_, 2, causal=None), TypeError, "causal"),
    ("ring list Q", lambda: L.ring_attention(Q.tolist(), K, V_, 2), TypeError, "Q"),
    ("ring complex Q", lambda: L.ring_attention(Q.to(torch.complex128), K, V_, 2), TypeError, "Q"),
    # ---- 代价公式 ----
    ("flops n_params str", lambda: L.flops_per_token("1e9", 2, 8, 16), TypeError, "n_params"),
    ("flops n_layers 1.5", lambda: L.flops_per_token(1e9, 1.5, 8, 16), TypeError, "n_layers"),
    ("flops d_model=0", lambda: L.flops_per_token(1e9, 2, 0, 16), ValueError, "d_model"),
    ("flops T inf", lambda: L.flops_per_token(1e9, 2, 8, float("inf")), ValueError, "T"),
    ("flops causal 1", lambda: L.flops_per_token(1e9, 2, 8, 16, causal=1), TypeError, "causal"),
    ("flops n_params<0", lambda: L.flops_per_token(-1, 2, 8, 16), ValueError, "n_params"),
]


@params([Case(*c) for c in BAD])
def test_bad_input_names_the_argument(case):
    check_case(case)   # 异常类型对、消息里写出参数名（整词）


def test_cases_are_many_and_distinct():
    assert len(BAD) >= 100


def test_memory_errors_say_how_many_bytes():
    for call in (lambda: L.attention_mask("full", 10 ** 6), lambda: L.RingLedger(BIG), lambda: ATTW(FAR)):
        with pytest.raises(ValueError) as info:
            call()
        assert "字节" in str(info.value) and "本机内存" in str(info.value)


# ---------------------------------------------------------------------------------------------------------------
# 合法的边界输入：答案对
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", L.MASK_KINDS)
def test_mask_T1_is_one_true(kind):
    assert torch.equal(L.attention_mask(kind, 1), torch.ones(1, 1, dtype=torch.bool))


def test_mask_extremes_match_closed_forms():
    T = 13
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    assert torch.equal(L.attention_mask("window", T, window=1), torch.eye(T, dtype=torch.bool))
    assert torch.equal(L.attention_mask("window", T, window=T + 5), causal)
    assert torch.equal(L.attention_mask("strided", T, stride=1), causal)
    assert torch.equal(L.attention_mask("dilated", T, segments=((1, 1),)), torch.eye(T, dtype=torch.bool))
    assert torch.equal(L.attention_mask("dilated", T, segments=((T, 1),)), causal)


def test_lr_at_endpoints():
    assert L.lr_at(0, 10, 4, 1e-3) == 0.0
    assert L.lr_at(4, 10, 4, 1e-3) == pytest.approx(1e-3)
    assert L.lr_at(10, 10, 4, 1e-3) == pytest.approx(1e-4)
    assert L.lr_at(1, 1, 1, 2e-3) == pytest.approx(2e-3)        # steps = warmup = 1


def test_attention_one_token_is_value_projection():
    att = L.LongAttention(8, 2).double()
    x = _r(3, 1, 8)
    v = (x @ att.qkv.weight.T)[..., 16:]                          # 一个 token：softmax 权重 = 1，输出 = out(V)
    assert (att(x) - att.out(v)).abs().max() < 1e-12


def test_block_forward_equals_manual():
    blk = L.LongBlock(8, 2, 12).double()
    x = _r(2, 6, 8)
    h = x + blk.attn(blk.n1(x))
    assert (blk(x) - (h + blk.ffn(blk.n2(h)))).abs().max() < 1e-12


def test_ring_P_equals_N_matches_softmax():
    N = Q.shape[0]
    S = (Q @ K.T) / math.sqrt(Q.shape[1])
    S = S.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.softmax(S, -1) @ V_
    for layout in L.LAYOUTS:
        O, led = L.ring_attention(Q, K, V_, N, layout=layout)
        assert (O - ref).abs().max() < 1e-12 and led.total_work() == N * (N + 1) // 2


def test_niah_heatmap_accepts_a_full_grid():
    L.niah_heatmap(_Ax(), GRID, [64], [0.0, 1.0])
    L.niah_heatmap(_Ax(), GRID, (64,), (1.0,))


def test_flops_zero_length():
    assert L.flops_per_token(0, 1, 1, 0) == (0, 0)


# ---------------------------------------------------------------------------------------------------------------
# 定律（hypothesis）
# ---------------------------------------------------------------------------------------------------------------
@settings(deadline=None, max_examples=15, derandomize=True)
@given(T=st.integers(1, 40), window=st.integers(1, 45), stride=st.integers(1, 45))
def test_mask_row_counts(T, window, stride):
    w = L.attention_mask("window", T, window=window).sum(1)
    assert w.tolist() == [min(i + 1, window) for i in range(T)]
    s = L.attention_mask("strided", T, stride=stride).sum(1)
    assert s.tolist() == [sum(1 for g in range(i + 1) if g < stride or g % stride == 0) for i in range(T)]


@settings(deadline=None, max_examples=6, derandomize=True)
@given(mask=st.sampled_from(L.MASK_KINDS), T=st.integers(1, 24), B=st.integers(1, 3), seed=st.integers(0, 10 ** 6))
def test_last_only_equals_full_forward_last(mask, T, B, seed):
    torch.manual_seed(seed)
    model = L.LongLM(V, d_model=16, n_layers=1, n_heads=2, d_ff=24, mask_kind=mask).double()
    ids = torch.randint(0, V, (B, T), generator=generator(seed))
    with torch.no_grad():
        assert (model(ids, last_only=True) - model(ids)[:, -1]).abs().max() < 1e-12


@settings(deadline=None, max_examples=10, derandomize=True)
@given(n=st.integers(1, 6), P=st.integers(1, 4), d=st.integers(1, 5), causal=st.booleans(),
       layout=st.sampled_from(L.LAYOUTS), seed=st.integers(0, 10 ** 6))
def test_ring_equals_explicit_softmax(n, P, d, causal, layout, seed):
    N = n * P
    q, k, v = (_r(N, d, seed=seed + i) for i in range(3))
    S = (q @ k.T) / math.sqrt(d)
    if causal:
        S = S.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
    O, _ = L.ring_attention(q, k, v, P, causal=causal, layout=layout)
    assert (O - torch.softmax(S, -1) @ v).abs().max() < 1e-12
