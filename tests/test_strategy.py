import json

import pytest
from conftest import run_python

from heterps_paddle.fleet.strategy import CONFIG_KEYS, HeterPSConfigError, validate_heterps_configs


def test_importing_the_package_does_not_import_paddle():
    result = run_python(
        "import sys, heterps_paddle, heterps_paddle.tools.cli; "
        "assert 'paddle' not in sys.modules, sorted(m for m in sys.modules if 'paddle' in m)"
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "module",
    [
        "heterps_paddle.program.profiler",
        "heterps_paddle.program.job_profile",
        "heterps_paddle.fleet.auto_plan",
        "heterps_paddle.runtime.sections",
        "heterps_paddle.fleet.evaluation",
        "heterps_paddle.data.dataset",
    ],
)
def test_a_module_that_imports_paddle_imports_after_heterps_paddle(module):
    # The fleet hook runs in the middle of `import paddle` (Paddle imports its fleet package): a module that
    # imports Paddle at its top must not be re-entered through the hook (a circular import otherwise).
    result = run_python(f"import heterps_paddle, {module}; print('ok')")
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_fields_appear_on_fleet_strategy_whichever_is_imported_first():
    for order in (
        "import heterps_paddle; import paddle.distributed.fleet as fleet",
        "import paddle.distributed.fleet as fleet; import heterps_paddle",
    ):
        result = run_python(
            order + "\ns = fleet.DistributedStrategy()\n"
            "assert s.heterps is False and s.heterps_configs['scheduler'] == 'rl'\n"
            "s.heterps = True; s.heterps_configs = {'throughput': 1000}\n"
            "import copy; c = copy.deepcopy(s)\n"
            "assert c.heterps is True and c.heterps_configs['throughput'] == 1000\n"
            "from paddle.distributed.fleet.base import meta_optimizer_factory as f\n"
            "assert 'HeterPSOptimizer' in f.meta_optimizer_names\n"
            "try:\n    s.heterps_typo = 1\nexcept TypeError as e:\n    print('REJECTED', e)\n"
        )
        assert result.returncode == 0, result.stderr
        assert "REJECTED heterps_typo is not a attribute" in result.stdout


def test_unknown_key_names_key_value_and_allowed():
    with pytest.raises(HeterPSConfigError) as err:
        validate_heterps_configs({"throughtput": 5})
    msg = str(err.value)
    assert "'throughtput'" in msg and "given 5" in msg
    for key in CONFIG_KEYS:
        assert key in msg


@pytest.mark.parametrize(
    "configs, words",
    [
        ({"throughput": "fast"}, ["'throughput'", "int or float", "str 'fast'"]),
        ({"throughput": True}, ["'throughput'", "bool True"]),
        ({"throughput": -3}, ["'throughput'", "positive"]),
        ({"throughput": float("nan")}, ["'throughput'", "positive"]),
        ({"seed": 1.5}, ["'seed'", "int", "float 1.5"]),
        ({"scheduler": "magic"}, ["'scheduler'", "rl, exact, brute, greedy, genetic", "'magic'"]),
        ({"cluster": "/nonexistent/cluster.yaml"}, ["'cluster'", "/nonexistent/cluster.yaml", "does not exist"]),
        ({"plan": 42}, ["'plan'", "str", "int 42"]),
        ([("cluster", "x")], ["must be a dict", "list"]),
    ],
)
def test_bad_values_name_key_given_and_allowed(configs, words):
    with pytest.raises(HeterPSConfigError) as err:
        validate_heterps_configs(configs)
    for word in words:
        assert word in str(err.value)


def test_local_cluster_needs_no_file():
    assert validate_heterps_configs({"cluster": "local"})["cluster"] == "local"


def test_defaults_are_filled_and_input_not_mutated():
    given = {"throughput": 5}
    full = validate_heterps_configs(given)
    assert given == {"throughput": 5}
    assert full == {**{k: v.default for k, v in CONFIG_KEYS.items()}, "throughput": 5}


def test_strategy_setters_validate():
    result = run_python(
        "import heterps_paddle, paddle.distributed.fleet as fleet\n"
        "s = fleet.DistributedStrategy()\n"
        "for bad in ('yes', 1):\n"
        "    try:\n        s.heterps = bad\n    except ValueError as e:\n        print('FLAG', e)\n"
        "try:\n    s.heterps_configs = {'bogus': 1}\nexcept ValueError as e:\n    print('CONF', e)\n"
    )
    assert result.returncode == 0, result.stderr
    assert "FLAG strategy.heterps must be a bool (True or False), got str 'yes'" in result.stdout
    assert "FLAG strategy.heterps must be a bool (True or False), got int 1" in result.stdout
    assert "CONF strategy.heterps_configs: unknown key 'bogus'" in result.stdout


def test_heterps_on_a_collective_job_is_an_error():
    result = run_python(
        "import paddle, heterps_paddle\n"
        "import paddle.distributed.fleet as fleet\n"
        "paddle.enable_static()\n"
        "fleet.init(is_collective=True)\n"
        "x = paddle.static.data('x', [None, 4], 'float32')\n"
        "loss = paddle.mean(paddle.static.nn.fc(x, 1))\n"
        "s = fleet.DistributedStrategy(); s.heterps = True\n"
        "opt = fleet.distributed_optimizer(paddle.optimizer.SGD(0.1), s)\n"
        "try:\n    opt.minimize(loss)\nexcept ValueError as e:\n    print('REFUSED', e)\n"
    )
    assert result.returncode == 0, result.stderr
    assert "REFUSED strategy.heterps = True needs a parameter-server job" in result.stdout
    assert "collective" in result.stdout


def test_the_automatic_paths_files_go_to_a_directory_of_their_own_by_default():
    full = validate_heterps_configs({})
    assert full["output_dir"] == "heterps_plan"


def test_an_output_dir_that_would_write_over_a_configured_file_is_refused_naming_both(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(
        '{"format": 1, "feasible": true, "stages": [{"resource": "cpu", "kind": "cpu", "layers": [], "units": 1}]}'
    )
    with pytest.raises(HeterPSConfigError) as err:
        validate_heterps_configs({"plan": str(plan), "output_dir": str(tmp_path)})
    message = str(err.value)
    assert "output_dir" in message and "the plan the job runs (plan.json)" in message
    assert f"would write over heterps_configs['plan'] ({plan})" in message


def test_an_output_dir_that_would_write_over_a_launch_input_is_refused_naming_both(tmp_path, monkeypatch):
    from heterps_paddle.files import INPUTS_ENV
    from heterps_paddle.launch.options import parse

    (tmp_path / "train.py").write_text("")
    (tmp_path / "config.yaml").write_text("")
    (tmp_path / "hosts.yaml").write_text("")
    (tmp_path / "plan.json").write_text("")
    monkeypatch.chdir(tmp_path)
    options = parse(["--hosts", "hosts.yaml", "--plan", "plan.json", "train.py", "-m", "config.yaml", "--out=x"])
    inputs = options.inputs()
    assert inputs == {
        str(tmp_path / "train.py"): "the training script",
        str(tmp_path / "config.yaml"): "the training script's argument 'config.yaml'",
        str(tmp_path / "plan.json"): "the plan heterps launch was given (--plan)",
        str(tmp_path / "hosts.yaml"): "the hosts file (--hosts)",
    }
    monkeypatch.setenv(INPUTS_ENV, json.dumps(inputs))
    # the old default, the working directory: plan.json there is the launch's --plan
    with pytest.raises(HeterPSConfigError) as err:
        validate_heterps_configs({"output_dir": "."})
    assert f"would write over the plan heterps launch was given (--plan) ({tmp_path / 'plan.json'})" in str(err.value)
    assert validate_heterps_configs({})["output_dir"] == "heterps_plan"  # the default writes over nothing
