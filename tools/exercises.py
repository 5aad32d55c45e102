#!/usr/bin/env python3
"""练习的"一份源码"：实验模块里用成对的注释标出练习区域，这里检查它们、把它们变成学生版的树。

标记（整行注释，缩进随意，begin 行的缩进就是学生版里 raise 的缩进）：
    # >>> 练习 11.2 hole          区域变成 raise NotImplementedError("练习 11.2 未完成：…")（默认角色）
    # >>> 练习 11.2 given         区域原样保留（给学生的脚手架），只去掉标记行
    # >>> 练习 11.2 instructor    区域整段删掉（只给老师）
    # <<< 练习 11.2               结束当前区域（编号必须与 begin 一致；区域不能嵌套）
练习编号形如 11.2、P5.1（讲次号.序号）。预测练习没有标记，只有 <讲次>/predictions.yaml。

check 查的东西：标记成对；每个标记的编号在本讲 EXERCISES.md 里有 `## 练习 <编号>：标题`，反之亦然；
EXERCISES.md 的格式（分值、依赖、位置、评分、预计用时、正好 3 条提示）；每个练习至少登记了一个检查；
非预测练习至少两个错误答案；学生树里找不到任何解答行（hole / instructor 区域里 ≥ 20 字符、不是纯注释的行）。

用法：
    python3 tools/exercises.py check                          只检查（有错时退出码 2）
    python3 tools/exercises.py student [--out dist/student]   先 check，没错才写学生树（不入库）
    python3 tools/exercises.py list                           列出全部区域和练习
"""
import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
EX_ID = r"(?:P?\d+)\.\d+"
BEGIN_RE = re.compile(rf"^(?P<indent>[ \t]*)# >>> 练习 (?P<id>{EX_ID})(?:[ \t]+(?P<role>\w+))?[ \t]*$")
END_RE = re.compile(rf"^[ \t]*# <<< 练习 (?P<id>{EX_ID})[ \t]*$")
ANY_MARK_RE = re.compile(r"^\s*#\s*(>>>|<<<)\s*练习")
# 只在讲次文件夹的 .py / .yaml 里找标记（文档里举例的标记不算）
MARKED_FILE_RE = re.compile(r"^(prereq|lecture)\d+/.*\.(py|yaml)$")
FOLDER_RE = re.compile(r"^(prereq|lecture)(\d+)$")
ROLES = ("hole", "given", "instructor")
# 学生树里不要的东西：老师的错误答案语料、生成物、本地环境
EXCLUDE_FILES = re.compile(r"^tests/exercises/(wrong_[^/]*\.py|test_wrong_corpus\.py)$")
HEADING_RE = re.compile(rf"^## 练习 (?P<id>{EX_ID})[：:]\s*(?P<title>.+?)\s*$")
FIELD_RE = re.compile(r"^- (?P<key>[^：:]+)[：:]\s*(?P<value>.*?)\s*$")
FIELDS = ("分值", "依赖", "位置", "评分", "预计用时")
HINT_RE = re.compile(r"^(?P<n>\d+)\.\s+(?P<text>.*)$")
ANSWER_RE = re.compile(r"^(?P<indent>\s*(?:-\s+)?)answer:.*$")
# 解答行泄漏检查：只看这么长、不是纯注释的行（短行如 `return out` 到处都有）
LEAK_MIN_CHARS = 20
LEAK_SCAN_EXT = (".py", ".md", ".yaml", ".yml", ".txt", ".toml", ".cfg", ".sh", ".ipynb")


class MarkerError(ValueError):
    """标记不成对、角色未知或编号不一致。"""


class ExerciseError(ValueError):
    """check 发现的问题（一条或多条）。"""


# =============================================================================
# 标记与学生版
# =============================================================================
def parse_regions(text, where="<text>"):
    """返回 [(编号, 角色, 缩进, begin 行号, end 行号)]（行号从 0 起）；标记有错时抛 MarkerError。"""
    regions, open_ = [], None
    for i, line in enumerate(text.splitlines()):
        b, e = BEGIN_RE.match(line), END_RE.match(line)
        if b:
            role = b.group("role") or "hole"
            if role not in ROLES:
                raise MarkerError(f"{where}:{i + 1}：未知角色 {role!r}，可选 {ROLES}")
            if open_ is not None:
                raise MarkerError(f"{where}:{i + 1}：练习 {open_[0]} 的区域还没结束，又开始了练习 {b.group('id')}")
            open_ = (b.group("id"), role, b.group("indent"), i)
        elif e:
            if open_ is None:
                raise MarkerError(f"{where}:{i + 1}：练习 {e.group('id')} 的结束标记前面没有开始标记")
            if e.group("id") != open_[0]:
                raise MarkerError(f"{where}:{i + 1}：结束标记写的是练习 {e.group('id')}，打开的是练习 {open_[0]}")
            regions.append((*open_, i))
            open_ = None
        elif ANY_MARK_RE.search(line):
            raise MarkerError(f"{where}:{i + 1}：看不懂的练习标记：{line.strip()!r}")
    if open_ is not None:
        raise MarkerError(f"{where}:{open_[3] + 1}：练习 {open_[0]} 的区域没有结束标记")
    return regions


def hole_message(ex_id, title=None):
    what = f"{title}" if title else "见本讲的 EXERCISES.md"
    return f"练习 {ex_id} 未完成：{what}"


def student_text(text, where="<text>", titles=None):
    """把一份源码变成学生版：hole 换成 raise，given 去掉标记行，instructor 整段删掉。"""
    regions = parse_regions(text, where)
    if not regions:
        return text
    lines = text.splitlines(keepends=True)
    out, pos = [], 0
    for ex_id, role, indent, b, e in regions:
        out.extend(lines[pos:b])
        if role == "hole":
            msg = hole_message(ex_id, (titles or {}).get(ex_id))
            out.append(f"{indent}raise NotImplementedError({msg!r})\n")
        elif role == "given":
            out.extend(lines[b + 1:e])
        pos = e + 1
    out.extend(lines[pos:])
    return "".join(out)


REASON_RE = re.compile(r"^(?P<indent>\s*)reason:")


def seal(text):
    """学生树里的 reason 封起来（base64）：里面写着实测值，填预测之前不该一眼看到；评分时才解开打印。"""
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def student_predictions(text):
    """predictions.yaml 的学生版：每个 answer 换成 null（整行换掉：行尾注释里常写着答案怎么算出来），
    每个 reason（可以跨行）换成一行 reason_sealed。"""
    import yaml
    reasons = [str(it["reason"]) for it in (yaml.safe_load(text) or {}).get("items", []) if "reason" in it]
    out, k, skip_deeper = [], 0, None
    for ln in text.splitlines(keepends=True):
        if skip_deeper is not None:
            if ln.strip() and len(ln) - len(ln.lstrip()) > skip_deeper:
                continue                               # reason 的续行
            skip_deeper = None
        m = REASON_RE.match(ln)
        if m and k < len(reasons):
            out.append(f"{m.group('indent')}reason_sealed: \"{seal(reasons[k])}\"      # 评分时解开（make grade）\n")
            k, skip_deeper = k + 1, len(m.group("indent"))
            continue
        out.append(ANSWER_RE.sub(lambda m: f"{m.group('indent')}answer: null      # 你的预测（单位见 unit）", ln))
    return "".join(out)


def solution_lines(text, regions):
    """hole / instructor 区域里会被泄漏检查盯住的行：[(行号从 1 起, 去掉首尾空白的行)]。"""
    lines = text.splitlines()
    out = []
    for _, role, _, b, e in regions:
        if role == "given":
            continue
        for i in range(b + 1, e):
            s = lines[i].strip()
            if len(s) >= LEAK_MIN_CHARS and not s.startswith("#"):
                out.append((i + 1, s))
    return out


# =============================================================================
# 树：文件、EXERCISES.md、predictions.yaml
# =============================================================================
def tracked_files(root=ROOT):
    """git 跟踪的文件加上未跟踪但未被忽略的文件（与 CI 的全新克隆一致）。"""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout.decode()
    return sorted({p for p in out.split("\0") if p and os.path.isfile(os.path.join(root, p))})


def course_folders(root=ROOT):
    return sorted(n for n in os.listdir(root) if FOLDER_RE.match(n) and os.path.isdir(os.path.join(root, n)))


def id_prefix(folder):
    """讲次文件夹 → 练习编号的前缀（lecture01 → "1"，prereq5 → "P5"）。"""
    m = FOLDER_RE.match(folder)
    return ("P" if m.group(1) == "prereq" else "") + str(int(m.group(2)))


def parse_exercises_md(text, where="EXERCISES.md"):
    """解析一讲的 EXERCISES.md。返回 ({编号: 信息}, [错误])；信息含 title, points, deps, location, grading,
    time, hints（提示列表）, line（标题的行号）。"""
    info, errors, cur, section = {}, [], None, None
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        h = HEADING_RE.match(line)
        if h:
            ex = h.group("id")
            if ex in info:
                errors.append(f"{where}:{i}：练习 {ex} 的标题出现了两次")
            cur = info[ex] = {"title": h.group("title"), "line": i, "fields": {}, "hints": []}
            section = "fields"
            continue
        if line.startswith("## ") and "练习" in line:
            errors.append(f"{where}:{i}：看不懂的练习标题 {line!r}（要写成 `## 练习 11.2：标题`）")
        if line.startswith("## "):
            cur, section = None, None
            continue
        if cur is None:
            continue
        if line.startswith("### "):
            section = "hints" if line[4:].strip() == "提示" else None
            continue
        if section == "fields":
            f = FIELD_RE.match(line)
            if f:
                cur["fields"].setdefault(f.group("key").strip(), f.group("value"))
        elif section == "hints":
            hm = HINT_RE.match(line.strip())
            if hm:
                cur["hints"].append(hm.group("text").strip())
            elif line.strip() and cur["hints"]:
                cur["hints"][-1] += " " + line.strip()        # 一条提示写成几行
    for ex, d in info.items():
        at = f"{where}:{d['line']}：练习 {ex}"
        for key in FIELDS:
            if key not in d["fields"]:
                errors.append(f"{at} 缺少 `- {key}：…`")
        pts = d["fields"].get("分值", "")
        d["points"] = int(pts) if re.fullmatch(r"\d+", pts) else None
        if "分值" in d["fields"] and (d["points"] is None or d["points"] <= 0):
            errors.append(f"{at} 的分值要写正整数，写的是 {pts!r}")
        dep = re.sub(r"[（(].*$", "", d["fields"].get("依赖", "")).strip()
        d["deps"] = [] if dep in ("无", "") else [x for x in re.split(r"[,，、\s]+", dep) if x]
        d["dep_text"] = dep
        d["location"] = d["fields"].get("位置", "")
        d["grading"] = d["fields"].get("评分", "")
        d["time"] = d["fields"].get("预计用时", "")
        if len(d["hints"]) != 3:
            errors.append(f"{at} 的「### 提示」要正好 3 条（1. 2. 3.），现在 {len(d['hints'])} 条")
    return info, errors


def exercise_info(root=ROOT):
    """全部讲次的 EXERCISES.md：返回 ({编号: 信息（加 folder）}, [错误])。"""
    info, errors = {}, []
    for folder in course_folders(root):
        path = os.path.join(root, folder, "EXERCISES.md")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                got, errs = parse_exercises_md(f.read(), f"{folder}/EXERCISES.md")
            errors += errs
            for ex, d in got.items():
                if ex in info:
                    errors.append(f"{folder}/EXERCISES.md：练习 {ex} 已经在 {info[ex]['folder']} 里出现过")
                d["folder"] = folder
                info[ex] = d
    return info, errors


def exercise_titles(root=ROOT):
    """各讲 EXERCISES.md 里 `## 练习 11.2：标题` 的标题（学生版 raise 的提示语用）。"""
    info, _ = exercise_info(root)
    return {ex: f"{d['title']}（见 {d['folder']}/EXERCISES.md）" for ex, d in info.items()}


def prediction_exercises(root=ROOT):
    """{编号: 讲次文件夹}：每个 <讲次>/predictions.yaml 的 exercise 字段（读不了时抛 ExerciseError）。"""
    import yaml
    out = {}
    for folder in course_folders(root):
        path = os.path.join(root, folder, "predictions.yaml")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f)
            ex = data.get("exercise") if isinstance(data, dict) else None
            if not isinstance(ex, str) or not re.fullmatch(EX_ID, ex):
                raise ExerciseError(f"{folder}/predictions.yaml：exercise 要写成 \"1.6\" 这样的字符串，收到 {ex!r}")
            out[ex] = folder
    return out


_PROBE = r"""
import json, os, sys
sys.path[:0] = [os.path.join("tests", "exercises"), "tests"]
import grading
checks = grading.load_exercise_tests()
wrong = {}
for fn in sorted(os.listdir(os.path.join("tests", "exercises"))):
    if fn.startswith("wrong_") and fn.endswith(".py"):
        for w in __import__(fn[:-3]).VARIANTS:
            wrong[w.ex] = wrong.get(w.ex, 0) + 1
print("@@PROBE@@" + json.dumps({"checks": {k: len(v) for k, v in checks.items()},
                               "wrong": wrong, "predictions": sorted(grading.PREDICTIONS)}))
"""


def probe_checks(root=ROOT):
    """在一个子进程里导入 tests/exercises 的检查和错误答案语料，返回 {"checks": {编号: 个数}, "wrong": {...}}。"""
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1", PYTHONIOENCODING="utf-8")
    r = subprocess.run([sys.executable, "-c", _PROBE], cwd=root, env=env, capture_output=True, text=True,
                       encoding="utf-8", errors="replace", timeout=600)
    tag = [ln for ln in r.stdout.splitlines() if ln.startswith("@@PROBE@@")]
    if r.returncode != 0 or not tag:
        raise ExerciseError("导入 tests/exercises 的检查失败：\n" + (r.stdout + r.stderr)[-3000:])
    return json.loads(tag[-1][len("@@PROBE@@"):])


# =============================================================================
# check 与学生树
# =============================================================================
def build_student(root=ROOT):
    """在内存里做出学生树：返回 (files, texts, regions, errors)。files：学生树的相对路径；texts：改过的文件的新内容；
    regions：{相对路径: (原文, 区域列表)}；errors：标记错误。"""
    titles = exercise_titles(root)
    files = [p for p in tracked_files(root) if not EXCLUDE_FILES.match(p) and not p.startswith("dist/")]
    texts, regions, errors = {}, {}, []
    for rel in files:
        if MARKED_FILE_RE.match(rel):
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                text = f.read()
            try:
                regs = parse_regions(text, rel)
            except MarkerError as e:
                errors.append(str(e))
                continue
            new = student_text(text, rel, titles) if regs else text
            if os.path.basename(rel) == "predictions.yaml":
                new = student_predictions(new)
            if regs:
                regions[rel] = (text, regs)
            if new != text:
                texts[rel] = new
    return files, texts, regions, errors


def find_leaks(root, files, texts, regions):
    """学生树里出现的解答行：返回 [错误]（哪一行、来自哪个练习、出现在哪个文件的哪一行）。"""
    corpus = {}
    for rel in files:
        if rel.endswith(LEAK_SCAN_EXT) or os.path.basename(rel) == "Makefile":
            if rel in texts:
                corpus[rel] = texts[rel]
            else:
                try:
                    with open(os.path.join(root, rel), encoding="utf-8") as f:
                        corpus[rel] = f.read()
                except (UnicodeDecodeError, OSError):
                    continue
    errors = []
    for rel, (text, regs) in sorted(regions.items()):
        ids = {}
        for ex_id, _role, _, b, e in regs:
            for i in range(b + 1, e):
                ids[i + 1] = ex_id
        for lineno, line in solution_lines(text, regs):
            for other, body in corpus.items():
                pos = body.find(line)
                if pos >= 0:
                    where = body.count("\n", 0, pos) + 1
                    errors.append(f"{rel}:{lineno}：练习 {ids[lineno]} 的解答行出现在学生树的 {other}:{where}："
                                  f"{line!r}")
                    break
    return errors


def check_tree(root=ROOT, probe=True):
    """全部一致性检查；返回错误列表（空 = 没问题）。probe=False 时不导入检查（不查登记的检查和错误答案）。"""
    files, texts, regions, errors = build_student(root)
    info, md_errors = exercise_info(root)
    errors += md_errors
    try:
        preds = prediction_exercises(root)
    except (ExerciseError, ImportError, OSError, ValueError) as e:
        errors.append(str(e))
        preds = {}
    marked = {}
    for rel, (_, regs) in regions.items():
        folder = rel.split("/")[0]
        for ex_id, *_ in regs:
            if marked.setdefault(ex_id, folder) != folder:
                errors.append(f"{rel}：练习 {ex_id} 的标记分散在 {marked[ex_id]} 和 {folder} 两个讲次里")
    for ex_id, folder in sorted({**marked, **preds}.items()):
        if ex_id in marked and ex_id in preds:
            errors.append(f"{folder}：练习 {ex_id} 既有代码标记又是 predictions.yaml 的预测练习")
        if not ex_id.startswith(id_prefix(folder) + "."):
            errors.append(f"{folder}：练习编号 {ex_id} 应以 {id_prefix(folder)}. 开头")
        if ex_id not in info or info[ex_id]["folder"] != folder:
            what = "predictions.yaml" if ex_id in preds else "代码里有标记"
            errors.append(f"{folder}/EXERCISES.md 缺少 `## 练习 {ex_id}：标题`（{what}）")
    for ex_id, d in sorted(info.items()):
        if ex_id not in marked and ex_id not in preds:
            errors.append(f"{d['folder']}/EXERCISES.md:{d['line']}：练习 {ex_id} 在代码里没有标记，"
                          f"{d['folder']}/predictions.yaml 里也没有")
        for dep in d["deps"]:
            if dep not in info:
                errors.append(f"{d['folder']}/EXERCISES.md:{d['line']}：练习 {ex_id} 依赖的 {dep!r} 不是已有的练习"
                              f"（写编号或 `无`）")
    if probe and info:
        try:
            got = probe_checks(root)
        except ExerciseError as e:
            errors.append(str(e))
        else:
            for ex_id in sorted(info):
                if not got["checks"].get(ex_id):
                    errors.append(f"练习 {ex_id} 没有登记任何检查"
                                  f"（tests/exercises/test_ex_*.py 里的 @exercise({ex_id!r})）")
                elif ex_id not in preds and got["wrong"].get(ex_id, 0) < 2:
                    errors.append(f"练习 {ex_id} 的错误答案不足两个（tests/exercises/wrong_*.py 里有 "
                                  f"{got['wrong'].get(ex_id, 0)} 个）")
            for ex_id in sorted(set(got["checks"]) - set(info)):
                errors.append(f"tests/exercises 里登记了练习 {ex_id} 的检查，但没有哪个 EXERCISES.md 有这个练习")
    errors += find_leaks(root, files, texts, regions)
    return errors


STUDENT_STAMP = ".student-tree"      # 学生树根目录里的标记文件：测试据此知道自己跑在学生树里


def write_student_tree(out, root=ROOT, check=True):
    """先 check（有错就抛 ExerciseError，一个文件也不写），再写学生树；返回 {相对路径: 区域个数}。"""
    out = os.path.abspath(out)
    if os.path.commonpath([out, root]) == root and not os.path.relpath(out, root).startswith("dist"):
        raise ValueError(f"--out 必须在仓库外或 dist/ 下，收到 {out}")
    errors = check_tree(root) if check else build_student(root)[3]
    if errors:
        raise ExerciseError(f"{len(errors)} 个问题，没有写学生树：\n  " + "\n  ".join(errors))
    files, texts, regions, _ = build_student(root)
    if os.path.exists(out):
        shutil.rmtree(out)
    for rel in files:
        dst = os.path.join(out, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if rel in texts:
            with open(dst, "w", encoding="utf-8") as f:
                f.write(texts[rel])
            shutil.copymode(os.path.join(root, rel), dst)
        else:
            shutil.copy2(os.path.join(root, rel), dst)
    with open(os.path.join(out, STUDENT_STAMP), "w", encoding="utf-8") as f:
        f.write("这是 tools/exercises.py 生成的学生树：练习的解答换成了 raise NotImplementedError。\n")
    return {rel: len(regs) for rel, (_, regs) in regions.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("student", help="检查后写学生树")
    st.add_argument("--out", default=os.path.join(ROOT, "dist", "student"))
    sub.add_parser("check", help="只检查标记、EXERCISES.md、检查与错误答案的登记、解答行泄漏")
    sub.add_parser("list", help="列出全部练习区域")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "student":
            conv = write_student_tree(args.out)
            print(f"学生树写到 {args.out}：{len(conv)} 个文件有练习区域，共 {sum(conv.values())} 个区域")
        elif args.cmd == "check":
            errors = check_tree()
            if errors:
                print(f"{len(errors)} 个问题：", file=sys.stderr)
                for e in errors:
                    print(f"  ✗ {e}", file=sys.stderr)
                return 2
            info, _ = exercise_info()
            print(f"练习检查通过：{len(info)} 个练习，标记、EXERCISES.md、检查、错误答案一致，没有解答行泄漏")
        else:
            info, _ = exercise_info()
            for rel in tracked_files():
                if MARKED_FILE_RE.match(rel):
                    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
                        for ex_id, role, _, b, e in parse_regions(f.read(), rel):
                            print(f"{ex_id:>6}  {role:<10} {rel}:{b + 1}-{e + 1}")
            for ex_id, d in info.items():
                print(f"{ex_id:>6}  {d['points'] or '?':>3} 分  {d['title']}")
    except (MarkerError, ExerciseError) as e:
        print(f"练习有问题：{e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
