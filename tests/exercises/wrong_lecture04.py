"""第 4 讲练习的错误答案语料（只给老师）：每一个都是学生真会写出来的实现，必须被 test_ex_lecture04 的检查拒绝。"""
import torch
import torch.nn.functional as F

from grading import Wrong, module

ml = module("lecture04", "modern_lm")
L04 = ("lecture04", "modern_lm")


# ---- 4.1 RMSNorm ------------------------------------------------------------
def rmsnorm_subtracts_mean(self, x):
    """减了均值、除标准差：这是（没有偏置的）LayerNorm。"""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    xc = xf - xf.mean(-1, keepdim=True)
    return (xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rmsnorm_eps_outside_sqrt(self, x):
    """eps 加在根号外面：x / (√mean(x²) + eps)。"""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    return (xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + self.eps)).to(x.dtype) * self.weight


def rmsnorm_without_weight(self, x):
    """忘了乘增益 weight。"""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rmsnorm_detached_scale(self, x):
    """为了"省显存"把 1/rms 从计算图上摘下来：前向对，梯度错。"""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps).detach()
    return (xf * inv).to(x.dtype) * self.weight


def rmsnorm_in_input_dtype(self, x):
    """直接在输入的 dtype 里平方、求均值：fp16 的 300² 溢出成 inf。"""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


# ---- 4.2 SwiGLU -------------------------------------------------------------
def swiglu_silu_on_up(self, x):
    """gate 与 up 弄反：SiLU 作用在 w_up 分支上。"""
    return self.w_down(self.w_gate(x) * F.silu(self.w_up(x)))


def swiglu_silu_on_product(self, x):
    """先相乘再 SiLU：SiLU(w_gate·x ⊙ w_up·x)。"""
    return self.w_down(F.silu(self.w_gate(x) * self.w_up(x)))


def swiglu_with_gelu(self, x):
    """门控用了 GELU（那是 GeGLU）。"""
    return self.w_down(F.gelu(self.w_gate(x)) * self.w_up(x))


def swiglu_no_activation(self, x):
    """忘了激活：双线性 (w_gate·x) ⊙ (w_up·x)。"""
    return self.w_down(self.w_gate(x) * self.w_up(x))


# ---- 4.3 RoPE ---------------------------------------------------------------
def rope_half_with_adjacent_pairs(x, cos, sin):
    """half 版本却按相邻两个数配对：两种配对混了。"""
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)


def rope_interleaved_concatenated(x, cos, sin):
    """交错版本按相邻配对转了，结果却按前半 / 后半拼回去（torch.cat 代替 stack + flatten）。"""
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.cat((a * c - b * s, a * s + b * c), dim=-1)


def rope_half_sin_sign(x, cos, sin):
    """sin 的符号反了：往反方向转（长度、相对位置性质都还在）。"""
    h = x.shape[-1] // 2
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    a, b = x[..., :h], x[..., h:]
    return torch.cat((a * c + b * s, -a * s + b * c), dim=-1)


def rope_half_in_place(x, cos, sin):
    """原地改写输入（省一次分配）：用到的 a 已经被改过，第二半算错，还改坏了调用者的张量。"""
    h = x.shape[-1] // 2
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    y = x.clone()
    a, b = y[..., :h], y[..., h:]
    a.copy_(a * c - b * s)
    b.copy_(a * s + b * c)
    return y


# ---- 4.4 GQA 注意力与 KV cache -------------------------------------------------
def _attend_with(self, x, pos0, cache, layer, expand, mask_for_cache=True):
    q, k, v, q_pos = self._project(x, pos0)
    cfg = self.cfg
    B, H, T, dh = q.shape
    R = H // cfg.n_kv_heads
    k_pos = q_pos
    if cache is not None:
        k, v, k_pos = cache._append(layer, k, v, q_pos)
    k, v = expand(k, R), expand(v, R)
    if cfg.window or cfg.pos == "alibi" or (mask_for_cache and cache is not None):
        bias = ml.attn_bias(q_pos, k_pos, cfg.window, self.slopes, x.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    else:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.wo(out.transpose(1, 2).reshape(B, T, H * dh))


def attend_repeat_not_interleave(self, x, pos0, cache, layer):
    """k.repeat(1, R, 1, 1)：头 h 用了第 h % G 组（应是 repeat_interleave，头 h 用第 h // R 组）。"""
    return _attend_with(self, x, pos0, cache, layer, lambda t, R: t.repeat(1, R, 1, 1))


def attend_always_is_causal(self, x, pos0, cache, layer):
    """有 cache（普通因果，没有窗口和 ALiBi）时也走 SDPA 的 is_causal=True：
    它的掩码左上对齐，解码时查询只看得到第 0 个键。"""
    return _attend_with(self, x, pos0, cache, layer, lambda t, R: t.repeat_interleave(R, dim=1), False)


def append_new_keys_in_front(self, layer, k_new, v_new, pos_new):
    """新的 K/V 接到了缓存的前面（位置却按旧在前、新在后接）：键和它的位置对不上了。"""
    if self.k[layer] is not None:
        k_new = torch.cat((k_new, self.k[layer]), dim=2)
        v_new = torch.cat((v_new, self.v[layer]), dim=2)
        pos_new = torch.cat((self.pos[layer], pos_new))
    keep = slice(-(self.cfg.window - 1), None) if self.cfg.window > 1 else slice(None)
    self.k[layer], self.v[layer], self.pos[layer] = k_new[:, :, keep], v_new[:, :, keep], pos_new[keep]
    return k_new, v_new, pos_new


def append_returns_trimmed(self, layer, k_new, v_new, pos_new):
    """先按窗口裁剪、再把裁过的缓存拿去算注意力：每个查询少了窗口里最早的那个键。"""
    if self.k[layer] is not None:
        k_new = torch.cat((self.k[layer], k_new), dim=2)
        v_new = torch.cat((self.v[layer], v_new), dim=2)
        pos_new = torch.cat((self.pos[layer], pos_new))
    if self.cfg.window > 1:
        keep = slice(-(self.cfg.window - 1), None)
        k_new, v_new, pos_new = k_new[:, :, keep], v_new[:, :, keep], pos_new[keep]
    self.k[layer], self.v[layer], self.pos[layer] = k_new, v_new, pos_new
    return k_new, v_new, pos_new


def append_never_trims(self, layer, k_new, v_new, pos_new):
    """滑动窗口模型也把所有旧键留着：结果对，cache 却随长度一直长（没有滚动缓冲区）。"""
    if self.k[layer] is not None:
        k_new = torch.cat((self.k[layer], k_new), dim=2)
        v_new = torch.cat((self.v[layer], v_new), dim=2)
        pos_new = torch.cat((self.pos[layer], pos_new))
    self.k[layer], self.v[layer], self.pos[layer] = k_new, v_new, pos_new
    return k_new, v_new, pos_new


def append_negative_zero_slice(self, layer, k_new, v_new, pos_new):
    """只用 [-(window − 1):] 裁剪：window = 1 时是 [-0:]，整段都留下（cache 一直长）。"""
    if self.k[layer] is not None:
        k_new = torch.cat((self.k[layer], k_new), dim=2)
        v_new = torch.cat((self.v[layer], v_new), dim=2)
        pos_new = torch.cat((self.pos[layer], pos_new))
    w = self.cfg.window
    keep = slice(-(w - 1), None) if w else slice(None)
    self.k[layer], self.v[layer], self.pos[layer] = k_new[:, :, keep], v_new[:, :, keep], pos_new[keep]
    return k_new, v_new, pos_new


VARIANTS = [
    Wrong("4.1", *L04, "RMSNorm.forward", "减了均值（LayerNorm）", rmsnorm_subtracts_mean),
    Wrong("4.1", *L04, "RMSNorm.forward", "eps 加在根号外", rmsnorm_eps_outside_sqrt),
    Wrong("4.1", *L04, "RMSNorm.forward", "漏乘 weight", rmsnorm_without_weight),
    Wrong("4.1", *L04, "RMSNorm.forward", "1/rms 被 detach（梯度错）", rmsnorm_detached_scale),
    Wrong("4.1", *L04, "RMSNorm.forward", "在 fp16 里求平方和（溢出）", rmsnorm_in_input_dtype),
    Wrong("4.2", *L04, "SwiGLU.forward", "SiLU 作用在 up 分支（gate/up 弄反）", swiglu_silu_on_up),
    Wrong("4.2", *L04, "SwiGLU.forward", "SiLU 作用在乘积上", swiglu_silu_on_product),
    Wrong("4.2", *L04, "SwiGLU.forward", "门控用了 GELU", swiglu_with_gelu),
    Wrong("4.2", *L04, "SwiGLU.forward", "没有激活（双线性）", swiglu_no_activation),
    Wrong("4.3", *L04, "apply_rope_half", "half 版本按相邻配对（配对混了）", rope_half_with_adjacent_pairs),
    Wrong("4.3", *L04, "apply_rope_interleaved", "交错版本的结果按前后半拼回", rope_interleaved_concatenated),
    Wrong("4.3", *L04, "apply_rope_half", "sin 的符号反了", rope_half_sin_sign),
    Wrong("4.3", *L04, "apply_rope_half", "原地改写，第二半用了改过的 a", rope_half_in_place),
    Wrong("4.4", *L04, "Attention._attend", "repeat 代替 repeat_interleave（头 h 用第 h % G 组）",
          attend_repeat_not_interleave),
    Wrong("4.4", *L04, "Attention._attend", "有 cache 也用 is_causal=True（掩码左上对齐）", attend_always_is_causal),
    Wrong("4.4", *L04, "KVCache._append", "新 K/V 接在缓存前面（与位置对不上）", append_new_keys_in_front),
    Wrong("4.4", *L04, "KVCache._append", "用裁剪后的缓存算注意力（少一个键）", append_returns_trimmed),
    Wrong("4.4", *L04, "KVCache._append", "滑动窗口也不裁剪（cache 一直长）", append_never_trims),
    Wrong("4.4", *L04, "KVCache._append", "window = 1 时切片 [-0:] 留下了整段", append_negative_zero_slice),
]
