"""第 1 讲的错误答案语料（只给老师）：数参数、KV、roofline、decode 吞吐时常见的错，每个都必须被检查拒绝。"""
from grading import Wrong, module

lm = module("lecture01", "llm_math")
_step_time = lm.step_time
_decode_time = lm.decode_time_per_token


# ---- 1.1 参数量 -------------------------------------------------------------------
def _layer(self, kv_dim, q_in, mlp_mats=3, bias=None):
    d = self.d_model
    attn = d * (q_in + 2 * kv_dim) + q_in * d
    if self.qkv_bias:
        attn += bias if bias is not None else self.q_dim + 2 * kv_dim
    return {"attention": attn, "mlp": mlp_mats * d * self.d_ff, "norms": 2 * d, "other": self.extra_per_layer}


def layer_kv_as_mha(self):
    return _layer(self, self.q_dim, self.q_dim)                          # K、V 也按 H 个头算


def layer_wq_square(self):
    return _layer(self, self.kv_dim, self.d_model)                       # 以为 H·dh 总等于 d


def layer_bias_3d(self):
    return _layer(self, self.kv_dim, self.q_dim, bias=3 * self.d_model)  # 偏置按 3d 算（只对 MHA、dh = d/H 成立）


def layer_mlp_two_mats(self):
    return _layer(self, self.kv_dim, self.q_dim, mlp_mats=2)             # 按 GELU MLP 只算两个矩阵


def _groups(self, tied_twice=False, final_norm=True, n_pos=True, extra_final=True):
    L, d, V = self.n_layers, self.d_model, self.vocab
    lp = self.layer_params()
    return {"embeddings": V * d + (self.n_pos * d if n_pos else 0), "attention": L * lp["attention"],
            "mlp": L * lp["mlp"], "norms": L * lp["norms"] + (d if final_norm else 0),
            "lm_head": V * d if (tied_twice or not self.tied) else 0,
            "other": L * lp["other"] + (self.extra_final if extra_final else 0)}


def groups_tied_twice(self):
    return _groups(self, tied_twice=True)


def groups_no_final_norm(self):
    return _groups(self, final_norm=False)


def groups_no_positions(self):
    return _groups(self, n_pos=False)


def groups_no_extra_final(self):
    return _groups(self, extra_final=False)


# ---- 1.2 KV cache -----------------------------------------------------------------
def kv_uses_query_heads(self, bytes_per_elem=2.0):
    return 2 * self.n_layers * self.n_heads * self.d_head * bytes_per_elem


def kv_only_k(self, bytes_per_elem=2.0):
    return self.n_layers * self.n_kv_heads * self.d_head * bytes_per_elem


def kv_d_over_group(self, bytes_per_elem=2.0):
    return 2 * self.n_layers * (self.d_model // self.group) * bytes_per_elem     # 以为 G·dh = d / (H/G)


def kv_fixed_bf16(self, bytes_per_elem=2.0):
    return 2 * self.n_layers * self.n_kv_heads * self.d_head * 2


def cache_ctx_plus_one(self, batch, ctx, bytes_per_elem=2.0):
    return batch * (ctx + 1) * self.kv_bytes_per_token(bytes_per_elem)


def cache_ignores_batch(self, batch, ctx, bytes_per_elem=2.0):
    return ctx * self.kv_bytes_per_token(bytes_per_elem)


# ---- 1.3 roofline -----------------------------------------------------------------
def _step(model, chip, batch, n_new, ctx=0, prec="bf16", w_bytes=2.0, kv_bytes=2.0, mfu=1.0, mbu=1.0,
          n_chips=1, mem_util=lm.MEM_UTIL, rule="tp", how=""):
    flops = model.step_flops(batch, n_new, ctx)
    f = lm.fit(model, chip, n_chips, batch, ctx + n_new, w_bytes, kv_bytes, mem_util, rule)
    if how != "flops_not_split":
        flops = flops / f.n_chips
    kv_tok = model.kv_bytes_per_token(kv_bytes) if how == "kv_not_split" else f.kv_per_token
    weights = model.n_params() if how == "n_params" else model.matmul_params()
    nbytes = weights * w_bytes / f.n_chips + batch * (ctx + n_new) * kv_tok
    t_c = flops / chip.peak_flops(prec) * (mfu if how == "mfu_times" else 1 / mfu)
    t_m = nbytes / (chip.mem_bw * mbu)
    time = t_c + t_m if how == "sum" else max(t_c, t_m)
    bound = ("memory" if t_c >= t_m else "compute") if how == "bound_flipped" else \
        ("compute" if t_c >= t_m else "memory")
    return {"flops": flops, "bytes": nbytes, "intensity": flops / nbytes, "t_compute": t_c, "t_memory": t_m,
            "time": time, "bound": bound, "fits": f.fits, "fit": f}


def _step_variant(how):
    def step_time(model, chip, batch, n_new, ctx=0, prec="bf16", w_bytes=2.0, kv_bytes=2.0, mfu=1.0, mbu=1.0,
                  n_chips=1, mem_util=lm.MEM_UTIL, rule="tp"):
        return _step(model, chip, batch, n_new, ctx, prec, w_bytes, kv_bytes, mfu, mbu, n_chips, mem_util, rule, how)
    return step_time


# ---- 1.4 decode -------------------------------------------------------------------
def tps_forgets_batch(model, chip, batch=1, ctx=0, **kw):
    return 1.0 / lm.decode_time_per_token(model, chip, batch, ctx, **kw)


def decode_no_capacity_check(model, chip, batch=1, ctx=0, **kw):
    return _step_time(model, chip, batch, 1, ctx, **kw)["time"]


def decode_as_prefill(model, chip, batch=1, ctx=0, **kw):
    r = _step_time(model, chip, 1, batch, ctx, **kw)        # 把 batch 当成一次送进的新 token 数
    if not r["fits"]:
        raise lm.CapacityError(r["fit"].why)
    return r["time"]


def decode_drops_kw(model, chip, batch=1, ctx=0, **kw):
    r = _step_time(model, chip, batch, 1, ctx)               # 忘了把 mbu、n_chips 等传下去
    if not r["fits"]:
        raise lm.CapacityError(r["fit"].why)
    return r["time"]


def tps_scaled_from_batch1(model, chip, batch=1, ctx=0, **kw):
    return batch / _decode_time(model, chip, 1, ctx, **kw)     # 以为一步的时间和 batch 无关


_L = ("lecture01", "llm_math")
VARIANTS = [
    Wrong("1.1", *_L, "ModelConfig.layer_params", "K、V 按 query 头数算（忽略 GQA）", layer_kv_as_mha),
    Wrong("1.1", *_L, "ModelConfig.layer_params", "Wq 当成 d×d", layer_wq_square),
    Wrong("1.1", *_L, "ModelConfig.layer_params", "qkv 偏置按 3d 算", layer_bias_3d),
    Wrong("1.1", *_L, "ModelConfig.layer_params", "MLP 只算两个矩阵", layer_mlp_two_mats),
    Wrong("1.1", *_L, "ModelConfig.param_groups", "共享的词嵌入算两次", groups_tied_twice),
    Wrong("1.1", *_L, "ModelConfig.param_groups", "漏了最后一个归一化层", groups_no_final_norm),
    Wrong("1.1", *_L, "ModelConfig.param_groups", "漏了可学习位置编码", groups_no_positions),
    Wrong("1.1", *_L, "ModelConfig.param_groups", "漏了 extra_final", groups_no_extra_final),
    Wrong("1.2", *_L, "ModelConfig.kv_bytes_per_token", "KV 按 query 头数 H 算", kv_uses_query_heads),
    Wrong("1.2", *_L, "ModelConfig.kv_bytes_per_token", "只算了 K 没算 V", kv_only_k),
    Wrong("1.2", *_L, "ModelConfig.kv_bytes_per_token", "KV 宽度写成 d / group", kv_d_over_group),
    Wrong("1.2", *_L, "ModelConfig.kv_bytes_per_token", "字节宽度写死成 2", kv_fixed_bf16),
    Wrong("1.2", *_L, "ModelConfig.kv_cache_bytes", "缓存多算一个 token（ctx + 1）", cache_ctx_plus_one),
    Wrong("1.2", *_L, "ModelConfig.kv_cache_bytes", "忘了乘 batch", cache_ignores_batch),
    Wrong("1.3", *_L, "step_time", "时间 = 运算 + 搬数据（应取最大）", _step_variant("sum")),
    Wrong("1.3", *_L, "step_time", "乘 mfu 而不是除以 mfu", _step_variant("mfu_times")),
    Wrong("1.3", *_L, "step_time", "张量并行时 KV 没按卡分", _step_variant("kv_not_split")),
    Wrong("1.3", *_L, "step_time", "张量并行时 FLOPs 没按卡分", _step_variant("flops_not_split")),
    Wrong("1.3", *_L, "step_time", "权重字节用 n_params（含查表的词嵌入）", _step_variant("n_params")),
    Wrong("1.3", *_L, "step_time", "bound 判反了", _step_variant("bound_flipped")),
    Wrong("1.4", *_L, "decode_tokens_per_s", "吞吐忘了乘 batch", tps_forgets_batch),
    Wrong("1.4", *_L, "decode_tokens_per_s", "batch × (batch = 1 的速度)", tps_scaled_from_batch1),
    Wrong("1.4", *_L, "decode_time_per_token", "放不下也照样给时间", decode_no_capacity_check),
    Wrong("1.4", *_L, "decode_time_per_token", "把 batch 当成 prefill 的 token 数", decode_as_prefill),
    Wrong("1.4", *_L, "decode_time_per_token", "没把 mbu、n_chips 传给 step_time", decode_drops_kw),
]
