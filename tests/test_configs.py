"""Every shipped config composes and validates (as lightning-hydra-template's test_configs.py).

Each ``conf/experiment/*.yaml`` (and each point of its own sweep), the root config, and every
option of every config group is composed with Hydra's compose API and run through
``kvbench.config.validate_config``, so a broken config fails here rather than at the start of a
study. The launcher options are composed in ``test_sweeps.py`` (they need their plugins).

The Python API (``core.catalog.get_deployment``) and the Hydra app read the same files; the tests
below prove they size the same KV pool for the same names, and that neither the structured configs
nor ``core.specs.Deployment`` hold defaults of their own that could drift from the YAML.
"""

from contextlib import nullcontext
from dataclasses import MISSING as NO_DEFAULT
from dataclasses import fields, is_dataclass, replace

import pytest
from conftest import compose_config
from hydra import compose, initialize_config_module
from omegaconf import MISSING, OmegaConf

from kvbench.config import ConfigError, KvbenchConfig, validate_config
from kvbench.core.catalog import (
    DEPLOYMENT_KEYS,
    deployment_from,
    get_deployment,
    get_hardware,
    get_model,
    hardware_names,
    model_names,
)
from kvbench.core.packaged_conf import option_names, read_option
from kvbench.core.specs import Deployment
from kvbench.workloads import WorkloadConfig

EXPERIMENTS = option_names("experiment")
# Options that need a value their file cannot know: a trace workload needs its trace.
REQUIRED_OVERRIDES = {
    ("workload", "trace"): ("workload.path=traces/any.csv",),
    ("executor", "profiled"): ("executor.profile=any_profile.json",),
    ("executor", "real"): ("model=smollm2-135m", "hardware=cpu"),
}
BLOCK_SIZE = 16
# Schema fields that start empty: absent unless an experiment fills them (not settings).
EXPERIMENT_FILLED_MAPS = ("cfg.workloads", "cfg.workload_request_rates", "cfg.schedulers")


def _compose(*overrides: str, hydra_node: bool = False):
    with initialize_config_module(config_module="kvbench.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides),
                       return_hydra_config=hydra_node)  # fmt: skip


def _sweep_points(raw) -> list[str]:
    """One override per value of each parameter of the experiment's own sweep (hydra.sweeper)."""
    params = OmegaConf.select(raw, "hydra.sweeper.params") or {}
    return [f"{key}={value}" for key, values in params.items() for value in values.split(",")]


def test_every_experiment_is_found():
    assert len(EXPERIMENTS) >= 13
    assert {"vllm_fig2", "vllm_fig12", "kernel_overhead", "logit_equivalence"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_composes_and_validates(experiment):
    raw = _compose(f"experiment={experiment}", hydra_node=True)
    for override in [None, *_sweep_points(raw)]:
        point = _compose(f"experiment={experiment}", *([override] if override else []))
        typed, deployment = validate_config(point)
        assert typed.experiment_name == experiment
        assert deployment.num_kv_blocks(BLOCK_SIZE) > 0


def test_root_config_composes_and_validates():
    typed, deployment = validate_config(_compose())
    assert typed.experiment_name == "default" and typed.task == "simulate"
    assert deployment.model.name == "llama-3-8b" and deployment.num_gpus == 1
    assert deployment.num_kv_blocks(BLOCK_SIZE) > 0


@pytest.mark.parametrize(
    ("group", "option"),
    [(group, option) for group in ("workload", "allocator", "scheduler", "executor")
     for option in option_names(group)],
)  # fmt: skip
def test_group_option_composes_and_validates(group, option):
    overrides = (f"{group}={option}", *REQUIRED_OVERRIDES.get((group, option), ()))
    validate_config(_compose(*overrides))


@pytest.mark.parametrize("hardware", hardware_names())
@pytest.mark.parametrize("model", model_names())
def test_model_and_hardware_load_and_size_the_same_pool_in_python(model, hardware):
    """Every model x GPU file loads into the schema; the Python API sizes the Hydra app's pool.

    Some pairs do not fit one GPU, so the Hydra side is the deployment its composed nodes describe
    (``validate_config`` builds it the same way, then checks that it fits).
    """
    raw = _compose(f"model={model}", f"hardware={hardware}", "hardware.num_gpus=1")
    fits = not _too_big(model, hardware)
    with nullcontext() if fits else pytest.raises(ConfigError, match=r"does not fit|exceed the"):
        validate_config(raw)
    hydra_side = deployment_from(OmegaConf.to_container(raw.model, resolve=True),
                                 OmegaConf.to_container(raw.hardware, resolve=True))  # fmt: skip
    by_name = get_deployment(model, hardware)
    assert (by_name.model, by_name.hardware) == (get_model(model), get_hardware(hardware))
    for python_side in (by_name, get_deployment(model, hardware, num_gpus=1)):
        assert python_side == hydra_side
        assert python_side.num_kv_blocks(BLOCK_SIZE) == hydra_side.num_kv_blocks(BLOCK_SIZE)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_python_api_sizes_each_experiments_pool(experiment):
    """The experiment's model, GPU and deployment settings, by name, give its pool in Python
    (with the model settings an experiment overrides: sim_to_real runs SmolLM2 in fp32)."""
    raw = _compose(f"experiment={experiment}")
    typed, app_deployment = validate_config(raw)
    settings = {key: getattr(typed.hardware, key) for key in DEPLOYMENT_KEYS}
    python_side = get_deployment(typed.model.name, typed.hardware.name, **settings)
    model_overrides = {key: getattr(typed.model, key) for key in ("dtype", "max_model_len")}
    python_side = replace(python_side, model=replace(python_side.model, **model_overrides))
    assert python_side.num_kv_blocks(BLOCK_SIZE) == app_deployment.num_kv_blocks(BLOCK_SIZE)
    assert python_side == app_deployment


def test_python_deployment_defaults_are_the_hydra_apps():
    # The old drift: Deployment reserved 0.0 GiB for activations where the app reserves 1.0.
    defaults = read_option("deployment", "default")
    deployment = get_deployment("llama-3-8b", "a100-80gb")
    assert {key: getattr(deployment, key) for key in DEPLOYMENT_KEYS} == defaults
    raw = _compose()
    _, app = validate_config(raw)
    assert app.activation_reserve_gib == deployment.activation_reserve_gib == 1.0
    assert deployment.num_kv_blocks(BLOCK_SIZE) == app.num_kv_blocks(BLOCK_SIZE)
    assert deployment == app


def test_deployment_holds_no_defaults_of_its_own():
    """``conf/deployment/default.yaml`` is the one source of the deployment settings: a default
    in ``core.specs.Deployment`` would be a second one, free to drift (the old 0.0 GiB reserve)."""
    specs = fields(Deployment)
    defaulted = [
        spec.name for spec in specs
        if spec.default is not NO_DEFAULT or spec.default_factory is not NO_DEFAULT
    ]  # fmt: skip
    assert defaulted == []
    assert [spec.name for spec in specs][2:] == list(DEPLOYMENT_KEYS)


def test_a_hardware_node_without_a_deployment_setting_is_refused():
    hardware_values = {**read_option("hardware", "a100-80gb"), "num_gpus": 4}
    with pytest.raises(ValueError, match=r"hardware\.gpu_memory_utilization is not set"):
        deployment_from(read_option("model", "llama-2-70b"), hardware_values)


def test_structured_configs_hold_no_defaults_of_their_own():
    """Every schema field is MISSING (the value comes from conf/) or a nested node; the workload
    node is WorkloadConfig, whose defaults fill what a workload file omits, and the maps that only
    experiments fill start empty."""
    owned_defaults = []
    for path, node in _schema_nodes(KvbenchConfig, "cfg"):
        for spec in fields(node):
            if spec.default_factory is not NO_DEFAULT:
                nested = spec.default_factory()
                if is_dataclass(nested) or f"{path}.{spec.name}" in EXPERIMENT_FILLED_MAPS:
                    assert nested == {} or is_dataclass(nested)
                    continue
            if spec.default != MISSING:
                owned_defaults.append(f"{path}.{spec.name}")
    assert owned_defaults == []


def _schema_nodes(node, path):
    yield path, node
    for spec in fields(node):
        if spec.default_factory is NO_DEFAULT:
            continue
        nested = spec.default_factory()
        if is_dataclass(nested) and not isinstance(nested, WorkloadConfig):
            yield from _schema_nodes(type(nested), f"{path}.{spec.name}")


def _too_big(model: str, hardware: str) -> bool:
    deployment = get_deployment(model, hardware, num_gpus=1)
    return deployment.num_kv_slots < deployment.model.max_model_len


def test_report_recomputes_knees_under_the_apps_bound():
    from kvbench.tasks.report.run import DEFAULT_LATENCY_MULTIPLE

    typed, _ = validate_config(_compose())
    assert typed.knee.latency_multiple == DEFAULT_LATENCY_MULTIPLE


def test_engine_defaults_match_the_yaml():
    """The engine's own keyword defaults (kept so it stays free of config reading) must say what
    conf/executor/roofline.yaml and conf/scheduler/vllm_v0.yaml say: a guard against drift."""
    from kvbench.engine import RooflineCostModel, SchedulerLimits

    executor = read_option("executor", "roofline")
    cost_defaults = {spec.name: spec.default for spec in fields(RooflineCostModel)}
    for key in ("compute_efficiency", "bandwidth_efficiency", "pcie_efficiency",
                "iteration_overhead_s", "allreduce_latency_s"):  # fmt: skip
        assert cost_defaults[key] == executor[key], key
    scheduler = read_option("scheduler", "vllm_v0")
    limit_defaults = {spec.name: spec.default for spec in fields(SchedulerLimits)}
    for key in ("max_num_seqs", "preemption", "policy"):
        assert limit_defaults[key] == scheduler[key], key


def test_every_group_of_the_help_passes_the_override_key_check():
    from kvbench.config import check_override_keys

    check_override_keys(["deployment@hardware=default", "experiment=vllm_fig2", "hardware=l40s"])
    with pytest.raises(ConfigError, match="unknown key"):
        check_override_keys(["deployments=default"])


def test_python_workload_defaults_are_the_apps_default_workload():
    """``WorkloadConfig()`` (the Python API's default) is the workload the root config replays:
    its field defaults fill what a workload file leaves out, so they must not drift from it."""
    typed, _ = validate_config(_compose())
    assert typed.workload == WorkloadConfig()


@pytest.mark.parametrize("key", ["memory_gib", "hbm_bandwidth_gb_per_s", "peak_tflops",
                                 "pcie_gb_per_s"])
@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_a_hardware_figure_the_roofline_divides_by_must_be_positive(key, value):
    with pytest.raises(ConfigError) as caught:
        compose_config(f"hardware.{key}={value}")
    assert str(caught.value).startswith(f"hardware.{key}={float(value)}: must be a finite "
                                        "number > 0")
