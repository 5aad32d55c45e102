#!/usr/bin/env python3
"""练习的"一份源码"：实验模块里用成对的注释标出练习区域，这里把它们变成学生版的树。

标记（整行注释，缩进随意，begin 行的缩进就是学生版里 raise 的缩进）：
    # >>> 练习 11.2 hole          区域变成 raise NotImplementedError("练习 11.2 未完成：…")（默认角色）
    # >>> 练习 11.2 given         区域原样保留（给学生的脚手架），只去掉标记行
    # >>> 练习 11.2 instructor    区域整段删掉（只给老师）
    # <<< 练习 11.2               结束当前区域（编号必须与 begin 一致；区域不能嵌套）
练习编号形如 11.2、P5.1（讲次号.序号）。

用法：
    python3 tools/exercises.py student [--out dist/student]   写学生树（不入库）
    python3 tools/exercises.py list                           列出全部区域
"""
import argparse
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
ROLES = ("hole", "given", "instructor")
# 学生树里不要的东西：老师的错误答案语料、生成物、本地环境
EXCLUDE_FILES = re.compile(r"^tests/exercises/(wrong_[^/]*\.py|test_wrong_corpus\.py)$")


class MarkerError(ValueError):
    """标记不成对、角色未知或编号不一致。"""


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


def tracked_files(root=ROOT):
    """git 跟踪的文件加上未跟踪但未被忽略的文件（与 CI 的全新克隆一致）。"""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout.decode()
    return sorted({p for p in out.split("\0") if p and os.path.isfile(os.path.join(root, p))})


def exercise_titles(root=ROOT):
    """各讲 EXERCISES.md 里 `## 练习 11.2：标题` 的标题（学生版 raise 的提示语用）。"""
    titles, head = {}, re.compile(rf"^## 练习 ({EX_ID})[：:]\s*(.+?)\s*$")
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name, "EXERCISES.md")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    m = head.match(line)
                    if m:
                        titles[m.group(1)] = f"{m.group(2)}（见 {name}/EXERCISES.md）"
    return titles


def write_student_tree(out, root=ROOT):
    """写学生树；返回 {相对路径: 区域个数}（只列有标记的文件）。"""
    out = os.path.abspath(out)
    if os.path.commonpath([out, root]) == root and not os.path.relpath(out, root).startswith("dist"):
        raise ValueError(f"--out 必须在仓库外或 dist/ 下，收到 {out}")
    titles = exercise_titles(root)
    files = [p for p in tracked_files(root) if not EXCLUDE_FILES.match(p) and not p.startswith("dist/")]
    converted = {}
    texts = {}
    for rel in files:                     # 先全部解析：标记有错就一个文件也不写
        if MARKED_FILE_RE.match(rel):
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                text = f.read()
            regions = parse_regions(text, rel)
            if regions:
                texts[rel] = student_text(text, rel, titles)
                converted[rel] = len(regions)
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
    return converted


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("student", help="写学生树")
    st.add_argument("--out", default=os.path.join(ROOT, "dist", "student"))
    sub.add_parser("list", help="列出全部练习区域")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "student":
            conv = write_student_tree(args.out)
            print(f"学生树写到 {args.out}：{len(conv)} 个文件有练习区域，共 {sum(conv.values())} 个区域")
        else:
            for rel in tracked_files():
                if MARKED_FILE_RE.match(rel):
                    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
                        for ex_id, role, _, b, e in parse_regions(f.read(), rel):
                            print(f"{ex_id:>6}  {role:<10} {rel}:{b + 1}-{e + 1}")
    except MarkerError as e:
        print(f"标记错误：{e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
