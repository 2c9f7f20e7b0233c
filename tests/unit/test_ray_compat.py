"""Ray Train as trainforge runs it (``trainforge.ray_compat``): the callbacks and the scaling
policy that would start processes for nothing, left out."""

from __future__ import annotations

import pytest
import ray.cloudpickle
from ray.train import RunConfig, ScalingConfig
from ray.train.v2._internal.execution.scaling_policy import ResizeDecision, create_scaling_policy
from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy

from trainforge import ray_compat
from trainforge.driver.workers.ray_train_backend import ProcessGroupConfig


def test_the_dropped_callbacks_are_those_that_start_processes_for_nothing() -> None:
    from ray.train.v2._internal.callbacks import BackendSetupCallback, DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import (
        PlacementGroupCleanerCallback,
    )

    trainer = ray_compat.trainer_class()(
        train_loop_per_worker=lambda: None,
        backend_config=ProcessGroupConfig(),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="callbacks"),
    )
    kinds = {type(c) for c in trainer._create_default_callbacks()}
    assert BackendSetupCallback in kinds  # the process group is still set up
    assert not kinds & {DatasetsCallback, PlacementGroupCleanerCallback}


def test_the_fixed_scaling_policy_sends_ray_data_no_request() -> None:
    # Ray's own policy makes its coordinator client at the controller's start (a detached actor
    # and a wait of up to 5 s) and cannot decide without it; this one decides alone.
    ray_policy = create_scaling_policy(
        ScalingConfig(num_workers=2, resources_per_worker={"CPU": 2})
    )
    with pytest.raises(AssertionError):  # what Ray's does with no coordinator client
        ray_policy.make_decision_for_non_running_worker_group()

    policy = ray_compat.without_autoscaling_coordinator(ray_policy)
    assert isinstance(policy, FixedScalingPolicy)
    # what the controller gets: the policy pickled by value (a class local to a function)
    policy = ray.cloudpickle.loads(ray.cloudpickle.dumps(policy))
    policy.after_controller_start(train_run_context=None)
    assert policy._coordinator_client is None
    decision = policy.make_decision_for_non_running_worker_group()
    assert decision == ResizeDecision(num_workers=2, resources_per_worker={"CPU": 2})
    policy.before_controller_abort()  # nothing to cancel, and no Ray needed to say so


def test_an_elastic_policy_keeps_its_coordinator() -> None:
    # elastic training asks the coordinator how many workers the cluster can take
    elastic = create_scaling_policy(ScalingConfig(num_workers=(1, 2)))
    assert ray_compat.without_autoscaling_coordinator(elastic) is elastic
