#!/usr/bin/env python3
"""课前总检查：跑每个实验模块的自检和每个演示脚本，打印一张 ✓ / ✗ / skip 表。

用法（通常通过 Makefile）：
    python3 tools/check_all.py                    # 全部讲次；演示用 --quick
    python3 tools/check_all.py --folders lecture02 lecture11
    python3 tools/check_all.py --full             # 演示用完整规模（make figures）
    python3 tools/check_all.py --list             # 只列出会跑什么

发现规则（新讲次按 CONTRIBUTING.md 放文件即可，不用改这里）：
    讲次文件夹   ：根目录下名为 prereqN / lectureNN 的文件夹，按编号排序（prereq 在前）
    实验模块     ：文件夹里不以数字开头、含 `def _selftest(` 的 .py 文件（它必须在 `if __name__ == "__main__":`
                   里调用 _selftest()，否则报错）；运行 `python <file>`
    演示脚本     ：文件夹里名为 `NN_*.py` 的文件；运行 `python <file> --quick`
    工作台脚本   ：`<讲次>/bench/*.py`（GPU 的测量工具）；运行 `python <file> --replot`：不用 GPU，
                   由已提交的 JSON 重画 bench/results/ 里的图
每一项在自己的子进程里运行（lecture11 与 lecture18 各有一个 flash_lab，不能同处一个进程）。
退出码 0 = ✓，77 = skip（原因取输出里最后一行 `SKIP: ...`），78 = blocked（学生树里跑到了还没做的练习：
course_utils 的 excepthook 打印"被练习 X 挡住"；没经过它的 NotImplementedError("练习 X 未完成：…") 的
traceback 也算），其他 = ✗（打印输出的最后几行）。整体有任何 ✗ 时退出码为 1；blocked 不算失败。
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SKIP_CODE = 77
BLOCKED_CODE = 78          # 与 lecture01/course_utils.py 的 BLOCKED_CODE 相同
BLOCKED_RE = re.compile(r"被练习 (P?\d+\.\d+) 挡住|NotImplementedError: 练习 (P?\d+\.\d+) 未完成")
# 每项的超时（秒）：check-all 和 pytest 共用这一个默认值，环境变量 CHECK_TIMEOUT 可以改
DEFAULT_TIMEOUT = int(os.environ.get("CHECK_TIMEOUT", "600"))
FOLDER_RE = re.compile(r"^(prereq|lecture)(\d+)$")
DEMO_RE = re.compile(r"^\d\d_\w+\.py$")


@dataclass
class Item:
    folder: str
    filename: str
    kind: str          # "selftest"、"demo" 或 "bench"（filename 是 bench/<name>.py）

    @property
    def label(self):
        return f"{self.folder}/{self.filename}"

    def argv(self, python, full=False):
        args = [python, os.path.join(ROOT, self.folder, self.filename)]
        if self.kind == "demo" and not full:
            args.append("--quick")
        if self.kind == "bench":
            args.append("--replot")
        return args


def course_folders(root=ROOT):
    """根目录下的讲次文件夹，prereq 在前，再按讲次编号。"""
    found = []
    for name in os.listdir(root):
        m = FOLDER_RE.match(name)
        if m and os.path.isdir(os.path.join(root, name)):
            found.append((m.group(1) != "prereq", int(m.group(2)), name))
    return [name for *_, name in sorted(found)]


MAIN_CALLS_SELFTEST = re.compile(r"^if __name__ == [\"']__main__[\"']:\n(?:[ \t]+.*\n|\s*\n)*?[ \t]+.*_selftest\(",
                                 re.MULTILINE)


def is_lab_module(path):
    """含 `def _selftest(` 的文件是实验模块；它还必须在 `if __name__ == "__main__":` 里调用 _selftest()，
    否则 `python <file>` 什么也不检查就以 0 退出——那种文件直接报错，而不是悄悄显示 ✓。"""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if "def _selftest(" not in text:
        return False
    if not MAIN_CALLS_SELFTEST.search(text):
        raise ValueError(f"{path} 定义了 _selftest()，但 `if __name__ == \"__main__\":` 里没有调用它")
    return True


def discover(root=ROOT, folders=None):
    """返回要跑的 Item 列表：每个讲次先自检、后演示（按编号）、最后工作台脚本（bench/ 里按名字）。"""
    all_folders = course_folders(root)
    if folders:
        unknown = sorted(set(folders) - set(all_folders))
        if unknown:
            raise ValueError(f"folders 里有不存在的讲次文件夹 {unknown}；现有：{all_folders}")
        all_folders = [f for f in all_folders if f in folders]
    items = []
    for folder in all_folders:
        names = sorted(os.listdir(os.path.join(root, folder)))
        for name in names:
            path = os.path.join(root, folder, name)
            if name.endswith(".py") and not name[0].isdigit() and is_lab_module(path):
                items.append(Item(folder, name, "selftest"))
        items += [Item(folder, n, "demo") for n in names if DEMO_RE.match(n)]
        bench = os.path.join(root, folder, "bench")
        if os.path.isdir(bench):
            items += [Item(folder, f"bench/{n}", "bench") for n in sorted(os.listdir(bench))
                      if n.endswith(".py") and not n.startswith("_")]
    return items


def child_env():
    # 子进程打印中文：不管本机 locale 是什么，都按 UTF-8 输出、按 UTF-8 读回
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1",
               PYTHONIOENCODING="utf-8")
    # 几项同时跑（--jobs 2、pytest -n 2）时，每个子进程的 BLAS / torch 再各开多个线程只会互相抢核；
    # 课程里的矩阵都很小，单线程更快也更稳。用户自己设置了就尊重用户的。
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    # 工作台的 --replot 照样重画已提交的图，但写进临时文件夹（course_utils.committed_figure）：检查不改动入库的文件
    env.setdefault("REPLOT_DIR", _replot_dir())
    return env


def _replot_dir():
    global _REPLOT_DIR
    if _REPLOT_DIR is None:
        _REPLOT_DIR = tempfile.mkdtemp(prefix="cs349e_replot_")
    return _REPLOT_DIR


_REPLOT_DIR = None


def run_item(item, python=sys.executable, full=False, timeout=DEFAULT_TIMEOUT):
    """运行一项，返回 (status, seconds, 输出尾部或 skip / blocked 的原因)。
    status ∈ {"ok", "fail", "skip", "blocked"}。"""
    t0 = time.perf_counter()
    try:
        r = subprocess.run(item.argv(python, full), cwd=ROOT, env=child_env(), capture_output=True,
                           text=True, encoding="utf-8", errors="replace", timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"")
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        return "fail", time.perf_counter() - t0, out[-2000:] + f"\n[超时：超过 {timeout} s]"
    dt = time.perf_counter() - t0
    out = r.stdout + r.stderr
    if r.returncode == 0:
        return "ok", dt, out
    if r.returncode == SKIP_CODE:
        reasons = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("SKIP:")]
        return "skip", dt, reasons[-1][5:].strip() if reasons else "(没有给出原因)"
    blocked = BLOCKED_RE.search(out)
    if blocked and r.returncode in (BLOCKED_CODE, 1):
        return "blocked", dt, f"blocked by 练习 {blocked.group(1) or blocked.group(2)}"
    return "fail", dt, out[-3000:] + f"\n[退出码 {r.returncode}]"


SYMBOL = {"ok": "✓", "fail": "✗", "skip": "skip", "blocked": "blocked"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folders", nargs="*", help="只检查这些讲次文件夹")
    ap.add_argument("--full", action="store_true", help="演示脚本不加 --quick（生成完整规模的图；工作台照样 --replot）")
    ap.add_argument("--list", action="store_true", help="只列出会运行的项目")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("CHECK_JOBS", "2")),
                    help="同时运行几项（默认 2，即 2 核机器的核数；计时类演示在 --jobs 1 时最准）")
    ap.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT,
                    help="每项的超时（秒）")
    a = ap.parse_args(argv)
    if a.jobs < 1:
        ap.error(f"--jobs 必须 ≥ 1，收到 {a.jobs}")
    items = discover(folders=a.folders)
    if a.list:
        for it in items:
            print(f"{it.kind:9s} {' '.join(os.path.relpath(x, ROOT) for x in it.argv('python', a.full)[1:])}")
        return 0
    if not items:
        print("没有找到任何实验模块、演示或工作台脚本。")
        return 1
    width = max(len(it.label) for it in items)
    mode = "完整规模" if a.full else "--quick"
    print(f"检查 {len(items)} 项（演示：{mode}；工作台：--replot；并行 {a.jobs}；Python {sys.version.split()[0]}）")
    t_all = time.perf_counter()
    results = {}
    order = {it.label: k for k, it in enumerate(items, 1)}

    def work(it):
        results[it.label] = run_item(it, full=a.full, timeout=a.timeout)
        status, dt, info = results[it.label]
        extra = f"  {info}" if status in ("skip", "blocked") else ""
        # 每项只打印一次（完成时；并行时是完成顺序，方括号里是发现顺序的编号）
        print(f"  [{order[it.label]:{len(str(len(items)))}d}/{len(items)}] {SYMBOL[status]:7s} {it.label:{width}s} "
              f"{dt:7.1f} s{extra}", flush=True)

    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        list(pool.map(work, items))
    wall = time.perf_counter() - t_all

    counts = {"ok": 0, "fail": 0, "skip": 0, "blocked": 0}
    for it in items:
        counts[results[it.label][0]] += 1
    for it in items:
        status, _, info = results[it.label]
        if status == "fail":
            print(f"\n----- ✗ {it.label} 的输出（末尾）-----\n{info.rstrip()}")
    slow = sorted(items, key=lambda it: -results[it.label][1])[:3]
    blocked = f", {counts['blocked']} blocked（被还没做的练习挡住）" if counts["blocked"] else ""
    print(f"\n{counts['ok']} passed, {counts['fail']} failed, {counts['skip']} skipped{blocked}  "
          f"（墙钟 {wall:.0f} s；最慢：{', '.join(f'{it.label} {results[it.label][1]:.1f} s' for it in slow)}）")
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
