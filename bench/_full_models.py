"""Full-size models for ``bench/models.py``, written as a PyTorch user writes them, with seeded random weights.

* ``resnet18``: ResNet-18 (224x224, BasicBlocks 64-128-256-512, batch-norm, 1000 classes);
* ``mobilenetv2``: MobileNetV2 width 1.0 (224x224, inverted residuals, depthwise 3x3, ReLU6, 1000 classes);
* ``bert``: a 2-layer BERT-style encoder (sequence 128, hidden 256, 4 heads, FFN 1024, GELU, layer norm,
  token and position embeddings), token ids in, last hidden state out.

All run batch 1 in eval mode. Each model is exported once to ONNX (what Kiln, onnxruntime and OpenVINO
read) and its weights saved beside it, so the PyTorch eager timing child rebuilds the identical module.
Batch-norm statistics are randomised too, so that folding them is not a no-op.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

MODELS = ("resnet18", "mobilenetv2", "bert")
BERT_VOCAB, BERT_SEQ, BERT_HIDDEN, BERT_HEADS, BERT_FFN, BERT_LAYERS = 8192, 128, 256, 4, 1024, 2


class BasicBlock(nn.Module):
    """ResNet's two 3x3 convolutions with a shortcut (a 1x1 convolution when the shape changes)."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        blocks, c_in = [], 64
        for c_out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(c_in, c_out, stride), BasicBlock(c_out, c_out, 1)]
            c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(torch.mean(x, dim=(2, 3)), 1))


def _conv_bn_relu6(c_in: int, c_out: int, kernel: int, stride: int, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU6(),
    )


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expansion, depthwise 3x3, 1x1 linear projection, residual when it fits."""

    def __init__(self, c_in: int, c_out: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = c_in * expand
        layers: list[nn.Module] = [_conv_bn_relu6(c_in, hidden, 1, 1)] if expand != 1 else []
        layers += [
            _conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, c_out, 1, bias=False),
            nn.BatchNorm2d(c_out),
        ]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    SETTINGS = (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn_relu6(3, 32, 3, 2)]
        c_in = 32
        for expand, c_out, repeat, stride in self.SETTINGS:
            for i in range(repeat):
                layers.append(InvertedResidual(c_in, c_out, stride if i == 0 else 1, expand))
                c_in = c_out
        layers.append(_conv_bn_relu6(c_in, 1280, 1, 1))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(1280, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(torch.mean(self.features(x), dim=(2, 3)), 1))


class EncoderLayer(nn.Module):
    """Post-norm BERT layer: self-attention, then a GELU feed-forward, each with residual and layer norm."""

    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q, self.k, self.v = (
            nn.Linear(hidden, hidden),
            nn.Linear(hidden, hidden),
            nn.Linear(hidden, hidden),
        )
        self.out = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden, eps=1e-12)
        self.ffn1, self.ffn2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=1e-12)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.reshape(batch, seq, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        context = context.permute(0, 2, 1, 3).reshape(batch, seq, hidden)
        x = self.norm1(x + self.out(context))
        return self.norm2(x + self.ffn2(nn.functional.gelu(self.ffn1(x))))


class BertEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(BERT_VOCAB, BERT_HIDDEN)
        self.positions = nn.Parameter(torch.randn(1, BERT_SEQ, BERT_HIDDEN) * 0.02)
        self.norm = nn.LayerNorm(BERT_HIDDEN, eps=1e-12)
        self.layers = nn.Sequential(
            *[EncoderLayer(BERT_HIDDEN, BERT_HEADS, BERT_FFN) for _ in range(BERT_LAYERS)]
        )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.layers(self.norm(self.tokens(input_ids) + self.positions))


def build(name: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model ``name`` in eval mode with seeded random weights (batch-norm statistics included), and an
    example input."""
    torch.manual_seed(seed)
    if name == "resnet18":
        module: nn.Module = ResNet18()
        example: tuple[torch.Tensor, ...] = (torch.randn(1, 3, 224, 224),)
    elif name == "mobilenetv2":
        module = MobileNetV2()
        example = (torch.randn(1, 3, 224, 224),)
    elif name == "bert":
        module = BertEncoder()
        example = (torch.randint(0, BERT_VOCAB, (1, BERT_SEQ)),)
    else:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.1, 0.1)
    return module.eval(), example


def export(name: str, dest_dir: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write ``name.onnx`` (opset 17) and ``name.pt`` (its weights, for the eager child) into ``dest_dir``."""
    module, example = build(name, seed)
    dest_dir.mkdir(parents=True, exist_ok=True)
    onnx_path, weights_path = dest_dir / f"{name}.onnx", dest_dir / f"{name}.pt"
    with torch.no_grad():
        # The TorchScript exporter: the torch.export-based one needs onnxscript, which Kiln does not install.
        torch.onnx.export(
            module,
            example,
            str(onnx_path),
            dynamo=False,
            opset_version=17,
            input_names=["input_ids" if name == "bert" else "x"],
            output_names=["y"],
        )
    torch.save({"name": name, "state_dict": module.state_dict()}, weights_path)
    return onnx_path, weights_path


def load(weights_path: Path) -> nn.Module:
    """The eval-mode module saved by :func:`export`."""
    saved = torch.load(weights_path, weights_only=True)
    module, _ = build(saved["name"])
    module.load_state_dict(saved["state_dict"])
    return module.eval()
