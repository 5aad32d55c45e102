"""lecture19/long_lab.py 的单元测试与性质测试。

_selftest() 和演示的 --quick 由 test_harness.py 在子进程里跑，这里不重复；这里测：
环形注意力（模拟）在随机形状、两种切法、因果与否、随机 P 上 = 整条序列的注意力（float64）；
真的 torch.distributed 环形注意力（2 个进程、gloo）= 整条序列的注意力，发送量 = RingLedger；
时间线的算术（被盖住的长度、每轮汇总）在合成区间上的性质，记录器（RingEvents）在 gloo 上不改变输出；
工作台 bench/ring_multi_gpu.py 的块函数（aten / Triton 的布局换算 / 显式核）和时间线的汇总、合并、报告、
画图（合成数据）；
掩码按定义逐项核对；任务的不变量；提交的检查点能读、SHA-256 对得上、在没用过的针上准确率 ≥ 0.9；
损坏 / 配置不符的检查点会带警告重新训练；坏输入报错。
"""
import json
import math
import os
import shutil
import signal

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from labload import load_lab

L = load_lab("lecture19", "long_lab")
CU = load_lab("lecture01", "course_utils")
RD = load_lab("lecture19", "ring_dist")


def _ref(Q, K, V, causal):
    """逐项按定义的参考（不经过 SDPA）：softmax(QKᵀ/√d + mask)·V，float64。"""
    S = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if causal:
        n = Q.shape[-2]
        S = S.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(S, -1) @ V


# ---------------------------------------------------------------------------------------------- 环形注意力
@settings(deadline=None, max_examples=40)
@given(P=st.integers(1, 7), per=st.integers(1, 9), d=st.integers(1, 12), heads=st.sampled_from([None, 1, 3]),
       causal=st.booleans(), layout=st.sampled_from(["contiguous", "striped"]), seed=st.integers(0, 2**31))
def test_ring_simulation_equals_full_attention(P, per, d, heads, causal, layout, seed):
    N = P * per
    Q, K, V = RD.make_qkv(N, d, seed, heads)
    O, led = L.ring_attention(Q, K, V, P, causal=causal, layout=layout)
    assert (O - _ref(Q, K, V, causal)).abs().max() < 1e-12
    lead = 1 if heads is None else heads
    assert led.total_work() == (N * (N + 1) // 2 if causal else N * N)
    assert led.sent == [2 * lead * per * d * (P - 1)] * P
    assert len(led.work) == P


def test_striped_balances_causal_work():
    Q, K, V = RD.make_qkv(96, 8, 3)
    for P in (2, 4, 8):
        c = L.ring_attention(Q, K, V, P, True, "contiguous")[1]
        s = L.ring_attention(Q, K, V, P, True, "striped")[1]
        assert s.round_time() < c.round_time()
        # striped：每轮各设备的工作量相差不超过一个块的对角线（n = N/P 对）
        assert all(max(r) - min(r) <= 96 // P for r in s.work)


def test_ring_distributed_gloo_two_processes():
    jobs = [dict(N=N, d=d, causal=c, layout=lay, seed=s, heads=h)
            for (N, d, s, h) in ((46, 5, 0, None), (64, 8, 1, 3)) for c in (True, False) for lay in L.LAYOUTS]
    res = RD.run_ring(2, jobs)
    for job, (O, stats) in zip(jobs, res):
        Q, K, V = RD.make_qkv(job["N"], job["d"], job["seed"], job["heads"])
        assert (O - _ref(Q, K, V, job["causal"])).abs().max() < 1e-12, job
        led = L.ring_attention(Q, K, V, 2, job["causal"], job["layout"])[1]
        assert [sum(r["sent"] for r in s["rounds"]) for s in stats] == led.sent
        assert [[s["rounds"][k]["pairs"] for s in stats] for k in range(2)] == led.work


def test_ring_distributed_three_processes():
    """P = 3：发给下一个、从上一个收，两者不是同一个进程。"""
    jobs = [dict(N=33, d=4, causal=True, layout=lay, seed=s) for s, lay in ((5, "striped"), (6, "contiguous"))]
    for job, (O, _) in zip(jobs, RD.run_ring(3, jobs)):
        Q, K, V = RD.make_qkv(33, 4, job["seed"])
        assert (O - _ref(Q, K, V, True)).abs().max() < 1e-12


# ---------------------------------------------------------------------------------------------- 掩码
@settings(deadline=None, max_examples=30)
@given(T=st.integers(1, 70), window=st.integers(1, 20), stride=st.integers(1, 12))
def test_masks_match_definitions(T, window, stride):
    segs = ((4, 1), (16, 3))
    got = {k: L.attention_mask(k, T, window=window, stride=stride, segments=segs) for k in L.MASK_KINDS}
    for i in range(T):
        for j in range(T):
            c = j <= i
            assert bool(got["full"][i, j]) == c
            assert bool(got["window"][i, j]) == (c and i - j < window)
            assert bool(got["strided"][i, j]) == (c and (i - j < stride or (i - j) % stride == 0))
            dil = i == j or any(i // w == j // w and (j % w) % r == 0 for w, r in segs)
            assert bool(got["dilated"][i, j]) == (c and dil)
    for k, m in got.items():
        assert L.pattern_pairs(k, T, window=window, stride=stride, segments=segs) == int(m.sum())


def test_model_fast_path_equals_reference_and_sdpa():
    task = L.NeedleTask()
    x = torch.randint(0, task.vocab_size, (3, 37))
    for kind in L.MASK_KINDS:
        model = L.build_model(task, {"seed": 2, "mask": kind})
        fast = model(x)
        for blk in model.blocks:
            blk.attn.keep_attn = True
        slow = model(x)
        assert (fast - slow).abs().max() < 1e-5
        assert torch.allclose(model(x, last_only=True), slow[:, -1], atol=1e-5)


def test_rope_scale_is_position_division():
    """PI 的 scale = s 等价于把位置除以 s：scale 2 在位置 2m 上的角度 = scale 1 在位置 m 上的。"""
    task = L.NeedleTask()
    m = L.build_model(task, {"seed": 1})
    att = m.blocks[0].attn
    att.scale = 2.0
    cos2, sin2 = att.rope(40, "cpu")
    att.scale = 1.0
    att._cache.clear()
    cos1, sin1 = att.rope(20, "cpu")
    assert torch.allclose(cos2[::2], cos1, atol=1e-6) and torch.allclose(sin2[::2], sin1, atol=1e-6)


# ---------------------------------------------------------------------------------------------- 任务
@settings(deadline=None, max_examples=25)
@given(seed=st.integers(0, 10**6), T=st.integers(55, 200), hay=st.booleans(), depth=st.floats(0, 1))
def test_task_invariants(seed, T, hay, depth):
    task = L.NeedleTask()
    ids, tgt = task.train_batch(seed, 3, T, hay=hay, zone=(0.5, 1.0))
    for b in range(3):
        seq = ids[b].tolist()
        needles = {seq[i + 1]: seq[i + 2] for i in range(T - 2) if seq[i] == task.N}
        assert 2 <= len(needles) <= 6
        where = (tgt[b] != -100).nonzero().flatten().tolist()
        assert len(where) == 2 * len(needles)            # 每根针平均问两次（有放回）
        for t in where:
            assert seq[t - 1] == task.Q and needles[seq[t]] == tgt[b, t] == seq[t + 1]
        if not hay:
            assert all(s < task.fil0 for s in seq)
    if T >= 20:
        ids, ans, dist = task.needle_batch(seed, 2, T, depth)
        assert ids.shape == (2, T) and ((ids == task.N).sum(1) == 4).all()
        for b in range(2):
            seq = ids[b].tolist()
            assert {seq[i + 1]: seq[i + 2] for i in range(T - 2) if seq[i] == task.N}[seq[-1]] == ans[b]


def test_train_and_test_data_are_reproducible():
    task = L.NeedleTask()
    a = task.train_batch(11, 4, 128)
    b = task.train_batch(11, 4, 128)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(task.train_batch(12, 4, 128)[0], a[0])


# ---------------------------------------------------------------------------------------------- 检查点
def _committed():
    return L.read_manifest()


@pytest.mark.skipif(not os.path.exists(os.path.join(L.CKPT, "base.pt")), reason="没有提交的 base 检查点")
def test_committed_checkpoints_load_and_match_manifest():
    man = _committed()
    for name in L.CHECKPOINTS:
        path = os.path.join(L.CKPT, f"{name}.pt")
        assert man[name]["files"][f"{name}.pt"] == CU.sha256_file(path)
        state = torch.load(path, weights_only=True)          # 纯 state_dict：torch ≥ 2.4 的安全读取
        assert all(torch.is_tensor(v) for v in state.values())
        assert man[name]["config"]["seed"] == L.CHECKPOINTS[name]["cfg"]["seed"]
        assert man[name]["config"]["steps"] == L.CHECKPOINTS[name]["steps"]
        model = L.build_model(L.NeedleTask(), L.CHECKPOINTS[name]["cfg"])   # 演示的配置建出来的模型
        model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=True)   # 键和形状都对得上
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(os.path.dirname(L.CKPT)) for f in fs
                if "__pycache__" not in dp and "figures" not in dp)
    assert total <= 12 * 2 ** 20


@pytest.mark.skipif(not os.path.exists(os.path.join(L.CKPT, "base.pt")), reason="没有提交的 base 检查点")
def test_base_finds_needle_on_fresh_needles():
    """演示用的测试种子是 12345（和训练数据不重叠）；这里换一个种子，都是模型没见过的针。"""
    torch.set_num_threads(1)
    task = L.NeedleTask()
    model, _ = L.get_checkpoint(task, "base", log=None)
    grid = L.niah_grid(model, task, [128], L.NIAH_DEPTHS, n=64, seed=424242)
    assert min(grid.values()) >= 0.9, grid


def test_corrupt_or_mismatched_checkpoint_is_retrained(tmp_path):
    task = L.NeedleTask()
    kw = dict(steps=3, T=64, warmup=1, folder=str(tmp_path), log=None)
    with pytest.warns(UserWarning, match="不存在"):
        m1, _ = L.get_model(task, "tiny", {"seed": 3}, **kw)                   # 没有缓存：带警告训练
    path = tmp_path / "tiny.pt"
    assert path.exists() and L.read_manifest(str(tmp_path))["tiny"]["files"]["tiny.pt"] == CU.sha256_file(str(path))
    m2, _ = L.get_model(task, "tiny", {"seed": 3}, **kw)                       # 命中缓存：同样的权重
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
    path.write_bytes(path.read_bytes()[:100])                                   # 截断 = 损坏
    with pytest.warns(UserWarning, match="SHA-256"):
        m3, _ = L.get_model(task, "tiny", {"seed": 3}, **kw)
    assert L.read_manifest(str(tmp_path))["tiny"]["files"]["tiny.pt"] == CU.sha256_file(str(path))
    with pytest.warns(UserWarning, match=r"配置.*lr: 0\.001 → 0\.0005"):     # 配置不同：写出哪一项、旧 → 新
        L.get_model(task, "tiny", {"seed": 3}, **dict(kw, lr=5e-4))
    (tmp_path / "manifest.json").unlink()
    path.write_bytes(b"not a checkpoint")                                       # 没有 manifest 可比时：读不出来
    with pytest.warns(UserWarning, match="读不出来"):
        L.get_model(task, "tiny", {"seed": 3}, **kw)
    shutil.rmtree(tmp_path)


def test_missing_manifest_checks_each_file(tmp_path):
    """manifest 不见了：文件照读（装得进模型），不打印"训练用了 0 s"之类没有来源的数字。"""
    task = L.NeedleTask()
    kw = dict(steps=3, T=64, warmup=1, folder=str(tmp_path))
    with pytest.warns(UserWarning):
        m1, _ = L.get_model(task, "tiny", {"seed": 3}, log=None, **kw)
    (tmp_path / "manifest.json").unlink()
    logs = []
    m2, curve = L.get_model(task, "tiny", {"seed": 3}, log=logs.append, **kw)
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
    assert curve == [] and "不存在" in logs[-1] and "只核对了文件本身" in logs[-1]
    assert not any("训练用了" in s for s in logs)


def test_cached_grid_is_keyed_on_the_model(tmp_path):
    """set_rope 改过的模型不会拿到原样模型的格子；手改的格子 seal 对不上，重算。"""
    task = L.NeedleTask()
    torch.manual_seed(0)
    model = L.build_model(task, {"seed": 2, "d_model": 32, "n_layers": 1})
    kw = dict(n=4, folder=str(tmp_path))
    g1 = L.cached_grid(task, "m", model, [64], [0.0, 1.0], **kw)
    assert g1 == L.niah_grid(model, task, [64], [0.0, 1.0], n=4)
    model.set_rope(scale=4.0)
    logs = []
    g2 = L.cached_grid(task, "m", model, [64], [0.0, 1.0], log=logs.append, **kw)
    assert logs and g2 == L.niah_grid(model, task, [64], [0.0, 1.0], n=4)     # 新算，不是 g1
    model.set_rope(scale=1.0)
    logs = []
    assert L.cached_grid(task, "m", model, [64], [0.0, 1.0], log=logs.append, **kw) == g1 and not logs   # 命中
    path = tmp_path / L.GRIDS
    c = json.loads(path.read_text())
    for item in c["results"].values():
        item["value"]["64"] = [0.123, 0.456]                                   # 手改
    path.write_text(json.dumps(c))
    logs = []
    assert L.cached_grid(task, "m", model, [64], [0.0, 1.0], log=logs.append, **kw) == g1 and logs


def test_train_needle_resumes_bit_exactly(tmp_path, monkeypatch):
    """中途停下（Ctrl-C 在两步之间生效）再接着训，和一口气训完的权重逐位相同。"""
    task = L.NeedleTask()
    kw = dict(steps=6, T=64, batch=2, warmup=2, log_every=2)
    straight = L.build_model(task, {"seed": 4, "d_model": 32, "n_layers": 1})
    L.train_needle(straight, task, **kw)
    path = str(tmp_path / "m.resume.pt")
    real = task.train_batch
    calls = []

    def flaky(gen_seed, *a, **k):                 # 第 5 步的数据取出来时按下 Ctrl-C
        calls.append(gen_seed)
        if len(calls) == 5:
            signal.raise_signal(signal.SIGINT)
        return real(gen_seed, *a, **k)
    monkeypatch.setattr(task, "train_batch", flaky)
    first = L.build_model(task, {"seed": 4, "d_model": 32, "n_layers": 1})
    with pytest.raises(SystemExit, match="第 5/6 步"):
        L.train_needle(first, task, resume_path=path, **kw)
    monkeypatch.setattr(task, "train_batch", real)
    again = L.build_model(task, {"seed": 4, "d_model": 32, "n_layers": 1})
    logs = []
    curve = L.train_needle(again, task, resume_path=path, log=logs.append, **kw)
    assert any("第 5 步" in s for s in logs) and [c[0] for c in curve] == [2, 4, 6]
    for (k, a), b in zip(straight.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k


def test_quick_never_touches_cache(tmp_path):
    task = L.NeedleTask()
    L.get_model(task, "q", {"seed": 1}, steps=5, T=64, quick=True, folder=str(tmp_path), log=None)
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------- 代价公式与坏输入
def test_cost_formulas():
    p, a = L.flops_per_token(1000, 3, 16, 100)
    assert p == 6000 and a == 6 * 3 * 100 * 16
    assert L.flops_per_token(1000, 3, 16, 100, causal=False)[1] == 2 * a
    s, h, n = 2048, 512, 8
    assert L.activation_bytes("vanilla", 2 * s, h, n) == 4 * L.activation_bytes("vanilla", s, h, n)
    assert L.activation_bytes("flash", s, h, n) == 4 * L.activation_bytes("bpt", s, h, n)
    assert L.activation_bytes("ring", s, h, n, c=256) == 6 * 256 * h


def test_bad_inputs():
    task = L.NeedleTask()
    Q, K, V = RD.make_qkv(12, 4, 0)
    with pytest.raises(ValueError, match="整除"):
        L.ring_attention(Q, K, V, 5)
    with pytest.raises(ValueError, match="layout"):
        L.ring_attention(Q, K, V, 3, layout="zigzag")
    with pytest.raises(ValueError, match="kind"):
        L.attention_mask("local", 8)
    with pytest.raises(ValueError, match="T"):
        task.train_batch(0, 2, 54)                    # 6 根针 + 12 个问题要 55 个 token
    with pytest.raises(ValueError, match="T"):
        task.needle_batch(0, 2, 14, 0.5)
    with pytest.raises(ValueError, match="depth"):
        task.needle_batch(0, 2, 64, 1.5)
    with pytest.raises(TypeError, match="causal"):
        L.ring_attention(Q, K, V, 3, causal="yes")
    with pytest.raises(ValueError, match="整除"):
        RD.run_ring(2, [dict(N=7, d=2)])
    with pytest.raises(ValueError, match="kind"):
        L.activation_bytes("paged", 10, 10, 1)
    with pytest.raises(ValueError, match="name"):
        L.get_checkpoint(task, "nonexistent")


def _bench_ring():
    from labload import load_demo
    return load_demo("lecture19", "bench/ring_multi_gpu.py")


def _check_block_fn(block, seed=7, atol=1e-12):
    """逐设备、逐轮用 block 合并 = 整条注意力（P = 2, 3, 4；两种布局；因果与否）。"""
    g = torch.Generator().manual_seed(seed)
    for P in (2, 3, 4):
        for layout in L.LAYOUTS:
            for causal in (False, True):
                N, d = 11 * P, 8
                Q, K, V = (torch.randn(1, 2, N, d, generator=g, dtype=torch.float64) for _ in range(3))
                idx = L.shard_index(N, P, layout)
                O = torch.empty_like(Q)
                for r in range(P):
                    acc = None
                    for rnd in range(P):
                        s = (r - rnd) % P
                        st, _ = block(Q[..., idx[r], :], K[..., idx[s], :], V[..., idx[s], :],
                                      idx[r], idx[s], causal, d ** -0.5)
                        if st is not None:
                            acc = st if acc is None else L.merge_states(acc, st)
                    O[..., idx[r], :] = L.finalize(acc)[0]
                assert torch.allclose(O, _ref(Q, K, V, causal), atol=atol, rtol=0), (P, layout, causal)


def test_bench_ring_flash_block_matches_full_attention():
    """工作台 ring_multi_gpu.py 的 GPU 块函数（整块 / 跳过 / 对角 / 错一位的对角）换成 CPU 上的显式核：
    逐设备、逐轮合并 = 整条注意力。"""
    demo = _bench_ring()
    demo._flash_state = demo._explicit_state              # flash_block 现在 = explicit_block（CPU 测量用的块）
    _check_block_fn(demo.flash_block)


def test_bench_ring_triton_block_layout():
    """
    triton_block 的布局换算：把 triton_flash 换成一个按 flash-attn 约定（[B, N, H, d]，lse [B, H, N]，
    causal 右下角对齐）写的参考，环的结果仍 = 整条注意力；传进去的是 [B, H, N, d] 的转置视图（没有拷贝）。
    """
    demo = _bench_ring()

    class FakeTriton:
        @staticmethod
        def flash_attn_func(q, k, v, softmax_scale=None, causal=False, return_lse=False):
            assert return_lse and q.stride(-1) == 1 and q.stride(1) == q.shape[-1]    # N 维步长 = d：转置视图
            qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))              # [B, H, N, d]
            S = (qh @ kh.transpose(-2, -1)) * softmax_scale
            if causal:                                                        # 右下角对齐
                nq, nk = S.shape[-2:]
                S = S.masked_fill(torch.ones(nq, nk, dtype=torch.bool).triu(nk - nq + 1), float("-inf"))
            return (torch.softmax(S, -1) @ vh).transpose(1, 2), torch.logsumexp(S, -1)

    demo._triton_flash = lambda: FakeTriton
    _check_block_fn(demo.triton_block, seed=8, atol=1e-6)      # 块输出和 aten 路径一样转成 float32


# ---------------------------------------------------------------------------------------------- 时间线的算术
def _cells(a, b):
    return set(range(a, b))


@settings(deadline=None, max_examples=60)
@given(comm=st.tuples(st.integers(0, 40), st.integers(0, 40)),
       computes=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=4))
def test_uncovered_and_covered_properties(comm, computes):
    """
    整数端点，数单位格子：uncovered 的几段按时间排、互不相接、都在传里面，盖住的格子正好是"传里、算外"的格子；
    covered = 传里被算盖住的格子数；传 ⊂ 算 → 整段、没有露出的；不相交 → 0；止早于起 → ValueError。
    """
    comm = tuple(sorted(comm))
    computes = [tuple(sorted(c)) for c in computes]
    union = set().union(*[_cells(*c) for c in computes]) if computes else set()
    free = RD.uncovered(comm, computes)
    assert all(comm[0] <= s < e <= comm[1] for s, e in free)
    assert all(e1 < s2 for (_, e1), (s2, _) in zip(free, free[1:]))                          # 相接的会合成一段
    assert set().union(*[_cells(*g) for g in free]) == _cells(*comm) - union
    assert RD.covered(comm, computes) == len(_cells(*comm) & union)
    a, b = comm
    assert RD.covered(comm, computes + [(a - 1, b + 2)]) == b - a                              # 传完全在算里面
    assert RD.uncovered(comm, computes + [(a - 1, b + 2)]) == []
    assert RD.covered(comm, [(s, e) for s, e in computes if e <= a or s >= b]) == 0            # 不相交
    with pytest.raises(ValueError, match="span"):
        RD.covered((3.0, 1.0), computes)
    with pytest.raises(ValueError, match="span"):
        RD.uncovered((3.0, 1.0), computes)


def test_timeline_summary_on_synthetic_rounds():
    """两轮：第 0 轮算 [0, 10]、传 [1, 4]（全被盖住）；第 1 轮算 [12, 20]；环 21 → 重叠 1、露在外面 21 − 18 = 3。"""
    tl = {"ring_s": 21.0, "rounds": [{"compute": (0.0, 10.0), "comm": (1.0, 4.0)},
                                     {"compute": (12.0, 20.0), "comm": None}]}
    s = RD.timeline_summary(tl)
    assert s["overlap"] == 1.0 and s["comm_exposed_s"] == 0.0 and s["exposed_s"] == 3.0
    assert s["compute_s"] == 18.0 and s["comm_s"] == 3.0 and s["per_round_comm_s"] == [3.0, None]
    tl["rounds"][0]["comm"] = (8.0, 12.0)                   # 一半在算里、一半露在外面
    s = RD.timeline_summary(tl)
    assert s["overlap"] == 0.5 and s["comm_exposed_s"] == 2.0
    tl["rounds"][0]["comm"] = None                          # 没有传（P = 1）
    assert RD.timeline_summary(tl)["overlap"] is None


def test_ring_events_gloo_record_without_changing_output():
    """gloo、2 个进程：带记录器的环输出不变，每轮都有算的区间、只有最后一轮没有传，区间都在环里。"""
    jobs = [dict(N=40, d=6, causal=True, layout="striped", seed=3, heads=2, events=e) for e in (False, True)]
    (O0, _), (O1, stats) = RD.run_ring(2, jobs)
    assert torch.equal(O0, O1)
    for s in stats:
        tl = s["timeline"]
        assert [r["comm"] is None for r in tl["rounds"]] == [False, True]
        for r in tl["rounds"]:
            for span in (r["compute"], r["comm"]):
                if span is not None:
                    assert 0.0 <= span[0] <= span[1] <= tl["ring_s"] + 1e-9
        assert 0.0 <= RD.timeline_summary(tl)["overlap"] <= 1.0


def _synthetic_variant(demo, name, slow=0.0, block="aten"):
    """
    一个变体的 JSON（两个进程、两个长度），样本由已知的区间造出来，走 rank_summary 同一条路。
    meta 和真的一样总带 triton 版本（gpu_timing.gpu_meta 给的），不管这个变体用不用 Triton。
    """
    lengths = []
    for n in (4096, 16384):
        c = n / 4096 * 1e-3                                   # 一轮算的时间（秒）
        ranks = []
        for rank in range(2):
            example = {"overlapped": {"ring_s": 2 * c * (1 + slow) + 1e-5, "rounds": [
                           {"compute": (0.0, c * (1 + slow)), "comm": (0.0, 0.1 * c)},
                           {"compute": (c * (1 + slow), 2 * c * (1 + slow)), "comm": None}]},
                       "serial": {"ring_s": 2.1 * c + 1e-5, "rounds": [
                           {"compute": (0.1 * c, 1.1 * c), "comm": (0.0, 0.1 * c)},
                           {"compute": (1.1 * c, 2.1 * c), "comm": None}]}}
            ov = [RD.timeline_summary(example["overlapped"]) for _ in range(3)]
            se = [RD.timeline_summary(example["serial"]) for _ in range(3)]
            pl = [{"ring_s": 2 * c * (1 + slow) + 1e-5}] * 3
            summary = demo.rank_summary({"overlapped": ov, "serial": se, "plain": pl})
            ranks.append({"rank": rank, **summary, "pairs_per_round": [n * (n + 1) // 2, n * (n - 1) // 2],
                          "full_block_tflops": 300.0, "recorder_output_max_diff": 0.0, "example": example,
                          "samples": {"overlapped": ov}})
        lengths.append({"n_local": n, "kv_bytes_per_round": 2 * 16 * n * 128 * 2, "ranks": ranks})
    meta = {"variant": name, "block": block, "env": {"NCCL_NVLS_ENABLE": "0"}, "heads": 16, "d": 128,
            "dtype": "bfloat16", "world": 2, "date": "2026-12-01", "gpu": "synthetic", "triton": "9.9"}
    return {"meta": meta, "checks": [{"n_local": 1024, "ok": True}], "lengths": lengths}


def test_bench_ring_rank_summary_merge_report_plot(tmp_path, capsys):
    """
    合成数据：藏住 1、有效藏住 = 省下的时间 / 传；算慢 5% 时藏住仍是 1、有效藏住是 0，目标判为没有达到；
    合并去掉原始样本、保留其他各节、记下测量的先后（JSON 的键按字母排）；报告按这个先后、只给 Triton 块的变体
    打印 triton 版本；甘特图画第一个变体和藏住最低的（一样低时取先测的）；画图跑得通。
    """
    demo = _bench_ring()
    paths = []
    for name, slow, block in (("default", 0.0, "aten"), ("triton", 0.0, "triton"), ("nchannels2", 0.05, "aten")):
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(_synthetic_variant(demo, name, slow, block)))
        paths.append(str(p))
    v = json.loads(open(paths[0]).read())
    r = v["lengths"][1]["ranks"][0]
    assert r["overlap"] == 1.0 and r["comm_exposed_s"] == 0.0 and demo.hidden_share(r) == 1.0
    assert r["hidden_effective"] == pytest.approx(1.0)                   # 2.1c − 2c = 0.1c = 全部的传
    assert r["compute_alone_s"] == pytest.approx([4e-3, 4e-3]) and r["comm_alone_s"][1] is None
    slow = json.loads(open(paths[2]).read())["lengths"][1]["ranks"][0]          # nchannels2
    assert slow["hidden_effective"] == pytest.approx(0.0, abs=1e-9)      # 算慢 5% 正好吃掉省下的 0.1c
    results = tmp_path / "ring_multi_gpu.json"
    results.write_text(json.dumps({"meta": {"world": 2}, "checks": [], "times": []}))
    demo.merge(paths, str(results))
    res = json.loads(results.read_text())
    assert set(res) == {"meta", "checks", "times", "timeline"}
    assert list(res["timeline"]["variants"]) == ["default", "nchannels2", "triton"]      # update_json 排了序
    assert res["timeline"]["order"] == ["default", "triton", "nchannels2"]               # 测量的先后
    assert all("samples" not in r for v in res["timeline"]["variants"].values() for x in v["lengths"]
               for r in x["ranks"])
    capsys.readouterr()
    data = demo.report_timeline(res["timeline"])
    out = capsys.readouterr().out
    assert list(data) == ["default", "triton", "nchannels2"]
    assert out.count("triton 9.9") == 1 and "block = triton，NCCL 环境 {'NCCL_NVLS_ENABLE': '0'}，triton 9.9" in out
    assert data["default"][1]["hidden"] == 1.0
    assert data["nchannels2"][1]["hidden_effective"] == pytest.approx(0, abs=1e-9)
    assert demo._verdict("default", data["default"]) is True
    assert demo._verdict("nchannels2", data["nchannels2"]) is False      # 藏住 100%，但省下的时间被算慢吃掉
    rows = demo._gantt_rows(data)                    # 没有 32k：最长的 16k；藏住都是 1，取先测的 triton
    assert [(name, mode, n) for name, mode, n, _ in rows] == [
        ("default", "overlapped", 16384), ("default", "serial", 16384),
        ("triton", "overlapped", 16384), ("triton", "serial", 16384)]
    data["nchannels2"][1]["hidden"] = 0.5                                # 藏住最低的换成 nchannels2
    assert [name for name, *_ in demo._gantt_rows(data)][2:] == ["nchannels2", "nchannels2"]
    data["nchannels2"][1]["hidden"] = 1.0
    demo.plot_timeline(data, quick=True, world=2)


def _committed_timeline(demo):
    res = json.loads(open(demo.RESULTS, encoding="utf-8").read())
    if "timeline" not in res:
        pytest.skip("已提交的 ring_multi_gpu.json 还没有时间线")
    return res["timeline"]


def test_bench_ring_report_timeline_without_order_key(capsys):
    """更早合并的 JSON 没有 "order"（测量的先后）：报告照样跑，按 variants 的键排，每个变体的数和有 order 时一样。"""
    demo = _bench_ring()
    tl = _committed_timeline(demo)
    assert "order" in tl and sorted(tl["order"]) == sorted(tl["variants"])
    with_order = demo.report_timeline(tl)
    old = {k: v for k, v in tl.items() if k != "order"}
    capsys.readouterr()
    without = demo.report_timeline(old)
    out = capsys.readouterr().out
    assert list(without) == list(tl["variants"]) and without == with_order
    assert all(f"-- 变体 {name}：" in out for name in tl["variants"])


def test_bench_ring_timeline_legends_do_not_touch(monkeypatch, capsys):
    """已提交的时间线画出来：两张上图的图例（都在图下方、比各自的图宽）之间至少留 0.25 英寸，投影时分得开。"""
    import course_utils
    demo = _bench_ring()
    data = demo.report_timeline(_committed_timeline(demo))
    gaps = []

    def measure(fig, *args, **kwargs):
        fig.canvas.draw()
        left, right = (a.get_legend().get_window_extent() for a in fig.axes[:2])
        gaps.append((right.x0 - left.x1) / fig.dpi)
        import matplotlib.pyplot as plt
        plt.close(fig)
        return "not saved"

    monkeypatch.setattr(course_utils, "save_figure", measure)
    demo.plot_timeline(data, quick=True, world=2)
    assert len(gaps) == 1 and gaps[0] >= 0.25, gaps


def test_bench_ring_merge_refuses_damaged_results(tmp_path):
    """已提交的结果坏了：--merge 报错（消息里有路径），文件原样不动——不能把它悄悄换成只有时间线的新文件。"""
    demo = _bench_ring()
    p = tmp_path / "default.json"
    p.write_text(json.dumps(_synthetic_variant(demo, "default")))
    for damaged in ('{"meta": {"world": 2}, "checks": [', "[1, 2]"):
        results = tmp_path / "ring_multi_gpu.json"
        results.write_text(damaged)
        with pytest.raises(ValueError, match="ring_multi_gpu.json"):
            demo.merge([str(p)], str(results))
        assert results.read_text() == damaged
    results.unlink()                                                     # 没有结果文件：从空的开始
    demo.merge([str(p)], str(results))
    assert list(json.loads(results.read_text())) == ["timeline"]


def test_bench_ring_variant_meta_on_cpu():
    """CPU（gloo）上变体的 meta 也来自 gpu_timing.gpu_meta：有 torch / triton 版本和日期，gpu 写成 cpu (gloo)。"""
    import argparse
    demo = _bench_ring()
    args = argparse.Namespace(variant="v", block="explicit", seed=0, sizes="cpu")
    meta = demo._variant_meta(torch, args, demo.SIZES["cpu"], 2, 0, torch.device("cpu"))
    assert meta["gpu"] == "cpu (gloo)" and meta["torch"] == torch.__version__
    assert {"triton", "date", "driver", "cuda"} <= set(meta) and meta["variant"] == "v" and meta["world"] == 2


def test_bench_ring_hidden_is_not_fooled_by_stretched_comm():
    """
    NCCL 排在算后面：传的区间被拉长到 [0, 1.1c]，这一轮算 [0, c]，下一轮等传完才开始。|传 ∩ 算| / |传| = 91%，
    但传露在外面 0.1c = 单独传的全部（0.1c）→ 藏住 0，目标没有达到。
    """
    demo = _bench_ring()
    c = 1e-3
    ov = RD.timeline_summary({"ring_s": 2.1 * c, "rounds": [{"compute": (0.0, c), "comm": (0.0, 1.1 * c)},
                                                          {"compute": (1.1 * c, 2.1 * c), "comm": None}]})
    se = RD.timeline_summary({"ring_s": 2.1 * c, "rounds": [{"compute": (0.1 * c, 1.1 * c), "comm": (0.0, 0.1 * c)},
                                                          {"compute": (1.1 * c, 2.1 * c), "comm": None}]})
    r = demo.rank_summary({"overlapped": [ov] * 3, "serial": [se] * 3, "plain": [{"ring_s": 2.1 * c}] * 3})
    assert r["overlap"] == pytest.approx(1 / 1.1)
    assert demo.hidden_share(r) == pytest.approx(0.0, abs=1e-12)
    assert r["hidden_effective"] == pytest.approx(0.0, abs=1e-12)
    point = {"n": 16384, "hidden": demo.hidden_share(r), "hidden_effective": r["hidden_effective"]}
    assert demo._verdict("stretched", [point]) is False


def test_bench_ring_recorder_check_is_exact():
    """记录器核对：输出逐位相同（差 0）才通过；差 1e-9 也报错。"""
    demo = _bench_ring()
    demo._check_rank({"rank": 0, "recorder_output_max_diff": 0.0}, "x", 1024)
    with pytest.raises(AssertionError, match="记录器"):
        demo._check_rank({"rank": 0, "recorder_output_max_diff": 1e-9}, "x", 1024)



def test_demo_start_prints_the_seeds_in_use(monkeypatch, capsys):
    """演示 01–03 打印的种子就是决定结果的那几个（没有不起作用的 --seed）。"""
    monkeypatch.setattr("sys.argv", ["demo", "--quick"])
    threads = torch.get_num_threads()
    try:
        args, task = L.demo_start("x", "y")
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert args.quick and isinstance(task, L.NeedleTask)
    for seed in (f"TASK_SEED = {L.TASK_SEED}", f"DATA_SEED = {L.DATA_SEED}", f"EVAL_SEED = {L.EVAL_SEED}",
                 f"模型初始化 {L.CHECKPOINTS['base']['cfg']['seed']}"):
        assert seed in out, (seed, out)
    monkeypatch.setattr("sys.argv", ["demo", "--seed", "3"])
    with pytest.raises(SystemExit):
        L.demo_start("x", "y")
