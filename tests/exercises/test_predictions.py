"""预测练习：学生在跑任何东西之前写下数字，这里拿它和课程入库的测量比。

每个 `<讲次>/predictions.yaml`：
    exercise: "1.6"
    items:
      - id: llama1b_decode_b64          # 本文件里唯一
        question: "……？"                # 学生看到的问题
        unit: ms
        answer: 3.1                      # 课程自己的估计（学生树里是 null，学生来填）
        reference: {file: lecture05/bench/results/x.json, path: [key, 3, "field"], scale: 1000.0}
        band: 1.5                        # answer / 实测 在 [1/band, band] 里就得满分
        reason: "为什么是这个数：……"      # 评分后打印
每一项登记成练习 `exercise` 的一个检查（所以每项各占该练习分值的一份）。文件本身的格式由
test_prediction_files_are_valid 检查（它不是练习检查：格式错是课程的错，不是学生的）。
"""
import base64
import json
import math
import os
import re

import yaml

from grading import PREDICTIONS, exercise, expect

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FOLDER_RE = re.compile(r"^(prereq|lecture)\d+$")
ITEM_KEYS = {"id", "question", "unit", "answer", "reference", "band", "reason"}


def prediction_files(root=ROOT):
    return [os.path.join(root, d, "predictions.yaml") for d in sorted(os.listdir(root))
            if FOLDER_RE.match(d) and os.path.isfile(os.path.join(root, d, "predictions.yaml"))]


def _is_pos(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def measured_value(ref, root=ROOT):
    """reference 指向的测量值（乘上 scale）；找不到或不是正数时抛 ValueError。"""
    path = os.path.join(root, ref["file"])
    if not os.path.isfile(path):
        raise ValueError(f"reference.file {ref['file']!r} 不存在")
    with open(path, encoding="utf-8") as f:
        node = json.load(f)
    for key in ref["path"]:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            raise ValueError(f"reference.path {ref['path']!r} 在 {ref['file']} 里走不通（卡在 {key!r}）") from None
    scale = ref.get("scale", 1.0)
    if not _is_pos(node) or not _is_pos(scale):
        raise ValueError(f"reference 指到的 {node!r}（scale {scale!r}）不是正数")
    return float(node) * float(scale)


def load_predictions(path, root=ROOT):
    """读一个 predictions.yaml：返回 (exercise 编号, [项], [格式错误])；每项加上 measured（实测值）。"""
    rel = os.path.relpath(path, root)
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict) or not isinstance(data.get("exercise"), str) \
            or not isinstance(data.get("items"), list) or not data["items"]:
        return None, [], [f"{rel}：要有 exercise（字符串，如 \"1.6\"）和非空的 items 列表"]
    items, errors, seen = [], [], set()
    for k, it in enumerate(data["items"]):
        at = f"{rel} 第 {k + 1} 项"
        if not isinstance(it, dict):
            errors.append(f"{at}：不是一个映射")
            continue
        if "reason_sealed" in it and "reason" not in it:       # 学生树：reason 是封起来的（tools/exercises.py）
            it = dict(it, reason=base64.b64decode(it.pop("reason_sealed")).decode("utf-8"))
        missing = ITEM_KEYS - set(it)
        if missing:
            errors.append(f"{at}：缺少 {sorted(missing)}")
            continue
        at = f"{rel} 的 {it['id']}"
        if it["id"] in seen:
            errors.append(f"{at}：id 重复")
        seen.add(it["id"])
        if not (isinstance(it["band"], (int, float)) and it["band"] > 1):
            errors.append(f"{at}：band 要是 > 1 的数，收到 {it['band']!r}")
        if it["answer"] is not None and not _is_pos(it["answer"]):
            errors.append(f"{at}：answer 要是 null 或正数，收到 {it['answer']!r}")
        ref = it["reference"]
        if not (isinstance(ref, dict) and isinstance(ref.get("file"), str) and isinstance(ref.get("path"), list)):
            errors.append(f"{at}：reference 要写成 {{file: …, path: [...], scale: …}}")
            continue
        try:
            it = dict(it, measured=measured_value(ref, root))
        except (ValueError, OSError) as e:
            errors.append(f"{at}：{e}")
            continue
        items.append(it)
    return data["exercise"], items, errors


def evaluate(item):
    """一项预测的结果：dict(ok, ratio, message)。message 一行，评分报告直接打印。"""
    ans, meas, band, unit = item["answer"], item["measured"], float(item["band"]), item["unit"]
    if ans is None:
        return {"ok": False, "ratio": None, "message": f"还没填这个预测：{item['question']}（单位 {unit}）"}
    if not _is_pos(ans):
        return {"ok": False, "ratio": None, "message": f"answer 要写一个正数（单位 {unit}），写的是 {ans!r}"}
    ratio = ans / meas
    ok = 1 / band <= ratio <= band
    verdict = "在允许范围" if ok else "不在允许范围"
    return {"ok": ok, "ratio": ratio,
            "message": f"预测 {ans:.4g} {unit}，实测 {meas:.4g} {unit}，比值 {ratio:.2f}，{verdict} "
                       f"[1/{band:g}, {band:g}] 内。{item['reason']}"}


def _make_check(item):
    def check():
        r = evaluate(item)
        expect(r["ok"], r["message"])
    return check


def _register():
    errors, registered = [], {}
    for path in prediction_files():
        ex_id, items, errs = load_predictions(path)
        errors += errs
        if ex_id is None:
            continue
        PREDICTIONS.add(ex_id)
        for it in items:
            name = "test_prediction_" + re.sub(r"\W", "_", f"{ex_id}_{it['id']}")

            check = _make_check(it)
            check.__name__ = check.__qualname__ = name
            check.item = it
            registered[name] = exercise(ex_id)(check)
    return registered, errors


_CHECKS, _ERRORS = _register()
globals().update(_CHECKS)


def test_prediction_files_are_valid():
    assert not _ERRORS, "predictions.yaml 有格式问题：\n" + "\n".join(_ERRORS)
