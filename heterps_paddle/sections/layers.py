"""Which forward op of a static program belongs to which layer.

TEMPORARY HOME (to be unified with heterps_paddle/planning/profiler.py): the planning work owns the
grouping of a program's ops into layers, and the layer names in a plan come from it.  It had not landed
when the sections runtime was written, so this module implements the rule stated for it:

- layers are taken in program order;
- a lookup (``lookup_table``/``lookup_table_v2``) starts a *sparse* layer named after its table
  (``embedding_0`` for ``embedding_0.w_0``); lookups of the same table are one layer, and the ops that
  consume only its outputs (pooling, squeeze, the concat of the pooled slots) join it;
- an fc (``mul``/``matmul``/``matmul_v2`` with a parameter operand) starts a *dense* layer named after
  its weight (``fc_0`` for ``fc_0.w_0``); the bias ``elementwise_add`` and the activation join it;
- every other op joins the latest layer among the producers of its inputs, so the loss, the metrics
  and the mean join the last layer; ops that read only data or constants join the layer that first
  uses their output (unused ones join the layer of the op before them).

Works on a Paddle ``Program`` without importing Paddle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .plan import PlanError

LOOKUP_OPS = ("lookup_table", "lookup_table_v2")
MATMUL_OPS = ("mul", "matmul", "matmul_v2")
_FORWARD_ROLES = (0, 0x0100)  # OpRole.Forward, OpRole.Forward | OpRole.Loss


@dataclass
class Layer:
    name: str
    kind: str  # sparse | dense
    ops: list = field(default_factory=list)


def _param_prefix(name: str) -> str:
    # "fc_0.w_0" -> "fc_0", "embedding_0.w_0" -> "embedding_0"
    return name.split(".", 1)[0]


def forward_ops(block) -> list:
    """Forward ops of a block, before backward and optimizer were appended."""
    ops = []
    for op in block.ops:
        role = int(op.attr("op_role")) if op.has_attr("op_role") else 0
        if role in _FORWARD_ROLES:
            ops.append(op)
    return ops


def group_layers(program) -> list[Layer]:
    block = program.global_block()
    params = {p.name for p in program.all_parameters()}
    layers: list[Layer] = []
    by_name: dict[str, int] = {}
    producer_layer: dict[str, int] = {}  # var name -> index of the layer whose op wrote it
    last_idx = None
    sourceless = []  # (op, layer of the op before it) for ops none of whose inputs is written by a layer's op
    first_consumer: dict[str, int] = {}  # var name -> first layer reading it

    def start(name: str, kind: str) -> int:
        if name in by_name:
            return by_name[name]
        layers.append(Layer(name=name, kind=kind))
        by_name[name] = len(layers) - 1
        return by_name[name]

    for op in forward_ops(block):
        idx = None
        if op.type in LOOKUP_OPS:
            idx = start(_param_prefix(op.input("W")[0]), "sparse")
        elif op.type in MATMUL_OPS:
            weights = [n for slot in op.input_names for n in op.input(slot) if n in params]
            if weights:
                idx = start(_param_prefix(weights[0]), "dense")
        if idx is None:
            sources = [producer_layer[n] for n in op.input_arg_names if n in producer_layer]
            if sources:
                idx = max(sources)
            else:
                sourceless.append((op, last_idx))
                continue
        layers[idx].ops.append(op)
        last_idx = idx
        for n in op.output_arg_names:
            producer_layer[n] = idx
        for n in op.input_arg_names:
            first_consumer.setdefault(n, idx)
    if not layers:
        raise PlanError("the program has no layers (no lookup and no fc with a parameter): nothing to split")
    # Ops that read only data or constants (a fill_constant, a cast of the label) run where their output
    # is first used, so they do not add a boundary variable; unused ones stay with the op before them, so
    # that each stage's ops stay one contiguous run (Paddle's splitter cuts wherever the tag changes).
    for op, before in sourceless:
        consumers = [first_consumer[n] for n in op.output_arg_names if n in first_consumer]
        layers[min(consumers) if consumers else (before if before is not None else 0)].ops.append(op)
    return layers
