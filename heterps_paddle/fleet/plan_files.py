"""The files the automatic path writes (fleet/auto_plan.py), where, and the rule that none of them is an input.

A job never writes over a file it was given: the plan ``heterps launch --plan`` read, the hosts file, the cluster
file, the training script or its config.  ``heterps launch`` tells every process of its job what it was given
(files.py: INPUTS_ENV); ``heterps_configs`` adds its own cluster and plan files.  An ``output_dir`` whose files would
be one of them is an error naming both, at the assignment of ``strategy.heterps_configs`` and again before the
automatic path writes anything.  The default, ``heterps_plan`` under the working directory, keeps the automatic
path's files apart from the ``plan.json`` a user hands the launch in that same directory.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from heterps_paddle.files import given_inputs, overwritten_input

DEFAULT_OUTPUT_DIR = "heterps_plan"
PLAN_FILE = "plan.json"
REPORT_FILE = "plan_report.txt"
PROFILE_FILE = "profile.yaml"
CLUSTER_FILE = "cluster.yaml"  # the cluster the plan was made for (with `local`: this machine's figures)
LAUNCH_FILE = "plan.launch"  # the id of the launch whose plan plan.json is
LOCK_FILE = ".heterps-plan.lock"
LOCAL_CLUSTER = "local"  # heterps_configs["cluster"]: describe this machine (heterps local-cluster) at plan time


def written(out_dir: str) -> dict[str, str]:
    """Every file the automatic path may write in ``out_dir`` -> what it is."""
    names = {
        PLAN_FILE: "the plan the job runs",
        REPORT_FILE: "the plan report",
        PROFILE_FILE: "the program's profile",
        CLUSTER_FILE: "the cluster the plan was made for",
        LAUNCH_FILE: "the launch's stamp",
        LOCK_FILE: "the planning lock",
    }
    return {os.path.join(out_dir, name): f"{what} ({name})" for name, what in names.items()}


def job_inputs(configs: Mapping[str, Any]) -> dict[str, str]:
    """What the job was given: the launch's inputs and ``heterps_configs``' own files."""
    inputs = given_inputs()
    if configs.get("cluster") and configs["cluster"] != LOCAL_CLUSTER:
        inputs[configs["cluster"]] = "heterps_configs['cluster']"
    if configs.get("plan"):
        inputs[configs["plan"]] = "heterps_configs['plan']"
    return inputs


def overwrites_an_input(configs: Mapping[str, Any]) -> str | None:
    """Why ``configs["output_dir"]`` cannot be used (a file the automatic path writes there is an input of the
    job), naming both; None when it can."""
    out_dir = configs.get("output_dir") or DEFAULT_OUTPUT_DIR
    why = overwritten_input(written(out_dir), job_inputs(configs))
    if why is None:
        return None
    return (
        f"strategy.heterps_configs['output_dir'] = {out_dir!r}: {why}; a job never writes over a file it was given: "
        f"give output_dir a directory of its own (the default is {DEFAULT_OUTPUT_DIR!r})"
    )
