"""Plan -> op tags: the part of splitting that happens before backward.

Paddle's heter pass (``ps/utils/public.py: find_heter_ops``) cuts block 0 wherever ``op_device`` changes,
and treats the first run of ``cpu`` ops as the CPU trainers' section.  So each stage's forward ops get a
*split tag*: ``cpu`` for stage 1, then ``gpu``, ``xpu``, ``gpu``, ... alternating so that two consecutive
heterogeneous stages are still cut apart.  The tags are markers only: once split, each section's ops are
re-tagged with the device of the process that runs them (runtime/heter_builder.py), so an ``xpu`` tag never
reaches an executor.  Backward ops copy the tag of their forward op (Paddle's ``append_backward``).
"""

from __future__ import annotations

from typing import Any

from heterps_paddle import graph_seam
from heterps_paddle.planning.model import Plan, PlanningInputError
from heterps_paddle.program.profiler import (  # the one home of "ops -> layers" (and of layer names)
    LayerGroup,
    group_layers,
)


def split_tag(stage_index: int) -> str:
    if stage_index == 1:
        return "cpu"
    return "gpu" if stage_index % 2 == 0 else "xpu"


def check_plan_against_layers(plan: Plan, layer_names: list[str]) -> None:
    """The plan must name exactly the program's layers, and stages must be contiguous runs of them."""
    planned = [name for st in plan.stages for name in st.layers]
    missing = [n for n in layer_names if n not in planned]
    unknown = [n for n in planned if n not in layer_names]
    if missing or unknown:
        raise PlanningInputError(
            f"the plan's layers do not match the program's layers {layer_names}: "
            + (f"not placed by the plan: {missing}; " if missing else "")
            + (f"not in the program: {unknown}" if unknown else "")
        )
    if planned != layer_names:
        raise PlanningInputError(
            f"stages must be contiguous runs of the program's layers in program order "
            f"{layer_names}; the plan orders them {planned}"
        )


def program_layers(program: Any, plan: Plan) -> list[LayerGroup]:
    """The program's layers, checked against ``plan`` (the same layers, in program order).

    Layers and their names come from the planning profiler's grouping, the same one that named the plan's layers,
    so a plan made by ``heterps plan`` for this model matches by construction.
    """
    try:
        layers, _ = group_layers(program)
    except ValueError as exc:
        raise PlanningInputError(f"cannot group the program into layers: {exc}") from None
    check_plan_against_layers(plan, [layer.name for layer in layers])
    return layers


def planned_layers(program: Any, plan: Plan) -> list[LayerGroup] | None:
    """What ``minimize`` passes along to the passes that read layers (the split tags: ``tag_program``; the GPU
    stage's embeddings: runtime/gpu_embedding.py), grouped and checked once per minimize; None when the plan needs
    neither (one stage on CPU trainers: the program goes to Paddle's PS optimizer unchanged)."""
    if plan.num_stages == 1 and all(stage.kind != "gpu" for stage in plan.stages):
        return None
    return program_layers(program, plan)


def tag_program(program: Any, plan: Plan, layers: list[LayerGroup] | None = None) -> dict[str, int]:
    """Set ``op_device`` of every forward op to its stage's split tag; returns layer -> stage.

    ``layers``: ``program_layers(program, plan)`` when the caller has them (grouped once per minimize).
    """
    if layers is None:
        layers = program_layers(program, plan)
    layer_stage = plan.layer_to_stage()
    ops = list(program.global_block().ops)
    for layer in layers:
        tag = split_tag(layer_stage[layer.name])
        for index in layer.op_indices:
            graph_seam.set_op_attr(ops[index], "op_device", tag)
    return layer_stage
