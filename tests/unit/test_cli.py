"""The command line (``trainforge.cli``): its commands, their one-line errors, and the checks
it runs before any Ray worker starts."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import trainforge
from trainforge import cli, config, resources
from trainforge.driver import launch
from trainforge.errors import RecipeError

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"
CIFAR10 = REPO / "recipes" / "cnn" / "cifar10_resnet18.yaml"


def _subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    return env


# --- trainforge validate -------------------------------------------------------------------


def test_validate_prints_loadable_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", str(DIGITS), "train.lr=0.05"]) == 0
    out, err = capsys.readouterr()
    printed = OmegaConf.create(out)
    expected = config.load(DIGITS, ["train.lr=0.05"])
    assert OmegaConf.to_container(printed) == config.to_container(expected)
    assert printed.train.lr == 0.05
    assert "Traceback" not in err
    assert "global batch: 64" in err  # 32 per worker × 2 workers × 1


@pytest.mark.parametrize(
    ("override", "key"),
    [("train.lrr=1", "train.lrr"), ("train.lr=0", "train.lr"), ("precision.dtype=fp8", "dtype")],
)
def test_validate_bad_override_is_one_error_line(
    capsys: pytest.CaptureFixture[str], override: str, key: str
) -> None:
    assert cli.main(["validate", str(DIGITS), override]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("trainforge: error:")
    assert key in lines[0]
    assert "Traceback" not in err


def test_overrides_after_an_option_are_overrides_and_an_unknown_option_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # argparse stops taking positionals at the first option: `-q train.lr=0.05` left the
    # override unparsed, and `sweep r.yaml --trials 4 key=value` was refused
    assert cli.main(["validate", str(DIGITS), "train.lr=0.05", "-q", "train.epochs=3"]) == 0
    printed = OmegaConf.create(capsys.readouterr().out)
    assert (printed.train.lr, printed.train.epochs) == (0.05, 3)
    with pytest.raises(SystemExit) as refused:
        cli.main(["validate", str(DIGITS), "train.lr=0.05", "--bogus"])
    assert refused.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_validate_missing_recipe_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    assert cli.main(["validate", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainforge: error:")
    assert str(missing) in err


def test_module_entry_point_reports_bad_override() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainforge", "validate", str(DIGITS), "train.lrr=1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_subprocess_env(),
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "train.lrr" in done.stderr
    assert done.stderr.startswith("trainforge: error:")
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_train_names_this_machine_where_its_own_workers_would_not_fit(tmp_path: Path) -> None:
    """With no cluster kept and none named, the command's workers would be processes of its
    own: a worker count the machine cannot hold is refused naming the machine, before any
    worker starts."""
    env = _subprocess_env() | {"TRAINFORGE_HOME": str(tmp_path / "home"),
                               "TRAINFORGE_WORKERS": "own"}  # fmt: skip
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-m", "trainforge", "train", str(DIGITS),
         "scaling.resources_per_worker.CPU=4096"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    refusal = r"^trainforge: error: scaling\.num_workers: 2 workers × 4096 CPU need 8192 CPU, but "
    assert re.search(refusal + r"this machine has \d+$", done.stderr, re.M), done.stderr
    assert "workers: starting" not in done.stdout and "Traceback" not in done.stderr
    assert list((tmp_path / "runs").glob("*")) == []  # no run folder, nothing half-written


def _closed_port() -> int:
    with socket.socket() as probe:  # bound then closed: nothing listens there afterwards
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_ray_address_nothing_answers_at_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Ray waits for a GCS that is not there without end (its own warnings once a minute): the
    command says which address it tried and what to check, and ends at once, before any run
    folder exists (`submit --address`: test_submit.py)."""
    port = _closed_port()
    env = _subprocess_env() | {"TRAINFORGE_HOME": str(tmp_path / "home"),
                               "RAY_ADDRESS": f"127.0.0.1:{port}"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "trainforge", "train", "digits_simple_cnn"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (
        f"trainforge: error: RAY_ADDRESS=127.0.0.1:{port}: no Ray cluster answers there "
        f"(Connection refused); check that its head runs (`ray status --address "
        f"127.0.0.1:{port}`), or unset RAY_ADDRESS to run on this machine\n"
    )
    assert list((tmp_path / "runs").glob("*")) == []  # no run folder, nothing half-written


def test_a_dashboard_address_in_ray_address_is_refused_naming_what_train_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`ray job submit` users export RAY_ADDRESS=http://HEAD:8265; `train` joins by the GCS."""
    from trainforge.driver import cluster

    with pytest.raises(RecipeError, match=r"is a dashboard address .* GCS address \(HOST:6379\)"):
        cluster.refuse_unreachable("http://127.0.0.1:8265")
    with pytest.raises(RecipeError, match=r"expected HOST:PORT"):
        cluster.refuse_unreachable("head-node")
    cluster.refuse_unreachable("auto")  # Ray's own lookup: nothing to check here


def test_version() -> None:
    script = shutil.which("trainforge")
    command = [script] if script else [sys.executable, "-m", "trainforge"]
    done = subprocess.run(
        [*command, "--version"],
        capture_output=True,
        text=True,
        env=_subprocess_env(),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"trainforge {trainforge.__version__}"


# --- data checks ---------------------------------------------------------------------------


def test_validate_notes_missing_data_but_succeeds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the recipe's ./data/cifar10 does not exist here
    assert cli.main(["validate", str(CIFAR10)]) == 0
    out, err = capsys.readouterr()
    assert OmegaConf.create(out).workload.dataset == "cifar10"
    assert "note" in err
    assert "workload.data_root" in err
    assert "Traceback" not in err


def test_simulate_refuses_a_recipe_without_a_simulation_stage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["simulate", str(DIGITS)]) == 2
    assert "workload.kind: cnn has no simulation stage" in capsys.readouterr().err


# --- shipped recipes by name, optional packages ----------------------------------------------


def test_recipes_lists_every_shipped_recipe_with_a_description(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines]
    assert names == list(resources.shipped_recipes())
    assert "cnn/digits_simple_cnn" in names
    digits = lines[names.index("cnn/digits_simple_cnn")]
    assert "digits" in digits.split(None, 1)[1]  # the recipe's first comment line
    cut = [line for line in lines if not line.endswith(".")]  # a line that runs on is cut
    assert cut == [], cut


@pytest.mark.parametrize("name", ["cnn/digits_simple_cnn", "digits_simple_cnn"])
def test_validate_a_shipped_recipe_by_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.chdir(tmp_path)  # no recipes/ here: the name finds the shipped one
    assert cli.main(["validate", name, "train.lr=0.05"]) == 0
    printed = OmegaConf.create(capsys.readouterr().out)
    assert printed.workload.dataset == "digits" and printed.train.lr == 0.05


def test_unknown_recipe_name_is_one_line_with_a_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["train", "digits_simple_cn"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [err.strip()]
    assert err.startswith("trainforge: error: recipe digits_simple_cn:")
    assert "did you mean 'digits_simple_cnn'?" in err


def test_sbi_recipe_without_sbi_fails_before_any_worker(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "sbi", None)  # import sbi fails as if not installed

    def must_not_run(*args: object) -> None:
        raise AssertionError("dispatched without sbi")

    monkeypatch.setattr(launch, "train", must_not_run)
    monkeypatch.setattr(launch, "simulate", must_not_run)
    for command in ("train", "simulate"):
        assert cli.main([command, "sbi/two_moons_debug"]) == 2
        err = capsys.readouterr().err
        assert err == (
            "trainforge: error: workload.kind: sbi needs the sbi package: "
            "pip install 'trainforge[sbi]'\n"
        )


def test_validate_notes_a_missing_sbi(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "sbi", None)
    assert cli.main(["validate", "sbi/two_moons_debug"]) == 0  # the recipe itself is fine
    err = capsys.readouterr().err
    assert "# note: `train` would refuse on this machine" in err
    assert "trainforge[sbi]" in err


def test_cnn_validate_and_train_path_never_import_sbi(tmp_path: Path) -> None:
    """sbi is an optional extra: a CNN user need not have it. A fresh process runs `validate`,
    then what `train` imports and builds on the driver and in a worker (short of Ray)."""
    code = """
import sys
from trainforge import cli, config
from trainforge.driver import launch, submit
from trainforge.worker import trainer
from trainforge.workloads import build_workload, check_workload_data
assert cli.main(["validate", "cnn/digits_simple_cnn"]) == 0
cfg = config.load(sys.argv[1])
cli.check_optional_modules(cfg.workload.kind)
check_workload_data(cfg.workload)
build_workload(cfg.workload, seed=0, precision=cfg.precision)
print("sbi imported:", sorted(m for m in sys.modules if m.split(".")[0] == "sbi"))
"""
    done = subprocess.run(
        [sys.executable, "-c", code, str(DIGITS)], cwd=tmp_path, env=_subprocess_env(),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "sbi imported: []"


# --- recipe errors: exit status 2 and one line naming the key, before Ray starts ------------

USER_SIMULATORS = """
import torch

def prior():
    box = torch.distributions.Uniform(-torch.ones(2), torch.ones(2))
    return torch.distributions.Independent(box, 1)

def simulate(theta):
    return theta + 0.1 * torch.randn_like(theta)

def wrong_shape(theta):
    return theta[:1]

def raises(theta):
    raise ValueError("solver diverged")
"""


def _one_error_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("trainforge: error: "), err
    assert "Traceback" not in err
    return err.removeprefix("trainforge: error: ").strip()


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """`train` must refuse before it connects to (or starts) Ray."""

    def must_not_connect(*args: object, **kwargs: object) -> None:
        raise AssertionError("connected to Ray despite a recipe error")

    monkeypatch.setattr(launch, "connect", must_not_connect)


def test_yaml_syntax_error_exits_2_with_file_line_and_column(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("run:\n  name: x\ntrain:\n  lr: [1, 2\n  epochs: 3\n")
    assert cli.main(["validate", str(recipe)]) == 2
    message = _one_error_line(capsys.readouterr().err)
    assert message.startswith(f"recipe {recipe}:5:9: YAML syntax error: ")


@pytest.fixture
def user_sim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A user's simulator module in the working directory, under a name no other test used."""
    name = f"user_sim_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(USER_SIMULATORS)
    monkeypatch.chdir(tmp_path)
    yield name
    sys.modules.pop(name, None)


def _sbi_custom(*overrides: str) -> list[str]:
    return ["validate", "sbi/two_moons_debug", "workload.task=custom", *overrides]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["workload.simulator={m}:simulate"], "workload.prior: task custom needs prior as import"),
        (["workload.prior={m}:prior"], "workload.simulator: task custom needs simulator as"),
        (
            ["workload.prior={m}:prior", "workload.simulator=no_such_module_xyz:simulate"],
            "workload.simulator: cannot import module 'no_such_module_xyz': ModuleNotFoundError",
        ),
        (
            ["workload.prior={m}:prior", "workload.simulator={m}:wrong_shape"],
            "workload.simulator: returned shape [1, 2] for 2 parameter sets; expected [2, dim_x]",
        ),
        (
            ["workload.prior={m}:prior", "workload.simulator={m}:raises"],
            "workload.simulator: failed on 2 prior draws: ValueError: solver diverged",
        ),
    ],
    ids=["no-prior", "no-simulator", "import-fails", "wrong-shape", "raises"],
)
def test_validate_exits_2_on_a_broken_custom_sbi_task(
    capsys: pytest.CaptureFixture[str], user_sim: str, overrides: list[str], expected: str
) -> None:
    pytest.importorskip("sbi")  # without sbi, validate only notes that train would refuse
    assert cli.main(_sbi_custom(*(o.format(m=user_sim) for o in overrides))) == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing printed as if the recipe were fine
    assert _one_error_line(err).startswith(expected)


def test_validate_accepts_a_working_custom_sbi_task(
    capsys: pytest.CaptureFixture[str], user_sim: str
) -> None:
    pytest.importorskip("sbi")
    args = _sbi_custom(
        f"workload.prior={user_sim}:prior", f"workload.simulator={user_sim}:simulate"
    )
    assert cli.main(args) == 0
    assert "error" not in capsys.readouterr().err


def test_unknown_torchvision_model_is_refused_before_ray(
    capsys: pytest.CaptureFixture[str], no_ray: None
) -> None:
    overrides = ["workload.model=torchvision:resnet9000", "workload.dataset=synthetic"]
    try:
        import torchvision  # noqa: F401
    except ImportError:
        # the name cannot be checked without torchvision: validate notes it, train refuses
        assert cli.main(["validate", str(DIGITS), *overrides]) == 0
        assert "# note: `train` would refuse on this machine" in capsys.readouterr().err
        expected = "workload.model='torchvision:...' needs torchvision"
    else:
        assert cli.main(["validate", str(DIGITS), *overrides]) == 2
        expected = "workload.model='torchvision:resnet9000': torchvision has no classification"
        assert _one_error_line(capsys.readouterr().err).startswith(expected)
    assert cli.main(["train", str(DIGITS), *overrides]) == 2
    assert _one_error_line(capsys.readouterr().err).startswith(expected)


def test_torchvision_model_on_one_channel_digits_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["validate", str(DIGITS), "workload.model=torchvision:resnet18"]) == 2
    message = _one_error_line(capsys.readouterr().err)
    assert message.startswith("workload.model: torchvision:resnet18 expects 3-channel (RGB)")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["train.batch_size=1000", "scaling.num_workers=2"],  # digits: 1437 train images
            "train.batch_size: 1000 is more than a worker's shard of 719 samples (1437 training "
            "samples over 2 workers)",
        ),
        (
            ["train.batch_size=400", "train.grad_accum_steps=2", "scaling.num_workers=2"],
            "train.batch_size: 400 × train.grad_accum_steps 2 is more than a worker's shard of 719",
        ),
    ],
    ids=["batch", "accumulated"],
)
def test_a_batch_larger_than_a_shard_is_refused_before_ray(
    capsys: pytest.CaptureFixture[str], no_ray: None, overrides: list[str], expected: str
) -> None:
    for command in ("validate", "train"):
        assert cli.main([command, str(DIGITS), *overrides]) == 2
        assert _one_error_line(capsys.readouterr().err).startswith(expected)
    # the largest batch that fits passes
    assert cli.main(["validate", str(DIGITS), "train.batch_size=719", "scaling.num_workers=2"]) == 0


def test_a_bad_tracking_uri_is_refused_at_validation(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", str(DIGITS), "tracking.tracking_uri=htp://nowhere"]) == 2
    message = _one_error_line(capsys.readouterr().err)
    assert message.startswith("tracking.tracking_uri: 'htp://nowhere' has scheme 'htp', which")
    assert "did you mean 'http'?" in message


def test_ui_on_a_server_that_does_not_answer_is_one_line_in_seconds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    assert cli.main(["ui", "--tracking-uri", f"http://user:secret@127.0.0.1:{port}"]) == 2
    assert time.monotonic() - started < 10
    assert _one_error_line(capsys.readouterr().err) == (
        f"--tracking-uri: no MLflow server answers at http://***@127.0.0.1:{port} (5 s); check "
        "that it is running and the host, port and http/https"
    )


def test_ui_on_a_taken_port_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        uri = f"sqlite:///{tmp_path}/mlflow.db"
        assert cli.main(["ui", "--tracking-uri", uri, "--port", str(port)]) == 2
    assert _one_error_line(capsys.readouterr().err) == (
        f"--port: {port} is taken on 127.0.0.1; pass another --port"
    )


@pytest.mark.parametrize(("command", "code"), [(["recipes"], 141), (["cluster", "status"], 1)])
def test_a_reader_gone_ends_the_output_without_a_traceback(
    command: list[str], code: int, tmp_path: Path
) -> None:
    """`trainforge recipes | head -1`: the reader closes the pipe before the command writes
    (here before it even starts); the command ends quietly, as a shell tool does."""
    env = _subprocess_env() | {"TRAINFORGE_HOME": str(tmp_path)}  # no cluster there
    process = subprocess.Popen(
        [sys.executable, "-m", "trainforge", *command], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
    )  # fmt: skip
    assert process.stdout is not None
    process.stdout.close()  # the reader is gone
    _, err = process.communicate(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert process.returncode == code  # `cluster status` still says there is none: exit 1


# --- stops that Python would drop ----------------------------------------------------------

DROPPED_STOP = """
import os, signal, sys, threading, time
from trainforge import cli

signal.signal(signal.SIGINT, signal.default_int_handler)  # the xdist worker ignores SIGINT
cli.handle_stops()
# Ray starts its processes with a preexec_fn: Python then runs the at-fork hooks, where a
# signal's exception cannot propagate. This hook holds the main thread there while it arrives.
os.register_at_fork(after_in_parent=lambda: time.sleep(1.0))
threading.Timer(0.3, os.kill, (os.getpid(), getattr(signal, sys.argv[1]))).start()
try:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(20)
    print("went on")
except cli.Terminated:
    print("terminated")
except KeyboardInterrupt:
    print("interrupted")
"""


@pytest.mark.parametrize(("stop", "said"), [("SIGINT", "interrupted"), ("SIGTERM", "terminated")])
def test_a_stop_that_lands_in_an_at_fork_hook_still_stops_the_command(stop: str, said: str) -> None:
    """Seen in CI: a Ctrl-C while Ray forked was printed as "Exception ignored in:
    <function _releaseLock>" and the run trained on to exit 0."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", DROPPED_STOP, stop], capture_output=True,
                          text=True, env=_subprocess_env(), timeout=60)  # fmt: skip
    assert done.stdout.strip() == said, done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
    assert time.monotonic() - started < 15  # stopped after the hook, not after the 20 s sleep


def test_other_dropped_exceptions_are_still_printed() -> None:
    script = (
        "import gc\nfrom trainforge import cli\ncli.handle_stops()\n"
        "class Leaky:\n    def __del__(self):\n        raise ValueError('in __del__')\n"
        "Leaky()\ngc.collect()\nprint('went on')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=_subprocess_env(), timeout=60)  # fmt: skip
    assert done.stdout.strip() == "went on"
    assert "Exception ignored" in done.stderr and "ValueError: in __del__" in done.stderr


@pytest.mark.parametrize("given", ["0", "-2", "two"])
def test_a_cluster_of_no_cpus_is_refused_in_one_line(
    given: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cluster start --num-cpus 0` would start a Ray that runs nothing (each command would
    then wait for CPUs): refused before anything starts, naming the value."""
    with pytest.raises(SystemExit) as ended:
        cli.main(["cluster", "start", "--num-cpus", given])
    assert ended.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"trainforge cluster: error: argument --num-cpus: a whole number of at least 1, "
        f"not '{given}'"
    )


@pytest.mark.parametrize("action", ["status", "stop"])
def test_cpus_given_to_another_action_than_start_are_refused(
    action: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["cluster", action, "--num-cpus", "2"]) == 2
    assert capsys.readouterr().err == (
        f"trainforge: error: --num-cpus is for `trainforge cluster start`, not `{action}`\n"
    )


def test_tracking_sync_tells_a_missing_run_folder_from_one_with_nothing_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["tracking-sync", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == (
        f"trainforge: error: no run folder {tmp_path / 'nope'} (give the folder a run wrote, "
        "runs/NAME)\n"
    )
    assert cli.main(["tracking-sync", str(tmp_path)]) == 2  # a run folder, all of it sent
    assert "nothing to sync: " in capsys.readouterr().err
