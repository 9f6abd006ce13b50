"""The held-out model set: architectures TuneHub was never tuned for, from ``transformers``' own
model classes with random weights (nothing is downloaded), built at run time.

    from bench.heldout import HELDOUT, build
    model, inputs = build("resnet50", batch=1, dtype=torch.float16)

Each entry is a :class:`HeldoutModel`: a name, what it is, and a builder of the ``nn.Module``
(in eval mode, returning one tensor: the model's last hidden state, logits or feature map) with
its seeded example inputs. Batch norms get random running statistics, as a trained network's
have, so a folded batch norm is not an identity. The benchmarks that measure zero-trial and
tuned ratios against ONNX Runtime / torch on models nobody tuned for (``bench_gpu_models``,
``bench_heldout``) read this one list, so that every result names the same models.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

SEED = 0


class FirstOutput(nn.Module):
    """``model(*inputs)``'s field ``key`` (a ``transformers`` output object) as a plain tensor."""

    def __init__(self, model: nn.Module, key: str) -> None:
        super().__init__()
        self.model = model
        self.key = key

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(*inputs), self.key)


@dataclass(frozen=True)
class HeldoutModel:
    """One held-out architecture: ``make(batch)`` returns the module (fp32, eval mode) and its
    example inputs for that batch size."""

    name: str
    describe: str
    make: Callable[[int], tuple[nn.Module, tuple[torch.Tensor, ...]]]


def _randomize_batchnorm(model: nn.Module, generator: torch.Generator) -> None:
    for module in model.modules():
        if isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d):
            n = module.num_features
            module.running_mean.copy_(torch.randn(n, generator=generator) * 0.1)
            module.running_var.copy_(torch.rand(n, generator=generator) * 0.5 + 0.75)
            module.weight.data.copy_(torch.rand(n, generator=generator) * 0.5 + 0.75)
            module.bias.data.copy_(torch.randn(n, generator=generator) * 0.1)


def _image(batch: int, size: int = 224, channels: int = 3) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(SEED + 1)
    return (torch.randn(batch, channels, size, size, generator=generator),)


def _tokens(batch: int, seq: int, vocab: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(SEED + 1)
    return (torch.randint(0, vocab, (batch, seq), generator=generator),)


def _resnet(depths: list[int], layer_type: str, hidden: list[int], size: int) -> Callable:
    def make(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        from transformers import ResNetConfig, ResNetModel  # noqa: PLC0415 - heavy, on demand

        config = ResNetConfig(depths=depths, layer_type=layer_type, hidden_sizes=hidden)
        return FirstOutput(ResNetModel(config), "pooler_output"), _image(batch, size)

    return make


def _distilbert(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import DistilBertConfig, DistilBertModel  # noqa: PLC0415

    config = DistilBertConfig()
    model = FirstOutput(DistilBertModel(config), "last_hidden_state")
    return model, _tokens(batch, 128, config.vocab_size)


def _vit_small(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import ViTConfig, ViTModel  # noqa: PLC0415

    config = ViTConfig(
        hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536
    )
    return FirstOutput(ViTModel(config, add_pooling_layer=False), "last_hidden_state"), _image(
        batch
    )


def _convnext(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import ConvNextConfig, ConvNextModel  # noqa: PLC0415

    config = ConvNextConfig(depths=[2, 2, 6, 2], hidden_sizes=[64, 128, 256, 512])
    return FirstOutput(ConvNextModel(config), "pooler_output"), _image(batch)


def _gpt2(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import GPT2Config, GPT2Model  # noqa: PLC0415

    config = GPT2Config(n_layer=6)
    return FirstOutput(GPT2Model(config), "last_hidden_state"), _tokens(
        batch, 64, config.vocab_size
    )


def _whisper_encoder(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import WhisperConfig  # noqa: PLC0415
    from transformers.models.whisper.modeling_whisper import WhisperEncoder  # noqa: PLC0415

    config = WhisperConfig(
        d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536
    )
    generator = torch.Generator().manual_seed(SEED + 1)
    features = torch.randn(batch, config.num_mel_bins, 3000, generator=generator)
    return FirstOutput(WhisperEncoder(config), "last_hidden_state"), (features,)


def _segformer(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import SegformerConfig, SegformerModel  # noqa: PLC0415

    return FirstOutput(SegformerModel(SegformerConfig()), "last_hidden_state"), _image(batch, 256)


def _mobilenet_v2(batch: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import MobileNetV2Config, MobileNetV2Model  # noqa: PLC0415

    return FirstOutput(MobileNetV2Model(MobileNetV2Config()), "pooler_output"), _image(batch)


HELDOUT: tuple[HeldoutModel, ...] = (
    HeldoutModel(
        "resnet18",
        "ResNet-18 at 224² (transformers ResNetModel)",
        _resnet([2, 2, 2, 2], "basic", [64, 128, 256, 512], 224),
    ),
    HeldoutModel(
        "resnet50",
        "ResNet-50 at 224²",
        _resnet([3, 4, 6, 3], "bottleneck", [256, 512, 1024, 2048], 224),
    ),
    HeldoutModel("distilbert", "DistilBERT encoder, sequence 128", _distilbert),
    HeldoutModel("vit_small", "ViT-small (384 wide, 12 layers, 6 heads) at 224²", _vit_small),
    HeldoutModel("convnext", "ConvNeXt (depths 2-2-6-2, 64-512 wide) at 224²", _convnext),
    HeldoutModel("gpt2_6l", "GPT-2 (6 layers), sequence 64", _gpt2),
    HeldoutModel(
        "whisper_enc", "Whisper-tiny-sized encoder: conv1d stem, 1,500 frames", _whisper_encoder
    ),
    HeldoutModel("segformer", "SegFormer-B0 encoder at 256²", _segformer),
    HeldoutModel("mobilenet_v2", "MobileNetV2 at 224²", _mobilenet_v2),
)
BY_NAME = {m.name: m for m in HELDOUT}


def build(
    name: str, *, batch: int = 1, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The held-out model ``name`` (seeded random weights, batch norms randomized, eval mode)
    in ``dtype`` on ``device``, and its example inputs (floating inputs in ``dtype``).

    Raises ``KeyError`` for an unknown name."""
    entry = BY_NAME[name]
    torch.manual_seed(SEED)
    model, inputs = entry.make(batch)
    _randomize_batchnorm(model, torch.Generator().manual_seed(SEED))
    model = model.eval().to(device=device, dtype=dtype)
    cast: list[Any] = [
        x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device) for x in inputs
    ]
    return model, tuple(cast)
