"""The first convolution of a CNN that reads a one-channel image, with an input gradient the CPU
computes at the pace of its arithmetic.

The align step reads the image through a warp that depends on the turn, so its training needs
the gradient w.r.t. the warped image: the transposed convolution from conv1's channels back to
one. oneDNN computes it on the CPU far slower than conv1's weight gradient, the same arithmetic
(batch 128, one thread, timed alone: 11.8 ms against 0.7 ms, of the encoder's 29 ms forward and
backward). Here it is one matrix product over the channels, giving what every output position
sends back to each of the k x k pixels it read, and k x k shifted additions that gather those
into the pixels (1.8 ms): the same sum in another order. The forward and the weight and bias
gradients are aten's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
