"""plot_log: PNG pictures of a training log (matplotlib)."""
import sys

import pytest
from PIL import Image

from cct import cli
from cct.errors import CCTError
from cct.tools import plot_log


def test_summary_png(caffe_fixtures, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "log.png"
    assert cli.main(["plot_log", str(caffe_fixtures / "lenet_train.log"), str(out)]) == 0
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (1200, 1020)  # 3 rows x 2 columns
        colours = image.convert("RGB").getcolors(1 << 20)
    assert len(colours) > 50  # lines, text and axes, not a blank canvas


def test_caffe_chart_types(caffe_fixtures, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    logs = [str(caffe_fixtures / "lenet_train.log"), str(caffe_fixtures / "lenet_resume.log")]
    for chart in range(8):
        out = tmp_path / f"chart{chart}.png"
        assert cli.main(["plot_log", str(chart), str(out)] + logs) == 0
        with Image.open(out) as image:
            assert image.size == (800, 600)
    assert cli.main(["plot_log", "9", str(tmp_path / "x.png")] + logs) == 1
    assert "chart type must be 0..7" in capsys.readouterr().err


def test_errors(caffe_fixtures, tmp_path, capsys):
    assert cli.main(["plot_log", str(tmp_path / "none.log"), str(tmp_path / "x.png")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert cli.main(["plot_log", "only_one_argument"]) == 1
    assert "usage" in capsys.readouterr().err


def test_missing_matplotlib_is_a_clear_error(caffe_fixtures, tmp_path, monkeypatch):
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(CCTError, match="needs matplotlib"):
        plot_log.plot_summary(str(caffe_fixtures / "lenet_train.log"), str(tmp_path / "x.png"))
    assert not (tmp_path / "x.png").exists()


def test_follow_redraws_as_the_log_grows_and_stops_when_done(caffe_fixtures, tmp_path):
    """--follow: nothing is drawn before the first output line, a picture appears with it and
    is redrawn as lines come, and the run ends on 'Optimization Done.'."""
    pytest.importorskip("matplotlib")
    lines = (caffe_fixtures / "lenet_train.log").read_text().splitlines(keepends=True)
    first_output = next(i for i, l in enumerate(lines) if "net output #" in l)
    log, out = tmp_path / "train.log", tmp_path / "live.png"
    # What the log holds at each poll: up to the solver's start (no picture yet), a first
    # output and half a line, the rest.
    parts = [lines[:first_output - 5], lines[first_output - 5:first_output + 1] + ["I1122 04"],
             ["I1122 04" + lines[first_output + 1][len("I1122 04"):]]
             + lines[first_output + 2:]]
    seen = []

    def sleep(_seconds):
        seen.append(out.exists())
        with open(log, "a") as f:
            f.writelines(parts.pop(0))

    assert plot_log.follow(str(log), str(out), poll=0.01, sleep=sleep) == "done"
    assert seen == [False, False, True]   # no log; no output line yet; drawn
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (1200, 1020)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live.png", "train.log"]  # no temp


def test_follow_from_the_command_line(caffe_fixtures, tmp_path, capsys):
    """A finished log: drawn once, and the command returns; one that stops growing without
    'Optimization Done.' is followed until --follow-timeout."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "done.png"
    assert cli.main(["plot_log", "--follow", str(caffe_fixtures / "lenet_train.log"),
                     str(out)]) == 0
    assert out.is_file()
    text = (caffe_fixtures / "lenet_train.log").read_text()
    cut = tmp_path / "cut.log"
    cut.write_text(text[:text.index("Optimization Done.")].rsplit("\n", 1)[0] + "\n")
    out = tmp_path / "cut.png"
    assert cli.main(["plot_log", "--follow", "--follow-timeout=0.3", "--poll=0.05", str(cut),
                     str(out)]) == 0
    assert out.is_file()
    assert "did not grow for 0.3 s" in capsys.readouterr().err
    assert cli.main(["plot_log", "--follow", "--poll=0", str(cut), str(out)]) == 1
    assert "--poll must be above 0" in capsys.readouterr().err


def test_follow_stops_on_ctrl_c(caffe_fixtures, tmp_path):
    def interrupt(_seconds):
        raise KeyboardInterrupt

    assert plot_log.follow(str(tmp_path / "none.log"), str(tmp_path / "x.png"),
                           sleep=interrupt) == "interrupted"
    assert not (tmp_path / "x.png").exists()
