"""
flash-attn 自己的测试（tests/test_flash_attn.py）跑在我们的内核上：过了几个网格点、哪些失败、哪些要我们没有的特性？

你会看到
  每个 flash-attn 测试函数的网格点总数、随机抽到的个数（每个函数 --per-test 个，种子会打印）、通过 / 失败 /
  "不支持"（用到 flash_attn_compat.UNSUPPORTED_FEATURES 里的特性：按标签计数，不算失败）/ 测试自己跳过的个数，
  失败的 node id 和第一行错误。结果写进 --out 下的 flash_attn_suite.json 和 flash_attn_suite.md（对齐的表）。

怎么做的
  1. 在临时目录里造一个假的 flash_attn 包：__init__ 从 lecture11/flash_attn_compat.py 导出 flash-attn 2 的 7 个
     公开函数；bert_padding、layers.rotary（及它要的 ops.triton.rotary）执行 checkout 里的原文件（rotary 装不上时
     换成抛 'kvcache-rotary' 的替身）；flash_attn_interface 只有测试导入的 _get_block_size_n、USE_TRITON_ROCM，
     其余内部名字都是抛 'internal-api' 的替身。临时目录放在 PYTHONPATH 最前面。
  2. 用 pytest（-p flash_attn_suite：本文件同时是插件）跑 checkout 的测试文件：插件收集全部网格点，按种子从
     排好序的 node id 里每个函数抽固定个数（每个 xdist 进程抽到的一样），把兼容层抛的 NotImplementedError 改记成
     带标签的跳过，逐项记下结果。-n 个 xdist 进程共用一块 GPU 和一个 TRITON_CACHE_DIR（编译过的内核互相复用）。

运行（GPU；checkout 只需要 tests/test_flash_attn.py 和它导入的纯 Python 文件，见 bench/README.md）：
    python3 lecture11/bench/flash_attn_suite.py --flash-attn PATH [--per-test 40] [--seed N] [--tests a,b] [-n 16]
        [--deadline 540] [--out lecture11/bench/results]
    python3 lecture11/bench/flash_attn_suite.py --flash-attn PATH --collect-only    # CPU 也行：只收集、抽样、计数
    python3 lecture11/bench/flash_attn_suite.py --summary | --replot      # 从提交的 JSON 重印表（--replot 还重写 .md）
没有 GPU 时（--collect-only、--summary、--replot 之外）打印一行 SKIP、退出码 77。
依赖 torch、triton、pytest、pytest-xdist；flash-attn 的测试文件还要 einops。
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
LECTURE = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(LECTURE, "..", "lecture01"))
sys.path.insert(0, os.path.join(LECTURE, "..", "lecture01", "bench"))
from course_utils import format_table, load_json  # noqa: E402
from gpu_timing import gpu_meta  # noqa: E402

SKIP = 77
DEFAULT_OUT = os.path.join(HERE, "results")
JSON_NAME, MD_NAME = "flash_attn_suite.json", "flash_attn_suite.md"
TEST_FILE = os.path.join("tests", "test_flash_attn.py")
DEFAULT_TESTS = (
    "test_flash_attn_output", "test_flash_attn_varlen_output", "test_flash_attn_causal",
    "test_flash_attn_varlen_causal", "test_flash_attn_splitkv", "test_flash_attn_kvcache",
    "test_flash_attn_qkvpacked", "test_flash_attn_varlen_qkvpacked", "test_flash_attn_deterministic",
    "test_flash_attn_varlen_deterministic", "test_flash_attn_race_condition", "test_flash_attn_bwd_overflow",
    "test_flash_attn_bwd_transpose", "test_flash_attn_bwd_varlen_overflow",
)
PER_TEST = 40                       # 每个测试函数抽几个网格点（0 = 全部）
FAKE_CAPABILITY = "9,0"             # --collect-only 在 CPU 上：测试文件 import 时查的 compute capability（H200）
TRITON_CACHE = os.path.join(tempfile.gettempdir(), "flash_attn_suite_triton_cache")   # 同一台机器上重跑时还在
DEADLINE_REASON = "flash_attn_suite: past --deadline, not run"


# ============================================================================
# 抽样（每个进程算出同一份：只依赖种子、函数名和排好序的 node id）
# ============================================================================
def sample_ids(nodeids, k, seed, func):
    """从 nodeids 里确定地抽 k 个（k = 0 或不少于总数：全要），返回集合。"""
    ids = sorted(nodeids)
    if k == 0 or len(ids) <= k:
        return set(ids)
    return set(random.Random(f"{seed}:{func}").sample(ids, k))


# 参数一看就知道要兼容层没有的特性的网格点：不抽、不跑，按特性计数（flash-attn 的 kvcache 测试 30 万个网格点里
# 只有约 1% 只用到我们有的特性，不先筛掉的话抽 40 个几乎一个也跑不到）。(参数名, 取值 → 是否需要, 特性标签)
_DROPOUT_PROBS = (("dropout_p", lambda v: v > 0, "dropout-probs"),)   # 这些测试 dropout > 0 时都要读 S_dmask
PREFILTER = {
    "test_flash_attn_output": _DROPOUT_PROBS,
    "test_flash_attn_varlen_output": _DROPOUT_PROBS,
    "test_flash_attn_qkvpacked": _DROPOUT_PROBS,
    "test_flash_attn_varlen_qkvpacked": _DROPOUT_PROBS,
    "test_flash_attn_varlen_causal": (("paged_kv_block_size", lambda v: v is not None, "paged-kv"),),
    "test_flash_attn_kvcache": (
        ("paged_kv_block_size", lambda v: v is not None, "paged-kv"),
        ("has_batch_idx", bool, "cache-batch-idx"),
        ("has_leftpad", bool, "cache-leftpad"),
        ("new_kv", bool, "kvcache-append"),
        ("rotary_fraction", lambda v: v > 0, "kvcache-rotary"),
        ("local", bool, "window-kvcache"),
        ("alibi", bool, "alibi-kvcache"),
    ),
}


def needs_feature(func, params):
    """这个网格点（参数字典）按 PREFILTER 需要的第一个缺少的特性标签；不需要时 None。"""
    for name, need, tag in PREFILTER.get(func, ()):
        if name in params and need(params[name]):
            return tag
    return None


def tag_of(exc):
    """兼容层因为缺少特性而抛的 NotImplementedError → 标签（flash_attn_compat.feature_of：只认登记过的标签，
    拼错的标签算失败）；否则 None。插件所在的进程里 flash_attn_compat 总在 PYTHONPATH 上（假包就是从它导出的）。"""
    if not isinstance(exc, NotImplementedError):
        return None
    if LECTURE not in sys.path:
        sys.path.insert(0, LECTURE)
    from flash_attn_compat import feature_of
    return feature_of(exc)


def _first_line(text, limit=300):
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def _crash_message(report):
    """失败报告的第一行错误（"AssertionError: assert ..."），和它在哪一行。"""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return _first_line(crash.message), f"{os.path.basename(str(crash.path))}:{crash.lineno}"
    text = str(report.longrepr)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return (_first_line(lines[-1]) if lines else ""), ""


# ============================================================================
# pytest 插件：-p flash_attn_suite
# ============================================================================
def pytest_addoption(parser):
    g = parser.getgroup("flash_attn_suite")
    g.addoption("--fa-seed", type=int, default=0, help="抽样的种子")
    g.addoption("--fa-per-test", type=int, default=PER_TEST, help="每个测试函数抽几个网格点（0 = 全部）")
    g.addoption("--fa-tests", default="", help="逗号分隔的测试函数名（空 = 文件里全部）")
    g.addoption("--fa-record", default=None, help="主进程把逐项结果写进这个 JSON")
    g.addoption("--fa-deadline", type=float, default=0.0, help="Unix 时间：过了它的网格点不再运行（0 = 不限）")
    g.addoption("--fa-capability", default=None,
                help="没有 CUDA 时 torch.cuda.get_device_capability 返回的值，如 9,0（只为在 CPU 上收集）")


def pytest_configure(config):
    config.pluginmanager.register(SuitePlugin(config), "flash_attn_suite_state")
    cap = config.getoption("--fa-capability")
    if cap:
        _fake_capability(tuple(int(x) for x in cap.split(",")))


def _fake_capability(cap):
    """flash-attn 的测试文件 import 时就调 torch.cuda.get_device_capability("cuda")：CPU 上收集时换成假的值。"""
    import torch
    if not torch.cuda.is_available():
        torch.cuda.get_device_capability = lambda device=None: cap


class SuitePlugin:
    """抽样、把兼容层的 NotImplementedError 改记成带标签的跳过、逐项记结果（主进程写 JSON）。"""

    def __init__(self, config):
        self.config = config
        self.seed = config.getoption("--fa-seed")
        self.per_test = config.getoption("--fa-per-test")
        wanted = config.getoption("--fa-tests")
        self.wanted = [t for t in wanted.split(",") if t] if wanted else None
        self.record = config.getoption("--fa-record")
        self.deadline = config.getoption("--fa-deadline")
        self.is_worker = hasattr(config, "workerinput")
        self.grid, self.kept = {}, {}            # 函数 → 网格点总数 / 抽到的 node id
        self.prefiltered = {}                    # 函数 → {特性: 按参数筛掉的网格点数}（PREFILTER）
        self.results = {}                        # node id → 结果
        self.worker_tests = []                   # xdist：各进程报回来的 (grid, kept)

    def _selected(self, func):
        return self.wanted is None or func in self.wanted

    # ---- 收集：先在参数组合这一层抽样（几十万个网格点不必都变成 Item），再在 Item 这一层核对
    @pytest.hookimpl(trylast=True)
    def pytest_generate_tests(self, metafunc):
        calls = getattr(metafunc, "_calls", None)      # pytest 的内部属性：没有时只在 Item 这一层抽样
        if not isinstance(calls, list) or not calls or not all(hasattr(c, "id") for c in calls):
            return
        func = metafunc.definition.name
        if not self._selected(func):
            del calls[1:]                             # 留一个，稍后整个函数被 deselect
            return
        ids = [f"{metafunc.definition.nodeid}[{c.id}]" for c in calls]
        if len(set(ids)) != len(ids):                 # id 有重复：pytest 之后还会改名，只在 Item 这一层抽样
            return
        self.grid[func] = len(calls)
        pairs = self._prefilter(func, [(c, nid, c.params) for c, nid in zip(calls, ids)])
        keep = sample_ids([nid for _, nid in pairs], self.per_test, self.seed, func)
        calls[:] = [c for c, nid in pairs if nid in keep]

    def _prefilter(self, func, entries):
        """(对象, node id, 参数) → 不需要缺少的特性的 (对象, node id)；筛掉的按特性记进 self.prefiltered。"""
        if func in self.prefiltered:                  # 参数层已经筛过（Item 层不再重复计数）
            return [(x, nid) for x, nid, _ in entries]
        counts, kept = {}, []
        for x, nid, params in entries:
            tag = needs_feature(func, params)
            if tag is None:
                kept.append((x, nid))
            else:
                counts[tag] = counts.get(tag, 0) + 1
        self.prefiltered[func] = counts
        return kept

    def pytest_collection_modifyitems(self, session, config, items):
        fa = sys.modules.get("flash_attn")
        if fa is not None and not getattr(fa, "__fa_compat__", False):
            pytest.exit(f"flash_attn_suite：测试导入的 flash_attn 是 {getattr(fa, '__file__', fa)}，不是假包", 3)
        by_func = {}
        for item in items:
            by_func.setdefault(getattr(item, "originalname", None) or item.name.split("[")[0], []).append(item)
        keep = set()
        for func, its in by_func.items():
            if not self._selected(func):
                continue
            self.grid.setdefault(func, len(its))
            params = [getattr(getattr(it, "callspec", None), "params", {}) for it in its]
            pairs = self._prefilter(func, [(it, it.nodeid, p) for it, p in zip(its, params)])
            chosen = sample_ids([nid for _, nid in pairs], self.per_test, self.seed, func)
            self.kept[func] = sorted(chosen)
            keep |= chosen
        dropped = [it for it in items if it.nodeid not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [it for it in items if it.nodeid in keep]
        if self.is_worker:
            config.workeroutput["fa_suite"] = {"grid": self.grid, "kept": self.kept, "prefiltered": self.prefiltered}

    # ---- 运行
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        if self.deadline and time.time() > self.deadline:
            pytest.skip(DEADLINE_REASON)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        rep = yield
        if call.excinfo is None or not rep.failed:
            return rep
        tag = tag_of(call.excinfo.value)
        if tag is not None:                           # 兼容层缺这个特性：记成跳过，按标签计数
            rep.outcome = "skipped"
            rep.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: flash_attn_compat unsupported '{tag}'")
            rep.user_properties.append(("fa_unsupported", tag))
        else:                                         # 失败在测试文件的哪一行（最里层的帧常在 torch 里）
            lines = [e.lineno + 1 for e in call.excinfo.traceback if str(e.path) == str(item.path)]
            if lines:
                rep.user_properties.append(("fa_where", f"{item.path.name}:{lines[-1]}"))
        return rep

    def pytest_runtest_logreport(self, report):
        if self.is_worker:
            return
        rec = self.results.setdefault(report.nodeid, {"outcome": None})
        if report.when == "call":
            rec["seconds"] = round(report.duration, 3)
        if report.failed:
            if rec["outcome"] not in ("failed", "error"):
                message, where = _crash_message(report)
                where = dict(report.user_properties).get("fa_where", where)
                rec.update(outcome="failed" if report.when == "call" else "error", phase=report.when,
                           message=message, where=where, stdout_tail=report.capstdout.splitlines()[-6:])
        elif report.skipped:
            tag = dict(report.user_properties).get("fa_unsupported")
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            reason = reason.removeprefix("Skipped: ")
            if tag is not None:
                rec.update(outcome="unsupported", feature=tag)
            elif reason == DEADLINE_REASON:
                rec.update(outcome="not-run")
            else:
                rec.update(outcome="skipped", reason=_first_line(reason, 120) or "(no reason given)")
        elif report.when == "call" and rec["outcome"] is None:
            rec["outcome"] = "passed"

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        out = getattr(node, "workeroutput", {}).get("fa_suite")
        if out is not None:
            self.worker_tests.append(out)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        if self.is_worker or not self.record:
            return
        grid, kept, pre, agree = self.grid, self.kept, self.prefiltered, True
        if self.worker_tests:                         # xdist：主进程自己不收集，用第一个进程报回来的
            first = self.worker_tests[0]
            grid, kept, pre = first["grid"], first["kept"], first.get("prefiltered", {})
            agree = all(w == first for w in self.worker_tests)
        with open(self.record, "w", encoding="utf-8") as f:
            json.dump(dict(seed=self.seed, per_test=self.per_test, wanted=self.wanted, grid=grid, kept=kept,
                           prefiltered=pre, workers_agree=agree, exitstatus=int(exitstatus),
                           results=self.results), f)


# ============================================================================
# 假的 flash_attn 包
# ============================================================================
_PUBLIC = '''from flash_attn_compat import (  # noqa: F401
    flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)
'''
_INIT = '''"""flash_attn_suite 生成的假 flash_attn 包：公开函数来自 lecture11/flash_attn_compat.py（我们的内核）。"""
''' + _PUBLIC + '''
__version__ = "compat"
__fa_compat__ = True       # 插件核对：测试拿到的是这个包，不是 checkout 里真的 flash_attn
'''

_INTERFACE = '''"""假的 flash_attn.flash_attn_interface：公开函数同 flash_attn，加上测试导入的两个名字；其余是替身。"""
from flash_attn_compat import unsupported
''' + _PUBLIC + '''

USE_TRITON_ROCM = False


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """flash-attn 内核的 key 块大小，测试只拿它解读 dropout 后的 S_dmask（normalize_flash_attn_S）。兼容层给不出
    那个 S_dmask（用它就抛 'dropout-probs'），这里的值用不上。"""
    return 64


class _Internal:
    """flash-attn 的内部接口（flash_attn_gpu、_flash_attn_forward……）：调用它或取它的属性都抛 'internal-api'。"""

    def __init__(self, name):
        object.__setattr__(self, "_name", name)

    def __call__(self, *args, **kwargs):
        raise unsupported("internal-api", f"flash_attn_interface.{self._name}")

    def __getattr__(self, attr):
        raise unsupported("internal-api", f"flash_attn_interface.{self._name}.{attr}")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Internal(name)
'''

_EXEC = '''"""执行 flash-attn checkout 里的 {rel}（假 flash_attn 包里的同名模块）。"""
_PATH = {path!r}
with open(_PATH, encoding="utf-8") as _f:
    exec(compile(_f.read(), _PATH, "exec"))
'''

_ROTARY = '''"""执行 checkout 里的 flash_attn/layers/rotary.py；装不上（缺文件、缺依赖）时 apply_rotary_emb 是替身。"""
_PATH = {path!r}
try:
    with open(_PATH, encoding="utf-8") as _f:
        exec(compile(_f.read(), _PATH, "exec"))
except Exception as _err:  # noqa: BLE001  缺文件、缺 triton / einops……：都换成替身
    _REASON = f"{{type(_err).__name__}}: {{_err}}"

    def apply_rotary_emb(*args, **kwargs):
        from flash_attn_compat import unsupported
        raise unsupported("kvcache-rotary", f"apply_rotary_emb（flash-attn 的 rotary 没装上：{{_REASON}}）")
'''


def write_fake_package(tmp, checkout):
    """在 tmp 下造 flash_attn/ 包（见模块 docstring 第 1 步）和一个空的 pytest.ini。"""
    files = {
        "flash_attn/__init__.py": _INIT,
        "flash_attn/flash_attn_interface.py": _INTERFACE,
        "flash_attn/bert_padding.py": _EXEC.format(rel="flash_attn/bert_padding.py",
                                                   path=os.path.join(checkout, "flash_attn", "bert_padding.py")),
        "flash_attn/layers/__init__.py": "",
        "flash_attn/layers/rotary.py": _ROTARY.format(path=os.path.join(checkout, "flash_attn", "layers",
                                                                        "rotary.py")),
        "flash_attn/ops/__init__.py": "",
        "flash_attn/ops/triton/__init__.py": "",
        "flash_attn/ops/triton/rotary.py": _EXEC.format(rel="flash_attn/ops/triton/rotary.py",
                                                        path=os.path.join(checkout, "flash_attn", "ops", "triton",
                                                                          "rotary.py")),
        "pytest.ini": "[pytest]\n",
    }
    for rel, text in files.items():
        path = os.path.join(tmp, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def checkout_info(checkout):
    """flash-attn checkout 的提交（COMMIT 文件或 git）和版本（flash_attn/__init__.py 的 __version__）。"""
    commit = None
    commit_file = os.path.join(checkout, "COMMIT")
    if os.path.isfile(commit_file):
        with open(commit_file, encoding="utf-8") as f:
            commit = f.read().strip() or None
    elif os.path.exists(os.path.join(checkout, ".git")):
        try:
            commit = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True,
                                    check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = None
    version = None
    init = os.path.join(checkout, "flash_attn", "__init__.py")
    if os.path.isfile(init):
        with open(init, encoding="utf-8") as f:
            m = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", f.read(), re.MULTILINE)
        version = m and m.group(1)
    return dict(commit=commit, version=version)


# ============================================================================
# 运行 pytest、汇总
# ============================================================================
def build_pytest_command(checkout, tmp, record, args, seed, deadline, tests=None):
    """运行器的 pytest 命令行（tests：要跑的测试函数，默认 args.tests）。"""
    cmd = [sys.executable, "-m", "pytest", os.path.join(checkout, TEST_FILE), "-c", os.path.join(tmp, "pytest.ini"),
           "--rootdir", checkout, "-p", "flash_attn_suite", "-p", "no:cacheprovider", "-q", "--tb=no",
           "--fa-seed", str(seed), "--fa-per-test", str(args.per_test), "--fa-record", record,
           "--fa-tests", ",".join(args.tests if tests is None else tests)]
    if args.collect_only:
        cmd += ["--collect-only", "-q", "--fa-capability", FAKE_CAPABILITY]
    elif args.workers > 0:
        cmd += ["-n", str(args.workers)]
    if deadline:
        cmd += ["--fa-deadline", str(deadline)]
    return cmd + list(args.pytest_arg)


def spawn_pytest(cmd, tmp, triton_cache, **kwargs):
    """在 tmp（假包所在的目录）里跑 pytest：`python -m` 把当前目录放在 sys.path 最前面，要是在 checkout 里跑，
    import 到的就是 checkout 里真的 flash_attn（它还会用 extend_path 把假包的子模块拼进来）。"""
    return subprocess.run(cmd, env=suite_env(tmp, triton_cache), cwd=tmp, **kwargs)


def suite_env(tmp, triton_cache):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([tmp, LECTURE, HERE] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["TRITON_CACHE_DIR"] = triton_cache
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("TRITON_INTERPRET", None)           # GPU 上跑编译好的内核
    return env


def _func_of(nodeid):
    return nodeid.split("::")[-1].split("[")[0]


def summarize(raw, tests):
    """插件的逐项记录 → 每个测试函数的计数（按 tests 的顺序；没抽到的函数也列出来，sampled = 0）。"""
    per = {}
    for func in tests:
        per[func] = dict(grid=raw["grid"].get(func, 0), sampled=len(raw["kept"].get(func, [])), passed=0,
                         failed=[], unsupported={}, skipped={}, not_run=0, missing=0, seconds=0.0,
                         prefiltered=dict(raw.get("prefiltered", {}).get(func, {})))
    for func, ids in raw["kept"].items():
        row = per.setdefault(func, dict(grid=raw["grid"].get(func, 0), sampled=len(ids), passed=0, failed=[],
                                        unsupported={}, skipped={}, not_run=0, missing=0, seconds=0.0,
                                        prefiltered=dict(raw.get("prefiltered", {}).get(func, {}))))
        for nid in ids:
            rec = raw["results"].get(nid, {"outcome": None})
            row["seconds"] += rec.get("seconds", 0.0)
            out = rec["outcome"]
            if out == "passed":
                row["passed"] += 1
            elif out in ("failed", "error"):
                row["failed"].append(dict(nodeid=nid, error=rec.get("message", ""), where=rec.get("where", ""),
                                          phase=rec.get("phase"), stdout_tail=rec.get("stdout_tail", [])))
            elif out == "unsupported":
                row["unsupported"][rec["feature"]] = row["unsupported"].get(rec["feature"], 0) + 1
            elif out == "skipped":
                row["skipped"][rec["reason"]] = row["skipped"].get(rec["reason"], 0) + 1
            elif out == "not-run":
                row["not_run"] += 1
            else:
                row["missing"] += 1                  # 抽到了却没有报告（进程崩溃等）
        row["seconds"] = round(row["seconds"], 1)
    return per


def summary_rows(per):
    rows = []
    for func, r in per.items():
        rows.append([func.removeprefix("test_flash_attn_") or func, r["grid"],
                     sum(r.get("prefiltered", {}).values()), r["sampled"], r["passed"],
                     len(r["failed"]), sum(r["unsupported"].values()), sum(r["skipped"].values()),
                     r["not_run"] + r["missing"], f"{r['seconds']:.0f}"])
    totals = [sum(row[j] for row in rows) for j in range(1, 9)]
    rows.append(["total", *totals, f"{sum(r['seconds'] for r in per.values()):.0f}"])
    return rows


def render_markdown(summary):
    """flash_attn_suite.md 的全文：说明、总表、按特性的"不支持"、失败清单。"""
    meta, per = summary["meta"], summary["tests"]
    fa = meta["flash_attn"]
    head = format_table(["test (test_flash_attn_*)", "grid", "needs missing", "sampled", "passed", "failed",
                         "unsupported", "skipped", "not run", "test s"], summary_rows(per))
    features = {}
    for func, r in per.items():
        merged = dict(r.get("prefiltered", {}))
        for tag, n in r["unsupported"].items():
            merged[tag] = merged.get(tag, 0) + n
        for tag, n in merged.items():
            features.setdefault(tag, [0, []])
            features[tag][0] += n
            features[tag][1].append(func.removeprefix("test_flash_attn_"))
    feat = format_table(["feature", "grid points", "tests"],
                        [[tag, n, ", ".join(fs)] for tag, (n, fs) in sorted(features.items(), key=lambda x: -x[1][0])]
                        or [["(none)", 0, ""]], align="<><")
    fails = [(f, x) for f, r in per.items() for x in r["failed"]]
    lines = [
        "# flash-attn tests on triton_flash (flash_attn_compat)", "",
        f"flash-attn {fa.get('commit') or '?'} (version {fa.get('version') or '?'}), {TEST_FILE}; "
        f"seed {meta['seed']}, {meta['per_test'] or 'all'} grid points per test function; "
        f"{meta.get('gpu')}, torch {meta.get('torch')}, triton {meta.get('triton')}; "
        f"{meta.get('workers')} xdist workers, wall {meta.get('wall_s', 0):.0f} s, {meta.get('date')}.", "",
        "needs missing = grid points whose parameters alone ask for a feature we lack (PREFILTER: counted, "
        "never sampled); unsupported = a sampled point whose call raised the adapter's NotImplementedError "
        "(flash_attn_compat.UNSUPPORTED_FEATURES; counted per feature, not a failure); skipped = the test skipped "
        "itself; not run = past --deadline or lost (worker crash).", "",
        "```", head, "```", "", "Unsupported, by feature:", "", "```", feat, "```", "",
        f"Failures ({len(fails)}):", "",
    ]
    lines += [f"- `{x['nodeid'].split('::')[-1]}` ({x['where'] or x['phase']}): {x['error']}" for _, x in fails[:60]]
    if len(fails) > 60:
        lines.append(f"- … {len(fails) - 60} more in {JSON_NAME}")
    if not fails:
        lines.append("- none")
    return "\n".join(lines) + "\n"


def collect_table(raw, tests):
    pre = raw.get("prefiltered", {})
    rows = [[func, raw["grid"].get(func, 0), sum(pre.get(func, {}).values()), len(raw["kept"].get(func, []))]
            for func in tests]
    rows.append(["total", *(sum(r[j] for r in rows) for j in (1, 2, 3))])
    return format_table(["test function", "grid points", "needs missing", "sampled"], rows)


# ============================================================================
# 命令行
# ============================================================================
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="flash-attn 的 tests/test_flash_attn.py 跑在 flash_attn_compat 上")
    ap.add_argument("--flash-attn", help="flash-attn checkout 的路径（含 tests/test_flash_attn.py）")
    ap.add_argument("--per-test", type=int, default=PER_TEST,
                    help=f"每个测试函数抽几个网格点（默认 {PER_TEST}，0 = 全部）")
    ap.add_argument("--seed", type=int, default=None, help="抽样种子（默认随机，会打印）")
    ap.add_argument("--tests", default=",".join(DEFAULT_TESTS),
                    help="逗号分隔的测试函数名（默认 14 个，见 DEFAULT_TESTS）")
    ap.add_argument("-n", "--workers", type=int, default=min(16, os.cpu_count() or 1),
                    help="pytest-xdist 进程数（共用一块 GPU；0 = 不用 xdist；默认 min(16, CPU 核数)）")
    ap.add_argument("--out", default=DEFAULT_OUT, help="结果目录（默认 lecture11/bench/results）")
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="开始后多少秒起不再开始新的网格点（记作 not run；0 = 不限）：GPU 命令有时限时用")
    ap.add_argument("--triton-cache", default=TRITON_CACHE, help=f"共用的 TRITON_CACHE_DIR（默认 {TRITON_CACHE}）")
    ap.add_argument("--resume", action="store_true",
                    help="接着 --out 里上次的 JSON 跑：沿用它的种子，跑完了的测试函数不再跑（上次到了 --deadline 时）")
    ap.add_argument("--collect-only", action="store_true", help="只收集、抽样、打印每个函数的个数（CPU 也行）")
    ap.add_argument("--summary", action="store_true", help="从 --out 里的 JSON 重印表")
    ap.add_argument("--replot", action="store_true", help="同 --summary，并按 JSON 重写 .md")
    ap.add_argument("--pytest-arg", action="append", default=[], help="原样传给 pytest 的参数（可重复）")
    args = ap.parse_args(argv)
    args.tests = [t.strip() for t in args.tests.split(",") if t.strip()]
    return args


def show_committed(args):
    path = os.path.join(args.out, JSON_NAME)
    summary = load_json(path)
    if summary is None:
        print(f"SKIP: 还没有 {os.path.relpath(path)}（在 GPU 上运行本脚本生成）")
        return SKIP
    text = render_markdown(summary)
    print(text)
    if args.replot:
        with open(os.path.join(args.out, MD_NAME), "w", encoding="utf-8") as f:
            f.write(text)
    return 0


def _need_gpu():
    """没有 torch 或 CUDA → SKIP 行；有 → None。"""
    try:
        import torch
    except ImportError:
        return "SKIP: 没有安装 torch（flash_attn_suite 要在 GPU 上跑；--collect-only 可在 CPU 上只收集）"
    if not torch.cuda.is_available():
        return "SKIP: flash_attn_suite 需要 CUDA GPU（--collect-only 可在 CPU 上只收集、抽样）"
    return None


def finished_rows(args, info):
    """--resume：--out 里已有的 JSON 若是同一份 checkout、同一个每函数个数（种子取它的），返回 (种子, 跑完了的函数的行,
    旧的 meta)——跑完 = 抽到的每一项都有结果（没有 not run）。不能接着跑时返回 None。"""
    path = os.path.join(args.out, JSON_NAME)
    old = load_json(path)
    if old is None:
        return None
    meta = old["meta"]
    if meta["flash_attn"].get("commit") != info["commit"] or meta["per_test"] != args.per_test \
            or (args.seed is not None and args.seed != meta["seed"]):
        print(f"flash_attn_suite：{os.path.relpath(path)} 的 checkout 提交 / --per-test / 种子和这次不同，不接着跑")
        return None
    done = {f: r for f, r in old["tests"].items()
            if f in args.tests and r["sampled"] and not r["not_run"] and not r["missing"]}
    return meta["seed"], done, meta


def run_suite(args, checkout, seed, tests):
    """造假包、跑 pytest；返回 (pytest 退出码, 插件的逐项记录或 None, 墙钟秒数)。tests 为空时不跑。"""
    if not tests:
        return 0, dict(grid={}, kept={}, results={}, workers_agree=True), 0.0
    with tempfile.TemporaryDirectory(prefix="flash_attn_suite_") as tmp:
        write_fake_package(tmp, checkout)
        record = os.path.join(tmp, "records.json")
        t0 = time.time()
        cmd = build_pytest_command(checkout, tmp, record, args, seed, t0 + args.deadline if args.deadline else 0.0,
                                   tests)
        rc = spawn_pytest(cmd, tmp, args.triton_cache).returncode
        wall = time.time() - t0
        if not os.path.isfile(record):
            print(f"flash_attn_suite：pytest 没有写出结果（退出码 {rc}）；命令：{' '.join(cmd)}")
            return rc, None, wall
        with open(record, encoding="utf-8") as f:
            return rc, json.load(f), wall


def write_results(args, summary):
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, JSON_NAME), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, ensure_ascii=False)
    text = render_markdown(summary)
    with open(os.path.join(args.out, MD_NAME), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    print(f"写了 {os.path.relpath(os.path.join(args.out, JSON_NAME))} 和 {MD_NAME}"
          f"（共 {summary['meta']['wall_s']:.0f} s）")


def _check_checkout(checkout):
    for rel in (TEST_FILE, os.path.join("flash_attn", "bert_padding.py")):
        if not os.path.isfile(os.path.join(checkout, rel)):
            return f"flash_attn_suite：{checkout} 里没有 {rel}（见 lecture11/bench/README.md）"
    return None


def main(argv=None):
    args = parse_args(argv)
    if args.summary or args.replot:
        return show_committed(args)
    if not args.flash_attn:
        print("flash_attn_suite：要给 --flash-attn PATH（flash-attn checkout，含 tests/test_flash_attn.py）")
        return 2
    checkout = os.path.abspath(args.flash_attn)
    bad = _check_checkout(checkout)
    if bad:
        print(bad)
        return 2
    why = None if args.collect_only else _need_gpu()
    if why:
        print(why)
        return SKIP
    info = checkout_info(checkout)
    prev = finished_rows(args, info) if args.resume and not args.collect_only else None
    seed, done, old_meta = prev or (args.seed if args.seed is not None else random.randrange(2**31), {}, None)
    tests = [t for t in args.tests if t not in done]
    print(f"flash_attn_suite: seed {seed}（--seed {seed} 复现同一份抽样），每个函数 {args.per_test or '全部'} 个网格点"
          + (f"；接着上次跑：{len(done)} 个函数已经跑完，这次跑 {len(tests)} 个" if prev else ""))
    rc, raw, wall = run_suite(args, checkout, seed, tests)
    if raw is None:
        return 1
    if args.collect_only:
        print(collect_table(raw, args.tests))
        return 0 if rc == 0 else 1
    if rc not in (0, 1) or not raw["workers_agree"]:
        print(f"flash_attn_suite：pytest 退出码 {rc}（0/1 之外：收集出错或被中断），"
              f"各进程抽样一致：{raw['workers_agree']}")
        return 1
    import torch
    command = " ".join(["python3", os.path.relpath(__file__)] + (sys.argv[1:] if argv is None else list(argv)))
    meta = gpu_meta(torch, seed=seed, per_test=args.per_test, workers=args.workers, deadline_s=args.deadline,
                    wall_s=round(wall + (old_meta["wall_s"] if old_meta else 0.0), 1),   # 接着跑：累加
                    runs=1 + (old_meta.get("runs", 1) if old_meta else 0), pytest_exit=rc, flash_attn=info,
                    command=command)
    fresh = summarize(raw, tests)
    per = {t: done[t] if t in done else fresh[t] for t in args.tests}
    write_results(args, dict(meta=meta, tests=per))
    failed = sum(len(r["failed"]) for r in per.values())
    if failed:
        print(f"flash_attn_suite：{failed} 个网格点失败（见 {MD_NAME}）")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
