"""
CS349E 第 4 讲 · checkpoint_store.py：入库的检查点怎样存、怎样核对、什么时候重训（第 4、19 讲共用）

【这一讲回答的问题】
    训练好的小模型跟着仓库走，演示直接读。可是文件会坏、代码里的配置会改、manifest 会被手改：
    读进来的是不是"这份代码、这个配置训出来的这份权重"？manifest 里的数字（损失、NIAH 表）是不是
    就是这份权重量出来的？答不上来就重训（tqdm 进度条），绝不崩溃，也绝不把改过的数字当测量值打印。

【主要内容】
    CheckpointStore        一个文件夹：<名字>.pt（纯 state_dict，torch.load(weights_only=True) 可读）+ manifest.json
        .save / .verify    存盘（拒收 steps < 1 与非有限的数字）/ 核对（配置逐项比、SHA-256、装得进模型、数值有限）
        .save_resume / .load_resume / .drop_resume / for_resume   续训文件 <名字>.resume.pt（不入库）
    ResultCache            量出来的结果（如 NIAH 表）的缓存：键 = 决定结果的一切（权重、设置、评测参数）的摘要
    stop_on_ctrl_c / interrupted   Ctrl-C 只在两步之间生效：存好续训状态，一行话退出
    canon / config_diff / state_digest   规范 JSON、配置差异（"lr: 0.001 → 0.0005"）、权重的摘要

【约定】
    manifest.json = {"format": FORMAT, "models": {名字: {config, files: {文件: SHA-256}, record, seal}}}。
    record 是训练时量的数字（steps、seconds、tokens_per_s、损失……）；seal = (config, files, record) 的 SHA-256：
    数字被改过、或不是这份权重的，seal 对不上，record 作废（不打印、调用者重算）。
    manifest 不存在或坏了：退化成"逐个文件核对"（装得进配置的模型、数值有限），没有 record。
    seconds 是累计训练秒数（含续训前的几段）；tokens_per_s 只按这一段实际跑的步数与秒数算。
    坏参数（名字带文件夹、state 不是张量字典、配置写不成 JSON、build 不是函数……）在写任何文件之前就报
    TypeError / ValueError，消息写出参数名；读不了的文件照旧当作"需要重训"，不报错。

【运行】python3 lecture04/checkpoint_store.py      # 自检（一两秒，只写临时文件夹）
【依赖】torch；../lecture01/course_utils.py（参数检查、SHA-256、加锁读写 JSON）。
"""

import contextlib
import datetime
import hashlib
import json
import math
import numbers
import os
import signal
import sys
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))

from course_utils import check_int, expect_errors, read_json_dict, sha256_file, update_json  # noqa: E402

FORMAT = "cs349e-checkpoints-1"
MANIFEST = "manifest.json"


# =============================================================================
# 1. 摘要与配置差异
# =============================================================================
def canon(obj):
    """
    可比较的 JSON 形式：元组变列表、键排序、numpy 的数变成 Python 的数（配置、记录都先过一遍它）。
    【报错】写不成 JSON 的东西（集合、张量、对象、混着字符串和数的键）→ TypeError；NaN / ±inf → ValueError
        （NaN ≠ NaN：含 NaN 的配置永远对不上，每次都会重训）。
    """
    return _canon(obj, "obj", "canon")


def _canon(obj, name, where, allow_nan=False):
    try:
        text = json.dumps(obj, sort_keys=True, allow_nan=allow_nan, default=_plain_number)
    except TypeError as e:
        raise TypeError(f"{where}：{name} 必须能写成 JSON（字典的键是字符串；值是字典、列表、字符串、数、None），"
                        f"{e}") from None
    except ValueError as e:
        raise ValueError(f"{where}：{name} 里只能有有限的数（{e}）") from None
    return json.loads(text)


def _plain_number(x):
    """json.dumps 不认识的对象：numpy 的整数 / 浮点数 → Python 的数，别的照样 TypeError。"""
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, numbers.Real):
        return float(x)
    raise TypeError(f"{type(x).__name__} 类型的 {x!r} 写不成 JSON")


def _digest(obj):
    """规范 JSON 的 SHA-256（十六进制）：同样的内容永远得到同样的摘要。坏输入同 canon。"""
    text = json.dumps(_canon(obj, "obj", "_digest"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def state_digest(state):
    """state_dict 的摘要：按键名排序，每个张量的名字、dtype、形状和字节都算进去。state：{字符串: 稠密张量}。"""
    _check_state(state, "state", "state_digest")
    h = hashlib.sha256()
    for k in sorted(state):
        t = state[k].detach().cpu().contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")   # 0 维也要先拉平
    return h.hexdigest()


def config_diff(old, new, prefix=""):
    """两个配置字典的不同之处：["train.steps: 1500 → 3", "mask: 缺 → 'window'"]（嵌套字典按点号展开）。"""
    if not isinstance(new, dict):
        raise TypeError(f"config_diff：new 必须是配置字典，收到 {type(new).__name__}")
    if not isinstance(prefix, str):
        raise TypeError(f"config_diff：prefix 必须是字符串，收到 {type(prefix).__name__}")
    old = old if isinstance(old, dict) else {}          # manifest 里缺配置或配置坏了：当作空的（全部"缺 → …"）
    out = []
    for k in sorted(set(old) | set(new), key=str):
        a, b = old.get(k, "缺"), new.get(k, "缺")
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {a!r} → {b!r}")
    return out


def _finite_numbers(obj, where):
    """record 里的每个数都必须有限（NaN 写进 manifest 再被当成测量值，是这里要杜绝的）。"""
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return
    if isinstance(obj, (int, float)):
        if not math.isfinite(obj):
            raise ValueError(f"{where} 里有非有限的数 {obj!r}：不写进 manifest")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _finite_numbers(v, f"{where}.{k}")
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _finite_numbers(v, where)


def _check_state(state, name, where):
    """{字符串: 稠密张量}（state_dict）；别的 → TypeError，消息写出参数名。"""
    if not isinstance(state, dict):
        raise TypeError(f"{where}：{name} 必须是 {{名字: 张量}} 的 state_dict，收到 {type(state).__name__}")
    for k, v in state.items():
        if not isinstance(k, str):
            raise TypeError(f"{where}：{name} 的键必须是字符串，收到 {type(k).__name__} 类型的 {k!r}")
        if not torch.is_tensor(v) or v.layout != torch.strided:
            what = type(v).__name__ if not torch.is_tensor(v) else f"{v.layout} 的张量"
            raise TypeError(f"{where}：{name}[{k!r}] 必须是稠密的 torch 张量，收到 {what}")


def _check_name(name, where):
    """检查点的名字：非空字符串，不带文件夹（它变成 <folder>/<name>.pt）。"""
    if not isinstance(name, str):
        raise TypeError(f"{where}：name 必须是字符串，收到 {type(name).__name__} 类型的 {name!r}")
    if not name or name in (".", "..") or "/" in name or os.sep in name:
        raise ValueError(f"{where}：name 必须是不带文件夹的非空名字（文件是 <folder>/<name>.pt），收到 {name!r}")


def _check_path(name, value, where):
    if not isinstance(value, (str, os.PathLike)) or isinstance(os.fspath(value), bytes):
        raise TypeError(f"{where}：{name} 必须是路径（str 或 os.PathLike），"
                        f"收到 {type(value).__name__} 类型的 {value!r}")
    if not os.fspath(value):
        raise ValueError(f"{where}：{name} 不能是空字符串")
    return os.fspath(value)


def _check_str(name, value, where):
    if not isinstance(value, str):
        raise TypeError(f"{where}：{name} 必须是字符串，收到 {type(value).__name__} 类型的 {value!r}")


def _check_model_opt(model, opt, where):
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{where}：model 必须是 torch.nn.Module，收到 {type(model).__name__}")
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"{where}：opt 必须是 torch.optim.Optimizer，收到 {type(opt).__name__}")


def _atomic_save(obj, path):
    tmp = f"{path}.{os.getpid()}.tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


# =============================================================================
# 2. 检查点文件夹
# =============================================================================
class CheckpointStore:
    """
    一个检查点文件夹。folder：路径；retrain_hint：重训的命令（写进 manifest 的 note）。
    verify(name, config, build) -> (model 或 None, why, record 或 None)：why 以 "ok" 开头就能用。
    """

    def __init__(self, folder, retrain_hint=""):
        self.folder = _check_path("folder", folder, "CheckpointStore")
        _check_str("retrain_hint", retrain_hint, "CheckpointStore")
        self.retrain_hint = retrain_hint
        self.manifest_path = os.path.join(self.folder, MANIFEST)

    def path(self, name, suffix=".pt"):
        """<folder>/<name><suffix>；name 不能带文件夹。"""
        _check_name(name, "CheckpointStore.path")
        _check_str("suffix", suffix, "CheckpointStore.path")
        return os.path.join(self.folder, name + suffix)

    # ---- manifest ----
    def read(self):
        """(models 字典, 问题)：问题是 None，或 "manifest.json 不存在" / "manifest.json 坏了"（此时 models 为空）。"""
        if not os.path.exists(self.manifest_path):
            return {}, "manifest.json 不存在"
        man = read_json_dict(self.manifest_path)
        if man.get("format") != FORMAT or not isinstance(man.get("models"), dict):
            return {}, "manifest.json 坏了或不是这个格式"
        return man["models"], None

    def save(self, name, state, config, record, extra_files=()):
        """存 <name>.pt（纯 state_dict），在 manifest 里记一项；extra_files：附属文件（曲线 csv），一起记 SHA-256。"""
        w = "CheckpointStore.save"
        _check_name(name, w)
        _check_state(state, "state", w)
        if not isinstance(record, dict):
            raise TypeError(f"{w}：record 必须是字典（至少有 steps），收到 {type(record).__name__}")
        check_int("record['steps']", record.get("steps"), lo=1, where=f"{w}（{name}）")
        _finite_numbers(record, f"{name} 的 record")
        config, record = _canon(config, "config", w), _canon(record, "record", w)
        if isinstance(extra_files, (str, bytes, os.PathLike)) or not hasattr(extra_files, "__iter__"):
            raise TypeError(f"{w}：extra_files 必须是路径的列表（一个文件也要写成 [path]），收到 {extra_files!r}")
        extra_files = [_check_path("extra_files 的元素", p, w) for p in extra_files]
        missing = [p for p in extra_files if not os.path.isfile(p)]
        if missing:
            raise ValueError(f"{w}：extra_files 里的 {missing[0]!r} 不是文件")
        os.makedirs(self.folder, exist_ok=True)
        path = self.path(name)
        _atomic_save({k: v.detach().cpu().contiguous() for k, v in state.items()}, path)
        files = {os.path.basename(p): sha256_file(p) for p in (path, *extra_files)}
        entry = {"config": config, "files": files, "record": record}
        entry["seal"] = _digest(entry)
        entry["torch"] = torch.__version__
        entry["saved"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

        def change(man):
            if man.get("format") != FORMAT or not isinstance(man.get("models"), dict):
                man.clear()
                man.update(format=FORMAT, models={})
            man["models"][name] = entry
            man["note"] = f"{self.retrain_hint} 生成；读的时候核对配置、SHA-256 与 seal，不符就重训"
        update_json(self.manifest_path, change)
        return entry

    def verify(self, name, config, build):
        """
        核对 <name>.pt：manifest 里的配置与 config 逐项相同、每个文件的 SHA-256 对得上、build() 的模型装得进、
        数值有限。manifest 没有它（或整个坏了）时退化成只核对文件本身，record 为 None。
        """
        w = "CheckpointStore.verify"
        _check_name(name, w)
        config = _canon(config, "config", w)
        if not callable(build) or isinstance(build, torch.nn.Module):
            raise TypeError(f"{w}：build 必须是造出新模型的函数（如 lambda: Model(cfg)），收到 {type(build).__name__}")
        path = self.path(name)
        if not os.path.isfile(path):
            return None, f"缺文件 {name}.pt", None
        models, problem = self.read()
        entry = models.get(name)
        if entry is None:
            model, why = self._load(path, build)
            if model is None:
                return None, why, None
            return model, f"ok（{problem or 'manifest.json 里没有它'}：只核对了文件本身；没有训练记录）", None
        diff = config_diff(entry.get("config"), config)
        if diff:
            return None, "配置与代码里的不同（manifest → 现在）：" + "；".join(diff), None
        files = entry.get("files") if isinstance(entry.get("files"), dict) else {}
        if f"{name}.pt" not in files:
            return None, f"manifest 里没有 {name}.pt 的 SHA-256", None
        for fn, want in files.items():
            p = os.path.join(self.folder, fn)
            if not os.path.isfile(p):
                return None, f"缺文件 {fn}", None
            if sha256_file(p) != want:
                return None, f"{fn} 的 SHA-256 对不上（文件损坏或被改过）", None
        model, why = self._load(path, build)
        if model is None:
            return None, why, None
        sealed = {k: entry.get(k) for k in ("config", "files", "record")}
        if entry.get("seal") != _digest(sealed):
            return model, "ok（manifest 里的数字和 seal 不符：被改过，不当测量值用）", None
        return model, "ok", entry["record"]

    @staticmethod
    def _load(path, build):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
                raise ValueError("不是纯 state_dict")
            bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
            if bad:
                raise ValueError(f"{bad[0]} 里有 NaN / Inf")
            model = build()
            want = model.state_dict()
            model.load_state_dict({k: v.to(want[k].dtype) if k in want else v for k, v in state.items()})
        except Exception as e:     # noqa: BLE001  读不了的文件一律当作"需要重训"
            return None, f"读不出来（{type(e).__name__}: {str(e)[:120]}）"
        return model.eval(), "ok"

    # ---- 续训 ----
    @classmethod
    def for_resume(cls, resume_path, where):
        """续训文件的路径 → (store, name)；路径必须以 .resume.pt 结尾（别的名字会被误当成检查点）。"""
        _check_str("where", where, "CheckpointStore.for_resume")
        resume_path = _check_path("resume_path", resume_path, where)
        if not resume_path.endswith(".resume.pt") or os.path.basename(resume_path) == ".resume.pt":
            raise ValueError(f"{where}：resume_path 必须是以 .resume.pt 结尾的路径（前面有名字），收到 {resume_path!r}")
        path = os.path.abspath(resume_path)
        return cls(os.path.dirname(path)), os.path.basename(path)[:-len(".resume.pt")]

    def save_resume(self, name, model, opt, step, config, meta):
        """续训文件：模型、优化器、已完成的步数、config 与 meta（曲线、已用秒数……，JSON 文本）。"""
        w = "CheckpointStore.save_resume"
        _check_name(name, w)
        _check_model_opt(model, opt, w)
        step = check_int("step", step, lo=0, where=w)
        text = json.dumps({"config": _canon(config, "config", w), "meta": _canon(meta, "meta", w)})
        os.makedirs(self.folder, exist_ok=True)
        blob = {"model": model.state_dict(), "opt": opt.state_dict(), "step": torch.tensor(step), "meta": text}
        _atomic_save(blob, self.path(name, ".resume.pt"))

    def load_resume(self, name, model, opt, config, log=print):
        """读续训文件：返回 (step, meta)；没有、坏了或配置不同（警告里写出哪几项）返回 (0, None)，model/opt 不变。"""
        w = "CheckpointStore.load_resume"
        _check_name(name, w)
        _check_model_opt(model, opt, w)
        config = _canon(config, "config", w)
        if log is not None and not callable(log):
            raise TypeError(f"{w}：log 必须是 None 或可调用（如 print），收到 {type(log).__name__}")
        path = self.path(name, ".resume.pt")
        if not os.path.exists(path):
            return 0, None
        keep_m, keep_o = {k: v.clone() for k, v in model.state_dict().items()}, opt.state_dict()
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
            meta = json.loads(blob["meta"])
            diff = config_diff(meta.get("config"), config)
            if diff:
                raise ValueError("配置不同：" + "；".join(diff))
            model.load_state_dict(blob["model"])
            opt.load_state_dict(blob["opt"])
            step = int(blob["step"])
        except Exception as e:     # noqa: BLE001  任何读不了的情况都是"从头训"
            model.load_state_dict(keep_m)
            opt.load_state_dict(keep_o)
            warnings.warn(f"续训文件 {os.path.basename(path)} 用不了（{type(e).__name__}: {e}），从头训练",
                          stacklevel=2)
            return 0, None
        if log:
            log(f"  从 {os.path.basename(path)} 的第 {step} 步接着训练")
        return step, meta["meta"]

    def drop_resume(self, name):
        """删掉续训文件（训完了）；不存在时什么也不做。"""
        _check_name(name, "CheckpointStore.drop_resume")
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path(name, ".resume.pt"))


# =============================================================================
# 3. 量出来的结果的缓存
# =============================================================================
class ResultCache:
    """
    JSON 文件里的结果缓存：{"format", "results": {_digest(键): {"key", "value", "seal", "label"}}}。
    键是决定结果的一切（权重摘要、模型设置、评测参数）：换了任何一样就不会命中。
    get 只返回 seal 对得上的值（手改过的当没有）；put 在锁里读-改-写。
    """

    def __init__(self, path):
        self.path = _check_path("path", path, "ResultCache")

    def get(self, key):
        d = _key_digest(key, "ResultCache.get")
        item = read_json_dict(self.path).get("results", {}).get(d)
        if not isinstance(item, dict) or item.get("seal") != _digest({"key": d, "value": item.get("value")}):
            return None
        return item["value"]

    def put(self, key, value, label=""):
        """value 是字典：和已有的（seal 对得上的）值合并，别的进程刚写进去的格子不丢。"""
        w = "ResultCache.put"
        d = _key_digest(key, w)
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise TypeError(f"{w}：value 必须是键为字符串的字典，收到 {value!r:.80}")
        _finite_numbers(value, f"{w} 的 value")
        value = _canon(value, "value", w)
        _check_str("label", label, w)

        def change(c):
            if c.get("format") != FORMAT or not isinstance(c.get("results"), dict):
                c.clear()
                c.update(format=FORMAT, results={})
            old = c["results"].get(d)
            ok = isinstance(old, dict) and old.get("seal") == _digest({"key": d, "value": old.get("value")})
            merged = canon(dict(old["value"], **value) if ok else value)
            c["results"][d] = {"key": canon(key), "value": merged, "seal": _digest({"key": d, "value": merged}),
                               "label": label}
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        update_json(self.path, change)


def _key_digest(key, where):
    return _digest(_canon(key, "key", where))


# =============================================================================
# 4. Ctrl-C：只在两步之间停
# =============================================================================
class _Stop:
    requested = False


@contextlib.contextmanager
def stop_on_ctrl_c():
    """
    训练循环里：with stop_on_ctrl_c() as stop: … if stop.requested: 存续训文件，raise interrupted(…)。
    Ctrl-C 只把 stop.requested 置真（不在 opt.step 的半中间打断）；第二次 Ctrl-C 照常中断。不在主线程时不接管。
    """
    stop = _Stop()

    def handler(signum, frame):
        if stop.requested:
            raise KeyboardInterrupt
        stop.requested = True
    try:
        old = signal.signal(signal.SIGINT, handler)
    except ValueError:              # 不在主线程：信号只能在主线程里接
        old = None
    try:
        yield stop
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)


def interrupted(name, step, total, resume_path):
    """Ctrl-C 之后的一行话（SystemExit：解释器只打印这行，不打印 traceback）。0 ≤ step ≤ total，total ≥ 1。"""
    w = "interrupted"
    _check_str("name", name, w)
    step, total = check_int("step", step, lo=0, where=w), check_int("total", total, lo=1, where=w)
    if step > total:
        raise ValueError(f"{w}：step = {step} 不能大于 total = {total}")
    resume_path = _check_path("resume_path", resume_path, w)
    return SystemExit(f"已中断：{name} 训练到第 {step}/{total} 步，续训状态存在 {resume_path}；"
                      f"再运行同一命令从这里接着训。")


# =============================================================================
# 自检
# =============================================================================
def _selftest():
    import tempfile
    torch.manual_seed(0)

    def build():
        return torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.Linear(3, 2))
    net = build()
    cfg = {"d": 5, "train": {"steps": 3, "lr": 1e-3}}
    with tempfile.TemporaryDirectory() as d:
        st = CheckpointStore(d, "selftest")
        st.save("m", net.state_dict(), cfg, {"steps": 3, "loss": 0.5})
        model, why, rec = st.verify("m", cfg, build)
        assert why == "ok" and rec == {"steps": 3, "loss": 0.5}
        assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), model.state_dict().values()))
        # 配置不同：写出是哪一项、旧 → 新
        why = st.verify("m", dict(cfg, train={"steps": 4, "lr": 1e-3}), build)[1]
        assert "train.steps: 3 → 4" in why, why
        # 手改 manifest 里的数字：权重照用，数字作废
        man = json.load(open(st.manifest_path, encoding="utf-8"))
        man["models"]["m"]["record"]["loss"] = 0.1
        json.dump(man, open(st.manifest_path, "w", encoding="utf-8"))
        model, why, rec = st.verify("m", cfg, build)
        assert model is not None and rec is None and "seal" in why
        # manifest 不见了：逐个文件核对，没有数字
        os.remove(st.manifest_path)
        model, why, rec = st.verify("m", cfg, build)
        assert model is not None and rec is None and "不存在" in why
        # 文件坏了
        st.save("m", net.state_dict(), cfg, {"steps": 3})
        open(st.path("m"), "ab").write(b"x")
        assert "SHA-256" in st.verify("m", cfg, build)[1]
        # steps = 0、NaN：拒收
        expect_errors([(lambda: st.save("z", net.state_dict(), cfg, {"steps": 0}), ValueError, "steps"),
                       (lambda: st.save("z", net.state_dict(), cfg, {"steps": 2, "loss": float("nan")}), ValueError,
                        "loss")])
        # 续训：配置相同才接着
        opt = torch.optim.AdamW(net.parameters())
        st.save_resume("m", net, opt, 2, cfg, {"seconds": 1.5})
        fresh = build()
        step, meta = st.load_resume("m", fresh, torch.optim.AdamW(fresh.parameters()), cfg, log=None)
        assert step == 2 and meta == {"seconds": 1.5}
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert st.load_resume("m", fresh, torch.optim.AdamW(fresh.parameters()), {"d": 6}, log=None) == (0, None)
        assert "d: 5 → 6" in str(w[0].message)
        # 结果缓存：键变了不命中，值被改过不命中
        rc = ResultCache(os.path.join(d, "r.json"))
        rc.put({"w": "abc", "n": 4}, {"128": [1.0, 0.5]})
        assert rc.get({"w": "abc", "n": 4}) == {"128": [1.0, 0.5]} and rc.get({"w": "abc", "n": 8}) is None
        c = json.load(open(rc.path, encoding="utf-8"))
        next(iter(c["results"].values()))["value"]["128"][0] = 0.0
        json.dump(c, open(rc.path, "w", encoding="utf-8"))
        assert rc.get({"w": "abc", "n": 4}) is None
    print("checkpoint_store 自检通过：存盘 / 核对（配置差异、SHA-256、seal、无 manifest）/ 拒收 / 续训 / 结果缓存")


if __name__ == "__main__":
    _selftest()
