"""第 5 讲 step_bench（实测一步 vs StepModel）的测试：cache 等价、拟合恢复、坏输入、CPU 上的测量路径、演示的 skip，
以及 serving_sim.H200_MEASURED 与已提交 JSON 的拟合一致（自检和演示 --quick 由 test_harness.py 在子进程里跑）。"""
import ast
import json
import os
import statistics
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from labload import ROOT, load_demo, load_lab

sb = load_lab("lecture05", "step_bench")
ss = load_lab("lecture05", "serving_sim")
lm = load_lab("lecture01", "llm_math")

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
CONFIGS = {m.name: m for m in sb.MODELS}
DEMO = os.path.join(ROOT, "lecture05", "bench", "step_calibration.py")
COMMITTED = os.path.join(ROOT, "lecture05", "bench", "results", "step_measure.json")
bench = load_demo("lecture05", "bench/step_calibration.py")


def _tiny(tied=False, G=2, R=3, dh=6):
    return lm.ModelConfig("odd", n_layers=2, d_model=40, n_heads=G * R, n_kv_heads=G, d_head=dh, d_ff=52, vocab=97,
                          tied=tied)


# ---------------------------------------------------------------------------
# 模型：预分配 cache 的 prefill + decode = 整段一次算 = 朴素参考
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("tied,G,R,B,P,n", [(False, 2, 3, 3, 7, 5), (True, 1, 4, 2, 1, 4), (False, 3, 1, 1, 11, 3),
                                            (True, 4, 2, 5, 3, 6)])
def test_cache_prefill_decode_equals_full_forward(tied, G, R, B, P, n):
    """MHA（R = 1）、GQA、MQA（G = 1），tied 与否，长度 1 的 prompt（第一步就走 decode 路径）。"""
    e_cache, e_ref = sb.check_cache_equivalence(_tiny(tied, G, R), B, P, n, seed=B * 100 + P)
    assert e_cache < 1e-10 and e_ref < 1e-10, (e_cache, e_ref)


def test_cache_equivalence_float32():
    e_cache, e_ref = sb.check_cache_equivalence(sb.TINY, 3, 9, 4, dtype=torch.float32, seed=3)
    assert e_cache < 1e-4 and e_ref < 1e-4, (e_cache, e_ref)


def test_model_matches_llm_math_param_count():
    """建出来的模型的参数个数 = llm_math.ModelConfig.n_params()（tied 时 lm_head 不另算）：StepModel 数的就是它。"""
    for tied in (False, True):
        cfg = _tiny(tied)
        m = sb.build_model(cfg, max_pos=8)
        assert sum(p.numel() for p in m.parameters()) == cfg.n_params()


def test_decode_writes_only_its_slot():
    cfg = sb.TINY
    m = sb.build_model(cfg, max_pos=16)
    cache = sb.alloc_cache(cfg, 2, 16, torch.float32, "cpu").fill_(7.0)
    with torch.no_grad():
        m(torch.zeros(2, 1, dtype=torch.long), cache, 5)
    changed = (cache != 7.0).any(dim=(0, 1, 2, 3, 5))             # [S_max]：哪些位置被写了
    assert changed.nonzero().flatten().tolist() == [5]


# ---------------------------------------------------------------------------
# 拟合
# ---------------------------------------------------------------------------
def _per_layer(mfu, mbu, oe, og):
    return {"mfu": mfu, "mbu": mbu, "overhead_eager_per_layer": oe, "overhead_graph_per_layer": og}


@settings(max_examples=12, **SETTINGS)
@given(mfu=st.floats(0.2, 1.0), mbu=st.floats(0.3, 1.0), oe=st.floats(3e-6, 5e-4), og=st.floats(5e-8, 3e-5))
def test_fit_recovers_parameters_from_step_model_points(mfu, mbu, oe, og):
    """每层开销：oe × 16 / 32 层 ≈ 0.05–16 ms 每步，og ≈ 1 µs – 1 ms 每步。"""
    true = _per_layer(mfu, mbu, oe, og)
    fit = sb.fit_step_params(sb.synthetic_points(sb.MODELS, sb.GRID, true), CONFIGS)
    for k, v in true.items():
        assert abs(fit[k] - v) <= 1e-3 * v, (k, fit[k], v)
    assert fit["loss"] < 1e-8


def test_fit_with_noise_and_without_graph_points():
    true = _per_layer(0.7, 0.82, 1.8e-4, 2.5e-6)
    pts = sb.synthetic_points(sb.MODELS, sb.GRID, true, noise=0.03, seed=4)
    fit = sb.fit_step_params(pts, CONFIGS)
    for k in ("mfu", "mbu", "overhead_eager_per_layer"):
        assert abs(fit[k] / true[k] - 1) < 0.05, (k, fit[k])
    eager = [p for p in pts if p["mode"] == "eager"]
    fe = sb.fit_step_params(eager, CONFIGS)
    assert fe["overhead_graph_per_layer"] is None and abs(fe["mfu"] / true["mfu"] - 1) < 0.05


def test_fit_prediction_is_step_model():
    """拟合用的向量化公式 = 直接问 StepModel（compare_points）：两者不会分家；每步开销 = 每层 × n_layers。"""
    params = _per_layer(0.55, 0.9, 1.2e-4, 2e-6)
    pts = sb.synthetic_points(sb.MODELS, sb.GRID, params)
    rows = sb.compare_points(pts, CONFIGS, params)
    for r in rows:
        assert abs(r["ratio"] - 1) < 1e-12, r
    assert abs(sb.fit_loss(pts, CONFIGS, params)) < 1e-20
    # 默认假设（每步 1 ms，不分层数）走同一条路：step_overhead 认 overhead_per_step
    d_pts = sb.synthetic_points(sb.MODELS, sb.GRID, sb.DEFAULT_PARAMS)
    d_rows = sb.compare_points(d_pts, CONFIGS, sb.DEFAULT_PARAMS)
    assert all(abs(r["ratio"] - 1) < 1e-12 for r in d_rows)
    assert [r["index"] for r in d_rows] == list(range(len(d_pts)))               # index = 在 points 里的位置
    # decode 的账：decode_time(B, B·(context + 1))，开销 = 每层 × 这个模型的层数
    for name in CONFIGS:
        r = next(r for r in rows if r["model"] == name and r["kind"] == "decode" and r["mode"] == "graph")
        cfg = CONFIGS[name]
        st_ = ss.StepModel(cfg, sb.CHIP, mfu=0.55, mbu=0.9, overhead=2e-6 * cfg.n_layers, mem_util=1.0)
        assert r["model_s"] == st_.decode_time(r["batch"], r["batch"] * (r["context"] + 1))


def test_step_overhead_per_layer_and_default_per_step():
    """拟合的参数按层（× n_layers，None 按 0）；默认假设按步（StepModel 的 1 ms，不分层数、不分 mode）；
    两种键都没有、两种键都有、mode 写错：ValueError 说缺什么 / 多了什么 / 错在哪。"""
    cfg8, cfg1 = CONFIGS["Llama-3.1-8B"], CONFIGS["Llama-3.2-1B"]
    p = _per_layer(0.5, 0.5, 1e-4, None)
    assert sb.step_overhead(p, "eager", cfg8) == pytest.approx(32e-4)
    assert sb.step_overhead(p, "eager", cfg1) == pytest.approx(16e-4)
    assert sb.step_overhead(p, "graph", cfg8) == 0.0
    assert {sb.step_overhead(sb.DEFAULT_PARAMS, mode, cfg) for mode in sb.MODES for cfg in (cfg1, cfg8)} \
        == {ss.STEP_OVERHEAD_S}
    with pytest.raises(ValueError, match="overhead_eager_per_layer"):
        sb.step_overhead({"mfu": 0.5, "mbu": 0.5}, "eager", cfg8)
    # 两种写法混在一起（例如把拟合的结果并进默认假设）：不悄悄用按步的那个，报错、两种键都点名
    for mixed in ({**sb.DEFAULT_PARAMS, **p}, {**sb.DEFAULT_PARAMS, "overhead_graph_per_layer": 1e-6}):
        for mode in sb.MODES:
            with pytest.raises(ValueError, match="overhead_per_step") as err:
                sb.step_overhead(mixed, mode, cfg8)
            assert all(k in str(err.value) for k in mixed if k.startswith("overhead_")), err.value
    for params in (p, sb.DEFAULT_PARAMS):
        with pytest.raises(ValueError, match="mode"):
            sb.step_overhead(params, "eagr", cfg8)


def test_fit_is_a_local_minimum():
    """拟合后参数沿随机方向一起挪 1%（坐标搜索没试过的斜方向），Σ log² 都不会变小（带噪声的点：最小值不是 0）。"""
    pts = sb.synthetic_points(sb.MODELS, sb.GRID, _per_layer(0.66, 0.78, 2e-4, 3e-6), noise=0.05, seed=1)
    fit = sb.fit_step_params(pts, CONFIGS)
    assert fit["loss"] == pytest.approx(sb.fit_loss(pts, CONFIGS, fit), rel=1e-12) and fit["loss"] > 0.01
    nudged = sb.nudged_losses(pts, CONFIGS, fit)
    assert len(nudged) == 32 and nudged.min() >= fit["loss"], (fit["loss"], nudged.min())
    assert (sb.nudged_losses(pts, CONFIGS, fit, seed=1) != nudged).any()        # 方向由种子定
    # 反过来：离开最小值的参数，挪一挪能变好（检查本身不是永远成立的）
    off = {**fit, "mbu": fit["mbu"] * 0.9}
    assert sb.nudged_losses(pts, CONFIGS, off).min() < sb.fit_loss(pts, CONFIGS, off)


def test_fit_never_worse_than_defaults():
    """拟合的 Σ log² ≤ 默认假设的（演示 06 也查）。默认的"每步 1 ms、不分层数"不在按层拟合的参数族里，所以这不是
    自动成立的：数据恰好由默认假设生成时，默认假设是 0，拟合做不到（反例也查）。"""
    pts = sb.synthetic_points(sb.MODELS, sb.GRID, _per_layer(0.7, 0.85, 4e-4, 1e-4), noise=0.05, seed=3)
    fit = sb.fit_step_params(pts, CONFIGS)
    assert fit["loss"] <= sb.fit_loss(pts, CONFIGS, sb.DEFAULT_PARAMS)
    d_pts = sb.synthetic_points(sb.MODELS, sb.GRID, sb.DEFAULT_PARAMS)
    d_fit = sb.fit_step_params(d_pts, CONFIGS)
    assert sb.fit_loss(d_pts, CONFIGS, sb.DEFAULT_PARAMS) < 1e-20 < d_fit["loss"]


def test_error_summary_returns_the_worst_row():
    """中位数的算法由 course_utils.ratio_errors 测；这里只查 error_summary 把最差的下标换回那一行（|log 0.5| 最大）。"""
    rows = [{"ratio": r} for r in (1.1, 0.5, 1.8, 1.0)]
    assert sb.error_summary(rows)["worst"] is rows[1]


def test_worst_rows_by_abs_log_ratio():
    """最差的 n 行按 |log 比值| 从大到小（0.5 比 1.8 差，2.0 和 0.5 一样差时保持原来的顺序）；第一行就是
    error_summary 的 worst；n 大于行数时全给，n = 0 给空；n 不是非负整数 → 报错。"""
    rows = [{"ratio": r} for r in (1.1, 0.5, 1.8, 1.0, 2.0)]
    assert [r["ratio"] for r in sb.worst_rows(rows, 3)] == [0.5, 2.0, 1.8]
    assert sb.worst_rows(rows, 1)[0] is sb.error_summary(rows)["worst"] is rows[1]
    assert [r["ratio"] for r in sb.worst_rows(rows, 10)] == [0.5, 2.0, 1.8, 1.1, 1.0]
    assert sb.worst_rows(rows, 0) == [] and [r["ratio"] for r in rows] == [1.1, 0.5, 1.8, 1.0, 2.0]  # 不改原列表
    for bad in (-1, 1.5):
        with pytest.raises((TypeError, ValueError), match="n"):
            sb.worst_rows(rows, bad)


def _decode_row(ratio, mode="eager", batch=64, context=4096, seconds=1e-2):
    """explain_point 要的一行（compare_points 的格式，只填它读的键）。"""
    return {"kind": "decode", "mode": mode, "batch": batch, "context": context, "ratio": ratio,
            "seconds": seconds, "bound": "memory", "index": 0}


def test_explain_point_eager_note_only_when_model_overestimates():
    """eager decode 的"主机和 GPU 重叠、开销按层加在 roofline 上"只在模型高估（比值 > 1）时写；实测内核数有就写进去。
    graph、比值 < 1 都不写；prefill 写 lm_head 和注意力两条；同组其余点的中位数远小于这一点时写出倍数和测量顺序。"""
    cfg = CONFIGS["Llama-3.1-8B"]

    def eager_notes(notes):
        return [t for t in notes if t.startswith("eager：")]

    assert eager_notes(sb.explain_point(_decode_row(0.5), cfg)) == []
    over = eager_notes(sb.explain_point(_decode_row(1.3), cfg))
    assert len(over) == 1 and "每层几十次内核启动" in over[0] and f"× {cfg.n_layers} 层" in over[0]
    counted = eager_notes(sb.explain_point(_decode_row(1.3), cfg, kernels_per_step=1288))[0]
    assert "每步启动 1288 个 GPU 内核（每层约 40 个）" in counted
    assert eager_notes(sb.explain_point(_decode_row(1.3, mode="graph"), cfg)) == []
    small = sb.explain_point(_decode_row(0.5, batch=4), cfg)
    assert any("批很小" in t for t in small) and small[-1].startswith("这一点在模型里是 memory 受限")
    pre = sb.explain_point({"kind": "prefill", "mode": "eager", "n_prompts": 2, "prompt_len": 512, "ratio": 1.3,
                            "seconds": 1e-2, "bound": "compute", "index": 0}, cfg)
    assert len(pre) == 3 and "lm_head" in pre[0] and "注意力占模型 FLOPs" in pre[1] and not eager_notes(pre)
    # 远慢于同组的其余点（> 1.5 倍中位数）：写出倍数、第几个测的（按 index）
    peers = [dict(_decode_row(1.0, seconds=s), index=i) for i, s in ((1, 4e-3), (3, 5e-3), (4, 6e-3))]
    slow = sb.explain_point(dict(_decode_row(1.3), index=2), cfg, peers=peers)
    assert "5.0 ms" in slow[0] and "2.0 倍" in slow[0] and "第 2 个测的" in slow[0]
    assert not sb.explain_point(_decode_row(1.3, seconds=7e-3), cfg, peers=peers)[0].startswith("实测是")


def test_plan_and_memory_rule():
    pts = sb.plan_points(sb.MODELS, sb.GRID)
    assert len(pts) == 2 * (16 + 18 * 2) + 2          # 两个模型 × (prefill 16 + decode 18 × 2) + 第 11 讲那一步
    p8 = {(p["batch"], p["context"]): p for p in pts if p["model"] == "Llama-3.1-8B" and p["kind"] == "decode"}
    assert not sb.fits_chip(CONFIGS["Llama-3.1-8B"], p8[(256, 8192)])      # 275 GB 的 KV
    assert not sb.fits_chip(CONFIGS["Llama-3.1-8B"], p8[(128, 8192)])      # 137 GB 的 KV + 16 GB 权重
    assert sb.fits_chip(CONFIGS["Llama-3.1-8B"], p8[(64, 8192)])
    p1 = [p for p in pts if p["model"] == "Llama-3.2-1B" and p["kind"] == "decode"]
    assert all(sb.fits_chip(CONFIGS["Llama-3.2-1B"], p) for p in p1)
    assert sum(p["context"] == 160 for p in p1) == 2                      # eager 与 graph


# ---------------------------------------------------------------------------
# 坏输入
# ---------------------------------------------------------------------------
def test_bad_inputs_raise_clear_errors():
    m = sb.build_model(sb.TINY, max_pos=8)
    cache = sb.alloc_cache(sb.TINY, 1, 8, torch.float32, "cpu")
    ids = torch.zeros(1, 1, dtype=torch.long)
    with pytest.raises(TypeError, match="ModelConfig"):
        sb.build_model("Llama-3.1-8B")
    with pytest.raises(TypeError, match="dtype"):
        sb.build_model(sb.TINY, dtype=torch.int32)
    with pytest.raises(ValueError, match="d_head"):
        sb.build_model(_tiny(dh=5))
    with pytest.raises(TypeError, match="ids"):
        m(ids.float(), cache, 0)
    with pytest.raises(ValueError, match="cache"):
        m(torch.zeros(2, 1, dtype=torch.long), cache, 0)
    with pytest.raises(ValueError, match="prefill"):
        m(torch.zeros(1, 3, dtype=torch.long), cache, 2)
    with pytest.raises(ValueError, match="S_max"):
        m(ids, cache, 8)
    with pytest.raises(TypeError, match="pos0"):
        m(ids, cache, 1.0)
    with pytest.raises(ValueError, match="batch"):
        sb.alloc_cache(sb.TINY, 0, 8, torch.float32, "cpu")
    good = sb.synthetic_points(sb.MODELS, sb.GRID, sb.DEFAULT_PARAMS)
    with pytest.raises(ValueError, match="没有测到"):
        sb.fit_step_params([], CONFIGS)
    with pytest.raises(ValueError, match="seconds"):
        sb.fit_step_params([{**good[0], "seconds": -1.0}], CONFIGS)
    with pytest.raises(ValueError, match="model"):
        sb.fit_step_params([{**good[0], "model": "GPT-5"}], CONFIGS)
    with pytest.raises(ValueError, match="kind"):
        sb.fit_step_params([{**good[0], "kind": "train"}], CONFIGS)
    with pytest.raises(ValueError, match="eager"):
        sb.fit_step_params([p for p in good if p["mode"] == "graph"], CONFIGS)
    with pytest.raises(ValueError, match="mode"):
        ss.h200_measured_step(lm.LLAMA31_8B, mode="compiled")
    with pytest.raises(TypeError, match="model"):
        ss.h200_measured_step("Llama-3.1-8B")


# ---------------------------------------------------------------------------
# 测量路径（CPU 小模型）与演示
# ---------------------------------------------------------------------------
def test_measure_runs_on_cpu_quick(tmp_path):
    out = tmp_path / "q.json"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = bench.measure((sb.TINY,), bench.QUICK_GRID, "cpu", torch.float32, str(out), quick=True,
                            log=lambda s: None)
    finally:
        torch.set_num_threads(threads)
    back, configs = sb.load_results(str(out))
    assert back["points"] == json.loads(json.dumps(res["points"])) and configs["tiny"] == sb.TINY
    eager = [p for p in back["points"] if p["mode"] == "eager"]
    graph = [p for p in back["points"] if p["mode"] == "graph"]
    assert eager and all(p["status"] == "ok" and p["seconds"] > 0 for p in eager)
    assert graph and all(p["status"] == "skipped" and "CUDA" in p["reason"] for p in graph)
    assert back["meta"]["device"] == "cpu" and back["meta"]["quick"] is True


def _run_demo(*args):
    return subprocess.run([sys.executable, DEMO, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_profile_kernels_records_shape_even_when_profiler_fails(monkeypatch):
    """profiler 出错不让测量失败：记下原因，也记下是哪个形状（演示的 profiled() 读它）。CPU 上跑：同步换成空操作。"""
    def broken(*args, **kwargs):
        raise RuntimeError("CUPTI unavailable")

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.profiler, "profile", broken)
    out = bench.profile_kernels(sb.build_model(sb.TINY, max_pos=1024), "cpu", torch.float32)
    assert set(out) == set(bench.PROFILE_POINTS)
    for kind, p in bench.PROFILE_POINTS.items():
        assert out[kind] == {"shape": p, "error": "RuntimeError: CUPTI unavailable"}, kind


def test_demo_skips_without_results(tmp_path):
    assert sb.load_results(str(tmp_path / "missing.json")) is None
    r = _run_demo("--quick", "--results", str(tmp_path / "missing.json"))
    assert r.returncode == 77, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("SKIP:")


def test_demo_runs_on_synthetic_results(tmp_path):
    true = _per_layer(0.72, 0.85, 1.5e-4, 3e-6)
    path = tmp_path / "syn.json"
    path.write_text(json.dumps(sb.synthetic_results(true, noise=0.03, seed=2)))
    r = _run_demo("--quick", "--results", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "拟合出的参数" in r.stdout and "最差的一点" in r.stdout and "第 11 讲" in r.stdout
    assert "第几个测的" in r.stdout
    assert "每个内核 µs" in r.stdout


# ---------------------------------------------------------------------------
# serving_sim.H200_MEASURED 与已提交的实测绑在一起
# ---------------------------------------------------------------------------
@pytest.mark.skipif(not os.path.exists(COMMITTED), reason="lecture05/bench/results/step_measure.json 还没有提交")
def test_h200_measured_equals_fit_of_committed_json():
    """常数 = 对已提交 JSON 的拟合（constant_text 写 CONST_DIGITS 位有效数字：相对误差 ≤ CONST_RTOL）；出处一字不差；
    拟合不比默认假设差、是局部最小；h200_measured_step 的预测 = 拟合的逐点预测（到 CONST_RTOL）。
    bench/README.md 和 serving_sim 注释里的这些数由 JSON + 代码算出来再去找：点数、中位误差、Σ log²、分组中位、
    参数表（mfu、mbu、每层开销和两种模型的每步开销）、最差三点的实测和比值。"""
    res, configs = sb.load_results(COMMITTED)
    fit = sb.fit_step_params(res["points"], configs)
    text = sb.constant_text(fit, res["meta"])
    assert ss.H200_MEASURED is not None, "把这三行粘贴进 serving_sim.py：\n" + text
    for k in sb.FIT_KEYS:
        assert abs(ss.H200_MEASURED[k] - fit[k]) <= sb.CONST_RTOL * abs(fit[k]), (k, ss.H200_MEASURED[k], fit[k])
    assert ss.H200_MEASURED["source"] == ast.literal_eval(text.split("=", 1)[1].strip())["source"]
    assert fit["n_points"] == sum(p["status"] == "ok" for p in res["points"])
    loss_before = sb.fit_loss(res["points"], configs, sb.DEFAULT_PARAMS)
    assert fit["loss"] <= loss_before
    assert sb.nudged_losses(res["points"], configs, fit).min() >= fit["loss"]
    before = sb.compare_points(res["points"], configs, sb.DEFAULT_PARAMS)
    after = sb.compare_points(res["points"], configs, fit)
    mb, ma = sb.error_summary(before)["median"], sb.error_summary(after)["median"]
    with open(os.path.join(ROOT, "lecture05", "bench", "README.md"), encoding="utf-8") as f:
        notes = f.read()
    with open(os.path.join(ROOT, "lecture05", "serving_sim.py"), encoding="utf-8") as f:
        sim_src = f.read()
    headline = (f"默认 {mb:.0%} → 拟合后 {ma:.0%}（{fit['n_points']} 个点；"
                f"Σ log² {loss_before:.2f} → {fit['loss']:.2f}）")
    assert headline in notes, headline
    assert f"中位误差约 {ma:.0%}" in sim_src
    groups = sb.group_rows(after)
    assert len(groups) == 6
    for key, g in groups.items():
        med = f"{statistics.median(r['ratio'] for r in g):.3f}"
        assert med in notes, (key, med)
    # 参数表：mfu、mbu 三位小数；每层开销 µs，两种模型的每步开销 ms
    d = sb.DEFAULT_PARAMS                                      # 默认假设那一列：0.60、0.80
    for k in ("mfu", "mbu"):
        assert f"| {k} | {d[k]:.2f} | {fit[k]:.3f} |" in notes, k
    n1, n8 = configs["Llama-3.2-1B"].n_layers, configs["Llama-3.1-8B"].n_layers
    for mode in sb.MODES:
        per = fit[f"overhead_{mode}_per_layer"]
        assert f"每层 {per * 1e6:.1f} µs" in notes, mode
        assert f"{per * n1 * 1e3:.2f} ms" in notes and f"{per * n8 * 1e3:.2f} ms" in notes, mode
    # 最差三点（|log 比值| 最大）：实测 ms 和比值
    worst = sb.worst_rows(after, 3)
    w0 = worst[0]
    assert f"模型 {w0['model_s'] * 1e3:.1f} ms 对实测 {w0['seconds'] * 1e3:.1f} ms，{w0['ratio']:.2f}" in notes
    for r in worst[1:]:
        assert f"{r['seconds'] * 1e3:.1f} ms，{r['ratio']:.2f}" in notes, r
    # h200_measured_step（CONST_DIGITS 位有效数字的常数）对每个已测的点给出拟合的预测
    for r in after:
        step = ss.h200_measured_step(configs[r["model"]], mode=r["mode"], mem_util=1.0)
        assert sb._step_cost(step, r).total == pytest.approx(r["model_s"], rel=sb.CONST_RTOL), r


def test_no_measured_constants_without_committed_json():
    if os.path.exists(COMMITTED):
        pytest.skip("已有实测结果：由 test_h200_measured_equals_fit_of_committed_json 检查")
    assert ss.H200_MEASURED is None
    with pytest.raises(ValueError, match="H200_MEASURED"):
        ss.h200_measured_step(lm.LLAMA31_8B)
