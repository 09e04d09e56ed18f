"""The MLS bench script runs end to end (tiny sizes; figures come from the script, never from tests)."""

from appliance.bench import mls as bench


def test_bench_script_runs(capsys):
    assert bench.main(["--sizes", "4", "--adds", "2", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "add 2 members in one Commit" in out and "group of 4: External Commit process" in out
