"""The ``train`` section of the run configuration: optimisation settings, read by the training engine.

Torch-free, like every section, so that building and checking a configuration (and listing its
options) imports no network code.
"""
from __future__ import annotations

from dataclasses import dataclass

from taskformer.core.options import check, option

BF16_SETTINGS = ("auto", "true", "false")
SCHEDULES = ("inverse_sqrt", "linear")


@dataclass
class TrainConfig:
    """Optimisation settings. ``lr`` is the peak rate, reached after ``warmup`` steps."""

    epochs: int = option(20, "Passes over the training data (an upper bound when another budget ends first); 0: "
                         "no cap, the time limit or train.max_steps is the budget (a --time-limit sets 0 unless "
                         "epochs is set by you).", at_least=0)
    max_steps: int = option(0, "Stop after this many updates; 0: no limit. The budget that gives the same run on "
                            "a busy machine, where a --time-limit gives fewer updates.", at_least=0)
    max_tokens: int = option(4096, "Padded tokens per batch (source or target, whichever is longer).", at_least=1)
    lr: float = option(1e-3, "Peak learning rate, reached after warmup updates.", above=0.0)
    warmup: int = option(400, "Updates of linear warm-up.", at_least=0)
    warmup_share: float = option(0.0, "Under a time limit, the warm-up lasts this share of the updates the time buys "
                                 "(those made and those the time left buys at the idle pace) instead of "
                                 "train.warmup updates, and the inverse-square-root decay after it scales with "
                                 "them: a slow or busy start then does not fix the schedule from its few updates "
                                 "(0: count train.warmup). Short budgets' recipes set it.",
                                 at_least=0.0, at_most=0.5)
    schedule: str = option("inverse_sqrt", "After warm-up: the paper's 1/sqrt(step) decay, or linear to zero at "
                           "the last update.", choices=SCHEDULES)
    cooldown: float = option(0.0, "The last fraction of the budget (time limit or planned updates), over which the "
                             "rate falls linearly to zero; 0: off.", at_least=0.0, below=1.0)
    label_smoothing: float = option(0.1, "Share of the target probability spread over the other tokens.",
                                    at_least=0.0, below=1.0)
    clip: float = option(1.0, "Gradient norm clipping; 0: off.", at_least=0.0)
    weight_decay: float = option(0.0, "AdamW weight decay.", at_least=0.0)
    bf16: str = option("auto", "auto: bf16 where the hardware runs it natively (else fp32); true or false force it.")
    seed: int = option(0, "Random seed of initialisation, batches and synthetic data.")
    patience: int = option(0, "Stop after this many evaluations without improvement; 0: never (a --time-limit sets "
                           "10 unless patience is set by you or the task: enough to ride out val noise and plateaus, "
                           "few enough to stop over-fitting early).", at_least=0)
    eval_every: int = option(0, "Updates between evaluations; 0: once per epoch.", at_least=0)
    accumulate: int = option(1, "Batches whose gradients are summed into one update.", at_least=1)
    save_every: int = option(0, "Updates between resumable checkpoints; 0: at each evaluation only.", at_least=0)
    keep_last: int = option(2, "Resumable checkpoints kept in checkpoints/.", at_least=1)
    average_last: int = option(0, "Also evaluate the mean of the last N evaluated weights (kept if best); 0, 1: off.",
                               at_least=0)
    log_every: int = option(20, "Updates between training log lines.", at_least=1)
    pace: float = option(0.0, "Target tokens/s this machine trains the task's model at, from which --time-limit picks "
                         "the task's recipe; 0: measure it before training (a few seconds). Pin it on a shared "
                         "machine.", at_least=0.0, at_most=1e12)
    threads: int = option(0, "torch's intra-op threads for training and decoding, per process with --nproc; 0: "
                          "torch's choice, shared out among --nproc processes (on a busy 2-core machine one "
                          "can be much faster than two).", at_least=0,
                          at_most=1024)  # torch overflows past 2**31 and would start every thread it is given
    tensorboard: bool = option(False, "Write TensorBoard event files into the run directory (tensorboard/): the "
                               "built-in tracker plugin; needs pip install taskformer[tensorboard].")

    def validate(self) -> None:
        """Refuse values outside each field's range (its metadata) and a bf16 setting that is not one."""
        check("train", self)
        bf16_setting(self.bf16)


def bf16_setting(setting) -> str:
    """``train.bf16`` as one of BF16_SETTINGS (config files may hold a real boolean)."""
    text = str(setting).strip().lower()
    text = {"1": "true", "yes": "true", "on": "true", "0": "false", "no": "false", "off": "false"}.get(text, text)
    if text not in BF16_SETTINGS:
        raise ValueError(f"train.bf16 must be auto, true or false, not {setting!r}")
    return text
