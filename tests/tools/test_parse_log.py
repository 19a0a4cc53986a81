"""parse_log: the CSV tables Caffe's tools/extra/parse_log.py writes for a training log."""
import os

import pytest

from cct import cli
from cct.errors import CCTError
from cct.tools import parse_log

# From lenet_train.log, by hand: (iteration, "Train net output #0: loss", the last
# "lr = " printed before that line). Caffe's script gives row 0 the lr of row 1.
TRAIN_ROWS = [
    (0, 2.27011, 0.01), (100, 0.590837, 0.01), (200, 0.108723, 0.00992565),
    (300, 0.1277, 0.00985258), (400, 0.0559738, 0.00978075), (500, 0.0425828, 0.00971013),
    (600, 0.165496, 0.00964069), (700, 0.00701034, 0.0095724), (800, 0.0390285, 0.00950522),
    (900, 0.0245114, 0.00943913), (1000, 0.0166353, 0.00937411),
    (1100, 0.0197713, 0.00931012), (1200, 0.00356991, 0.00924715),
    (1300, 0.00488679, 0.00918515), (1400, 0.00633676, 0.00912412),
    (1500, 0.00673275, 0.00906403), (1600, 0.0115779, 0.00900485),
    (1700, 0.00157619, 0.00894657), (1800, 0.00215216, 0.00888916),
    (1900, 0.00305618, 0.0088326),
]
# (iteration, seconds after "Solving LeNet" at 04:17:58.397853, lr, accuracy, loss)
TEST_ROWS = [
    (0, 0.391864, 0.00971013, 0.08, 2.34377),
    (500, 11.246527, 0.00971013, 0.9735, 0.0897528),
    (1000, 22.068247, 0.00937411, 0.9805, 0.0775682),
    (1500, 32.641194, 0.00906403, 0.979, 0.0839708),
    (2000, 44.00605, 0.00877687, 0.9815, 0.0758345),
]


def test_lenet_log_rows(caffe_fixtures):
    train, test = parse_log.parse_log(str(caffe_fixtures / "lenet_train.log"))
    assert [list(r) for r in train[:1]] == [["NumIters", "Seconds", "LearningRate", "loss"]]
    assert [(r["NumIters"], r["loss"], r["LearningRate"]) for r in train] == TRAIN_ROWS
    assert train[0]["Seconds"] == pytest.approx(0.423823, abs=1e-9)  # 04:17:58.821676
    assert train[1]["Seconds"] == pytest.approx(2.496009, abs=1e-9)  # 04:18:00.893862
    assert train[-1]["Seconds"] == pytest.approx(41.397601, abs=1e-9)  # 04:18:39.795454
    assert list(test[0]) == ["NumIters", "Seconds", "LearningRate", "accuracy", "loss"]
    got = [(r["NumIters"], r["Seconds"], r["LearningRate"], r["accuracy"], r["loss"])
           for r in test]
    assert [g[:1] + g[2:] for g in got] == [t[:1] + t[2:] for t in TEST_ROWS]
    assert [g[1] for g in got] == pytest.approx([t[1] for t in TEST_ROWS], abs=1e-9)


def test_csv_files_as_caffe_writes_them(caffe_fixtures, tmp_path, capsys):
    log = str(caffe_fixtures / "lenet_train.log")
    assert cli.main(["parse_log", log, str(tmp_path), "--verbose"]) == 0
    assert "Wrote" in capsys.readouterr().out
    test_csv = (tmp_path / "lenet_train.log.test").read_bytes().decode()
    assert test_csv == (
        "NumIters,Seconds,LearningRate,accuracy,loss\r\n"
        "0.0,0.391864,0.00971013,0.08,2.34377\r\n"
        "500.0,11.246527,0.00971013,0.9735,0.0897528\r\n"
        "1000.0,22.068247,0.00937411,0.9805,0.0775682\r\n"
        "1500.0,32.641194,0.00906403,0.979,0.0839708\r\n"
        "2000.0,44.00605,0.00877687,0.9815,0.0758345\r\n")
    lines = (tmp_path / "lenet_train.log.train").read_bytes().decode().split("\r\n")
    assert lines[0] == "NumIters,Seconds,LearningRate,loss"
    assert lines[1] == "0.0,0.423823,0.01,2.27011"
    assert lines[-2] == "1900.0,41.397601,0.0088326,0.00305618" and lines[-1] == ""
    assert len(lines) == 1 + 20 + 1


def test_delimiter(caffe_fixtures, tmp_path):
    log = str(caffe_fixtures / "lenet_train.log")
    assert cli.main(["parse_log", "--delimiter", ";", log, str(tmp_path)]) == 0
    first = (tmp_path / "lenet_train.log.test").read_text().splitlines()[1]
    assert first == "0.0;0.391864;0.00971013;0.08;2.34377"


LOG_WITH_YEAR = """\
I20231231 23:59:59.500000  1 solver.cpp:289] Solving Net
I20231231 23:59:59.700000  1 solver.cpp:239] Iteration 0 (0 iter/s, 0s/1 iters), loss = 1.5
I20231231 23:59:59.700001  1 solver.cpp:258]     Train net output #0: loss = 1.5 (* 1 = 1.5 loss)
I20231231 23:59:59.700002  1 sgd_solver.cpp:112] Iteration 0, lr = 0.1
I20240101 00:00:01.000000  1 solver.cpp:239] Iteration 10 (1 iter/s, 1s/10 iters), loss = 0.5
I20240101 00:00:01.000001  1 solver.cpp:258]     Train net output #0: loss = 0.5 (* 1 = 0.5 loss)
I20240101 00:00:01.000002  1 sgd_solver.cpp:112] Iteration 10, lr = 0.05
I20240101 00:00:02.000000  1 solver.cpp:347] Iteration 10, Testing net (#0)
I20240101 00:00:02.500000  1 solver.cpp:414]     Test net output #0: acc = 0.5
"""


def test_year_in_prefix_and_new_year_and_single_row():
    train, test = parse_log.parse_lines(LOG_WITH_YEAR.splitlines(True), 1999)
    assert [(r["NumIters"], r["Seconds"], r["LearningRate"], r["loss"]) for r in train] == \
        [(0.0, 0.200001, 0.1, 1.5), (10.0, 1.500001, 0.1, 0.5)]
    # one test row only: Caffe's script drops it, cct keeps it
    assert test == [{"NumIters": 10.0, "Seconds": 3.0, "LearningRate": 0.05, "acc": 0.5}]


def test_year_less_prefix_across_new_year():
    text = LOG_WITH_YEAR.replace("I2023", "I").replace("I2024", "I")
    train, _ = parse_log.parse_lines(text.splitlines(True), 2023)
    assert train[1]["Seconds"] == pytest.approx(1.500001)


def test_errors(tmp_path, capsys):
    log = tmp_path / "x.log"
    log.write_text("I0101 00:00:00.000000 1 caffe.cpp:1] no solver here\n")
    for argv, message in [([str(tmp_path / "nope.log"), str(tmp_path)], "does not exist"),
                          ([str(log), str(tmp_path)], "Solving"),
                          ([str(log)], "expected 2 argument(s)"),
                          ([str(log), str(tmp_path / "nodir")], None),
                          ([str(log), str(tmp_path), "--delimiter", "ab"], "one character")]:
        assert cli.main(["parse_log"] + argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("cct: error: parse_log") and (message is None or message in err)
    assert os.listdir(tmp_path) == ["x.log"]


def test_missing_output_dir(caffe_fixtures, tmp_path):
    train, test = parse_log.parse_log(str(caffe_fixtures / "lenet_train.log"))
    with pytest.raises(CCTError, match="output directory"):
        parse_log.save_csv_files("a.log", str(tmp_path / "nodir"), train, test)
