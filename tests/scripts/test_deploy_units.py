"""What an operator runs (deploy/ and the Procfile) agrees with the code: every command a unit
starts is a program of the virtualenv and a management command or WSGI module that exists, with
options its parser takes; the Procfile runs the same commands; what the units expect of the host
(its user, its writable directories) is made by the sysusers.d and tmpfiles.d files shipped
beside them; the example settings file passes Django's deployment checks. systemd's own
`systemd-analyze verify` and its offline security score run where systemd is installed."""

import configparser
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from django.core.management import get_commands, load_command_class
from django.utils.module_loading import import_string
from gunicorn.config import Config

from tests.conftest import PYTHON, REDIS_URL, ROOT

DEPLOY = ROOT / "deploy"
UNITS = DEPLOY / "systemd"
SHARED = UNITS / "surety-.service.d" / "surety.conf"  # a drop-in every surety-*.service gets
INSTALLED_AT = "/opt/surety"
VENV_BIN = f"{INSTALLED_AT}/.venv/bin/"
# The units a host runs all the time, and what each one's ExecStart is in the Procfile.
PROCFILE_OF = {"surety-web.service": "web", "surety-worker@.service": "worker", "surety-sweeper.service": "sweeper",
               "surety-migrate.service": "release"}
LONG_RUNNING = ["surety-web.service", "surety-worker@.service", "surety-sweeper.service"]


def unit(path):
    # systemd repeats keys (SystemCallFilter=, Wants=) and writes % and $ freely.
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # keys are case-sensitive
    parser.read(path)
    return parser


def commands(parsed):
    """The argv of each ExecStartPre and ExecStart, without the install path's virtualenv."""
    found = []
    for key in ("ExecStartPre", "ExecStart"):
        if parsed.has_option("Service", key):
            argv = shlex.split(parsed["Service"][key])
            assert argv[0].startswith(VENV_BIN), f"{key} runs {argv[0]}, not a program of the virtualenv"
            found.append([argv[0].removeprefix(VENV_BIN), *argv[1:]])
    return found


def check_command(argv):
    """Fails unless `argv` starts something that exists here, with options it takes."""
    program, *args = argv
    assert (Path(PYTHON).parent / program).exists(), f"{program} is not installed in the virtualenv"
    if program == "python":
        script, name, *options = args
        assert script == "manage.py", argv
        assert name in get_commands(), f"no management command {name}"
        command = load_command_class(get_commands()[name], name)
        parsed = vars(command.create_parser("manage.py", name).parse_args(options))  # CommandError if refused
        if parsed.get("worker_class"):
            import_string(parsed["worker_class"])
    else:
        assert program == "gunicorn", argv
        config = Config()
        parsed = config.parser().parse_args(args)
        for setting, value in vars(parsed).items():
            if value is not None and setting in config.settings:
                config.set(setting, value)
        assert config.worker_class  # imported here
        (app,) = parsed.args
        assert importlib.util.find_spec(app.partition(":")[0]), f"no module {app}"


def procfile():
    lines = (line.partition(":") for line in (ROOT / "Procfile").read_text().splitlines() if line.strip())
    return {name.strip(): shlex.split(command) for name, _, command in lines}


def test_it_starts_only_commands_that_exist_with_options_they_take():
    started = {path.name: commands(unit(path)) for path in UNITS.glob("*.service")}
    assert set(started) == set(PROCFILE_OF)
    for argvs in started.values():
        assert argvs
        for argv in argvs:
            check_command(argv)


def test_the_procfile_runs_what_the_units_run():
    assert procfile() == {process: commands(unit(UNITS / name))[-1] for name, process in PROCFILE_OF.items()}


def test_the_long_running_units_restart_whatever_happens_and_belong_to_the_target():
    for name in LONG_RUNNING:
        parsed = unit(UNITS / name)
        assert parsed["Service"]["Restart"] == "always", name
        assert float(parsed["Service"]["RestartSec"]) > 0, name
        # Without it systemd gives up after 5 quick restarts and leaves the service dead.
        assert parsed["Unit"]["StartLimitIntervalSec"] == "0", name
        assert parsed["Unit"]["PartOf"] == parsed["Install"]["WantedBy"] == "surety.target", name
    assert "Restart" not in unit(UNITS / "surety-migrate.service")["Service"]


def test_the_host_gets_the_user_and_the_writable_directories_the_units_expect():
    shared = unit(SHARED)["Service"]
    users = [line.split()[1] for line in (DEPLOY / "sysusers.d" / "surety.conf").read_text().splitlines()
             if line.startswith("u ")]
    assert users == [shared["User"]]
    made = {fields[1]: fields[3] for line in (DEPLOY / "tmpfiles.d" / "surety.conf").read_text().splitlines()
            if (fields := line.split()) and fields[0] in ("d", "D")}
    writable = [path for file in [SHARED, *UNITS.glob("*.service")]
                for path in unit(file)["Service"].get("ReadWritePaths", "").split()]
    assert writable and all(made.get(path) == shared["User"] for path in writable), (writable, made)
    assert f"{INSTALLED_AT}/staticfiles" in writable  # the web app's collectstatic writes there
    assert shared["WorkingDirectory"] == INSTALLED_AT
    assert shared["EnvironmentFile"] == "/etc/surety/surety.env"
    multiproc = example_settings()["PROMETHEUS_MULTIPROC_DIR"]
    assert multiproc in made and Path(multiproc).parent.as_posix() in writable


def example_settings():
    pairs = (line.split("=", 1) for line in (DEPLOY / "surety.env.example").read_text().splitlines()
             if line.strip() and not line.startswith("#"))
    return dict(pairs)


def run_with_example_settings(*args, **env):
    """`manage.py ARGS` with the example settings file's environment, and `env` over it."""
    settings = {k: v for k, v in example_settings().items() if k != "PROMETHEUS_MULTIPROC_DIR"}  # a host's directory
    # Not the test run's own: its settings module, and the browser tests' async switch (which
    # stays set for the rest of their xdist worker's session, and check --deploy refuses).
    environment = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DJANGO_ALLOW_ASYNC_UNSAFE")}
    return subprocess.run([PYTHON, "manage.py", *args], cwd=ROOT, env={**environment, **settings, **env},
                          capture_output=True, text=True, timeout=120)


def test_the_example_settings_pass_the_deployment_checks():
    # This run's own database and Redis stand in for the example's hosts, which do not exist here.
    done = run_with_example_settings("check", "--deploy", DATABASE_URL=os.environ.get("DATABASE_URL", "sqlite:///:memory:"),
                                     REDIS_URL=REDIS_URL)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def installed_here(tmp_path):
    """The units as they would be installed, with the install path this checkout."""
    shutil.copytree(UNITS, tmp_path, dirs_exist_ok=True)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            path.write_text(path.read_text().replace(INSTALLED_AT, str(ROOT)))
    return tmp_path


needs_systemd = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")


@needs_systemd
def test_systemd_finds_nothing_wrong_in_the_units(installed_here):
    units = [installed_here / name for name in ("surety.target", "surety-web.service", "surety-worker@1.service",
                                                 "surety-sweeper.service", "surety-migrate.service")]
    done = subprocess.run(["systemd-analyze", "verify", *map(str, units)], capture_output=True, text=True, timeout=60)
    # An unknown key or a bad value is only a warning to systemd: any line about these files fails.
    complaints = [line for line in (done.stdout + done.stderr).splitlines()
                  if str(installed_here) in line or re.match(r"surety[-.@\w]*: ", line)]
    assert done.returncode == 0 and not complaints, done.stdout + done.stderr


@needs_systemd
@pytest.mark.parametrize("name", ["surety-web.service", "surety-worker@1.service", "surety-sweeper.service"])
def test_systemd_rates_the_units_exposure_low(installed_here, name):
    # The score runs from 0 (locked down) to 10 (unprotected); --threshold is in tenths.
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--threshold=20", str(installed_here / name)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr


def test_the_deployment_page_names_only_settings_and_metrics_that_exist():
    page = (ROOT / "docs" / "deployment.md").read_text()
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    gunicorns = {"PORT", "WEB_CONCURRENCY"}  # gunicorn's own variables, not Surety's
    named = set(re.findall(r"`([A-Z][A-Z0-9_<>]+)[=`]", page))
    assert named and {name for name in named - gunicorns if f"`{name}`" not in configuration} == set()
    source = "\n".join(path.read_text() for app in ("ledger", "approvals", "dlq") for path in (ROOT / app).rglob("*.py"))
    metrics = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in re.findall(r"`(surety_\w+)", page)}
    assert metrics and {name for name in metrics if f'"{name}"' not in source} == set()


def test_a_production_process_started_while_redis_is_down_still_sends_its_work_to_redis():
    answers = {production: run_with_example_settings(
        "shell", "--no-imports", "-c", "from django.conf import settings; print(settings.RQ_ASYNC)", PRODUCTION=production,
        DATABASE_URL="sqlite:///:memory:", REDIS_URL="redis://127.0.0.1:1/0",  # nothing listens there
    ).stdout.strip() for production in ("true", "false")}
    # Outside production the zero-configuration default stands: no Redis, jobs in-process.
    assert answers == {"true": "True", "false": "False"}, answers
