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
