"""glog's held lines (the optimizer's kept probes): INFO lines wait, warnings do not, and
released lines come out in order with the time of their release."""
import re
import time

from cct import glog


def test_held_lines_wait_and_come_out_stamped_at_release(capfd):
    capfd.readouterr()
    with glog.held() as lines:
        glog.info("solver.cpp:239", "Iteration 0, loss = 2.3")
        glog.warning("solver.cpp:1", "a warning is not held")
        glog.info("solver.cpp:239", "Iteration 1, loss = 2.2")
    during = capfd.readouterr().err
    assert "a warning is not held" in during and "Iteration" not in during
    assert len(lines) == 2
    glog.info("optimizer.py:0", "after the probe")
    time.sleep(0.01)
    glog.release(lines)
    out = capfd.readouterr().err.splitlines()
    assert [line.split("] ", 1)[1] for line in out] == [
        "after the probe", "Iteration 0, loss = 2.3", "Iteration 1, loss = 2.2"]
    stamps = [re.match(r"I\d{4} (\S+)", line).group(1) for line in out]
    assert stamps == sorted(stamps) and stamps[0] < stamps[1]
