"""`with_recovery` keeps a distributed executor's name and config schema (no cluster needed to check that)."""

from __future__ import annotations

import pytest
from dagster import job, op, validate_run_config
from dagster_docker import docker_executor
from dagster_k8s import k8s_job_executor

from recovery_ext import with_recovery


@op
def noop():
    return 1


@pytest.mark.parametrize("executor, config", [
    (k8s_job_executor, {"job_namespace": "pipelines", "max_concurrent": 4, "step_k8s_config": {
        "container_config": {"resources": {"limits": {"memory": "2Gi"}}}}}),  # nested defaults are filled in
    (docker_executor, {"image": "example/pipelines:1", "network": "pipelines", "retries": {"enabled": {}}}),
])
def test_a_wrapped_distributed_executor_keeps_its_name_and_config_schema(executor, config):
    wrapped = with_recovery(executor)
    assert wrapped.name == executor.name
    assert wrapped.config_schema.as_field().config_type.key == executor.config_schema.as_field().config_type.key

    @job(executor_def=wrapped)
    def distributed():
        noop()

    resolved = validate_run_config(distributed, {"execution": {"config": config}})["execution"][executor.name]
    assert resolved["job_namespace" if executor is k8s_job_executor else "image"] == config[
        "job_namespace" if executor is k8s_job_executor else "image"]  # the executor's own fields pass through
    assert set(config) <= set(resolved)
    with pytest.raises(Exception, match="no_such_field"):
        validate_run_config(distributed, {"execution": {"config": {**config, "no_such_field": 1}}})


def test_executor_fences_are_one_registry_with_celery_first_and_a_user_fence_consulted_before_it():
    from dagster import in_process_executor, multiprocess_executor

    from recovery_ext import ExecutorFence, register_executor_fence
    from recovery_ext._dagster import fences
    from recovery_ext._dagster.celery_fence import CeleryFence

    plain = object()
    assert fences.fence_for(plain) is None  # an executor no fence handles runs as it is
    assert any(isinstance(f, CeleryFence) for f in fences._fences)

    class StepHandlerFence:
        """What a Kubernetes or Docker StepHandler wrapper would register: one more entry."""

        def handles(self, executor):
            return executor is plain

        def execute(self, executor, plan_context, execution_plan, scope):
            yield "fenced"

    mine = StepHandlerFence()
    assert isinstance(mine, ExecutorFence)
    register_executor_fence(mine)
    try:
        assert fences.fence_for(plain) is mine
        assert list(fences.execute_steps(plain, None, None, None)) == ["fenced"]
        assert fences.fence_for(multiprocess_executor) is None and fences.fence_for(in_process_executor) is None
        with pytest.raises(TypeError, match="not an ExecutorFence"):
            register_executor_fence(object())  # type: ignore[arg-type]
    finally:
        fences._fences.remove(mine)
