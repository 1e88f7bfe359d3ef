"""Convert one model of scripts/probe/models.jsonl to a .tflite through litert-torch.

The probe takes litekiln to models nobody here designed and that the corpus does not hold:
torchvision and timm architectures by name, and small modules written the way users write
them (a UNet, a causal text decoder, a temporal conv net; ``"lib": "custom"``: style transfer,
super-resolution, a VAE decoder, a spatial transformer, soft-argmax keypoints, a BiLSTM, a
tabular MLP, masked attention, top-k post-processing), all with seeded random weights. Runs
in the corpus virtualenv (build/corpus-venv: torch, torchvision, timm, litert-torch), one
model a process:

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


class StyleNet(nn.Module):
    """A fast style-transfer net: reflection padding, instance norm, residual blocks,
    nearest upsampling then a conv (not a transposed one), tanh."""

    def __init__(self):
        super().__init__()

        def conv(i, o, k, s=1):
            return nn.Sequential(nn.ReflectionPad2d(k // 2), nn.Conv2d(i, o, k, s))

        self.down = nn.Sequential(
            conv(3, 16, 9), nn.InstanceNorm2d(16, affine=True), nn.ReLU(),
            conv(16, 32, 3, 2), nn.InstanceNorm2d(32, affine=True), nn.ReLU(),
        )  # fmt: skip
        self.res = nn.ModuleList(
            nn.Sequential(conv(32, 32, 3), nn.InstanceNorm2d(32, affine=True), nn.ReLU(),
                          conv(32, 32, 3), nn.InstanceNorm2d(32, affine=True))
            for _ in range(2)
        )  # fmt: skip
        self.up = nn.Sequential(
            nn.Upsample(scale_factor=2, mode="nearest"), conv(32, 16, 3),
            nn.InstanceNorm2d(16, affine=True), nn.ReLU(), conv(16, 3, 9),
        )  # fmt: skip

    def forward(self, x):
        y = self.down(x)
        for r in self.res:
            y = y + r(y)
        return torch.tanh(self.up(y))


class ESPCN(nn.Module):
    """Super-resolution by sub-pixel convolution (x3): tanh convs, PixelShuffle."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 64, 5, padding=2), nn.Tanh(), nn.Conv2d(64, 32, 3, padding=1),
            nn.Tanh(), nn.Conv2d(32, 9, 3, padding=1), nn.PixelShuffle(3),
        )  # fmt: skip

    def forward(self, x):
        return self.body(x).clamp(0, 1)


class VAEDecoder(nn.Module):
    """A latent [1, 32] -> Linear -> [64, 4, 4] -> ConvTranspose2d x3 (BatchNorm,
    LeakyReLU) -> sigmoid image [3, 32, 32]."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64 * 4 * 4)
        layers = []
        for i, o in ((64, 32), (32, 16)):
            layers += [nn.ConvTranspose2d(i, o, 4, 2, 1), nn.BatchNorm2d(o), nn.LeakyReLU(0.2)]
        self.up = nn.Sequential(*layers, nn.ConvTranspose2d(16, 3, 4, 2, 1))

    def forward(self, z):
        return torch.sigmoid(self.up(self.fc(z).view(1, 64, 4, 4)))


class STN(nn.Module):
    """A spatial transformer: a small localisation net predicts an affine map, affine_grid
    and grid_sample warp the input, a classifier reads the warped image."""

    def __init__(self):
        super().__init__()
        self.loc = nn.Sequential(
            nn.Conv2d(1, 8, 7), nn.MaxPool2d(2), nn.ReLU(), nn.Conv2d(8, 10, 5),
            nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(10 * 3 * 3, 6),
        )  # fmt: skip
        self.cls = nn.Sequential(
            nn.Conv2d(1, 10, 5), nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(),
            nn.Linear(10 * 12 * 12, 10),
        )  # fmt: skip

    def forward(self, x):
        theta = self.loc(x).view(1, 2, 3) * 0.1 + torch.tensor([[[1.0, 0, 0], [0, 1.0, 0]]])
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        return F.log_softmax(self.cls(F.grid_sample(x, grid, align_corners=False)), -1)


class SoftArgmax(nn.Module):
    """Keypoints by soft-argmax: heatmaps, a softmax over each map's pixels, expected x and y
    against coordinate grids; also the maps' peak values."""

    def __init__(self, k=5):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1), nn.Hardswish(), nn.Conv2d(16, k, 3, 1, 1)
        )
        ys, xs = torch.meshgrid(torch.linspace(0, 1, 32), torch.linspace(0, 1, 32), indexing="ij")
        self.register_buffer("xs", xs.reshape(1, 1, -1))
        self.register_buffer("ys", ys.reshape(1, 1, -1))

    def forward(self, x):
        h = self.net(x).flatten(2)
        p = F.softmax(h * 4.0, -1)
        xy = torch.stack([(p * self.xs).sum(-1), (p * self.ys).sum(-1)], -1)
        return xy, h.amax(-1)


class BiLSTM(nn.Module):
    """nn.LSTM, two layers, bidirectional, over [1, 20, 16], then a linear tagger."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(16, 24, num_layers=2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(48, 6)

    def forward(self, x):
        return self.out(self.rnn(x)[0])


class RecurrentMix(nn.Module):
    """nn.GRU of two layers, then nn.LSTM with a projection (proj_size), over [1, 24, 12]:
    the last output and the final states through a linear head."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(12, 32, num_layers=2, batch_first=True)
        self.lstm = nn.LSTM(32, 20, batch_first=True, proj_size=8)
        self.out = nn.Linear(8 + 20, 4)

    def forward(self, x):
        h, _ = self.gru(x)
        y, (hn, cn) = self.lstm(h)
        return self.out(torch.cat([y[:, -1], cn[0]], -1))


class Tabular(nn.Module):
    """A tabular MLP: BatchNorm1d, and activations beyond ReLU (Mish, SELU, ELU, Softplus,
    Hardsigmoid, SiLU); two heads."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.BatchNorm1d(24), nn.Linear(24, 64), nn.Mish(), nn.Linear(64, 64), nn.SELU(),
            nn.Linear(64, 32), nn.ELU(), nn.Linear(32, 32), nn.Softplus(),
        )  # fmt: skip
        self.reg = nn.Linear(32, 1)
        self.cls = nn.Sequential(nn.Linear(32, 3), nn.Hardsigmoid())

    def forward(self, x):
        h = self.body(x)
        return self.reg(h) * F.silu(h).mean(-1, keepdim=True), self.cls(h)


class MaskedAttention(nn.Module):
    """nn.MultiheadAttention with a key padding mask made from the input (rows of zeros are
    padding), masked mean pooling, cumsum positions."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(12, 32)
        self.att = nn.MultiheadAttention(32, 4, batch_first=True)
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        pad = x.abs().sum(-1) < 1e-3  # [1, n]
        pos = torch.cumsum(torch.ones_like(x[..., :1]), 1) / x.shape[1]
        h = self.proj(x) + pos
        a, _ = self.att(h, h, h, key_padding_mask=pad, need_weights=False)
        keep = (~pad).float().unsqueeze(-1)
        return self.out((a * keep).sum(1) / keep.sum(1).clamp(min=1.0))


class TopK(nn.Module):
    """Detection post-processing: sigmoid scores over 500 anchors, the 10 best, their boxes
    gathered and decoded."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(16, 5)

    def forward(self, feats):
        out = self.head(feats)[0]  # [500, 5]
        scores, idx = torch.topk(torch.sigmoid(out[:, 0]), 10)
        boxes = out[idx, 1:]
        return scores, torch.cat([boxes[:, :2] - boxes[:, 2:].exp() / 2,
                                  boxes[:, :2] + boxes[:, 2:].exp() / 2], -1)  # fmt: skip


class OddPools(nn.Module):
    """An adaptive pool over a size it does not divide (windows of two sizes), F.unfold (im2col)
    then a product, torch.roll and torch.flip, bicubic upsampling."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 9, 10)

    def forward(self, x):
        y = F.relu(self.conv(x))  # [1, 8, 10, 10]
        a = F.adaptive_avg_pool2d(y, (7, 7))  # (litert-torch has no adaptive_max_pool2d)
        a = torch.roll(a, shifts=(1, -2), dims=(2, 3)) + torch.flip(a, dims=[3])
        cols = F.unfold(a, kernel_size=3, stride=2)  # [1, 72, 9]
        up = F.interpolate(a, scale_factor=2, mode="bicubic", align_corners=False)
        return self.fc(cols.transpose(1, 2)).mean(1), up


class Sequence(nn.Module):
    """A bidirectional nn.GRU, grouped Conv1d, GLU, cumsum and a cosine-similarity matrix."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(16, 32, 3, padding=1, groups=4)
        self.gru = nn.GRU(16, 12, batch_first=True, bidirectional=True)

    def forward(self, x):  # [1, 20, 16]
        c = F.glu(self.conv(x.transpose(1, 2)), dim=1).transpose(1, 2)  # [1, 20, 16]
        h, _ = self.gru(c + torch.cumsum(x, 1) / 20)
        n = F.normalize(h, dim=-1)
        return n @ n.transpose(1, 2)


#: Hand-written modules: (class, sample input).
class OddMath(nn.Module):
    """Elementwise and row math few models use: a running product (as exp of a cumsum of
    logs), atan2, fmod and remainder, L2 normalisation, logsumexp, variance, a signed power,
    PReLU, replicate padding."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(24, 24)
        self.prelu = nn.PReLU(16)  # (over dim 1: the 16 rows)

    def forward(self, x):  # [1, 16, 24]
        y = self.fc(x)
        a = torch.exp(torch.cumsum(F.logsigmoid(y), dim=-1))  # (aten.cumprod: no lowering)
        b = torch.atan2(y, x + 0.5)
        c = torch.fmod(y, 0.7) + torch.remainder(y, 0.5)
        d = F.normalize(y, dim=-1)
        e = torch.logsumexp(y, dim=-1, keepdim=True) + y.var(dim=-1, keepdim=True, unbiased=False)
        f = torch.where(y > 0, y.abs().pow(1.5), -y.abs().sqrt())
        g = F.pad(self.prelu(y).unsqueeze(0), (1, 1, 2, 2), mode="replicate")[0, :, 2:-2, 1:-1]
        return a + b + c + d + e + f + g


class OddIndex(nn.Module):
    """Indexing by computed positions: the top rows' order and a gather by it, the row maxima's
    positions and values, a gather of columns at them, a one-hot of the positions."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x):  # [1, 8, 32]
        y = self.fc(x)
        _, order = torch.topk(y, 8)  # (argsort: the converter's sort wants int32 comparators)
        ranked = torch.gather(y, -1, order)
        pos = y.argmax(-1)  # [1, 8]
        picked = torch.gather(x, -1, pos.unsqueeze(-1))  # [1, 8, 1]
        onehot = (pos.unsqueeze(-1) == torch.arange(32)).float()  # (F.one_hot asserts: no lowering)
        return ranked[..., :4] * picked + y.amax(-1, keepdim=True), onehot * y


CUSTOM = {
    "stylenet": (StyleNet, lambda: torch.randn(1, 3, 96, 96)),
    "espcn": (ESPCN, lambda: torch.rand(1, 1, 48, 48)),
    "vae_decoder": (VAEDecoder, lambda: torch.randn(1, 32)),
    "stn": (STN, lambda: torch.randn(1, 1, 28, 28)),
    "softargmax": (SoftArgmax, lambda: torch.randn(1, 3, 64, 64)),
    "bilstm": (BiLSTM, lambda: torch.randn(1, 20, 16)),
    "recurrent_mix": (RecurrentMix, lambda: torch.randn(1, 24, 12)),
    "tabular": (Tabular, lambda: torch.randn(1, 24)),
    "masked_attention": (
        MaskedAttention,
        lambda: torch.cat([torch.randn(1, 12, 12), torch.zeros(1, 4, 12)], 1),
    ),
    "topk": (TopK, lambda: torch.randn(1, 500, 16)),
    "odd_pools": (OddPools, lambda: torch.randn(1, 3, 10, 10)),
    "sequence": (Sequence, lambda: torch.randn(1, 20, 16)),
    "odd_math": (OddMath, lambda: torch.randn(1, 16, 24)),
    "odd_index": (OddIndex, lambda: torch.randn(1, 8, 32)),
}


class Seg(nn.Module):
    def __init__(self, name):
        super().__init__()
        import torchvision

        self.m = torchvision.models.get_model(
            name, weights=None, weights_backbone=None, num_classes=5, aux_loss=False
        )

    def forward(self, x):
        return self.m(x)["out"]


class HuggingFace(nn.Module):
    """``"lib": "hf"``: a Hugging Face transformers model built from its configuration class
    (``"config"`` with ``"kwargs"``, random weights: no download), returning its first output
    (``last_hidden_state``, ``logits``...), as a user exports one through litert-torch."""

    def __init__(self, spec):
        super().__init__()
        import importlib

        import transformers

        def attr(name):  # a top-level class, or a dotted path below transformers
            if "." not in name:
                return getattr(transformers, name)
            module, _, cls = name.rpartition(".")
            return getattr(importlib.import_module(f"transformers.{module}"), cls)

        config = attr(spec["config"])(**spec.get("kwargs", {}))
        self.m = attr(spec["model"])(config)

    def forward(self, x):
        out = self.m(x, return_dict=True)
        return next(iter(out.values()))


def _hf_sample(spec):
    """The sample input: token ids (``"input": "ids"``, seeded, below the vocabulary), an
    image batch or an audio signal."""
    kind, shape = spec.get("input", "image"), spec.get("shape", [1, 3, 224, 224])
    if kind == "ids":
        vocab = spec.get("kwargs", {}).get("vocab_size", 1000)
        return torch.randint(0, vocab, tuple(shape))
    return torch.randn(shape)


def make(spec):
    kind = spec["lib"]
    torch.manual_seed(0)
    if kind == "hf":
        m = HuggingFace(spec).eval()
        sample = _hf_sample(spec)
    elif kind == "unet":
        m = UNet().eval()
        sample = torch.randn(1, 3, 128, 128)
    elif kind == "decoder":
        m = Decoder().eval()
        sample = torch.randint(0, 512, (1, 32))
    elif kind == "tcn":
        m = TCN().eval()
        sample = torch.randn(1, 40, 200)
    elif kind == "custom":
        cls, sample_fn = CUSTOM[spec["name"]]
        m = cls().eval()
        sample = sample_fn()
    elif kind == "seg":
        m = Seg(spec["name"]).eval()
        sample = torch.randn(1, 3, 224, 224)
    else:
        m = build_module(kind, spec["name"], spec.get("kwargs", {}), 0)
        sample = torch.randn(spec.get("shape", [1, 3, 224, 224]))
    randomize_constant_tensors(m, 0)
    return m.eval(), sample


def quantize_aeq(out_dir: str, spec: dict) -> None:
    """``"lib": "aeq"``: a float .tflite (``"base"``, a path from the repository root)
    quantized by Google's AI Edge Quantizer with one of its recipes (``"recipe"``: dynamic or
    weight-only int8/int4 weights, static int8 or int16 activations; the static ones
    calibrated on four seeded random inputs), as a user quantizes a LiteRT model."""
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter
    from ai_edge_quantizer import quantizer, recipe

    base = os.path.join(os.path.dirname(os.path.dirname(_HERE)), spec["base"])
    qt = quantizer.Quantizer(base)
    qt.load_quantization_recipe(getattr(recipe, spec["recipe"])())
    calibration = None
    if qt.need_calibration:
        runner_of = Interpreter(model_path=base)
        key = next(iter(runner_of.get_signature_list()))
        inputs = runner_of.get_signature_runner(key).get_input_details()
        rng = np.random.default_rng(0)
        data = [
            {n: rng.uniform(-1, 1, d["shape"]).astype(d["dtype"]) for n, d in inputs.items()}
            for _ in range(4)
        ]
        calibration = qt.calibrate({key: data})
    result = qt.quantize(calibration, enable_progress_report=False)
    result.export_model(os.path.join(out_dir, f"{spec['out']}.tflite"), overwrite=True)


def main() -> None:
    out_dir, spec = sys.argv[1], json.loads(sys.argv[2])
    t = time.time()
    if spec["lib"] == "aeq":
        try:
            quantize_aeq(out_dir, spec)
            print("OK", spec["out"], round(time.time() - t, 1), "-")
        except Exception as e:  # noqa: BLE001 - a quantizer failure is a result
            print("FAIL", spec["out"], type(e).__name__, str(e)[:300])
        return
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
