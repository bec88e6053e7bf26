"""The built-in tasks as the settings and the reports read them, without torch: what each task's
inputs are, what it refuses (`config_problems`) and derives (`resolve_options`), how reports name
its buckets (`view`). registry.TASKS names these; each `implementation` (tasks/mnist.py,
parity.py), the class that loads and draws the data, subclasses its declaration."""

from __future__ import annotations

from .. import BadValue, PonderError
from ..config import PAPER_SCALE, PAPER_SCALE_ELEMS
from ..reports import TaskView, Terms, band_text
from . import Task


# MNIST --------------------------------------------------------------------------------------------

# How reports name MNIST's buckets (rotations) and inputs (images)
MNIST_TERMS = Terms("rotation", "±deg", "g", "|angle|", "|rotation angle| and ponder steps", "images", "MNIST test set",
              lambda b: band_text(b, "°") if b.get("band") else f"±{b['rotation']:g}°", sweep_key="rotation",
              sweep_header="|angle|", sweep_scale=10.0, sweep_unit="10°", sweep_fit="steps_per_10_degrees",
              sweep_name="mental rotation")


class Mnist(Task):
    implementation = "ponder_cli.tasks.mnist:MnistTask"
    name, classes, inputs, input_kind = "mnist", 10, "28x28 images", "images"
    uses_protocol = True
    bucket_options, bucket_metavar, article = ("--angles", "--rotation"), "DEG...", "an"
    buckets_share_inputs = True  # calibrate rotates the held-out training digits again for every bucket

    def view(self) -> TaskView:
        return TaskView("mnist", MNIST_TERMS, {"train_rotation": self.cfg.task.train_rotation},
                        f"trained within ±{self.cfg.task.train_rotation:g}°", named_in_titles=False)


# parity -------------------------------------------------------------------------------------------

CLASSES = 2
# the paper's largest vectors have 96 entries; the fixed evaluation sets hold a few hundred rows
# per non-zero count, so their size grows with elems squared
MAX_ELEMS = 256
# How reports name parity's buckets and inputs
PARITY_TERMS = Terms("counts", "counts", "s", "count", "non-zero count and ponder steps", "vectors", "parity test vectors",
              lambda bucket: f"counts {bucket['counts']}", sweep_key="lo", sweep_header="count", sweep_scale=1.0,
              sweep_unit="count", sweep_fit="steps_per_count", sweep_name="non-zero count")
def parse_count_range(text: str, elems: int) -> tuple[int, int]:
    """'17-32' -> (17, 32), '5' -> (5, 5), checked against 1..elems."""
    lo, sep, hi = str(text).partition("-")
    try:
        bounds = (int(lo), int(hi) if sep else int(lo))
    except ValueError:
        raise BadValue(f"a count range is LO-HI or N (got {text!r})") from None
    if not 1 <= bounds[0] <= bounds[1] <= elems:
        raise BadValue(f"count range {text} must satisfy 1 <= LO <= HI <= {elems} (the elements of a vector)")
    return bounds


def train_range(cfg) -> tuple[int, int]:
    """The training non-zero counts (lo, hi): --train-counts, or all (a config before runs saved theirs)."""
    return parse_count_range(cfg.task.train_counts, cfg.task.elems) if cfg.task.train_counts else (1, cfg.task.elems)



class Parity(Task):
    implementation = "ponder_cli.tasks.parity:ParityTask"
    name, classes, inputs, input_kind = "parity", CLASSES, "vectors of --elems entries in {-1, 0, +1}", "vectors"
    bucket_options, bucket_metavar = ("--counts",), "LO-HI..."

    @classmethod
    def config_problems(cls, cfg):
        task = cfg.task
        if not 1 <= task.elems <= MAX_ELEMS:  # (the config made it an integer)
            return [f"elems must be an integer from 1 to {MAX_ELEMS} (got {task.elems})"]
        problems = []
        if task.train_counts != "":
            try:
                parse_count_range(task.train_counts, task.elems)
            except PonderError as exc:
                problems.append(f"train-counts: {exc}")
        curriculum = task.curriculum or task.curriculum_advance
        if curriculum and not 1 <= task.curriculum_start <= task.elems:
            problems.append(f"curriculum-start must be a count from 1 to elems ({task.elems}) "
                            f"(got {task.curriculum_start})")
        if task.curriculum and task.curriculum_advance:
            problems.append("--curriculum (a schedule) and --curriculum-advance (by progress) are two curricula; "
                            "choose one")
        if task.curriculum_mix and not curriculum:
            problems.append("--curriculum-mix is a share of a curriculum's batches: it needs --curriculum or "
                            "--curriculum-advance")
        return problems

    @classmethod
    def resolve_options(cls, values: dict, given: dict) -> dict:
        elems = values.get("elems")
        if "train_counts" not in given and isinstance(elems, int):
            values["train_counts"] = f"1-{elems}"  # saved explicitly: the run says what it trained on
        if isinstance(elems, int) and not isinstance(elems, bool) and elems >= PAPER_SCALE_ELEMS:
            values.update({key: value for key, value in PAPER_SCALE.items() if key not in given})
        return values
    def layout_text(self) -> str:
        """"scattered layout", "prefix layout, one-hot; training never put a non-zero past position 8"."""
        hi = train_range(self.cfg)[1]
        text = f"{self.cfg.task.layout} layout" + (", one-hot" if self.cfg.step.encoding == "onehot" else "")
        if self.cfg.task.layout == "prefix" and hi < self.cfg.task.elems:
            text += f"; training never put a non-zero past position {hi}"
        return text
    def view(self):
        lo, hi = train_range(self.cfg)
        return TaskView("parity", PARITY_TERMS, {"elems": self.cfg.task.elems, "train_counts": f"{lo}-{hi}",
                                          "layout": self.cfg.task.layout, "encoding": self.cfg.step.encoding},
                        f"{self.cfg.task.elems} elements, trained on counts {lo}-{hi} ({self.layout_text()})",
                        protocol=None)
