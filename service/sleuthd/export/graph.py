"""A small builder for writing ONNX graphs by hand with ``onnx.helper``, shared by the exporters.

Building the graph ourselves (rather than tracing through ``torch.onnx``) keeps the exported operators
independent of the torch release and copies weights verbatim, so the same checkpoint always gives the
same bytes. Every helper here appends nodes and returns the name of its output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

OPSET = 17
IR_VERSION = 8  # readable by every ONNX Runtime release since 1.14
BN_EPS = 1e-5


class GraphBuilder:
    """Nodes and initialisers of one graph; names are generated in order, so builds are deterministic."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._count = 0

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, value: np.ndarray, hint: str = "c") -> str:
        from onnx import numpy_helper

        name = self.fresh(hint)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def ints(self, values: Sequence[int], hint: str = "i") -> str:
        return self.const(np.asarray(values, np.int64), hint)

    def op(self, op_type: str, inputs: Sequence[str], hint: str | None = None, **attrs: Any) -> str:
        from onnx import helper

        out = self.fresh(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def op_multi(self, op_type: str, inputs: Sequence[str], n_out: int, **attrs: Any) -> list[str]:
        from onnx import helper

        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, **attrs))
        return outs

    # Layers -----------------------------------------------------------------------------------

    def conv(
        self,
        x: str,
        weight: np.ndarray,
        bias: np.ndarray | None = None,
        stride: Sequence[int] | int = 1,
        padding: Sequence[int] | int = 0,
        dilation: Sequence[int] | int = 1,
        groups: int = 1,
    ) -> str:
        """Conv1d or Conv2d (from the weight's rank) with symmetric zero padding."""
        dims = weight.ndim - 2
        as_list = lambda v: [v] * dims if isinstance(v, int) else list(v)  # noqa: E731
        pads = as_list(padding)
        inputs = [x, self.const(weight.astype(np.float32), "w")]
        if bias is not None:
            inputs.append(self.const(bias.astype(np.float32), "b"))
        return self.op(
            "Conv",
            inputs,
            strides=as_list(stride),
            pads=pads + pads,
            dilations=as_list(dilation),
            group=groups,
            kernel_shape=list(weight.shape[2:]),
        )

    def batchnorm(
        self,
        x: str,
        mean: np.ndarray,
        var: np.ndarray,
        scale: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        eps: float = BN_EPS,
    ) -> str:
        """Inference-mode batch norm over axis 1 (scale 1 / bias 0 for ``affine=False``)."""
        n = len(mean)
        s = np.ones(n, np.float32) if scale is None else scale
        b = np.zeros(n, np.float32) if bias is None else bias
        args = [self.const(a.astype(np.float32), "bn") for a in (s, b, mean, var)]
        return self.op("BatchNormalization", [x, *args], epsilon=eps)

    def relu(self, x: str) -> str:
        return self.op("Relu", [x])

    def mean(self, x: str, axis: int, keepdims: int = 1) -> str:
        return self.op("ReduceMean", [x], axes=[axis], keepdims=keepdims)

    def l2_normalize(self, x: str, out_name: str) -> str:
        """Unit rows of (batch, D); an all-zero row stays zero instead of dividing by zero."""
        norm = self.op("ReduceL2", [x], axes=[1], keepdims=1)
        safe = self.op("Max", [norm, self.const(np.array([1e-12], np.float32), "eps")])
        from onnx import helper

        self.nodes.append(helper.make_node("Div", [x, safe], [out_name]))
        return out_name

    def dim(self, x: str, axis: int) -> str:
        """The size of ``x`` along ``axis`` as a (1,) int64 tensor."""
        shape = self.op("Shape", [x])
        return self.op("Gather", [shape, self.ints([axis])], axis=0)

    def model(self, name: str, inputs: Sequence[Any], outputs: Sequence[Any], producer: str = "sleuthd") -> Any:
        import onnx
        from onnx import helper

        graph = helper.make_graph(self.nodes, name, list(inputs), list(outputs), self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=producer)
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        return model


def trim_and_wrap(g: GraphBuilder, x: str) -> str:
    """Replace exact-zero padding at either end of each (batch, samples) row by repeating the row's audio.

    The window cutter pads a clip shorter than one window (and the first window's leading context)
    with zeros. A log-mel front end turns all-zero frames into log-floor outliers that then dominate
    the per-utterance mean; filling the row with its own audio keeps the features those of the speech
    (CAM++ on short FSDD turns: cosine to the unpadded turn's embedding 0.96 refilled, 0.79 zero-padded).
    A row with no zero padding is returned unchanged; an all-zero row too.
    """
    nonzero = g.op("Cast", [g.op("Greater", [g.op("Abs", [x]), g.const(np.array(0.0, np.float32))])], to=1)
    first = g.op("ArgMax", [nonzero], axis=1, keepdims=1)  # first nonzero sample; 0 for an all-zero row
    reversed_ = g.op("Slice", [nonzero, g.ints([-1]), g.ints([np.iinfo(np.int64).min]), g.ints([1]), g.ints([-1])])
    n = g.dim(x, 1)
    last = g.op("Sub", [g.op("Sub", [n, g.ints([1])]), g.op("ArgMax", [reversed_], axis=1, keepdims=1)])
    length = g.op("Add", [g.op("Sub", [last, first]), g.ints([1])])  # (batch, 1), >= 1
    positions = g.op("Range", [g.const(np.array(0, np.int64)), g.op("Squeeze", [n]), g.const(np.array(1, np.int64))])
    index = g.op("Add", [first, g.op("Mod", [g.op("Unsqueeze", [positions, g.ints([0])]), length])])
    return g.op("GatherElements", [x, index], axis=1)


def trim_and_wrap_reference(window: np.ndarray) -> np.ndarray:
    """NumPy statement of :func:`trim_and_wrap` for one row (what the references are fed)."""
    nz = np.flatnonzero(window != 0)
    if len(nz) == 0:
        return window
    core = window[nz[0] : nz[-1] + 1]
    return np.resize(core, len(window)).astype(np.float32)  # np.resize repeats the core cyclically
