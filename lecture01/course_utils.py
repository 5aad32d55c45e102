"""
course_utils.py —— 各讲共用的小工具：对齐的表格、好读的数字、存图、参数检查

【问题】每个演示都要把结果排成中英文混排也对齐的表格、把大数字写成 "16 GFLOP" "8.03B" "2.5 ms" 这样好读的样子、
    把 matplotlib 图存到 <讲次>/figures/；每个实验模块都要检查参数，坏输入要报出参数名和允许的取值。
    这些只写一份，就在这里。后面的讲次本来就把 lecture01 放进 sys.path，不需要新的导入路径：
        sys.path.insert(0, os.path.join(HERE, "..", "lecture01"))
        from course_utils import format_table, save_figure

【里面有什么】
    display_width(text) / format_table(headers, rows, align=None)   显示宽度（全角字占 2 格）；对齐的文本表格
    fmt_si / fmt_count / fmt_bytes / fmt_time                       数字 → 带单位前缀的短字符串
    figure_path(script, what, quick=False) / save_figure(fig, script, what, quick=…)
                                    存成 <script 所在文件夹>/figures/[quick/]<script 文件名>_<what>.png；先查字号
    committed_figure(script, name, replot)   已提交的图 <script 所在文件夹>/results/<name>：只有 replot 时才给路径
    pyplot() / merge_identical(series)   Agg 后端 + 投影用的字号（所有文字 ≥ MIN_FONT_PT = 12 磅）；重合曲线合成一条
    check_int / check_real / check_bool / check_choice / check_array / check_dtype / check_seed / check_memory
                  参数检查（类型、范围、取值、dtype、种子 = 整数 ≥ 0 或 np.random.Generator、分配前的大小）
    load_json(path)                 读已提交的结果 JSON（不存在时 None）
                                    （GPU 计时和"在哪测的"只有测量脚本用：在 lecture01/bench/gpu_timing.py）
    ratio_errors(ratios)            模型 / 实测的比值 → 中位 |比值 − 1| 和最差一点；expect_errors：自检里的坏输入表
    sha256_file / read_json_dict / update_json   检查点的 manifest、结果缓存、已提交的结果（strict=True）：
                                    核对文件、加锁的读-改-写

【约定】字节用十进制（1 kB = 1000 B）；图里的文字用英文（学生机器上常缺中文字形）；检查函数返回转换后的值
    （如 numpy 整数 → int、数组 → float64），只在出错时才拼报错消息（热路径上很便宜）。

【运行】python3 lecture01/course_utils.py     # 自检（不到 1 秒）
【依赖】模块级只用标准库；numpy 只在 check_array 里、matplotlib 只在真的存图时才导入。
"""

import math
import numbers
import os
import statistics
import re
import sys
import unicodedata

ALIGNS = ("<", ">")


# =============================================================================
# 学生树：脚本跑到还没做的练习时，只打印一行"被练习 X 挡住"（不是一屏 traceback）
# =============================================================================
BLOCKED_CODE = 78          # 退出码：被练习挡住（77 = skip）；tools/check_all.py 把它显示为 blocked
EXERCISE_HOLE_RE = re.compile(r"练习 (P?\d+\.\d+) 未完成[：:]\s*([^（\n]*)")


def exercise_hole(exc):
    """exc（或它的 __cause__ / __context__ 链上、ExceptionGroup 里）是练习留空处的 NotImplementedError 时
    返回 (编号, 标题)，否则 None。"""
    todo, seen = [exc], set()
    while todo:
        exc = todo.pop(0)
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, NotImplementedError):
            m = EXERCISE_HOLE_RE.search(str(exc))
            if m:
                return m.group(1), m.group(2).strip()
        todo += [*getattr(exc, "exceptions", ()), exc.__cause__, exc.__context__]
    return None


def _blocked_excepthook(kind, exc, tb, _previous=sys.excepthook):
    hole = exercise_hole(exc)
    if hole is None:
        return _previous(kind, exc, tb)
    ex_id, title = hole
    sys.stdout.flush()
    print(f"✗ 被练习 {ex_id} 挡住：{title}。先完成它：make grade EX={ex_id}", file=sys.stderr, flush=True)
    os._exit(BLOCKED_CODE)


sys.excepthook = _blocked_excepthook


# =============================================================================
# 表格
# =============================================================================
def display_width(text):
    """终端里的显示宽度：中文等东亚全角 / 宽字符（east_asian_width 为 W 或 F）占 2 格，其余占 1 格。"""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in str(text))


def format_table(headers, rows, align=None):
    """
    把表格排成对齐的文本（按显示宽度补空格，中文列名、中文单元格也能对齐）。

    【参数】headers：列名；rows：每行一个序列（元素先 str()），每行的元素个数必须和 headers 一样多；
            align：每列 "<"（左对齐）或 ">"（右对齐）；默认第一列左对齐、其余右对齐（数字右对齐才好比大小）
    【返回】多行字符串：表头、虚线分隔行、数据行（行尾空格去掉）
    【报错】headers / rows / 某一行不是列表或元组（字符串会被拆成一个个字）→ TypeError；
            某一行的元素个数不对、align 的长度或取值不对 → ValueError
    """
    rows = _check_table_input(headers, rows)
    cells = [[str(h) for h in headers]] + [[str(v) for v in row] for row in rows]
    k = len(cells[0])
    if k == 0:
        raise ValueError("headers 不能为空")
    bad = [i for i, r in enumerate(cells[1:]) if len(r) != k]
    if bad:
        i = bad[0]
        raise ValueError(f"rows 的每一行都要有 {k} 个元素（和 headers 一样多）；第 {i} 行有 {len(cells[1 + i])} 个")
    if align is None:
        align = ["<"] + [">"] * (k - 1)
    align = list(align)
    if len(align) != k or any(a not in ALIGNS for a in align):
        raise ValueError(f"align 要有 {k} 个元素、每个是 '<' 或 '>'，收到 {align!r}")
    widths = [max(display_width(r[j]) for r in cells) for j in range(k)]

    def line(r):
        parts = []
        for j, v in enumerate(r):
            pad = " " * (widths[j] - display_width(v))
            parts.append(v + pad if align[j] == "<" else pad + v)
        return "  ".join(parts).rstrip()

    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]])


def _is_row(x):
    """表格的一行 / 表头：列表、元组这样的序列（字符串不算：'ab' 会被拆成两列）。"""
    from collections.abc import Sequence
    return isinstance(x, Sequence) and not isinstance(x, (str, bytes))


def _check_table_input(headers, rows):
    if not _is_row(headers):
        raise TypeError(f"format_table：headers 必须是列名的列表或元组，收到 {type(headers).__name__} 类型的 "
                        f"{headers!r}")
    if isinstance(rows, (str, bytes)) or not hasattr(rows, "__iter__"):
        raise TypeError(f"format_table：rows 必须是行的列表，收到 {type(rows).__name__} 类型的 {rows!r}")
    rows = list(rows)
    for i, r in enumerate(rows):
        if not _is_row(r):
            raise TypeError(f"format_table：rows 的第 {i} 行必须是列表或元组，收到 {type(r).__name__} 类型的 {r!r}")
    return rows


# =============================================================================
# 数字
# =============================================================================
def _fmt_number(name, x, where, lo=None):
    """fmt_* 的入口检查：实数（int、float、numpy 数）；NaN → ValueError（表格里的 NaN 是上游的错，不替它遮掩）；
    ±inf 照样显示成 "inf"；lo 给定时（时间不能为负）检查下限。返回 float。"""
    v = check_real(name, x, lo=lo, allow_inf=True, where=where)
    return v


def fmt_si(x, unit="", digits=3):
    """按 10 的 3 次方缩写：fmt_si(1.6e10, "FLOP") → "16 GFLOP"。±inf 写成 "inf FLOP"；NaN、非数字报错。"""
    _fmt_number("x", x, "fmt_si")
    if not isinstance(unit, str):
        raise TypeError(f"fmt_si：unit 必须是字符串（如 'B'、'FLOP'），收到 {type(unit).__name__} 类型的 {unit!r}")
    check_int("digits", digits, lo=1, hi=17, where="fmt_si")
    if x == 0:
        return f"0 {unit}".strip()
    if math.isinf(x):
        return f"{x} {unit}".strip()
    prefixes = ((1e24, "Y"), (1e21, "Z"), (1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
    for scale, p in prefixes:
        if abs(x) >= scale:
            return f"{x / scale:.{digits}g} {p}{unit}"
    return f"{x:.{digits}g} {unit}".strip()


def fmt_count(n):
    """参数个数：8.03e9 → "8.03B"，124e6 → "124M"。"""
    _fmt_number("n", n, "fmt_count")
    if math.isinf(n):
        return str(float(n))
    for scale, p in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{p}"
    return f"{n:.3g}"


def fmt_bytes(n):
    """字节（十进制）：16.06e9 → "16.1 GB"。"""
    _fmt_number("n", n, "fmt_bytes")
    return fmt_si(n, "B")


def fmt_time(s):
    """秒 → 合适的单位：2.5e-3 → "2.5 ms"，3 天 → "3 d"。s 必须 ≥ 0（inf 写成 "inf s"）。"""
    _fmt_number("s", s, "fmt_time", lo=0.0)
    if math.isinf(s):
        return "inf s"
    if s < 1e-3:
        return f"{s * 1e6:.3g} µs"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    if s < 120:
        return f"{s:.3g} s"
    if s < 7200:
        return f"{s / 60:.3g} min"
    if s < 2 * 86400:
        return f"{s / 3600:.3g} h"
    return f"{s / 86400:.3g} d"


# =============================================================================
# 图
# =============================================================================
def figure_path(script, what, quick=False):
    """演示 script（传 __file__）的图 what 的路径：<script 所在文件夹>/figures/<脚本名>_<what>.png。

    quick=True（演示的 --quick 小规模版本）时放在 figures/quick/ 下：make test / check-all 跑的小图
    不会覆盖 make figures 生成的完整图。figures/ 文件夹不存在就建。"""
    if not isinstance(what, str):
        raise TypeError(f"figure_path：what 必须是字符串（图文件名的后半段），"
                        f"收到 {type(what).__name__} 类型的 {what!r}")
    if not what or os.sep in what or "/" in what:
        raise ValueError(f"figure_path：what 不能为空、不能带文件夹（它是图文件名的后半段），收到 {what!r}")
    if not isinstance(script, (str, os.PathLike)):
        raise TypeError(f"figure_path：script 必须是脚本的路径（传 __file__），收到 {type(script).__name__}")
    quick = check_bool("quick", quick, where="figure_path")
    folder = os.path.join(os.path.dirname(os.path.abspath(script)), "figures", *(["quick"] if quick else []))
    os.makedirs(folder, exist_ok=True)
    stem = os.path.splitext(os.path.basename(script))[0]
    return os.path.join(folder, f"{stem}_{what}.png")


# 投影用的图：所有文字至少 MIN_FONT_PT 磅（按存下来的尺寸；bbox_inches="tight" 不缩放文字）。
# 演示脚本用 pyplot() 取 matplotlib.pyplot：Agg 后端 + 这组默认字号；save_figure 再检查一遍，
# 有字小于 MIN_FONT_PT 就报错（而不是存一张投影时看不清的图）。
MIN_FONT_PT = 12
FIG_RC = {"font.size": 13, "axes.titlesize": 14, "axes.labelsize": 13, "xtick.labelsize": 12,
          "ytick.labelsize": 12, "legend.fontsize": 12, "legend.title_fontsize": 12, "figure.titlesize": 14,
          "legend.framealpha": 0.9}


def pyplot():
    """Agg 后端（从不 show()）+ 课程的字号（FIG_RC），返回 matplotlib.pyplot。演示脚本画图前调用一次。"""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update(FIG_RC)
    return plt


def merge_identical(series, atol=0.0):
    """
    [(标签, xs, ys)] → 同样的列表，但 xs 相同、ys 逐点相差 ≤ atol 的几条合成一条（用第一条的 ys）、标签写成 "A = B"
    （保持第一次出现的顺序）。atol = 0：完全相同才合并。xs、ys 是一样长的实数序列（NaN 可以：曲线断开），
    否则 ValueError / TypeError（zip 会悄悄截掉长出来的点）。

    为什么：两条曲线重合时后画的那条把前一条盖住，图例里却列着两条——学生找不到其中一条。
    """
    check_real("atol", atol, lo=0.0, where="merge_identical")
    merged = []                                   # [(标签列表, xs, ys)]
    for i, item in enumerate(series):
        if not _is_row(item) or len(item) != 3:
            raise TypeError(f"merge_identical：series 的第 {i} 项必须是 (标签, xs, ys)，收到 {item!r}")
        label, xs, ys = item
        xs, ys = _plot_values(f"series[{i}] 的 xs", xs), _plot_values(f"series[{i}] 的 ys", ys)
        if len(xs) != len(ys):
            raise ValueError(f"merge_identical：series[{i}] 的 xs 有 {len(xs)} 个点、ys 有 {len(ys)} 个，必须一样多")
        for labels, mx, my in merged:
            if mx == xs and all(abs(a - b) <= atol for a, b in zip(my, ys)):
                labels.append(label)
                break
        else:
            merged.append(([label], xs, ys))
    return [(" = ".join(labels), xs, ys) for labels, xs, ys in merged]


def _plot_values(name, values):
    """曲线的坐标 → float 列表：实数（NaN 可以，matplotlib 把它画成断开的一段）；bool、字符串 → TypeError。"""
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"merge_identical：{name} 只能含实数，收到 {type(v).__name__} 类型的 {v!r}")
        out.append(float(v))
    return out


def small_texts(fig, min_pt=MIN_FONT_PT):
    """图里看得见、非空、字号小于 min_pt 磅的文字：[(文字, 磅数)]。save_figure 用它拒绝投影时看不清的图。"""
    from matplotlib.text import Text
    out = []
    for t in fig.findobj(Text):
        if t.get_visible() and t.get_text().strip() and t.get_fontsize() < min_pt - 1e-9:
            out.append((t.get_text(), t.get_fontsize()))
    return out


def save_figure(fig, script, what, dpi=120, quick=False, path=None):
    """
    把 matplotlib 图存到 figure_path(script, what, quick)：先排版（tight_layout；图自己设了排版引擎就用它的），
    再按 bbox_inches="tight" 存，然后关闭这张图，返回路径。演示脚本用 pyplot()（Agg，从不 show()）；
    传 quick=args.quick，小规模的图就进 figures/quick/，不覆盖完整图。
    path：完整图另存到这个路径（例如和测量 JSON 放在一起的结果图）；quick=True 时不用它，照样进 figures/quick/。
    【报错】图里有小于 MIN_FONT_PT 磅的文字 → ValueError（列出前几个）：投影时看不清。
    """
    tiny = small_texts(fig)
    if tiny:
        import matplotlib.pyplot as plt
        plt.close(fig)
        shown = ", ".join(f"{t[:20]!r} {sz:g} pt" for t, sz in tiny[:5])
        raise ValueError(f"图 {what!r} 有 {len(tiny)} 处文字小于 {MIN_FONT_PT} 磅（投影看不清）：{shown}；"
                         f"用 course_utils.pyplot() 的默认字号，别传更小的 fontsize")
    path = figure_path(script, what, quick) if quick or path is None else path
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    import matplotlib.pyplot as plt   # 只在真的存图时才需要 matplotlib
    plt.close(fig)
    return path


def committed_figure(script, name, replot):
    """
    已提交的结果图：replot=True 时返回 <script 所在文件夹>/results/<name>，否则 None。给 save_figure 的 path 用：
        save_figure(fig, __file__, "fit", quick=args.quick,
                    path=committed_figure(__file__, "step_calibration.png", args.replot))
    规则只写在这里：results/ 下已提交的图只有 --replot（重测之后）才重画；平时的图进 figures/（--quick 时
    figures/quick/，save_figure 管），跑一遍演示不会改动已提交的文件。
    name 是 results/ 里的文件名（带 .png，不带文件夹）；replot=False 时也检查，写错了平时就报出来。
    环境变量 REPLOT_DIR（check-all 和 make test 设成临时文件夹）：重画的图写到 REPLOT_DIR/<讲次路径>/<name>，
    照样走一遍重画，但不改动已提交的文件（别的 matplotlib 版本、字体画出的字节不同，git 会显示改动）。
    """
    replot = check_bool("replot", replot, where="committed_figure")
    if not isinstance(name, str) or not name.endswith(".png") or len(name) <= len(".png") \
            or os.path.basename(name) != name:
        raise ValueError(f"committed_figure：name 必须是 results/ 里的文件名，以 .png 结尾、不带文件夹，收到 {name!r}")
    if not replot:
        return None
    here = os.path.dirname(os.path.abspath(script))
    redirect = os.environ.get("REPLOT_DIR")
    if redirect:
        rel = os.path.relpath(here, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        os.makedirs(os.path.join(redirect, rel), exist_ok=True)
        return os.path.join(redirect, rel, name)
    return os.path.join(here, "results", name)



def ratio_errors(ratios):
    """
    模型 / 实测的比值（一串正数）→ (中位 |比值 − 1|, 最差一点的下标)。"最差"按 |log 比值| 比：
    慢一半（0.5）和快一倍（2.0）一样差。各讲的校准表（lecture05 的 StepModel、lecture11 的解码和时间线）都用它。
    """
    ratios = [check_real("ratios 的元素", r, lo=0.0, lo_open=True) for r in ratios]
    if not ratios:
        raise ValueError("ratios 不能是空的")
    median = statistics.median(abs(r - 1) for r in ratios)
    worst = max(range(len(ratios)), key=lambda i: abs(math.log(ratios[i])))
    return median, worst


def sha256_file(path):
    """文件的 SHA-256（十六进制），按 1 MiB 一块读：检查点入库时记下，装载前核对。"""
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_json_dict(path):
    """
    读一个 JSON 字典；不存在、损坏或不是字典时返回 {}（manifest、缓存坏了就当没有，调用者会重建）。
    就是宽容版的 load_json：读不了（OSError）、不是合法 JSON / UTF-8（ValueError）都当作空字典。
    """
    try:
        out = load_json(path)
    except (OSError, ValueError):
        return {}
    return out if isinstance(out, dict) else {}


def update_json(path, change, strict=False):
    """
    几个进程可能同时读-改-写同一个 JSON 字典（检查点的 manifest、结果缓存、已提交的结果）：在文件锁里重读、
    change(d) 原地修改、写临时文件再改名（别的进程永远读不到写了一半的文件）。锁文件放在系统临时目录，不进仓库；
    没有 fcntl 的系统（Windows）不加锁，同时只跑一个训练进程即可。返回改过的字典。
    strict=False（manifest、缓存）：用 read_json_dict 读，坏了就当空字典、重建。
    strict=True（已提交的结果）：用 load_json 读，文件不存在时从空字典开始；坏了（不是合法 JSON / UTF-8、
        不是字典）→ ValueError，文件原样不动——不能把坏掉的结果悄悄换成只有这次改动的新文件。
    """
    import hashlib
    import json
    import tempfile
    path = os.path.abspath(path)
    tag = hashlib.sha1(path.encode()).hexdigest()[:12]
    with open(os.path.join(tempfile.gettempdir(), f"cs349e_{tag}.lock"), "w") as lock:
        try:
            import fcntl
            fcntl.flock(lock, fcntl.LOCK_EX)
        except ImportError:
            pass
        d = _read_strict(path) if strict else read_json_dict(path)
        change(d)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(d, f, indent=1, ensure_ascii=False, sort_keys=True)
        os.replace(tmp, path)
    return d


def _read_strict(path):
    """update_json(strict=True) 的读：load_json，不存在 → {}；坏文件、不是字典 → ValueError（消息里有路径）。"""
    try:
        out = load_json(path)
    except ValueError as e:
        raise ValueError(f"{path} 不是合法的 JSON（{e}）：不覆盖它；修好或从 git 恢复后再写") from e
    if out is None:
        return {}
    if not isinstance(out, dict):
        raise ValueError(f"{path} 里是 {type(out).__name__}，不是 JSON 字典：不覆盖它")
    return out


def load_json(path):
    """
    读一个已提交的结果 JSON（UTF-8）；文件不存在时返回 None（演示据此打印 SKIP）。
    坏文件照样报错（json 的 ValueError）：已提交的结果坏了要大声说。要"坏了就当没有"用 read_json_dict。
    """
    import json
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


# =============================================================================
# 参数检查（各实验模块共用：坏输入要大声报错，消息写出参数名、允许的范围、收到的值）
# =============================================================================
def _who(name, where):
    return f"{where}：{name}" if where else str(name)


def _range_text(lo, hi, lo_open=False, hi_open=False):
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '≥'} {lo}")
    if hi is not None:
        parts.append(f"{'<' if hi_open else '≤'} {hi}")
    return " 且 ".join(parts)


def check_int(name, value, lo=None, hi=None, where="", whole_float=False, type_error=TypeError):
    """
    检查一个整数参数（个数、长度、设备数……）：lo ≤ value ≤ hi（None 表示那一边不限），返回转换后的值。

    【允许】Python int、numpy 整数（返回 int(value)）；whole_float=True 时还允许整数值的有限浮点数
            （训练 token 数常写成 15.6e12；这时原样返回那个浮点数，不改调用者的算术）。
    【报错】全课程一个约定（和 Python 自己的 range(2.5) 一样）：**不是整数**——bool、字符串、None、
            （whole_float=False 时的）浮点数、（whole_float=True 时的）2.5 这样的小数——→ type_error（默认 TypeError；
            个别老接口对一切坏值都报 ValueError，就传 type_error=ValueError）；
            是整数但越界、NaN、无穷 → ValueError。
            消息：「[where：]name 必须是整数，且 <范围>，收到 <值>」。
    """
    integral = type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool))
    ok = integral or (whole_float and isinstance(value, numbers.Real) and not isinstance(value, bool))
    if not ok:
        raise type_error(_int_message(name, value, lo, hi, where, whole_float, with_type=True))
    if not integral and not math.isfinite(value):
        raise ValueError(_int_message(name, value, lo, hi, where, whole_float))
    if not integral and not float(value).is_integer():      # 2.5 个序列：不是整数 → 和 2.5（float 类型）同一种错
        raise type_error(_int_message(name, value, lo, hi, where, whole_float))
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(_int_message(name, value, lo, hi, where, whole_float))
    return int(value) if integral else value


def _int_message(name, value, lo, hi, where, whole_float, with_type=False):
    """check_int 的报错消息（只在出错时才拼：热路径上的检查不付字符串的钱）。"""
    rng = _range_text(lo, hi)
    allowed = "整数" + ("（也可以是 1e12 这样整数值的浮点数）" if whole_float else "") + (f"，且 {rng}" if rng else "")
    got = f"{type(value).__name__} 类型的 {value!r}" if with_type else repr(value)
    return f"{_who(name, where)} 必须是{allowed}，收到 {got}"


def check_real(name, value, lo=None, hi=None, lo_open=False, hi_open=False, where="",
               allow_inf=False, type_error=TypeError):
    """
    检查一个实数参数（字节宽度、比例、时间……）：有限，且落在 lo..hi 里（lo_open / hi_open 表示不含端点；
    None 表示那一边不限），返回 float(value)。

    【允许】int、float、numpy 整数 / 浮点数；allow_inf=True 时也允许 ±inf（只要它在范围里，
            例如 "没有上限的 SLO" 用 inf 表示）。
    【报错】bool、字符串、None 等非数字 → type_error（默认 TypeError）；NaN、（不允许时的）无穷、越界 → ValueError。
            消息：「[where：]name 必须是有限实数，且 <范围>，收到 <值>」。
    """
    # type(...) is float / int 先判：最常见的情形不走抽象基类的 isinstance（热路径上省几微秒）
    if type(value) is not float and type(value) is not int and (
            isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise type_error(_real_message(name, value, lo, hi, lo_open, hi_open, where, allow_inf, with_type=True))
    v = float(value)
    ok = not math.isnan(v) and (allow_inf or math.isfinite(v))
    ok = ok and (lo is None or (v > lo if lo_open else v >= lo))
    ok = ok and (hi is None or (v < hi if hi_open else v <= hi))
    if not ok:
        raise ValueError(_real_message(name, value, lo, hi, lo_open, hi_open, where, allow_inf))
    return v


def _real_message(name, value, lo, hi, lo_open, hi_open, where, allow_inf, with_type=False):
    """check_real 的报错消息（只在出错时才拼）。"""
    rng = _range_text(lo, hi, lo_open, hi_open)
    allowed = ("实数（可以是 ±inf）" if allow_inf else "有限实数") + (f"，且 {rng}" if rng else "")
    got = f"{type(value).__name__} 类型的 {value!r}" if with_type else repr(value)
    return f"{_who(name, where)} 必须是{allowed}，收到 {got}"


def check_bool(name, value, where=""):
    """
    检查一个开关参数：只收 True / False（也收 numpy 的 bool_），返回 Python bool。

    为什么要查：Python 里 "False"、"no"、1.0 都是真值，`if causal:` 会把字符串 'False' 当成 True，
    算出一个错的结果而不报错。
    【报错】其他一切（字符串、整数、None……）→ TypeError：「[where：]name 必须是 True 或 False，收到 …」。
    """
    t = type(value)
    # numpy 的 bool_（比较的结果）也算开关；numpy 2 里它的类型名是 "bool"，numpy 1 里是 "bool_"
    if t is bool or (t.__module__ == "numpy" and t.__name__ in ("bool", "bool_")):
        return bool(value)
    raise TypeError(f"{_who(name, where)} 必须是 True 或 False，收到 {type(value).__name__} 类型的 {value!r}")


def check_choice(name, value, allowed, where=""):
    """
    检查一个"从几个名字里选一个"的参数（如 kind='ring'），返回 value。

    【报错】不在 allowed 里 → ValueError，消息列出全部允许的取值：「[where：]name 只能是 'a' / 'b'，收到 …」。
    """
    allowed = tuple(allowed)
    # True == 1 在 Python 里成立：bool 只和 bool 相配（免得 mode=True 被当成 1）
    try:
        ok = any(bool(a == value) and isinstance(a, bool) == isinstance(value, bool) for a in allowed)
    except (TypeError, ValueError):     # 比不了的东西（如 numpy 数组，== 得到数组）当作不在其中
        ok = False
    if not ok:
        raise ValueError(f"{_who(name, where)} 只能是 {' / '.join(repr(a) for a in allowed)}，收到 {value!r}")
    return value


def check_array(name, value, ndim=None, allow_neginf=False, where=""):
    """
    把一个实数数组参数转成 float64 numpy 数组并检查（attention 的分数、概率表、缓冲区……）。

    【允许】任何能 np.asarray 成布尔 / 整数 / 浮点的东西；ndim 给定时维数必须相等。
    【报错】复数、字符串、object → TypeError；维数不对、含 NaN 或 +∞ → ValueError
            （allow_neginf=True 时允许 −∞：被掩掉的分数就是 −∞）。
    """
    import numpy as np        # 模块级只依赖标准库；用到数组时才导入 numpy
    a = np.asarray(value)
    who = _who(name, where)
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{who} 必须是实数数组，收到 dtype={a.dtype}")
    a = a.astype(np.float64, copy=False)
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{who} 必须是 {ndim} 维数组，收到形状 {a.shape}")
    bad = (np.isnan(a) | (a == np.inf)) if allow_neginf else ~np.isfinite(a)
    if bad.any():
        raise ValueError(f"{who} 只能含{'有限值或 −∞' if allow_neginf else '有限值'}，发现了 NaN 或 ∞")
    return a


def machine_memory_bytes():
    """这台机器的物理内存（字节）；读不到（非 POSIX）时返回 None，check_memory 就不设上限。"""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def check_rng(name, rng, where=""):
    """随机性的约定：调用者传 np.random.Generator（种子在调用者那里：np.random.default_rng(seed)）；
    别的 → TypeError。"""
    import numpy as np
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"{_who(name, where)} 必须是 np.random.Generator（例如 np.random.default_rng(0)），"
                        f"收到 {type(rng).__name__} {rng!r}")
    return rng


def check_count(name, value, bytes_each, where="", lo=1):
    """个数参数：check_int（≥ lo），再用 check_memory 按每个 bytes_each 字节算要多少内存——放不下就在分配之前
    ValueError（消息写出要多少、有多少），而不是先分配几十 GB 再崩。"""
    value = check_int(name, value, lo=lo, where=where)
    check_memory(name, value * bytes_each, where=where)
    return value


def check_memory(name, nbytes, where="", limit=None):
    """
    分配之前先算大小：要 nbytes 字节、超过 limit（默认这台机器的物理内存 machine_memory_bytes()）→ ValueError，
    消息写出引出这个大小的参数 name 和要多少字节。为什么：np.zeros 一个放不下的形状要么 MemoryError、要么让
    系统换页到卡死（OOM killer 杀掉整个进程）——都不告诉学生是哪个参数太大。返回 nbytes。
    """
    limit = machine_memory_bytes() if limit is None else limit
    if limit is not None and nbytes > limit:
        raise ValueError(f"{_who(name, where)} 太大：需要 {fmt_bytes(nbytes)}（{int(nbytes):,} 字节）内存，"
                         f"超过本机内存 {fmt_bytes(limit)}")
    return nbytes


def check_seed(name, seed, where=""):
    """
    随机种子的全课程约定：整数 ≥ 0，或一个 numpy 的 np.random.Generator；返回 np.random.Generator
    （整数 → np.random.default_rng(seed)，Generator → 原样，接着用它的状态）。
    【报错】bool、浮点数、字符串、None（不可复现）、random.Random / np.random.RandomState（另一套接口）→ TypeError；
            负数 → ValueError。消息：「[where：]name 必须是 ≥ 0 的整数或 np.random.Generator，收到 …」。
    """
    import numpy as np
    if isinstance(seed, np.random.Generator):
        return seed
    allowed = "≥ 0 的整数或 np.random.Generator（如 np.random.default_rng(0)）"
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        hint = ""
        if type(seed).__name__ in ("Random", "RandomState"):
            hint = "；random.Random / RandomState 是另一套接口，改传整数种子或 np.random.default_rng(种子)"
        raise TypeError(f"{_who(name, where)} 必须是{allowed}，收到 {type(seed).__name__} 类型的 {seed!r}{hint}")
    if seed < 0:
        raise ValueError(f"{_who(name, where)} 必须是{allowed}，收到 {seed!r}")
    return np.random.default_rng(int(seed))


TORCH_SEED_MAX = 2 ** 64 - 1     # torch.manual_seed 收得下的最大种子（numpy 的种子不设上限）


def check_torch_seed(name, seed, where=""):
    """给 torch.manual_seed 的种子：0 … TORCH_SEED_MAX 的整数；返回 int。
    【报错】bool、浮点、字符串 → TypeError；负数或超出 → ValueError（消息里有 name）。"""
    return check_int(name, seed, lo=0, hi=TORCH_SEED_MAX, where=where)


def check_dtype(name, dtype, kinds="f", where=""):
    """
    检查一个 dtype 参数（转换之前）：能被 np.dtype 认出、种类（dtype.kind）在 kinds 里（"f" 浮点、"i" 有符号整数、
    "u" 无符号整数、"b" 布尔、"c" 复数），返回 np.dtype。None 不收（np.dtype(None) 会悄悄变成 float64）。
    【报错】认不出的名字、None、种类不对 → TypeError：「[where：]name 必须是 … 类型，收到 …」。
    """
    import numpy as np
    names = {"f": "浮点", "i": "有符号整数", "u": "无符号整数", "b": "布尔", "c": "复数"}
    allowed = " / ".join(names.get(k, k) for k in kinds)
    try:
        dt = None if dtype is None else np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt.kind not in kinds:
        raise TypeError(f"{_who(name, where)} 必须是{allowed}类型（如 np.float64），收到 {dtype!r}")
    return dt


# =============================================================================
# 自检
# =============================================================================
def expect_errors(cases):
    """自检用（各模块的 _selftest 共用）：cases = [(调用, 异常类型, 消息里必须有的文字)]，
    每个调用都必须抛这个异常、消息里有这段文字。"""
    for call, exc, text in cases:
        try:
            call()
        except exc as e:
            assert text in str(e), (text, e)
        else:
            raise AssertionError(f"应当报错：{text}")


def _selftest():
    import json
    import tempfile

    # 0) 读已提交的结果：文件不在时是 None（演示据此打印 SKIP），在时原样读回
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "r.json")
        assert load_json(path) is None
        with open(path, "w") as fh:
            json.dump({"a": [1, 2.5]}, fh)
        assert load_json(path) == {"a": [1, 2.5]}
        # 加锁的读-改-写：在已有内容上改；文件损坏时 strict=True 报错、不动文件，默认从空字典开始；SHA-256 跟着内容变
        digest = sha256_file(path)
        assert update_json(path, lambda d: d.update(b=3)) == {"a": [1, 2.5], "b": 3} == load_json(path)
        assert sha256_file(path) != digest and len(digest) == 64
        with open(path, "w") as fh:
            fh.write("{not json")
        expect_errors([(lambda: update_json(path, lambda d: d.update(c=1), strict=True), ValueError, "不覆盖")])
        assert open(path).read() == "{not json"                         # strict：坏文件原样不动
        assert read_json_dict(path) == {} and update_json(path, lambda d: d.update(c=1)) == {"c": 1}

    # 0b) 校准摘要：中位数（偶数个取中间两个的平均）、最差按 |log|（0.5 比 1.8 差）
    med, worst = ratio_errors([1.1, 0.5, 1.8, 1.0])
    assert math.isclose(med, (0.1 + 0.5) / 2) and worst == 1, (med, worst)
    assert ratio_errors([1.25]) == (0.25, 0)
    expect_errors([(lambda: ratio_errors([]), ValueError, "ratios"),
                    (lambda: ratio_errors([1.0, 0.0]), ValueError, "ratios")])

    # 1) 中文对齐：每一行的显示宽度相同；分隔线在第 2 行；默认第一列左对齐、其余右对齐
    text = format_table(["模型", "参数", "备注"], [["中文名字", 1, "短"], ["ab", 12345, "长一点的说明"]])
    lines = text.splitlines()
    assert len(lines) == 4 and set(lines[1]) <= {"-", " "}, text
    small = format_table(["模型", "x"], [["中文", "宽"], ["ab", "cd"]]).splitlines()
    assert len({display_width(ln) for ln in small}) == 1, small
    assert lines[2].startswith("中文名字") and lines[3].startswith("ab      ")
    assert display_width("中文ab") == 6 and display_width("ＡＢ") == 4 and display_width("µs") == 2
    left = format_table(["a", "b"], [["x", "1"], ["yy", "22"]], align="<<").splitlines()
    assert left[2] == "x   1" and left[3] == "yy  22", left

    # 2) 数字：对照手算的期望值
    assert fmt_si(1.6e10, "FLOP") == "16 GFLOP" and fmt_si(0, "B") == "0 B" and fmt_si(512) == "512"
    assert fmt_si(-2.5e6, "B") == "-2.5 MB" and fmt_si(1.23456e15, "FLOP/s", digits=2) == "1.2 PFLOP/s"
    assert fmt_count(8.03e9) == "8.03B" and fmt_count(124e6) == "124M" and fmt_count(999) == "999"
    assert fmt_bytes(16.06e9) == "16.1 GB"
    assert fmt_time(2.5e-3) == "2.5 ms" and fmt_time(5e-6) == "5 µs" and fmt_time(30) == "30 s"
    assert fmt_time(600) == "10 min" and fmt_time(3 * 3600) == "3 h" and fmt_time(3 * 86400) == "3 d"

    # 3) figure_path：在临时文件夹里建 figures/，文件名 = 脚本名_what.png
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "sub", "07_demo.py")
        p = figure_path(script, "curve")
        assert p == os.path.join(tmp, "sub", "figures", "07_demo_curve.png"), p
        assert os.path.isdir(os.path.dirname(p)) and not os.path.exists(p)
        saved = os.environ.pop("REPLOT_DIR", None)          # check-all 设了它：两种情况都查，查完放回
        try:
            assert committed_figure(script, "demo.png", True) == os.path.join(tmp, "sub", "results", "demo.png")
            assert committed_figure(script, "demo.png", False) is None
            os.environ["REPLOT_DIR"] = os.path.join(tmp, "redirect")
            lesson = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench", "x.py")
            assert committed_figure(lesson, "demo.png", True) == os.path.join(tmp, "redirect", "lecture01", "bench",
                                                                              "demo.png")
            assert committed_figure(lesson, "demo.png", False) is None
        finally:
            os.environ.pop("REPLOT_DIR", None)
            if saved is not None:
                os.environ["REPLOT_DIR"] = saved

    # 4) 坏输入报错，消息里写出参数名
    expect_errors([(lambda: format_table(["a", "b"], [[1]]), ValueError, "rows"),
                    (lambda: format_table(["a", "b"], [[1, 2]], align="<"), ValueError, "align"),
                    (lambda: format_table(["a", "b"], [[1, 2]], align="<^"), ValueError, "align"),
                    (lambda: format_table([], []), ValueError, "headers"),
                    (lambda: figure_path("x.py", ""), ValueError, "what"),
                    (lambda: committed_figure("x.py", "results/a.png", False), ValueError, "name")])
    # 5) check_int / check_real：好值原样（转换后）返回；坏类型 TypeError、坏值 ValueError，消息写出名字、范围、值
    assert check_int("n", 3, lo=1) == 3 and type(check_int("n", 7)) is int
    assert check_int("D", 15.6e12, lo=0, whole_float=True) == 15.6e12
    assert check_real("x", 2, lo=0, lo_open=True) == 2.0 and check_real("t", math.inf, lo=0, allow_inf=True) == math.inf
    assert check_real("p", 1.0, lo=0.0, hi=1.0) == 1.0
    expect_errors([(lambda: check_int("batch", True), TypeError, "batch"),
                    (lambda: check_int("batch", 2.0), TypeError, "batch"),
                    (lambda: check_int("batch", 2.5, whole_float=True), TypeError, "batch"),
                    (lambda: check_int("batch", math.nan, whole_float=True), ValueError, "batch"),
                    (lambda: check_int("batch", 0, lo=1, where="f"), ValueError,
                     "f：batch 必须是整数，且 ≥ 1，收到 0"),
                    (lambda: check_int("n", 2.5, type_error=ValueError), ValueError, "n"),
                    (lambda: check_real("eps", float("nan"), lo=0), ValueError, "eps"),
                    (lambda: check_real("eps", math.inf), ValueError, "eps"),
                    (lambda: check_real("eps", 0.0, lo=0, lo_open=True), ValueError, "> 0"),
                    (lambda: check_real("mfu", 1.5, lo=0, hi=1), ValueError, "≤ 1"),
                    (lambda: check_real("mfu", 1.0, hi=1, hi_open=True), ValueError, "< 1"),
                    (lambda: check_real("mfu", "a"), TypeError, "mfu")])
    # 6) check_bool / check_choice / check_array
    assert check_bool("causal", True) is True and check_bool("causal", False) is False
    try:                                                       # numpy 的 bool_（比较的结果）也是开关
        import numpy as np
        assert check_bool("causal", np.True_) is True and check_bool("causal", np.bool_(False)) is False
    except ImportError:
        pass
    assert check_choice("kind", "ring", ("ring", "tree")) == "ring"
    a = check_array("s", [[1, -math.inf]], ndim=2, allow_neginf=True)
    assert a.dtype.name == "float64" and a.shape == (1, 2)
    expect_errors([(lambda: check_bool("causal", "False"), TypeError, "causal"),
                    (lambda: check_bool("causal", 1), TypeError, "True 或 False"),
                    (lambda: check_bool("tied", None, where="ModelConfig"), TypeError, "ModelConfig：tied"),
                    (lambda: check_choice("kind", "rign", ("ring", "tree")), ValueError, "'ring' / 'tree'"),
                    (lambda: check_choice("kind", ["ring"], ("ring",)), ValueError, "kind"),
                    (lambda: check_choice("mode", True, (1, 2)), ValueError, "mode"),
                    (lambda: check_array("s", ["a"]), TypeError, "s"),
                    (lambda: check_array("s", [1.0], ndim=2), ValueError, "2 维"),
                    (lambda: check_array("s", [math.nan]), ValueError, "NaN"),
                    (lambda: check_array("s", [-math.inf]), ValueError, "有限值"),
                    (lambda: check_array("s", [math.inf], allow_neginf=True), ValueError, "−∞")])
    got = merge_identical([("a", [1, 2], [3, 4]), ("b", [1, 2], [5, 6]), ("c", [1, 2], [3, 4])])
    assert [g[0] for g in got] == ["a = c", "b"], got
    near = [("a", [1, 2], [3, 4]), ("b", [1, 2], [3.4, 4]), ("c", [1, 3], [3, 4])]      # c 的 x 不同：不合并
    assert [g[0] for g in merge_identical(near)] == ["a", "b", "c"]
    assert [(g[0], g[2]) for g in merge_identical(near, atol=0.5)] == [("a = b", [3.0, 4.0]), ("c", [3.0, 4.0])]
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "07_demo.py")
        assert figure_path(script, "c", quick=True) == os.path.join(tmp, "figures", "quick", "07_demo_c.png")
    print("course_utils 自检通过：中文表格对齐、fmt_* 与手算一致、figure_path 建文件夹、坏输入报错、"
          "check_int / check_real 的边界")



def check_device(name, device, where="", kinds=("cpu", "cuda"), type_error=TypeError, error=ValueError, hint=""):
    """
    检查一个设备参数：'cpu'、'cuda'、'cuda:N'、整数 N（= cuda:N）或 torch.device，返回 torch.device。
    【报错】不是这几种类型（bool、浮点数、None、list……）→ type_error（默认 TypeError；对一切坏值都报 ValueError
            的老接口传 type_error=ValueError，同 check_int）；认不出的名字、种类不在 kinds 里、这台机器上没有的
            CUDA GPU → error（默认 ValueError；"张量不在要求的设备上"这类运行环境的问题传 RuntimeError）。
            hint 接在消息末尾（如"本内核要 Hopper GPU"）。torch 在第一次调用时才导入（学生的工具箱不依赖 torch）。
    """
    import torch
    allowed = " / ".join(f"'{k}'" for k in kinds)
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise type_error(f"{_who(name, where)} 必须是 {allowed}（可带 ':N'）、整数或 torch.device，"
                         f"收到 {type(device).__name__} 类型的 {device!r}{hint}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise error(f"{_who(name, where)} 认不出来：必须是 {allowed}（可带 ':N'），收到 {device!r}{hint}") from None
    if dev.type not in kinds:
        raise error(f"{_who(name, where)} 只能是 {allowed} 设备，收到 {device!r}{hint}")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (dev.index or 0) >= count:
            raise error(f"{_who(name, where)} = {device!r}，但这台机器上只有 {count} 块 CUDA GPU{hint}")
    return dev


if __name__ == "__main__":
    _selftest()
