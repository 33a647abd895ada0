"""`make run`'s Ctrl-C (scripts/run-local.sh): a terminal sends SIGINT to its whole foreground
process group, the script's processes included. The web app is started out of that group, so
that it gets only the script's SIGTERM: gunicorn's graceful shutdown. On SIGINT (its quick exit)
a worker at times hung in the interpreter's exit until the master killed it 5 s later, logged
as "was sent SIGKILL! Perhaps out of memory?".

The script's own `start` line for the web app and its functions are run here, with a process in
gunicorn's place that writes down the signals it gets: starting the whole stack is
tests/scripts/test_run_local.py's."""

import os
import re
import signal
import subprocess
import time

from tests.conftest import PYTHON, ROOT

SCRIPT = (ROOT / "scripts" / "run-local.sh").read_text()
# In gunicorn's place: writes "ready", then the name of each signal it gets; ends on SIGTERM.
WEB_APP = """
import os, signal, sys, time
out = open(sys.argv[1], "a", buffering=1)
def got(sig, frame):
    out.write(signal.Signals(sig).name + "\\n")
    if sig == signal.SIGTERM:
        sys.exit(0)
signal.signal(signal.SIGINT, got)
signal.signal(signal.SIGTERM, got)
out.write(f"ready {os.getpid()}\\n")
while True:
    time.sleep(0.05)
"""


def script_pieces():
    """The script's one-line functions, its `start`, and how its `start web` line runs gunicorn
    (what comes before `"$PY" -m gunicorn`)."""
    one_liners = re.findall(r"^\w+\(\) \{ .* \}$", SCRIPT, re.M)
    start = re.search(r"^start\(\) \{.*?^\}$", SCRIPT, re.M | re.S)[0]
    web = re.search(r'^start web +(.*?)"\$PY" -m gunicorn ', SCRIPT, re.M)[1]
    return "\n".join([*one_liners, start]), web


def still_running(pid):
    """Whether `pid` is still the process in gunicorn's place (not one that took its number since)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"signal.Signals" in cmdline.read()
    except FileNotFoundError:
        return False


def test_ctrl_c_reaches_the_web_app_only_as_the_scripts_sigterm(tmp_path):
    functions, web = script_pieces()
    log = tmp_path / "signals"
    # As the script stops on Ctrl-C (its stop(): SIGTERM to each process it started, then wait).
    shell = f"""set -euo pipefail
PY={PYTHON}
pids=()
{functions}
trap 'kill -TERM "${{pids[@]}}"; wait; exit 0' INT
start web {web}"$PY" -c "$WEB_APP" "$LOG"
wait
"""
    run = subprocess.Popen(["bash", "-c", shell], cwd=ROOT, env={**os.environ, "WEB_APP": WEB_APP, "LOG": str(log)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    web_pid = None
    try:
        deadline = time.monotonic() + 20
        while not (log.exists() and log.read_text().startswith("ready")):
            assert run.poll() is None, run.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        web_pid = int(log.read_text().split()[1])

        os.killpg(run.pid, signal.SIGINT)  # Ctrl-C: the terminal's whole process group
        assert run.wait(20) == 0
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        if web_pid is not None and still_running(web_pid):
            os.kill(web_pid, signal.SIGKILL)

    assert log.read_text().split("\n")[1:] == ["SIGTERM", ""]
