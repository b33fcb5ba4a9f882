"""Runs the random-call API fuzzer (fuzz_api.py, not collected by pytest)
for a few seconds: every program in a forked child, which must neither
crash nor hang nor print, and whose failing calls must raise the API's
error types and change nothing. Longer runs: ``python fuzz_api.py
--seconds 600`` (``PKV_FUZZ_API_SECONDS`` sets this test's budget)."""

import os
import subprocess
import sys

FUZZER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_api.py")


def test_fuzz_api_smoke(tmp_path):
    seconds = os.environ.get("PKV_FUZZ_API_SECONDS", "10")
    r = subprocess.run(
        [
            sys.executable,
            FUZZER,
            "--seconds",
            seconds,
            "--first-seed",
            "1",
            "--calls",
            "150",
            "--timeout",
            "60",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=float(seconds) + 300,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "fuzz_api:" in r.stdout and " 0 failed" in r.stdout, r.stdout[-3000:]
