"""The benches run on a non-editable install (issue 16, item 1): a bench puts the repository
after the installed packages, so `import cct` finds the installed cct with its compiled _C and
not the source tree, which has none after `pip install .`."""
import pathlib
import re

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
# sys.path.insert(0, <the repository>): REPO, parents[1] or parent.parent of the bench file.
AHEAD = re.compile(r"sys\.path\.insert\(\s*0\s*,.*(REPO|parents\[1\]|parent\.parent|"
                   r"HERE\.parent)")


def test_no_bench_puts_the_source_tree_ahead_of_the_installed_cct():
    offenders = [f"{path.name}:{n}" for path in sorted(BENCH.glob("*.py"))
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if AHEAD.search(line)]
    assert not offenders, (f"{', '.join(offenders)}: use sys.path.append(repository) so the "
                           f"installed cct comes first (see bench/bench_train.py)")
