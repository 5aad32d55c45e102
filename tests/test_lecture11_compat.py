"""lecture11/flash_attn_compat.py（flash-attn 2 接口 → triton_flash）和 lecture11/bench/flash_attn_suite.py
（拿 flash-attn 自己的测试跑我们的内核）的 CPU 测试。

兼容层：每个不支持的特性抛带标签的 NotImplementedError、feature_of 认得它；参数映射（用替身记下传给我们函数的参数）；
打包输入、return_attn_probs、flash_attn_with_kvcache 在 Triton 解释器里（fp32、小尺寸）和直接调我们的函数 /
float64 参考比较。运行器：插件的抽样（确定、每个函数固定个数、xdist 进程之间一致）、NotImplementedError → 按标签计数
的跳过、假 flash_attn 包、--collect-only，全部用 tmp_path 里生成的测试文件（CI 里没有 flash-attn checkout）。
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from labload import ROOT, load_lab
from triton_interp import load_triton_flash

tf = load_triton_flash()
fac = load_lab("lecture11", "flash_attn_compat")
suite = load_lab("lecture11/bench", "flash_attn_suite")
pytestmark = pytest.mark.usefixtures("triton_interpret")   # 每个测试运行期间打开解释器（conftest.py）

F32 = torch.float32
TOL = tf.CPU_TOL
SUITE = os.path.join(ROOT, "lecture11", "bench", "flash_attn_suite.py")


def _rand(gen, *shape, grad=False):
    return torch.randn(*shape, generator=gen, dtype=F32).requires_grad_(grad)


# ============================================================================
# 不支持的特性：NotImplementedError + 标签
# ============================================================================
def _kv_case(gen, n=1, batch=2, s_max=24, hq=4, hk=2, d=16):
    q = _rand(gen, batch, n, hq, d)
    kc, vc = _rand(gen, batch, s_max, hk, d), _rand(gen, batch, s_max, hk, d)
    return q, kc, vc, torch.tensor([9, s_max], dtype=torch.int32)[:batch]


def _refusal_calls(gen):
    """(标签, 调用)：每个调用只用到一个不支持的特性；都在调我们的内核之前就抛。"""
    q, kc, vc, lens = _kv_case(gen)
    kv = dict(q=q, k_cache=kc, v_cache=vc, cache_seqlens=lens)
    new = _rand(gen, 2, 1, 2, 16)
    cos = torch.ones(24, 8)
    qp, cu = _rand(gen, 8, 2, 16), torch.tensor([0, 8], dtype=torch.int32)
    calls = [
        ("kvcache-append", lambda: fac.flash_attn_with_kvcache(**kv, k=new, v=new)),
        ("kvcache-rotary", lambda: fac.flash_attn_with_kvcache(**kv, rotary_cos=cos, rotary_sin=cos)),
        ("cache-batch-idx", lambda: fac.flash_attn_with_kvcache(**kv, cache_batch_idx=torch.tensor([1, 0]))),
        ("cache-leftpad", lambda: fac.flash_attn_with_kvcache(**kv, cache_leftpad=torch.tensor([0, 1]))),
        ("paged-kv", lambda: fac.flash_attn_with_kvcache(**kv, block_table=torch.zeros(2, 1, dtype=torch.int32))),
        ("paged-kv", lambda: fac.flash_attn_varlen_func(qp, qp, qp, cu, cu, 8, 8, block_table=cu)),
        ("window-kvcache", lambda: fac.flash_attn_with_kvcache(**kv, window_size=torch.tensor([3, 0]))),
        ("alibi-kvcache", lambda: fac.flash_attn_with_kvcache(**kv, alibi_slopes=torch.ones(4))),
        ("kvcache-lse", lambda: fac.flash_attn_with_kvcache(**kv, return_softmax_lse=True)),
    ]
    calls.append(("softcap-kvcache", lambda: fac.flash_attn_with_kvcache(**kv, softcap=30.0)))
    return calls


def test_each_unsupported_feature_raises_with_its_tag(gen):
    seen = set()
    for tag, call in _refusal_calls(gen):
        with pytest.raises(NotImplementedError, match=f"^flash_attn_compat: '{tag}'") as info:
            call()
        assert fac.feature_of(info.value) == tag
        assert suite.tag_of(info.value) == tag               # 运行器的插件认同一个格式
        seen.add(tag)
    # 其余的标签：dropout-probs 见下面的测试，internal-api 由运行器的假包抛（test_fake_package_and_plugin）
    rest = set(fac.UNSUPPORTED_FEATURES) - seen
    assert rest == {"dropout-probs", "internal-api"}, rest


def test_feature_of():
    exc = fac.unsupported("paged-kv", "block_table=")
    assert fac.feature_of(exc) == "paged-kv" and exc.feature == "paged-kv"
    assert fac.feature_of(NotImplementedError(str(exc))) == "paged-kv"     # 只剩消息（如跨进程）也认得
    assert fac.feature_of(NotImplementedError("flash_attn_compat: 'not-a-tag' (x) 不支持")) is None
    assert fac.feature_of(NotImplementedError("return_encoded_softmax=True 不支持")) is None
    assert fac.feature_of(ValueError(str(exc))) is None
    with pytest.raises(ValueError, match="未登记"):
        fac.unsupported("not-a-tag", "x")
    for tag in fac.UNSUPPORTED_FEATURES:
        assert suite.tag_of(NotImplementedError(str(fac.unsupported(tag, "x")))) == tag


def test_dropout_probs_placeholder(gen):
    """dropout > 0 时 out、lse 照常（和直接调我们的函数逐位相同：同一个随机数种子），S_dmask 一用就抛。"""
    q, k = _rand(gen, 1, 12, 2, 16), _rand(gen, 1, 12, 2, 16)
    torch.manual_seed(3)
    out, lse, s_dmask = fac.flash_attn_func(q, k, k, 0.25, return_attn_probs=True)
    torch.manual_seed(3)
    ref_out, ref_lse = tf.flash_attn_func(q, k, k, 0.25, return_lse=True)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    for use in (lambda s: s.shape, lambda s: s >= 0, lambda s: s[0], lambda s: torch.abs(s), lambda s: s.abs()):
        with pytest.raises(NotImplementedError) as info:
            use(s_dmask)
        assert fac.feature_of(info.value) == "dropout-probs"
    assert "dropout-probs" in repr(s_dmask)


# ============================================================================
# 参数映射：替身记下传给我们函数的参数（不跑内核）
# ============================================================================
class _Spy:
    def __init__(self, result=None):
        self.calls, self.result = [], result

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.result if self.result is not None else args[0]


def test_dense_mapping(monkeypatch, gen):
    spy = _Spy()
    monkeypatch.setattr(tf, "flash_attn_func", spy)
    q = _rand(gen, 1, 5, 2, 16)
    fac.flash_attn_func(q, q, q, 0.1, 0.5, True, torch.tensor([3, 2]), 0.0, None, True, False)
    (args, kw), = spy.calls
    assert args[0] is q and kw == dict(dropout_p=0.1, softmax_scale=0.5, causal=True, alibi_slopes=None,
                                       window_size=(3, 2), return_lse=False, deterministic=True, softcap=0.0)
    assert type(kw["window_size"][0]) is int                 # 张量换成 Python int
    for cap, passed in ((30.0, 30.0), (0.0, 0.0), (-1.0, 0.0), (-5, 0.0)):   # flash-attn：softcap ≤ 0 = 不截
        fac.flash_attn_func(q, q, q, softcap=cap)
        assert spy.calls[-1][1]["softcap"] == passed


def test_packed_inputs_are_views(monkeypatch, gen):
    spy = _Spy()
    monkeypatch.setattr(tf, "flash_attn_func", spy)
    qkv, kv, q = _rand(gen, 2, 7, 3, 4, 16), _rand(gen, 2, 9, 2, 2, 16), _rand(gen, 2, 7, 4, 16)
    fac.flash_attn_qkvpacked_func(qkv, causal=True, deterministic=True)
    fac.flash_attn_kvpacked_func(q, kv, window_size=(2, 1))
    (a1, k1), (a2, k2) = spy.calls
    for t, i in zip(a1, range(3)):
        assert t.data_ptr() == qkv[:, :, i].data_ptr() and t.stride() == qkv[:, :, i].stride()    # 视图，没有拷贝
    assert k1["causal"] and k1["deterministic"]
    assert a2[0] is q and a2[1].data_ptr() == kv[:, :, 0].data_ptr() and a2[2].data_ptr() == kv[:, :, 1].data_ptr()
    assert k2["window_size"] == (2, 1)
    vspy = _Spy()
    monkeypatch.setattr(tf, "flash_attn_varlen_func", vspy)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    pqkv = _rand(gen, 7, 3, 2, 16)
    fac.flash_attn_varlen_qkvpacked_func(pqkv, cu, 4, 0.0, None, True)
    args, kw = vspy.calls[-1]
    assert [t.data_ptr() for t in args[:3]] == [pqkv[:, i].data_ptr() for i in range(3)]
    assert args[3] is cu and args[4] is cu and args[5:7] == (4, 4) and kw["causal"]


def test_kvcache_mapping(monkeypatch, gen):
    spy = _Spy()
    monkeypatch.setattr(tf, "flash_decode", spy)
    q, kc, vc, lens = _kv_case(gen, n=3)
    fac.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, num_splits=0, softmax_scale=0.3)
    fac.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=7, causal=True, num_splits=2)
    fac.flash_attn_with_kvcache(q[:, :1], kc, vc, causal=False)
    (a1, k1), (a2, k2), (a3, k3) = spy.calls
    assert a1[0] is q and a1[3] is lens and k1 == dict(num_splits=None, softmax_scale=0.3)
    assert a2[3].dtype == torch.int32 and a2[3].tolist() == [7, 7] and k2["num_splits"] == 2
    assert a3[3].tolist() == [24, 24]                         # cache_seqlens=None：整个缓存
    fac.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, softcap=-1.0)     # ≤ 0 = 不截
    assert spy.calls[-1][0][0] is q and "softcap" not in spy.calls[-1][1]
    spy.calls.clear()
    spy.result = torch.zeros(2, 2 * 3 * 2, 16)                # causal=False、n = 3：折成 [B, Hk·n·R, d]
    out = fac.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)
    assert spy.calls[0][0][0].shape == (2, 12, 16) and out.shape == q.shape


# ============================================================================
# 解释器里真的跑：和直接调我们的函数、float64 参考比
# ============================================================================
def test_qkvpacked_matches_ours(gen):
    """qkvpacked + return_attn_probs：out、lse 和直接调 flash_attn_func 逐位相同，梯度回到打包的 qkv。"""
    qkv = _rand(gen, 2, 19, 3, 2, 16, grad=True)
    out, lse, s_dmask = fac.flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
    q, k, v = (t.detach().clone().requires_grad_() for t in qkv.unbind(2))
    ref_out, ref_lse = tf.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert out.shape == (2, 19, 2, 16) and lse.shape == (2, 2, 19)
    assert s_dmask.numel() == 0 and s_dmask.dtype == qkv.dtype        # flash-attn：dropout = 0 时是空张量
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    g = torch.randn(out.shape, generator=gen)
    out.backward(g)
    ref_out.backward(g)
    assert torch.equal(qkv.grad, torch.stack([q.grad, k.grad, v.grad], 2))


def test_varlen_packed_match_ours(gen):
    cu_q, cu_k = torch.tensor([0, 7, 19], dtype=torch.int32), torch.tensor([0, 10, 15], dtype=torch.int32)
    qkv = _rand(gen, 19, 3, 2, 16, grad=True)
    out, lse, _ = fac.flash_attn_varlen_qkvpacked_func(qkv, cu_q, 12, return_attn_probs=True)
    q, k, v = (t.detach().clone().requires_grad_() for t in qkv.unbind(1))
    ref_out, ref_lse = tf.flash_attn_varlen_func(q, k, v, cu_q, cu_q, 12, 12, return_lse=True)
    assert lse.shape == (2, 19) and torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    g = torch.randn(out.shape, generator=gen)
    out.backward(g)
    ref_out.backward(g)
    assert torch.equal(qkv.grad, torch.stack([q.grad, k.grad, v.grad], 1))
    qg, kv = _rand(gen, 19, 4, 16), _rand(gen, 15, 2, 2, 16)                 # GQA 2
    out = fac.flash_attn_varlen_kvpacked_func(qg, kv, cu_q, cu_k, 12, 10, causal=True)
    assert torch.equal(out, tf.flash_attn_varlen_func(qg, kv[:, 0], kv[:, 1], cu_q, cu_k, 12, 10, causal=True))


def test_kvpacked_window_tensor(gen):
    """kvpacked + GQA + 张量形式的 window_size（flash-attn 测试的写法）= 直接调我们的函数、窗口用 tuple。"""
    q, kv = _rand(gen, 1, 13, 4, 16), _rand(gen, 1, 21, 2, 2, 16)
    out = fac.flash_attn_kvpacked_func(q, kv, window_size=torch.tensor([5, 2]))
    assert torch.equal(out, tf.flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], window_size=(5, 2)))


def _prefix_reference(q, k_cache, v_cache, lengths, causal):
    """每个序列只取有效前缀，float64；causal=False 时每个新 query 看整个前缀。"""
    outs = [tf.reference_attention(q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n], causal=causal)[0]
            for b, n in enumerate(lengths)]
    return torch.cat(outs)


@pytest.mark.parametrize("n, causal", [(1, False), (3, True), (3, False)])
def test_kvcache_matches_reference(gen, n, causal):
    """缓存里有效前缀之外是 NaN（读到就露馅）；参考是每个序列的有效前缀上的 reference_attention（flash-attn 的
    约定：causal 时右下角对齐，不是 flash_decode 自己的 reference_decode），最大绝对误差和相对误差都查。"""
    q, kc, vc, lens = tf.make_decode_case(gen, batch=2, lengths=[9, 24], s_max=24, hq=4, hk=2, d=16, n_new=n)
    q4 = q.unsqueeze(1) if q.dim() == 3 else q                                  # flash-attn 的 q 总是 [B, n, Hq, d]
    out = fac.flash_attn_with_kvcache(q4, kc, vc, cache_seqlens=lens, causal=causal)
    ref = _prefix_reference(q4, kc, vc, lens.tolist(), causal=causal)
    assert out.shape == q4.shape
    err, err_abs = tf._rel_err(out, ref), tf._max_abs(out.double(), ref)
    print(f"n={n} causal={causal} err {err:.1e} max-abs {err_abs:.1e}")
    assert err < TOL and err_abs < TOL


def test_kvcache_lengths_int_and_none(gen):
    q, kc, vc, _ = tf.make_decode_case(gen, batch=2, lengths=[24, 24], s_max=24, hq=2, hk=2, d=16, n_new=2)
    ref = tf.reference_decode(q, kc, vc, torch.tensor([24, 24], dtype=torch.int32))
    for lens in (None, 24):
        assert tf._rel_err(fac.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True), ref) < TOL


# ============================================================================
# 运行器：插件（抽样、按标签计数）、假 flash_attn 包、--collect-only
# ============================================================================
# 合成的 flash-attn 测试文件：GRID 是网格；HEAVY 像真的 test_flash_attn.py 那样在 import 时用假 flash_attn 包、查 GPU，
# 三个特性由假包 / 兼容层抛；LIGHT 不 import torch（跑得快），同样格式的 NotImplementedError 由测试自己抛。
HEAVY = """
import pytest
import torch
from flash_attn import flash_attn_func, flash_attn_with_kvcache  # noqa: F401
from flash_attn.bert_padding import pad_input
from flash_attn.flash_attn_interface import _get_block_size_n, USE_TRITON_ROCM  # noqa: F401
from flash_attn.layers.rotary import apply_rotary_emb

IS_SM90 = torch.cuda.get_device_capability("cuda") == (9, 0)     # 和 flash-attn 的测试文件一样在 import 时查


def _append():
    q = torch.zeros(1, 1, 2, 16)
    flash_attn_with_kvcache(q, q, q, k=q, v=q)                  # 兼容层：'kvcache-append'


def _internal():
    from flash_attn.flash_attn_interface import _flash_attn_varlen_forward
    _flash_attn_varlen_forward(1, 2)                            # 假包的替身：'internal-api'


def _rotary():
    apply_rotary_emb(None, None, None)                          # checkout 里没有 rotary：'kvcache-rotary'
"""
LIGHT = """
import pytest


def pad_input():
    return "pad"


def _append():
    raise NotImplementedError({append!r})


def _internal():
    raise NotImplementedError({internal!r})


def _rotary():
    raise NotImplementedError({rotary!r})
""".format(**{name: str(fac.unsupported(tag, "x")) for name, tag in
              (("append", "kvcache-append"), ("internal", "internal-api"), ("rotary", "kvcache-rotary"))})
GRID = """

@pytest.mark.parametrize("b", ["x", "y", "z"])
@pytest.mark.parametrize("a", range(10))
def test_flash_attn_output(a, b):
    if a == 5:
        _append()
    if a == 6:
        _internal() if b == "x" else _rotary()
    if a == 7:
        raise NotImplementedError("something else")             # 别处的 NotImplementedError：算失败
    if a == 8:
        pytest.skip("own skip")
    assert a != 3, "boom"
    assert pad_input() == "pad"


@pytest.mark.parametrize("c", range(4))
def test_flash_attn_small(c):
    pass


def test_flash_attn_plain():
    pass


def test_flash_attn_unselected():
    raise AssertionError("must not run")


@pytest.mark.parametrize("paged_kv_block_size", [None, 256])
@pytest.mark.parametrize("new_kv", [False, True])
@pytest.mark.parametrize("d", [32, 59, 64])
def test_flash_attn_kvcache(d, new_kv, paged_kv_block_size):
    assert not new_kv and paged_kv_block_size is None, "a prefiltered point ran"
"""
SELECTED = "test_flash_attn_output,test_flash_attn_small,test_flash_attn_plain"
GRID_IDS = [f"tests/test_flash_attn.py::test_flash_attn_output[{a}-{b}]" for a in range(10) for b in "xyz"]


def _make_checkout(root, header):
    """一个假的 flash-attn checkout：tests/test_flash_attn.py（合成文件）、flash_attn/bert_padding.py、COMMIT。"""
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test_flash_attn.py").write_text(header + GRID, encoding="utf-8")
    (root / "flash_attn").mkdir()
    (root / "flash_attn" / "bert_padding.py").write_text("def pad_input():\n    return 'pad'\n", encoding="utf-8")
    # 真的 flash_attn/__init__.py 会 import 编译好的 CUDA 扩展：测试绝不能 import 到它
    (root / "flash_attn" / "__init__.py").write_text(
        "from pkgutil import extend_path\n__path__ = extend_path(__path__, __name__)\n__version__ = '2.8.4'\n"
        "raise ImportError('the real flash_attn package was imported')\n", encoding="utf-8")
    (root / "COMMIT").write_text("0123abcd\n", encoding="utf-8")
    return root


@pytest.fixture
def light(tmp_path):
    return _make_checkout(tmp_path / "light", LIGHT)


@pytest.fixture
def heavy(tmp_path):
    return _make_checkout(tmp_path / "heavy", HEAVY)


def _run_plugin(checkout, tmp_path, name, workers=0, seed=5, per_test=12, deadline=0.0, tests=None):
    """运行器的那条 pytest 命令（假包 + 插件），在 CPU 上跑；返回插件写出的逐项记录。"""
    pkg = tmp_path / f"pkg_{name}"
    suite.write_fake_package(str(pkg), str(checkout))
    record = tmp_path / f"{name}.json"
    argv = ["--flash-attn", str(checkout), "--per-test", str(per_test), "--tests", tests or SELECTED,
            "-n", str(workers)]
    if checkout.name == "heavy":          # import 时查 GPU 的那个文件：CPU 上给一个假的 compute capability
        argv.append("--pytest-arg=--fa-capability=9,0")
    cmd = suite.build_pytest_command(str(checkout), str(pkg), str(record), suite.parse_args(argv), seed, deadline)
    proc = suite.spawn_pytest(cmd, str(pkg), str(tmp_path / "triton_cache"), capture_output=True, text=True,
                              timeout=240)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    assert proc.returncode in (0, 1), proc.returncode
    return json.loads(record.read_text(encoding="utf-8"))


def _expected(nodeid):
    a = int(nodeid.split("[")[1].split("-")[0]) if "test_flash_attn_output[" in nodeid else -1
    b = nodeid.split("-")[-1].rstrip("]") if a >= 0 else None
    if a == 5:
        return "unsupported", "kvcache-append"
    if a == 6:
        return "unsupported", "internal-api" if b == "x" else "kvcache-rotary"
    if a in (3, 7):
        return "failed", None
    if a == 8:
        return "skipped", None
    return "passed", None


def _check_outcomes(raw, per_test=12):
    assert raw["grid"] == {"test_flash_attn_output": 30, "test_flash_attn_small": 4, "test_flash_attn_plain": 1}
    assert raw["kept"]["test_flash_attn_output"] == sorted(suite.sample_ids(GRID_IDS, per_test, 5,
                                                                            "test_flash_attn_output"))
    assert len(raw["kept"]["test_flash_attn_small"]) == 4 and len(raw["kept"]["test_flash_attn_plain"]) == 1
    kept = [nid for v in raw["kept"].values() for nid in v]
    assert sorted(raw["results"]) == sorted(kept)             # 只跑了抽到的；没选的函数一个也没跑
    for nid in kept:
        outcome, tag = _expected(nid)
        rec = raw["results"][nid]
        assert rec["outcome"] == outcome and rec.get("feature") == tag, (nid, rec)
        if outcome == "failed":
            assert rec["where"].startswith("test_flash_attn.py:"), rec       # 测试文件里的那一行
            assert rec["message"] in ("AssertionError: boom", "NotImplementedError: something else") \
                or rec["message"].startswith("AssertionError: boom"), rec


def test_plugin_samples_and_counts_tags(light, tmp_path):
    """抽样确定（= sample_ids 对排好序的 node id）、每个函数固定个数；兼容层格式的 NotImplementedError → 按标签计数；
    两个 xdist 进程抽到的、每一项的结果都和单进程一样；换个种子就换一份抽样。"""
    raw = _run_plugin(light, tmp_path, "serial", per_test=20)
    _check_outcomes(raw, per_test=20)
    per = suite.summarize(raw, SELECTED.split(","))
    row = per["test_flash_attn_output"]
    assert row["sampled"] == 20 == row["passed"] + len(row["failed"]) + sum(row["unsupported"].values()) \
        + sum(row["skipped"].values())
    text = suite.render_markdown(dict(meta=dict(seed=5, per_test=20, flash_attn=suite.checkout_info(str(light))),
                                      tests=per))
    assert "0123abcd" in text and "test (test_flash_attn_*)" in text
    raw2 = _run_plugin(light, tmp_path, "xdist", workers=2, per_test=20)
    assert raw2["workers_agree"] and raw2["kept"] == raw["kept"] and raw2["grid"] == raw["grid"]
    assert {k: v["outcome"] for k, v in raw2["results"].items()} == {k: v["outcome"] for k, v in raw["results"].items()}
    assert suite.sample_ids(GRID_IDS, 12, 6, "x") != suite.sample_ids(GRID_IDS, 12, 5, "x")


def test_fake_package(heavy, tmp_path):
    """像真的测试文件：import 时用假 flash_attn 包、查 compute capability；三个标签由假包和兼容层抛。"""
    _check_outcomes(_run_plugin(heavy, tmp_path, "heavy", per_test=30), per_test=30)


def test_plugin_deadline(light, tmp_path):
    raw = _run_plugin(light, tmp_path, "late", per_test=3, deadline=1.0)
    assert raw["results"] and {r["outcome"] for r in raw["results"].values()} == {"not-run"}
    assert suite.summarize(raw, SELECTED.split(","))["test_flash_attn_output"]["not_run"] == 3


def test_runner_collect_only(heavy):
    proc = subprocess.run([sys.executable, SUITE, "--flash-attn", str(heavy), "--collect-only", "--seed", "9",
                           "--per-test", "7", "--tests", SELECTED + ",test_flash_attn_missing"],
                          capture_output=True, text=True, timeout=240)
    print(proc.stdout, proc.stderr[-2000:])
    assert proc.returncode == 0
    rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()
            if line.startswith(("test_", "total"))}
    assert rows["test_flash_attn_output"] == ["30", "0", "7"] and rows["test_flash_attn_small"] == ["4", "0", "4"]
    assert rows["test_flash_attn_missing"] == ["0", "0", "0"] and rows["total"] == ["35", "0", "12"]
    assert "seed 9" in proc.stdout


def test_prefilter_counts_points_that_need_a_missing_feature(light, tmp_path):
    """kvcache 的网格点里参数就要分页 KV / 追加的：按特性计数、不抽、不跑；其余照常抽样、运行。"""
    raw = _run_plugin(light, tmp_path, "pre", per_test=2, tests="test_flash_attn_kvcache")
    assert raw["grid"]["test_flash_attn_kvcache"] == 12
    assert raw["prefiltered"]["test_flash_attn_kvcache"] == {"paged-kv": 6, "kvcache-append": 3}
    kept = raw["kept"]["test_flash_attn_kvcache"]
    assert len(kept) == 2 and all(raw["results"][nid]["outcome"] == "passed" for nid in kept)
    row = suite.summarize(raw, ["test_flash_attn_kvcache"])["test_flash_attn_kvcache"]
    assert row["prefiltered"] == {"paged-kv": 6, "kvcache-append": 3} and row["passed"] == 2
    assert suite.needs_feature("test_flash_attn_kvcache", {"paged_kv_block_size": None, "new_kv": False}) is None
    assert suite.needs_feature("test_flash_attn_output", {"paged_kv_block_size": 256}) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="有 GPU 时运行器真的会跑")
def test_runner_without_gpu_skips(light):
    proc = subprocess.run([sys.executable, SUITE, "--flash-attn", str(light)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 77 and proc.stdout.strip().startswith("SKIP:") and len(proc.stdout.splitlines()) == 1


def test_runner_summary(tmp_path):
    proc = subprocess.run([sys.executable, SUITE, "--summary", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 77 and proc.stdout.startswith("SKIP:")
    per = {"test_flash_attn_causal": dict(grid=960, sampled=2, passed=1, unsupported={}, skipped={}, not_run=0,
                                          missing=0, seconds=3.0,
                                          failed=[dict(nodeid="t.py::test_flash_attn_causal[1]", error="AssertionError",
                                                       where="t.py:9", phase="call", stdout_tail=[])])}
    meta = dict(seed=1, per_test=2, flash_attn=dict(commit="abc", version="2.8"), gpu="H200", torch="2", triton="3",
                workers=4, wall_s=10.0, date="2026-01-01")
    (tmp_path / suite.JSON_NAME).write_text(json.dumps(dict(meta=meta, tests=per)), encoding="utf-8")
    proc = subprocess.run([sys.executable, SUITE, "--replot", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "causal" in proc.stdout and "AssertionError" in proc.stdout
    assert (tmp_path / suite.MD_NAME).read_text(encoding="utf-8") == proc.stdout[:-1]


def _fake_raw(tests, not_run=()):
    """插件记录的样子：每个函数 2 个网格点，一个通过、一个失败；not_run 里的函数两个都没跑到。"""
    raw = dict(grid={}, kept={}, results={}, workers_agree=True)
    for func in tests:
        ids = [f"tests/test_flash_attn.py::{func}[{i}]" for i in range(2)]
        raw["grid"][func], raw["kept"][func] = 9, ids
        outs = ["not-run"] * 2 if func in not_run else ["passed", "failed"]
        for nid, out in zip(ids, outs):
            raw["results"][nid] = dict(outcome=out, message="AssertionError: x", where="test_flash_attn.py:1")
    return raw


def test_runner_writes_and_resumes(light, tmp_path, monkeypatch):
    """main 写 JSON / .md；--resume 沿用种子，只重跑没跑完的函数，其余的行原样留下；有失败的网格点时退出码 1。
    （GPU 和 pytest 换成替身。）"""
    calls = []

    def fake_run(args, checkout, seed, tests):
        calls.append((seed, list(tests)))
        return 1, _fake_raw(tests, not_run={"test_flash_attn_small"} if len(calls) == 1 else ()), 2.0

    monkeypatch.setattr(suite, "_need_gpu", lambda: None)
    monkeypatch.setattr(suite, "run_suite", fake_run)
    out = tmp_path / "out"
    base = ["--flash-attn", str(light), "--out", str(out), "--tests", SELECTED, "--per-test", "2"]
    assert suite.main(base + ["--seed", "4"]) == 1                       # 替身里每个函数都有一个失败
    first = json.loads((out / suite.JSON_NAME).read_text(encoding="utf-8"))
    assert first["meta"]["seed"] == 4 and first["meta"]["flash_attn"]["commit"] == "0123abcd"
    assert first["tests"]["test_flash_attn_small"]["not_run"] == 2
    assert first["tests"]["test_flash_attn_output"]["passed"] == 1
    assert suite.main(base + ["--resume"]) == 1
    assert calls[-1] == (4, ["test_flash_attn_small"])
    second = json.loads((out / suite.JSON_NAME).read_text(encoding="utf-8"))
    assert second["meta"]["runs"] == 2 and second["meta"]["wall_s"] == 4.0
    assert second["tests"]["test_flash_attn_small"]["not_run"] == 0
    assert second["tests"]["test_flash_attn_output"] == first["tests"]["test_flash_attn_output"]
    assert (out / suite.MD_NAME).read_text(encoding="utf-8").startswith("# flash-attn tests")
    assert suite.main(base + ["--resume", "--per-test", "3"]) == 1       # 每函数个数变了：不接着跑
    assert calls[-1][1] == SELECTED.split(",")
