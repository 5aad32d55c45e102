"""
坏输入与边界输入（续）：lecture04/modern_lm.py 的每个公开入口（检查点函数除外）。

每个坏输入必须抛 ValueError / TypeError，消息里写出调用者传的参数名；放不进本机内存的尺寸（巨大的
d_model / vocab / n_layers、10¹² 个新 token、几十万个位置的注意力偏置）在分配之前就报错并写出要多少字节。
合法的边界输入给出对的答案（和显式公式 / 不带 cache 的参考比）。hypothesis 检查两条定律：
带 KV cache 的生成 = 不带 cache 的生成；RoPE 保持每对分量的范数。整个文件在 2 核 CPU 上 < 30 s。
"""
import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from bad_input_cases import Case, generator, randn, check_case, params
from labload import load_lab

ml = load_lab("lecture04", "modern_lm")
tl = load_lab("lecture02", "transformer_lab")

SEED = 20261203
print(f"test_bad_inputs_lecture04 的随机种子 {SEED}")
F64 = torch.float64
BIG = 10 ** 12


def _r(*shape, dtype=F64, seed=SEED):
    return randn(*shape, dtype=dtype, seed=seed)


TINY = ml.LMConfig(vocab=19, d_model=24, n_layers=1, n_heads=4, n_kv_heads=2, d_head=6, d_ff=20, max_seq=32)
torch.manual_seed(0)
LM = ml.ModernLM(TINY)
WIN = ml.ModernLM(ml.config_like(TINY, window=4))
ALIBI = ml.ModernLM(ml.config_like(TINY, pos="alibi"))
LEARNED = ml.ModernLM(ml.config_like(TINY, pos="learned", max_seq=8))
ATTN = ml.Attention(TINY)
BLOCK = ml.Block(TINY)
IDS = torch.randint(0, 19, (2, 5), generator=generator(SEED))
XA = _r(2, 5, 24, dtype=torch.float32)
LANG = ml.language()
TC = ml.TrainConfig(steps=4, batch=2, seq=8, warmup=1, eval_every=4, eval_batches=1)
POS4 = torch.arange(4)
X4 = _r(2, 3, 5, 8)
COS, SIN = ml.rope_angles(torch.arange(5), 8)
TOK, _ = LANG.sample(2, 9, seed=3)
L02 = tl.init_params(tl.TINY, seed=1)
FAR = torch.zeros(1, 200_000, dtype=torch.long)       # 1.6 MB 的 id；窗口 / ALiBi 的偏置 [T, T] 却要几百 GB


def _l02(**change):
    """第 2 讲参数的拷贝，改掉几项（layers 里的用 'layers.0.wq' 这样的键）。"""
    p = dict(L02, layers=[dict(lp) for lp in L02["layers"]])
    for key, val in change.items():
        if key.startswith("layers."):
            _, i, k = key.split(".")
            p["layers"][int(i)][k] = val
        elif val is None:
            p.pop(key)
        else:
            p[key] = val
    return p


def _cache_after(model, ids):
    cache = ml.KVCache(model.cfg)
    model(ids, cache)
    return cache


# (id, 调用, 异常类型, 消息里必须出现的文字：调用者传的参数名)
BAD = [
    # ---- 积木 ----
    ("RMSNorm d huge", lambda: ml.RMSNorm(BIG), ValueError, "d"),
    ("RMSNorm d None", lambda: ml.RMSNorm(None), TypeError, "d"),
    ("RMSNorm eps str", lambda: ml.RMSNorm(4, eps="1e-5"), TypeError, "eps"),
    ("RMSNorm eps<0", lambda: ml.RMSNorm(4, eps=-1e-5), ValueError, "eps"),
    ("RMSNorm int x", lambda: ml.RMSNorm(4)(torch.ones(3, 4, dtype=torch.long)), TypeError, "x"),
    ("RMSNorm bool x", lambda: ml.RMSNorm(4)(torch.ones(3, 4, dtype=torch.bool)), TypeError, "x"),
    ("make_norm layer d=0", lambda: ml.make_norm("layer", 0), ValueError, "d"),
    ("make_norm layer d=4.5", lambda: ml.make_norm("layer", 4.5), TypeError, "d"),
    ("make_norm layer d huge", lambda: ml.make_norm("layer", BIG), ValueError, "d"),
    ("make_norm layer eps=0", lambda: ml.make_norm("layer", 4, eps=0), ValueError, "eps"),
    ("make_norm rms eps nan", lambda: ml.make_norm("rms", 4, eps=float("nan")), ValueError, "eps"),
    ("make_norm kind None", lambda: ml.make_norm(None, 4), ValueError, "norm"),
    ("SwiGLU huge", lambda: ml.SwiGLU(10 ** 6, 10 ** 6), ValueError, "d_ff"),
    ("SwiGLU d_model None", lambda: ml.SwiGLU(None, 4), TypeError, "d_model"),
    ("SwiGLU wrong last dim", lambda: ml.SwiGLU(4, 8)(torch.ones(2, 5)), ValueError, "x"),
    ("SwiGLU int x", lambda: ml.SwiGLU(4, 8)(torch.ones(2, 4, dtype=torch.long)), TypeError, "x"),
    ("SwiGLU list x", lambda: ml.SwiGLU(4, 8)([1.0] * 4), ValueError, "x"),
    ("GeluMLP huge", lambda: ml.GeluMLP(10 ** 6, 10 ** 6), ValueError, "d_ff"),
    ("GeluMLP d_model=True", lambda: ml.GeluMLP(True, 4), TypeError, "d_model"),
    ("GeluMLP wrong last dim", lambda: ml.GeluMLP(4, 8)(torch.ones(2, 3)), ValueError, "x"),
    ("GeluMLP int x", lambda: ml.GeluMLP(4, 8)(torch.ones(2, 4, dtype=torch.int32)), TypeError, "x"),
    ("GeluMLP none x", lambda: ml.GeluMLP(4, 8)(None), ValueError, "x"),
    ("mlp_width True", lambda: ml.mlp_width(True, "gelu"), TypeError, "d_ff_swiglu"),
    ("mlp_width kind None", lambda: ml.mlp_width(8, None), ValueError, "mlp"),
    # ---- 位置 ----
    ("rope_angles dim huge", lambda: ml.rope_angles(torch.arange(4), BIG), ValueError, "dim"),
    ("rope_angles dim None", lambda: ml.rope_angles(torch.arange(4), None), TypeError, "dim"),
    ("rope_angles base inf", lambda: ml.rope_angles(torch.arange(4), 8, base=float("inf")), ValueError, "base"),
    ("rope_angles base True", lambda: ml.rope_angles(torch.arange(4), 8, base=True), TypeError, "base"),
    ("rope_angles positions None", lambda: ml.rope_angles(None, 8), TypeError, "positions"),
    ("rope_angles positions str", lambda: ml.rope_angles(["a", "b"], 8), TypeError, "positions"),
    ("rope_angles 0-d positions", lambda: ml.rope_angles(torch.tensor(3), 8), ValueError, "positions"),
    ("apply_rope_half cos list", lambda: ml.apply_rope_half(X4, COS.tolist(), SIN), TypeError, "cos"),
    ("apply_rope_half sin shape", lambda: ml.apply_rope_half(X4, COS, SIN[:4]), ValueError, "sin"),
    ("apply_rope_half cos complex", lambda: ml.apply_rope_half(X4, COS.to(torch.complex128), SIN), TypeError, "cos"),
    ("apply_rope_half x None", lambda: ml.apply_rope_half(None, COS, SIN), ValueError, "x"),
    ("apply_rope_interleaved odd dim", lambda: ml.apply_rope_interleaved(_r(5, 7), COS, SIN), ValueError, "x"),
    ("apply_rope_interleaved int sin", lambda: ml.apply_rope_interleaved(X4, COS, SIN.long()), TypeError, "sin"),
    ("apply_rope_interleaved bool x", lambda: ml.apply_rope_interleaved(torch.ones(5, 8, dtype=torch.bool), COS, SIN),
     TypeError, "x"),
    ("half_to_interleaved huge", lambda: ml.half_to_interleaved(BIG), ValueError, "dim"),
    ("half_to_interleaved 0", lambda: ml.half_to_interleaved(0), ValueError, "dim"),
    ("half_to_interleaved str", lambda: ml.half_to_interleaved("8"), TypeError, "dim"),
    ("sinusoidal_table n_pos huge", lambda: ml.sinusoidal_table(BIG, 8), ValueError, "n_pos"),
    ("sinusoidal_table d=0", lambda: ml.sinusoidal_table(4, 0), ValueError, "d"),
    ("sinusoidal_table n_pos None", lambda: ml.sinusoidal_table(None, 8), TypeError, "n_pos"),
    ("alibi_slopes huge", lambda: ml.alibi_slopes(BIG), ValueError, "n_heads"),
    ("alibi_slopes True", lambda: ml.alibi_slopes(True), TypeError, "n_heads"),
    ("alibi_slopes -2", lambda: ml.alibi_slopes(-2), ValueError, "n_heads"),
    ("attn_bias huge T×S", lambda: ml.attn_bias(torch.arange(400_000), torch.arange(400_000)), ValueError, "q_pos"),
    ("attn_bias 2-D slopes", lambda: ml.attn_bias(POS4, POS4, slopes=torch.ones(2, 2)), TypeError, "slopes"),
    ("attn_bias list slopes", lambda: ml.attn_bias(POS4, POS4, slopes=[0.5, 0.25]), TypeError, "slopes"),
    ("attn_bias dtype str", lambda: ml.attn_bias(POS4, POS4, dtype="float32"), TypeError, "dtype"),
    ("attn_bias bool q_pos", lambda: ml.attn_bias(torch.ones(4, dtype=torch.bool), POS4), TypeError, "q_pos"),
    ("attn_bias complex k_pos", lambda: ml.attn_bias(POS4, torch.zeros(4, dtype=torch.complex64)), TypeError, "k_pos"),
    # ---- 配置与模型 ----
    ("ModernLM huge vocab", lambda: ml.ModernLM(ml.LMConfig(vocab=10 ** 9, d_model=4096)), ValueError, "vocab"),
    ("ModernLM huge d_model", lambda: ml.ModernLM(ml.LMConfig(d_model=10 ** 6, d_ff=10 ** 6)), ValueError, "d_model"),
    ("ModernLM huge n_layers", lambda: ml.ModernLM(ml.LMConfig(n_layers=10 ** 9)), ValueError, "n_layers"),
    ("KVCache huge n_layers", lambda: ml.KVCache(ml.LMConfig(n_layers=BIG)), ValueError, "n_layers"),
    ("KVCache str cfg", lambda: ml.KVCache("modern"), TypeError, "LMConfig"),
    ("LMConfig n_heads=0", lambda: ml.LMConfig(n_heads=0), ValueError, "n_heads"),
    ("LMConfig n_kv_heads=0", lambda: ml.LMConfig(n_kv_heads=0), ValueError, "n_kv_heads"),
    ("LMConfig d_ff=0", lambda: ml.LMConfig(d_ff=0), ValueError, "d_ff"),
    ("LMConfig d_head str", lambda: ml.LMConfig(d_head="16"), TypeError, "d_head"),
    ("LMConfig rope_base inf", lambda: ml.LMConfig(rope_base=float("inf")), ValueError, "rope_base"),
    ("LMConfig norm_eps<0", lambda: ml.LMConfig(norm_eps=-1.0), ValueError, "norm_eps"),
    ("LMConfig window=2.0", lambda: ml.LMConfig(window=2.0), TypeError, "window"),
    ("LMConfig tied None", lambda: ml.LMConfig(tied=None), TypeError, "tied"),
    ("LMConfig vocab True", lambda: ml.LMConfig(vocab=True), TypeError, "vocab"),
    ("config_like cfg None", lambda: ml.config_like(None, vocab=4), TypeError, "cfg"),
    ("config_like pos typo", lambda: ml.config_like(TINY, pos="yarn"), ValueError, "pos"),
    ("Attention dict cfg", lambda: ml.Attention({"vocab": 3}), TypeError, "LMConfig"),
    ("Block None cfg", lambda: ml.Block(None), TypeError, "LMConfig"),
    ("Attention int x", lambda: ATTN(torch.ones(2, 5, 24, dtype=torch.long)), TypeError, "x"),
    ("Attention wrong last dim", lambda: ATTN(torch.ones(2, 5, 23)), ValueError, "x"),
    ("Attention 2-D x", lambda: ATTN(torch.ones(5, 24)), ValueError, "x"),
    ("Attention pos0=-1", lambda: ATTN(XA, pos0=-1), ValueError, "pos0"),
    ("Attention pos0=1.5", lambda: ATTN(XA, pos0=1.5), TypeError, "pos0"),
    ("Attention layer=5", lambda: ATTN(XA, layer=5), ValueError, "layer"),
    ("Attention cache dict", lambda: ATTN(XA, cache={}), TypeError, "cache"),
    ("Attention pos0 not after cache", lambda: ATTN(XA, pos0=0, cache=_cache_after(LM, IDS)),
     ValueError, "pos0"),
    ("Attention cache other cfg", lambda: ATTN(XA, cache=ml.KVCache(ml.MODERN)), ValueError, "cache"),
    ("Block int x", lambda: BLOCK(torch.ones(2, 5, 24, dtype=torch.int32)), TypeError, "x"),
    ("Block layer=-1", lambda: BLOCK(XA, layer=-1), ValueError, "layer"),
    ("forward int16 ids", lambda: LM(IDS.short()), TypeError, "ids"),
    ("forward bool ids", lambda: LM(IDS.bool()), TypeError, "ids"),
    ("forward 3-D ids", lambda: LM(IDS[None]), TypeError, "ids"),
    ("forward cache batch", lambda: LM(IDS[:1], cache=_cache_after(LM, IDS)), ValueError, "ids"),
    ("forward window huge T", lambda: WIN(FAR), ValueError, "ids"),
    ("forward alibi huge T", lambda: ALIBI(FAR), ValueError, "ids"),
    ("generate n_new huge", lambda: ml.generate(LM, IDS, BIG), ValueError, "n_new"),
    ("generate learned past max_seq", lambda: ml.generate(LEARNED, IDS, 5), ValueError, "n_new"),
    ("generate float prompt", lambda: ml.generate(LM, IDS.float(), 2), TypeError, "prompt"),
    ("generate 1-D prompt", lambda: ml.generate(LM, IDS[0], 2), TypeError, "prompt"),
    ("generate use_cache None", lambda: ml.generate(LM, IDS, 2, use_cache=None), TypeError, "use_cache"),
    ("generate n_new None", lambda: ml.generate(LM, IDS, None), TypeError, "n_new"),
    ("generate n_new True", lambda: ml.generate(LM, IDS, True), TypeError, "n_new"),
    ("generate model None", lambda: ml.generate(None, IDS, 2), TypeError, "model"),
    # ---- 第 2 讲的权重 ----
    ("from_lecture02 cfg None", lambda: ml.from_lecture02(L02, None), TypeError, "cfg02"),
    ("from_lecture02 params list", lambda: ml.from_lecture02([], tl.TINY), TypeError, "params"),
    ("from_lecture02 no embed", lambda: ml.from_lecture02(_l02(embed=None), tl.TINY), ValueError, "embed"),
    ("from_lecture02 wq shape", lambda: ml.from_lecture02(_l02(**{"layers.0.wq": np.zeros((3, 3))}), tl.TINY),
     ValueError, "wq"),
    ("from_lecture02 few layers", lambda: ml.from_lecture02(dict(L02, layers=L02["layers"][:1]), tl.TINY), ValueError,
     "layers"),
    ("from_lecture02 nan embed", lambda: ml.from_lecture02(_l02(embed=np.full_like(L02["embed"], np.nan)), tl.TINY),
     ValueError, "embed"),
    ("from_lecture02 int w_up", lambda: ml.from_lecture02(
        _l02(**{"layers.1.w_up": L02["layers"][1]["w_up"].astype(np.int64)}), tl.TINY), ValueError, "w_up"),
    ("expand_kv_heads None", lambda: ml.expand_kv_heads(None), TypeError, "model"),
    # ---- 合成语言 ----
    ("language n_letters huge", lambda: ml.ChunkCopyLanguage(n_letters=10 ** 7), ValueError, "n_letters"),
    ("language seed 'x'", lambda: ml.ChunkCopyLanguage(seed="x"), TypeError, "seed"),
    ("language seed 1.0", lambda: ml.ChunkCopyLanguage(seed=1.0), TypeError, "seed"),
    ("language p_copy nan", lambda: ml.ChunkCopyLanguage(p_copy=float("nan")), ValueError, "p_copy"),
    ("language n_succ>n_letters", lambda: ml.ChunkCopyLanguage(n_letters=4, n_succ=5), ValueError, "n_succ"),
    ("language max_back=0", lambda: ml.ChunkCopyLanguage(max_back=0), ValueError, "max_back"),
    ("language chunk str", lambda: ml.ChunkCopyLanguage(chunk="8"), TypeError, "chunk"),
    ("sample huge", lambda: LANG.sample(10 ** 6, 10 ** 6, 0), ValueError, "length"),
    ("sample seed 'x'", lambda: LANG.sample(2, 8, "x"), TypeError, "seed"),
    ("sample n True", lambda: LANG.sample(True, 8, 0), TypeError, "n"),
    ("token_kinds float", lambda: LANG.token_kinds(TOK.float()), TypeError, "tokens"),
    ("token_kinds 1-D", lambda: LANG.token_kinds(TOK[0]), TypeError, "tokens"),
    ("token_kinds OOV", lambda: LANG.token_kinds(TOK + LANG.vocab), ValueError, "tokens"),
    ("token_kinds negative", lambda: LANG.token_kinds(TOK - 100), ValueError, "tokens"),
    # ---- 训练与评估 ----
    ("TrainConfig seed 2**64", lambda: ml.TrainConfig(seed=2 ** 64), ValueError, "seed"),
    ("TrainConfig seed 'x'", lambda: ml.TrainConfig(seed="x"), TypeError, "seed"),
    ("TrainConfig warmup 1.5", lambda: ml.TrainConfig(warmup=1.5), TypeError, "warmup"),
    ("TrainConfig min_lr_frac<0", lambda: ml.TrainConfig(min_lr_frac=-0.1), ValueError, "min_lr_frac"),
    ("TrainConfig lr inf", lambda: ml.TrainConfig(lr=float("inf")), ValueError, "lr"),
    ("TrainConfig eval_batches True", lambda: ml.TrainConfig(eval_batches=True), TypeError, "eval_batches"),
    ("lr_at step=-1", lambda: ml.lr_at(-1, TC), ValueError, "step"),
    ("lr_at step str", lambda: ml.lr_at("3", TC), TypeError, "step"),
    ("lr_at step 2.5", lambda: ml.lr_at(2.5, TC), TypeError, "step"),
    ("lr_at tc dict", lambda: ml.lr_at(0, {"lr": 1e-3}), TypeError, "tc"),
    ("lr_at tc None", lambda: ml.lr_at(0, None), TypeError, "tc"),
    ("make_optimizer model None", lambda: ml.make_optimizer(None, TC), TypeError, "model"),
    ("make_optimizer tc dict", lambda: ml.make_optimizer(LM, {}), TypeError, "tc"),
    ("lm_loss float tokens", lambda: ml.lm_loss(LM, TOK.float()), TypeError, "tokens"),
    ("lm_loss T=1", lambda: ml.lm_loss(LM, TOK[:, :1]), ValueError, "tokens"),
    ("lm_loss OOV", lambda: ml.lm_loss(LM, TOK + 19), ValueError, "tokens"),
    ("lm_loss model None", lambda: ml.lm_loss(None, TOK), TypeError, "model"),
    ("lm_loss 1-D", lambda: ml.lm_loss(LM, TOK[0]), TypeError, "tokens"),
    ("lm_loss learned past max_seq", lambda: ml.lm_loss(LEARNED, TOK % 19), ValueError, "max_seq"),
    ("evaluate seed=-1", lambda: ml.evaluate(ml.ModernLM(ml.MODERN), LANG, 8, seed=-1), ValueError, "seed"),
    ("evaluate huge batch×seq", lambda: ml.evaluate(ml.ModernLM(ml.MODERN), LANG, 10 ** 6, batch=10 ** 6), ValueError,
     "batch"),
    ("evaluate seq str", lambda: ml.evaluate(ml.ModernLM(ml.MODERN), LANG, "64"), TypeError, "seq"),
    ("loss_by_position huge", lambda: ml.loss_by_position(ml.ModernLM(ml.MODERN), LANG, 10 ** 6, batch=10 ** 5),
     ValueError, "seq"),
    ("loss_breakdown seed 'x'", lambda: ml.loss_breakdown(ml.ModernLM(ml.MODERN), LANG, 8, seed="x"), TypeError,
     "seed"),
    ("loss_by_position model None", lambda: ml.loss_by_position(None, LANG, 8), TypeError, "model"),
    ("train_model resume_path int", lambda: ml.train_model(ml.MODERN, TC, LANG, progress=False, resume_path=3),
     TypeError, "resume_path"),
    ("train_model log None", lambda: ml.train_model(ml.MODERN, TC, LANG, progress=False, log=None), TypeError, "log"),
    ("train_model desc int", lambda: ml.train_model(ml.MODERN, TC, LANG, progress=False, desc=3), TypeError, "desc"),
    ("train_model lang None", lambda: ml.train_model(ml.MODERN, TC, None, progress=False), TypeError, "lang"),
    ("train_model huge batch×seq", lambda: ml.train_model(ml.MODERN, ml.TrainConfig(batch=10 ** 6, seq=10 ** 6), LANG,
                                                          progress=False), ValueError, "batch"),
    ("train_model huge cfg", lambda: ml.train_model(ml.config_like(ml.MODERN, d_model=10 ** 8), TC, LANG,
                                                    progress=False), ValueError, "d_model"),
    ("train_config name None", lambda: ml.train_config(None), ValueError, "name"),
]


@params([Case(*c) for c in BAD])
def test_bad_input_names_the_argument(case):
    check_case(case)   # 异常类型对、消息里写出参数名（整词）


def test_cases_are_many_and_distinct():
    assert len(BAD) >= 100


def test_memory_errors_say_how_many_bytes():
    for call in (lambda: ml.RMSNorm(BIG), lambda: ml.generate(LM, IDS, BIG), lambda: WIN(FAR)):
        with pytest.raises(ValueError) as info:
            call()
        assert "字节" in str(info.value) and "本机内存" in str(info.value)


# ---------------------------------------------------------------------------------------------------------------
# 合法的边界输入：答案对
# ---------------------------------------------------------------------------------------------------------------
def test_rmsnorm_d1_matches_formula():
    x = _r(3, 1)
    got = ml.RMSNorm(1, eps=1e-3).double()(x)
    assert torch.allclose(got, x / torch.sqrt(x ** 2 + 1e-3), rtol=0, atol=1e-15)


def test_make_norm_layer_matches_layernorm():
    x = _r(4, 6)
    got = ml.make_norm("layer", 6, eps=1e-6).double()(x)
    want = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-6)
    assert (got - want).abs().max() < 1e-12


def test_generate_zero_new_tokens():
    ids, steps = ml.generate(LM, IDS, 0)
    assert torch.equal(ids, IDS) and steps == []


def test_generate_learned_to_the_last_row():
    P = IDS.shape[1]
    n = LEARNED.cfg.max_seq - P + 1               # 最后一步读满 max_seq 个位置：合法
    model = copy.deepcopy(LEARNED).double()
    a, la = ml.generate(model, IDS, n, use_cache=True)
    b, lb = ml.generate(model, IDS, n, use_cache=False)
    assert a.shape == (2, P + n) and torch.equal(a, b)
    assert max((x - y).abs().max().item() for x, y in zip(la, lb)) < 1e-12


def test_sinusoidal_table_empty_and_values():
    assert ml.sinusoidal_table(0, 6).shape == (0, 6)
    tab = ml.sinusoidal_table(5, 4).double()
    p = torch.arange(5, dtype=F64)[:, None]
    freq = 10000.0 ** (-torch.arange(2, dtype=F64) * 2 / 4)
    want = torch.stack((torch.sin(p * freq), torch.cos(p * freq)), -1).flatten(-2)
    assert (tab - want).abs().max() < 1e-6


def test_attn_bias_window1_is_diagonal():
    b = ml.attn_bias(torch.arange(3, 8), torch.arange(0, 8), window=1)
    want = torch.full((5, 8), float("-inf"))
    want[torch.arange(5), torch.arange(3, 8)] = 0.0
    assert torch.equal(b, want)


def test_lr_at_past_the_end_and_warmup0():
    tc = ml.TrainConfig(steps=10, warmup=0, lr=2e-3, min_lr_frac=0.25)
    assert ml.lr_at(0, tc) == pytest.approx(2e-3)
    assert ml.lr_at(10, tc) == ml.lr_at(10 ** 6, tc) == pytest.approx(2e-3 * 0.25)


def test_token_kinds_one_column_is_empty():
    assert LANG.token_kinds(TOK[:, :1]).shape == (2, 0)


def test_lm_loss_matches_explicit_cross_entropy():
    tok = TOK[:, :6] % 19
    with torch.no_grad():
        logits = LM(tok[:, :-1])
    logp = torch.log_softmax(logits.double(), -1)
    want = -logp.gather(-1, tok[:, 1:, None]).mean()
    assert abs(ml.lm_loss(LM, tok).item() - want.item()) < 1e-5


def test_attention_forward_with_cache_equals_without():
    cfg = ml.config_like(TINY, window=3)
    attn = ml.Attention(cfg).double()
    x = _r(2, 7, 24)
    full = attn(x)
    cache = ml.KVCache(cfg)
    parts = [attn(x[:, :4], 0, cache, 0), attn(x[:, 4:], 4, cache, 0)]
    assert (torch.cat(parts, 1) - full).abs().max() < 1e-12


def test_lecture02_seed_compatible_types_still_load():
    m = ml.from_lecture02(L02, tl.TINY)
    ids = np.random.default_rng(2).integers(0, tl.TINY.vocab, size=(1, 7))
    assert np.abs(m(torch.from_numpy(ids)).detach().numpy() - tl.forward(L02, tl.TINY, ids)).max() < 1e-10


# ---------------------------------------------------------------------------------------------------------------
# 定律（hypothesis）
# ---------------------------------------------------------------------------------------------------------------
@settings(deadline=None, max_examples=8, derandomize=True)
@given(pos=st.sampled_from(["rope", "alibi", "learned", "sinusoidal", "none"]), window=st.integers(0, 5),
       kv=st.sampled_from([1, 2, 4]), P=st.integers(1, 6), n_new=st.integers(0, 6), seed=st.integers(0, 10 ** 6))
def test_cached_generation_equals_uncached(pos, window, kv, P, n_new, seed):
    cfg = ml.LMConfig(vocab=13, d_model=16, n_layers=2, n_heads=4, n_kv_heads=kv, d_head=4, d_ff=12, max_seq=16,
                      pos=pos, window=window)
    torch.manual_seed(seed)
    model = ml.ModernLM(cfg).double()
    prompt = torch.randint(0, 13, (2, P), generator=generator(seed))
    a, la = ml.generate(model, prompt, n_new, use_cache=True)
    b, lb = ml.generate(model, prompt, n_new, use_cache=False)
    assert torch.equal(a, b)
    assert all((x - y).abs().max() < 1e-10 for x, y in zip(la, lb))


@settings(deadline=None, max_examples=10, derandomize=True)
@given(half=st.integers(1, 9), T=st.integers(1, 12), base=st.floats(2.0, 1e6), start=st.integers(0, 10 ** 5),
       seed=st.integers(0, 10 ** 6))
def test_rope_preserves_pair_norms(half, T, base, start, seed):
    dim = 2 * half
    x = _r(3, T, dim, seed=seed)
    cos, sin = ml.rope_angles(torch.arange(start, start + T, dtype=F64), dim, base)
    yh = ml.apply_rope_half(x, cos, sin)
    pair_h = lambda t: t[..., :half] ** 2 + t[..., half:] ** 2          # noqa: E731
    assert (pair_h(yh) - pair_h(x)).abs().max() < 1e-12
    yi = ml.apply_rope_interleaved(x, cos, sin)
    pair_i = lambda t: t[..., 0::2] ** 2 + t[..., 1::2] ** 2           # noqa: E731
    assert (pair_i(yi) - pair_i(x)).abs().max() < 1e-12
    assert math.isfinite(float(yh.abs().max()))
