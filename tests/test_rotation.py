import pytest
import torch

from ponder_cli.tasks.mnist import MNIST_MEAN, MNIST_STD, prepare_batch, rotate, uniform_angles
from synthetic_data import synthetic_digits


@pytest.mark.parametrize("angle", [0.0, 5.0, -12.25, 22.5, 45.0, -67.5, 90.0, 133.3, 180.0])
def test_rotation_matches_torchvision_pixel_for_pixel(angle, tv):
    T, TF = tv
    images = synthetic_digits(4, seed=1).images
    ours = rotate(images.unsqueeze(1).float(), torch.full((4,), angle)).to(torch.uint8)
    theirs = TF.rotate(images.unsqueeze(1), angle, interpolation=T.InterpolationMode.NEAREST, fill=0)
    assert torch.equal(ours, theirs)


def test_per_image_angles_match_random_rotation(tv):
    T, _ = tv
    images = synthetic_digits(16, seed=2).images
    transform = T.RandomRotation(degrees=45)
    angles, expected = [], []
    for i, img in enumerate(images):
        torch.manual_seed(i)
        expected.append(transform(img.unsqueeze(0)))  # the real transform, one image at a time
        torch.manual_seed(i)
        angles.append(T.RandomRotation.get_params(transform.degrees))  # the angle it drew
    ours = rotate(images.unsqueeze(1).float(), torch.tensor(angles)).to(torch.uint8)
    assert torch.equal(ours, torch.stack(expected))
    assert len({round(a, 3) for a in angles}) == 16


def test_rotation_is_counter_clockwise():
    image = torch.zeros(1, 1, 28, 28)
    image[0, 0, 2, 14] = 1.0  # a dot above the centre
    rotated = rotate(image, torch.tensor([90.0]))[0, 0]
    row, col = divmod(int(rotated.argmax()), 28)
    assert col < 14 and abs(row - 13.5) <= 1  # moved to the left: counter-clockwise


def test_uniform_angles_range_and_seeding():
    a = uniform_angles(10_000, 30.0, generator=torch.Generator().manual_seed(5))
    b = uniform_angles(10_000, 30.0, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    assert a.min() >= -30 and a.max() <= 30 and a.min() < -29 and a.max() > 29


def test_prepare_batch_normalises_like_to_tensor_normalize(tv):
    T, _ = tv
    images = synthetic_digits(3, seed=4).images
    reference = T.Normalize((MNIST_MEAN,), (MNIST_STD,))(images.unsqueeze(1).float() / 255)
    assert torch.allclose(prepare_batch(images), reference, atol=1e-6)
    assert prepare_batch(images, torch.zeros(3)).shape == (3, 1, 28, 28)


def test_minus_zero_degrees_is_zero_degrees():
    """`--angles -0` names the bucket `--angles 0` does: the same name and the same draws (the
    bucket's key is part of the seed of its rotations and coins)."""
    import math

    from ponder_cli.tasks.mnist import bucket_key, evaluation_draws, parse_angles

    (angle,) = parse_angles(["-0"])
    assert math.copysign(1.0, angle) == 1.0 and bucket_key(angle, "uniform") == bucket_key(0.0, "uniform")
    assert str(bucket_key(angle, "fixed")) == str(bucket_key(0.0, "fixed"))  # the seed is made from its text
    for protocol in ("uniform", "fixed"):
        zero = evaluation_draws(20, 4, 0.0, 7, "cpu", protocol=protocol)[1]
        minus = evaluation_draws(20, 4, angle, 7, "cpu", protocol=protocol)[1]
        assert torch.equal(zero, minus)
    # unparsed, -0.0 names another bucket and draws other coins: what parsing mends
    assert not torch.equal(zero, evaluation_draws(20, 4, float("-0"), 7, "cpu", protocol="fixed")[1])
