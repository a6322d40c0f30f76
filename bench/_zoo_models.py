"""The architectures of bench/zoo.py, built from their libraries' own constructors (torchvision, timm,
transformers) with seeded random weights, batch 1; nothing is downloaded.

torchvision's wheel on this project's registry is a CUDA build: its C++ operators (NMS, RoI align,
deformable convolution: detection only) do not load beside the CPU torch, and the package then fails on
import registering their fake kernels (``operator torchvision::nms does not exist``).
:func:`import_torchvision` declares those operators' schemas first, without kernels, so that the package
imports; the classification and segmentation models are plain PyTorch and never call them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

#: torchvision's C++ operators, by schema (torchvision/csrc/ops/*.cpp), declared when its library did not
#: load.
_TORCHVISION_OPS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels, "
    "SymInt height, SymInt width) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, "
    "SymInt width) -> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, "
    "SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
    "SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, "
    "Tensor bias, SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, "
    "SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, "
    "Tensor, Tensor)",
)
_declared: list[Any] = []  # the library object must outlive the declarations


def import_torchvision() -> Any:
    """``torchvision.models``, its C++ operators declared first where their library does not load here."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        raise ImportError("torchvision is not installed (make bench installs it)")
    if not _declared:
        try:
            torch.ops.load_library(str(Path(spec.origin).parent / "_C.so"))
        except OSError:  # a build for another torch: declare its operators, without kernels
            library = torch.library.Library("torchvision", "DEF")
            for schema in _TORCHVISION_OPS:
                library.define(schema)
            _declared.append(library)
        else:
            _declared.append(None)
    import torchvision.models

    return torchvision.models


class _Output(nn.Module):
    """A model whose forward returns one tensor: a field of its output, or its first element."""

    def __init__(self, model: nn.Module, field: str | None) -> None:
        super().__init__()
        self.model = model
        self.field = field

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        if self.field is not None:
            return out[self.field] if isinstance(out, dict) else getattr(out, self.field)
        return out


@dataclass(frozen=True)
class ZooModel:
    """One architecture: its library, how to build it, and its input."""

    library: str
    make: Callable[[], nn.Module]
    shape: tuple[int, ...]
    integer: bool = False  # token ids rather than an image
    vocabulary: int = 1000

    def build(self, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
        """The model in eval mode with seeded random weights (batch-norm statistics too, and the weights a
        constructor starts at zero) and an input."""
        torch.manual_seed(seed)
        module = self.make().eval()
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d) and m.running_mean is not None:
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
        with torch.no_grad():  # torchvision's ViT starts its head at zero: its output would be zero
            for weight in module.parameters():
                if weight.dim() >= 2 and not weight.any():
                    weight.normal_(0.0, 0.02)
        if self.integer:
            return module, torch.randint(0, self.vocabulary, self.shape)
        return module, torch.randn(*self.shape)


def _torchvision(name: str, field: str | None = None, **kwargs: Any) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        models = import_torchvision()
        return _Output(models.get_model(name, weights=None, **kwargs), field)

    return make


def _timm(name: str) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        import_torchvision()  # timm imports torchvision's transforms
        import timm

        return timm.create_model(name, pretrained=False)

    return make


def _transformers(build: Callable[[Any], nn.Module], field: str) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        import_torchvision()  # transformers imports torchvision where it is installed
        import transformers

        return _Output(build(transformers), field)

    return make


SEQ = 128  # tokens of the text models


def _text_model(build: Callable[[Any], nn.Module]) -> ZooModel:
    """A transformers encoder or decoder of ``SEQ`` token ids, its last hidden state the output."""
    return ZooModel("transformers", _transformers(build, "last_hidden_state"), (1, SEQ), integer=True)


IMAGE = (1, 3, 224, 224)

#: The architectures of issue 33's list, by name.
MODELS: dict[str, ZooModel] = {
    "resnet50": ZooModel("torchvision", _torchvision("resnet50"), IMAGE),
    "mobilenet_v3_large": ZooModel("torchvision", _torchvision("mobilenet_v3_large"), IMAGE),
    "efficientnet_b0": ZooModel("torchvision", _torchvision("efficientnet_b0"), IMAGE),
    "convnext_tiny": ZooModel("torchvision", _torchvision("convnext_tiny"), IMAGE),
    "regnet_y_400mf": ZooModel("torchvision", _torchvision("regnet_y_400mf"), IMAGE),
    "densenet121": ZooModel("torchvision", _torchvision("densenet121"), IMAGE),
    "squeezenet1_0": ZooModel("torchvision", _torchvision("squeezenet1_0"), IMAGE),
    "shufflenet_v2_x1_0": ZooModel("torchvision", _torchvision("shufflenet_v2_x1_0"), IMAGE),
    "vit_b_16": ZooModel("torchvision", _torchvision("vit_b_16"), IMAGE),
    "swin_t": ZooModel("torchvision", _torchvision("swin_t"), IMAGE),
    "deeplabv3_mobilenet_v3_large": ZooModel(
        "torchvision", _torchvision("deeplabv3_mobilenet_v3_large", "out", weights_backbone=None), IMAGE
    ),
    "mobilevit_s": ZooModel("timm", _timm("mobilevit_s"), (1, 3, 256, 256)),
    "efficientformer_l1": ZooModel("timm", _timm("efficientformer_l1"), IMAGE),
    "levit_128": ZooModel("timm", _timm("levit_128"), IMAGE),
    "bert_base": _text_model(lambda t: t.BertModel(t.BertConfig(), add_pooling_layer=False)),
    "distilbert": _text_model(lambda t: t.DistilBertModel(t.DistilBertConfig())),
    "gpt2": _text_model(lambda t: t.GPT2Model(t.GPT2Config())),
    "t5_small_encoder": _text_model(lambda t: t.T5EncoderModel(t.T5Config())),
    "vit_hf_base": ZooModel(
        "transformers",
        _transformers(lambda t: t.ViTForImageClassification(t.ViTConfig()), "logits"),
        IMAGE,
    ),
    "whisper_tiny_encoder": ZooModel(
        "transformers",
        _transformers(
            lambda t: t.WhisperModel(
                t.WhisperConfig(d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6)
            ).get_encoder(),
            "last_hidden_state",
        ),
        (1, 80, 3000),
    ),
    "llama_decoder": ZooModel(
        "transformers",
        _transformers(
            lambda t: t.LlamaModel(
                t.LlamaConfig(
                    vocab_size=32000,
                    hidden_size=512,
                    intermediate_size=1376,
                    num_hidden_layers=4,
                    num_attention_heads=8,
                    num_key_value_heads=2,
                )
            ),
            "last_hidden_state",
        ),
        (1, SEQ),
        integer=True,
    ),
}


def torchvision_models() -> list[str]:
    """Every classification and semantic-segmentation model torchvision registers (for ``--all``)."""
    models = import_torchvision()
    import torchvision.models.segmentation as segmentation

    return sorted(set(models.list_models(module=models)) | set(models.list_models(module=segmentation)))


def zoo_model(name: str) -> ZooModel:
    """The architecture ``name``: one of :data:`MODELS`, or any torchvision model by its registered name."""
    if name in MODELS:
        return MODELS[name]
    field = "out" if name.startswith(("deeplab", "fcn", "lraspp")) else None
    extra: dict[str, Any] = {"weights_backbone": None} if field else {}
    size = 299 if name == "inception_v3" else 224
    return ZooModel("torchvision", _torchvision(name, field, **extra), (1, 3, size, size))
