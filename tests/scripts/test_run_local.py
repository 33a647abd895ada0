"""`make run` (scripts/run-local.sh) as a newcomer meets it: a taken port is said before
anything starts; on another PORT the sandbox calls and the alerts' links follow it; the
README's create_agent and grant_promote lines, pasted after it started, make an agent whose refund
executes for real (make run ran the replay set first); the output carries no mail bodies
and no tracebacks for a 403 (Linux: the processes' environments are read from /proc).

The whole local stack is started once here (a database of its own, dropped at the end)."""

import os
import random
import re
import signal
import socket
import subprocess
import time

import httpx
import pytest
import psycopg

from tests.conftest import REDIS_URL, ROOT

BASE = "postgres://postgres@127.0.0.1:5432"
RUN_DATABASE = "surety_run_local_test"
# The line the README tells a newcomer to paste once `make run` is up (DATABASE_URL: make run's).
README_AGENT = ".venv/bin/python manage.py create_agent my-bot --grant refund --owner olga"
README_PROMOTE = [".venv/bin/python", "manage.py", "grant_promote", "my-bot", "refund", "--by", "ada", "--reason",
                  "quick start"]


def local_env(port, **extra):
    """The run's environment: with few threads and lanes, as each holds a PostgreSQL connection
    and the suite's own stacks run beside it (its 100 connections ran out twice, `make run`'s
    defaults holding up to 44)."""
    # Not the suite's own key and hosts (tests/settings.py): the run gives itself the development
    # values, with DEBUG on, as a newcomer's shell without them gets.
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PORT", "SECRET_KEY", "ALLOWED_HOSTS")}
    return {**env, "PORT": str(port), "REDIS_URL": REDIS_URL, "WEB_THREADS": "4", "DRAIN_LANES": "2", **extra}


def listening_port():
    """A free port below the kernel's ephemeral range: the suite's outgoing connections take
    their local ports from that range, and one took the port a run was given between this
    choice and the script's own check of it."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        lowest_ephemeral = int(ports.read().split()[0])
    for port in random.sample(range(lowest_ephemeral - 10_000, lowest_ephemeral), 100):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def drop_database():
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{RUN_DATABASE}" WITH (FORCE)')


def test_a_taken_port_is_refused_before_anything_is_prepared_or_announced():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        # Its own session: a script that went on regardless would leave no process behind.
        run = subprocess.Popen(["bash", "scripts/run-local.sh"], cwd=ROOT, env=local_env(port), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            stdout, stderr = run.communicate(timeout=10)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
    assert run.returncode != 0
    assert time.monotonic() - started < 10
    assert f"port {port} on 127.0.0.1 is in use" in stderr
    assert "web app at" not in stdout and "migrating" not in stdout



def test_a_port_whose_last_connections_are_in_time_wait_is_not_refused():
    """What Ctrl-C leaves: the server closed its connections first, so they wait out TIME_WAIT
    on its port for a minute. The run goes on (to a database it cannot reach, so it stops there)."""
    port = listening_port()
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen()
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            accepted.close()  # the server's side closes first: its end goes to TIME_WAIT
            client.recv(1)
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # the port check as it was refused this port
    run = subprocess.run(["bash", "scripts/run-local.sh"], cwd=ROOT, text=True, capture_output=True, timeout=60,
                         env=local_env(port, DATABASE_URL="postgres://postgres@127.0.0.1:1/unreachable"))
    assert "is in use" not in run.stderr
    assert "ensuring database unreachable" in run.stdout

def processes_of(session):
    """{(pid, command line): environment} of the web app, workers and sweeper the run started."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[3]) != session:
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode()
            with open(f"/proc/{pid}/environ", "rb") as environ:
                pairs = [item.split(b"=", 1) for item in environ.read().split(b"\0") if b"=" in item]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if any(name in command for name in ("gunicorn", "rqworker", "manage.py sweep")):
            found[(pid, command)] = {k.decode(): v.decode() for k, v in pairs}
    assert len(found) >= 4, found.keys()  # gunicorn's master and workers, two RQ workers, the sweeper
    return found


def test_make_run_does_not_install_the_browser_the_tests_use():
    # -B: every prerequisite as if out of date, -n: print the commands without running them.
    planned = subprocess.run(["make", "-Bn", "run"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert planned.returncode == 0, planned.stderr
    assert "scripts/run-local.sh" in planned.stdout
    assert "chromium" not in planned.stdout and "apt-get" not in planned.stdout


def login(client, username, password="demo"):
    client.get("/accounts/login/")
    token = client.cookies["csrftoken"]
    answer = client.post("/accounts/login/", headers={"Referer": str(client.base_url)},
                         data={"login": username, "password": password, "csrfmiddlewaretoken": token})
    assert answer.status_code == 302, answer.text[:300]


@pytest.mark.stack  # run-local.sh starts gunicorn, the workers and the sweeper
def test_make_run_on_another_port_works_end_to_end_and_keeps_its_output_quiet(tmp_path):
    drop_database()
    port = listening_port()
    database_url = f"{BASE}/{RUN_DATABASE}"
    log = tmp_path / "run.log"
    env = local_env(port, DATABASE_URL=database_url, EMAIL_FILE_PATH=str(tmp_path / "mail"))
    with open(log, "w") as out:
        run = subprocess.Popen(["bash", "scripts/run-local.sh"], cwd=ROOT, env=env, stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while f"run: web app at http://127.0.0.1:{port}/" not in log.read_text():
            assert run.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)

        # The README's line, pasted with make run's database and DEBUG on (the README's export).
        readme_env = {**env, "DATABASE_URL": database_url, "DEBUG": "true"}
        made = subprocess.run(README_AGENT.split(), cwd=ROOT, env=readme_env,
                              capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
        assert "owner olga" in made.stdout
        token = made.stdout.strip().splitlines()[-1]
        promoted = subprocess.run(README_PROMOTE, cwd=ROOT, capture_output=True, text=True, timeout=60, env={
            **readme_env, "SANDBOX_BASE_URL": f"http://127.0.0.1:{port}/sandbox/v1"})
        assert promoted.returncode == 0, promoted.stdout + promoted.stderr
        assert "my-bot acts for real on refund" in promoted.stdout

        # Every process sends its sandbox calls to this port and links alerts to it (it was always :8000).
        site = f"http://127.0.0.1:{port}"
        for process, environ in processes_of(run.pid).items():
            assert (environ.get("SITE_URL"), environ.get("SANDBOX_BASE_URL")) == (site, f"{site}/sandbox/v1"), process

        with httpx.Client(base_url=site, timeout=30) as client:
            bearer = {"Authorization": f"Bearer {token}"}
            assert client.get("/sandbox/v1/refunds", params={"order_id": "ORD-RUN1"}, headers=bearer).status_code == 200
            # make run's replay set passed, so the promoted grant is live: the refund executes.
            key = "refund:ORD-RUN1:full:dec-run1"
            answer = client.post("/api/v1/actions", headers={**bearer, "Idempotency-Key": key},
                                 json={"action_type": "refund", "target": "ORD-RUN1", "customer": "CUST-RUN1",
                                       "params": {"amount": "25.00", "currency": "EUR"}})
            assert answer.status_code == 201, answer.text
            settled = client.get(f"/api/v1/actions/{key}", params={"wait": 20}, headers=bearer).json()
            assert settled["status"] == "succeeded", settled
            refunds = client.get("/sandbox/v1/refunds", params={"operation_key": key}, headers=bearer).json()["data"]
            assert len(refunds) == 1, refunds

            # An ordinary 403 on the dashboard: an auditor may not create agents.
            login(client, "aldo")
            refused = client.post("/agents/", data={"name": "x", "csrfmiddlewaretoken": client.cookies["csrftoken"]},
                                  headers={"Referer": str(client.base_url)})
            assert refused.status_code == 403
    finally:
        os.killpg(run.pid, signal.SIGINT)
        try:
            run.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        drop_database()

    output = log.read_text()
    assert "Traceback" not in output, output[output.find("Traceback") - 500:][:3000]
    assert not re.search(r"^\S+ \| (Subject|Content-Type|MIME-Version):", output, re.M), "an e-mail was printed"
    assert "apt" not in output.split("run: ensuring database")[0]
    assert '"POST /agents/ HTTP/1.1" 403' in output  # the refusal is the access log's one line
    # Every connector the demo agents use passed its replay set, and each of their grants is live on it
    # (the seed's were bound to none): the connectors page says ready for each.
    for action_type in ("refund", "send_message", "create_booking"):
        passed = rf"^replay \| replay run \d+ of {action_type} against sandbox: passed$"
        assert re.search(passed, output, re.M), action_type
    for agent, action_type in (("billing-bot", "refund"), ("billing-bot", "send_message"),
                               ("billing-bot", "create_booking"), ("support-bot", "send_message"),
                               ("support-bot", "create_booking")):
        assert f"replay | {agent} acts for real on {action_type} until " in output, (agent, action_type)
    assert f"site | SITE_URL {site} reaches this deployment" in output  # checked by its signed probe
