"""Build a SpeechBrain ECAPA-TDNN checkpoint folder as one ONNX graph, front end included.

The folder is what SpeechBrain's ``EncoderClassifier.from_hparams`` reads (e.g. a download of
spkrec-ecapa-voxceleb): ``hyperparams.yaml`` naming ``speechbrain.lobes.features.Fbank`` as
``compute_features``, ``speechbrain.processing.features.InputNormalization`` (sentence mean) as
``mean_var_norm`` and ``speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN`` as ``embedding_model``, plus the
``embedding_model.ckpt`` state dict. The YAML is read with plain PyYAML (its ``!new:``/``!ref`` tags
resolved here) so exporting needs torch and onnx but not speechbrain. The serving path never imports this.

    audio_windows (batch, samples) float32, 16 kHz
      -> exact-zero padding at either end refilled with the window's audio (graph.trim_and_wrap)
      -> SpeechBrain Fbank: centred STFT (zero padding n_fft // 2), periodic Hamming, power,
         triangular mel filters, 10 log10 with amin and top_db -> minus the mean over frames
      -> ECAPA-TDNN (TDNN, SE-Res2Net blocks, multi-layer aggregation, attentive statistics pooling, fc)
      -> L2 normalise
    embeddings (batch, lin_neurons) float32
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np

from sleuthd.encoders.manifest import sha256_of
from sleuthd.export.graph import OPSET, GraphBuilder, trim_and_wrap

logger = logging.getLogger(__name__)

INPUT_NAME = "audio_windows"
OUTPUT_NAME = "embeddings"
HPARAMS = "hyperparams.yaml"
WEIGHTS = "embedding_model.ckpt"
FBANK = "speechbrain.lobes.features.Fbank"
NORM = "speechbrain.processing.features.InputNormalization"
ECAPA = "speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN"
FBANK_DEFAULTS: dict[str, Any] = {
    "sample_rate": 16000, "f_min": 0, "f_max": None, "n_fft": 400, "n_mels": 40, "win_length": 25,
    "hop_length": 10, "deltas": False, "context": False, "filter_shape": "triangular", "requires_grad": False,
}  # fmt: skip
ECAPA_DEFAULTS: dict[str, Any] = {
    "lin_neurons": 192, "channels": [512, 512, 512, 512, 1536], "kernel_sizes": [5, 3, 3, 3, 1],
    "dilations": [1, 2, 3, 4, 1], "attention_channels": 128, "res2net_scale": 8, "se_channels": 128,
    "global_context": True, "groups": [1, 1, 1, 1, 1],
}  # fmt: skip
AMIN, TOP_DB = 1e-10, 80.0  # Filterbank's defaults (Fbank does not expose them)


class CheckpointError(RuntimeError):
    """The checkpoint folder is missing a file or describes a model this exporter cannot reproduce."""


# hyperparams.yaml ----------------------------------------------------------------------------------


class _Tagged(dict[str, Any]):
    """A ``!new:``/``!name:``/``!apply:`` node: the class path in ``tag`` and its arguments."""

    tag = ""


def read_hparams(folder: Path) -> dict[str, Any]:
    """The top level of ``hyperparams.yaml`` with ``!ref <key>`` resolved (plain substitution only)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
        if isinstance(node, yaml.MappingNode):
            out = _Tagged(loader.construct_mapping(node, deep=True))
        else:
            out = _Tagged()
        out.tag = suffix
        return out

    def ref(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        return ("!ref", loader.construct_scalar(node))  # type: ignore[arg-type]

    for prefix in ("!new:", "!name:", "!apply:", "!module:"):
        Loader.add_multi_constructor(prefix, tagged)
    Loader.add_constructor("!ref", ref)
    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)  # !include, !PLACEHOLDER, ...

    path = folder / HPARAMS
    try:
        top = yaml.load(path.read_text(), Loader=Loader)
    except yaml.YAMLError as exc:
        raise CheckpointError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(top, dict):
        raise CheckpointError(f"{path} does not hold a mapping of hyperparameters")

    def resolve(value: Any, depth: int = 0) -> Any:
        if depth > 20:
            raise CheckpointError(f"{path}: !ref references nest too deep (a cycle?)")
        if isinstance(value, tuple) and value[:1] == ("!ref",):
            text = value[1].strip()
            whole = re.fullmatch(r"<([\w.]+)>", text)
            if whole:
                return resolve(_lookup(top, whole.group(1), path), depth + 1)
            return re.sub(r"<([\w.]+)>", lambda m: str(resolve(_lookup(top, m.group(1), path), depth + 1)), text)
        if isinstance(value, _Tagged):
            out = _Tagged({k: resolve(v, depth + 1) for k, v in value.items()})
            out.tag = value.tag
            return out
        if isinstance(value, dict):
            return {k: resolve(v, depth + 1) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v, depth + 1) for v in value]
        return value

    return {k: resolve(v) for k, v in top.items()}


def _lookup(top: dict[str, Any], dotted: str, path: Path) -> Any:
    node: Any = top
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise CheckpointError(f"{path}: !ref <{dotted}> names no key of the file")
        node = node[part]
    return node


def _module(hp: dict[str, Any], key: str, cls: str, folder: Path) -> dict[str, Any]:
    node = hp.get(key)
    if not isinstance(node, _Tagged) or node.tag != cls:
        found = f"!new:{node.tag}" if isinstance(node, _Tagged) else repr(node)
        raise CheckpointError(f"{folder / HPARAMS}: `{key}` must be `!new:{cls}` (found {found})")
    return dict(node)


def read_checkpoint(folder: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, np.ndarray]]:
    """(Fbank options, ECAPA options, state dict) of a checkpoint folder; one message names what is wrong."""
    if not folder.is_dir():
        raise CheckpointError(f"ECAPA checkpoint folder {folder} does not exist")
    missing = [name for name in (HPARAMS, WEIGHTS) if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(
            f"ECAPA checkpoint folder {folder} lacks {' and '.join(missing)} (a SpeechBrain EncoderClassifier "
            f"folder such as spkrec-ecapa-voxceleb has {HPARAMS} and {WEIGHTS})"
        )
    hp = read_hparams(folder)
    fbank = {**FBANK_DEFAULTS, **_module(hp, "compute_features", FBANK, folder)}
    norm = _module(hp, "mean_var_norm", NORM, folder)
    ecapa = {**ECAPA_DEFAULTS, **_module(hp, "embedding_model", ECAPA, folder)}
    problems = []
    if fbank["sample_rate"] != 16000:
        problems.append(f"Fbank sample_rate {fbank['sample_rate']} (sleuthd feeds 16000 Hz)")
    for key in ("deltas", "context", "requires_grad"):
        if fbank[key]:
            problems.append(f"Fbank {key}: true")
    if fbank["filter_shape"] != "triangular":
        problems.append(f"Fbank filter_shape {fbank['filter_shape']!r}")
    if norm.get("norm_type", "global") != "sentence" or norm.get("std_norm", True):
        problems.append("mean_var_norm other than norm_type: sentence with std_norm: False")
    activation = ecapa.get("activation")
    if activation is not None and not (isinstance(activation, _Tagged) and activation.tag == "torch.nn.ReLU"):
        problems.append("an ECAPA activation other than torch.nn.ReLU")
    if problems:
        raise CheckpointError(
            f"{folder / HPARAMS} describes what this exporter cannot reproduce: {'; '.join(problems)}"
        )
    import torch

    try:
        state = torch.load(folder / WEIGHTS, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a corrupt or foreign file
        raise CheckpointError(f"{folder / WEIGHTS} is not a readable torch state dict: {exc}") from exc
    arrays = {k: v.detach().cpu().numpy() for k, v in state.items() if not k.endswith("num_batches_tracked")}
    for key in ("blocks.0.conv.conv.weight", "mfa.conv.conv.weight", "asp.conv.conv.weight", "fc.conv.weight"):
        if key not in arrays:
            raise CheckpointError(f"{folder / WEIGHTS} is not an ECAPA_TDNN state dict: it has no {key}")
    return fbank, ecapa, arrays


# Graph ---------------------------------------------------------------------------------------------


def _mel_filters(fb: dict[str, Any]) -> np.ndarray:
    """(n_fft // 2 + 1, n_mels) SpeechBrain Filterbank triangles (symmetric, half-width = the lower gap)."""
    to_mel = lambda hz: 2595.0 * np.log10(1.0 + hz / 700.0)  # noqa: E731
    f_max = fb["f_max"] if fb["f_max"] is not None else fb["sample_rate"] // 2
    mel = np.linspace(to_mel(float(fb["f_min"])), to_mel(float(f_max)), fb["n_mels"] + 2)
    hz = 700.0 * (10.0 ** (mel / 2595.0) - 1.0)
    band, central = (hz[1:] - hz[:-1])[:-1], hz[1:-1]
    freqs = np.linspace(0, fb["sample_rate"] // 2, fb["n_fft"] // 2 + 1)
    slope = (freqs[:, None] - central[None, :]) / band[None, :]
    return np.maximum(0.0, np.minimum(slope + 1.0, 1.0 - slope)).astype(np.float32)


def _stft_kernels(n_fft: int, win: int) -> np.ndarray:
    """Conv weights for a one-sided DFT of periodic-Hamming frames (torch.stft with a centred window)."""
    window = np.zeros(n_fft)
    left = (n_fft - win) // 2
    window[left : left + win] = 0.54 - 0.46 * np.cos(2 * np.pi * np.arange(win) / win)
    n, k = np.arange(n_fft), np.arange(n_fft // 2 + 1)[:, None]
    angle = 2 * np.pi * k * n / n_fft
    return np.concatenate([np.cos(angle) * window, -np.sin(angle) * window])[:, None, :].astype(np.float32)


def fbank(g: GraphBuilder, x: str, fb: dict[str, Any]) -> str:
    """(batch, samples) -> sentence-mean-normalised log-mel (batch, n_mels, frames)."""
    n_fft, rate = fb["n_fft"], fb["sample_rate"]
    hop, win = round(rate / 1000 * fb["hop_length"]), round(rate / 1000 * fb["win_length"])
    half = n_fft // 2
    padded = g.op("Pad", [x, g.ints([0, half, 0, half])], mode="constant")  # torch.stft(center=True)
    spec = g.conv(g.op("Unsqueeze", [padded, g.ints([1])]), _stft_kernels(n_fft, win), stride=hop)
    re, im = g.op_multi("Split", [spec, g.ints([half + 1, half + 1])], 2, axis=1)
    power = g.op("Add", [g.op("Mul", [re, re]), g.op("Mul", [im, im])])
    mel = g.op("MatMul", [g.op("Transpose", [power], perm=[0, 2, 1]), g.const(_mel_filters(fb), "mel")])
    db = g.op("Log", [g.op("Max", [mel, g.const(np.array([AMIN], np.float32))])])
    db = g.op("Mul", [db, g.const(np.array([10.0 / np.log(10.0)], np.float32))])  # 10 log10
    floor = g.op("Sub", [g.op("ReduceMax", [db], axes=[1, 2], keepdims=1), g.const(np.array([TOP_DB], np.float32))])
    db = g.op("Max", [db, floor])
    return g.op("Transpose", [g.op("Sub", [db, g.mean(db, axis=1)])], perm=[0, 2, 1])


def _conv_same(g: GraphBuilder, x: str, s: dict[str, np.ndarray], p: str, dilation: int = 1, groups: int = 1) -> str:
    """SpeechBrain Conv1d(padding="same", padding_mode="reflect"), stride 1."""
    w = s[f"{p}.weight"]
    pad = dilation * (w.shape[2] - 1) // 2
    if pad:
        x = g.op("Pad", [x, g.ints([0, 0, pad, 0, 0, pad])], mode="reflect")
    return g.conv(x, w, s.get(f"{p}.bias"), dilation=dilation, groups=groups)


def _tdnn(g: GraphBuilder, x: str, s: dict[str, np.ndarray], p: str, dilation: int = 1, groups: int = 1) -> str:
    """conv -> ReLU -> batch norm (SpeechBrain's TDNNBlock order)."""
    y = g.relu(_conv_same(g, x, s, f"{p}.conv.conv", dilation, groups))
    n = f"{p}.norm.norm"
    return g.batchnorm(y, s[f"{n}.running_mean"], s[f"{n}.running_var"], s[f"{n}.weight"], s[f"{n}.bias"])


def _se_res2net(
    g: GraphBuilder, x: str, s: dict[str, np.ndarray], p: str, dilation: int, scale: int, groups: int
) -> str:
    residual = (
        g.conv(x, s[f"{p}.shortcut.conv.weight"], s[f"{p}.shortcut.conv.bias"])
        if f"{p}.shortcut.conv.weight" in s
        else x
    )
    h = _tdnn(g, x, s, f"{p}.tdnn1", groups=groups)
    width = s[f"{p}.tdnn1.conv.conv.weight"].shape[0] // scale
    chunks = g.op_multi("Split", [h, g.ints([width] * scale)], scale, axis=1)
    ys: list[str] = [chunks[0]]
    for i in range(1, scale):
        inp = chunks[i] if i == 1 else g.op("Add", [chunks[i], ys[-1]])
        ys.append(_tdnn(g, inp, s, f"{p}.res2net_block.blocks.{i - 1}", dilation))
    h = _tdnn(g, g.op("Concat", ys, axis=1), s, f"{p}.tdnn2", groups=groups)
    squeeze = g.relu(
        g.conv(g.mean(h, axis=2), s[f"{p}.se_block.conv1.conv.weight"], s[f"{p}.se_block.conv1.conv.bias"])
    )
    gate = g.op("Sigmoid", [g.conv(squeeze, s[f"{p}.se_block.conv2.conv.weight"], s[f"{p}.se_block.conv2.conv.bias"])])
    return g.op("Add", [g.op("Mul", [h, gate]), residual])


def _stats(g: GraphBuilder, x: str, weights: str | None) -> tuple[str, str]:
    """Weighted mean and std over time (uniform weights when None), std clamped at 1e-12 before sqrt."""
    if weights is None:
        mean = g.mean(x, axis=2)
        var = g.mean(g.op("Mul", [g.op("Sub", [x, mean]), g.op("Sub", [x, mean])]), axis=2)
    else:
        mean = g.op("ReduceSum", [g.op("Mul", [x, weights]), g.ints([2])], keepdims=1)
        dev = g.op("Sub", [x, mean])
        var = g.op("ReduceSum", [g.op("Mul", [weights, g.op("Mul", [dev, dev])]), g.ints([2])], keepdims=1)
    std = g.op("Sqrt", [g.op("Max", [var, g.const(np.array([1e-12], np.float32))])])
    return mean, std


def _ecapa(g: GraphBuilder, x: str, s: dict[str, np.ndarray], hp: dict[str, Any]) -> str:
    dil, groups, scale = hp["dilations"], hp["groups"], hp["res2net_scale"]
    h = _tdnn(g, x, s, "blocks.0", dil[0], groups[0])
    outs = []
    for i in range(1, len(hp["channels"]) - 1):
        h = _se_res2net(g, h, s, f"blocks.{i}", dil[i], scale, groups[i])
        outs.append(h)
    h = _tdnn(g, g.op("Concat", outs, axis=1), s, "mfa", dil[-1], groups[-1])
    attn_in = h
    if hp["global_context"]:
        mean, std = _stats(g, h, None)
        shape = g.op("Shape", [h])
        attn_in = g.op("Concat", [h, g.op("Expand", [mean, shape]), g.op("Expand", [std, shape])], axis=1)
    attn = g.op("Tanh", [_tdnn(g, attn_in, s, "asp.tdnn")])
    attn = g.op("Softmax", [g.conv(attn, s["asp.conv.conv.weight"], s["asp.conv.conv.bias"])], axis=2)
    mean, std = _stats(g, h, attn)
    pooled = g.op("Squeeze", [g.op("Concat", [mean, std], axis=1), g.ints([2])])  # (batch, 2C)
    n = "asp_bn.norm"
    pooled = g.batchnorm(pooled, s[f"{n}.running_mean"], s[f"{n}.running_var"], s[f"{n}.weight"], s[f"{n}.bias"])
    w = s["fc.conv.weight"][:, :, 0].astype(np.float32)
    return g.op("Gemm", [pooled, g.const(w), g.const(s["fc.conv.bias"].astype(np.float32))], transB=1)


def build_graph(fb: dict[str, Any], hp: dict[str, Any], state: dict[str, np.ndarray]) -> Any:
    from onnx import TensorProto, helper

    g = GraphBuilder()
    feats = fbank(g, trim_and_wrap(g, INPUT_NAME), fb)
    emb = _ecapa(g, feats, state, hp)
    g.l2_normalize(emb, OUTPUT_NAME)
    size = int(state["fc.conv.weight"].shape[0])
    return g.model(
        "ecapa_tdnn_speaker_encoder",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", "samples"])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", size])],
    )


def export(folder: Path, out_path: Path) -> dict[str, Any]:
    """Write the graph for a checkpoint folder; returns facts for the manifest."""
    import onnx

    fb, hp, state = read_checkpoint(folder)
    model = build_graph(fb, hp, state)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out_path))
    from importlib.metadata import version

    logger.info("wrote %s from %s", out_path, folder)
    return {
        "checkpoint": str(folder.resolve()),
        "file": WEIGHTS,
        "file_sha256": sha256_of(folder / WEIGHTS),
        "hparams_sha256": sha256_of(folder / HPARAMS),
        "embedding_size": int(state["fc.conv.weight"].shape[0]),
        "n_mels": int(fb["n_mels"]),
        "exporter": f"sleuthd onnx.helper graph, onnx {version('onnx')}, opset {OPSET}",
    }
