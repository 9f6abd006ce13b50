"""Example networks in plain torch, with deterministic weights, and their registry.

Every network here is built from ops that both ONNX exporters and both TVM Relax importers
(``relax.frontend.onnx.from_onnx`` and ``relax.frontend.torch.from_exported_program``) handle:
conv / batch-norm / ReLU / ReLU6 / add / pooling / linear / matmul / softmax / layer-norm / GELU.
Deliberately absent: embeddings (``take``/``gather`` tasks crash MetaSchedule's measuring
process), ``nn.TransformerEncoderLayer`` (the legacy ONNX exporter fails on it) and reductions
that lower to ``aten.amax`` (not supported by the torch importer).

Contract of the registry: ``EXAMPLES[name].build()`` returns a fresh module in eval mode whose
parameters and buffers depend only on the fixed seed, so two calls (in any process) give
bit-identical weights; ``EXAMPLES[name].make_inputs(seed)`` returns a tuple of CPU tensors in
the order of the module's ``forward`` arguments, identical for equal seeds. Batch-norm layers are
kept as written (with non-trivial running statistics), never fused here: the compiler folds
them later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

WEIGHT_SEED = 0
"""Seed that fixes the weights of every example network."""


# ---------------------------------------------------------------------------------------------
# Weight initialisation helpers
# ---------------------------------------------------------------------------------------------


def _randomize_batchnorm(model: nn.Module, generator: torch.Generator) -> None:
    """Give every BatchNorm2d non-trivial affine parameters and running statistics.

    Default BN state (gamma=1, beta=0, mean=0, var=1) is nearly an identity, which would let a
    broken batch-norm lowering pass the numeric checks; random but well-conditioned values
    (variance in [0.5, 1.5], gamma in [0.5, 1.5]) make it observable without blowing up the
    activations of deep nets.
    """
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            n = module.num_features
            with torch.no_grad():
                module.weight.copy_(0.5 + torch.rand(n, generator=generator))
                module.bias.copy_(0.1 * torch.randn(n, generator=generator))
                module.running_mean.copy_(0.1 * torch.randn(n, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(n, generator=generator))


def _seeded(builder: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """Wrap ``builder`` so that it constructs under ``WEIGHT_SEED`` and returns an eval module.

    The global torch RNG state of the caller is saved and restored (``fork_rng``), so building an
    example never perturbs the caller's random stream.
    """

    def build() -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(WEIGHT_SEED)
            model = builder()
            generator = torch.Generator().manual_seed(WEIGHT_SEED + 1)
            _randomize_batchnorm(model, generator)
        return model.eval()

    build.__name__ = builder.__name__
    build.__doc__ = builder.__doc__
    return build


# ---------------------------------------------------------------------------------------------
# ResNet-18
# ---------------------------------------------------------------------------------------------


def _conv_bn(in_ch: int, out_ch: int, kernel: int, stride: int, groups: int = 1) -> nn.Sequential:
    """Conv (no bias, 'same'-style padding) followed by BatchNorm2d."""
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, kernel, stride, padding=kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_ch),
    )


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 conv-BN, ReLU between, residual add, then ReLU.

    A 1x1 strided conv-BN projects the shortcut when the stride or the width changes.
    """

    def __init__(self, in_ch: int, out_ch: int, stride: int) -> None:
        super().__init__()
        self.conv1 = _conv_bn(in_ch, out_ch, 3, stride)
        self.conv2 = _conv_bn(out_ch, out_ch, 3, 1)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = (
            _conv_bn(in_ch, out_ch, 1, stride) if stride != 1 or in_ch != out_ch else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.conv1(x))
        out = self.conv2(out)
        return self.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18: 7x7/2 stem, 3x3/2 max-pool, BasicBlock x [2, 2, 2, 2], global avg pool, FC.

    Input ``[N, 3, 224, 224]`` float32, output logits ``[N, num_classes]``.
    """

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(_conv_bn(3, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        widths = (64, 128, 256, 512)
        layers: list[nn.Module] = []
        in_ch = 64
        for i, width in enumerate(widths):
            stride = 1 if i == 0 else 2
            layers += [BasicBlock(in_ch, width, stride), BasicBlock(width, width, 1)]
            in_ch = width
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


# ---------------------------------------------------------------------------------------------
# MobileNetV2
# ---------------------------------------------------------------------------------------------


def _conv_bn_relu6(
    in_ch: int, out_ch: int, kernel: int, stride: int, groups: int = 1
) -> nn.Sequential:
    """Conv-BN followed by ReLU6."""
    return nn.Sequential(*_conv_bn(in_ch, out_ch, kernel, stride, groups), nn.ReLU6())


def _make_divisible(value: float, divisor: int = 8) -> int:
    """Round a scaled channel count to a multiple of ``divisor`` (never below 90 % of it)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand (ReLU6), 3x3 depthwise (ReLU6), 1x1 linear projection.

    The expansion conv is skipped when ``expand == 1``; the residual add is used only when the
    block keeps both the resolution (stride 1) and the width.
    """

    def __init__(self, in_ch: int, out_ch: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = in_ch * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(_conv_bn_relu6(in_ch, hidden, 1, 1))
        layers.append(_conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden))
        layers.append(_conv_bn(hidden, out_ch, 1, 1))
        self.body = nn.Sequential(*layers)
        self.use_residual = stride == 1 and in_ch == out_ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return x + out if self.use_residual else out


class MobileNetV2(nn.Module):
    """MobileNetV2 with the paper's block table and a width multiplier.

    ``width_mult=1.0`` is the standard network (3.5 M parameters); the registry uses 1.0, i.e.
    full width, not a reduced one. Input ``[N, 3, 224, 224]`` float32, output
    ``[N, num_classes]``. No dropout (eval-only network).
    """

    # (expansion t, output channels c, repeats n, first stride s), as in the paper.
    BLOCKS: tuple[tuple[int, int, int, int], ...] = (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0) -> None:
        super().__init__()
        in_ch = _make_divisible(32 * width_mult)
        last_ch = _make_divisible(1280 * max(1.0, width_mult))
        layers: list[nn.Module] = [_conv_bn_relu6(3, in_ch, 3, 2)]
        for t, c, n, s in self.BLOCKS:
            out_ch = _make_divisible(c * width_mult)
            for i in range(n):
                layers.append(InvertedResidual(in_ch, out_ch, s if i == 0 else 1, t))
                in_ch = out_ch
        layers.append(_conv_bn_relu6(in_ch, last_ch, 1, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(last_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


# ---------------------------------------------------------------------------------------------
# BERT-style encoder
# ---------------------------------------------------------------------------------------------


class SelfAttention(nn.Module):
    """Multi-head self-attention written out with matmul + softmax (no fused SDPA op).

    ``[B, S, H] -> [B, S, H]``; no mask (all positions attend to all positions).
    """

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden={hidden} is not divisible by heads={heads}")
        self.heads = heads
        self.head_dim = hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, S, H] -> [B, heads, S, head_dim]``."""
        batch, seq, _ = x.shape
        return x.reshape(batch, seq, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q = self._split_heads(self.query(x))
        k = self._split_heads(self.key(x))
        v = self._split_heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / self.head_dim**0.5)
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        context = context.permute(0, 2, 1, 3).reshape(batch, seq, hidden)
        return self.out(context)


class EncoderLayer(nn.Module):
    """Post-LN BERT encoder layer: ``LN(x + Attn(x))`` then ``LN(h + FFN(h))``, FFN with GELU."""

    def __init__(self, hidden: int, heads: int, intermediate: int) -> None:
        super().__init__()
        self.attention = SelfAttention(hidden, heads)
        self.attention_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.ffn_in = nn.Linear(hidden, intermediate)
        self.gelu = nn.GELU()
        self.ffn_out = nn.Linear(intermediate, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attention_norm(x + self.attention(x))
        return self.ffn_norm(h + self.ffn_out(self.gelu(self.ffn_in(h))))


class BertEncoder(nn.Module):
    """Stack of BERT encoder layers over float hidden states (no embedding layer).

    Input ``[N, seq, hidden]`` float32 hidden states, output the same shape. Defaults: hidden 256,
    4 heads, intermediate 1024, 2 layers (a BERT-mini-sized encoder).
    """

    def __init__(
        self, hidden: int = 256, heads: int = 4, intermediate: int = 1024, layers: int = 2
    ) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            *(EncoderLayer(hidden, heads, intermediate) for _ in range(layers))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


# ---------------------------------------------------------------------------------------------
# MLP and small CNN
# ---------------------------------------------------------------------------------------------


class MLP(nn.Module):
    """784 -> 512 -> 256 -> 10 perceptron with ReLU. Input ``[N, 784]``, output ``[N, 10]``."""

    def __init__(self, sizes: tuple[int, ...] = (784, 512, 256, 10)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(n_in, n_out))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """Tiny CNN for fast tests: 3 conv-BN-ReLU (16, 32, 32 ch; 2nd and 3rd stride 2), avg pool, FC.

    Input ``[N, 3, 32, 32]`` float32, output ``[N, 10]``.
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            *_conv_bn(3, 16, 3, 1), nn.ReLU(),
            *_conv_bn(16, 32, 3, 2), nn.ReLU(),
            *_conv_bn(32, 32, 3, 2), nn.ReLU(),
        )  # fmt: skip
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputSpec:
    """One positional input of a network: its name (used as the ONNX input name), shape, dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32


@dataclass(frozen=True)
class ExampleSpec:
    """A registered example network.

    ``builder()`` must return a fresh eval-mode module with seed-fixed weights; ``inputs`` lists
    the positional arguments of its ``forward`` in order (static shapes).
    """

    name: str
    description: str
    builder: Callable[[], nn.Module]
    inputs: tuple[InputSpec, ...]

    def build(self) -> nn.Module:
        """A fresh instance of the network, in eval mode, with deterministic weights."""
        return self.builder()

    def make_inputs(self, seed: int = 0) -> tuple[torch.Tensor, ...]:
        """Example inputs (standard normal floats) for ``forward``; identical for equal seeds.

        Uses a private generator: the global torch RNG state is left untouched.
        """
        generator = torch.Generator().manual_seed(seed)
        tensors: list[torch.Tensor] = []
        for spec in self.inputs:
            if not spec.dtype.is_floating_point:
                raise NotImplementedError(f"no sampler for input dtype {spec.dtype}")
            tensors.append(torch.randn(spec.shape, generator=generator, dtype=spec.dtype))
        return tuple(tensors)


def _spec(
    name: str, description: str, builder: Callable[[], nn.Module], *inputs: InputSpec
) -> ExampleSpec:
    return ExampleSpec(name=name, description=description, builder=_seeded(builder), inputs=inputs)


EXAMPLES: dict[str, ExampleSpec] = {
    spec.name: spec
    for spec in (
        _spec("resnet18", "ResNet-18 CNN, 224x224 RGB -> 1000 logits", ResNet18,
              InputSpec("input", (1, 3, 224, 224))),
        _spec("mobilenetv2", "MobileNetV2 (width 1.0), 224x224 RGB -> 1000 logits", MobileNetV2,
              InputSpec("input", (1, 3, 224, 224))),
        _spec("bert",
              "2-layer BERT-style encoder, hidden 256, 4 heads, seq 128 (float hidden states)",
              BertEncoder, InputSpec("hidden_states", (1, 128, 256))),
        _spec("mlp", "3-layer MLP 784-512-256-10 with ReLU", MLP, InputSpec("input", (1, 784))),
        _spec("small_cnn", "tiny 3-conv CNN, 32x32 RGB -> 10 logits (fast tests)", SmallCNN,
              InputSpec("input", (1, 3, 32, 32))),
    )
}  # fmt: skip
"""All example networks by name. Names are stable identifiers used by tests and benchmarks."""


def get_example(name: str) -> ExampleSpec:
    """The spec registered as ``name``; raises ``KeyError`` listing the known names otherwise."""
    try:
        return EXAMPLES[name]
    except KeyError:
        raise KeyError(f"unknown example {name!r}; known: {sorted(EXAMPLES)}") from None
