"""lecture04/checkpoint_store.py 与两讲（第 4、19 讲）用它的方式：格式、seal、没有 manifest、拒收、续训、Ctrl-C。

全部在临时文件夹里用几步的小配置：从不重训入库的模型。
"""
import json
import math
import os
import signal
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from labload import load_lab

cs = load_lab("lecture04", "checkpoint_store")
ml = load_lab("lecture04", "modern_lm")

TINY = ml.TrainConfig(steps=6, batch=2, seq=16, warmup=1, eval_every=3, eval_batches=1)
QUIET = dict(progress=False, log=lambda *_: None)


def _build():
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))


# ---------------------------------------------------------------------------------------------- 存储本身
def test_store_round_trip_is_bit_exact_and_plain(tmp_path):
    torch.manual_seed(1)
    net = _build().half()
    st_ = cs.CheckpointStore(str(tmp_path))
    st_.save("m", net.state_dict(), {"a": 1}, {"steps": 2})
    plain = torch.load(st_.path("m"), weights_only=True)              # 纯 state_dict，FP16 原样
    assert all(plain[k].dtype == torch.float16 and torch.equal(plain[k], v) for k, v in net.state_dict().items())
    model, why, rec = st_.verify("m", {"a": 1}, _build)
    assert why == "ok" and rec == {"steps": 2}
    assert all(torch.equal(a.float(), b) for a, b in zip(net.state_dict().values(), model.state_dict().values()))


@pytest.mark.parametrize("bad", [{"steps": 0}, {"steps": -1}, {"steps": 3, "loss": math.nan},
                                 {"steps": 3, "curve": [[1, math.inf]]}, {}])
def test_store_refuses_records_it_cannot_stand_behind(tmp_path, bad):
    st_ = cs.CheckpointStore(str(tmp_path))
    with pytest.raises((ValueError, TypeError)):
        st_.save("m", _build().state_dict(), {"a": 1}, bad)
    assert not os.path.exists(st_.manifest_path)


@settings(deadline=None, max_examples=40)
@given(st.dictionaries(st.sampled_from("abcde"), st.integers(-3, 3), max_size=5),
       st.dictionaries(st.sampled_from("abcde"), st.integers(-3, 3), max_size=5))
def test_config_diff_names_exactly_the_differing_fields(old, new):
    diff = cs.config_diff(old, new)
    named = {line.split(":")[0] for line in diff}
    assert named == {k for k in set(old) | set(new) if old.get(k, "缺") != new.get(k, "缺")}
    assert (not diff) == (old == new)


def test_state_digest_sees_every_bit():
    s = {"w": torch.zeros(3)}
    t = {"w": torch.tensor([0.0, -0.0, 0.0])}                                # 相等但位不同
    assert cs.state_digest(s) != cs.state_digest(t) and cs.state_digest(s) == cs.state_digest({"w": torch.zeros(3)})


# ---------------------------------------------------------------------------------------------- 第 4 讲
@pytest.fixture(scope="module")
def trained_once(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("trained"))
    ml.train_and_save("modern_mqa", d, TINY, **QUIET)
    return d


@pytest.fixture
def trained(trained_once, tmp_path):
    """训一次（整个文件共用），每个测试拿一份拷贝去改。"""
    import shutil
    d = str(tmp_path / "ckpt")
    shutil.copytree(trained_once, d)
    return d


def test_lecture04_missing_or_broken_manifest_checks_each_file(trained):
    d = trained
    ref = ml.verify_checkpoint("modern_mqa", d, TINY)[0]
    for damage in ("remove", "garbage"):
        man = os.path.join(d, "manifest.json")
        saved = open(man, encoding="utf-8").read()
        os.remove(man) if damage == "remove" else open(man, "w").write("{not json")
        logs = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")                                   # 不重训：没有"将重新训练"的警告
            model, info = ml.load_or_train("modern_mqa", ckpt_dir=d, tc=TINY, log=logs.append, progress=False)
        assert info == {"source": "checkpoint", "steps": None} and "只核对了文件本身" in logs[-1]
        assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(), model.state_dict().values()))
        open(man, "w", encoding="utf-8").write(saved)


def test_lecture04_edited_number_is_not_printed_as_measured(trained):
    d = trained
    man_path = os.path.join(d, "manifest.json")
    man = json.load(open(man_path, encoding="utf-8"))
    true_loss = man["models"]["modern_mqa"]["record"]["final_eval_loss"]
    man["models"]["modern_mqa"]["record"]["final_eval_loss"] = 0.123
    json.dump(man, open(man_path, "w", encoding="utf-8"))
    logs = []
    _, info = ml.load_or_train("modern_mqa", ckpt_dir=d, tc=TINY, log=logs.append, progress=False)
    assert "final_eval_loss" not in info and not any("0.123" in s for s in logs) and "seal" in logs[-1]
    man["models"]["modern_mqa"]["record"]["final_eval_loss"] = true_loss        # 改回去：又是测量值
    json.dump(man, open(man_path, "w", encoding="utf-8"))
    _, info = ml.load_or_train("modern_mqa", ckpt_dir=d, tc=TINY, log=logs.append, progress=False)
    assert info["final_eval_loss"] == true_loss


def test_resume_path_must_name_a_resume_file(tmp_path):
    with pytest.raises(ValueError, match="resume_path"):
        ml.train_model(ml.CHECKPOINTS["modern"], TINY, ml.language(), progress=False,
                       resume_path=str(tmp_path / "modern.pt"))          # 会被当成检查点的名字：拒绝


def test_lecture04_flags_are_checked():
    with pytest.raises(TypeError, match="quick"):
        ml.load_or_train("modern", quick="yes")
    with pytest.raises(ValueError, match="steps"):
        ml.TrainConfig(steps=0)


def test_lecture04_ctrl_c_is_one_line_and_resumable(tmp_path, monkeypatch):
    """Ctrl-C 之后：SystemExit 一行话、续训文件在；再跑接着训，权重和一口气训完的逐位相同，tokens/s 只算后一段。"""
    d = str(tmp_path)
    straight, _ = ml.train_model(ml.CHECKPOINTS["modern_mqa"], TINY, ml.language(), progress=False)
    lang_cls = type(ml.language())
    real = lang_cls.sample
    calls = []

    def flaky(self, n, length, seed):
        if seed == TINY.seed * 1_000_000 + 4:                     # 第 5 步取数据时按 Ctrl-C：第 5 步照常做完
            calls.append(seed)
            if len(calls) == 1:
                signal.raise_signal(signal.SIGINT)
        return real(self, n, length, seed)
    monkeypatch.setattr(lang_cls, "sample", flaky)
    with pytest.raises(SystemExit, match="第 5/6 步") as e:
        ml.train_and_save("modern_mqa", d, TINY, **QUIET)
    assert "\n" not in str(e.value) and os.path.exists(os.path.join(d, "modern_mqa.resume.pt"))
    assert not os.path.exists(os.path.join(d, "modern_mqa.pt"))
    sessions = []
    real_train = ml._train

    def spy(*a, **k):
        out = real_train(*a, **k)
        sessions.append(out[2])
        return out
    monkeypatch.setattr(ml, "_train", spy)
    model, record = ml.train_and_save("modern_mqa", d, TINY, **QUIET)
    s = sessions[0]
    assert s["start"] == 5 and s["seconds_before"] > 0
    assert record["tokens_per_s"] == round((TINY.steps - 5) * TINY.batch * TINY.seq / s["seconds"])
    assert record["seconds"] == round(s["seconds_before"] + s["seconds"], 1)
    for (k, a), b in zip(straight.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), k
    assert not os.path.exists(os.path.join(d, "modern_mqa.resume.pt"))
