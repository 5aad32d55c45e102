"""
flash-attn 兼容层：用 flash-attn 2 的函数名和参数（flash_attn_interface.py 的公开接口）调用我们的 triton_flash，
从而能直接拿 flash-attn 自己的测试（tests/test_flash_attn.py）来检查我们的内核（bench/flash_attn_suite.py）。

里面有什么
  flash_attn_func / flash_attn_kvpacked_func / flash_attn_qkvpacked_func      → triton_flash.flash_attn_func
  flash_attn_varlen_func / _varlen_kvpacked_func / _varlen_qkvpacked_func     → triton_flash.flash_attn_varlen_func
  flash_attn_with_kvcache                                                     → triton_flash.flash_decode
  UNSUPPORTED_FEATURES：我们没有的特性的标签；用到它们时抛 NotImplementedError("flash_attn_compat: '<标签>' …")，
  feature_of(exc) 从异常里认出标签（不是本层的 NotImplementedError → None）。

映射的约定
  · 参数名、顺序、默认值和 flash-attn 2 相同；打包的输入（qkv [B, N, 3, H, d]、kv [B, N, 2, Hk, d]，varlen 少 B 维）
    用 unbind 拆成视图，不拷贝（我们的内核接受任意步长）；梯度经 autograd 回到打包的张量。
  · window_size 可以是 flash-attn 测试里那样的两元素张量：换成 (int, int)。deterministic 原样传下去。
  · return_attn_probs=True → (out, softmax_lse, S_dmask)。dropout_p = 0 时 flash-attn 的 S_dmask 是空张量
    （它只在有 dropout 时才算），我们也返回空张量；dropout_p > 0 时 S_dmask 要按 flash-attn 的编码给出 dropout
    掩码（负数 = 丢掉），我们给不出：返回一个占位对象，对它的任何使用都抛 'dropout-probs'（只看 out、lse 的调用
    照常工作，如 race-condition 测试）。
  · softcap ≤ 0 = 不截（flash-attn 的内核只看 softcap > 0），传给我们的是 0；flash_decode 没有 softcap
    → 'softcap-kvcache'。
  · flash_attn_with_kvcache：causal=True 与 flash_decode 的约定相同（n 个新 query 右下角对齐、彼此 causal）；
    causal=False 且 n > 1 时每个新 query 都看整个有效前缀：把 n 折进 query 头（[B, Hk·n·R, d]，一个新 token），
    一次 flash_decode 算完再折回来。cache_seqlens 可以是 int 或 None（= 整个缓存）。
  · 本层只检查 flash-attn 自己的参数名（开关、打包的形状、max_seqlen、cache_seqlens、num_splits），其余交给我们的函数。
运行：没有自检；测试在 tests/test_lecture11_compat.py（Triton 解释器），整套 flash-attn 测试见 bench/README.md。
依赖 torch、triton（同 triton_flash）。
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import torch  # noqa: E402
import triton_flash as tf  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))
from course_utils import check_bool, check_int  # noqa: E402

# 我们没有的特性（NotImplementedError 消息里的标签，feature_of 认它们；bench/flash_attn_suite.py 按它们计数）
UNSUPPORTED_FEATURES = (
    "dropout-probs",     # return_attn_probs=True 且 dropout_p > 0：flash-attn 编码的 S_dmask（含 dropout 掩码）
    "paged-kv",          # block_table（分页 KV 缓存）
    "kvcache-append",    # flash_attn_with_kvcache 的 k=、v=：把新的 K/V 追加进缓存
    "kvcache-rotary",    # rotary_cos / rotary_sin：在缓存里做旋转位置编码
    "cache-batch-idx",   # cache_batch_idx：按下标从更大的缓存里取序列
    "cache-leftpad",     # cache_leftpad：缓存左侧留空
    "window-kvcache",    # flash_decode 没有滑动窗口
    "alibi-kvcache",     # flash_decode 没有 ALiBi
    "softcap-kvcache",   # flash_decode 没有 softcap
    "kvcache-lse",       # return_softmax_lse=True：flash_decode 不返回 LSE
    "internal-api",      # flash-attn 的内部接口（flash_attn_gpu、_flash_attn_forward……）：兼容层不提供
)
_TAG_RE = re.compile(r"^flash_attn_compat: '([a-z0-9-]+)'")


def unsupported(tag, what):
    """本层的 NotImplementedError：消息以 "flash_attn_compat: '<标签>'" 开头，异常带 .feature = 标签。"""
    if tag not in UNSUPPORTED_FEATURES:
        raise ValueError(f"flash_attn_compat：未登记的特性标签 {tag!r}（应为 UNSUPPORTED_FEATURES 之一）")
    exc = NotImplementedError(f"flash_attn_compat: '{tag}' ({what}) 不支持")
    exc.feature = tag
    return exc


def feature_of(exc):
    """exc 是本层因为缺少某个特性而抛的 NotImplementedError → 它的标签；否则 None。"""
    if not isinstance(exc, NotImplementedError):
        return None
    tag = getattr(exc, "feature", None)
    if tag is None:
        m = _TAG_RE.match(str(exc))
        tag = m and m.group(1)
    return tag if tag in UNSUPPORTED_FEATURES else None


def _cap(softcap):
    """flash-attn 的 softcap ≤ 0 = 不截；别的值（正数，或不是数的坏输入）原样交给我们的检查。"""
    return 0.0 if isinstance(softcap, (int, float)) and not isinstance(softcap, bool) and softcap <= 0 else softcap


def _window(window_size):
    """flash-attn 的测试传两元素张量（torch.randint(0, n, (2,))）：换成 (int, int)；别的原样交给我们的检查。"""
    if isinstance(window_size, torch.Tensor):
        return tuple(window_size.tolist())
    if isinstance(window_size, list):
        return tuple(window_size)
    return window_size


class _DropoutProbs:
    """dropout_p > 0 时 return_attn_probs 的第三个值：flash-attn 用 S_dmask 的符号编码 dropout 掩码，我们给不出。
    只看 out、lse 的调用不受影响；读它的任何属性、下标、比较、传给 torch 函数都抛 'dropout-probs'。"""
    __slots__ = ()

    def _refuse(self, *args, **kwargs):
        raise unsupported("dropout-probs", "return_attn_probs=True 且 dropout_p > 0 时的 S_dmask")

    __getattr__ = __getitem__ = __iter__ = __len__ = __bool__ = __array__ = _refuse
    __lt__ = __le__ = __gt__ = __ge__ = __abs__ = __neg__ = __add__ = __sub__ = __mul__ = __truediv__ = _refuse

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise unsupported("dropout-probs", f"S_dmask 传给了 {getattr(func, '__name__', func)}")

    def __repr__(self):
        return "<flash_attn_compat: S_dmask（dropout-probs：不支持）>"


_NO_DROPOUT_PROBS = _DropoutProbs()


def _with_probs(res, q, dropout_p):
    """(out, lse) → flash-attn 的 (out, lse, S_dmask)。"""
    out, lse = res
    return out, lse, (q.new_empty((0,)) if dropout_p == 0 else _NO_DROPOUT_PROBS)


# ============================================================================
# 稠密：[B, N, H, d]
# ============================================================================
def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q [B, Nq, Hq, d]，k、v [B, Nk, Hk, d] → out（return_attn_probs 时 (out, lse [B, Hq, Nq], S_dmask)）。"""
    _check_flags("flash_attn_func", causal=causal, deterministic=deterministic, return_attn_probs=return_attn_probs)
    if type(window_size) is not tuple:
        window_size = _window(window_size)
    res = tf.flash_attn_func(q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                             alibi_slopes=alibi_slopes, window_size=window_size, return_lse=return_attn_probs,
                             deterministic=deterministic, softcap=_cap(softcap))
    return _with_probs(res, q, dropout_p) if return_attn_probs else res


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """kv [B, Nk, 2, Hk, d]：k、v 是它的两个视图。"""
    k, v = _unpack("flash_attn_kvpacked_func", "kv", kv, 5, 2, 2)  # 各 [B, Nk, Hk, d]
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv [B, N, 3, H, d]：q、k、v 是它的三个视图。"""
    q, k, v = _unpack("flash_attn_qkvpacked_func", "qkv", qkv, 5, 2, 3)   # 各 [B, N, H, d]
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


# ============================================================================
# 变长（varlen）：[total, H, d] + cu_seqlens
# ============================================================================
def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """q [total_q, Hq, d]，k、v [total_k, Hk, d] → out（return_attn_probs 时 (out, lse [Hq, total_q], S_dmask)）。"""
    _check_flags("flash_attn_varlen_func", causal=causal, deterministic=deterministic,
                 return_attn_probs=return_attn_probs)
    check_int("max_seqlen_q", max_seqlen_q, lo=0, where="flash_attn_varlen_func")
    check_int("max_seqlen_k", max_seqlen_k, lo=0, where="flash_attn_varlen_func")
    if block_table is not None:
        raise unsupported("paged-kv", "block_table=")
    if type(window_size) is not tuple:
        window_size = _window(window_size)
    res = tf.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                                    alibi_slopes=alibi_slopes, window_size=window_size,
                                    return_lse=return_attn_probs, deterministic=deterministic,
                                    softcap=_cap(softcap))
    return _with_probs(res, q, dropout_p) if return_attn_probs else res


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """kv [total_k, 2, Hk, d]。"""
    k, v = _unpack("flash_attn_varlen_kvpacked_func", "kv", kv, 4, 1, 2)   # 各 [total_k, Hk, d]
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """qkv [total, 3, H, d]；q 和 k 共用 cu_seqlens、max_seqlen。"""
    q, k, v = _unpack("flash_attn_varlen_qkvpacked_func", "qkv", qkv, 4, 1, 3)   # 各 [total, H, d]
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


# ============================================================================
# KV 缓存上的 decode
# ============================================================================
def _refuse_kvcache(k, v, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, block_table, window_size,
                    alibi_slopes, return_softmax_lse, softcap):
    """flash_decode 没有的参数：用到了哪个就抛哪个标签。"""
    if k is not None or v is not None:
        raise unsupported("kvcache-append", "k=, v= 追加进缓存")
    if rotary_cos is not None or rotary_sin is not None:
        raise unsupported("kvcache-rotary", "rotary_cos=, rotary_sin=")
    if cache_batch_idx is not None:
        raise unsupported("cache-batch-idx", "cache_batch_idx=")
    if cache_leftpad is not None:
        raise unsupported("cache-leftpad", "cache_leftpad=")
    if block_table is not None:
        raise unsupported("paged-kv", "block_table=")
    window_size = _window(window_size)
    if window_size != (-1, -1):
        raise unsupported("window-kvcache", f"window_size={window_size}")
    if alibi_slopes is not None:
        raise unsupported("alibi-kvcache", "alibi_slopes=")
    if return_softmax_lse:
        raise unsupported("kvcache-lse", "return_softmax_lse=True")
    if _cap(softcap):
        raise unsupported("softcap-kvcache", f"softcap={softcap}")


def _cache_lengths(cache_seqlens, q, k_cache):
    """cache_seqlens 不是张量时：None = 整个缓存，int = 每个序列一样长（别的原样交给 flash_decode 报错）。"""
    if cache_seqlens is None:
        cache_seqlens = k_cache.shape[1]
    if isinstance(cache_seqlens, int):
        return torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=k_cache.device)
    return cache_seqlens


def _decode_all_visible(q, k_cache, v_cache, lens, num_splits, softmax_scale):
    """causal=False、n > 1：每个新 query 都看整个前缀 [0, L_b)。把 n 折进 query 头，当成一个新 token 的 decode。"""
    batch, n, hq, d = q.shape
    hk = k_cache.shape[2]
    group = hq // hk
    q1 = q.reshape(batch, n, hk, group, d).transpose(1, 2).reshape(batch, hk * n * group, d)   # [B, Hk·n·R, d]
    o1 = tf.flash_decode(q1, k_cache, v_cache, lens, num_splits=num_splits, softmax_scale=softmax_scale)
    return o1.view(batch, hk, n, group, d).transpose(1, 2).reshape(batch, n, hq, d)            # [B, n, Hq, d]


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """
    q [B, n, Hq, d]，k_cache、v_cache [B, S_max, Hk, d] → out [B, n, Hq, d]。只支持"缓存已经写好、只读"的用法；
    num_splits = 0（flash-attn：自动）→ None（flash_decode 自己选），其余原样。
    """
    _check_flags("flash_attn_with_kvcache", causal=causal, rotary_interleaved=rotary_interleaved,
                 return_softmax_lse=return_softmax_lse)
    if not isinstance(cache_seqlens, torch.Tensor) and cache_seqlens is not None:
        check_int("cache_seqlens", cache_seqlens, lo=0, hi=k_cache.shape[1] if isinstance(k_cache, torch.Tensor)
                  and k_cache.dim() == 4 else None, where="flash_attn_with_kvcache")
    check_int("num_splits", num_splits, lo=0, where="flash_attn_with_kvcache")
    if not (isinstance(softcap, (int, float)) and not isinstance(softcap, bool)):
        raise TypeError(f"flash_attn_with_kvcache：softcap 必须是实数（≤ 0 = 不截），收到 {type(softcap).__name__}")
    _refuse_kvcache(k, v, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, block_table, window_size,
                    alibi_slopes, return_softmax_lse, softcap)
    lens = cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else _cache_lengths(cache_seqlens, q, k_cache)
    splits = None if num_splits == 0 else num_splits
    # n = 1 时 causal 与否一样；q 的形状不对、Hq 不是 Hk 的倍数时不折叠，交给 flash_decode 报错
    if (causal or q.dim() != 4 or q.shape[1] == 1 or k_cache.dim() != 4 or k_cache.shape[2] == 0
            or q.shape[2] % k_cache.shape[2]):
        return tf.flash_decode(q, k_cache, v_cache, lens, num_splits=splits, softmax_scale=softmax_scale)
    return _decode_all_visible(q, k_cache, v_cache, lens, splits, softmax_scale)


# ============================================================================
# 输入检查（只查 flash-attn 的参数名；其余由 triton_flash 的函数检查）
# ============================================================================
def _check_flags(where, **flags):
    for name, value in flags.items():
        check_bool(name, value, where=where)


def _unpack(where, name, packed, ndim, axis, parts):
    """打包的 kv / qkv：ndim 维张量、第 axis 维长 parts，拆成 parts 个视图。"""
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"{where}：{name} 必须是 torch.Tensor，收到 {type(packed).__name__}")
    if packed.dim() != ndim or packed.shape[axis] != parts:
        raise ValueError(f"{where}：{name} 必须是 {ndim} 维、第 {axis} 维长 {parts} 的张量，收到形状 "
                         f"{tuple(packed.shape)}")
    return packed.unbind(axis)
