"""PonderNet for MNIST: a CNN embeds the image once, an MLP steps a hidden state, two heads read it.

Knows nothing of data loading, training or the CLI.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import PonderConfig

N_CLASSES = 10
IMAGE_SIZE = 28


class PonderOutput(NamedTuple):
    logits: torch.Tensor  # (steps, B, classes): y_n at every step
    lambda_logits: torch.Tensor  # (steps, B): pre-sigmoid conditional halting probability


class ImageEncoder(nn.Module):
    """Two conv/pool blocks and a linear layer, as in the reference CNN."""

    def __init__(self, cfg: PonderConfig, image_size: int = IMAGE_SIZE):
        super().__init__()
        k = cfg.kernel_size
        self.conv1 = nn.Conv2d(1, 10, kernel_size=k)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=k)
        self.conv2_drop = nn.Dropout2d(cfg.cnn_dropout)
        side = ((image_size - (k - 1)) // 2 - (k - 1)) // 2
        self.fc = nn.Linear(20 * side * side, cfg.hidden_cnn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 1, 28, 28) -> (B, hidden_cnn)
        # channels_last halves the CPU cost of these small convolutions (oneDNN) and suits
        # tensor cores on CUDA; the weights are converted once in PonderNet.__init__.
        x = x.contiguous(memory_format=torch.channels_last)
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        return F.relu(self.fc(x.flatten(1)))


class StepMLP(nn.Module):
    """h_n = relu(W2 dropout(relu(W1 [e, h_{n-1}]))).

    W1 is split into its embedding and state columns so that the embedding's share, constant
    across steps, is computed once per image instead of once per step.
    """

    def __init__(self, cfg: PonderConfig):
        super().__init__()
        self.from_embedding = nn.Linear(cfg.hidden_cnn, cfg.hidden_lin)
        self.from_state = nn.Linear(cfg.hidden, cfg.hidden_lin, bias=False)
        self.to_state = nn.Linear(cfg.hidden_lin, cfg.hidden)
        self.dropout = cfg.mlp_dropout
        self._init_like_concatenated_linear(cfg)

    def _init_like_concatenated_linear(self, cfg: PonderConfig) -> None:
        # nn.Linear scales its init by 1/sqrt(fan_in); keep the fan-in of the unsplit layer.
        bound = 1 / math.sqrt(cfg.hidden_cnn + cfg.hidden)
        for weight in (self.from_embedding.weight, self.from_state.weight, self.from_embedding.bias):
            nn.init.uniform_(weight, -bound, bound)

    def embedding_part(self, embedding: torch.Tensor) -> torch.Tensor:  # (B, E) -> (B, L)
        return self.from_embedding(embedding)

    def dropout_masks(self, steps: int, batch: int, like: torch.Tensor) -> torch.Tensor | None:
        """Every step's dropout mask in one draw (steps, B, L), scaled by 1/(1-p); None in eval."""
        if not self.training or self.dropout == 0:
            return None
        keep = 1 - self.dropout
        # rand < keep draws half as slowly as bernoulli_ on the CPU
        uniform = torch.rand(steps, batch, self.to_state.in_features, device=like.device)
        return (uniform < keep).to(like.dtype).div_(keep)

    def forward(self, embedding_part: torch.Tensor, h: torch.Tensor | None,
                dropout_mask: torch.Tensor | None = None) -> torch.Tensor:
        pre = embedding_part if h is None else embedding_part + self.from_state(h)  # h_0 = 0
        pre = F.relu(pre)
        if dropout_mask is not None:
            pre = pre * dropout_mask
        return F.relu(self.to_state(pre))  # (B, hidden)


class PonderNet(nn.Module):
    def __init__(self, cfg: PonderConfig):
        super().__init__()
        self.max_steps = cfg.max_steps
        self.encoder = ImageEncoder(cfg)
        self.step_mlp = StepMLP(cfg)
        self.output_head = nn.Linear(cfg.hidden, N_CLASSES)
        # "state+confidence" also shows the halting head the step's top class probability
        self.confidence_input = cfg.halting_input == "state+confidence"
        self.halting_head = nn.Linear(cfg.hidden + self.confidence_input, 1)
        if cfg.method == "act":
            # Graves: a positive halting bias makes early training ponder little
            nn.init.constant_(self.halting_head.bias, 1.0)
        self.encoder.to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> PonderOutput:
        """Run every step for every image (training and loss computation)."""
        embedding_part = self.step_mlp.embedding_part(self.encoder(x))  # (B, L), once per image
        masks = self.step_mlp.dropout_masks(self.max_steps, x.shape[0], embedding_part)
        h = None
        states = []
        for n in range(self.max_steps):
            h = self.step_mlp(embedding_part, h, None if masks is None else masks[n])
            states.append(h)
        states = torch.stack(states)  # (steps, B, hidden)
        # Heads run once on all steps together: one large matmul beats `steps` small ones.
        return PonderOutput(*self.heads(states))

    def heads(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Class logits (..., classes) and halting logits (...) from states (..., hidden)."""
        logits = self.output_head(h)
        if self.confidence_input:
            confidence = torch.softmax(logits.float(), dim=-1).amax(dim=-1, keepdim=True).to(h.dtype)
            h = torch.cat([h, confidence], dim=-1)
        return logits, self.halting_head(h).squeeze(-1)

    @torch.no_grad()
    def infer(self, x: torch.Tensor, uniforms: torch.Tensor | None = None,
              rule: str = "sample") -> tuple[torch.Tensor, torch.Tensor]:
        """Halting with real early exit: each step computes only the images still running.

        rule "sample": image b halts at the first step n where uniforms[n, b] < lambda_n
        (uniforms (steps, B) are the coin flips, drawn up front so that the result is identical
        to running every step and calling `sample_halting_steps`). rule "median": it halts at the
        first step where its cumulative halting probability reaches 1/2 (`median_halting_steps`).
        Returns the logits at the halting step (B, classes) and the 1-based halting step (B,).
        """
        if rule not in ("sample", "median"):
            raise ValueError(f"early exit supports the sample and median rules, not {rule!r}")
        batch = x.shape[0]
        embedding_part = self.step_mlp.embedding_part(self.encoder(x))  # (B, L)
        logits = embedding_part.new_empty(batch, N_CLASSES)
        steps = torch.full((batch,), self.max_steps, dtype=torch.long, device=x.device)
        active = torch.arange(batch, device=x.device)  # rows of the batch still running
        log_survival = torch.zeros(batch, device=x.device)  # median rule: log prod_k (1 - lambda_k)
        h = None
        for n in range(self.max_steps):
            h = self.step_mlp(embedding_part, h)  # (A, hidden)
            step_logits, lambda_logits = self.heads(h)
            if n == self.max_steps - 1:
                halts = torch.ones(h.shape[0], dtype=torch.bool, device=x.device)
            elif rule == "sample":
                halts = uniforms[n, active] < torch.sigmoid(lambda_logits.float())
            else:
                log_survival = log_survival + F.logsigmoid(-lambda_logits.float())
                halts = log_survival <= _LOG_HALF
            halted = active[halts]
            logits[halted] = step_logits[halts].to(logits.dtype)
            steps[halted] = n + 1
            running = ~halts
            # Compacting needs the count of survivors on the host: one sync per step, which
            # buys skipping all work on halted images.
            if not bool(running.any()):
                break
            active, embedding_part, h = active[running], embedding_part[running], h[running]
            if rule == "median":
                log_survival = log_survival[running]
        return logits, steps


_LOG_HALF = math.log(0.5)


def halting_log_probs(lambda_logits: torch.Tensor) -> torch.Tensor:
    """log p_n = log lambda_n + sum_{k<n} log(1 - lambda_k), with lambda forced to 1 at the last step.

    Computed in log space and float32 so it stays finite even where p_n underflows:
    log(1 - sigmoid(z)) = logsigmoid(-z) never takes the log of 0.
    """
    z = lambda_logits.float()  # (steps, B)
    log_lambda = F.logsigmoid(z)
    log_lambda = torch.cat([log_lambda[:-1], torch.zeros_like(log_lambda[-1:])])  # lambda_N = 1
    log_continue = F.logsigmoid(-z)
    log_survive = torch.cat([torch.zeros_like(z[:1]), torch.cumsum(log_continue[:-1], dim=0)])
    return log_lambda + log_survive  # (steps, B)


def sample_halting_steps(lambda_logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """1-based step at which each image halts: the first n with uniforms[n] < lambda_n."""
    lam = torch.sigmoid(lambda_logits.float())  # (steps, B)
    fires = uniforms < lam
    fires[-1] = True  # lambda_N = 1
    return fires.to(torch.uint8).argmax(dim=0) + 1  # argmax returns the first maximum; (B,)


def logits_at(logits: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Pick y_n at each image's 1-based halting step: (steps, B, C), (B,) -> (B, C)."""
    index = (steps - 1).view(1, -1, 1).expand(1, -1, logits.shape[-1])
    return logits.gather(0, index).squeeze(0)


def median_halting_steps(lambda_logits: torch.Tensor) -> torch.Tensor:
    """1-based first step where the cumulative halting probability 1 - prod_{k<=n}(1 - lambda_k)
    reaches 1/2: a deterministic halting rule. (steps, B) -> (B,)"""
    log_survival = torch.cumsum(F.logsigmoid(-lambda_logits.float()), dim=0)  # (steps, B)
    fires = log_survival <= _LOG_HALF
    fires[-1] = True
    return fires.to(torch.uint8).argmax(dim=0) + 1


def expected_prediction(out: PonderOutput) -> tuple[torch.Tensor, torch.Tensor]:
    """The p-weighted average of every step's class probabilities (B, classes) and the expected
    number of steps sum_n n p_n (B,): the 'expected' halting rule, which runs every step."""
    p = halting_log_probs(out.lambda_logits).exp()  # (steps, B)
    probs = torch.softmax(out.logits.float(), dim=-1)  # (steps, B, classes)
    n = torch.arange(1, p.shape[0] + 1, device=p.device, dtype=p.dtype)[:, None]
    return (p[..., None] * probs).sum(dim=0), (n * p).sum(dim=0)
