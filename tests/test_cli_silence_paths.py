"""`specwatch silence` on a state directory that does not exist says so (a typo is not 'none')."""

import subprocess
import sys


def test_list_on_a_missing_state_dir_warns(tmp_path):
    missing = tmp_path / "typo"
    r = subprocess.run([sys.executable, "-m", "specwatch", "silence", "list", "--state-dir", str(missing)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    assert f"state directory {missing} does not exist" in r.stderr
    ok = subprocess.run([sys.executable, "-m", "specwatch", "silence", "list", "--state-dir", str(tmp_path)],
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and "does not exist" not in ok.stderr
