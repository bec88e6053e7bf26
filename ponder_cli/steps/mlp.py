"""The reference step function: a CNN embeds the image once, an MLP steps a hidden state.

h_n = relu(W2 dropout(relu(W1 [e, h_{n-1}]))), h_0 = 0, e = CNN(x). Since e never changes,
step 1 already knows everything the later steps can know.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import pieces
from . import StepFunction

# The first convolution's input gradient, at the pace of its arithmetic ---------------------------
# The first convolution of a CNN that reads a one-channel image, with an input gradient the CPU
# computes at the pace of its arithmetic.
#
# The align step reads the image through a warp that depends on the turn, so its training needs
# the gradient w.r.t. the warped image: the transposed convolution from conv1's channels back to
# one. oneDNN computes it on the CPU far slower than conv1's weight gradient, the same arithmetic
# (batch 128, one thread, timed alone: 11.8 ms against 0.7 ms, of the encoder's 29 ms forward and
# backward). Here it is one matrix product over the channels, giving what every output position
# sends back to each of the k x k pixels it read, and k x k shifted additions that gather those
# into the pixels (1.8 ms): the same sum in another order. The forward and the weight and bias
# gradients are aten's.

def input_gradient(grad_out: torch.Tensor, weight: torch.Tensor, size: tuple) -> torch.Tensor:
    """d/dx of sum(grad_out * conv2d(x, weight)) for x of `size` (N, 1, H, W), stride 1, no
    padding: grad_out (N, C, H - k + 1, W - k + 1), weight (C, 1, k, k)."""
    channels, _, k, _ = weight.shape
    n, _, out_h, out_w = grad_out.shape
    # taps[u, v]: what every output position sends back to the pixel (u, v) away in its window;
    # (C, N * out_h * out_w) is a view of a channels_last grad_out (its channels are innermost)
    taps = weight.reshape(channels, k * k).t().matmul(grad_out.transpose(0, 1).reshape(channels, -1))
    taps = taps.view(k, k, n, out_h, out_w)
    grad = grad_out.new_zeros(n, *size[-2:])
    for u in range(k):
        for v in range(k):
            grad[:, u:u + out_h, v:v + out_w] += taps[u, v]
    return grad.unsqueeze(1)


class _ImageConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.conv2d(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        grad_x = input_gradient(grad_out, weight, x.shape) if ctx.needs_input_grad[0] else None
        _, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
            grad_out, x, weight, [weight.shape[0]] if ctx.has_bias else None, [1, 1], [0, 0], [1, 1], False, [0, 0],
            1, [False, ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]])
        return grad_x, grad_weight, grad_bias


def image_conv(conv: torch.nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """conv(x) for a one-channel, stride-1, unpadded conv: through _ImageConv where x needs a
    gradient on the CPU in float32 (cuDNN's own input gradient is fine, and under autocast
    conv2d would hand the backward bfloat16 gradients against float32 weights)."""
    if x.requires_grad and x.device.type == "cpu" and torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu"):
        return _ImageConv.apply(x, conv.weight, conv.bias)
    return conv(x)


IMAGE_SIZE = 28


def dropout_mask(shape: tuple, p: float, like: torch.Tensor) -> torch.Tensor:
    """A dropout mask of `shape`, scaled by 1/(1-p), on like's device and in its dtype."""
    keep = 1 - p
    # rand < keep draws half as slowly as bernoulli_ on the CPU
    return (torch.rand(shape, device=like.device) < keep).to(like.dtype).div_(keep)


class ImageEncoder(nn.Module):
    """Two conv/pool blocks and a linear layer, as in the reference CNN."""

    def __init__(self, kernel_size: int, out_features: int, dropout: float):
        super().__init__()
        k = kernel_size
        self.conv1 = nn.Conv2d(1, 10, kernel_size=k)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=k)
        self.conv2_drop = nn.Dropout2d(dropout)
        side = ((IMAGE_SIZE - (k - 1)) // 2 - (k - 1)) // 2
        self.fc = nn.Linear(20 * side * side, out_features)
        # channels_last halves the CPU cost of these small convolutions (oneDNN) and suits
        # tensor cores on CUDA.
        self.to(memory_format=torch.channels_last)

    @classmethod
    def of(cls, cfg) -> "ImageEncoder":
        return cls(cfg.step.kernel_size, cfg.step.hidden_cnn, cfg.step.cnn_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 1, 28, 28) -> (B, out_features)
        return self.head(self.features(x))

    def features(self, x: torch.Tensor) -> torch.Tensor:  # (B, 1, 28, 28) -> (B, 20 * side * side)
        return self.maps(x).flatten(1)

    def maps(self, x: torch.Tensor, dropout: bool = True) -> torch.Tensor:  # (B, 1, 28, 28) -> (B, 20, side, side)
        """The pooled conv2 maps; dropout=False leaves out the Dropout2d, for per-step masks."""
        x = x.contiguous(memory_format=torch.channels_last)
        x = F.relu(F.max_pool2d(image_conv(self.conv1, x), 2))
        x = self.conv2(x)
        return F.relu(F.max_pool2d(self.conv2_drop(x) if dropout else x, 2))

    def channel_masks(self, steps: int, like: torch.Tensor) -> torch.Tensor | None:
        """A fresh Dropout2d mask per step, scaled by 1/(1-p), rows first: (B, steps, 20, 1, 1);
        None in evaluation or without dropout. Dropout2d scales whole channels of conv2's output;
        max-pooling and relu commute with a non-negative per-channel scale, so masking the pooled
        maps equals masking conv2's output, and the convolutions need not run again each step."""
        if not self.training or self.conv2_drop.p == 0:
            return None
        return dropout_mask((like.shape[0], steps, self.conv2.out_channels, 1, 1), self.conv2_drop.p, like)

    def masked_heads(self, maps: torch.Tensor, channel_masks: torch.Tensor) -> torch.Tensor:
        """head((maps * channel_masks[:, n]).flatten(1)) for every step n at once: (B, steps, out).
        fc is linear in the maps, so the masks weigh each channel's share of fc (without its bias)
        instead of fc rerunning on every masked copy of the maps."""
        weight = self.fc.weight.view(self.fc.out_features, maps.shape[1], -1)  # (out, 20, side * side)
        projections = torch.einsum("bck,ock->bco", maps.flatten(2), weight)  # (B, 20, out)
        return F.relu(torch.baddbmm(self.fc.bias, channel_masks.flatten(2), projections))

    def head(self, features: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc(features))


class StepMLP(nn.Module):
    """h_n = relu(W2 dropout(relu(W1 [e, h_{n-1}]))), W1 split into its embedding and state
    columns: the embedding's share, constant across steps, is computed once per image."""

    def __init__(self, embedding: int, hidden: int, hidden_lin: int, dropout: float):
        super().__init__()
        self.from_embedding = nn.Linear(embedding, hidden_lin)
        self.from_state = nn.Linear(hidden, hidden_lin, bias=False)
        self.to_state = nn.Linear(hidden_lin, hidden)
        self.dropout = dropout
        # nn.Linear scales its init by 1/sqrt(fan_in); keep the fan-in of the unsplit layer.
        bound = 1 / math.sqrt(embedding + hidden)
        for weight in (self.from_embedding.weight, self.from_state.weight, self.from_embedding.bias):
            nn.init.uniform_(weight, -bound, bound)

    def dropout_masks(self, steps: int, batch: int, like: torch.Tensor) -> torch.Tensor | None:
        """Every step's dropout mask in one draw, scaled by 1/(1-p): (B, steps, L); None in eval."""
        if not self.training or self.dropout == 0:
            return None
        masks = dropout_mask((steps, batch, self.to_state.in_features), self.dropout, like)
        return masks.transpose(0, 1)  # rows first, for compaction

    def forward(self, embedding_part: torch.Tensor, h: torch.Tensor | None,
                dropout_mask: torch.Tensor | None = None) -> torch.Tensor:
        pre = embedding_part if h is None else embedding_part + self.from_state(h)  # h_0 = 0
        pre = F.relu(pre)
        if dropout_mask is not None:
            pre = pre * dropout_mask
        return F.relu(self.to_state(pre))  # (B, hidden)


class MLPStep(pieces.MLP, StepFunction):
    graph_safe = True

    def __init__(self, cfg, input_shape):
        super().__init__(cfg)
        self.encoder = ImageEncoder.of(cfg)
        self.mlp = StepMLP(cfg.step.hidden_cnn, cfg.step.hidden, cfg.step.hidden_lin, cfg.step.mlp_dropout)
        self.fresh_cnn_mask = cfg.step.cnn_dropout_mask == "per-step"

    def start(self, x, steps):
        if self.fresh_cnn_mask and self.training and self.encoder.conv2_drop.p > 0:
            # the convolutions run once; each step embeds them under its own channel mask
            maps = self.encoder.maps(x, dropout=False)  # (B, 20, side, side)
            channel_masks = self.encoder.channel_masks(steps, maps)  # (B, steps, 20, 1, 1)
            # one tensor per step: a step reading a slice of one (B, steps, L) tensor would cost
            # its backward pass a zero-filled gradient of the whole tensor
            embedding_parts = self.mlp.from_embedding(self.encoder.masked_heads(maps, channel_masks)).unbind(1)
        else:
            embedding_parts = (self.mlp.from_embedding(self.encoder(x)),)  # (B, L), once per image
        masks = self.mlp.dropout_masks(steps, x.shape[0], embedding_parts[0])  # (B, steps, L) or None
        return (masks, *embedding_parts), (None,)

    def forward(self, context, state, n):
        masks, *embedding_parts = context  # (B, L) each: one shared by every step, or one per step
        embedding_part = embedding_parts[n if len(embedding_parts) > 1 else 0]
        h = self.mlp(embedding_part, state[0], None if masks is None else masks[:, n])
        return (h,), h, None
