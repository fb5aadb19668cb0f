"""Plain PyTorch modules for zoo families that no installed library ships as a model
(a YOLO-style detector with its NMS, a DLRM-style ranker, a U-Net, recurrent taggers, ...).
Each builder returns an nn.Module in eval mode; weights come from the caller's seed."""
import torch
from torch import nn
import torch.nn.functional as F


def conv_bn_act(cin, cout, k=3, s=1, act=nn.SiLU):
    return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, bias=False), nn.BatchNorm2d(cout), act())


class CspBlock(nn.Module):
    """A CSP bottleneck (YOLOv5/v8 C2f-like): split, residual convs on one half, concat."""

    def __init__(self, c, n=1):
        super().__init__()
        self.split = conv_bn_act(c, c, 1)
        self.blocks = nn.ModuleList(nn.Sequential(conv_bn_act(c // 2, c // 2), conv_bn_act(c // 2, c // 2)) for _ in range(n))
        self.out = conv_bn_act(c // 2 * (2 + n), c, 1)

    def forward(self, x):
        a, b = self.split(x).chunk(2, dim=1)
        parts = [a, b]
        for blk in self.blocks:
            b = b + blk(b)
            parts.append(b)
        return self.out(torch.cat(parts, dim=1))


class YoloStyle(nn.Module):
    """Backbone, FPN with nearest upsampling, a decoupled head at three strides, box decoding
    and torchvision's NMS (exported as NonMaxSuppression)."""

    def __init__(self, classes=80):
        super().__init__()
        w = [32, 64, 128, 256, 512]
        self.stem = conv_bn_act(3, w[0], 3, 2)
        self.stages = nn.ModuleList(nn.Sequential(conv_bn_act(w[i], w[i + 1], 3, 2), CspBlock(w[i + 1], 1 + (i % 2))) for i in range(4))
        self.sppf = conv_bn_act(w[4], w[4], 1)
        self.lat4 = conv_bn_act(w[4] + w[3], w[3], 1)
        self.lat3 = conv_bn_act(w[3] + w[2], w[2], 1)
        self.heads = nn.ModuleList(nn.Conv2d(c, 4 + classes, 1) for c in (w[2], w[3], w[4]))
        self.classes = classes

    def forward(self, images):
        x = self.stem(images)
        feats = []
        for s in self.stages:
            x = s(x)
            feats.append(x)
        c3, c4, c5 = feats[1], feats[2], self.sppf(feats[3])
        p5 = torch.cat([c5, F.max_pool2d(c5, 5, 1, 2)], 1)[:, : c5.shape[1]]
        p4 = self.lat4(torch.cat([F.interpolate(p5, scale_factor=2.0, mode="nearest"), c4], 1))
        p3 = self.lat3(torch.cat([F.interpolate(p4, scale_factor=2.0, mode="nearest"), c3], 1))
        outs = []
        for head, p, stride in zip(self.heads, (p3, p4, p5), (8, 16, 32)):
            o = head(p)
            n, _, h, w = o.shape
            gy, gx = torch.meshgrid(torch.arange(h, dtype=o.dtype, device=o.device), torch.arange(w, dtype=o.dtype, device=o.device), indexing="ij")
            o = o.flatten(2).transpose(1, 2)
            xy = (o[..., 0:2].sigmoid() * 2 - 0.5 + torch.stack([gx, gy], -1).reshape(1, -1, 2)) * stride
            wh = o[..., 2:4].exp().clamp(max=50.0) * stride
            outs.append(torch.cat([xy - wh / 2, xy + wh / 2, o[..., 4:].sigmoid()], -1))
        pred = torch.cat(outs, 1)[0]
        scores, labels = pred[:, 4:].max(1)
        keep = torchvision_nms(pred[:, :4], scores, 0.45)[:300]
        return pred[keep, :4], scores[keep], labels[keep]


def torchvision_nms(boxes, scores, iou):
    import torchvision
    return torchvision.ops.nms(boxes, scores, iou)


class RepVggStyle(nn.Module):
    """RepVGG after reparameterisation: each train-time block (3x3 conv+BN, 1x1 conv+BN,
    identity BN) is folded into one 3x3 conv with bias, as deployment exports do."""

    def __init__(self, widths=(48, 96, 192, 384, 1280), depths=(1, 2, 4, 14, 1)):
        super().__init__()
        layers, cin = [], 3
        for w, d in zip(widths, depths):
            for i in range(d):
                layers += [self._fused(cin, w, 2 if i == 0 else 1), nn.ReLU()]
                cin = w
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, 1000)

    @staticmethod
    def _fused(cin, cout, stride):
        conv = nn.Conv2d(cin, cout, 3, stride, 1)
        with torch.no_grad():
            k3 = torch.randn(cout, cin, 3, 3) * (2.0 / (cin * 9)) ** 0.5
            k1 = torch.randn(cout, cin, 1, 1) * (2.0 / cin) ** 0.5
            k3[:, :, 1:2, 1:2] += k1
            if cin == cout and stride == 1:
                k3[:, :, 1, 1] += torch.eye(cout)
            conv.weight.copy_(k3 * 0.5)
            conv.bias.copy_(torch.randn(cout) * 0.1)
        return conv

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


class UnetStyle(nn.Module):
    """Encoder-decoder with ConvTranspose upsampling followed by BatchNorm, and skip concats."""

    def __init__(self, base=32, classes=2):
        super().__init__()
        w = [base, base * 2, base * 4, base * 8]
        self.downs = nn.ModuleList()
        cin = 3
        for c in w:
            self.downs.append(nn.Sequential(conv_bn_act(cin, c, act=nn.ReLU), conv_bn_act(c, c, act=nn.ReLU)))
            cin = c
        self.ups = nn.ModuleList(nn.Sequential(nn.ConvTranspose2d(w[i + 1], w[i], 2, 2), nn.BatchNorm2d(w[i]), nn.ReLU()) for i in reversed(range(3)))
        self.merges = nn.ModuleList(conv_bn_act(w[i] * 2, w[i], act=nn.ReLU) for i in reversed(range(3)))
        self.out = nn.Conv2d(w[0], classes, 1)

    def forward(self, x):
        skips = []
        for i, d in enumerate(self.downs):
            x = d(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        for up, merge, skip in zip(self.ups, self.merges, reversed(skips[:-1])):
            x = merge(torch.cat([up(x), skip], 1))
        return self.out(x)


class DlrmStyle(nn.Module):
    """DLRM: a bottom MLP on dense features, one embedding table per sparse feature, the
    pairwise dot-product interaction (upper triangle), and a top MLP."""

    def __init__(self, dense=13, tables=26, rows=50000, dim=32):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(dense, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        self.embeddings = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(tables))
        f = tables + 1
        self.register_buffer("pairs", torch.triu_indices(f, f, 1)[0] * f + torch.triu_indices(f, f, 1)[1])
        self.top = nn.Sequential(nn.Linear(dim + f * (f - 1) // 2, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 1), nn.Sigmoid())

    def forward(self, dense, sparse):
        x = self.bottom(dense)
        feats = torch.stack([x] + [e(sparse[:, i]) for i, e in enumerate(self.embeddings)], 1)
        inter = torch.bmm(feats, feats.transpose(1, 2)).flatten(1)[:, self.pairs]
        return self.top(torch.cat([x, inter], 1))


class TransformerEncoderModel(nn.Module):
    """torch.nn.TransformerEncoder (post-norm, GELU) over learned token and position embeddings."""

    def __init__(self, vocab=30522, d=512, layers=6, heads=8, seq=128):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, seq, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu", batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)

    def forward(self, input_ids):
        return self.norm(self.enc(self.tok(input_ids) + self.pos[:, : input_ids.shape[1]]))


class ConvSpeechEncoder(nn.Module):
    """wav2vec2-style: a strided Conv1d feature extractor (GroupNorm on the first layer, GELU),
    a projection and transformer layers."""

    def __init__(self, d=384, layers=4):
        super().__init__()
        convs, cin = [], 1
        for i, (k, s) in enumerate([(10, 5)] + [(3, 2)] * 4 + [(2, 2)] * 2):
            convs += [nn.Conv1d(cin, 256, k, s, bias=False)]
            if i == 0:
                convs += [nn.GroupNorm(256, 256)]
            convs += [nn.GELU()]
            cin = 256
        self.features = nn.Sequential(*convs)
        self.proj = nn.Sequential(nn.LayerNorm(256), nn.Linear(256, d))
        layer = nn.TransformerEncoderLayer(d, 6, 4 * d, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, audio):
        return self.enc(self.proj(self.features(audio.unsqueeze(1)).transpose(1, 2)))


class RecurrentTagger(nn.Module):
    """A two-layer bidirectional LSTM or GRU over feature frames, with a per-frame classifier."""

    def __init__(self, cell, features=80, hidden=256, classes=40):
        super().__init__()
        self.rnn = cell(features, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, classes)

    def forward(self, features):
        return self.out(self.rnn(features)[0]).log_softmax(-1)


BUILDERS = {
    "yolo_style": YoloStyle,
    "repvgg_style": RepVggStyle,
    "unet_style": UnetStyle,
    "dlrm_style": DlrmStyle,
    "transformer_encoder": TransformerEncoderModel,
    "conv_speech_encoder": ConvSpeechEncoder,
    "lstm_tagger": lambda: RecurrentTagger(nn.LSTM),
    "gru_tagger": lambda: RecurrentTagger(nn.GRU),
}
