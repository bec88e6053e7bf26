"""The first convolution's input gradient (steps/mlp.py (`image_conv`)): the sum aten computes, in another order."""

import torch

from ponder_cli.steps.mlp import _ImageConv, image_conv, input_gradient
from ponder_cli.steps.mlp import ImageEncoder


def test_input_gradient_by_hand():
    # a 3x3 image, one 2x2 kernel, an upstream gradient of ones at the four output positions:
    # each pixel gets the sum of the kernel weights that read it
    weight = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).view(1, 1, 2, 2)
    grad = input_gradient(torch.ones(1, 1, 2, 2), weight, (1, 1, 3, 3))
    assert grad.view(3, 3).tolist() == [[1.0, 3.0, 2.0], [4.0, 10.0, 6.0], [3.0, 7.0, 4.0]]


def test_input_gradient_is_atens_in_float64():
    torch.manual_seed(0)
    weight, grad_out = torch.randn(10, 1, 5, 5, dtype=torch.float64), torch.randn(4, 10, 24, 24, dtype=torch.float64)
    expected = torch.nn.grad.conv2d_input((4, 1, 28, 28), weight, grad_out)
    assert torch.allclose(input_gradient(grad_out, weight, (4, 1, 28, 28)), expected, rtol=0, atol=1e-12)


def test_every_gradient_passes_gradcheck():
    torch.manual_seed(0)
    x = torch.randn(2, 1, 9, 9, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 1, 5, 5, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_ImageConv.apply, (x, weight, bias))


def test_encoder_gradients_match_the_plain_convolution():
    """The align step's case: a channels_last image that needs a gradient, in float32."""
    torch.manual_seed(0)
    encoder = ImageEncoder(5, 16, 0.0)
    image = torch.randn(8, 1, 28, 28).contiguous(memory_format=torch.channels_last)
    results = []
    for conv in (image_conv, lambda conv, x: conv(x)):
        x = image.clone().requires_grad_(True)
        hidden = torch.relu(torch.max_pool2d(conv(encoder.conv1, x), 2))
        encoder.zero_grad()
        hidden.square().sum().backward()
        results.append((x.grad, encoder.conv1.weight.grad.clone(), encoder.conv1.bias.grad.clone()))
    for ours, atens in zip(*results):
        assert torch.allclose(ours, atens, rtol=1e-5, atol=1e-5)
