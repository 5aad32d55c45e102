"""
step_bench.py —— 第 5 讲：StepModel 预测的"一步"和 GPU 上真实的一步对得上吗？

【问题】serving_sim.StepModel 用 roofline + 假设的 mfu 0.6、mbu 0.8、每步 1 ms 开销预测一步的时间。H200 上真跑
    Llama 形状的模型（随机权重，BF16）的 prefill 和 decode（eager 与 CUDA graph），拟合出的 mfu、mbu、开销是多少，
    拟合后还差在哪？开销按"每层一个常数 × 层数"拟合：一步启动的内核数和层数成正比（1B 632 个、8B 1288 个）。

【里面有什么】
    模型    LlamaShaped（第 4 讲 modern_lm 的积木）、build_model、alloc_cache（预分配的 KV cache）、
            reference_logits（不用 cache、不用 SDPA 的朴素注意力：等价性检查的参考）
    网格    plan_points、point_shape / point_bytes / fits_chip；结果读回用 load_results
            （GPU 上的计时在工作台 lecture05/bench/step_calibration.py）
    拟合    ideal_times、predict、log_loss、step_overhead、fit_step_params（平方对数比：网格 + 坐标搜索）、fit_loss、
            nudged_losses（局部最小的检查）、compare_points、group_rows、error_summary、worst_rows、explain_point、
            constant_text（粘贴进 serving_sim.H200_MEASURED 的几行）、synthetic_results / synthetic_points

【约定】KV cache [L, 2, B, G, S_max, dh]（2 = K、V；G = KV 头数）。prefill：n 个等长输入 [n, T]，只算最后一个 token
    的 logits；decode：每个序列已有 context 个 token，看 context + 1 个键。GQA：一组 R = H/G 个 query 头当作 R 个
    query 位置 [B, G, R, dh]，K/V 不复制。对照：prefill ↔ prefill_time([T] × n)，decode ↔ decode_time(B, B·(ctx + 1))。
    参数字典 FIT_KEYS = {"mfu", "mbu", "overhead_eager_per_layer", "overhead_graph_per_layer"}（每层秒数）；
    默认假设 DEFAULT_PARAMS = {"mfu", "mbu", "overhead_per_step"}；step_overhead 两种都认。时间：秒；显存：字节。

【运行】python3 lecture05/step_bench.py                 # 自检（CPU，几秒）
        python3 lecture05/bench/step_calibration.py --measure   # H200 上重测（见 lecture05/bench/README.md）
【依赖】torch、numpy；../lecture01（llm_math、hw_specs、course_utils）、../lecture04（modern_lm）、serving_sim。
"""

import dataclasses
import datetime
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
for _sub in ("lecture01", "lecture04"):
    sys.path.insert(0, os.path.join(HERE, "..", _sub))

import hw_specs  # noqa: E402
import llm_math  # noqa: E402
import serving_sim as ss  # noqa: E402
from course_utils import (check_array, check_bool, check_choice, check_device, check_int, check_real,  # noqa: E402
                          check_seed, fmt_bytes, load_json, machine_memory_bytes, ratio_errors)
from modern_lm import RMSNorm, SwiGLU, apply_rope_half, rope_angles  # noqa: E402

ROPE_BASE = 500_000.0       # Llama 3 的 RoPE 底数（只影响数值，不影响时间）
INIT_STD = 0.02             # 随机权重的标准差（BF16 里 32 层也不溢出）
CHIP = hw_specs.H200        # 拟合和对照用的芯片（测量在 H200 上）
MODELS = (llm_math.LLAMA32_1B, llm_math.LLAMA31_8B)
GRID = {"prefill_n": (1, 2, 4, 8), "prefill_len": (128, 512, 1024, 4096),
        "decode_batch": (1, 8, 32, 64, 128, 256), "decode_ctx": (512, 2048, 8192)}
EXTRA_DECODE = (("Llama-3.2-1B", 1, 160),)   # 第 11 讲时间线模型的那一步：1B、批 1、上下文 160
MODES = ("eager", "graph")
# --quick：小模型、小网格（CPU 上几秒走完整条代码路径）
TINY = llm_math.ModelConfig("tiny", n_layers=2, d_model=48, n_heads=6, n_kv_heads=2, d_head=8, d_ff=80, vocab=101)
WORKSPACE_BYTES = 1 << 30   # 每个点在 KV 和激活之外留的显存（cuBLAS 工作区、分配器碎片）
FIT_KEYS = ("mfu", "mbu", "overhead_eager_per_layer", "overhead_graph_per_layer")   # 拟合的参数（开销：每层秒数）
# serving_sim.H200_MEASURED 写几位有效数字、和重新拟合差多少算一致（半个末位）：拟合后的中位误差约 11%，更多位没有意义
CONST_DIGITS = 3
CONST_RTOL = 0.5 * 10.0 ** (1 - CONST_DIGITS)
# 默认假设（StepModel 的 mfu 0.6、mbu 0.8、每步 1 ms）：开销按步给，不分层数、不分 mode（step_overhead 认这两种写法）
DEFAULT_PARAMS = {"mfu": ss.MFU, "mbu": ss.MBU, "overhead_per_step": ss.STEP_OVERHEAD_S}


# =============================================================================
# 1. Llama 形状的 decoder，带预分配的 KV cache
# =============================================================================
class _Layer(nn.Module):
    """一层：x + attn(norm1(x))，再 x + mlp(norm2(x))。wqkv 把 q、k、v 三个投影拼成一个矩阵（引擎的做法）。"""

    def __init__(self, cfg):
        super().__init__()
        d = cfg.d_model
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.wqkv = nn.Linear(d, cfg.q_dim + 2 * cfg.kv_dim, bias=False)
        self.wo = nn.Linear(cfg.q_dim, d, bias=False)
        self.mlp = SwiGLU(d, cfg.d_ff)


class LlamaShaped(nn.Module):
    """
    forward(ids [B, T], cache [L, 2, B, G, S_max, dh], pos0, last_only=True) → logits [B, 1 或 T, V]。
    两种步：pos0 = 0 的 prefill（因果注意力，只看这 T 个新 token）；T = 1 的 decode（看 cache 前 pos0 + 1 格）。
    新 token 的 K、V 写进 cache 的第 pos0 … pos0 + T − 1 格。
    """

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.layers = nn.ModuleList(_Layer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model)
        self.head = None if cfg.tied else nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.cos = self.sin = None      # RoPE 表 [max_pos, dh/2]，build_model 放到设备上

    def forward(self, ids, cache, pos0=0, last_only=True):
        pos0 = _check_step(self, ids, cache, pos0, last_only)
        x = self.tok(ids)                                             # [B, T, d]
        for li, layer in enumerate(self.layers):
            x = x + self.attention(layer, layer.norm1(x), cache[li], pos0)
            x = x + layer.mlp(layer.norm2(x))
        if last_only:
            x = x[:, -1:]                                             # [B, 1, d]：只有最后一个 token 要采样
        w = self.tok.weight if self.cfg.tied else self.head.weight    # [V, d]
        return F.linear(self.norm(x), w)                              # [B, 1 或 T, V]

    def attention(self, layer, x, kv, pos0):
        """x [B, T, d]；kv = 这一层的 cache [2, B, G, S_max, dh]。返回 [B, T, d]。"""
        c = self.cfg
        B, T, _ = x.shape
        H, G, dh = c.n_heads, c.n_kv_heads, c.d_head
        q, k, v = layer.wqkv(x).split([H * dh, G * dh, G * dh], dim=-1)
        q = q.view(B, T, H, dh).transpose(1, 2)                       # [B, H, T, dh]
        k = k.view(B, T, G, dh).transpose(1, 2)                       # [B, G, T, dh]
        v = v.view(B, T, G, dh).transpose(1, 2)
        cos, sin = self.cos[pos0:pos0 + T], self.sin[pos0:pos0 + T]   # [T, dh/2]
        q, k = apply_rope_half(q, cos, sin), apply_rope_half(k, cos, sin)
        kv[0, :, :, pos0:pos0 + T] = k                                # 写 cache：[B, G, T, dh]
        kv[1, :, :, pos0:pos0 + T] = v
        if T == 1:
            # decode：一组的 R 个 query 头当作 R 个 query 位置，新 token 看得见 cache 里前 pos0 + 1 格的全部键
            qg = q.reshape(B, G, H // G, dh)                          # [B, G, R, dh]：头 h = g·R + r
            o = F.scaled_dot_product_attention(qg, kv[0, :, :, :pos0 + 1], kv[1, :, :, :pos0 + 1])
            o = o.reshape(B, H, 1, dh)                                # [B, H, 1, dh]
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)   # [B, H, T, dh]
        return layer.wo(o.transpose(1, 2).reshape(B, T, H * dh))      # [B, T, H·dh] → [B, T, d]


def build_model(cfg, device="cpu", dtype=torch.float32, seed=0, max_pos=256):
    """在 meta 设备上建（不占内存）、转成 dtype、在 device 上分配，再随机初始化：矩阵 N(0, INIT_STD)，RMSNorm 的缩放 1。
    8B 模型这样建只占 BF16 的 16 GB，不会先建一份 FP32。max_pos：RoPE 表的长度（最大位置 + 1）。"""
    device = _check_build(cfg, device, dtype, seed, max_pos)
    with torch.device("meta"):
        model = LlamaShaped(cfg)
    model = model.to(dtype).to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0.0, INIT_STD, generator=gen)
            else:
                p.fill_(1.0)
    cos, sin = rope_angles(torch.arange(max_pos, dtype=torch.float64), cfg.d_head, ROPE_BASE)   # [max_pos, dh/2]
    model.cos, model.sin = cos.to(device, dtype), sin.to(device, dtype)
    return model.eval()


def alloc_cache(cfg, batch, max_seq, dtype, device):
    """预分配的 KV cache [L, 2, B, G, S_max, dh]（torch.empty：内容未定义，prefill / decode 只读写过的格子）。"""
    batch, max_seq, device = _check_alloc_cache(cfg, batch, max_seq, dtype, device)
    return torch.empty(cfg.n_layers, 2, batch, cfg.n_kv_heads, max_seq, cfg.d_head, dtype=dtype, device=device)


@torch.no_grad()
def reference_logits(model, ids):
    """参考：整段 [B, T] 一次算完，所有位置的 logits [B, T, V]。注意力写成朴素的 softmax(QKᵀ/√dh + 因果掩码)·V，
    GQA 用 repeat_interleave 把 K、V 复制到每个 query 头；不用 cache、不用 SDPA。"""
    _check_reference(model, ids)
    c = model.cfg
    B, T = ids.shape
    H, G, dh = c.n_heads, c.n_kv_heads, c.d_head
    cos, sin = model.cos[:T], model.sin[:T]
    mask = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()           # [T, T]：查询 i 看键 j ≤ i
    x = model.tok(ids)                                                            # [B, T, d]
    for layer in model.layers:
        h = layer.norm1(x)
        q, k, v = layer.wqkv(h).split([H * dh, G * dh, G * dh], dim=-1)
        q = apply_rope_half(q.view(B, T, H, dh).transpose(1, 2), cos, sin)       # [B, H, T, dh]
        k = apply_rope_half(k.view(B, T, G, dh).transpose(1, 2), cos, sin)       # [B, G, T, dh]
        k = k.repeat_interleave(H // G, dim=1)                                   # [B, H, T, dh]
        v = v.view(B, T, G, dh).transpose(1, 2).repeat_interleave(H // G, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(dh)                            # [B, H, T, T]
        p = s.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        x = x + layer.wo((p @ v).transpose(1, 2).reshape(B, T, H * dh))
        x = x + layer.mlp(layer.norm2(x))
    w = model.tok.weight if c.tied else model.head.weight
    return F.linear(model.norm(x), w)                                             # [B, T, V]


# =============================================================================
# 2. 测量的网格：每点的形状、显存够不够
# =============================================================================
def plan_points(models, grid, modes=MODES, extra=EXTRA_DECODE):
    """测量网格（还没测的点）：每个模型 prefill n × T（eager），decode 批 × 上下文（每种 mode 各一点），加上 extra。"""
    models, grid, modes, extra = _check_plan(models, grid, modes, extra)
    pts = []
    for cfg in models:
        for n in grid["prefill_n"]:
            for T in grid["prefill_len"]:
                pts.append({"model": cfg.name, "kind": "prefill", "n_prompts": n, "prompt_len": T, "mode": "eager",
                            "tokens": n * T})
        pairs = [(b, c) for c in grid["decode_ctx"] for b in grid["decode_batch"]]
        pairs += [(b, c) for name, b, c in extra if name == cfg.name]
        for b, c in pairs:
            for mode in modes:
                pts.append({"model": cfg.name, "kind": "decode", "batch": b, "context": c, "mode": mode, "tokens": b})
    return pts


def point_shape(p):
    """这一点的 (序列数, cache 长度 S_max, 每序列送进几个 token, 起始位置 pos0)。"""
    _check_point(p, "p", "point_shape")
    if p["kind"] == "prefill":
        return p["n_prompts"], p["prompt_len"], p["prompt_len"], 0
    return p["batch"], p["context"] + 1, 1, p["context"]


def point_bytes(cfg, p, elem=2):
    """这一点在权重之外要的显存：(KV cache 字节, 工作区字节的估计)。工作区 = 固定 1 GiB + 每个 token 几份
    MLP 宽度的激活（gate、up、乘积、残差）+ logits（fp32 算）。"""
    _check_cfg(cfg, "point_bytes")
    check_real("elem", elem, 0.0, 8.0, lo_open=True, where="point_bytes")
    n, S, T, _ = point_shape(p)
    kv = n * S * cfg.kv_bytes_per_token(elem)
    work = WORKSPACE_BYTES + 4 * n * T * (cfg.d_ff + cfg.d_model) * elem + 4 * n * cfg.vocab
    return kv, work


def fits_chip(cfg, p, chip=CHIP, elem=2):
    """不上卡的估计：llm_math.fit（全课程"放不放得下"的规则；mem_util = 1，即整个可分配显存）的权重 + KV，
    再加上这一点的工作区（point_bytes）。synthetic_points 用它挑点。"""
    _check_cfg(cfg, "fits_chip")
    llm_math.check_model_chip(cfg, chip)
    n, S, _, _ = point_shape(p)
    f = llm_math.fit(cfg, chip, 1, n, S, elem, elem, mem_util=1.0)
    return f.fits and f.need + point_bytes(cfg, p, elem)[1] <= f.usable


def load_results(path):
    """读测量 JSON（course_utils.load_json），返回 (结果字典, {模型名: ModelConfig})；文件不存在时返回 None。"""
    res = load_json(path)
    if res is None:
        return None
    return res, {name: llm_math.ModelConfig(**d) for name, d in res["models"].items()}


# =============================================================================
# 3. 拟合：StepModel 的 mfu、mbu、两种开销（每层一个常数 × 层数）
# =============================================================================
def ideal_times(points, configs, chip=CHIP):
    """
    每一点在 StepModel 里的两边（mfu = mbu = 1、开销 0）：t_compute、t_memory（秒，数组）。任意参数下
    StepModel 的一步由它们算出：predict(t_compute, t_memory, mfu, mbu, overhead)。
    mem_util = 1：这里只比时间，不让 StepModel 的 90% 显存策略（A5）拒绝实际放得下的点。
    """
    _check_points(points, configs)
    steps, tc, tm = {}, [], []
    for p in points:
        name = p["model"]
        if name not in steps:
            steps[name] = ss.StepModel(configs[name], chip, mfu=1.0, mbu=1.0, overhead=0.0, mem_util=1.0)
        c = _step_cost(steps[name], p)
        tc.append(float(c.t_compute))
        tm.append(float(c.t_memory))
    return np.array(tc), np.array(tm)


def _step_cost(step, p):
    if p["kind"] == "prefill":
        return step.prefill_cost([p["prompt_len"]] * p["n_prompts"])
    return step.decode_cost(p["batch"], p["batch"] * (p["context"] + 1))


def step_overhead(params, mode, cfg):
    """
    参数 → 模型 cfg 在 mode（"eager" / "graph"）下每步的开销（秒），也就是 StepModel 的 overhead。两种写法：
      拟合的（FIT_KEYS）按层：overhead_{mode}_per_layer × cfg.n_layers（主机开销来自内核启动，内核数和层数成正比；
      值是 None——没有 graph 点的拟合——按 0 算）；
      默认假设（DEFAULT_PARAMS）按步：overhead_per_step（StepModel 的每步 1 ms），不分 mode、不分层数。
    mode 不是 MODES 之一、params 两种键都没有、两种键都有（不知道该用哪种）→ ValueError。
    """
    check_choice("mode", mode, MODES, where="step_overhead")
    _check_params(params, "step_overhead", eff=False)
    _check_cfg(cfg, "step_overhead")
    key = f"overhead_{mode}_per_layer"
    if "overhead_per_step" in params:
        both = [k for k in (f"overhead_{m}_per_layer" for m in MODES) if k in params]
        if both:
            raise ValueError(f"step_overhead：params 里既有 overhead_per_step（按步）又有 {'、'.join(both)}（按层），"
                             f"只能用一种写法；收到 {sorted(params)}")
        return float(params["overhead_per_step"])
    if key not in params:
        raise ValueError(f"step_overhead：params 里既没有 {key} 也没有 overhead_per_step，收到 {sorted(params)}")
    v = params[key]
    return 0.0 if v is None else float(v) * cfg.n_layers


def predict(tc, tm, mfu, mbu, overhead):
    """
    StepModel 的一步（tp = 1，没有通信）：max(tc / mfu, tm / mbu) + overhead。全部按 numpy 广播，点在最后一维：
    fit_loss、synthetic_points、拟合的目标函数和网格穷举（mfu、mbu、开销各占一维）都用这一个式子。
    compare_points 不用它，直接问 StepModel（测试查两者一致）。
    【报错】tc、tm、overhead 不是有限的非负数；mfu、mbu 不在 (0, 1] 里 → ValueError / TypeError（拟合的内层循环
        用不查的 _predict：只在这个入口查一次）。
    """
    return _predict(*_check_predict(tc, tm, mfu, mbu, overhead))


def _predict(tc, tm, mfu, mbu, overhead):
    return np.maximum(tc / mfu, tm / mbu) + overhead


def log_loss(pred, meas):
    """Σ log²(模型 / 实测)，对最后一维（点）求和：相对误差，大小点一样重。pred、meas 必须是有限的正数。"""
    return _log_loss(_positive("pred", pred, "log_loss"), _positive("meas", meas, "log_loss"))


def _log_loss(pred, meas):
    return np.sum(np.log(pred / meas) ** 2, axis=-1)


def _overheads(points, configs, params):
    """每一点的每步开销（数组）：step_overhead(params, 这一点的 mode, 这一点的模型)。"""
    return np.array([step_overhead(params, p["mode"], configs[p["model"]]) for p in points])


def fit_loss(points, configs, params, chip=CHIP):
    """Σ log²(模型 / 实测)（只用 status == "ok" 的点）：拟合最小化的量。
    params 用拟合的或默认的写法都行（step_overhead）。"""
    ok = _ok_points(points)
    _check_params(params, "fit_loss")
    tc, tm = ideal_times(ok, configs, chip)
    pred = _predict(tc, tm, params["mfu"], params["mbu"], _overheads(ok, configs, params))
    return float(_log_loss(pred, np.array([p["seconds"] for p in ok])))


def fit_step_params(points, configs, chip=CHIP):
    """
    拟合 StepModel 的 mfu、mbu（两种 mode 共用）和两种每层开销 overhead_eager_per_layer、overhead_graph_per_layer
    （一点的每步开销 = 每层开销 × 这个模型的 n_layers）：最小化 Σ log²(模型 / 实测)（相对误差，大小点一样重）。
    只用 status == "ok" 的点。
    做法（只用 numpy）：
      1. 对数网格穷举：mfu、mbu 各 31 格（[0.02, 1]），每层开销 {0} ∪ 50 格（[10 ns, 2 ms]）；给定 mfu、mbu，
         两种开销各管各的点，可以分开取最好的；
      2. 从最好的格点出发做坐标搜索（对数坐标：每个参数试 ± 步长，变好就走，没有一个变好就步长减半，
         从 0.25 减到 1e-7 以下）。不用导数：roofline 的 max() 有折点。
    没有 graph 点时 overhead_graph_per_layer 为 None。
    返回 {"mfu", "mbu", "overhead_eager_per_layer", "overhead_graph_per_layer", "loss", "n_points"}。
    """
    ok = _ok_points(points)
    tc, tm = ideal_times(ok, configs, chip)
    meas = np.array([p["seconds"] for p in ok])
    graph = np.array([p["mode"] == "graph" for p in ok])
    layers = np.array([configs[p["model"]].n_layers for p in ok], dtype=float)
    has_graph = bool(graph.any())
    if graph.all():
        raise ValueError("points 里至少要有一个 eager 点（prefill 都是 eager）")

    def loss(x):                                      # x = (log mfu, log mbu, log 每层 oe, log 每层 og)
        mfu, mbu, oe, og = np.exp(x)
        return float(_log_loss(_predict(tc, tm, mfu, mbu, np.where(graph, og, oe) * layers), meas))

    active = np.array([True, True, True, has_graph])
    x = _coordinate_search(loss, _grid_start(tc, tm, meas, graph, layers), active, step=0.25)
    mfu, mbu, oe, og = (float(v) for v in np.exp(x))
    return {"mfu": mfu, "mbu": mbu, "overhead_eager_per_layer": oe,
            "overhead_graph_per_layer": og if has_graph else None, "loss": loss(x), "n_points": len(ok)}


def _grid_start(tc, tm, meas, graph, layers):
    """网格上最好的 (log mfu, log mbu, log 每层 oe, log 每层 og)。"""
    eff = np.geomspace(0.02, 1.0, 31)
    ovh = np.concatenate([[1e-10], np.geomspace(1e-8, 2e-3, 50)])               # 每层；1e-10 ≈ 0（取对数用）
    best, total = [], 0.0
    for sel in (~graph, graph):
        if not sel.any():
            best.append(np.zeros((len(eff), len(eff)), dtype=int))
            continue
        pred = _predict(tc[sel], tm[sel], eff[:, None, None, None], eff[None, :, None, None],
                       ovh[:, None] * layers[sel])                              # [mfu, mbu, 开销, 点]
        err = _log_loss(pred, meas[sel])                                        # [mfu, mbu, 开销]
        best.append(err.argmin(axis=2))
        total = total + err.min(axis=2)
    i, j = np.unravel_index(np.argmin(total), total.shape)
    return np.log([eff[i], eff[j], ovh[best[0][i, j]], ovh[best[1][i, j]]])


X_HI = np.log([1.0, 1.0, 0.1, 0.1])      # mfu、mbu ≤ 1（StepModel 的范围）；每层开销 ≤ 0.1 s
X_LO = np.log([1e-3, 1e-3, 1e-10, 1e-10])  # 每层开销 1e-10 s 就是 0


def _coordinate_search(loss, x, active, step=0.25, tol=1e-7):
    """坐标（模式）搜索：每个可调的坐标试 ±step，有改进就走，一轮没有改进就步长减半，直到 step < tol。
    参数夹在 [X_LO, X_HI]。"""
    x, fx = np.array(x, dtype=float), loss(x)
    while step >= tol:
        moved = False
        for k in np.nonzero(active)[0]:
            for sgn in (1.0, -1.0):
                y = x.copy()
                y[k] += sgn * step
                y = np.clip(y, X_LO, X_HI)
                fy = loss(y)
                if fy < fx:
                    x, fx, moved = y, fy, True
                    break
        if not moved:
            step /= 2
    return x


def nudged_losses(points, configs, params, rel=0.01, n_dirs=32, seed=0, chip=CHIP):
    """
    局部最小的检查：在拟合参数（FIT_KEYS 里不是 None 的）的对数坐标里取 n_dirs 个随机单位方向 u（种子 seed），
    把参数一起挪到 参数 × exp(rel · u)（每个最多挪 rel），返回这些点的 fit_loss（数组）。params 是 fit_step_params
    的最小值时，每个都不小于 fit_loss(params)（演示和测试都查）。坐标搜索只在停下时试过每个参数单独 ± 步长；
    斜着的方向（例如 mfu、mbu 一起变）它没有试过，这个检查才不是它的停止条件的复述。mfu、mbu 夹在 ≤ 1。
    """
    _check_params(params, "nudged_losses")
    rel = check_real("rel", rel, 0.0, 1.0, lo_open=True, where="nudged_losses")
    n_dirs = check_int("n_dirs", n_dirs, 1, 10_000, where="nudged_losses")
    rng = check_seed("seed", seed, where="nudged_losses")
    keys = [k for k in FIT_KEYS if params.get(k) is not None]
    dirs = rng.standard_normal((n_dirs, len(keys)))
    out = []
    for u in dirs / np.linalg.norm(dirs, axis=1, keepdims=True):
        q = dict(params)
        for k, uk in zip(keys, u):
            q[k] = params[k] * math.exp(rel * uk)
            if k in ("mfu", "mbu"):
                q[k] = min(q[k], 1.0)                 # StepModel 的范围：mfu、mbu ≤ 1
        out.append(fit_loss(points, configs, q, chip))
    return np.array(out)


def compare_points(points, configs, params, chip=CHIP):
    """逐点：StepModel(model, chip, mfu, mbu, overhead = overhead(params, 这一点的 mode、模型)) 的预测 vs 实测。
    返回字典列表（原来的字段 + index = 这一点在 points 里的位置（JSON 的顺序就是测量顺序）、model_s、
    roofline_s = max(t_compute, t_memory)（不含开销）、ratio = 模型 / 实测、bound）。预测直接问 StepModel
    （不是拟合用的 predict）。params 用拟合的或默认的写法都行（step_overhead）。"""
    _check_params(params, "compare_points")
    index = {id(p): i for i, p in enumerate(points)}
    rows = []
    for p in _ok_points(points):
        cfg = configs[p["model"]]
        step = ss.StepModel(cfg, chip, mfu=params["mfu"], mbu=params["mbu"],
                            overhead=step_overhead(params, p["mode"], cfg), mem_util=1.0)
        c = _step_cost(step, p)
        t = float(c.total)
        rows.append({**p, "index": index[id(p)], "model_s": t, "roofline_s": float(max(c.t_compute, c.t_memory)),
                     "ratio": t / p["seconds"], "bound": str(c.bound)})
    return rows


def group_rows(rows):
    """compare_points 的行按 (模型, 步, 执行方式) 分组：{(model, kind, mode): [行, …]}（保持原来的顺序）。"""
    groups = {}
    for r in _check_rows(rows, "group_rows", keys=("model", "kind", "mode")):
        groups.setdefault((r["model"], r["kind"], r["mode"]), []).append(r)
    return groups


def error_summary(rows):
    """compare_points 的行 → {"median": 中位 |模型/实测 − 1|, "worst": |log 比值| 最大的那一行}
    （course_utils.ratio_errors，各讲的校准表共用）。"""
    rows = _check_rows(rows, "error_summary")
    if not rows:
        raise ValueError("error_summary：rows 不能是空的（compare_points 的结果）")
    median, worst = ratio_errors([r["ratio"] for r in rows])
    return {"median": median, "worst": rows[worst]}


def worst_rows(rows, n):
    """compare_points 的行里最差的 n 行（按 |log 比值| 从大到小；一样差时保持原来的顺序）：慢一半（0.5）和
    快一倍（2.0）一样差，和 error_summary 的 "worst"（course_utils.ratio_errors）同一个标准，第一行就是它。"""
    n = check_int("n", n, lo=0, where="worst_rows")
    rows = _check_rows(rows, "worst_rows")
    return sorted(rows, key=lambda r: abs(math.log(r["ratio"])), reverse=True)[:n]


def explain_point(row, cfg, kernels_per_step=None, peers=None):
    """这一点 StepModel 没有算到的东西（中文短句的列表），数字由 cfg 算出；kernels_per_step：实测的一次 decode
    启动几个 GPU 内核（meta["kernels"]，没有就不写具体数）；peers：同一模型、同一种步、同一执行方式的其余点
    （compare_points 的行）。eager 的 decode 受主机限制，各点本该差不多：这一点远慢于它们时，写出倍数、它在这一组里
    第几个测的（index）和计时的次数（reps、trials）——原因这里查不出来，不猜。"""
    row, peers = _check_explain(row, cfg, kernels_per_step, peers)
    notes = []
    if peers:
        typical = float(np.median([r["seconds"] for r in peers]))
        if row["seconds"] > 1.5 * typical:
            order = 1 + sum(r["index"] < row["index"] for r in peers)
            notes.append(f"实测是同一模型、同一种步、同一执行方式其余 {len(peers)} 个点中位数"
                         f"（{typical * 1e3:.1f} ms）的 {row['seconds'] / typical:.1f} 倍，而这种步受主机限制、"
                         f"多数点在中位数上下：多出来的时间不像是模型漏算的。它是这 {len(peers) + 1} 个点里第 {order} "
                         f"个测的，计时每组 {row.get('reps', '?')} 步、{row.get('trials', '?')} 组取最快。"
                         "原因没有查清：预热不足和测量时主机变慢都说得通，要重测才分得清")
    flops_tok = cfg.linear_flops_per_token()
    head = 2 * cfg.d_model * cfg.vocab                              # lm_head 每个 token 的 FLOPs
    if row["kind"] == "prefill":
        n, T = row["n_prompts"], row["prompt_len"]
        attn = cfg.attn_flops_per_token(1) * n * T * (T + 1) / 2
        total = n * T * flops_tok + attn
        notes.append(f"模型按每个 token 都过 lm_head 计 FLOPs，实测只算最后一个 token 的 logits："
                     f"多算了 {(n * T - n) * head / total:.0%} 的 FLOPs")
        notes.append(f"注意力占模型 FLOPs 的 {attn / total:.0%}：FlashAttention 的算力效率和矩阵乘不同，"
                     f"共用一个 mfu 会偏")
    else:
        b, ctx = row["batch"], row["context"]
        kv = b * (ctx + 1) * cfg.kv_bytes_per_token(2)
        w = cfg.matmul_params() * 2
        notes.append(f"读 KV 占模型字节的 {kv / (kv + w):.0%}：decode 注意力（每个 KV 头一个 R 行的小查询）的带宽效率"
                     f"和读权重的矩阵乘不同")
        if row["mode"] == "eager" and row["ratio"] > 1:          # 模型高估时才是这个原因
            k = (f"每步启动 {kernels_per_step} 个 GPU 内核（每层约 {kernels_per_step / cfg.n_layers:.0f} 个）"
                 if kernels_per_step else "每层几十次内核启动")
            notes.append(f"eager：{k}；主机发内核和 GPU 执行是重叠的，一步更接近 max(主机时间, GPU 时间)，"
                         f"模型却把每层开销 × {cfg.n_layers} 层加在 roofline 上（大批、长上下文时高估）")
        if b <= 8:
            notes.append("批很小：矩阵乘是细长的 GEMV，达不到大矩阵的带宽")
    notes.append(f"这一点在模型里是 {row['bound']} 受限；roofline 的 max() 假设两边完全重叠")
    return notes


def constant_text(fit, meta):
    """拟合结果 → 粘贴进 serving_sim.py 的 H200_MEASURED = {...}（CONST_DIGITS 位有效数字；三行，每行不超过 120 字符）。
    "source" 是出处：GPU、驱动、torch / CUDA 版本、日期、拟合的哪个 JSON。
    开销是每层的秒数（h200_measured_step 乘模型的 n_layers）。"""
    _check_params(fit, "constant_text", name="fit")
    if not isinstance(meta, dict):
        raise TypeError(f"constant_text：meta 必须是字典（测量结果的 meta），收到 {type(meta).__name__}")

    def g(v):
        return "None" if v is None else f"{v:.{CONST_DIGITS}g}"
    where = (f"{meta.get('gpu')}, driver {meta.get('driver')}, torch {meta.get('torch')}, CUDA {meta.get('cuda')}, "
             f"{meta.get('date')}; ")
    return (f'H200_MEASURED = {{"mfu": {g(fit["mfu"])}, "mbu": {g(fit["mbu"])}, '
            f'"overhead_eager_per_layer": {g(fit["overhead_eager_per_layer"])}, '
            f'"overhead_graph_per_layer": {g(fit["overhead_graph_per_layer"])},\n'
            f'                 "source": "{where}"\n'
            f'                           "fit of lecture05/bench/results/step_measure.json"}}')


def synthetic_points(models, grid, params, chip=CHIP, noise=0.0, seed=0):
    """用 StepModel 自己生成"实测"（拟合恢复测试与演示的测试用）：plan_points 里放得下（fits_chip）的每一点，
    秒数 = 模型（predict；开销 step_overhead(params, mode, 模型)）× exp(noise·N(0,1))。"""
    _check_params(params, "synthetic_points")
    noise = check_real("noise", noise, 0.0, 10.0, where="synthetic_points")
    rng = check_seed("seed", seed, where="synthetic_points")
    configs = {m.name: m for m in _check_models(models, "synthetic_points")}
    pts = [p for p in plan_points(models, grid) if fits_chip(configs[p["model"]], p, chip)]
    tc, tm = ideal_times(pts, configs, chip)
    t = _predict(tc, tm, params["mfu"], params["mbu"], _overheads(pts, configs, params))
    for p, s in zip(pts, t * np.exp(noise * rng.standard_normal(len(pts)))):
        p.update(status="ok", seconds=float(s))
    return pts


def synthetic_results(params, noise=0.0, seed=0, models=MODELS, grid=GRID):
    """和 measure 写的 JSON 同样结构的合成结果（meta 里标着 synthetic），演示的测试用。"""
    models = _check_models(models, "synthetic_results")
    meta = {"synthetic": True, "gpu": "synthetic (StepModel)", "driver": "-", "torch": torch.__version__, "cuda": None,
            "date": datetime.date.today().isoformat(), "dtype": "bfloat16", "device": "none", "quick": False,
            "params": params, "noise": noise, "seed": seed}
    return {"meta": meta, "models": {m.name: dataclasses.asdict(m) for m in models},
            "points": synthetic_points(models, grid, params, noise=noise, seed=seed)}


# =============================================================================
# 输入检查（放在教学代码之后）
# =============================================================================
def _check_cfg(cfg, where):
    if not isinstance(cfg, llm_math.ModelConfig):
        raise TypeError(f"{where}：cfg 必须是 llm_math.ModelConfig，收到 {type(cfg).__name__}")
    return cfg


def _device_bytes(dev):
    """设备上的内存：CUDA 是整块卡的显存，CPU 是这台机器的物理内存（读不到时 None）。"""
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).total_memory
    return machine_memory_bytes()


def _check_room(what, need, dev, where, name):
    have = _device_bytes(dev)
    if have is not None and need > have:
        raise ValueError(f"{where}：{name} 要 {fmt_bytes(need)}（{what}），{dev} 上只有 {fmt_bytes(have)}")


def _check_dtype(dtype, where):
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{where}：dtype 必须是浮点 torch.dtype，收到 {dtype!r}")
    return torch.tensor([], dtype=dtype).element_size()


def _check_build(cfg, device, dtype, seed, max_pos):
    """build_model 的检查；返回 torch.device。权重、RoPE 表放不进设备内存时 ValueError（先算、不先分配）。"""
    w = "build_model"
    _check_cfg(cfg, w)
    if cfg.qkv_bias or cfg.n_pos or cfg.extra_per_layer or cfg.extra_final:
        raise ValueError(f"build_model：cfg 必须是 Llama 形状（没有 qkv 偏置、可学习位置、额外参数），收到 {cfg}")
    if cfg.d_head % 2:
        raise ValueError(f"build_model：d_head 必须是偶数（RoPE 两两配对），收到 {cfg.d_head}")
    elem = _check_dtype(dtype, w)
    check_int("seed", seed, lo=0, hi=2 ** 63 - 1, where=w)     # torch.Generator 的种子：整数（check_seed 给 numpy）
    max_pos = check_int("max_pos", max_pos, lo=1, where=w)
    dev = check_device("device", device, where=w, type_error=ValueError)
    _check_room(f"{cfg.name} 的权重 {cfg.n_params():,} 个参数 × {elem} 字节", cfg.n_params() * elem, dev, w, "cfg")
    _check_room(f"RoPE 表 2 × {max_pos:,} × {cfg.d_head // 2} × {elem} 字节", max_pos * cfg.d_head * elem, dev, w,
                "max_pos")
    return dev


def _check_alloc_cache(cfg, batch, max_seq, dtype, device):
    w = "alloc_cache"
    _check_cfg(cfg, w)
    batch = check_int("batch", batch, lo=1, where=w)
    max_seq = check_int("max_seq", max_seq, lo=1, where=w)
    elem = _check_dtype(dtype, w)
    dev = check_device("device", device, where=w, type_error=ValueError)
    need = batch * max_seq * cfg.kv_bytes_per_token(elem)
    _check_room(f"KV cache {cfg.n_layers} 层 × 2 × {batch:,} × {cfg.n_kv_heads} × {max_seq:,} × {cfg.d_head} × "
                f"{elem} 字节", need, dev, w, "batch × max_seq")
    return batch, max_seq, dev


def _check_ids(model, ids, where):
    """ids：[B, T] 的 int64 / int32 张量，和模型在同一设备上。CPU 上还查取值在 [0, vocab) 里；
    CUDA 上不查取值（要把张量读回主机、同步一次，会改变被测的一步，CUDA graph 录制时也不允许）。"""
    if not torch.is_tensor(ids) or ids.ndim != 2 or ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{where}：ids 必须是 [B, T] 的 int64 / int32 张量，收到 "
                        f"{getattr(ids, 'dtype', type(ids).__name__)} {tuple(getattr(ids, 'shape', ()))}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"{where}：ids 不能是空的，收到形状 {tuple(ids.shape)}")
    weight = model.tok.weight
    if ids.device != weight.device:
        raise ValueError(f"{where}：ids 在 {ids.device} 上，模型在 {weight.device} 上")
    if ids.device.type == "cpu":
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= model.cfg.vocab:
            raise ValueError(f"{where}：ids 的 token 必须在 [0, {model.cfg.vocab}) 里（vocab），收到范围 [{lo}, {hi}]")


def _check_step(model, ids, cache, pos0, last_only):
    """forward 的入口检查（形状、dtype、设备的比较；只在 CPU 上碰 ids 的值）。返回 pos0（int）。"""
    c = model.cfg
    _check_ids(model, ids, "LlamaShaped")
    check_bool("last_only", last_only, where="LlamaShaped")
    B, T = ids.shape
    want = (c.n_layers, 2, B, c.n_kv_heads, c.d_head)
    if not torch.is_tensor(cache) or cache.ndim != 6 or tuple(cache.shape[:4]) + (cache.shape[5],) != want:
        raise ValueError(f"cache 必须是 [L, 2, B, G, S_max, dh] = [{want[0]}, 2, {B}, {want[3]}, S_max, {want[4]}]，"
                         f"收到 {getattr(cache, 'shape', type(cache).__name__)}")
    weight = model.tok.weight
    if cache.dtype != weight.dtype or cache.device != weight.device:
        raise ValueError(f"LlamaShaped：cache 是 {cache.dtype} / {cache.device}，模型是 {weight.dtype} / "
                         f"{weight.device}：两者要一样（alloc_cache 传同一个 dtype、device）")
    pos0 = check_int("pos0", pos0, lo=0, where="LlamaShaped")
    if pos0 > 0 and T > 1:
        raise ValueError(f"一步只能是 prefill（pos0 = 0）或 decode（T = 1）；收到 pos0 = {pos0}、T = {T}")
    if pos0 + T > min(cache.shape[4], model.cos.shape[0]):
        raise ValueError(f"pos0 + T = {pos0 + T} 超过 cache 长度 S_max = {cache.shape[4]} 或 RoPE 表长度 "
                         f"{model.cos.shape[0]}")
    return pos0


def _check_reference(model, ids):
    if not isinstance(model, LlamaShaped) or model.cos is None:
        raise TypeError(f"reference_logits：model 必须是 build_model 建的 LlamaShaped，收到 {type(model).__name__}")
    _check_ids(model, ids, "reference_logits")
    B, T = ids.shape
    if T > model.cos.shape[0]:
        raise ValueError(f"reference_logits：ids 的长度 T = {T} 超过 RoPE 表长度 {model.cos.shape[0]}（max_pos）")
    elem = model.tok.weight.element_size()
    _check_room(f"注意力分数 {B} × {model.cfg.n_heads} × {T}² × {elem} 字节", B * model.cfg.n_heads * T * T * elem,
                model.tok.weight.device, "reference_logits", "ids")


def _check_models(models, where):
    if isinstance(models, llm_math.ModelConfig) or not isinstance(models, (list, tuple)):
        raise TypeError(f"{where}：models 必须是 ModelConfig 的列表或元组，收到 {type(models).__name__}")
    for i, m in enumerate(models):
        if not isinstance(m, llm_math.ModelConfig):
            raise TypeError(f"{where}：models[{i}] 必须是 llm_math.ModelConfig，收到 {type(m).__name__}")
    if not models:
        raise ValueError(f"{where}：models 不能是空的")
    return tuple(models)


def _check_plan(models, grid, modes, extra):
    w = "plan_points"
    models = _check_models(models, w)
    if not isinstance(grid, dict) or set(grid) != set(GRID):
        raise ValueError(f"{w}：grid 必须是键为 {sorted(GRID)} 的字典，收到 "
                         f"{sorted(grid) if isinstance(grid, dict) else type(grid).__name__}")
    for k, vals in grid.items():
        if isinstance(vals, (str, bytes)) or not isinstance(vals, (list, tuple)) or not vals:
            raise TypeError(f"{w}：grid[{k!r}] 必须是非空的整数列表，收到 {vals!r}")
        for v in vals:
            check_int(f"grid[{k!r}] 的元素", v, lo=1, hi=1 << 20, where=w)
    if isinstance(modes, str) or not isinstance(modes, (list, tuple)):
        raise TypeError(f"{w}：modes 必须是 {MODES} 的子集（元组），收到 {modes!r}")
    for m in modes:
        check_choice("modes 的元素", m, MODES, where=w)
    if not isinstance(extra, (list, tuple)):
        raise TypeError(f"{w}：extra 必须是 (模型名, 批, 上下文) 的元组，收到 {type(extra).__name__}")
    for e in extra:
        if not isinstance(e, (list, tuple)) or len(e) != 3:
            raise ValueError(f"{w}：extra 的元素必须是 (模型名, 批, 上下文)，收到 {e!r}")
        check_int("extra 的批", e[1], lo=1, hi=1 << 20, where=w)
        check_int("extra 的上下文", e[2], lo=0, hi=1 << 24, where=w)
    return models, grid, tuple(modes), tuple(extra)


def _check_point(p, name, where):
    """一个测量点（字典）：kind、mode 是合法的选择，形状字段是整数。"""
    if not isinstance(p, dict):
        raise TypeError(f"{where}：{name} 必须是测量点（字典），收到 {type(p).__name__}")
    check_choice(f"{name}['kind']", p.get("kind"), ("prefill", "decode"), where=where)
    keys = ("n_prompts", "prompt_len") if p["kind"] == "prefill" else ("batch", "context")
    for k in keys:
        check_int(f"{name}[{k!r}]", p.get(k), lo=1 if k != "context" else 0, where=where)


def _ok_points(points):
    if not isinstance(points, (list, tuple)):
        raise TypeError(f"points 必须是点（字典）的列表，收到 {type(points).__name__}")
    for i, p in enumerate(points):
        if not isinstance(p, dict):
            raise TypeError(f"points[{i}] 必须是字典，收到 {type(p).__name__}")
    ok = [p for p in points if p.get("status", "ok") == "ok"]
    if not ok:
        raise ValueError("points 里没有测到的点（status == 'ok'）")
    index = {id(p): i for i, p in enumerate(points)}
    for p in ok:
        check_real(f"points[{index[id(p)]}]['seconds']", p.get("seconds"), lo=0.0, lo_open=True)
    return ok


def _check_points(points, configs):
    if not isinstance(configs, dict):
        raise TypeError(f"configs 必须是 {{模型名: ModelConfig}}，收到 {type(configs).__name__}")
    if not isinstance(points, (list, tuple)):
        raise TypeError(f"points 必须是点（字典）的列表，收到 {type(points).__name__}")
    for i, p in enumerate(points):
        _check_point(p, f"points[{i}]", "")
        if p.get("model") not in configs:
            raise ValueError(f"points[{i}]['model'] = {p.get('model')!r} 不在 configs 里（有：{sorted(configs)}）")
        check_choice(f"points[{i}]['mode']", p.get("mode"), MODES)


def _check_params(params, where, eff=True, name="params"):
    """参数字典：mfu、mbu 在 (0, 1]（eff=False 时不要求有这两个键）；开销（有的那些）是有限的非负数或 None
    （没有 graph 点的拟合）。"""
    if not isinstance(params, dict):
        raise TypeError(f"{where}：{name} 必须是字典（如 DEFAULT_PARAMS 或 fit_step_params 的结果），"
                        f"收到 {type(params).__name__}")
    for k in ("mfu", "mbu") if eff else ():
        if k not in params:
            raise ValueError(f"{where}：{name} 缺少 {k!r}，收到 {sorted(params)}")
        check_real(f"{name}[{k!r}]", params[k], 0.0, 1.0, lo_open=True, where=where)
    for k in ("overhead_per_step",) + FIT_KEYS[2:]:
        if params.get(k) is not None:
            check_real(f"{name}[{k!r}]", params[k], 0.0, 10.0, where=where)


def _check_predict(tc, tm, mfu, mbu, overhead):
    w = "predict"
    tc, tm = check_array("tc", tc, where=w), check_array("tm", tm, where=w)
    overhead = check_array("overhead", overhead, where=w)
    for name, a in (("tc", tc), ("tm", tm), ("overhead", overhead)):
        if (a < 0).any():
            raise ValueError(f"{w}：{name} 必须 ≥ 0，最小的是 {a.min()}")
    mfu, mbu = check_array("mfu", mfu, where=w), check_array("mbu", mbu, where=w)
    for name, a in (("mfu", mfu), ("mbu", mbu)):
        if (a <= 0).any() or (a > 1).any():
            raise ValueError(f"{w}：{name} 必须在 (0, 1] 里，收到范围 [{a.min()}, {a.max()}]")
    return tc, tm, mfu, mbu, overhead


def _positive(name, v, where):
    a = check_array(name, v, where=where)
    if a.size and (a <= 0).any():
        raise ValueError(f"{where}：{name} 必须是正数（比值取对数），最小的是 {a.min()}")
    return a


def _check_rows(rows, where, keys=("ratio",), name="rows"):
    """compare_points 的行：字典的列表，每行有 keys；ratio 有限且 > 0。"""
    if not isinstance(rows, (list, tuple)):
        raise TypeError(f"{where}：{name} 必须是 compare_points 的行（字典的列表），收到 {type(rows).__name__}")
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or any(k not in r for k in keys):
            raise ValueError(f"{where}：{name}[{i}] 必须是有 {list(keys)} 的字典（compare_points 的行），收到 {r!r}")
        if "ratio" in keys:
            check_real(f"{name}[{i}]['ratio']", r["ratio"], lo=0.0, lo_open=True, where=where)
    return list(rows)


def _check_explain(row, cfg, kernels_per_step, peers):
    w = "explain_point"
    need = ("kind", "mode", "seconds", "ratio", "bound")
    if not isinstance(row, dict) or any(k not in row for k in need):
        raise ValueError(f"{w}：row 必须是 compare_points 的一行（有 {list(need)}），收到 {row!r}")
    _check_point(row, "row", w)
    check_real("row['seconds']", row["seconds"], lo=0.0, lo_open=True, where=w)
    _check_cfg(cfg, w)
    if kernels_per_step is not None:
        check_int("kernels_per_step", kernels_per_step, lo=1, where=w)
    if peers is not None:
        peers = _check_rows(peers, w, keys=("seconds", "index"), name="peers")
        if "index" not in row and peers:
            raise ValueError(f"{w}：给了 peers 时 row 要有 'index'（compare_points 的行）")
    return row, peers


# =============================================================================
# 自检与命令行
# =============================================================================
def check_cache_equivalence(cfg, batch, prompt, n_decode, dtype=torch.float64, seed=0):
    """prefill(prompt 个) + 逐个 decode（n_decode 步）的 logits vs 整段一次算（SDPA 与朴素参考）。返回两个最大误差。"""
    batch = check_int("batch", batch, lo=1, where="check_cache_equivalence")
    prompt = check_int("prompt", prompt, lo=1, where="check_cache_equivalence")
    n_decode = check_int("n_decode", n_decode, lo=1, where="check_cache_equivalence")
    seed = check_int("seed", seed, lo=0, hi=2 ** 63 - 1, where="check_cache_equivalence")
    model = build_model(cfg, "cpu", dtype, seed=seed, max_pos=prompt + n_decode)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(cfg.vocab, (batch, prompt + n_decode), generator=gen)     # [B, P + n]
    with torch.no_grad():
        cache = alloc_cache(cfg, batch, prompt + n_decode, dtype, "cpu")
        got = [model(ids[:, :prompt], cache, 0)[:, 0]]                           # [B, V]：位置 P − 1 的 logits
        for j in range(n_decode - 1):
            got.append(model(ids[:, prompt + j:prompt + j + 1], cache, prompt + j)[:, 0])
        got = torch.stack(got, dim=1)                                             # [B, n, V]
        full = model(ids, alloc_cache(cfg, batch, prompt + n_decode, dtype, "cpu"), 0, last_only=False)
    ref = reference_logits(model, ids)                                            # [B, P + n, V]
    want = full[:, prompt - 1:prompt + n_decode - 1]
    return float((got - want).abs().max()), float((full - ref).abs().max())


def _selftest():
    t0 = time.perf_counter()
    torch.manual_seed(0)
    torch.set_num_threads(1)            # 小张量：多线程只有同步开销（2 核的课程机上还会和别的进程抢）
    # 1. 预分配 cache 的 prefill + decode = 整段一次算 = 朴素注意力参考（不规则尺寸、GQA、tied 与不 tied）
    for tied, (B, P, n) in ((False, (3, 7, 5)), (True, (2, 1, 4))):
        cfg = llm_math.ModelConfig("odd", n_layers=2, d_model=40, n_heads=6, n_kv_heads=2, d_head=6, d_ff=52,
                                   vocab=97, tied=tied)
        e_cache, e_ref = check_cache_equivalence(cfg, B, P, n)
        assert e_cache < 1e-10 and e_ref < 1e-10, (tied, e_cache, e_ref)
    e32, _ = check_cache_equivalence(TINY, 2, 5, 3, dtype=torch.float32)
    assert e32 < 1e-4, e32
    # 2. 拟合从 StepModel 自己生成的点里找回真参数（完整的 H200 网格形状）
    true = {"mfu": 0.71, "mbu": 0.83, "overhead_eager_per_layer": 1.9e-4, "overhead_graph_per_layer": 2.6e-6}
    pts = synthetic_points(MODELS, GRID, true)
    fit = fit_step_params(pts, {m.name: m for m in MODELS})
    for k in true:
        assert abs(fit[k] - true[k]) <= 1e-3 * true[k], (k, fit[k], true[k])
    rows = compare_points(pts, {m.name: m for m in MODELS}, fit)
    assert error_summary(rows)["median"] < 1e-4
    # 3. 坏输入：清楚的 TypeError / ValueError
    m = build_model(TINY, max_pos=8)
    cache = alloc_cache(TINY, 1, 8, torch.float32, "cpu")
    for bad, exc in ((lambda: build_model("8B"), TypeError),
                     (lambda: m(torch.zeros(1, 2, dtype=torch.long), cache, 3), ValueError),
                     (lambda: m(torch.zeros(1, 1, dtype=torch.long), cache, 8), ValueError),
                     (lambda: m(torch.zeros(2, 1, dtype=torch.long), cache, 0), ValueError),
                     (lambda: fit_step_params([], {}), ValueError),
                     (lambda: fit_step_params([{**pts[0], "seconds": -1.0}], {m.name: m for m in MODELS}),
                      ValueError)):
        try:
            bad()
            raise AssertionError("坏输入没有报错")
        except exc:
            pass
    print(f"step_bench 自检通过：cache 的 prefill + decode = 整段 = 朴素参考（float64 误差 < 1e-10），"
          f"拟合找回 mfu {fit['mfu']:.3f}、mbu {fit['mbu']:.3f}、"
          f"每层开销 {fit['overhead_eager_per_layer'] * 1e6:.0f} / {fit['overhead_graph_per_layer'] * 1e6:.1f} µs"
          f"（{time.perf_counter() - t0:.1f} s）")


if __name__ == "__main__":
    _selftest()
