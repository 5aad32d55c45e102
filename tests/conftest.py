"""pytest 的公共设置：测试文件可以 `from labload import load_lab`，也能导入 tools/check_all.py 的发现逻辑。

学生树里（练习的解答换成了 raise NotImplementedError("练习 X 未完成：…")）：不是练习检查的测试碰到别的练习的
留空处时报告成 skipped "blocked by 练习 X"，而不是失败；练习检查（标记 exercise）照常失败。每个报告带上
user_properties（练习编号、异常的第一行、留空处的编号），tools/grade.py 和学生树的 CI 测试据此分类；
设了环境变量 CS349E_REPORT 时把每个报告写成一行 JSON 追加到那个文件。
"""
import json
import os
import re
import sys

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
for extra in (TESTS_DIR, os.path.join(TESTS_DIR, "..", "tools"), os.path.join(TESTS_DIR, "..", "lecture01")):
    if extra not in sys.path:
        sys.path.insert(0, extra)
# 子进程和本进程里的 matplotlib 都不开窗口
os.environ.setdefault("MPLBACKEND", "Agg")


# ---- Triton 解释器测试（test_lecture11_triton.py、test_lecture11_decode.py）共用的两个 fixture ----
import pytest  # noqa: E402
import torch  # noqa: E402

# triton.language 的库函数（tl.cdiv……）在第一次 import triton 时就定成"解释"或"编译"两种之一。没有 GPU 时
# 只有解释器能跑内核：先以解释器模式导入一次，这样别的测试文件（如 gluon_flash 的）先 import triton 也不会
# 让后面的解释器测试拿到编译模式的 tl.cdiv（与测试文件的先后顺序无关）。有 GPU 时不动：GPU 测试要编译模式。
if not torch.cuda.is_available():
    from triton_interp import interpreter_env  # noqa: E402
    with interpreter_env():
        try:
            import triton.language  # noqa: F401
        except ImportError:                  # 没有 triton：解释器测试自己会 skip
            pass


@pytest.fixture
def triton_interpret(monkeypatch):
    """本测试运行期间打开 Triton 解释器（测试文件用 pytestmark 的 usefixtures 打开它）。"""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def gen(request):
    """每个测试一组新的随机输入（种子由测试名和随机数决定，打印出来，失败时可复现）。"""
    seed = (hash(request.node.name) ^ int(torch.randint(0, 2**30, (1,)))) % 2**31
    print("seed", seed)
    return torch.Generator().manual_seed(seed)


# ---- 学生树：被别的练习挡住的测试 ----
from course_utils import EXERCISE_HOLE_RE, exercise_hole  # noqa: E402

if os.path.exists(os.path.join(TESTS_DIR, "..", ".student-tree")):
    # 学生树里被留空处挡住的 hypothesis 测试一碰就失败：不缩小反例、不找第二个失败（否则一个测试要缩几分钟）
    from hypothesis import Phase, settings  # noqa: E402
    settings.register_profile("student-tree", phases=(Phase.explicit, Phase.reuse, Phase.generate),
                              report_multiple_bugs=False)
    settings.load_profile("student-tree")

_BLOCKED_TEXT = re.compile(r"被练习 (P?\d+\.\d+) 挡住|NotImplementedError: " + EXERCISE_HOLE_RE.pattern)


def blocking_exercise(exc=None, text=""):
    """异常 exc（链上）或输出文字 text（子进程的输出）里的练习留空处编号；没有时 None。"""
    hole = exercise_hole(exc) if exc is not None else None
    if hole:
        return hole[0]
    m = _BLOCKED_TEXT.search(text or "")
    return (m.group(1) or m.group(2)) if m else None


def _first_line(exc):
    while getattr(exc, "exceptions", None):     # hypothesis 找到几个不同的失败时抛 ExceptionGroup：报第一个
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    rep = (yield).get_result()
    marker = item.get_closest_marker("exercise")
    if marker is not None:
        rep.user_properties.append(("exercise", marker.args[0]))
    if call.excinfo is None or not rep.failed:
        return
    exc = call.excinfo.value
    blocker = blocking_exercise(exc, str(exc))
    if marker is not None:                      # 练习检查：照常失败，记下原因给评分用
        rep.user_properties.append(("error", _first_line(exc)))
        if blocker:
            rep.user_properties.append(("hole", blocker))
    elif blocker:
        path, lineno, _ = item.location
        rep.outcome = "skipped"
        rep.longrepr = (str(item.path), (lineno or 0) + 1, f"blocked by 练习 {blocker}")
        rep.user_properties.append(("blocked", blocker))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    # 测试文件在导入时就碰到留空处（模块级的计算调用了练习函数）：整个文件报告成 blocked，不是收集错误
    rep = (yield).get_result()
    if rep.failed and not os.path.basename(str(collector.path)).startswith("test_ex_"):
        blocker = blocking_exercise(text=str(rep.longrepr))
        if blocker:
            rep.outcome = "skipped"
            rep.longrepr = (str(collector.path), 0, f"blocked by 练习 {blocker}")
            rep.result = []


_REPORT = {}


def pytest_configure(config):
    # xdist：报告在主进程里写（worker 的报告也会转到主进程），worker 自己不写，免得每行两份
    _REPORT["path"] = None if hasattr(config, "workerinput") else os.environ.get("CS349E_REPORT")


def pytest_runtest_logreport(report):
    path = _REPORT.get("path")
    if not path or (report.when != "call" and not (report.failed or report.skipped)):
        return
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = report.longrepr[2]
    else:
        reason = str(report.longrepr)[-1500:] if report.failed else ""
    row = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome, "reason": reason,
           "props": dict(report.user_properties), "duration": report.duration}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")


def pytest_collectreport(report):
    path = _REPORT.get("path")
    if path and (report.failed or report.skipped):
        reason = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else str(report.longrepr)
        row = {"nodeid": report.nodeid, "when": "collect", "outcome": report.outcome, "reason": reason[-2000:],
               "props": {}, "duration": 0.0}
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
