"""`ponder predict`: the user's own files read as training reads MNIST (any size and mode, light
or dark background, .npy arrays) or parity vectors, per-step figures equal to a direct forward
pass, the align step's turn, the strip plot, and bad input as one error line naming the file."""

import json
import math
import os
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from ponder_cli import PonderWarning
from ponder_cli.checkpoint import TrainingState, load_model, save_checkpoint
from ponder_cli.config import PonderConfig
from ponder_cli.tasks.mnist import frame_like_mnist, prepare_batch, read_images
from synthetic_data import synthetic_digits
from ponder_cli.model import Quantile, halting_log_probs, halting_steps
from ponder_cli.checkpoint import new_model


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """Six generated digits as 28x28 PNG files, white on black (L) and black on white (RGB),
    and as one .npy array."""
    folder = tmp_path_factory.mktemp("digits")
    data = synthetic_digits(6, seed=5)
    white, black = [], []
    for i, image in enumerate(data.images.numpy()):
        white.append(folder / f"white{i}.png")
        Image.fromarray(image).save(white[-1])
        black.append(folder / f"black{i}.png")
        Image.fromarray(255 - image).convert("RGB").save(black[-1])
    np.save(folder / "digits.npy", data.images.numpy())
    return data, white, black, folder / "digits.npy"


def _untrained(tmp_path, **fields) -> str:
    """A checkpoint of an untrained model (no training needed to look inside one)."""
    cfg = PonderConfig.of(**fields)
    torch.manual_seed(0)
    model = new_model(cfg)
    path = tmp_path / "model.pt"
    save_checkpoint(TrainingState(config=cfg, model=model.state_dict(), epoch=0), path)
    return path


def test_images_are_normalised_exactly_as_training_prepares_mnist(digits):
    data, white, black, array = digits
    names, x = read_images(white)
    assert names == [str(p) for p in white]
    assert torch.equal(x, prepare_batch(data.images))
    # black on white (RGB) is detected from its light border and inverted: the same pixels
    assert torch.equal(read_images(black)[1], x)
    assert torch.equal(read_images([array])[1], x)
    angles = torch.full((6,), 70.0)
    assert torch.equal(read_images(white, rotate=70)[1], prepare_batch(data.images, angles))
    # whole circles are taken off first: 70 + 2 * 360 is 70, and 1e39 degrees (exactly
    # 1e39 mod 360 = 352 in double precision) does not overflow float32
    assert torch.equal(read_images(white, rotate=790)[1], prepare_batch(data.images, angles))
    assert torch.equal(read_images(white, rotate=1e39)[1], prepare_batch(data.images, torch.full((6,), 352.0)))
    # --invert forces it: white on black read as a dark digit is the inverse
    assert torch.equal(read_images(white, invert=True)[1], prepare_batch(255 - data.images))


def test_other_sizes_are_framed_as_mnist_frames_its_digits():
    # a 10-wide, 40-tall bright bar in a 100x100 image -> scaled to 20 tall, 5 wide, centred
    image = np.zeros((100, 100))
    image[10:50, 70:80] = 1.0
    framed = frame_like_mnist(image)
    rows, cols = np.nonzero(framed > 0.5)
    assert framed.shape == (28, 28)
    assert rows.max() - rows.min() + 1 == 20 and cols.max() - cols.min() + 1 == 5
    ys, xs = np.indices(framed.shape)
    assert abs((ys * framed).sum() / framed.sum() - 13.5) <= 0.5
    assert abs((xs * framed).sum() / framed.sum() - 13.5) <= 0.5


def test_white_on_black_and_black_on_white_give_the_same_predictions(ponder, checkpoint, digits):
    _, white, black, array = digits
    results = [json.loads(ponder("predict", checkpoint, *files, "-f", "json", "-q").stdout)
               for files in (white, black, [array])]
    predictions = [[(b["prediction"], b["probability"], b["halting_step"]) for b in r["buckets"]] for r in results]
    assert predictions[0] == predictions[1] == predictions[2]
    assert [b["input"] for b in results[2]["buckets"]] == [f"{array}[{i}]" for i in range(6)]


def test_any_size_and_mode_is_read(ponder, checkpoint, tmp_path):
    big = np.zeros((90, 60, 4), dtype=np.uint8)  # RGBA: a dark stroke on a transparent background
    big[20:70, 25:35] = (0, 0, 0, 255)
    Image.fromarray(big, "RGBA").save(tmp_path / "stroke.png")
    Image.fromarray(np.full((40, 30), 250, np.uint8)).save(tmp_path / "blank.jpg")
    result = ponder("predict", checkpoint, tmp_path / "stroke.png", tmp_path / "blank.jpg", "-f", "csv")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 3


def test_steps_equal_a_direct_forward_pass(ponder, checkpoint, digits):
    data, white, _, _ = digits
    report = json.loads(ponder("predict", checkpoint, *white, "--steps", "--halting", "median", "-f", "json").stdout)
    model, cfg, _ = load_model(checkpoint, "cpu")
    with torch.no_grad():
        out = model(prepare_batch(data.images))
    p = halting_log_probs(out.lambda_logits).exp()
    halts = halting_steps(Quantile(0.5), None, out.lambda_logits)[0]
    probs = torch.softmax(out.logits, dim=-1)
    for i, bucket in enumerate(report["buckets"]):
        steps = bucket["steps"]
        assert len(steps) == cfg.method.max_steps == 5
        assert math.isclose(sum(s["p"] for s in steps), 1.0, rel_tol=1e-5)
        assert bucket["halting_step"] == int(halts[i])
        for n, step in enumerate(steps):
            assert step["class"] == int(probs[n, i].argmax())
            assert step["lambda"] == pytest.approx(float(torch.sigmoid(out.lambda_logits[n, i])), abs=1e-6)
            assert step["p"] == pytest.approx(float(p[n, i]), abs=1e-6)
        # p_n = lambda_n prod_{k<n} (1 - lambda_k) before the last step, which takes what is left
        survive = 1.0
        for step in steps[:-1]:
            assert step["p"] == pytest.approx(survive * step["lambda"], abs=1e-5)
            survive *= 1 - step["lambda"]
        assert steps[-1]["p"] == pytest.approx(survive, abs=1e-5)
        halting = steps[bucket["halting_step"] - 1]
        assert (bucket["prediction"], bucket["probability"]) == (halting["class"], pytest.approx(halting["probability"]))


def test_the_sample_rule_is_seeded(ponder, checkpoint, digits):
    _, white, _, _ = digits
    runs = [json.loads(ponder("predict", checkpoint, *white, "--seed", seed, "-f", "json").stdout)
            for seed in (7, 7)]
    assert runs[0]["buckets"] == runs[1]["buckets"] and runs[0]["seed"] == 7


def test_align_reports_the_accumulated_turn(ponder, tmp_path, digits):
    path = _untrained(tmp_path, step="align", max_steps=4)
    state = torch.load(path, weights_only=True)
    # every step turns by max_turn * tanh(atanh(0.5)) = 15 degrees: after step n, 15 n
    state["model"]["step.turn.weight"].zero_()
    state["model"]["step.turn.bias"].fill_(math.atanh(0.5))
    torch.save(state, path)
    report = json.loads(ponder("predict", path, digits[1][0], "--steps", "-f", "json").stdout)
    assert [round(s["turn_deg"], 3) for s in report["buckets"][0]["steps"]] == [15.0, 30.0, 45.0, 60.0]
    table = ponder("predict", path, digits[1][0], "--steps").stdout
    assert "turn_deg" in table and "+60.0" in table


def test_the_plot_draws_a_strip_per_input(ponder, checkpoint, digits, tmp_path):
    pytest.importorskip("matplotlib")
    result = ponder("predict", checkpoint, *digits[1][:2], "--plot", tmp_path / "strip.png")
    assert result.exit_code == 0, result.output
    assert Image.open(tmp_path / "strip.png").size[0] > 500


@pytest.mark.parametrize("make, named", [  # the file, what is wrong, and the array as it is
    (lambda d: d / "missing.png", ["missing.png", "no such file"]),
    (lambda d: (d / "notes.txt").write_text("hello") and d / "notes.txt", ["notes.txt", "image"]),
    (lambda d: np.save(d / "wide.npy", np.zeros((2, 32, 32))) or d / "wide.npy",
     ["wide.npy", "(2, 32, 32)", "float64", "(N, 28, 28) or (28, 28)"]),
    (lambda d: np.save(d / "flat.npy", np.zeros(784)) or d / "flat.npy", ["flat.npy", "(784,)", "float64"]),
    # the array's own shape, not the shape it was read as (one image of 10x16)
    (lambda d: np.save(d / "small.npy", np.zeros((10, 16))) or d / "small.npy", ["small.npy", "(10, 16)", "float64"]),
    (lambda d: np.save(d / "none.npy", np.zeros((0, 28, 28), np.uint8)) or d / "none.npy",
     ["none.npy", "empty", "(0, 28, 28)", "uint8"]),
    (lambda d: np.save(d / "waves.npy", np.zeros((2, 28, 28), complex)) or d / "waves.npy",
     ["waves.npy", "real numbers", "(2, 28, 28)", "complex128"]),
    (lambda d: (d / "cut.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0") and d / "cut.png", ["cut.png"]),
    (lambda d: os.mkfifo(d / "pipe.png") or d / "pipe.png", ["pipe.png", "named pipe"]),
])
def test_bad_input_is_one_error_line_naming_the_file(ponder, error, checkpoint, tmp_path, make, named):
    error(ponder("predict", checkpoint, make(tmp_path)), 1, *named)


def test_a_blank_image_is_predicted_with_a_warning(ponder, checkpoint, digits, tmp_path):
    Image.new("L", (40, 30), 255).save(tmp_path / "white.png")  # a light background, no digit: 0 once inverted
    np.save(tmp_path / "grey.npy", np.stack([np.full((28, 28), 0.5), np.zeros((28, 28))]))
    with pytest.warns(PonderWarning) as caught:
        names, _ = read_images([tmp_path / "white.png", digits[1][0], tmp_path / "grey.npy"])
    assert len(names) == 4
    grey = tmp_path / "grey.npy"
    expected = [f"{tmp_path / 'white.png'} is blank: all its pixels are 0 (of 255) as the model reads it, so its "
                "prediction means nothing",
                f"{grey}[0] is blank: all its pixels are 128 (of 255) as the model reads it, so its prediction means "
                "nothing", f"{grey}[1] is blank: all its pixels are 0 (of 255) as the model reads it, so its "
                "prediction means nothing"]
    assert [str(w.message) for w in caught] == expected
    # the CLI predicts them all, with one Warning line each on stderr (--quiet too)
    result = ponder("predict", checkpoint, tmp_path / "white.png", digits[1][0], grey, "-q", "-f", "json")
    assert result.exit_code == 0 and len(json.loads(result.stdout)["buckets"]) == 4
    assert result.stderr.splitlines() == [f"Warning: {line}" for line in expected]


# parity ----------------------------------------------------------------------------------------

def test_parity_models_read_vectors(ponder, error, tmp_path):
    path = _untrained(tmp_path, task="parity", elems=4, max_steps=3, hidden=8)
    (tmp_path / "v.txt").write_text("# vectors\n1 0 -1 1\n\n0,0,1,-1\n")
    np.save(tmp_path / "v.npy", np.array([[1, 0, -1, 1], [0, 0, 1, -1]], dtype=np.int8))
    report = json.loads(ponder("predict", path, tmp_path / "v.txt", tmp_path / "v.npy", "--steps",
                               "-f", "json").stdout)
    names = [b["input"] for b in report["buckets"]]
    assert names == [f"{tmp_path / 'v.txt'}:2", f"{tmp_path / 'v.txt'}:4", f"{tmp_path / 'v.npy'}[0]",
                     f"{tmp_path / 'v.npy'}[1]"]
    assert report["task"] == "parity" and report["buckets"][0]["steps"][0].keys() == {
        "step", "class", "probability", "lambda", "p"}
    assert report["buckets"][0]["prediction"] == report["buckets"][2]["prediction"]
    (tmp_path / "long.txt").write_text("1 0 -1 1 0\n")
    # the file and line, what it holds and what the model reads
    error(ponder("predict", path, tmp_path / "long.txt"), 1, f"{tmp_path / 'long.txt'}:1", "5", "4")
    (tmp_path / "two.txt").write_text("1 0 2 1\n")
    error(ponder("predict", path, tmp_path / "two.txt"), 1, f"{tmp_path / 'two.txt'}:1", "-1, 0 or +1", "2")
    error(ponder("predict", path, tmp_path / "v.txt", "--rotate", "10"), 1, "--rotate", "mnist")


@pytest.mark.parametrize("array, named", [
    # what is wrong, and the array as it is: its own shape, never the one it was read as
    (np.zeros((10, 16)), ["(10, 16)", "float64", "(N, 4) or (4,)"]),
    (np.zeros(0), ["empty", "(0,)", "float64", "4 entries"]),
    (np.zeros((2, 4), complex), ["real numbers", "(2, 4)", "complex128", "4 entries"]),
    (np.array(["1", "0", "-1", "1"]), ["real numbers", "(4,)", "<U2"]),
])
def test_a_parity_array_that_does_not_fit_is_described_as_it_is(ponder, error, tmp_path, array, named):
    path = _untrained(tmp_path, task="parity", elems=4, max_steps=3, hidden=8)
    np.save(tmp_path / "bad.npy", array)
    error(ponder("predict", path, tmp_path / "bad.npy"), 1, tmp_path / "bad.npy", *named)


def test_the_expected_rule_reports_sum_n_p_n_and_the_mixture(ponder, checkpoint, digits):
    data, white, _, _ = digits
    report = json.loads(ponder("predict", checkpoint, *white[:2], "--steps", "--halting", "expected",
                               "-f", "json").stdout)
    model, _, _ = load_model(checkpoint, "cpu")
    with torch.no_grad():
        out = model(prepare_batch(data.images[:2]))
    p = halting_log_probs(out.lambda_logits).exp()  # (steps, B)
    mixture = (p[..., None] * torch.softmax(out.logits, dim=-1)).sum(0)  # (B, classes)
    for i, bucket in enumerate(report["buckets"]):
        assert bucket["halting_step"] == pytest.approx(sum((n + 1) * s["p"] for n, s in enumerate(bucket["steps"])))
        assert bucket["prediction"] == int(mixture[i].argmax())
        assert bucket["probability"] == pytest.approx(float(mixture[i].max()), abs=1e-6)


def test_act_weights_its_steps_by_its_halting_units(ponder, runs, digits):
    report = json.loads(ponder("predict", runs / "act", *digits[1], "--steps", "-f", "json").stdout)
    epsilon = load_model(runs / "act" / "best.pt", "cpu")[1].method.act_epsilon
    assert report["halting"] == "act"
    for bucket in report["buckets"]:
        steps, halt = bucket["steps"], bucket["halting_step"]
        # N: the first step whose running sum of halting units reaches 1 - epsilon (or the last)
        running = [sum(s["lambda"] for s in steps[:n + 1]) for n in range(len(steps))]
        assert halt == next((n + 1 for n, total in enumerate(running) if total >= 1 - epsilon), len(steps))
        # p = (h_1, ..., h_{N-1}, R, 0, ...), summing to 1
        assert [s["p"] for s in steps[:halt - 1]] == pytest.approx([s["lambda"] for s in steps[:halt - 1]], abs=1e-6)
        assert all(s["p"] == 0 for s in steps[halt:])
        assert sum(s["p"] for s in steps) == pytest.approx(1.0, abs=1e-5)


def test_a_parity_strip(ponder, tmp_path):
    pytest.importorskip("matplotlib")
    path = _untrained(tmp_path, task="parity", elems=4, max_steps=3, hidden=8)
    (tmp_path / "v.txt").write_text("1 0 -1 1\n")
    result = ponder("predict", path, tmp_path / "v.txt", "--plot", tmp_path / "strip.png")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "strip.png").exists()


def test_an_input_alone_is_told_that_a_checkpoint_comes_first(tmp_path, ponder, error):
    # the form, and the command that would do: with a shipped model first
    error(ponder("predict", tmp_path / "digit.png"), 2, "CHECKPOINT", "INPUT",
          f"`ponder predict reference {tmp_path / 'digit.png'}`", "`ponder models`")


@pytest.mark.parametrize("given", ["align", "latest", "a run folder", "a checkpoint file"])
def test_a_checkpoint_alone_is_told_that_its_inputs_follow_it(tmp_path, ponder, error, given):
    # a checkpoint without inputs is not taken for an input: the example keeps it first
    from ponder_cli.folders import shipped_path

    if given in ("a run folder", "a checkpoint file"):
        (tmp_path / "run").mkdir()
        shutil.copyfile(shipped_path("parity16"), tmp_path / "run" / "best.pt")
        given = tmp_path / "run" if given == "a run folder" else tmp_path / "run" / "best.pt"
    line = error(ponder("predict", given), 2, "INPUT", f"`ponder predict {given} INPUT...`")
    assert f"predict reference {given}" not in line


def test_a_file_of_another_kind_alone_is_taken_for_an_input(tmp_path, ponder, error):
    (tmp_path / "digit.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    error(ponder("predict", tmp_path / "digit.png"), 2, f"`ponder predict reference {tmp_path / 'digit.png'}`")


def test_vectors_from_standard_input(tmp_path, error):
    """`-` reads parity vectors from standard input, as a file of them reads: the same predictions."""
    from typer.testing import CliRunner

    from ponder_cli.cli import app

    def run(*args, input=None):
        return CliRunner().invoke(app, [str(a) for a in args], input=input, prog_name="ponder")

    path = _untrained(tmp_path, task="parity", elems=4, max_steps=3, hidden=8)
    lines = "# vectors\n1 0 -1 1\n\n0,0,1,-1\n"
    (tmp_path / "v.txt").write_text(lines)
    piped = json.loads(run("predict", path, "-", "--steps", "-f", "json", input=lines).stdout)
    read = json.loads(run("predict", path, tmp_path / "v.txt", "--steps", "-f", "json").stdout)
    assert [b["input"] for b in piped["buckets"]] == ["-:2", "-:4"]
    assert [{k: v for k, v in b.items() if k != "input"} for b in piped["buckets"]] == \
        [{k: v for k, v in b.items() if k != "input"} for b in read["buckets"]]
    error(run("predict", path, "-", input=""), 1, "-: ", "4")
    twice = run("predict", path, "-", "-", input=lines)
    error(twice, 2, "- (standard input)", "2 times")
    (tmp_path / "mnist").mkdir()
    mnist = _untrained(tmp_path / "mnist", max_steps=2)
    images = run("predict", mnist, "-", input=lines)
    # usage mistakes (2); garbage read from it is a bad file (1)
    error(images, 2, "- (standard input)", "parity", "MNIST", ".npy")


def test_more_steps_than_trained_are_said_on_stderr(ponder, tmp_path):
    path = _untrained(tmp_path, task="parity", elems=4, max_steps=3, hidden=8)
    (tmp_path / "v.txt").write_text("1 0 -1 1\n")
    result = ponder("predict", path, tmp_path / "v.txt", "--max-steps", "5", "-q")
    assert result.exit_code == 0, result.output
    assert result.stderr == ("Warning: --max-steps 5 runs this model past the 3 steps it trained with: steps 4-5 "
                             "were never trained, and its halting is forced at step 5\n")
    for steps in ("3", "2"):  # within the trained steps: nothing to say
        assert ponder("predict", path, tmp_path / "v.txt", "--max-steps", steps, "-q").stderr == ""
