"""第 6 讲练习的错误答案语料（只给老师）：每一个都必须让对应练习至少一个检查失败。"""
import numpy as np

from grading import Wrong

L, M = "lecture06", "decode_lab"


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _greedy(z):
    hot = np.zeros_like(z)
    np.put_along_axis(hot, np.argmax(z, axis=-1)[..., None], 1.0, axis=-1)
    return hot


def _keep_top(x, k):
    """k 为 None 时原样返回；否则第 k 大以外的换成 −inf。"""
    if k is None:
        return x
    cut = -np.sort(-x, axis=-1)[..., k - 1:k]
    return np.where(x < cut, -np.inf, x)


def adjust_topk_after_softmax(logits, temperature=1.0, top_k=None):
    """先 softmax、再把 top-k 之外的概率置 0，忘了重新归一化。"""
    x = np.array(logits, dtype=float)
    if not temperature:
        return _greedy(x)
    probs = _softmax(x / temperature)
    return np.where(np.isfinite(_keep_top(x, top_k)), probs, 0.0)


def adjust_divide_probs(logits, temperature=1.0, top_k=None):
    """温度除的是概率（再归一化），不是 logits：温度完全不起作用。"""
    x = np.array(logits, dtype=float)
    if not temperature:
        return _greedy(x)
    scaled = _softmax(_keep_top(x, top_k)) / temperature
    return scaled / scaled.sum(axis=-1, keepdims=True)


def adjust_no_max_shift(logits, temperature=1.0, top_k=None):
    """直接 exp(z / T)，不先减最大值：温度小或 logits 大时溢出成 inf/inf = NaN。"""
    x = np.array(logits, dtype=float)
    if not temperature:
        return _greedy(x)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(_keep_top(x, top_k) / temperature)
        return e / e.sum(axis=-1, keepdims=True)


def residual_not_renormalised(p, q):
    """max(p − q, 0) 忘了除以它的和。"""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    over = np.maximum(p - q, 0.0)
    return np.where(over.sum(axis=-1, keepdims=True) > 0, over, p)


def residual_q_minus_p(p, q):
    """方向写反：max(q − p, 0)（草稿"给多了"的部分）。"""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    over = np.maximum(q - p, 0.0)
    mass = over.sum(axis=-1, keepdims=True)
    return np.where(mass > 0, over / np.where(mass > 0, mass, 1.0), p)


def residual_no_edge_case(p, q):
    """公式对，但 p == q 时 0/0 得到 NaN（也没处理 q 全为 0）。"""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    over = np.maximum(p - q, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return over / over.sum(axis=-1, keepdims=True)


def expected_tokens_off_by_one(alpha, gamma):
    """指数少了一：(1 − α^γ) / (1 − α)，即 1 + α + … + α^(γ−1)。"""
    a = np.asarray(alpha, dtype=np.float64)
    out = np.sum(a[..., None] ** np.arange(gamma), axis=-1)
    return float(out) if out.ndim == 0 else out


def expected_tokens_no_bonus(alpha, gamma):
    """只数被接受的草稿 α + … + α^γ，忘了每轮总会补上的那 1 个 token。"""
    a = np.asarray(alpha, dtype=np.float64)
    out = np.sum(a[..., None] ** np.arange(1, gamma + 1), axis=-1)
    return float(out) if out.ndim == 0 else out


def expected_tokens_closed_form_nan(alpha, gamma):
    """闭式 (1 − α^(γ+1)) / (1 − α)，没处理 α = 1（0/0 = NaN）。"""
    a = np.asarray(alpha, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (1.0 - a ** (gamma + 1)) / (1.0 - a)
    return float(out) if out.ndim == 0 else out


VARIANTS = [
    Wrong("6.1", L, M, "adjust", "top-k 在 softmax 之后截断、没重新归一化", adjust_topk_after_softmax),
    Wrong("6.1", L, M, "adjust", "温度除的是概率不是 logits", adjust_divide_probs),
    Wrong("6.1", L, M, "adjust", "exp 之前没减最大值（溢出成 NaN）", adjust_no_max_shift),
    Wrong("6.2", L, M, "residual", "残差没重新归一化", residual_not_renormalised),
    Wrong("6.2", L, M, "residual", "残差取了 max(q − p, 0)", residual_q_minus_p),
    Wrong("6.2", L, M, "residual", "p == q 时 0/0", residual_no_edge_case),
    Wrong("6.3", L, M, "expected_tokens", "指数差一（少算 α^γ）", expected_tokens_off_by_one),
    Wrong("6.3", L, M, "expected_tokens", "忘了补上的那 1 个 token", expected_tokens_no_bonus),
    Wrong("6.3", L, M, "expected_tokens", "闭式没处理 α = 1", expected_tokens_closed_form_nan),
]
