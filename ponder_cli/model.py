"""PonderNet: a step function applied up to max_steps times, and two heads that read each step.

The class head gives y_n, the halting head the conditional halting probability lambda_n.
`forward` runs every step for every image (training, losses); `infer` is the one early-exit
loop, used by every method: each step computes only the images still running.
Knows nothing of data loading, training, the halting methods' losses or the CLI.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn as nn

from .halting import FixedBudget, Rule, halting_steps
from .registry import step_class
from .steps import select_rows

# A halting logit whose sigmoid is 1.0 in float32: how a truncated image's last computed step
# takes all its remaining halting mass (see PonderNet.forward).
FORCED_HALT_LOGIT = 80.0


ANSWER_FEATURES = 7  # answer_features' width


def answer_features(logits: torch.Tensor, earlier: torch.Tensor | None, n, first) -> torch.Tensor:
    """What the halting head reads of step n's answer (--halting-input ...+answer), (..., classes)
    -> (..., 7), detached and in float32: the top class probability, its margin over the second,
    the entropy (in units of log classes), log(1 - top probability) in tens of nats (how sure, where
    the probability itself rounds to 1), the total-variation distance from the step before's class
    probabilities and whether the top class changed (at the first step, `first`, the step before is
    the uniform distribution: the answer has changed from none), and 1 / (n + 1) for the 0-based
    step n (no scale of the steps run, which --max-steps changes). `earlier` (..., classes): the
    step before's logits, ignored where `first`; n and first an int and a bool, or tensors that
    broadcast over (...); fixed shapes, no host read."""
    log_p = torch.log_softmax(logits.detach().float(), dim=-1)
    p = log_p.exp()
    top2, top = p.topk(2, dim=-1)
    classes = p.shape[-1]
    entropy = -(p * log_p).sum(dim=-1) / math.log(classes)
    others = log_p.scatter(-1, top[..., :1], float("-inf")).logsumexp(dim=-1).clamp_min(-30.0) / 10
    if earlier is None:
        earlier = torch.zeros_like(logits)
    first = torch.as_tensor(first, device=p.device).expand(p.shape[:-1])
    q = torch.where(first[..., None], torch.full_like(p, 1 / classes), torch.softmax(earlier.detach().float(), dim=-1))
    change = (p - q).abs().sum(dim=-1) / 2
    changed = first | (earlier.detach().argmax(dim=-1) != top[..., 0])
    inverse = (1 / (torch.as_tensor(n, device=p.device, dtype=p.dtype) + 1)).expand(p.shape[:-1])
    return torch.stack([top2[..., 0], top2[..., 0] - top2[..., 1], entropy, others, change, changed.float(), inverse],
                       dim=-1)


class PonderOutput(NamedTuple):
    logits: torch.Tensor  # (steps, B, classes): y_n at every step
    lambda_logits: torch.Tensor  # (steps, B): pre-sigmoid conditional halting probability
    computed: torch.Tensor | None = None  # (B,) steps computed per image, when truncated


def halting_as_computed(out: PonderOutput) -> torch.Tensor:
    """out's halting logits (steps, B) with every input halting by its last computed step at the
    latest, as a forward whose rule `forces_halt` gives them: what a halting rule may pick from a
    truncated forward."""
    if out.computed is None:
        return out.lambda_logits
    n = torch.arange(1, out.lambda_logits.shape[0] + 1, device=out.lambda_logits.device)[:, None]  # (steps, 1)
    return torch.where(n >= out.computed, torch.full_like(out.lambda_logits, FORCED_HALT_LOGIT), out.lambda_logits)


def truncate(out: PonderOutput, rule: Rule) -> PonderOutput:
    """A forward over every step as the truncated one `forward(x, stop=rule)` gives it (`rule`
    fresh): the steps the rule computes for each input (halting.halting_steps, the same steps),
    those after them masked out, their class logits 0 and halting logits FORCED_HALT_LOGIT, and,
    when the rule `forces_halt`, the last computed step's halting forced too (see
    PonderNet.forward). The masked steps get no gradient: the loss and its gradients are the
    truncated forward's. Fixed shapes, no host read (a captured training batch runs this)."""
    computed, _ = halting_steps(rule, None, out.lambda_logits)
    n = torch.arange(1, out.lambda_logits.shape[0] + 1, device=out.lambda_logits.device)[:, None]  # (steps, 1)
    logits = torch.where((n <= computed)[..., None], out.logits, torch.zeros_like(out.logits))
    forced = n >= computed if rule.forces_halt else n > computed  # (steps, B)
    lambda_logits = torch.where(forced, torch.full_like(out.lambda_logits, FORCED_HALT_LOGIT), out.lambda_logits)
    return PonderOutput(logits, lambda_logits, computed)


class PonderNet(nn.Module):
    def __init__(self, cfg, classes: int, input_shape: tuple):
        super().__init__()
        self.max_steps = cfg.method.max_steps
        self.step = step_class(cfg.step.name)(cfg, tuple(input_shape))
        self.output_head = nn.Linear(self.step.readout_size, classes)
        # what the halting head sees besides the readout: the step's top class probability
        # ("confidence"), the previous step's readout ("previous": [h_n, h_{n-1}], zeros before
        # the first step) and the step function's own halting features (its halting_feature)
        inputs = cfg.method.halting_input.split("+")[1:]
        self.confidence_input = "confidence" in inputs
        self.previous_input = "previous" in inputs
        self.extra_input = self.step.halting_feature in inputs
        self.answer_input = "answer" in inputs  # answer_features: how sure the step is, how it changed
        self.halting_head = nn.Linear(self.step.readout_size * (1 + self.previous_input) + self.confidence_input
                                      + self.extra_input * self.step.halting_extra_size
                                      + self.answer_input * ANSWER_FEATURES, 1)

    def forward(self, x: torch.Tensor, stop: Rule | None = None, traces: list | None = None) -> PonderOutput:
        """Run the steps for training and losses: every step of every image, or, with a `stop`
        rule (halting.py: a truncation), each image only until the rule says it is done (the
        same steps as `truncate` masks).
        `traces`, a list, receives each step's steps.StepTrace (every step, no `stop`): what
        `ponder predict` shows of a step.

        A truncated image's last computed step gets halting logit FORCED_HALT_LOGIT, so lambda
        is 1 there and every later step has p_n = 0: the remaining mass the rule found too small
        to compute moves onto that step (unless the rule says otherwise: `forces_halt`; then the
        step after it takes that mass, and the method's loss leaves out the steps not computed).
        Later steps' class logits are 0.
        """
        if stop is not None:
            return self._forward_truncated(x, stop)
        context, state = self.step.start(x, self.max_steps)
        stacked = self.step.all_steps(context, state, self.max_steps) if traces is None else None
        if stacked is None:
            readouts, extras = [], []
            for n in range(self.max_steps):
                before = state
                state, readout, extra = self.step(context, state, n)
                if traces is not None:
                    traces.append(self.step.trace(x, context, before, state, n))
                readouts.append(readout)
                extras.append(extra)
            stacked = torch.stack(readouts), None if extras[0] is None else torch.stack(extras)
        # Heads run once on all steps together: one large matmul beats `steps` small ones.
        readouts, extra = stacked  # (steps, B, readout), (steps, B, extra) or None
        previous = torch.cat([torch.zeros_like(readouts[:1]), readouts[:-1]]) if self.previous_input else None
        return PonderOutput(*self.heads(readouts, extra, previous, n=None))

    def heads(self, readout: torch.Tensor, extra: torch.Tensor | None = None,
              previous: torch.Tensor | None = None, earlier: torch.Tensor | None = None,
              n: int | None = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Class logits (..., classes) and halting logits (...) from readouts (..., readout) of
        step `n` (0-based), or, with n None, of every step stacked (steps, B, readout);
        `previous`, the readouts one step earlier (zeros at the first step), when the halting
        head reads them; `earlier`, the class logits one step earlier (None at the first step),
        when it reads the answer (n None: taken from the stack)."""
        logits = self.output_head(readout)
        halting_input = [readout]
        if self.confidence_input:
            # detached, as the turn below: the halting loss must not teach the class head to be
            # more (or less) sure in order to halt sooner
            halting_input.append(torch.softmax(logits.detach().float(), dim=-1).amax(dim=-1, keepdim=True)
                                 .to(readout.dtype))
        if self.previous_input:
            halting_input.append(torch.zeros_like(readout) if previous is None else previous)
        if self.extra_input and extra is not None:
            # detached: halting may read the step's own features but its loss (the KL pull towards
            # halting early) must not reach the step through them, or training could teach the
            # step to work less in order to halt sooner
            halting_input.append(extra.detach().to(readout.dtype))
        if self.answer_input:
            if n is None:  # every step stacked: step n's earlier answer is step n - 1's
                n = torch.arange(logits.shape[0], device=logits.device)[:, None]  # (steps, 1)
                earlier = torch.cat([torch.zeros_like(logits[:1]), logits[:-1]])
                first = n == 0
            else:
                first = earlier is None
            halting_input.append(answer_features(logits, earlier, n, first).to(readout.dtype))
        halting_input = halting_input[0] if len(halting_input) == 1 else torch.cat(halting_input, dim=-1)
        lambda_logits = self.halting_head(halting_input).squeeze(-1)
        return logits, lambda_logits if extra is None else self.step.gate_halting(lambda_logits, extra)

    def _until_done(self, x: torch.Tensor, rule: Rule, predicts: bool = True):
        """The one early-exit loop: yields, for every step, the rows still running (A,) of the
        batch, their class and halting logits, and the rule's decision (done (A,), chosen: the
        step's class logits where the rule says None), the rule shown the class logits when it
        `predicts` (a truncation reads the halting logits alone);
        then keeps only the rows that go on in the step function's and the rule's state.

        One host synchronisation per step, none after the last: `nonzero` finds which rows go
        on (the host must know how many to shape the next step), and everything else uses
        those integer indices on the device. That sync buys skipping all work on finished rows.
        """
        context, state = self.step.start(x, self.max_steps)
        active = torch.arange(x.shape[0], device=x.device)  # rows of the batch still running
        previous = None  # the last step's readouts of the running rows, when the halting head reads them
        earlier = None  # the last step's class logits of the running rows, when it reads the answer
        for n in range(self.max_steps):
            state, readout, extra = self.step(context, state, n)  # (A, ...)
            logits, lambda_logits = self.heads(readout, extra, previous, earlier, n)
            previous = readout if self.previous_input else None
            earlier = logits if self.answer_input else None
            last = n == self.max_steps - 1
            done, chosen = rule.decide(n, last, logits if predicts else None, lambda_logits.detach())
            chosen = logits if chosen is None else chosen
            yield n, active, logits, lambda_logits, done, chosen
            if last:
                return
            going_on = torch.nonzero(~done).squeeze(1)  # (A',) positions among the A: the step's sync
            if going_on.shape[0] == 0:
                return
            if going_on.shape[0] < active.shape[0]:  # nothing to copy when no row is done
                active = active.index_select(0, going_on)
                context, state = select_rows(context, going_on), select_rows(state, going_on)
                previous = None if previous is None else previous.index_select(0, going_on)
                earlier = None if earlier is None else earlier.index_select(0, going_on)
                rule.keep(going_on)

    def _forward_truncated(self, x: torch.Tensor, stop: Rule) -> PonderOutput:
        batch = x.shape[0]
        computed = torch.full((batch,), self.max_steps, dtype=torch.long, device=x.device)
        logits_all = lambda_all = None
        for n, active, logits, lambda_logits, _, _ in self._until_done(x, stop, predicts=False):
            if logits_all is None:  # padding: logits 0, halting forced (p_n = 0 after the last step)
                logits_all = logits.new_zeros(self.max_steps, batch, logits.shape[-1])
                lambda_all = lambda_logits.new_full((self.max_steps, batch), FORCED_HALT_LOGIT)
            # index_put keeps the graph: gradients flow to the rows computed at this step (the step
            # index is filled on the device: no host-to-device copy per step)
            step = active.new_full(active.shape, n)
            logits_all = logits_all.index_put((step, active), logits)
            lambda_all = lambda_all.index_put((step, active), lambda_logits)
            # Every running row gets n + 1; the last write a row gets is at the step it is done
            # (then it stops running), so no mask of the done rows is needed.
            computed.index_fill_(0, active, n + 1)
        out = PonderOutput(logits_all, lambda_all, computed)
        return out._replace(lambda_logits=halting_as_computed(out)) if stop.forces_halt else out

    @torch.no_grad()
    def infer(self, x: torch.Tensor, rule: Rule) -> tuple[torch.Tensor, torch.Tensor]:
        """Halting with real early exit: each step computes only the images still running.

        `rule` (see halting.py) decides which running images halt at each step and what they
        predict; the result equals applying the same rule to a forward pass over every step.
        Returns the prediction at the halting step (B, classes) and the 1-based halting step (B,).
        """
        batch = x.shape[0]
        prediction = None
        steps = torch.full((batch,), self.max_steps, dtype=torch.long, device=x.device)
        for n, active, _, _, halts, chosen in self._until_done(x, rule):
            if prediction is None:
                prediction = chosen.new_empty(batch, chosen.shape[-1])
            # Every running row is written at every step; the last write is at its halting step,
            # after which it no longer runs: what stays is the rule's choice there.
            prediction.index_copy_(0, active, chosen)
            steps.index_fill_(0, active, n + 1)
        return prediction, steps

    def left_out_by_one_step(self, x: torch.Tensor) -> list[str]:
        """Names of the parameters that a training forward stopping every image after its
        first step leaves out of the autograd graph.

        Every forward runs at least that step for every image, so any other parameter gets a
        gradient (maybe zero) from every batch; data-parallel training needs to search each
        backward pass for parameters without one only when this list is not empty. Runs one
        small forward pass on `x`, a batch of the task's inputs (its example_input); the random
        number generators are left as they were.
        """
        device = next(self.parameters()).device
        named = [(name, p) for name, p in self.named_parameters() if p.requires_grad]
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.enable_grad():
            out = self(x, stop=FixedBudget(1)) if self.max_steps > 1 else self(x)
            grads = torch.autograd.grad(out.logits.sum() + out.lambda_logits.sum(), [p for _, p in named],
                                        allow_unused=True)
        return [name for (name, _), grad in zip(named, grads) if grad is None]
