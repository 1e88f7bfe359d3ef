"""Convert one model of scripts/probe/models.jsonl to a .tflite through litert-torch.

The probe takes litekiln to models nobody here designed and that the corpus does not hold:
torchvision and timm architectures by name, and three small modules written the way users
write them (a UNet, a causal text decoder, a temporal conv net), all with seeded random
weights. Runs in the corpus virtualenv (build/corpus-venv: torch, torchvision, timm,
litert-torch), one model a process:

    build/corpus-venv/bin/python scripts/probe/convert.py OUT_DIR '<one line of models.jsonl>'

prints ``OK <out> <seconds> <parameters>`` or ``FAIL <out> <error>``. scripts/probe/run.sh
converts them all and checks each against LiteRT on PoCL.
"""

import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # scripts/: corpus_torch
sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))

import litert_torch  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from corpus_torch import build_module, randomize_constant_tensors  # noqa: E402


class UNet(nn.Module):
    """A small UNet: GroupNorm, SiLU, strided convs down, bilinear (align_corners) up, skip
    concatenations, a pixel-shuffle head."""

    def __init__(self):
        super().__init__()
        ch = [16, 32, 64]

        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.GroupNorm(4, o), nn.SiLU())

        self.inc = block(3, ch[0])
        self.d1 = nn.Sequential(nn.Conv2d(ch[0], ch[1], 3, 2, 1), block(ch[1], ch[1]))
        self.d2 = nn.Sequential(nn.Conv2d(ch[1], ch[2], 3, 2, 1), block(ch[2], ch[2]))
        self.u1 = block(ch[2] + ch[1], ch[1])
        self.u2 = block(ch[1] + ch[0], ch[0])
        self.head = nn.Conv2d(ch[0], 3 * 4, 1)
        self.ps = nn.PixelShuffle(2)

    def forward(self, x):
        a = self.inc(x)
        b = self.d1(a)
        c = self.d2(b)
        u = F.interpolate(c, scale_factor=2, mode="bilinear", align_corners=True)
        u = self.u1(torch.cat([u, b], 1))
        u = F.interpolate(u, size=a.shape[-2:], mode="bilinear", align_corners=False)
        u = self.u2(torch.cat([u, a], 1))
        return torch.sigmoid(self.ps(self.head(u)))


class Decoder(nn.Module):
    """A causal text decoder: token + learned position embeddings, 2 pre-norm blocks with a
    causal mask, tied output head, arg-max of the last token."""

    def __init__(self, vocab=512, d=96, n=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, n, d) * 0.02)
        layer = nn.TransformerEncoderLayer(
            d, 4, 192, dropout=0.0, batch_first=True, activation="gelu", norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.register_buffer("mask", torch.triu(torch.full((n, n), float("-inf")), 1))

    def forward(self, ids):
        x = self.emb(ids) + self.pos
        x = self.blocks(x, mask=self.mask, is_causal=True)
        logits = self.norm(x) @ self.emb.weight.T
        return logits[:, -1].argmax(-1), logits


class TCN(nn.Module):
    """A temporal conv net over [1, 40, 200] features: dilated causal conv1d, LayerNorm over
    channels, residuals, global average then a softmax."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(
            [nn.Conv1d(40 if i == 0 else 64, 64, 3, dilation=2**i) for i in range(4)]
        )
        self.norms = nn.ModuleList([nn.LayerNorm(64) for _ in range(4)])
        self.fc = nn.Linear(64, 12)

    def forward(self, x):
        for i, (c, n) in enumerate(zip(self.convs, self.norms, strict=False)):
            y = c(F.pad(x, (2 * 2**i, 0)))
            y = F.gelu(n(y.transpose(1, 2)).transpose(1, 2))
            x = y if i == 0 else x + y
        return F.softmax(self.fc(x.mean(-1)), -1)


class Seg(nn.Module):
    def __init__(self, name):
        super().__init__()
        import torchvision

        self.m = torchvision.models.get_model(
            name, weights=None, weights_backbone=None, num_classes=5, aux_loss=False
        )

    def forward(self, x):
        return self.m(x)["out"]


def make(spec):
    kind = spec["lib"]
    torch.manual_seed(0)
    if kind == "unet":
        m = UNet().eval()
        sample = torch.randn(1, 3, 128, 128)
    elif kind == "decoder":
        m = Decoder().eval()
        sample = torch.randint(0, 512, (1, 32))
    elif kind == "tcn":
        m = TCN().eval()
        sample = torch.randn(1, 40, 200)
    elif kind == "seg":
        m = Seg(spec["name"]).eval()
        sample = torch.randn(1, 3, 224, 224)
    else:
        m = build_module(kind, spec["name"], spec.get("kwargs", {}), 0)
        sample = torch.randn(spec.get("shape", [1, 3, 224, 224]))
    randomize_constant_tensors(m, 0)
    return m.eval(), sample


def main() -> None:
    out_dir, spec = sys.argv[1], json.loads(sys.argv[2])
    t = time.time()
    try:
        m, sample = make(spec)
        edge = litert_torch.convert(m, (sample,))
        edge.export(os.path.join(out_dir, f"{spec['out']}.tflite"))
        params = sum(p.numel() for p in m.parameters())
        print("OK", spec["out"], round(time.time() - t, 1), params)
    except Exception as e:  # noqa: BLE001 - a converter failure is a result
        print("FAIL", spec["out"], type(e).__name__, str(e)[:300])


if __name__ == "__main__":
    main()
