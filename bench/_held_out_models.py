"""Held-out models for bench/time_to_fast.py: real architectures from transformers' constructors (not
Kiln's own test or bench models), seeded random weights, batch 1, exported to ONNX (opset 17).

torchvision's wheels on this project's registry are CUDA builds that do not import beside the CPU torch
(``operator torchvision::nms does not exist``); transformers builds the same architectures (ResNet,
MobileNetV2, ViT) in plain PyTorch. Sizes are those of the published checkpoints where a 2-core machine
tunes them in minutes (ResNet-18, MobileNetV2-1.0, DistilBERT); the transformer stacks are shortened
(fewer layers, the published widths) so that six models fit one run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

SEQ = 128  # tokens of the text models


class _Logits(nn.Module):
    """A transformers model whose forward returns one tensor (its logits or last hidden state)."""

    def __init__(self, model: nn.Module, field: str) -> None:
        super().__init__()
        self.model = model
        self.field = field

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(x), self.field)


def _resnet18() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(
        embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic"
    )
    return _Logits(ResNetForImageClassification(config), "logits")


def _resnet50() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    return _Logits(ResNetForImageClassification(ResNetConfig()), "logits")  # the default is ResNet-50


def _mobilenet_v2() -> nn.Module:
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    # tf_padding off: TensorFlow's "same" padding is computed in the graph (Shape -> ... -> Pad), which Kiln's
    # ONNX importer does not take yet ("Dynamic pads are not supported yet"; issue 33); torchvision pads so.
    return _Logits(MobileNetV2ForImageClassification(MobileNetV2Config(tf_padding=False)), "logits")


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    # ViT-S/16's width and heads, 4 of its 12 layers.
    config = ViTConfig(hidden_size=384, num_hidden_layers=4, num_attention_heads=6, intermediate_size=1536)
    return _Logits(ViTForImageClassification(config), "logits")


def _distilbert() -> nn.Module:
    from transformers import DistilBertConfig, DistilBertModel

    return _Logits(DistilBertModel(DistilBertConfig(n_layers=3)), "last_hidden_state")  # 3 of its 6 layers


def _bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    # BERT-medium's shape (Turc et al.): 512 wide, 8 heads, 4 layers.
    config = BertConfig(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048)
    return _Logits(BertModel(config, add_pooling_layer=False), "last_hidden_state")


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2Model

    return _Logits(GPT2Model(GPT2Config(n_layer=3)), "last_hidden_state")  # 3 of GPT-2 small's 12 layers


_IMAGE = (1, 3, 224, 224)
#: name -> (constructor, input shape, integer input?)
MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], bool]] = {
    "resnet18": (_resnet18, _IMAGE, False),
    "mobilenet_v2": (_mobilenet_v2, _IMAGE, False),
    "vit_s16_4l": (_vit, _IMAGE, False),
    "bert_medium": (_bert, (1, SEQ), True),
    "distilbert_3l": (_distilbert, (1, SEQ), True),
    "gpt2_3l": (_gpt2, (1, SEQ), True),
    "resnet50": (_resnet50, _IMAGE, False),
}
DEFAULT_MODELS = ("resnet18", "mobilenet_v2", "vit_s16_4l", "bert_medium", "distilbert_3l", "gpt2_3l")


def build(name: str, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """The model ``name`` in eval mode with seeded random weights (batch-norm statistics too) and an
    example input."""
    make, shape, integer = MODELS[name]
    torch.manual_seed(seed)
    module = make().eval()
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    example = torch.randint(0, 1000, shape) if integer else torch.randn(*shape)
    return module, example


def export(name: str, dest_dir: Path, seed: int = 0) -> Path:
    """Write ``name.onnx`` into ``dest_dir`` (opset 17, the TorchScript exporter: the torch.export-based
    one needs onnxscript, which Kiln does not install)."""
    module, example = build(name, seed)
    dest_dir.mkdir(parents=True, exist_ok=True)
    return export_onnx(module, example, dest_dir / f"{name}.onnx")


def export_onnx(module: nn.Module, example: torch.Tensor, path: Path) -> Path:
    """``module`` on input ``x`` (output ``y``) written to ``path`` by the TorchScript exporter, opset 17."""
    with torch.no_grad():
        torch.onnx.export(
            module,
            (example,),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["x"],
            output_names=["y"],
        )
    return path


def describe(name: str) -> dict[str, Any]:
    """What the model is, for the report."""
    _, shape, integer = MODELS[name]
    return {"name": name, "input": list(shape), "dtype": "int64" if integer else "float32"}
