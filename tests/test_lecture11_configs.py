"""triton_flash 的配置检查（check_configs）、可复现检查的规则和 gluon 分派规则：CPU 上用 Triton 解释器。

GPU 上 check_configs 逐个强制启动 autotune 可能选中的每个配置；这里用解释器的小块配置证明这个检查本身会失败：
一个算错的配置、一个两次结果不同的配置、一个漏写元素的配置都被它抓到，并且消息里点名那个配置。
"""
import os
import types

import pytest
import torch

from labload import ROOT
from triton_interp import load_triton_flash

tf = load_triton_flash()
pytestmark = pytest.mark.usefixtures("triton_interpret")

F32 = torch.float32
SMALL = {"dkdv": [(16, 16, 4, 1), (32, 16, 4, 1)], "dq": [(16, 16, 4, 1)]}
ATOL = 1e-4              # fp32 解释器对 float64 参考：PyTorch 自己的 fp32 误差太小，2× 它不是有意义的上限


def _cases(seed=5):
    gen = torch.Generator().manual_seed(seed)
    return [tf.make_case("causal 13x29 GQA2", 1, 13, 29, 2, 1, 16, F32, "cpu", gen, causal=True),
            tf.make_case("causal 31x7 d=24", 1, 31, 7, 2, 2, 24, F32, "cpu", gen, causal=True)]


def _check(run=None, configs=SMALL):
    return tf.check_configs(seed=1, configs=configs, cases=_cases(), run=run, atol=ATOL, verbose=False)


def test_check_configs_passes_every_given_config():
    rows = _check()
    seen = {(r[0], r[1]) for r in rows}
    assert seen == {(k, c) for k, cs in SMALL.items() for c in cs}
    assert all(r[-1] for r in rows)
    assert {r[3] for r in rows if r[0] == "dkdv"} == {"dq", "dk", "dv"}


def _broken(bad_cfg, how):
    """run(case, launch) 的替身：强制的配置是 bad_cfg 时按 how 弄坏 dK（其余照常）。"""
    calls = {"n": 0}

    def run(case, launch):
        out = list(tf.run_ours(case, "full", launch))
        if launch.blocks.get("dkdv") == bad_cfg:
            calls["n"] += 1
            dk = out[3].clone()
            if how == "wrong-row":                 # 一行错：范数几乎看不出，最大值看得出
                dk[-1, 0, 0] += 0.05 * float(dk.abs().max())
            elif how == "irreproducible":          # 第二次运行差一个 ulp
                if calls["n"] % 2 == 0:
                    dk[0, 0, 0] = torch.nextafter(dk[0, 0, 0], torch.tensor(1e30, dtype=dk.dtype))
            elif how == "unwritten":
                dk[0, 1, 0] = float("nan")
            out[3] = dk
        return tuple(out)
    return run


@pytest.mark.parametrize("how", ["wrong-row", "irreproducible", "unwritten"])
def test_check_configs_fails_on_a_broken_config(how):
    bad = SMALL["dkdv"][1]
    with pytest.raises(AssertionError, match=r"\('dkdv', \(32, 16, 4, 1\)\)"):
        _check(run=_broken(bad, how))


def test_wrong_row_is_invisible_to_the_relative_error_alone():
    """造的那一行错，相对误差（范数）仍然很小：只有最大绝对误差能抓到它——两个判据都要。"""
    case = _cases()[0]
    bad = SMALL["dkdv"][1]
    ours = _broken(bad, "wrong-row")(case, tf.Launch(blocks={"dkdv": bad}))
    ref = tf.run_reference(case)
    assert tf.field_errors(ours, ref)["dk"] < 0.05
    assert tf._max_abs(ours[3], ref[3]) > 10 * ATOL


def test_reachable_configs_cover_the_tuning_lists_and_the_fixed_configs():
    for kind, configs in tf.TUNE_CONFIGS.items():
        reach = tf.reachable_configs(kind)
        assert [tf.config_tuple(c) for c in configs] == reach[:len(configs)]
        for block_d, dtype in ((256, torch.float16), (64, torch.float32)):
            assert tf._fixed_config(kind, block_d, dtype) in reach or tf.INTERPRET
    with pytest.raises(ValueError, match="kind"):
        tf.reachable_configs("bwd")


def test_no_dkdv_config_pipelines_32_row_q_blocks():
    """H200 上 BLOCK_M = 32 的 dK/dV 配置配多级流水线时 dK 错且不可复现（CHANGELOG）：调优列表和固定配置都不许有。"""
    for kind in ("dkdv", "dkdv_atomic"):
        for bm, _bn, _w, stages in [tf.config_tuple(c) for c in tf.TUNE_CONFIGS[kind]]:
            assert bm >= 64 or stages == 1, (kind, bm, stages)
            assert tf._dkdv_config_safe(bm, _bn, _w, stages)
    assert not tf._dkdv_config_safe(32, 64, 4, 3) and not tf._dkdv_config_safe(32, 128, 4, 2)
    cfgs = [tf._cfg(32, 64, 4, 3), tf._cfg(64, 64, 4, 2), tf._cfg(32, 64, 4, 1)]
    assert [tf.config_tuple(c) for c in tf._prune_dkdv(cfgs, {})] == [(64, 64, 4, 2), (32, 64, 4, 1)]


@pytest.mark.parametrize("kind", ["dkdv", "dkdv_atomic"])
def test_launch_refuses_an_unsafe_dkdv_config(kind):
    with pytest.raises(ValueError, match="num_stages = 1"):
        tf.Launch(blocks={kind: (32, 64, 4, 3)})
    tf.Launch(blocks={kind: (32, 64, 4, 1), "dq": (32, 64, 4, 3)})          # 安全的、别的内核的：照收


class _FakeCuda:
    """gluon_route 只看形状、dtype、是否连续、是否在 GPU 上：CPU 张量装成 GPU 张量来检查规则。"""
    def __init__(self, t):
        self._t = t
        self.shape, self.dtype, self.is_cuda, self.device = t.shape, t.dtype, True, "cuda:0"

    def is_contiguous(self):
        return self._t.is_contiguous()


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(tf, "INTERPRET", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    sentinel = types.SimpleNamespace(name="gluon")
    monkeypatch.setattr(tf, "_gluon_module", lambda: sentinel)
    return sentinel


def _opts(**kw):
    base = dict(scale=0.1, window=(-1, 0), dropout_p=0.0, seed=0, slopes=None, bias=None, return_lse=False,
                launch=tf.DEFAULT_LAUNCH, deterministic=False, softcap=0.0)
    base.update(kw)
    return types.SimpleNamespace(**base)


def _qkv(b=4, n=2048, h=8, hk=8, d=128, dtype=torch.bfloat16, nk=None):
    q = torch.empty(b, n, h, d, dtype=dtype)
    k = torch.empty(b, n if nk is None else nk, hk, d, dtype=dtype)
    return _FakeCuda(q), _FakeCuda(k), _FakeCuda(k.clone())


def test_gluon_route_takes_the_calls_it_supports(hopper):
    assert tf.gluon_route(*_qkv(), _opts(), grad=True) is hopper
    assert tf.gluon_route(*_qkv(d=64, hk=2), _opts(window=(-1, -1)), grad=False) is hopper


@pytest.mark.parametrize("change", [
    dict(qkv=dict(d=96)), dict(qkv=dict(nk=2047)), dict(qkv=dict(n=512)), dict(qkv=dict(b=1, h=1)),
    dict(qkv=dict(dtype=torch.float32)), dict(opts=dict(window=(128, 0))), dict(opts=dict(dropout_p=0.1)),
    dict(opts=dict(slopes=object())), dict(opts=dict(bias=object())), dict(opts=dict(softcap=5.0)),
    dict(opts=dict(launch=tf.Launch(gluon=False))), dict(opts=dict(deterministic=True), grad=True),
])
def test_gluon_route_refuses_what_gluon_lacks(hopper, change):
    grad = change.get("grad", False)
    assert tf.gluon_route(*_qkv(**change.get("qkv", {})), _opts(**change.get("opts", {})), grad=grad) is None


def test_gluon_route_deterministic_without_grad_is_fine(hopper):
    """deterministic 只约束梯度：不求梯度时 gluon 的前向（逐位可复现）照常接手。"""
    assert tf.gluon_route(*_qkv(), _opts(deterministic=True), grad=False) is hopper


def test_gluon_route_is_never_taken_on_cpu_or_in_the_interpreter():
    q = torch.randn(2, 1024, 8, 128)
    opts = tf._check_dense(q, q, q, 0.0, None, True, None, None, (-1, -1), False, None, False, False, None)
    assert tf.gluon_route(q, q, q, opts, grad=False) is None


@pytest.mark.parametrize("field", ["autotune", "poison", "tma", "gluon"])
def test_launch_flags_must_be_bools(field):
    with pytest.raises((TypeError, ValueError), match=field):
        tf.Launch(**{field: "yes"})


@pytest.mark.parametrize("causal, return_lse", [(True, False), (False, True)])
def test_flash_attn_func_hands_routed_calls_to_gluon(monkeypatch, causal, return_lse):
    """gluon_route 说交给 gluon 时，flash_attn_func 调用 gluon_flash.attention（causal、scale、return_lse 对上）。"""
    calls = []

    def attention(q, k, v, causal=False, softmax_scale=None, return_lse=False):
        calls.append((causal, softmax_scale, return_lse))
        return ("gluon-out", "gluon-lse") if return_lse else "gluon-out"

    fake = types.SimpleNamespace(attention=attention)
    seen = []
    monkeypatch.setattr(tf, "gluon_route", lambda q, k, v, opts, grad: seen.append((opts.window, grad)) or fake)
    q = torch.randn(1, 8, 2, 16, requires_grad=True)
    out = tf.flash_attn_func(q, q, q, causal=causal, softmax_scale=0.3, return_lse=return_lse)
    assert out == (("gluon-out", "gluon-lse") if return_lse else "gluon-out")
    assert calls == [(causal, 0.3, return_lse)]
    assert seen == [((-1, 0) if causal else (-1, -1), True)]


def test_gluon_route_threshold_follows_the_committed_bench():
    """gluon_route 的门槛只放行量过、gluon 不慢（最多 1%）的形状：由 06 提交的 JSON 现算每个形状 gluon / ours。"""
    import json
    with open(os.path.join(ROOT, "lecture11", "bench", "results", "triton_bench.json"), encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    ms = {(r["provider"], r["mode"], r["causal"], r["d"], r["N"]): r["ms"] for r in rows}
    shapes = {k[1:] for k in ms if k[0] == "gluon" and k[4] >= tf.GLUON_MIN_N}
    assert len(shapes) == 24 and {d for _, _, d, _ in shapes} == {64, 128}
    ratios = {s: ms[("ours", *s)] / ms[("gluon", *s)] for s in shapes}      # > 1：gluon 更快
    print(sorted(ratios.items(), key=lambda x: x[1])[:3])
    assert min(ratios.values()) >= 0.99
    assert min(n for _, _, _, n in shapes) == tf.GLUON_MIN_N                 # 门槛就是量过的最短长度
